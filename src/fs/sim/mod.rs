//! [`SimFs`]: an in-memory, fault-injecting [`Fs`], deterministic from a seed.
//!
//! SKELETON: this version keeps only the process's view (so it behaves like
//! `ProcessCrash` for every crash mode). The durable image, power loss, torn
//! appends, directory models and injected errors land behind this same API.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Fs, OpenMode};

/// When an unsynced directory operation reaches disk under power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DirModel {
    /// Creates/renames/removes are durable only after `sync_dir` of their
    /// directory; before that each may or may not have reached disk.
    Strict,
    /// ext4-like (data=ordered, auto_da_alloc): a directory operation is
    /// durable once a later `sync` of a file in the same directory, or of the
    /// renamed file, has completed.
    Eager,
}

/// What a crash does to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CrashMode {
    /// kill -9 / OOM: the OS page cache survives, so everything written does.
    ProcessCrash,
    /// Power loss: each file falls back to its durable image plus a seeded
    /// subset of unsynced writes (appends possibly torn); unsynced directory
    /// operations per the [`DirModel`].
    PowerLoss(DirModel),
}

/// Kind of an injected I/O error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FailKind {
    /// EIO (`ErrorKind::Other`). A failed `sync` leaves unsynced data unknown.
    Eio,
    /// ENOSPC (`ErrorKind::StorageFull`).
    Enospc,
}

/// A fault armed at one numbered I/O point (points count from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Fault {
    /// Points `1..n` happen; point `n` is torn or not done; every later call
    /// fails until [`SimFs::restart`].
    CrashAt(u64),
    /// Point `n` fails with the given error and has no effect (a failed
    /// `sync` leaves that file's unsynced data unknown).
    FailAt(u64, FailKind),
    /// Point `n` takes effect but the caller gets EIO.
    LostReplyAt(u64),
}

/// Tunables of the fault model. Every random choice draws from `seed`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SimConfig {
    pub seed: u64,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig { seed }
    }
}

/// The operation an I/O point performed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum IoOp {
    CreateDir,
    Open,
    WriteAt,
    Append,
    ReadAt,
    Read,
    Len,
    Truncate,
    Sync,
    SyncDir,
    Rename,
    Remove,
    List,
    Exists,
}

impl IoOp {
    /// Whether the op can change the disk (reads and listings cannot).
    pub fn mutates(self) -> bool {
        !matches!(
            self,
            IoOp::ReadAt | IoOp::Read | IoOp::Len | IoOp::List | IoOp::Exists
        )
    }
}

/// What happened at an I/O point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    Ok,
    Err,
    Crashed,
    Failed(FailKind),
    LostReply,
}

/// One numbered I/O point in the trace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TraceEntry {
    pub point: u64,
    pub op: IoOp,
    pub path: String,
    pub label: String,
    pub outcome: Outcome,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, Vec<u8>>,
    dirs: BTreeSet<PathBuf>,
    points: u64,
    fault: Option<Fault>,
    crashed: bool,
    trace: Vec<TraceEntry>,
}

/// The simulated disk. Cheap to clone: clones share one disk.
#[derive(Debug, Clone)]
pub struct SimFs {
    config: SimConfig,
    state: Arc<Mutex<State>>,
}

fn crash_error() -> io::Error {
    io::Error::other("simulated crash: the process is dead")
}

