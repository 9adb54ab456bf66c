//! The [`Fs`] methods of [`SimFs`]: each translates one call into changes
//! of the [`Image`](super::state::Image) inside one numbered I/O point.
//!
//! Invariant: a call either fails with no effect on the image, or records
//! its whole effect (visible now, durable per the fault model in
//! [`super`]); only an op cut short by `CrashAt` applies part of itself
//! (a torn write prefix, or some of `create_dir_all`'s directories).

use std::io;
use std::path::Path;

use super::key::{Arg, Key};
use super::state::{DataOp, DirOpKind, Inode, Node};
use super::{Apply, IoOp, SimFs};
use crate::fs::{Fs, OpenMode};

fn too_large(path: &Path, end: Option<u64>, max: u64) -> io::Error {
    let end = end.map_or_else(|| "overflow".to_string(), |e| e.to_string());
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{}: would grow to {end} bytes, past SimConfig::max_file_bytes = {max}",
            path.display()
        ),
    )
}

impl SimFs {
    /// Reject a write ending past the size limit before touching anything.
    fn check_end(&self, path: &Path, offset: u64, len: usize) -> io::Result<()> {
        let max = self.config.max_file_bytes;
        match offset.checked_add(len as u64) {
            Some(end) if end <= max => Ok(()),
            end => Err(too_large(path, end, max)),
        }
    }
}

/// The fair coins of one interrupted `sync`/`sync_dir`, all from the one
/// draw the crash made (so the run's RNG advances exactly as for any torn
/// op, and a captured image replays).
struct Coin(rand_chacha::ChaCha8Rng);

impl Coin {
    fn new(draw: u64) -> Self {
        use rand::SeedableRng;
        Coin(rand_chacha::ChaCha8Rng::seed_from_u64(draw))
    }

    fn flip(&mut self) -> bool {
        use rand::Rng;
        self.0.random_bool(0.5)
    }
}

