//! The I/O seam. Every byte durable-agent persists — event logs, session
//! records, SQLite pages and journals — crosses [`Fs`].
//!
//! The trait is path-based (no file handles): each call is one I/O point,
//! which is what lets [`SimFs`] number, label, fail and crash every one of
//! them. Each call carries a `label` naming the step it performs
//! (`"events.jsonl append turn.start"`, `"sqlite wal write"`); labels appear
//! in the simulated trace and in failure reports, and are ignored by
//! [`RealFs`].
//!
//! Contract (POSIX, as a careful program must assume it):
//! - `write_at`/`append`/`truncate` change what the process sees; they are
//!   durable only after `sync` of that file.
//! - Creating, renaming or removing a directory entry is durable only after
//!   `sync_dir` of the directory that holds it.
//! - `rename` atomically replaces the target in the process's view.
//! - Errors are `std::io::Error` with the usual kinds (`NotFound`,
//!   `AlreadyExists`, `StorageFull` for ENOSPC, `Other` for EIO).

mod lock;
mod real;
pub mod sim;

use std::fmt;
use std::io;
use std::path::Path;

pub use lock::{lock_held, FsLock};
pub use real::RealFs;
pub use sim::{
    CrashImage, CrashMode, DirModel, DiskBackup, Fault, FileVersion, SimConfig, SimFs, SimSnapshot,
    TraceEntry,
};

/// Read `buf.len()` bytes at `offset`, looping over short reads: POSIX
/// lets `pread` return fewer bytes than asked (a signal, a network or FUSE
/// filesystem; [`SimFs`] does it on purpose), so a reader that wants the
/// bytes must ask again. Returns fewer than `buf.len()` only at the end of
/// the file. Bounded: every round reads at least one byte or ends.
pub fn read_full_at(fs: &dyn Fs, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match fs.read_at(path, offset + filled as u64, &mut buf[filled..], label)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// The directory whose entry names `path`: where that entry is synced
/// ([`Fs::sync_dir`]) to make it durable. Its parent, or `.` (the working
/// directory) for a bare relative name, whose `Path::parent` is the empty
/// path; `None` for `/` and the empty path, which no directory names.
pub fn holding_dir(path: &Path) -> Option<&Path> {
    match path.parent()? {
        p if p.as_os_str().is_empty() => Some(Path::new(".")),
        p => Some(p),
    }
}

/// Every directory up the chain above `path`, nearest first, each holding
/// the entry of the one below (`/a/b` gives `/a`, `/`; `a/b` gives `a`,
/// `.`): what syncing a new directory "in its parents up the chain"
/// syncs. A relative path's chain ends at `.`, the working directory.
pub fn dirs_above(path: &Path) -> impl Iterator<Item = &Path> {
    // `.` holds itself: the chain ends there.
    std::iter::successors(holding_dir(path), |dir| holding_dir(dir).filter(|up| up != dir))
}

/// How [`Fs::open`] treats an existing or missing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// The file must exist (`NotFound` otherwise).
    Existing,
    /// Create the file empty if missing; keep its content if present.
    Create,
    /// Create the file; fail with `AlreadyExists` if present.
    CreateNew,
    /// Create the file if missing and truncate it to zero length.
    Truncate,
}

/// The filesystem seam. Implementations must be usable from several threads
/// (`Send + Sync`); [`SimFs`] serialises every call.
pub trait Fs: Send + Sync + fmt::Debug {
    /// Create `path` and any missing parents (like `mkdir -p`). A new
    /// directory entry is durable only once its parent is `sync_dir`ed.
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()>;

    /// Open (and maybe create) a regular file, see [`OpenMode`].
    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()>;

    /// Write `data` at `offset`, extending the file (zero-filled) if needed.
    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()>;

    /// Append `data` at the end of the file; returns the offset it was
    /// written at.
    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64>;

    /// Read up to `buf.len()` bytes at `offset`; returns the count (0 at
    /// EOF). Like `pread(2)` it may return fewer bytes than asked before
    /// the end of the file: a reader that wants them all loops
    /// ([`read_full_at`]).
    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize>;

    /// Read the whole file.
    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>>;

    /// Length of the file in bytes.
    fn len(&self, path: &Path, label: &str) -> io::Result<u64>;

    /// Set the file's length (shrink or zero-extend).
    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()>;

    /// fsync the file: its data and length become durable.
    fn sync(&self, path: &Path, label: &str) -> io::Result<()>;

    /// fsync the directory: creates, renames and removes of its entries
    /// become durable.
    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()>;

    /// Atomically rename `from` over `to` (replacing it if present).
    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()>;

    /// Remove a file.
    fn remove(&self, path: &Path, label: &str) -> io::Result<()>;

    /// Names of the entries in a directory, sorted (determinism: callers
    /// never see an order that depends on the host).
    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path, label: &str) -> io::Result<bool>;

    /// Take an exclusive lock on `path` for as long as the returned guard
    /// lives; fails at once (`WouldBlock`, see [`lock_held`]) if another
    /// holder has it. Process state, not data: see [`FsLock`]. The default
    /// refuses, so a wrapper that forgets to forward it cannot pretend to
    /// lock.
    fn lock_exclusive(&self, path: &Path, label: &str) -> io::Result<FsLock> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{label}: {}: this Fs cannot lock", path.display()),
        ))
    }
}