impl SimFs {
    pub fn new(config: SimConfig) -> Self {
        let mut state = State::default();
        state.dirs.insert(PathBuf::from("/"));
        SimFs {
            config,
            state: Arc::new(Mutex::new(state)),
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic mid-operation in a test; the state is
        // still a consistent map, so keep going rather than cascade panics.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arm a fault at a future I/O point (replaces any armed fault).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// Number of I/O points so far.
    pub fn points(&self) -> u64 {
        self.lock().points
    }

    /// Whether the armed crash point was hit (the process is dead).
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Apply a crash with `mode` and reboot: the process's view becomes what
    /// survived on disk, the fault is disarmed, I/O works again.
    pub fn restart(&self, _mode: CrashMode) {
        let mut s = self.lock();
        s.crashed = false;
        s.fault = None;
    }

    /// The labelled trace of every I/O point so far.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.lock().trace.clone()
    }

    /// The files the process sees, by path.
    pub fn disk_image(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.lock().files.clone()
    }

    fn point<T>(
        &self,
        op: IoOp,
        path: &Path,
        label: &str,
        f: impl FnOnce(&mut State) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut s = self.lock();
        if s.crashed {
            return Err(crash_error());
        }
        s.points += 1;
        let point = s.points;
        let (result, outcome) = match s.fault {
            Some(Fault::CrashAt(n)) if n == point => {
                s.crashed = true;
                (Err(crash_error()), Outcome::Crashed)
            }
            Some(Fault::FailAt(n, kind)) if n == point => {
                let err = match kind {
                    FailKind::Eio => io::Error::other("simulated EIO"),
                    FailKind::Enospc => io::Error::new(io::ErrorKind::StorageFull, "simulated ENOSPC"),
                };
                (Err(err), Outcome::Failed(kind))
            }
            Some(Fault::LostReplyAt(n)) if n == point => {
                let _ = f(&mut s);
                (Err(io::Error::other("simulated lost reply")), Outcome::LostReply)
            }
            _ => {
                let r = f(&mut s);
                let o = if r.is_ok() { Outcome::Ok } else { Outcome::Err };
                (r, o)
            }
        };
        s.trace.push(TraceEntry {
            point,
            op,
            path: path.display().to_string(),
            label: label.to_string(),
            outcome,
        });
        result
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

fn parent_exists(s: &State, path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() && !s.dirs.contains(p) => Err(not_found(p)),
        _ => Ok(()),
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::CreateDir, path, label, |s| {
            for a in path.ancestors() {
                if !a.as_os_str().is_empty() {
                    s.dirs.insert(a.to_path_buf());
                }
            }
            Ok(())
        })
    }

    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        self.point(IoOp::Open, path, label, |s| {
            let exists = s.files.contains_key(path);
            match mode {
                OpenMode::Existing if !exists => return Err(not_found(path)),
                OpenMode::CreateNew if exists => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        path.display().to_string(),
                    ))
                }
                _ => {}
            }
            parent_exists(s, path)?;
            let file = s.files.entry(path.to_path_buf()).or_default();
            if mode == OpenMode::Truncate {
                file.clear();
            }
            Ok(())
        })
    }

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        self.point(IoOp::WriteAt, path, label, |s| {
            let file = s.files.get_mut(path).ok_or_else(|| not_found(path))?;
            let start = offset as usize;
            let end = start + data.len();
            if file.len() < end {
                file.resize(end, 0);
            }
            file[start..end].copy_from_slice(data);
            Ok(())
        })
    }

    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        self.point(IoOp::Append, path, label, |s| {
            let file = s.files.get_mut(path).ok_or_else(|| not_found(path))?;
            let at = file.len() as u64;
            file.extend_from_slice(data);
            Ok(at)
        })
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        self.point(IoOp::ReadAt, path, label, |s| {
            let file = s.files.get(path).ok_or_else(|| not_found(path))?;
            let start = (offset as usize).min(file.len());
            let n = buf.len().min(file.len() - start);
            buf[..n].copy_from_slice(&file[start..start + n]);
            Ok(n)
        })
    }

    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        self.point(IoOp::Read, path, label, |s| {
            s.files.get(path).cloned().ok_or_else(|| not_found(path))
        })
    }

    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        self.point(IoOp::Len, path, label, |s| {
            s.files
                .get(path)
                .map(|f| f.len() as u64)
                .ok_or_else(|| not_found(path))
        })
    }

    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        self.point(IoOp::Truncate, path, label, |s| {
            let file = s.files.get_mut(path).ok_or_else(|| not_found(path))?;
            file.resize(len as usize, 0);
            Ok(())
        })
    }

    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Sync, path, label, |s| {
            if s.files.contains_key(path) {
                Ok(())
            } else {
                Err(not_found(path))
            }
        })
    }

    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::SyncDir, path, label, |s| {
            if s.dirs.contains(path) {
                Ok(())
            } else {
                Err(not_found(path))
            }
        })
    }

    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Rename, from, label, |s| {
            parent_exists(s, to)?;
            let data = s.files.remove(from).ok_or_else(|| not_found(from))?;
            s.files.insert(to.to_path_buf(), data);
            Ok(())
        })
    }

    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Remove, path, label, |s| {
            s.files.remove(path).map(drop).ok_or_else(|| not_found(path))
        })
    }

    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        self.point(IoOp::List, dir, label, |s| {
            if !s.dirs.contains(dir) {
                return Err(not_found(dir));
            }
            let mut names: BTreeSet<String> = BTreeSet::new();
            let children = s.files.keys().chain(s.dirs.iter());
            for p in children {
                if p.parent() == Some(dir) {
                    if let Some(n) = p.file_name() {
                        names.insert(n.to_string_lossy().into_owned());
                    }
                }
            }
            Ok(names.into_iter().collect())
        })
    }

    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        self.point(IoOp::Exists, path, label, |s| {
            Ok(s.files.contains_key(path) || s.dirs.contains(path))
        })
    }
}
