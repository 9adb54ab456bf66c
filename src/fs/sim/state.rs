//! The simulated disk: a visible image (what the process sees, i.e. the
//! page cache) and a durable image (what survives any power loss), for file
//! data and for directory entries separately.
//!
//! Invariants:
//! - File identity is an inode number. A directory entry maps a path (as a
//!   [`Key`]: component-wise, so `/a//b` and `/a/b` are one entry) to an
//!   inode; `rename` moves the entry, never the data. A file's data
//!   durability (`sync`) is separate from its entry's durability (`sync_dir`).
//! - For each inode, `visible == apply(base, every op in log)`; `base` plus
//!   the `Synced` ops of `log` is what is guaranteed on disk.
//! - `ns == apply(ns_base, every op in dir_log)` for the process's view;
//!   `ns_base` holds only entries durable under both directory models.
//! - Leading durable ops are folded into the bases, so logs only hold what a
//!   power loss could still decide.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) use super::inode::{DataOp, Durability, Ino, Inode};
use super::key::{Arg, Key, KeyRef};
use super::pages::Pages;

/// A directory entry's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    Dir,
    File(Ino),
}

/// A change to the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DirOpKind {
    Mkdir {
        path: Key,
    },
    Create {
        path: Key,
        ino: Ino,
    },
    Rename {
        from: Key,
        to: Key,
        ino: Ino,
    },
    /// A directory moved with everything under it (one `rename(2)` of a
    /// directory: atomic, as the file rename).
    RenameDir {
        from: Key,
        to: Key,
    },
    Remove {
        path: Key,
        ino: Ino,
    },
}

impl DirOpKind {
    /// Apply to a namespace by inode identity: a rename or remove whose
    /// source entry no longer names that inode on this image (because an
    /// earlier op did not reach disk) only does the part that still makes
    /// sense, as a journal replay of that one op would.
    pub(super) fn apply(&self, ns: &mut BTreeMap<Key, Node>) {
        match self {
            DirOpKind::Mkdir { path } => {
                ns.entry(path.clone()).or_insert(Node::Dir);
            }
            DirOpKind::Create { path, ino } => {
                ns.insert(path.clone(), Node::File(*ino));
            }
            DirOpKind::Rename { from, to, ino } => {
                if ns.get(from) == Some(&Node::File(*ino)) {
                    ns.remove(from);
                }
                ns.insert(to.clone(), Node::File(*ino));
            }
            DirOpKind::Remove { path, ino } => {
                if ns.get(path) == Some(&Node::File(*ino)) {
                    ns.remove(path);
                }
            }
            DirOpKind::RenameDir { from, to } => {
                // Whatever this image holds under `from` moves (the
                // directory and its descendants sort contiguously).
                let under: Vec<Key> = ns
                    .range::<[u8], _>((
                        std::ops::Bound::Included(from.as_ref().bytes()),
                        std::ops::Bound::Unbounded,
                    ))
                    .map(|(k, _)| k)
                    .take_while(|k| k.as_ref().starts_with(from.as_ref()))
                    .cloned()
                    .collect();
                let (from_path, to_path) = (from.to_path_buf(), to.to_path_buf());
                for key in under {
                    if let Some(node) = ns.remove(&key) {
                        let path = key.to_path_buf();
                        let rest = path.strip_prefix(&from_path).unwrap_or(&path);
                        ns.insert(Key::new(&to_path.join(rest)), node);
                    }
                }
            }
        }
    }

    /// Whether the op changes an entry of directory `dir`.
    pub(super) fn touches_dir(&self, dir: KeyRef<'_>) -> bool {
        let in_dir = |p: &Key| p.as_ref().parent() == Some(dir);
        match self {
            DirOpKind::Mkdir { path } => in_dir(path),
            DirOpKind::Create { path, .. } | DirOpKind::Remove { path, .. } => in_dir(path),
            DirOpKind::Rename { from, to, .. } | DirOpKind::RenameDir { from, to } => {
                in_dir(from) || in_dir(to)
            }
        }
    }

