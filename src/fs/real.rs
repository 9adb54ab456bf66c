//! [`RealFs`]: the production [`Fs`] over `std::fs`.
//!
//! Invariant: `sync` is `File::sync_all` on the descriptor that did the
//! writes, and `sync_dir` fsyncs a descriptor of the directory held since
//! its entries changed — the two calls POSIX needs for a write, a create
//! or a rename to survive power loss. Why the descriptors are kept: Linux
//! reports a writeback error (the page cache failed to reach the disk)
//! to the descriptors open when it happened, and forgets it once the
//! inode leaves the cache; a descriptor opened just for the fsync can miss
//! it and report success for lost data (PostgreSQL's "fsyncgate", 2018).
//! So a written file's descriptor stays open until the file is removed,
//! and a failed fsync is sticky: every later `sync` of that file fails too
//! ("the data it held is unknown"), because a retried fsync would succeed
//! on pages the kernel already marked clean.
//!
//! The table is bounded ([`RealFs::MAX_KEPT`]): past it, descriptors with nothing
//! unsynced are closed first; one with unsynced writes is never closed
//! before its fsync. Opening a file again (an `open` of a path already
//! kept: a truncate, a second SQLite connection) replaces its descriptor,
//! but never loses what the old one knew: a failed fsync stays sticky on
//! the new one, and an old descriptor with writes not yet synced stays
//! open, and is fsynced first, until the file's next successful `sync`.
//!
//! Private by construction: every file this creates is mode 0600 and every
//! directory 0700 ([`FILE_MODE`], [`DIR_MODE`]; the umask can only take
//! bits away), because the root holds prompts, replies and email bodies.
//! Existing files and directories keep their modes.
//!
//! Errors keep their `ErrorKind` (callers branch on `NotFound`,
//! `AlreadyExists`, `StorageFull`) and gain the label and path, because a
//! bare "No such file or directory" names neither the file nor the step.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(feature = "canaries")]
use crate::canary::{Canaries, Canary};

use super::{lock_held, Fs, FsLock, OpenMode};

/// One kept descriptor: a file opened read-write, or a directory opened
/// read-only.
#[derive(Debug)]
struct Kept {
    file: File,
    /// Written (or, for a directory, an entry changed) since the last
    /// successful fsync.
    dirty: AtomicBool,
    /// The error of a failed fsync: sticky (see the module doc).
    failed: Mutex<Option<String>>,
    /// Descriptors of the same file this one replaced while they held
    /// writes not yet synced: their writeback errors are reported to them
    /// (see the module doc), so they are fsynced before this one.
    earlier: Mutex<Vec<Arc<Kept>>>,
}

impl Kept {
    fn new(file: File) -> Arc<Kept> {
        Arc::new(Kept {
            file,
            dirty: AtomicBool::new(false),
            failed: Mutex::new(None),
            earlier: Mutex::new(Vec::new()),
        })
    }

    fn failed(&self) -> MutexGuard<'_, Option<String>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn earlier(&self) -> MutexGuard<'_, Vec<Arc<Kept>>> {
        self.earlier.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This descriptor replaces `old`, of the same file: a failed fsync
    /// stays failed (`old` is then closed: its error is recorded, and a
    /// file reopened again and again keeps one descriptor), and unsynced
    /// writes stay to be synced through `old`.
    fn replaces(&self, old: Arc<Kept>) {
        let failed = old.failed().clone();
        if let Some(first) = failed {
            *self.failed() = Some(first);
            self.dirty.store(true, Ordering::SeqCst);
        } else if old.dirty.load(Ordering::SeqCst) {
            self.dirty.store(true, Ordering::SeqCst);
            self.earlier().push(old);
        }
    }

    /// fsync, unless an earlier one failed.
    fn sync(&self) -> io::Result<()> {
        let mut failed = self.failed();
        if let Some(first) = failed.as_ref() {
            return Err(io::Error::other(format!(
                "an earlier fsync of this file failed ({first}); the data it held is unknown"
            )));
        }
        // Cleared before the fsync: a write racing it stays dirty.
        self.dirty.store(false, Ordering::SeqCst);
        // The replaced descriptors first: their writes are this file's.
        let earlier = std::mem::take(&mut *self.earlier());
        for old in &earlier {
            if let Err(e) = old.sync() {
                self.dirty.store(true, Ordering::SeqCst);
                *failed = Some(e.to_string());
                return Err(e);
            }
        }
        match self.file.sync_all() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.dirty.store(true, Ordering::SeqCst);
                *failed = Some(e.to_string());
                Err(e)
            }
        }
    }
}

