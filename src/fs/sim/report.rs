//! Human-readable account of what a power loss could still decide, for
//! failure reports ("expected X, recovered Y — and this was undecided").
//!
//! Invariant: read-only; one line per undecided thing, in a stable order
//! (data by path, then directory ops in the order they happened).

use super::key::Key;
use super::state::{DataOp, DirOpKind, Durability, Inode, Node};
use super::SimFs;

fn data_line(path: &Key, inode: &Inode) -> Option<String> {
    let count = |d: Durability| inode.log.iter().filter(|e| e.durability == d).count();
    let (unsynced, unknown) = (count(Durability::Unsynced), count(Durability::Unknown));
    if unsynced + unknown == 0 {
        return None;
    }
    let bytes: usize = inode
        .log
        .iter()
        .filter(|e| e.durability != Durability::Synced)
        .map(|e| match &e.op {
            DataOp::Write { data, .. } => data.len(),
            DataOp::Truncate { .. } => 0,
        })
        .sum();
    Some(format!(
        "{}: {unsynced} unsynced and {unknown} unknown (failed sync) writes/truncates, {bytes} bytes; \
         durable length {}, visible length {}",
        path,
        inode.base.len(),
        inode.visible.len()
    ))
}

fn dir_line(kind: &DirOpKind, strict: bool, eager: bool) -> String {
    let what = match kind {
        DirOpKind::Mkdir { path } => format!("mkdir {path}"),
        DirOpKind::Create { path, .. } => format!("create {path}"),
        DirOpKind::Rename { from, to, .. } => format!("rename {from} -> {to}"),
        DirOpKind::RenameDir { from, to } => format!("rename directory {from} -> {to}"),
        DirOpKind::Remove { path, .. } => format!("remove {path}"),
    };
    let state = |durable: bool| if durable { "durable" } else { "undecided" };
    format!(
        "{what}: {} under Strict, {} under Eager",
        state(strict),
        state(eager)
    )
}

impl SimFs {
    /// What a power loss could still decide right now, one line each:
    /// files (by visible path) with unsynced or unknown data, then every
    /// directory op not yet durable under `Strict`.
    pub fn undecided(&self) -> Vec<String> {
        let s = self.lock();
        let image = &s.image;
        let mut lines: Vec<String> = image
            .ns
            .iter()
            .filter_map(|(path, node)| match node {
                Node::File(ino) => image.inodes.get(ino).and_then(|i| data_line(path, i)),
                Node::Dir => None,
            })
            .collect();
        lines.extend(
            image
                .dir_log
                .iter()
                .filter(|op| !op.durable_strict)
                .map(|op| dir_line(&op.kind, op.durable_strict, op.durable_eager)),
        );
        lines
    }
}
