//! One file's bytes, identified by inode: the visible image (page cache),
//! the durable base, and the log of writes a power loss has yet to decide.
//! Both images are [`Pages`]: copies of an inode share their bytes, and a
//! write copies only the pages it changes.
//!
//! Invariants: `visible == apply(base, every op in log)`; `base` plus the
//! `Synced` ops of `log` is guaranteed on disk; a `Synced` op is folded
//! into `base` as soon as nothing undecided precedes it.

use super::pages::Pages;

pub(super) type Ino = u64;

/// The unit a drive writes back: a power cut in the middle of an `fsync`
/// leaves each dirty page of the file written or not, whole (4 KiB, the
/// page cache's page; FoundationDB's `AsyncFileNonDurable` also tears at
/// 4 KiB).
pub(super) const PAGE_BYTES: u64 = 4096;

/// A change to a file's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DataOp {
    Write { offset: u64, data: Vec<u8> },
    Truncate { len: u64 },
}

impl DataOp {
    /// Apply to an image: a write overwrites what overlaps and appends
    /// the rest (zero-filling a hole before it), a truncate resizes with
    /// zeros. Lengths were checked against `max_file_bytes` when the op
    /// was accepted, so they fit in memory.
    pub(super) fn apply(&self, image: &mut Pages) {
        match self {
            DataOp::Write { offset, data } => image.write(to_usize(*offset), data),
            DataOp::Truncate { len } => image.truncate(to_usize(*len)),
        }
    }
}

fn to_usize(n: u64) -> usize {
    // Callers bound every length by `max_file_bytes`; on a 32-bit host a
    // larger config is a setup bug, not a simulated fault.
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// How much the kernel has promised about one data op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// Written to the page cache only.
    Unsynced,
    /// A `sync` covering it failed: it may or may not be on disk, and no
    /// later `sync` will say otherwise (Linux marks the pages clean).
    Unknown,
    /// A `sync` covering it completed.
    Synced,
}

#[derive(Debug, Clone)]
pub(super) struct LoggedOp {
    pub op: DataOp,
    pub durability: Durability,
}

/// One file's data, identified by inode, independent of any name.
#[derive(Debug, Clone, Default)]
pub(super) struct Inode {
    pub visible: Pages,
    pub base: Pages,
    pub log: Vec<LoggedOp>,
}

impl Inode {
    pub(super) fn push(&mut self, op: DataOp) {
        op.apply(&mut self.visible);
        self.log.push(LoggedOp {
            op,
            durability: Durability::Unsynced,
        });
    }

    /// `fsync` completed: everything written so far is durable, except ops
    /// already `Unknown` (their fate was sealed by the earlier failure).
    pub(super) fn synced(&mut self) {
        for entry in &mut self.log {
            if entry.durability == Durability::Unsynced {
                entry.durability = Durability::Synced;
            }
        }
        self.fold();
    }

    /// Power was cut in the middle of this file's `fsync`: the pages for
    /// which `reached(page)` says so were written with their current
    /// content (every unsynced piece on them becomes durable), the rest
    /// stay unsynced (a power loss decides them as any unsynced write: the
    /// kernel may have written them back before the `fsync` began). Each
    /// unsynced write is split at page boundaries, so a multi-page write
    /// can land as any subset of its pages, not only a prefix; a truncate
    /// (metadata) reached disk as a whole or not. Unknown ops stay unknown.
    pub(super) fn partly_synced(&mut self, reached: &mut impl FnMut(u64) -> bool) {
        let mut log = Vec::with_capacity(self.log.len());
        for entry in self.log.drain(..) {
            match (entry.durability, entry.op) {
                (Durability::Unsynced, DataOp::Write { offset, data }) => {
                    let mut at = 0usize;
                    while at < data.len() {
                        let offset_bytes = offset + at as u64;
                        let page = offset_bytes / PAGE_BYTES;
                        let page_end = ((page + 1) * PAGE_BYTES - offset_bytes) as usize;
                        let end = data.len().min(at + page_end);
                        let durability = if reached(page) {
                            Durability::Synced
                        } else {
                            Durability::Unsynced
                        };
                        log.push(LoggedOp {
                            op: DataOp::Write {
                                offset: offset_bytes,
                                data: data[at..end].to_vec(),
                            },
                            durability,
                        });
                        at = end;
                    }
                }
                (Durability::Unsynced, op @ DataOp::Truncate { len }) => {
                    let durability = if reached(len / PAGE_BYTES) {
                        Durability::Synced
                    } else {
                        Durability::Unsynced
                    };
                    log.push(LoggedOp { op, durability });
                }
                (durability, op) => log.push(LoggedOp { op, durability }),
            }
        }
        self.log = log;
        self.fold();
    }

