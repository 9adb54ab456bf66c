//! [`RealFs`]: the production [`Fs`] over `std::fs`.
//!
//! Invariant: `sync` is `File::sync_all` and `sync_dir` opens the directory
//! and fsyncs it — the two calls POSIX needs for a write, a create or a
//! rename to survive power loss. Files are opened per call: the seam is
//! path-based so that every call is one countable I/O point in simulation,
//! and production I/O here is rare (a few appends per turn).
//!
//! Errors keep their `ErrorKind` (callers branch on `NotFound`,
//! `AlreadyExists`, `StorageFull`) and gain the label and path, because a
//! bare "No such file or directory" names neither the file nor the step.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{lock_held, Fs, FsLock, OpenMode};

/// The real filesystem. Paths are used as given (absolute, or relative to
/// the process's working directory).
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl RealFs {
    pub fn new() -> Self {
        RealFs
    }
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Name the step and the file in an error, keeping its kind.
fn ctx<T>(result: io::Result<T>, label: &str, path: &Path) -> io::Result<T> {
    result.map_err(|e| io::Error::new(e.kind(), format!("{label}: {}: {e}", path.display())))
}

fn open_with(path: &Path, mode: OpenMode) -> io::Result<()> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
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
    opts.open(path).map(drop)
}

fn append_at_end(path: &Path, data: &[u8]) -> io::Result<u64> {
    let mut file = open_rw(path)?;
    let offset = file.seek(SeekFrom::End(0))?;
    file.write_all(data)?;
    Ok(offset)
}

fn read_fully_at(path: &Path, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let file = File::open(path)?;
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

fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    File::open(path)?.read_to_end(&mut out)?;
    Ok(out)
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

impl Fs for RealFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        ctx(fs::create_dir_all(path), label, path)
    }

    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        ctx(open_with(path, mode), label, path)
    }

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        let result = open_rw(path).and_then(|f| f.write_all_at(data, offset));
        ctx(result, label, path)
    }

    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        ctx(append_at_end(path, data), label, path)
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        ctx(read_fully_at(path, offset, buf), label, path)
    }

    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        ctx(read_all(path), label, path)
    }

    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        ctx(fs::metadata(path).map(|m| m.len()), label, path)
    }

    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        ctx(open_rw(path).and_then(|f| f.set_len(len)), label, path)
    }

    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        ctx(open_rw(path).and_then(|f| f.sync_all()), label, path)
    }

    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        // A directory fsync on Linux needs a read-only descriptor of the dir.
        ctx(File::open(path).and_then(|d| d.sync_all()), label, path)
    }

    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        let result = fs::rename(from, to);
        result.map_err(|e| {
            let (from, to) = (from.display(), to.display());
            io::Error::new(e.kind(), format!("{label}: {from} -> {to}: {e}"))
        })
    }

    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        ctx(fs::remove_file(path), label, path)
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
