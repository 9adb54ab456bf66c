//! Silent corruption (bit rot at rest) for the `PowerRot` crash mode: after
//! the power loss, one bit of one complete, durable line of an event log
//! or a session record is flipped, and the reboot must notice.
//!
//! Invariant: a rot only ever hits bytes that were durable *before* the
//! crash (the durable floor, [`durable_agent::fs::SimFs::durable_image`])
//! and that the power loss left as they were, inside a line that ends
//! with its newline there — never a torn or unacknowledged tail, never the
//! newline itself, never a line with a hole of zeros (the torn append of
//! an fsync the crash cut short, which only looks complete) — nor the
//! newline itself (a flipped last newline would turn a durable line into
//! what a torn append looks like: no reader can tell them apart, a limit
//! stated in sim/RELAXATIONS.md). The choice is a pure function of (seed,
//! crash point), so a forked crash image and a replay rot the same bit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use durable_agent::fs::sim::IoOp;
use durable_agent::fs::SimFs;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One flipped bit, and where the boot must say the damage is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rot {
    pub path: PathBuf,
    /// 1-based line of the file holding the flipped byte.
    pub line: u64,
    /// Byte offset of that line's start.
    pub line_offset: u64,
    /// Byte offset of the flipped byte.
    pub byte_offset: u64,
    pub mask: u8,
    /// The disk's point count when the bit flipped (reads after it are
    /// the boot's).
    pub at_point: u64,
    /// The byte's value before the flip.
    pub original: u8,
    /// The line is its log's last and `events.pending` beside it holds
    /// exactly its bytes (the writer keeps the last append's copy durable):
    /// the boot has everything it needs to replace it, so it must
    /// ([`crate::oracle::RotVerdict::Replaced`]), not refuse.
    pub replaceable: bool,
}

/// Files that carry checksummed lines: event logs and session records.
pub fn is_target(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("events.jsonl" | "session.json")
    )
}

/// Flip one bit of `fs` (rebooted after a power loss) in a line that was
/// complete in `floor` (the durable image of [`is_target`] files taken
/// before the crash) and is unchanged on the disk. `None` when there is no
/// such line (nothing durable yet).
pub fn strike(fs: &SimFs, floor: &BTreeMap<PathBuf, Vec<u8>>, seed: u64, point: u64) -> Option<Rot> {
    let disk = fs.disk_image_where(is_target);
    // (path, line number, start, end without the newline)
    let mut lines: Vec<(&PathBuf, u64, usize, usize)> = Vec::new();
    for (path, durable) in floor {
        let Some(now) = disk.get(path) else { continue };
        let mut start = 0;
        let mut number = 0;
        while let Some(nl) = durable[start..].iter().position(|&b| b == b'\n') {
            number += 1;
            let end = start + nl;
            let unchanged = now.get(start..=end) == Some(&durable[start..=end]);
            // A NUL byte is never in a JSON line: it is a hole an fsync the
            // crash cut short left (a later page of the append durable, an
            // earlier one not): a torn, unacknowledged append, whose whole
            // entry `events.pending` holds — not a durable line to rot.
            let hole = durable[start..end].contains(&0);
            if end > start && unchanged && !hole {
                lines.push((path, number, start, end));
            }
            start = end + 1;
        }
    }
    if lines.is_empty() {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ point.rotate_left(32) ^ 0x726f_7421);
    let (path, line, start, end) = lines[rng.random_range(0..lines.len())];
    let byte = rng.random_range(start..end);
    let mask = 1u8 << rng.random_range(0..8);
    let now = disk.get(path)?;
    let original = *now.get(byte)?;
    let last_line = !now.get(end + 1..).unwrap_or_default().contains(&b'\n');
    let replaceable = last_line && path.file_name().and_then(|n| n.to_str()) == Some("events.jsonl") && {
        let pending = path.with_file_name("events.pending");
        let copy = fs.disk_image_where(|p| p == pending);
        copy.get(&pending).map(Vec::as_slice) == now.get(start..=end)
    };
    fs.rot(path, byte as u64, mask).ok()?;
    Some(Rot {
        path: path.clone(),
        line,
        line_offset: start as u64,
        byte_offset: byte as u64,
        mask,
        at_point: fs.points(),
        original,
        replaceable,
    })
}

impl Rot {
    /// Whether anything read the rotted file since the flip.
    pub fn read_since(&self, fs: &SimFs) -> bool {
        let shown = self.path.display().to_string();
        fs.trace_from(self.at_point + 1)
            .iter()
            .any(|e| matches!(e.op, IoOp::Read | IoOp::ReadAt) && e.path == shown)
    }

    /// Whether the flipped byte holds its original value again: recovery
    /// replaced the line (see [`crate::oracle::RotVerdict::Replaced`]).
    pub fn replaced(&self, fs: &SimFs) -> bool {
        let disk = fs.disk_image_where(|p| p == self.path);
        let at = usize::try_from(self.byte_offset).unwrap_or(usize::MAX);
        disk.get(&self.path).and_then(|b| b.get(at)) == Some(&self.original)
    }

    /// Flip the bit back (the operator restored the line from a backup,
    /// or a scrub repaired a flip nobody had read), so the run goes on
    /// from the disk the crash left. A file recovery removed stays gone.
    pub fn restore(&self, fs: &SimFs) {
        let _ = fs.rot(&self.path, self.byte_offset, self.mask);
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "bit rot: byte {} (mask {:#04x}) of {} line {} (line starts at byte {})",
            self.byte_offset,
            self.mask,
            self.path.display(),
            self.line,
            self.line_offset
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};

    use super::strike;

    /// A line with a hole (an append whose fsync the crash cut short) is
    /// never taken for a durable line: only the complete one is struck.
    #[test]
    fn a_line_with_a_hole_of_zeros_is_never_struck() {
        let durable_line = b"{\"a\":1}\n".to_vec();
        let holed_line = b"{\"b\0\0\0\0}\n".to_vec();
        for seed in 0..64 {
            let fs = SimFs::new(SimConfig::new(seed));
            let path = PathBuf::from("/s/events.jsonl");
            fs.create_dir_all(&PathBuf::from("/s"), "mkdir").expect("mkdir");
            fs.open(&path, OpenMode::Create, "create").expect("create");
            let mut bytes = durable_line.clone();
            bytes.extend_from_slice(&holed_line);
            fs.append(&path, &bytes, "append").expect("append");
            fs.sync(&path, "sync").expect("sync");
            fs.sync_dir(&PathBuf::from("/s"), "sync dir").expect("sync dir");
            let floor = BTreeMap::from([(path.clone(), bytes.clone())]);
            let rot = strike(&fs, &floor, seed, 1).expect("a durable line to strike");
            assert_eq!(rot.line, 1, "seed {seed}: struck the holed line");
            assert!(rot.byte_offset < durable_line.len() as u64 - 1);
        }
    }
}