/// Push a write of `data` (nothing for an empty one).
fn write(inode: &mut Inode, offset: u64, data: &[u8]) {
    if !data.is_empty() {
        inode.push(DataOp::Write {
            offset,
            data: data.to_vec(),
        });
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::CreateDir, path, None, label, |image, apply| {
            let key = Key::new(path);
            let mut missing: Vec<Key> = Vec::new();
            // `path.ancestors()`, as keys: the nth is `path.ancestors().nth(n)`.
            let ancestors = std::iter::successors(Some(key.as_ref()), |k| k.parent());
            for (n, dir) in ancestors.enumerate() {
                match image.entry(dir) {
                    _ if image.is_dir(dir) => break,
                    Some(Node::File(_)) => {
                        let shown = path.ancestors().nth(n).unwrap_or(path).display();
                        // Same kinds as std::fs::create_dir_all: EEXIST for the
                        // target itself, ENOTDIR for a file on the way.
                        let kind = if n == 0 {
                            io::ErrorKind::AlreadyExists
                        } else {
                            io::ErrorKind::NotADirectory
                        };
                        return Err(io::Error::new(
                            kind,
                            format!("{shown}: is a file, cannot create a directory"),
                        ));
                    }
                    _ => missing.push(dir.to_key()),
                }
            }
            // A crash mid mkdir -p leaves the outer directories only.
            let count = match apply {
                Apply::Torn(draw) if !missing.is_empty() => 1 + (draw % missing.len() as u64) as usize,
                _ => missing.len(),
            };
            for dir in missing.into_iter().rev().take(count) {
                image.dir_op(DirOpKind::Mkdir { path: dir });
            }
            Ok(())
        })
    }

    fn open(&self, path: &Path, mode: OpenMode, label: &str) -> io::Result<()> {
        self.point(IoOp::Open, path, None, label, |image, _| {
            let arg = Arg::new(path);
            match image.entry(arg.key.as_ref()) {
                Some(Node::Dir) => {
                    image.file(&arg)?;
                }
                Some(Node::File(ino)) => match mode {
                    OpenMode::CreateNew => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{}: exists (OpenMode::CreateNew)", path.display()),
                        ))
                    }
                    OpenMode::Truncate => image.ino_mut(*ino, path)?.push(DataOp::Truncate { len: 0 }),
                    OpenMode::Existing | OpenMode::Create => {}
                },
                None => {
                    if mode == OpenMode::Existing {
                        return Err(super::state::not_found(path));
                    }
                    image.parent_is_dir(&arg)?;
                    image.create_file(arg.key);
                }
            }
            Ok(())
        })
    }

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        self.point(IoOp::WriteAt, path, None, label, |image, apply| {
            let ino = image.file(&Arg::new(path))?;
            self.check_end(path, offset, data.len())?;
            write(image.ino_mut(ino, path)?, offset, apply.cut(data));
            Ok(())
        })
    }

    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        self.point(IoOp::Append, path, None, label, |image, apply| {
            let ino = image.file(&Arg::new(path))?;
            let inode = image.ino_mut(ino, path)?;
            let offset = inode.visible.len() as u64;
            self.check_end(path, offset, data.len())?;
            write(inode, offset, apply.cut(data));
            Ok(offset)
        })
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        self.numbered_point(IoOp::ReadAt, path, None, label, |image, _, point| {
            let file = &image.inode(&Arg::new(path))?.visible;
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(file.len());
            let available = buf.len().min(file.len() - start);
            let n = self.config.short_read(point, available);
            Ok(file.read_at(start, &mut buf[..n]))
        })
    }

    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        self.point(IoOp::Read, path, None, label, |image, _| {
            Ok(image.inode(&Arg::new(path))?.visible.to_vec())
        })
    }

    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        self.point(IoOp::Len, path, None, label, |image, _| {
            Ok(image.inode(&Arg::new(path))?.visible.len() as u64)
        })
    }

    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        self.point(IoOp::Truncate, path, None, label, |image, _| {
            let inode = image.inode_mut(&Arg::new(path))?;
            self.check_end(path, len, 0)?;
            inode.push(DataOp::Truncate { len });
            Ok(())
        })
    }

    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Sync, path, None, label, |image, apply| match apply {
            Apply::Whole => image.file_synced(&Arg::new(path)),
            // A power cut mid-fsync: a seeded subset of the dirty pages.
            Apply::Torn(draw) => {
                let mut coin = Coin::new(draw);
                image.file_partly_synced(&Arg::new(path), &mut |_| coin.flip())
            }
        })
    }

    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::SyncDir, path, None, label, |image, apply| {
            let arg = Arg::new(path);
            if !image.is_dir(arg.key.as_ref()) {
                image.file(&arg)?;
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: sync_dir of a file", path.display()),
                ));
            }
            match apply {
                Apply::Whole => image.dir_synced(arg.key.as_ref()),
                // A power cut mid-commit: a seeded subset of its changes.
                Apply::Torn(draw) => {
                    let mut coin = Coin::new(draw);
                    image.dir_partly_synced(arg.key.as_ref(), &mut || coin.flip())
                }
            }
            Ok(())
        })
    }

    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Rename, from, Some(to), label, |image, _| {
            let (from, to) = (Arg::new(from), Arg::new(to));
            if !from.key.as_ref().is_root() && image.is_dir(from.key.as_ref()) {
                // A directory moves whole, to a name that does not exist
                // (rename(2) would also take an empty directory's place;
                // nothing here asks for that), never into itself.
                if image.is_dir(to.key.as_ref()) || image.entry(to.key.as_ref()).is_some() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{}: rename target exists", to.path.display()),
                    ));
                }
                if to.key.as_ref().starts_with(from.key.as_ref()) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: a directory cannot move into itself", from.path.display()),
                    ));
                }
                image.parent_is_dir(&to)?;
                image.dir_op(DirOpKind::RenameDir {
                    from: from.key,
                    to: to.key,
                });
                return Ok(());
            }
            let ino = image.file(&from)?;
            if image.is_dir(to.key.as_ref()) {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{}: rename target is a directory", to.path.display()),
                ));
            }
            image.parent_is_dir(&to)?;
            if from.key != to.key {
                image.dir_op(DirOpKind::Rename {
                    from: from.key,
                    to: to.key,
                    ino,
                });
            }
            Ok(())
        })
    }

    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Remove, path, None, label, |image, _| {
            let arg = Arg::new(path);
            let ino = image.file(&arg)?;
            image.dir_op(DirOpKind::Remove { path: arg.key, ino });
            Ok(())
        })
    }

    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        self.point(IoOp::List, dir, None, label, |image, _| {
            let arg = Arg::new(dir);
            if !image.is_dir(arg.key.as_ref()) {
                image.file(&arg)?;
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: list of a file", dir.display()),
                ));
            }
            Ok(image.children(arg.key.as_ref()))
        })
    }

    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        self.point(IoOp::Exists, path, None, label, |image, _| {
            let key = Key::new(path);
            Ok(image.is_dir(key.as_ref()) || image.entry(key.as_ref()).is_some())
        })
    }

    fn lock_exclusive(&self, path: &Path, label: &str) -> io::Result<super::super::FsLock> {
        // Not an I/O point: a lock is process state (see `fs::lock`).
        self.locks.take(path, label)
    }
}