    /// Fold the leading durable ops into `base`.
    fn fold(&mut self) {
        let durable = self
            .log
            .iter()
            .take_while(|e| e.durability == Durability::Synced)
            .count();
        for entry in self.log.drain(..durable) {
            entry.op.apply(&mut self.base);
        }
    }

    /// Every write is synced.
    pub(super) fn is_durable(&self) -> bool {
        self.log.iter().all(|e| e.durability == Durability::Synced)
    }

    /// `fsync` failed: unsynced ops become unknown (Linux fsync semantics).
    pub(super) fn sync_failed(&mut self) {
        for entry in &mut self.log {
            if entry.durability == Durability::Unsynced {
                entry.durability = Durability::Unknown;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DataOp, Pages};

    fn write(image: &mut Pages, offset: u64, data: &[u8]) {
        DataOp::Write {
            offset,
            data: data.to_vec(),
        }
        .apply(image);
    }

    #[test]
    fn a_partial_fsync_splits_writes_at_pages_and_keeps_visible_intact() {
        use super::{Durability, Inode, PAGE_BYTES};
        let mut inode = Inode::default();
        let page = PAGE_BYTES as usize;
        inode.push(DataOp::Write {
            offset: 10,
            data: vec![1; 3 * page],
        });
        inode.push(DataOp::Write {
            offset: 0,
            data: vec![2; 5],
        });
        let visible = inode.visible.clone();
        // Pages 1 and 3 reached the disk, 0 and 2 did not.
        inode.partly_synced(&mut |p| p % 2 == 1);
        assert_eq!(inode.visible, visible);
        let mut replayed = inode.base.clone();
        inode.log.iter().for_each(|e| e.op.apply(&mut replayed));
        assert_eq!(replayed, visible, "visible == apply(base, log)");
        let synced: Vec<u64> = inode
            .log
            .iter()
            .filter(|e| e.durability == Durability::Synced)
            .map(|e| match &e.op {
                DataOp::Write { offset, .. } => offset / PAGE_BYTES,
                DataOp::Truncate { .. } => u64::MAX,
            })
            .collect();
        assert_eq!(synced, [1, 3], "the durable pieces are exactly pages 1 and 3");
        // Pieces never straddle a page.
        for e in &inode.log {
            if let DataOp::Write { offset, data } = &e.op {
                assert_eq!(offset / PAGE_BYTES, (offset + data.len() as u64 - 1) / PAGE_BYTES);
            }
        }
    }

    #[test]
    fn writes_overwrite_straddle_append_and_zero_fill_gaps() {
        let mut image = Pages::from(&b"abcdef"[..]);
        write(&mut image, 1, b"XY"); // inside
        assert_eq!(image.to_vec(), b"aXYdef");
        write(&mut image, 4, b"1234"); // straddles the end
        assert_eq!(image.to_vec(), b"aXYd1234");
        write(&mut image, 8, b"!"); // appends
        assert_eq!(image.to_vec(), b"aXYd1234!");
        write(&mut image, 11, b"z"); // past the end: a zero-filled hole
        assert_eq!(image.to_vec(), b"aXYd1234!\0\0z");
        write(&mut image, 2, b""); // empty: no change
        assert_eq!(image.to_vec(), b"aXYd1234!\0\0z");
        DataOp::Truncate { len: 3 }.apply(&mut image);
        assert_eq!(image.to_vec(), b"aXY");
    }
}