    /// The ext4-like rule (`DirModel::Eager`) for a completed `sync` of
    /// `path` (inode `ino`): ops in the same directory, ops that create or
    /// move that inode, and the creation of its ancestor directories.
    /// `parent` is `path`'s parent (computed once per `sync`).
    pub(super) fn made_durable_by_file_sync(
        &self,
        path: KeyRef<'_>,
        parent: Option<KeyRef<'_>>,
        ino: Ino,
    ) -> bool {
        if parent.is_some_and(|parent| self.touches_dir(parent)) {
            return true;
        }
        match self {
            DirOpKind::Mkdir { path: dir } => path.starts_with(dir.as_ref()),
            DirOpKind::Create { ino: i, .. } | DirOpKind::Rename { ino: i, .. } => *i == ino,
            DirOpKind::Remove { .. } | DirOpKind::RenameDir { .. } => false,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct DirOp {
    pub kind: DirOpKind,
    /// Durable under `DirModel::Strict` (its directory was `sync_dir`ed).
    pub durable_strict: bool,
    /// Durable under `DirModel::Eager` (implied by `durable_strict`).
    pub durable_eager: bool,
}

/// Namespace plus inodes; no faults, no trace, no randomness.
#[derive(Debug, Clone)]
pub(super) struct Image {
    pub ns: BTreeMap<Key, Node>,
    pub ns_base: BTreeMap<Key, Node>,
    pub dir_log: Vec<DirOp>,
    /// Shared, copied on write: a crash image (one per I/O point in
    /// capture mode) clones the map, not the files; a later write copies
    /// the inode's page lists and the pages it changes
    /// ([`super::pages::Pages`]), never a whole file.
    pub inodes: BTreeMap<Ino, Arc<Inode>>,
    next_ino: Ino,
}

pub(super) fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory", path.display()),
    )
}

impl Image {
    pub(super) fn new() -> Self {
        let root = BTreeMap::from([(Key::root(), Node::Dir)]);
        Image {
            ns: root.clone(),
            ns_base: root,
            dir_log: Vec::new(),
            inodes: BTreeMap::new(),
            next_ino: 1,
        }
    }

    /// The visible entry at `key`.
    pub(super) fn entry(&self, key: KeyRef<'_>) -> Option<&Node> {
        self.ns.get(key.bytes())
    }

    pub(super) fn is_dir(&self, key: KeyRef<'_>) -> bool {
        key.is_root() || self.entry(key) == Some(&Node::Dir)
    }

    pub(super) fn parent_is_dir(&self, arg: &Arg<'_>) -> io::Result<()> {
        match arg.key.as_ref().parent() {
            // `Path::parent` is `Some` exactly when the key's parent is.
            Some(p) if !self.is_dir(p) => Err(not_found(arg.path.parent().unwrap_or(arg.path))),
            _ => Ok(()),
        }
    }

