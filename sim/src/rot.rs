//! Damage at rest for the `PowerRot` crash mode: after the power loss,
//! one complete, durable line of an event log or a session record is
//! changed under the runtime, and the reboot must notice. Three kinds
//! ([`Damage`]): a flipped bit (bit rot), the line as a newer version of
//! durable-agent writes it (a downgrade: the input no build of this one
//! ever produced), and a gap (the line's `seq` skips one, as a log that
//! lost a line mid-file reads). The last two carry a valid checksum: only
//! the reader's version and `seq` checks can tell. An older version's
//! line (unsealed) must be read. And one time in eight, when the disk has
//! something to lose, a loss instead ([`Damage::Lost`], [`crate::loss`]):
//! `store.db`, lines off a log's end, a session record, or a parent's
//! directory, lost at rest; the whole disk is kept aside first and put
//! back after the boot is judged.
//!
//! Invariant: a line damage only ever hits bytes that were durable *before* the
//! crash (the durable floor, [`durable_agent::fs::SimFs::durable_image`])
//! and that the power loss left as they were, inside a line that ends
//! with its newline there — never a torn or unacknowledged tail, never the
//! newline itself, never a line with a hole of zeros (the torn append of
//! an fsync the crash cut short, which only looks complete) — nor the
//! newline itself (a flipped last newline would turn a durable line into
//! what a torn append looks like: no reader can tell them apart, a limit
//! stated in sim/RELAXATIONS.md), and never a line without a checksum
//! (an older version's, which nothing promises to check). The choice is a
//! pure function of (seed,
//! crash point), so a forked crash image and a replay damage the same
//! bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use durable_agent::checksum::{self, Sealed};
use durable_agent::fs::sim::IoOp;
use durable_agent::fs::SimFs;
use durable_agent::log::CHECKSUM_VERSION;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What was done to the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// One bit flipped: the checksum (or the line's shape) must say so.
    Flip,
    /// `schema_version` one above this build's, the line resealed: the
    /// boot must refuse it as newer (never as damage, never as data).
    Newer,
    /// `seq` one above what the line held, resealed (the log reads as if
    /// the line before it were lost): the boot must refuse it as corrupt.
    /// Never the log's last line.
    Gap,
    /// An event-log line of the first sealed version rewritten as the
    /// version before it writes it (no seal, padded with the spaces JSON
    /// allows to keep its length): an upgrade reads old logs, so the boot
    /// must read it as the same entry. Left in place (not undone).
    Older,
    /// A file, or lines off a log's end, lost at rest
    /// ([`crate::loss`]): the boot must refuse it as damage naming the
    /// file. `line` is then the first missing line (lost entries) or 0.
    Lost(crate::loss::Loss),
}

