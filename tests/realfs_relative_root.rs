//! A root given as a relative path is made durable in the directory that
//! holds it: the boot (`durable_root_locked`) and `SessionStore::open`
//! sync the chain above the root with `fs::dirs_above` / `fs::holding_dir`,
//! where the empty parent of a bare name means `.`, the working directory
//! — so a new root `relroot`'s own entry, and with it everything
//! acknowledged under it, survives a power cut.
//!
//! Relative roots are what the product normally gets: the app resolves
//! `[runtime] root` against the config file's directory, so
//! `durable-agent serve --config agent.toml` hands the boot
//! `durable-agent-data` (the default) or `root`: one relative component.
//!
//! docs/GUARANTEES.md #12: "New directories are synced in their parents up
//! the chain"; src/fs/mod.rs: "Creating, renaming or removing a directory
//! entry is durable only after `sync_dir` of the directory that holds
//! it."

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use durable_agent::fs::{Fs, FsLock, OpenMode, RealFs};
use durable_agent::runtime::{FakeProvider, PureTools};
use durable_agent::system::{Deps, LogicalClock, System, SystemConfig};
use durable_agent::world::World;

/// RealFs, recording every directory created and every directory fsynced.
#[derive(Debug, Default)]
struct Recording {
    inner: RealFs,
    ops: Mutex<Vec<(&'static str, PathBuf)>>,
}

impl Recording {
    fn note(&self, op: &'static str, path: &Path) {
        self.ops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((op, path.to_path_buf()));
    }
}

impl Fs for Recording {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        self.note("mkdir", path);
        self.inner.create_dir_all(path, label)
    }
    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        self.inner.open(path, mode, label)
    }
    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        self.inner.write_at(path, offset, data, label)
    }
    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        self.inner.append(path, data, label)
    }
    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        self.inner.read_at(path, offset, buf, label)
    }
    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        self.inner.read(path, label)
    }
    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        self.inner.len(path, label)
    }
    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        self.inner.truncate(path, len, label)
    }
    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        self.inner.sync(path, label)
    }
    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        self.note("sync_dir", path);
        self.inner.sync_dir(path, label)
    }
    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        self.inner.rename(from, to, label)
    }
    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        self.inner.remove(path, label)
    }
    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir, label)
    }
    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        self.inner.exists(path, label)
    }
    fn lock_exclusive(&self, path: &Path, label: &str) -> io::Result<FsLock> {
        self.inner.lock_exclusive(path, label)
    }
}

#[derive(Debug)]
struct Fixed;

impl LogicalClock for Fixed {
    fn now_ms(&self) -> u64 {
        1_000
    }
}

/// The only test in this binary: it changes the process's working
/// directory (as running `durable-agent` from a project directory does).
#[test]
fn a_relative_root_is_made_durable_in_the_directory_that_holds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cwd = dir.path().canonicalize().expect("canonical tempdir");
    std::env::set_current_dir(&cwd).expect("chdir");

    let fs = Arc::new(Recording::default());
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(3)),
        tools: Arc::new(PureTools),
        outbox: Arc::new(World::without_dedup()),
        clock: Arc::new(Fixed),
    };
    let root = PathBuf::from("relroot");
    let (mut system, _) =
        System::boot(fs.clone(), SystemConfig::new(root.clone(), 3), deps).expect("boot a new relative root");
    // Something acknowledged under it.
    let agent = system
        .runtime_mut()
        .create_root("lead", "be brief")
        .expect("agent");
    system.runtime_mut().run_turn(&agent, "hello").expect("turn");
    drop(system);
    assert!(
        cwd.join("relroot").join("agents").is_dir(),
        "the root was created in the cwd"
    );

    let ops = fs.ops.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        ops.iter().any(|(op, p)| *op == "mkdir" && p == &root),
        "the boot created the root: {ops:#?}"
    );
    // The directory holding `relroot` is the cwd: named ".", "" or its
    // absolute path, any of them would do.
    let syncs_cwd = ops.iter().any(|(op, p)| {
        *op == "sync_dir"
            && (p.as_os_str().is_empty() || p == Path::new(".") || p.canonicalize().is_ok_and(|c| c == cwd))
    });
    let synced: Vec<&PathBuf> = ops
        .iter()
        .filter(|(op, _)| *op == "sync_dir")
        .map(|(_, p)| p)
        .collect();
    assert!(
        syncs_cwd,
        "the boot created the new root `relroot` in {} and acknowledged a turn under it, but never fsynced \
         the directory holding the root's entry; directories fsynced: {synced:?}",
        cwd.display()
    );
}
