//! The kernel speaks in inode numbers, the seam in paths: this table maps
//! one to the other for one mount.
//!
//! Invariant: `by_path` and `paths` are inverse maps; the root is inode 1
//! at `/`; an inode number is never reused within a mount (a removed
//! path's number is retired, so a stale kernel handle gets `ENOENT`, not
//! another file).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(crate) const ROOT_INO: u64 = 1;

#[derive(Debug)]
pub(crate) struct Inodes {
    paths: BTreeMap<u64, PathBuf>,
    by_path: BTreeMap<PathBuf, u64>,
    next: u64,
}

impl Inodes {
    pub(crate) fn new() -> Self {
        let mut table = Inodes {
            paths: BTreeMap::new(),
            by_path: BTreeMap::new(),
            next: ROOT_INO + 1,
        };
        table.paths.insert(ROOT_INO, PathBuf::from("/"));
        table.by_path.insert(PathBuf::from("/"), ROOT_INO);
        table
    }

    /// The path an inode number stands for, if it still names one.
    pub(crate) fn path(&self, ino: u64) -> Option<&Path> {
        self.paths.get(&ino).map(PathBuf::as_path)
    }

    /// The inode number of `path`, allocating one the first time.
    pub(crate) fn ino(&mut self, path: &Path) -> u64 {
        if let Some(ino) = self.by_path.get(path) {
            return *ino;
        }
        let ino = self.next;
        self.next += 1;
        self.paths.insert(ino, path.to_path_buf());
        self.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    /// `path` no longer exists: retire its number.
    pub(crate) fn remove(&mut self, path: &Path) {
        if let Some(ino) = self.by_path.remove(path) {
            self.paths.remove(&ino);
        }
    }

    /// A file moved from `from` to `to` (replacing whatever `to` was): the
    /// moved file keeps its number, the replaced one is retired.
    pub(crate) fn rename(&mut self, from: &Path, to: &Path) {
        self.remove(to);
        if let Some(ino) = self.by_path.remove(from) {
            self.paths.insert(ino, to.to_path_buf());
            self.by_path.insert(to.to_path_buf(), ino);
        }
        debug_assert_eq!(self.paths.len(), self.by_path.len());
    }
}