/// The damaged line, and where the boot must say the damage is.
#[derive(Debug, Clone)]
pub struct Rot {
    pub damage: Damage,
    pub path: PathBuf,
    /// 1-based line of the file holding the changed bytes.
    pub line: u64,
    /// Byte offset of that line's start.
    pub line_offset: u64,
    /// Each changed byte: (offset, xor mask, value before the change).
    /// One entry for a [`Damage::Flip`], the first its flipped byte.
    pub bytes: Vec<(u64, u8, u8)>,
    /// The disk's point count when the damage was done (reads after it are
    /// the boot's).
    pub at_point: u64,
    /// A flipped bit in the log's last line when `events.pending` beside
    /// it holds exactly its bytes (the writer keeps the last append's copy
    /// durable): the boot has everything it needs to replace it, so it
    /// must ([`crate::oracle::RotVerdict::Replaced`]), not refuse. Never
    /// a newer or gap line (it is not damage a copy undoes).
    pub replaceable: bool,
    /// The whole disk before a [`Damage::Lost`], which [`Rot::restore`]
    /// puts back (a flip or rewrite is undone byte by byte instead).
    pub backup: Option<durable_agent::fs::DiskBackup>,
    /// A lost parent's ([`crate::loss::Loss::Parent`]): the session
    /// directories the boot must terminate. Empty otherwise.
    pub cut_off: Vec<PathBuf>,
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
    // The kind from its own stream, so a flip hits the byte it always
    // did; one time in eight a loss ([`crate::loss`]) instead, when the
    // disk has something to lose.
    let mut kinds = ChaCha8Rng::seed_from_u64(seed ^ point.rotate_left(17) ^ 0x6b69_6e64);
    let kind = kinds.random_range(0..8u8);
    if kind == 3 {
        if let Some(rot) = crate::loss::strike(fs, seed, point) {
            return Some(rot);
        }
    }
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
            // Only a sealed line: one of the version before checksums (an
            // earlier `Damage::Older`) carries nothing a flip could be
            // caught by, and none is promised (GUARANTEES 11a).
            let sealed = checksum::check(&durable[start..end]) == Sealed::Verified;
            if end > start && unchanged && !hole && sealed {
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
    let last_line = !now.get(end + 1..).unwrap_or_default().contains(&b'\n');
    let is_log = path.file_name().and_then(|n| n.to_str()) == Some("events.jsonl");
    let replaceable = last_line && is_log && {
        let pending = path.with_file_name("events.pending");
        let copy = fs.disk_image_where(|p| p == pending);
        copy.get(&pending).map(Vec::as_slice) == now.get(start..=end)
    };
    // A kind the line cannot take (or a rewrite that changes its length)
    // falls back to the flip.
    let wanted = match kind {
        0 if !replaceable => Damage::Newer,
        1 if is_log && !last_line => Damage::Gap,
        // Not the last line: its `events.pending` copy would be the
        // older version's too (the writer keeps it equal to the line).
        2 if is_log && !last_line => Damage::Older,
        _ => Damage::Flip,
    };
    let original = now.get(start..end)?;
    let rewritten = match wanted {
        Damage::Flip | Damage::Lost(_) => None,
        // 9: newer than any version this build knows, one digit as the
        // versions it writes are (so the line keeps its length).
        Damage::Newer => rewrite(original, "schema_version", |v| v.max(9)),
        Damage::Gap => rewrite(original, "seq", |v| v + 1),
        Damage::Older => unseal_as_older(original),
    };
    let (damage, bytes) = match rewritten {
        Some(new) => {
            let changed: Vec<(u64, u8, u8)> = original
                .iter()
                .zip(&new)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| ((start + i) as u64, a ^ b, *a))
                .collect();
            (wanted, changed)
        }
        None => (Damage::Flip, vec![(byte as u64, mask, *now.get(byte)?)]),
    };
    for (at, mask, _) in &bytes {
        fs.rot(path, *at, *mask).ok()?;
    }
    Some(Rot {
        damage,
        path: path.clone(),
        line,
        line_offset: start as u64,
        bytes,
        at_point: fs.points(),
        replaceable: replaceable && damage == Damage::Flip,
        backup: None,
        cut_off: Vec::new(),
    })
}

/// A sealed line's object without its seal and closing brace (`{…`),
/// when the seal verifies: what the rewrites below edit and seal again.
fn sealed_body(line: &[u8]) -> Option<&str> {
    if checksum::check(line) != Sealed::Verified {
        return None;
    }
    std::str::from_utf8(line.get(..line.len().checked_sub(checksum::SEAL_BYTES + 1)?)?).ok()
}

/// `line` (an event-log entry sealed at [`CHECKSUM_VERSION`], without
/// its newline) as the version before writes it: the same members, no
/// seal, `schema_version` one lower, padded with spaces to its length.
fn unseal_as_older(line: &[u8]) -> Option<Vec<u8>> {
    let object = sealed_body(line)?;
    let sealed_version = format!("{{\"schema_version\":{CHECKSUM_VERSION},");
    let rest = object.strip_prefix(&sealed_version)?;
    let older = format!("{{\"schema_version\":{},{rest}}}", CHECKSUM_VERSION - 1);
    let mut bytes = older.into_bytes();
    (bytes.len() <= line.len()).then(|| {
        bytes.resize(line.len(), b' ');
        bytes
    })
}

