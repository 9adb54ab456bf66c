//! Canaries: a runtime switch that re-introduces known bug classes, so the
//! harness can prove it finds them (a fault the harness claims to find must
//! be shown found).
//!
//! Invariant: with [`Canaries::none`] (the default, and the only value
//! production code ever builds) every branch guarded by a canary behaves
//! correctly; each canary flips exactly one well-known mistake, in the
//! component named in its doc. Without the `canaries` cargo feature (which
//! only the harness and the tests enable) no canary can be switched on at
//! all: [`Canaries::only`] does not exist and [`Canaries::has`] is `false`
//! whatever a set holds, so the guarded branches compile away.

use std::collections::BTreeSet;

/// One known bug class. The names are stable: they appear in test output,
/// CLI flags and the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Canary {
    /// Atomic writes skip the fsync of the temp file before the rename.
    NoFsyncBeforeRename,
    /// Atomic writes and file creation skip the directory fsync.
    NoDirFsync,
    /// An operation is acknowledged before its log entry is durable.
    AckBeforeLog,
    /// Log recovery skips truncating a partial trailing line.
    NoPartialLineRepair,
    /// `message.delivered` is logged before the message reaches the inbox.
    DeliveredBeforeDelivery,
    /// `emit()` inserts a trigger without honouring its dedup key.
    TriggerWithoutDedup,
    /// An irreversible tool's side effect happens before its INTENT is recorded.
    SideEffectBeforeIntent,
    /// Resume from a checkpoint skips rolling back messages past it.
    CheckpointRollbackSkipped,
    /// Each attempt of a call derives its idempotency key from the
    /// agent's turn count, not the key its durable decision gave it (from
    /// the work it performs, or the prompt): resumed after a crash, once
    /// the agent did any other turn, its calls carry new keys.
    TriggerTurnKeyedByTurn,
    /// A re-claimed trigger runs its turn again although the turn had
    /// completed before the crash (only the ack was lost).
    TriggerTurnRerun,
    /// A trigger ack checks only that the row is CLAIMED, not that the
    /// acking claim still holds the lease.
    AckIgnoresLease,
    /// Messages a turn reads are logged delivered when collected, before
    /// the turn (seed 002's known gap): a turn lost in a crash loses them.
    DeliveredAtCollect,
    /// `RealFs::sync` returns without calling fsync (a process death
    /// cannot see it: only a power cut, e.g. the soak's `--power-cut`).
    RealFsSyncNoop,
    /// `RealFs::sync_dir` returns without fsyncing the directory (likewise
    /// visible only to a power cut).
    RealFsSyncDirNoop,
    /// The SQLite VFS's `xRead` takes one `read_at` as the whole answer: a
    /// short read (which POSIX allows) reaches SQLite as end of file,
    /// zero-filled.
    NonLoopingReader,
    /// Log entries and session records are loaded without verifying their
    /// checksum: a bit flipped at rest is accepted as data.
    NoChecksumVerify,
    /// An irreversible call that needs a human's confirmation is answered
    /// `ok: false` and the turn goes on (it completes, its trigger is
    /// acked DONE): the work that depends on it is not blocked.
    ConfirmationNotBlocking,
    /// A resumed turn ignores its interrupted round's durable decision
    /// and asks the model again for that round (the hole seed 001 §4.2
    /// describes): a model that words the call differently makes a new
    /// idempotency key, and an irreversible call in flight can happen
    /// twice.
    ReaskDecidedRound,
    /// The worker core acks a trigger DONE when its turn starts, before
    /// the turn's effects are durable: a crash mid-turn leaves a DONE
    /// trigger whose work never completed.
    TriggerAckedBeforeTurn,
    /// The worker core emits a schedule bucket's trigger without its
    /// dedup key (keyed by row id): after a restart the bucket already
    /// emitted is not found and fires again.
    ScheduleBucketWithoutKey,
}

impl Canary {
    /// Every canary, in a stable order.
    pub const ALL: [Canary; 20] = [
        Canary::NoFsyncBeforeRename,
        Canary::NoDirFsync,
        Canary::AckBeforeLog,
        Canary::NoPartialLineRepair,
        Canary::DeliveredBeforeDelivery,
        Canary::TriggerWithoutDedup,
        Canary::SideEffectBeforeIntent,
        Canary::CheckpointRollbackSkipped,
        Canary::TriggerTurnKeyedByTurn,
        Canary::TriggerTurnRerun,
        Canary::AckIgnoresLease,
        Canary::DeliveredAtCollect,
        Canary::RealFsSyncNoop,
        Canary::RealFsSyncDirNoop,
        Canary::NonLoopingReader,
        Canary::NoChecksumVerify,
        Canary::ConfirmationNotBlocking,
        Canary::ReaskDecidedRound,
        Canary::TriggerAckedBeforeTurn,
        Canary::ScheduleBucketWithoutKey,
    ];
}

/// The set of enabled canaries (empty in production).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Canaries(BTreeSet<Canary>);

impl Canaries {
    /// No bug re-introduced: the correct runtime.
    pub fn none() -> Self {
        Canaries(BTreeSet::new())
    }

    /// Exactly one bug re-introduced (harness and test builds only).
    #[cfg(feature = "canaries")]
    pub fn only(canary: Canary) -> Self {
        Canaries(BTreeSet::from([canary]))
    }

    /// Whether `canary` is enabled: never without the `canaries` feature.
    pub fn has(&self, canary: Canary) -> bool {
        cfg!(feature = "canaries") && self.0.contains(&canary)
    }
}
