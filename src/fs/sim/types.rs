//! The public vocabulary of [`super::SimFs`]: crash modes, faults, the
//! config with its named probabilities, and the trace entry.
//!
//! Invariant: everything here is plain data (serde-serialisable) so a run is
//! reproducible from a `SimConfig`, a `Fault` and the op sequence.

use serde::{Deserialize, Serialize};

/// When an unsynced directory operation reaches disk under power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DirModel {
    /// Creates/renames/removes are durable only after `sync_dir` of their
    /// directory; before that each may or may not have reached disk.
    Strict,
    /// ext4-like (data=ordered, auto_da_alloc): a directory operation is
    /// also durable once a later `sync` of a file in the same directory, or
    /// of the created/renamed file itself, has completed (see the module doc
    /// of [`super`] for the exact rule).
    Eager,
}

/// What a crash does to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CrashMode {
    /// kill -9 / OOM: the OS page cache survives, so everything written does.
    ProcessCrash,
    /// Power loss: each file falls back to its durable image plus a seeded
    /// subset of unsynced writes (possibly torn); unsynced directory
    /// operations per the [`DirModel`].
    PowerLoss(DirModel),
}

/// Kind of an injected I/O error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailKind {
    /// EIO (`ErrorKind::Other`). A failed `sync` leaves unsynced data unknown.
    Eio,
    /// ENOSPC (`ErrorKind::StorageFull`).
    Enospc,
}

/// A fault armed at one numbered I/O point (points count from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Fault {
    /// Points `1..n` happen; point `n` is torn or not done; every later call
    /// fails until [`super::SimFs::restart`].
    CrashAt(u64),
    /// Point `n` fails with the given error and has no effect (a failed
    /// `sync` leaves that file's unsynced data unknown).
    FailAt(u64, FailKind),
    /// Point `n` takes effect but the caller gets EIO.
    LostReplyAt(u64),
}

/// Tunables of the fault model. Every random choice draws from `seed`.
///
/// Probabilities are plain fields with defaults (turmoil-fs style); set them
/// to 0.0 or 1.0 to pin a behaviour in a test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SimConfig {
    /// The one random source of the run (ChaCha8).
    pub seed: u64,
    /// Power loss: chance that one unsynced (or unknown) write or truncate
    /// reached the platter anyway. Each is drawn independently, so the
    /// survivors are any subset, applied in their original order.
    pub unsynced_write_survival: f64,
    /// Chance that a surviving unsynced write, or a write interrupted by
    /// `CrashAt`, lands as a strict prefix (torn) instead of whole.
    pub torn_write_probability: f64,
    /// Power loss: chance that one unsynced directory operation (create,
    /// rename, remove, mkdir) reached disk anyway.
    pub dir_op_survival: f64,
    /// `CrashAt(n)`: chance that the op at point `n` took effect (possibly
    /// torn) before the process died.
    pub crash_point_done_probability: f64,
    /// Limit on any file's length; writes past it fail with `FileTooLarge`
    /// (TigerBeetle rule: put a limit on everything).
    pub max_file_bytes: u64,
    /// Chance that a `read_at` of two or more available bytes returns
    /// fewer (at least one), as `pread(2)` may. Decided by the point
    /// number alone, never by the seed's RNG (see [`SimConfig::short_read`]).
    pub short_read_probability: f64,
}

impl SimConfig {
    pub const DEFAULT_UNSYNCED_WRITE_SURVIVAL: f64 = 0.5;
    pub const DEFAULT_TORN_WRITE_PROBABILITY: f64 = 0.3;
    pub const DEFAULT_DIR_OP_SURVIVAL: f64 = 0.5;
    pub const DEFAULT_CRASH_POINT_DONE_PROBABILITY: f64 = 0.5;
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;
    /// Off unless asked for: a test reading a file with one `read_at` on
    /// purpose is not a reader under test.
    pub const DEFAULT_SHORT_READ_PROBABILITY: f64 = 0.0;

    pub fn new(seed: u64) -> Self {
        SimConfig {
            seed,
            unsynced_write_survival: Self::DEFAULT_UNSYNCED_WRITE_SURVIVAL,
            torn_write_probability: Self::DEFAULT_TORN_WRITE_PROBABILITY,
            dir_op_survival: Self::DEFAULT_DIR_OP_SURVIVAL,
            crash_point_done_probability: Self::DEFAULT_CRASH_POINT_DONE_PROBABILITY,
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            short_read_probability: Self::DEFAULT_SHORT_READ_PROBABILITY,
        }
    }

    /// How many of `available` bytes the `read_at` at `point` returns.
    /// A pure function of the point number (splitmix64), not a draw from
    /// the run's RNG: reads then change no later draw, and a copied
    /// install or a rebooted crash image reads exactly as the run it was
    /// taken from, whatever its seed.
    pub fn short_read(&self, point: u64, available: usize) -> usize {
        if available < 2 || self.short_read_probability <= 0.0 {
            return available;
        }
        let h = splitmix64(point ^ 0x5bd1_e995_0d1c_a7e5);
        let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
        if unit >= self.short_read_probability {
            return available;
        }
        1 + (splitmix64(h) % (available as u64 - 1)) as usize
    }

    /// Clamp every probability into `[0, 1]` (a NaN becomes 0) so a
    /// hand-edited config cannot make the RNG panic.
    pub(super) fn sanitized(mut self) -> Self {
        for p in [
            &mut self.unsynced_write_survival,
            &mut self.torn_write_probability,
            &mut self.dir_op_survival,
            &mut self.crash_point_done_probability,
            &mut self.short_read_probability,
        ] {
            *p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        }
        self
    }
}

/// splitmix64's finaliser: a well-mixed hash of one word.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::new(0)
    }
}

/// The operation an I/O point performed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IoOp {
    CreateDir,
    Open,
    WriteAt,
    Append,
    ReadAt,
    Read,
    Len,
    Truncate,
    Sync,
    SyncDir,
    Rename,
    Remove,
    List,
    Exists,
}

impl IoOp {
    /// Whether the op can change the disk (reads and listings cannot).
    pub fn mutates(self) -> bool {
        !matches!(
            self,
            IoOp::ReadAt | IoOp::Read | IoOp::Len | IoOp::List | IoOp::Exists
        )
    }

    /// Stable one-byte code for [`super::SimFs::trace_hash`] (never reorder).
    pub(super) fn code(self) -> u8 {
        self as u8
    }
}

/// What happened at an I/O point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// The op succeeded.
    Ok,
    /// The op failed on its own terms (`NotFound`, `AlreadyExists`, ...).
    Err,
    /// The armed `CrashAt` fired here.
    Crashed,
    /// The armed `FailAt` fired here.
    Failed(FailKind),
    /// The armed `LostReplyAt` fired here: effect taken, caller got EIO.
    LostReply,
}

impl Outcome {
    /// Stable one-byte code for [`super::SimFs::trace_hash`].
    pub(super) fn code(self) -> u8 {
        match self {
            Outcome::Ok => 0,
            Outcome::Err => 1,
            Outcome::Crashed => 2,
            Outcome::Failed(FailKind::Eio) => 3,
            Outcome::Failed(FailKind::Enospc) => 4,
            Outcome::LostReply => 5,
        }
    }
}

/// One numbered I/O point in the trace. For a rename `path` is
/// `"<from> -> <to>"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceEntry {
    pub point: u64,
    pub op: IoOp,
    pub path: String,
    pub label: String,
    pub outcome: Outcome,
}