/// `line` (a sealed JSON object, without its newline) with the integer
/// member `key` mapped through `f` and sealed again, when the result has
/// the same length (the damage is done in place, byte by byte).
fn rewrite(line: &[u8], key: &str, f: impl Fn(u64) -> u64) -> Option<Vec<u8>> {
    let object = sealed_body(line)?;
    let needle = format!("\"{key}\":");
    let at = object.find(&needle)? + needle.len();
    let digits = object[at..].bytes().take_while(u8::is_ascii_digit).count();
    let value: u64 = object.get(at..at + digits)?.parse().ok()?;
    let changed = format!("{}{}{}}}", &object[..at], f(value), &object[at + digits..]);
    let sealed = checksum::seal(&changed).into_bytes();
    (sealed.len() == line.len() && sealed != line).then_some(sealed)
}

impl Rot {
    /// Whether anything read the damaged file since the damage.
    pub fn read_since(&self, fs: &SimFs) -> bool {
        let shown = self.path.display().to_string();
        fs.trace_from(self.at_point + 1)
            .iter()
            .any(|e| matches!(e.op, IoOp::Read | IoOp::ReadAt) && e.path == shown)
    }

    /// Whether every changed byte holds its original value again: recovery
    /// replaced the line (see [`crate::oracle::RotVerdict::Replaced`]).
    pub fn replaced(&self, fs: &SimFs) -> bool {
        let disk = fs.disk_image_where(|p| p == self.path);
        self.bytes.iter().all(|(at, _, original)| {
            let at = usize::try_from(*at).unwrap_or(usize::MAX);
            disk.get(&self.path).and_then(|b| b.get(at)) == Some(original)
        })
    }

    /// Undo the damage (the operator restored the line from a backup, or
    /// a scrub repaired a flip nobody had read), so the run goes on from
    /// the disk the crash left. A file recovery removed stays gone.
    pub fn restore(&self, fs: &SimFs) {
        if let Some(backup) = &self.backup {
            fs.restore_backup(backup);
        }
        for (at, mask, _) in &self.bytes {
            let _ = fs.rot(&self.path, *at, *mask);
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        let what = match (self.damage, self.bytes.first()) {
            (Damage::Flip, Some((at, mask, _))) => format!("bit rot: byte {at} (mask {mask:#04x}) of"),
            (Damage::Newer, _) => "a newer version's line (schema_version raised, resealed):".into(),
            (Damage::Gap, _) => "a gap (the line's seq raised by one, resealed):".into(),
            (Damage::Older, _) => "an older version's line (unsealed, schema_version lowered):".into(),
            (Damage::Lost(loss), _) => format!("lost at rest ({loss:?}):"),
            (Damage::Flip, None) => "bit rot in".into(),
        };
        if self.line == 0 {
            // A lost file or directory: no line to name.
            let cut_off = if self.cut_off.is_empty() {
                String::new()
            } else {
                format!(" (cutting off {:?})", self.cut_off)
            };
            return format!("{what} {}{cut_off}", self.path.display());
        }
        format!(
            "{what} {} line {} (line starts at byte {})",
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
        // Both sealed (damage strikes sealed lines only), so only the
        // hole of zeros tells the torn append from a durable line.
        let durable_line = format!("{}\n", durable_agent::checksum::seal("{\"a\":1}")).into_bytes();
        let holed_line = format!("{}\n", durable_agent::checksum::seal("{\"b\":\"\0\0\0\0\"}")).into_bytes();
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
            assert!(rot
                .bytes
                .iter()
                .all(|(at, _, _)| *at < durable_line.len() as u64 - 1));
        }
    }
}
