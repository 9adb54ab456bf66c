//! Power loss: decide, from the seed, what of the unsynced state reached the
//! platter, and compute the resulting on-disk image.
//!
//! Invariant: the result always contains everything durable (base images,
//! `Synced` data ops, directory ops durable under the chosen [`DirModel`])
//! and otherwise only things the process actually wrote: a subset of the
//! unsynced/unknown ops, each whole or as a prefix, applied in their
//! original order. The same `Chooser` draws give the same image.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::key::Key;
use super::pages::Pages;
use super::state::{DataOp, Durability, Image, Ino, Node};
use super::types::{DirModel, SimConfig};

/// What became of one undecided data op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Lost,
    Whole,
    /// Only the first `n` bytes of a write (0 < n < len) reached disk.
    Prefix(usize),
}

/// The source of every power-loss decision.
pub(super) trait Chooser {
    /// Fate of an unsynced or unknown data op; `tearable_len` is the byte
    /// count of a write (`None` for a truncate, which cannot tear).
    fn data_op(&mut self, tearable_len: Option<usize>) -> Fate;
    /// Whether an unsynced directory op reached disk.
    fn dir_op(&mut self) -> bool;
}

/// Draws from the run's one seeded RNG, with the config's probabilities.
pub(super) struct Seeded<'a> {
    pub rng: &'a mut ChaCha8Rng,
    pub config: &'a SimConfig,
}

impl Chooser for Seeded<'_> {
    fn data_op(&mut self, tearable_len: Option<usize>) -> Fate {
        if !self.rng.random_bool(self.config.unsynced_write_survival) {
            return Fate::Lost;
        }
        match tearable_len {
            Some(len) if len > 1 && self.rng.random_bool(self.config.torn_write_probability) => {
                Fate::Prefix(self.rng.random_range(1..len))
            }
            _ => Fate::Whole,
        }
    }

    fn dir_op(&mut self) -> bool {
        self.rng.random_bool(self.config.dir_op_survival)
    }
}

/// Nothing undecided survives: the image every power loss preserves.
pub(super) struct Nothing;

impl Chooser for Nothing {
    fn data_op(&mut self, _: Option<usize>) -> Fate {
        Fate::Lost
    }
    fn dir_op(&mut self) -> bool {
        false
    }
}

/// The disk after a power loss: namespace and each surviving inode's bytes.
pub(super) struct Disk {
    pub ns: BTreeMap<Key, Node>,
    pub data: BTreeMap<Ino, Pages>,
}

/// Resolve a power loss on `image` under `model`. Draw order is fixed
/// (inodes by number, then the directory log in order) so a seed replays.
pub(super) fn resolve(image: &Image, model: DirModel, chooser: &mut impl Chooser) -> Disk {
    let mut data = BTreeMap::new();
    for (ino, inode) in &image.inodes {
        // Shares the durable pages; a surviving write copies those it changes.
        let mut bytes = inode.base.clone();
        for entry in &inode.log {
            let fate = match entry.durability {
                Durability::Synced => Fate::Whole,
                Durability::Unsynced | Durability::Unknown => {
                    let tearable = match &entry.op {
                        DataOp::Write { data, .. } => Some(data.len()),
                        DataOp::Truncate { .. } => None,
                    };
                    chooser.data_op(tearable)
                }
            };
            match (fate, &entry.op) {
                (Fate::Lost, _) => {}
                (Fate::Whole, op) => op.apply(&mut bytes),
                (Fate::Prefix(n), DataOp::Write { offset, data }) => {
                    let torn = DataOp::Write {
                        offset: *offset,
                        data: data[..n.min(data.len())].to_vec(),
                    };
                    torn.apply(&mut bytes);
                }
                (Fate::Prefix(_), op @ DataOp::Truncate { .. }) => op.apply(&mut bytes),
            }
        }
        data.insert(*ino, bytes);
    }

    let mut ns = image.ns_base.clone();
    for op in &image.dir_log {
        let durable = match model {
            DirModel::Strict => op.durable_strict,
            DirModel::Eager => op.durable_eager,
        };
        if durable || chooser.dir_op() {
            op.kind.apply(&mut ns);
        }
    }

    // An entry whose directory did not reach disk is unreachable (fsck
    // would put it in lost+found; we drop it). BTreeMap order visits a
    // parent before its children, so one pass settles whole subtrees.
    let mut reachable: BTreeMap<Key, Node> = BTreeMap::new();
    for (path, node) in ns {
        let parent_ok = match path.as_ref().parent() {
            None => true,
            Some(p) if p.is_root() => true,
            Some(p) => reachable.get(p.bytes()) == Some(&Node::Dir),
        };
        if parent_ok {
            reachable.insert(path, node);
        }
    }
    reachable.insert(Key::root(), Node::Dir);

    // Inodes no surviving entry names are gone (an orphan's data may have
    // been synced, but nothing can reach it).
    let named: BTreeSet<Ino> = reachable
        .values()
        .filter_map(|n| match n {
            Node::File(ino) => Some(*ino),
            Node::Dir => None,
        })
        .collect();
    data.retain(|ino, _| named.contains(ino));
    Disk { ns: reachable, data }
}