    /// The inode a regular-file path names in the process's view.
    pub(super) fn file(&self, arg: &Arg<'_>) -> io::Result<Ino> {
        match self.entry(arg.key.as_ref()) {
            Some(Node::File(ino)) => Ok(*ino),
            Some(Node::Dir) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{}: is a directory, expected a file", arg.path.display()),
            )),
            None => Err(not_found(arg.path)),
        }
    }

    pub(super) fn inode(&self, arg: &Arg<'_>) -> io::Result<&Inode> {
        let ino = self.file(arg)?;
        self.inodes
            .get(&ino)
            .map(|i| &**i)
            .ok_or_else(|| not_found(arg.path))
    }

    pub(super) fn inode_mut(&mut self, arg: &Arg<'_>) -> io::Result<&mut Inode> {
        let ino = self.file(arg)?;
        self.ino_mut(ino, arg.path)
    }

    /// Inode `ino`, which [`Image::file`] found at `path`.
    pub(super) fn ino_mut(&mut self, ino: Ino, path: &Path) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&ino)
            .map(Arc::make_mut)
            .ok_or_else(|| not_found(path))
    }

    /// Record a namespace change: visible now, durable once synced.
    pub(super) fn dir_op(&mut self, kind: DirOpKind) {
        kind.apply(&mut self.ns);
        self.dir_log.push(DirOp {
            kind,
            durable_strict: false,
            durable_eager: false,
        });
    }

    /// A file put in place at rest with `bytes`, durable (name and data
    /// alike): a copy an operator made while nothing ran. Replaces any
    /// file of that name.
    pub(super) fn adopt_file(&mut self, path: Key, bytes: Pages) {
        let ino = self.next_ino;
        self.next_ino += 1;
        let inode = super::inode::Inode {
            visible: bytes.clone(),
            base: bytes,
            log: Vec::new(),
        };
        self.inodes.insert(ino, Arc::new(inode));
        self.ns.insert(path.clone(), Node::File(ino));
        self.ns_base.insert(path, Node::File(ino));
    }

    pub(super) fn create_file(&mut self, path: Key) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Arc::default());
        self.dir_op(DirOpKind::Create { path, ino });
        ino
    }

    /// `sync_dir(dir)` completed.
    pub(super) fn dir_synced(&mut self, dir: KeyRef<'_>) {
        for op in &mut self.dir_log {
            // `durable_strict` implies `durable_eager`: nothing to change.
            if !op.durable_strict && op.kind.touches_dir(dir) {
                op.durable_strict = true;
                op.durable_eager = true;
            }
        }
        self.fold_dir_log();
    }

    /// Power was cut in the middle of `sync_dir(dir)`: the directory's
    /// changes for which `reached()` says so were committed, the rest stay
    /// undecided (see [`super`]'s fault table).
    pub(super) fn dir_partly_synced(&mut self, dir: KeyRef<'_>, reached: &mut impl FnMut() -> bool) {
        for op in &mut self.dir_log {
            if !op.durable_strict && op.kind.touches_dir(dir) && reached() {
                op.durable_strict = true;
                op.durable_eager = true;
            }
        }
        self.fold_dir_log();
    }

    /// Power was cut in the middle of `sync(path)`: see
    /// [`Inode::partly_synced`]. No directory op becomes durable (the
    /// journal commit an ext4 `fsync` ends with did not happen).
    pub(super) fn file_partly_synced(
        &mut self,
        arg: &Arg<'_>,
        reached: &mut impl FnMut(u64) -> bool,
    ) -> io::Result<()> {
        let ino = self.file(arg)?;
        self.ino_mut(ino, arg.path)?.partly_synced(reached);
        Ok(())
    }

    /// `sync(path)` completed: data durable, plus the Eager directory rule.
    pub(super) fn file_synced(&mut self, arg: &Arg<'_>) -> io::Result<()> {
        let ino = self.file(arg)?;
        self.ino_mut(ino, arg.path)?.synced();
        let (path, parent) = (arg.key.as_ref(), arg.key.as_ref().parent());
        for op in &mut self.dir_log {
            if !op.durable_eager && op.kind.made_durable_by_file_sync(path, parent, ino) {
                op.durable_eager = true;
            }
        }
        Ok(())
    }

    /// No pending change: every directory op durable under the strict
    /// model, every inode's writes synced (a failed sync's unknown ones
    /// count as pending: a power loss decides them).
    pub(super) fn is_durable(&self) -> bool {
        self.dir_log.iter().all(|op| op.durable_strict)
            && self.inodes.values().all(|inode| inode.is_durable())
    }

    fn fold_dir_log(&mut self) {
        let durable = self.dir_log.iter().take_while(|op| op.durable_strict).count();
        if durable == 0 {
            // Nothing can have died since the last collection: see below.
            debug_assert!({
                let live = self.live_inodes();
                self.inodes.keys().all(|ino| live.contains(ino))
            });
            return;
        }
        for op in self.dir_log.drain(..durable) {
            op.kind.apply(&mut self.ns_base);
        }
        self.collect_garbage();
    }

    /// Drop inodes no name can reach any more, visible or on any disk a
    /// power loss could produce: keeps memory bounded for programs that
    /// replace files by rename and `sync_dir` (session records, checkpoints).
    ///
    /// Only a fold can kill an inode: since `ns == apply(ns_base, dir_log)`
    /// and every op that puts an inode into `ns` names it, an inode in `ns`
    /// is also in `ns_base` or named by `dir_log`; between folds `ns_base`
    /// stays put and `dir_log` only grows. So running this right after each
    /// fold that drained something keeps every inode in `inodes` live.
    pub(super) fn collect_garbage(&mut self) {
        let live = self.live_inodes();
        self.inodes.retain(|ino, _| live.contains(ino));
    }

    /// Inodes a name reaches: visible, durable, or in an undecided op.
    fn live_inodes(&self) -> BTreeSet<Ino> {
        let mut live = BTreeSet::new();
        for node in self.ns.values().chain(self.ns_base.values()) {
            if let Node::File(ino) = node {
                live.insert(*ino);
            }
        }
        for op in &self.dir_log {
            match &op.kind {
                DirOpKind::Create { ino, .. }
                | DirOpKind::Rename { ino, .. }
                | DirOpKind::Remove { ino, .. } => {
                    live.insert(*ino);
                }
                DirOpKind::Mkdir { .. } | DirOpKind::RenameDir { .. } => {}
            }
        }
        live
    }

    /// Names directly inside `dir`, sorted.
    pub(super) fn children(&self, dir: KeyRef<'_>) -> Vec<String> {
        use std::ops::Bound::{Excluded, Unbounded};
        // Key (= path) ordering is by component, so a directory's
        // descendants sort contiguously right after it.
        self.ns
            .range::<[u8], _>((Excluded(dir.bytes()), Unbounded))
            .map(|(p, _)| p.as_ref())
            .take_while(|p| p.starts_with(dir))
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    /// Replace everything with a resolved on-disk state (after a power
    /// loss): the visible image is the disk, nothing is pending.
    pub(super) fn install(&mut self, ns: BTreeMap<Key, Node>, data: BTreeMap<Ino, Pages>) {
        self.inodes = data
            .into_iter()
            .map(|(ino, bytes)| {
                // One set of pages, shared by both views until written.
                let inode = Inode {
                    visible: bytes.clone(),
                    base: bytes,
                    log: Vec::new(),
                };
                (ino, Arc::new(inode))
            })
            .collect();
        self.ns_base = ns.clone();
        self.ns = ns;
        self.dir_log.clear();
        debug_assert!(self.ns.values().all(|n| match n {
            Node::File(ino) => self.inodes.contains_key(ino),
            Node::Dir => true,
        }));
    }

    /// The files the process sees, by path.
    pub(super) fn visible_files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.visible_files_where(|_| true)
    }

    /// The files the process sees whose path `wanted` accepts (copies only
    /// those bytes).
    pub(super) fn visible_files_where(&self, wanted: impl Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
        self.ns
            .iter()
            .filter_map(|(k, n)| match n {
                Node::File(ino) => Some((k.to_path_buf(), *ino)),
                Node::Dir => None,
            })
            .filter(|(p, _)| wanted(p))
            .filter_map(|(p, ino)| self.inodes.get(&ino).map(|i| (p, i.visible.to_vec())))
            .collect()
    }
}

