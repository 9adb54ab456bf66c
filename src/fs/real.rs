//! [`RealFs`]: the production [`Fs`] over `std::fs`.
//!
//! Invariant: `sync` is `File::sync_all` and `sync_dir` opens the directory
//! and fsyncs it — the two calls POSIX needs for a write, a create or a
//! rename to survive power loss. Files are opened per call: the seam is
//! path-based so that every call is one countable I/O point in simulation,
//! and production I/O here is rare (a few appends per turn).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{Fs, OpenMode};

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

impl Fs for RealFs {
    fn create_dir_all(&self, path: &Path, _label: &str) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn open(&self, path: &Path, mode: OpenMode, _label: &str) -> io::Result<()> {
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

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], _label: &str) -> io::Result<()> {
        open_rw(path)?.write_all_at(data, offset)
    }

    fn append(&self, path: &Path, data: &[u8], _label: &str) -> io::Result<u64> {
        let mut file = open_rw(path)?;
        let offset = file.seek(SeekFrom::End(0))?;
        file.write_all(data)?;
        Ok(offset)
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], _label: &str) -> io::Result<usize> {
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

    fn read(&self, path: &Path, _label: &str) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        File::open(path)?.read_to_end(&mut out)?;
        Ok(out)
    }

    fn len(&self, path: &Path, _label: &str) -> io::Result<u64> {
        Ok(fs::metadata(path)?.len())
    }

    fn truncate(&self, path: &Path, len: u64, _label: &str) -> io::Result<()> {
        open_rw(path)?.set_len(len)
    }

    fn sync(&self, path: &Path, _label: &str) -> io::Result<()> {
        open_rw(path)?.sync_all()
    }

    fn sync_dir(&self, path: &Path, _label: &str) -> io::Result<()> {
        // A directory fsync on Linux needs a read-only descriptor of the dir.
        File::open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path, _label: &str) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path, _label: &str) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn list(&self, dir: &Path, _label: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            names.push(name.to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path, _label: &str) -> io::Result<bool> {
        path.try_exists()
    }
}
