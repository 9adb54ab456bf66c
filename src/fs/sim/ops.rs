//! The [`Fs`] methods of [`SimFs`]: each translates one call into changes
//! of the [`Image`] inside one numbered I/O point.
//!
//! Invariant: a call either fails with no effect on the image, or records
//! its whole effect (visible now, durable per the fault model in
//! [`super`]); only an op cut short by `CrashAt` applies part of itself
//! (a torn write prefix, or some of `create_dir_all`'s directories).

use std::io;
use std::path::{Path, PathBuf};

use super::state::{DataOp, DirOpKind, Image, Node};
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

fn write(image: &mut Image, path: &Path, offset: u64, data: &[u8]) -> io::Result<()> {
    let inode = image.inode_mut(path)?;
    if !data.is_empty() {
        inode.push(DataOp::Write {
            offset,
            data: data.to_vec(),
        });
    }
    Ok(())
}

impl Fs for SimFs {
    fn create_dir_all(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::CreateDir, path, None, label, |image, apply| {
            let mut missing: Vec<PathBuf> = Vec::new();
            for dir in path.ancestors() {
                match image.ns.get(dir) {
                    _ if image.is_dir(dir) => break,
                    // Same kinds as std::fs::create_dir_all: EEXIST for the
                    // target itself, ENOTDIR for a file on the way.
                    Some(Node::File(_)) if dir == path => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{}: is a file, cannot create a directory", dir.display()),
                        ))
                    }
                    Some(Node::File(_)) => {
                        return Err(io::Error::new(
                            io::ErrorKind::NotADirectory,
                            format!("{}: is a file, cannot create a directory", dir.display()),
                        ))
                    }
                    _ => missing.push(dir.to_path_buf()),
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
            match image.ns.get(path) {
                Some(Node::Dir) => {
                    image.file(path)?;
                }
                Some(Node::File(_)) => match mode {
                    OpenMode::CreateNew => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!("{}: exists (OpenMode::CreateNew)", path.display()),
                        ))
                    }
                    OpenMode::Truncate => image.inode_mut(path)?.push(DataOp::Truncate { len: 0 }),
                    OpenMode::Existing | OpenMode::Create => {}
                },
                None => {
                    if mode == OpenMode::Existing {
                        return Err(super::state::not_found(path));
                    }
                    image.parent_is_dir(path)?;
                    image.create_file(path);
                }
            }
            Ok(())
        })
    }

    fn write_at(&self, path: &Path, offset: u64, data: &[u8], label: &str) -> io::Result<()> {
        self.point(IoOp::WriteAt, path, None, label, |image, apply| {
            image.file(path)?;
            self.check_end(path, offset, data.len())?;
            write(image, path, offset, apply.cut(data))
        })
    }

    fn append(&self, path: &Path, data: &[u8], label: &str) -> io::Result<u64> {
        self.point(IoOp::Append, path, None, label, |image, apply| {
            let offset = image.inode(path)?.visible.len() as u64;
            image.file(path)?;
            self.check_end(path, offset, data.len())?;
            write(image, path, offset, apply.cut(data))?;
            Ok(offset)
        })
    }

    fn read_at(&self, path: &Path, offset: u64, buf: &mut [u8], label: &str) -> io::Result<usize> {
        self.point(IoOp::ReadAt, path, None, label, |image, _| {
            let file = &image.inode(path)?.visible;
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(file.len());
            let n = buf.len().min(file.len() - start);
            buf[..n].copy_from_slice(&file[start..start + n]);
            Ok(n)
        })
    }

    fn read(&self, path: &Path, label: &str) -> io::Result<Vec<u8>> {
        self.point(IoOp::Read, path, None, label, |image, _| {
            Ok(image.inode(path)?.visible.clone())
        })
    }

    fn len(&self, path: &Path, label: &str) -> io::Result<u64> {
        self.point(IoOp::Len, path, None, label, |image, _| {
            Ok(image.inode(path)?.visible.len() as u64)
        })
    }

    fn truncate(&self, path: &Path, len: u64, label: &str) -> io::Result<()> {
        self.point(IoOp::Truncate, path, None, label, |image, _| {
            let inode = image.inode_mut(path)?;
            self.check_end(path, len, 0)?;
            inode.push(DataOp::Truncate { len });
            Ok(())
        })
    }

    fn sync(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Sync, path, None, label, |image, _| image.file_synced(path))
    }

    fn sync_dir(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::SyncDir, path, None, label, |image, _| {
            if !image.is_dir(path) {
                image.file(path)?;
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: sync_dir of a file", path.display()),
                ));
            }
            image.dir_synced(path);
            Ok(())
        })
    }

    fn rename(&self, from: &Path, to: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Rename, from, Some(to), label, |image, _| {
            let ino = image.file(from).map_err(|e| {
                if e.kind() == io::ErrorKind::IsADirectory {
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("{}: SimFs renames files only", from.display()),
                    )
                } else {
                    e
                }
            })?;
            if image.is_dir(to) {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{}: rename target is a directory", to.display()),
                ));
            }
            image.parent_is_dir(to)?;
            if from != to {
                image.dir_op(DirOpKind::Rename {
                    from: from.to_path_buf(),
                    to: to.to_path_buf(),
                    ino,
                });
            }
            Ok(())
        })
    }

    fn remove(&self, path: &Path, label: &str) -> io::Result<()> {
        self.point(IoOp::Remove, path, None, label, |image, _| {
            let ino = image.file(path)?;
            image.dir_op(DirOpKind::Remove {
                path: path.to_path_buf(),
                ino,
            });
            Ok(())
        })
    }

    fn list(&self, dir: &Path, label: &str) -> io::Result<Vec<String>> {
        self.point(IoOp::List, dir, None, label, |image, _| {
            if !image.is_dir(dir) {
                image.file(dir)?;
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: list of a file", dir.display()),
                ));
            }
            Ok(image.children(dir))
        })
    }

    fn exists(&self, path: &Path, label: &str) -> io::Result<bool> {
        self.point(IoOp::Exists, path, None, label, |image, _| {
            Ok(image.is_dir(path) || image.ns.contains_key(path))
        })
    }
}