/// Files of a namespace with their bytes, by path.
pub(super) fn files_of<'a>(
    ns: &BTreeMap<Key, Node>,
    bytes: impl Fn(Ino) -> Option<&'a Pages>,
) -> BTreeMap<PathBuf, Vec<u8>> {
    ns.iter()
        .filter_map(|(p, n)| match n {
            Node::File(ino) => bytes(*ino).map(|b| (p.to_path_buf(), b.to_vec())),
            Node::Dir => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayed(inode: &Inode) -> Pages {
        let mut bytes = inode.base.clone();
        inode.log.iter().for_each(|e| e.op.apply(&mut bytes));
        bytes
    }

    #[test]
    fn atomic_replace_loop_keeps_one_inode_and_the_image_invariants() {
        let mut image = Image::new();
        let d = Key::new(Path::new("/d"));
        image.dir_op(DirOpKind::Mkdir { path: d.clone() });
        image.dir_synced(Key::root().as_ref());
        for i in 0..100u8 {
            let tmp = Arg::new(Path::new("/d/tmp"));
            image.create_file(tmp.key.clone());
            let data = vec![i; 3];
            image
                .inode_mut(&tmp)
                .unwrap()
                .push(DataOp::Write { offset: 0, data });
            image.file_synced(&tmp).unwrap();
            let ino = image.file(&tmp).unwrap();
            let (from, to) = (tmp.key.clone(), Key::new(Path::new("/d/f")));
            image.dir_op(DirOpKind::Rename { from, to, ino });
            image.dir_synced(d.as_ref());
        }
        assert_eq!(image.inodes.len(), 1, "replaced inodes must be collected");
        assert!(image.dir_log.is_empty());
        assert_eq!(image.ns, image.ns_base);
        for inode in image.inodes.values() {
            assert_eq!(replayed(inode), inode.visible);
        }
        assert_eq!(
            image
                .inode(&Arg::new(Path::new("/d/f")))
                .unwrap()
                .visible
                .to_vec(),
            [99; 3]
        );
    }
}