/// The real filesystem. Paths are used as given (absolute, or relative to
/// the process's working directory). Clones share the kept descriptors.
#[derive(Debug, Default, Clone)]
pub struct RealFs {
    kept: Arc<Mutex<BTreeMap<PathBuf, Arc<Kept>>>>,
    #[cfg(feature = "canaries")]
    canaries: Canaries,
}

/// Mode of every file [`RealFs`] creates: the owner's only.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory [`RealFs`] creates.
pub const DIR_MODE: u32 = 0o700;

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Name the step and the file in an error, keeping its kind.
fn ctx<T>(result: io::Result<T>, label: &str, path: &Path) -> io::Result<T> {
    result.map_err(|e| io::Error::new(e.kind(), format!("{label}: {}: {e}", path.display())))
}

fn open_with(path: &Path, mode: OpenMode) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).mode(FILE_MODE);
    match mode {
        OpenMode::Existing => {}
        OpenMode::Create => {
            opts.create(true);
        }
        OpenMode::CreateNew => {
            opts.create_new(true);
        }
        OpenMode::Truncate => {
            opts.create(true).truncate(true);
        }
    }
    opts.open(path)
}

fn read_fully_at(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn list_sorted(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        names.push(name.to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

impl RealFs {
    /// Kept descriptors beyond which clean ones are closed.
    pub const MAX_KEPT: usize = 256;

    pub fn new() -> Self {
        RealFs::default()
    }

    /// The same filesystem with known bugs switched on (harness and test
    /// builds only; see [`Canary::RealFsSyncNoop`]).
    #[cfg(feature = "canaries")]
    pub fn with_canaries(canaries: Canaries) -> Self {
        RealFs {
            canaries,
            ..RealFs::default()
        }
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<PathBuf, Arc<Kept>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Descriptors currently kept open (for tests and diagnostics).
    pub fn kept_len(&self) -> usize {
        self.table().len()
    }

    /// Keep `file` as `path`'s descriptor, closing clean ones past the bound.
    fn keep(&self, path: &Path, file: File) -> Arc<Kept> {
        let mut table = self.table();
        if table.len() >= Self::MAX_KEPT {
            // Never a dirty one: its fsync must see its writeback errors.
            table.retain(|_, k| k.dirty.load(Ordering::SeqCst) || k.failed().is_some());
        }
        let kept = Kept::new(file);
        if let Some(old) = table.insert(path.to_path_buf(), Arc::clone(&kept)) {
            kept.replaces(old);
        }
        kept
    }

    /// `path`'s kept read-write descriptor, opened and kept if missing.
    fn file(&self, path: &Path) -> io::Result<Arc<Kept>> {
        if let Some(k) = self.table().get(path) {
            return Ok(Arc::clone(k));
        }
        Ok(self.keep(path, open_rw(path)?))
    }

    /// The directory's kept descriptor (read-only: Linux's dir fsync needs
    /// one), opened and kept if missing.
    fn dir(&self, path: &Path) -> io::Result<Arc<Kept>> {
        if let Some(k) = self.table().get(path) {
            return Ok(Arc::clone(k));
        }
        Ok(self.keep(path, File::open(path)?))
    }

    /// An entry of `path`'s directory is about to change: hold the
    /// directory's descriptor across the change and its fsync.
    fn dir_changes(&self, path: &Path) -> io::Result<()> {
        self.dir(parent_of(path))?.dirty.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The descriptor to read through: the kept one, else a fresh one.
    fn reader(&self, path: &Path) -> io::Result<ReadVia> {
        match self.table().get(path) {
            Some(k) => Ok(ReadVia::Kept(Arc::clone(k))),
            None => Ok(ReadVia::Fresh(File::open(path)?)),
        }
    }

    fn written(kept: &Kept) {
        kept.dirty.store(true, Ordering::SeqCst);
    }
}

enum ReadVia {
    Kept(Arc<Kept>),
    Fresh(File),
}

impl ReadVia {
    fn file(&self) -> &File {
        match self {
            ReadVia::Kept(k) => &k.file,
            ReadVia::Fresh(f) => f,
        }
    }
}

impl Fs for RealFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        let result = (|| {
            if !path.is_dir() {
                // The new entry lands in the nearest existing ancestor.
                let mut top = path;
                while let Some(up) = top.parent().filter(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
                    top = up;
                }
                self.dir_changes(top)?;
            }
            fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(path)
        })();
        ctx(result, label, path)
    }

    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        let result = (|| {
            if mode != OpenMode::Existing {
                self.dir_changes(path)?;
            }
            let file = open_with(path, mode)?;
            let kept = self.keep(path, file);
            if mode != OpenMode::Existing {
                Self::written(&kept);
            }
            Ok(())
        })();
        ctx(result, label, path)
    }

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        let result = self.file(path).and_then(|k| {
            Self::written(&k);
            k.file.write_all_at(data, offset)
        });
        ctx(result, label, path)
    }

    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        let result = self.file(path).and_then(|k| {
            Self::written(&k);
            // pwrite at the length, not the descriptor's offset: the kept
            // descriptor is shared, and the log has one writer.
            let offset = k.file.metadata()?.len();
            k.file.write_all_at(data, offset)?;
            Ok(offset)
        });
        ctx(result, label, path)
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        let result = self
            .reader(path)
            .and_then(|r| read_fully_at(r.file(), offset, buf));
        ctx(result, label, path)
    }

    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        let result = self.reader(path).and_then(|r| {
            let mut out = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = read_fully_at(r.file(), out.len() as u64, &mut chunk)?;
                out.extend_from_slice(&chunk[..n]);
                if n < chunk.len() {
                    return Ok(out);
                }
            }
        });
        ctx(result, label, path)
    }

    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        ctx(fs::metadata(path).map(|m| m.len()), label, path)
    }

    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        let result = self.file(path).and_then(|k| {
            Self::written(&k);
            k.file.set_len(len)
        });
        ctx(result, label, path)
    }

    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        #[cfg(feature = "canaries")]
        if self.canaries.has(Canary::RealFsSyncNoop) {
            return Ok(());
        }
        ctx(self.file(path).and_then(|k| k.sync()), label, path)
    }

    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        #[cfg(feature = "canaries")]
        if self.canaries.has(Canary::RealFsSyncDirNoop) {
            return Ok(());
        }
        ctx(self.dir(path).and_then(|k| k.sync()), label, path)
    }

    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        let result = (|| {
            self.dir_changes(from)?;
            self.dir_changes(to)?;
            fs::rename(from, to)?;
            // The descriptors follow their inodes: whatever was kept under
            // `from` (a file, or a directory's entries) is now under `to`;
            // what `to` named is gone.
            let mut table = self.table();
            table.retain(|p, _| !p.starts_with(to));
            let moved: Vec<PathBuf> = table.keys().filter(|p| p.starts_with(from)).cloned().collect();
            for old in moved {
                if let (Some(k), Ok(rest)) = (table.remove(&old), old.strip_prefix(from)) {
                    let new = if rest.as_os_str().is_empty() {
                        to.to_path_buf()
                    } else {
                        to.join(rest)
                    };
                    table.insert(new, k);
                }
            }
            Ok(())
        })();
        result.map_err(|e: io::Error| {
            let (from, to) = (from.display(), to.display());
            io::Error::new(e.kind(), format!("{label}: {from} -> {to}: {e}"))
        })
    }

    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        let result = (|| {
            self.dir_changes(path)?;
            fs::remove_file(path)?;
            self.table().remove(path);
            Ok(())
        })();
        ctx(result, label, path)
    }

    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        ctx(list_sorted(dir), label, dir)
    }

    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        ctx(path.try_exists(), label, path)
    }

    fn lock_exclusive(&self, path: &Path, label: &str) -> io::Result<FsLock> {
        // flock(2) via std: held per open file description, so a second
        // open in this process conflicts too, and the kernel releases it
        // when the process dies (kill -9 included). The file's content is
        // never read.
        let file = ctx(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(FILE_MODE)
                .open(path),
            label,
            path,
        )?;
        match file.try_lock() {
            Ok(()) => Ok(FsLock::new(path, Box::new(file))),
            Err(std::fs::TryLockError::WouldBlock) => Err(lock_held(path, label)),
            Err(std::fs::TryLockError::Error(e)) => ctx(Err(e), label, path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed fsync is sticky: retrying it would report success for
    /// pages the kernel already dropped (fsyncgate). A pipe cannot be
    /// fsynced (EINVAL), which stands in for a writeback error.
    #[test]
    fn a_failed_fsync_fails_every_later_sync_of_the_file() {
        let (_reader, writer) = std::io::pipe().expect("pipe");
        let kept = Kept::new(File::from(std::os::fd::OwnedFd::from(writer)));
        let first = kept.sync().expect_err("fsync of a pipe fails");
        let again = kept.sync().expect_err("a retry must not succeed");
        assert!(
            again.to_string().contains("an earlier fsync of this file failed"),
            "{again}"
        );
        assert!(again.to_string().contains(&first.to_string()), "{again}");
        assert!(kept.dirty.load(Ordering::SeqCst));
    }

    /// Opening a kept file again replaces its descriptor without losing
    /// what the old one knew: here the old one's fsync failed (a pipe
    /// stands in for the writeback error), and the file's next `sync`
    /// after a truncating `open` must fail too, not succeed on the fresh
    /// descriptor.
    #[test]
    fn reopening_a_file_keeps_its_failed_fsync_sticky() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.pending");
        let fs = RealFs::new();
        fs.open(&path, OpenMode::Truncate, "t").expect("open");
        let (_reader, writer) = std::io::pipe().expect("pipe");
        let failing = Kept::new(File::from(std::os::fd::OwnedFd::from(writer)));
        failing.sync().expect_err("fsync of a pipe fails");
        fs.table().insert(path.clone(), Arc::clone(&failing));
        fs.open(&path, OpenMode::Truncate, "t").expect("reopen");
        // The failure is the new descriptor's own, not its predecessor's
        // fsync run again: the failed one is closed.
        assert!(fs.table()[&path].earlier().is_empty());
        assert_eq!(Arc::strong_count(&failing), 1, "the failed descriptor is closed");
        let e = fs.sync(&path, "t").expect_err("the failed fsync is sticky");
        assert!(
            e.to_string().contains("an earlier fsync of this file failed"),
            "{e}"
        );
        // Reopened again and again, the file keeps one descriptor.
        fs.open(&path, OpenMode::Truncate, "t").expect("reopen");
        assert!(fs.table()[&path].earlier().is_empty());
        fs.sync(&path, "t").expect_err("still failed");
    }

    /// An old descriptor with writes not yet synced stays open across a
    /// reopen and is fsynced first: its failure fails the file's `sync`;
    /// its success lets it go.
    #[test]
    fn reopening_a_file_syncs_the_replaced_descriptor_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.db-wal");
        let fs = RealFs::new();
        let (_reader, writer) = std::io::pipe().expect("pipe");
        let unsynced = Kept::new(File::from(std::os::fd::OwnedFd::from(writer)));
        unsynced.dirty.store(true, Ordering::SeqCst);
        fs.table().insert(path.clone(), unsynced);
        fs.open(&path, OpenMode::Create, "t").expect("reopen");
        // Kept, and the new descriptor dirty (else the bound in `keep`
        // could close both unsynced).
        assert_eq!(fs.table()[&path].earlier().len(), 1);
        assert!(fs.table()[&path].dirty.load(Ordering::SeqCst));
        fs.sync(&path, "t")
            .expect_err("the replaced descriptor's fsync fails");
        fs.sync(&path, "t").expect_err("and stays failed");
        // A dirty replaced descriptor of a file that then syncs is let go.
        let ok = dir.path().join("ok");
        fs.open(&ok, OpenMode::Truncate, "t").expect("open");
        fs.write_at(&ok, 0, b"x", "t").expect("write");
        fs.open(&ok, OpenMode::Existing, "t").expect("reopen");
        assert_eq!(fs.table()[&ok].earlier().len(), 1);
        fs.sync(&ok, "t").expect("sync");
        assert!(fs.table()[&ok].earlier().is_empty(), "synced, let go");
        // A clean replaced descriptor is simply closed.
        fs.open(&ok, OpenMode::Existing, "t").expect("reopen");
        assert!(fs.table()[&ok].earlier().is_empty());
        fs.sync(&ok, "t").expect("a clean reopen syncs");
    }
}
