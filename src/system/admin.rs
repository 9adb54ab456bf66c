//! The operator's view of a [`System`]: what is stuck and waits for a
//! human, the answers a human can give, and garbage collection of settled
//! rows (seed 001 §9 phase 5: dead-letter surfacing and TTL GC).
//!
//! Every operation runs on the system's own stores and connection, under
//! the connection lock the agent loop's ledger calls take too, so an
//! answer never interleaves with a send. Each write is one guarded
//! transaction of the store it belongs to (a wrong state is a typed
//! [`crate::store::StoreError`] inside [`SystemError::Store`], nothing changed).
//!
//! Invariants kept here:
//! - no irreversible side effect twice: [`System::confirm`] only settles a
//!   NEEDS_CONFIRMATION row (see [`Resolution`] for why `NotDelivered`
//!   releases the key rather than re-sending it here), and [`System::gc`]
//!   never collects an INTENT or NEEDS_CONFIRMATION row, an in-flight
//!   tool call, nor any ledger row of an agent that may still resume
//!   (whose resumed turn would re-run their keys);
//! - no trigger lost: [`System::gc`] never collects a PENDING or CLAIMED
//!   trigger, and [`System::retry_trigger`] only moves DEAD/FAILED ones.
//!
//! The TTL must exceed every retry and resume horizon: a row collected
//! after it no longer deduplicates its key (see `store::triggers`,
//! `store::activities` and `store::tool_calls` GC docs).
//! [`DEFAULT_GC_TTL_MS`] is seed 001's 24 h.
//!
//! What a pass keeps whatever its age ([`Keep`]): an agent "may still
//! resume" when it has an open turn, a work it started and never
//! completed (a superseded work is resumed by its RESUME trigger or `run
//! --resume`, and re-runs its keys), or a parked plain turn — a turn
//! without a work id that a newer turn superseded, which a caller
//! re-sending the same prompt continues from its durable decisions with
//! the same keys. The runtime exposes no accessor for parked turns; the
//! ledger shows them: every call of a completed turn is in the agent's
//! conversation, so a ledger row of the agent's session whose call id is
//! not there belongs to a turn that never completed (open or parked) —
//! kept. Such an agent's activity rows, tool calls (its session's ledger
//! run), usage and error rows are all kept; so are the runs parked
//! `waiting_for_human` and the sessions of job runs not settled.
//!
//! [`System::strip_payloads`] (seed 001 §10's privacy note) replaces the
//! bodies of settled activity and tool-call rows after a shorter TTL,
//! keeping keys, statuses, times and provider references. It strips only
//! rows GC could delete — never those [`Keep`] names — because a settled
//! call asked again is answered from its stored result.

use serde::Serialize;

use super::tools::session_run;
use super::{System, SystemError};
use crate::runtime::ConversationItem;
use crate::sqlite::Db;
use crate::store::activities::{ActivityRecord, ActivityStatus, StripReport};
use crate::store::inspect::BOOKKEEPING_RUN_PREFIX;
use crate::store::tool_calls::{RunRecord, RunStatus, ToolCall, ToolCallGcReport, ToolCallStore};
use crate::store::triggers::{scheduled, GcReport, Trigger, TriggerStatus};
use crate::store::usage::{UsageGcReport, UsageStore};
use crate::store::StoreError;

pub use crate::store::activities::Resolution;

/// Seed 001's stale-row TTL: settled triggers and ledger rows are kept a
/// day after their last update.
pub const DEFAULT_GC_TTL_MS: u64 = 24 * 3600 * 1000;

/// A run parked `waiting_for_human`, with the calls a human should look
/// at.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingRun {
    pub run: RunRecord,
    /// Its calls still in flight, and those whose replays reached the
    /// limit (the one that parked the run is settled with its refusal),
    /// in creation order ([`ToolCallStore::stuck`]).
    pub stuck: Vec<ToolCall>,
}

/// What [`System::gc`] collected from each store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SystemGcReport {
    pub triggers: GcReport,
    pub activities: GcReport,
    /// Settled tool calls with their attempts, and settled runs.
    pub tool_calls: ToolCallGcReport,
    /// Token usage and error rows.
    pub usage: UsageGcReport,
}

/// What a GC pass leaves whatever its age (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Keep {
    /// Agents that may still resume: the activity ledger's `task_id` of
    /// their irreversible calls.
    agents: Vec<String>,
    /// Tool-call ledger runs: those agents' sessions' (`session:{id}`,
    /// see `SystemTools`) and the runs parked `waiting_for_human`.
    runs: Vec<String>,
    /// Sessions whose runs, usage and errors stay: those agents' and the
    /// sessions of runs not settled.
    sessions: Vec<String>,
}

/// What [`System::strip_payloads`] rewrote in each store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SystemStripReport {
    pub activities: StripReport,
    pub tool_calls: StripReport,
}

/// What [`System::confirm`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Confirmed {
    /// The key's status afterwards, `None` when `NotDelivered` released it
    /// for the resumed work to send.
    pub status: Option<ActivityStatus>,
    /// The triggers that were blocked on the key, PENDING again.
    pub retried: Vec<Trigger>,
}

/// Whether FAILED trigger `t` stopped at `idem_key`: the key belongs to
/// the trigger's work (work keys are `{work}-r{round}-…@{session}`, see
/// `runtime::work_idempotency_key`) and its last error names it.
fn blocked_on(t: &Trigger, idem_key: &str) -> bool {
    let work = System::trigger_work(t);
    idem_key.starts_with(&format!("{work}-r"))
        && t.last_error.as_deref().is_some_and(|e| e.contains(idem_key))
}

impl System {
    /// Dead-lettered triggers (used `max_attempts`), oldest first, with
    /// their `last_error` and `attempts`.
    pub fn dead_triggers(&self) -> Result<Vec<Trigger>, SystemError> {
        self.triggers_with(TriggerStatus::Dead)
    }

    /// Permanently failed triggers (the consumer said retrying is
    /// pointless), oldest first, with their `last_error` and `attempts`.
    pub fn failed_triggers(&self) -> Result<Vec<Trigger>, SystemError> {
        self.triggers_with(TriggerStatus::Failed)
    }

    fn triggers_with(&self, status: TriggerStatus) -> Result<Vec<Trigger>, SystemError> {
        let now = self.now_ms();
        Ok(self.triggers().with_status(self.db().conn(), status, now)?)
    }

    /// A human retries trigger `id`: DEAD/FAILED → PENDING now, attempts
    /// reset (see `TriggerStore::retry`). Any other state is
    /// `StoreError::WrongState`, a missing id `StoreError::NotFound`.
    pub fn retry_trigger(&self, id: &str) -> Result<Trigger, SystemError> {
        let now = self.now_ms();
        Ok(self.triggers().retry(self.db().conn(), id, now)?)
    }

    /// Irreversible actions whose fate a crash left unknown and whose
    /// provider cannot deduplicate: each waits for [`System::confirm`].
    /// Key, action, payload and created time are on the record.
    pub fn needs_confirmation(&self) -> Result<Vec<ActivityRecord>, SystemError> {
        let db = self.db();
        Ok(self
            .gate()
            .store()
            .with_status(db.conn(), ActivityStatus::NeedsConfirmation)?)
    }

    /// Whether the action `idem_key` waits for a human's answer
    /// (NEEDS_CONFIRMATION in the ledger).
    pub fn waits_for_human(&self, idem_key: &str) -> Result<bool, StoreError> {
        let db = self.db();
        let record = self.gate().store().get(db.conn(), idem_key)?;
        Ok(record.is_some_and(|r| r.status == ActivityStatus::NeedsConfirmation))
    }

    /// A human's answer for the NEEDS_CONFIRMATION action `idem_key`
    /// (see [`Resolution`]), which unblocks the work waiting on it: every
    /// FAILED trigger whose turn stopped at this key
    /// (`RuntimeError::NeedsConfirmation`) goes back to PENDING, so it
    /// resumes where it stopped and the ledger answers the call (or sends
    /// it once, after `NotDelivered`). A crash between the two steps
    /// leaves the trigger FAILED, listed, for [`Self::retry_trigger`]; GC
    /// keeps it, as its turn is unfinished ([`Self::still_needed`]).
    pub fn confirm(&self, idem_key: &str, resolution: &Resolution) -> Result<Confirmed, SystemError> {
        let now = self.now_ms();
        let status = {
            let db = self.db();
            self.gate()
                .store()
                .confirm(db.conn(), idem_key, resolution, now)?
        };
        let mut retried = Vec::new();
        for t in self.failed_triggers()? {
            if blocked_on(&t, idem_key) {
                tracing::info!(id = %t.id, idem_key, "confirmed: the blocked trigger runs again");
                retried.push(self.retry_trigger(&t.id)?);
            }
        }
        Ok(Confirmed { status, retried })
    }

    /// Runs the tool-call ledger parked `waiting_for_human`, oldest first
    /// (read-only; all reads under one connection lock, so one snapshot of
    /// what this writer committed).
    pub fn waiting_for_human(&self) -> Result<Vec<WaitingRun>, SystemError> {
        let store = ToolCallStore::default();
        let db = self.db();
        let conn = db.conn();
        let mut waiting = Vec::new();
        for run_id in store.run_ids(conn)? {
            let Some(run) = store.get_run(conn, &run_id)? else {
                continue;
            };
            if run.status == RunStatus::WaitingForHuman {
                let stuck = store.stuck(conn, &run_id)?;
                waiting.push(WaitingRun { run, stuck });
            }
        }
        Ok(waiting)
    }

    /// A human releases a run parked `waiting_for_human` (see
    /// `ToolCallStore::release`): `running` again, its in-flight calls'
    /// replay counts reset, so a resume replays them again. A call
    /// refused while the run was parked stays settled: the model read
    /// the refusal.
    ///
    /// Only an agent's session run (`session:…`, where its calls are
    /// counted) is parked by replays. A job run waits for a human only
    /// when its turn stopped on a call needing confirmation, which a
    /// release cannot answer: refused (unchanged), naming `confirm`.
    /// Before, it was set `running` while nothing could run it, and left
    /// the waiting list with its key still unanswered (found by a review).
    pub fn release_run(&self, run_id: &str) -> Result<RunRecord, SystemError> {
        let now = self.now_ms();
        let db = self.db();
        let store = ToolCallStore::default();
        if !run_id.starts_with(BOOKKEEPING_RUN_PREFIX) {
            let run = store.get_run(db.conn(), run_id)?;
            if run.is_some_and(|r| r.status == RunStatus::WaitingForHuman) {
                return Err(SystemError::AwaitsConfirmation {
                    run_id: run_id.to_string(),
                });
            }
        }
        Ok(store.release(db.conn(), run_id, now)?)
    }

    /// Collect settled rows older than `ttl_ms` (use [`DEFAULT_GC_TTL_MS`]
    /// unless you know every retry and resume horizon is shorter): DONE,
    /// FAILED and DEAD triggers — except those blocked on a confirmation,
    /// those whose work a boot would emit again or only they resume
    /// ([`Self::still_needed`]) and each schedule's newest bucket — then DONE and
    /// FAILED activity rows, settled tool calls with their attempts and
    /// settled runs, and usage and error rows — except everything [`Keep`]
    /// names (the rows of agents that may still resume, which resuming
    /// re-runs or shows).
    ///
    /// Four transactions, one per store, in this order; a crash between
    /// two leaves the later stores uncollected, and running `gc` again
    /// finishes (it is idempotent).
    pub fn gc(&self, ttl_ms: u64) -> Result<SystemGcReport, SystemError> {
        let now = self.now_ms();
        let keep = self.keep()?;
        // One reading of the triggers serves the three keep rules.
        let all = self.triggers().all(self.db().conn(), now)?;
        let mut kept = self.blocked_triggers(&all)?;
        kept.extend(self.still_needed(&all)?);
        kept.extend(schedule_marks(&all));
        let db = self.db();
        let conn = db.conn();
        let triggers = self.triggers().gc_keeping(conn, now, ttl_ms, &kept)?;
        let activities = self.gate().store().gc_keeping(conn, now, ttl_ms, &keep.agents)?;
        let tool_calls =
            ToolCallStore::default().gc_keeping(conn, now, ttl_ms, &keep.runs, &keep.sessions)?;
        let usage = UsageStore.gc_keeping(conn, now, ttl_ms, &keep.sessions)?;
        Ok(SystemGcReport {
            triggers,
            activities,
            tool_calls,
            usage,
        })
    }

    /// FAILED triggers blocked on a key still waiting for a human: the
    /// answer re-pends them ([`Self::confirm`]), so GC keeps them.
    fn blocked_triggers(&self, all: &[Trigger]) -> Result<Vec<String>, SystemError> {
        let keys = self.needs_confirmation()?;
        Ok(all
            .iter()
            .filter(|t| t.status == TriggerStatus::Failed)
            .filter(|t| keys.iter().any(|k| blocked_on(t, &k.idem_key)))
            .map(|t| t.id.clone())
            .collect())
    }

    /// Settled triggers (DONE, FAILED or DEAD) something still needs,
    /// whatever their age. Collecting one frees its dedup key, and the
    /// next boot would then emit its work afresh (PENDING, attempts 0),
    /// silently undoing a dead-letter or a settle by hand, or nothing
    /// would be left to resume it:
    /// - the RESUME trigger of a work still unfinished — boot's resume
    ///   pass emits `resume:{work}@{agent}` again (found by the fuzzer's
    ///   `gc` op);
    /// - the wake-up of a message still pending — boot's wake-up pass
    ///   emits `wake:{message}` again (found by a review; `system_admin`
    ///   tests);
    /// - a trigger whose own turn (`trigger:{key}`) started and never
    ///   completed — no RESUME trigger stands for it, only re-claiming the
    ///   trigger resumes it: an operator's retry, or a human's answer to
    ///   the call it stopped at (after a crash between
    ///   [`Self::confirm`]'s two steps, the trigger is FAILED and its key
    ///   answered, so [`Self::blocked_triggers`] no longer names it).
    ///
    /// Each is kept until its work completes, its message is read, its
    /// agent is deleted, or an operator retries it.
    fn still_needed(&self, all: &[Trigger]) -> Result<Vec<String>, SystemError> {
        let runtime = self.runtime();
        let mut keys = std::collections::BTreeSet::new();
        for agent in runtime.state().agents.keys() {
            for (work, _) in runtime.unfinished_work(agent)? {
                match work.strip_prefix("trigger:") {
                    Some(own) => keys.insert(own.to_string()),
                    None => keys.insert(super::resume::resume_key(agent, work)),
                };
            }
        }
        for agent in runtime.tree().nodes().keys() {
            for message in runtime.pending(agent) {
                keys.insert(super::wake::wake_key(&message.id));
            }
        }
        Ok(all
            .iter()
            .filter(|t| {
                matches!(
                    t.status,
                    TriggerStatus::Dead | TriggerStatus::Failed | TriggerStatus::Done
                )
            })
            .filter(|t| keys.contains(t.dedup_key.as_deref().unwrap_or(&t.id)))
            .map(|t| t.id.clone())
            .collect())
    }

    /// Replace the bodies of settled rows older than `payload_ttl_ms`:
    /// activity payloads, then tool-call arguments and results (two
    /// transactions, one per table; a crash between them leaves the
    /// second for the next run — it is idempotent). Never the rows
    /// [`Keep`] names (see the module docs).
    pub fn strip_payloads(&self, payload_ttl_ms: u64) -> Result<SystemStripReport, SystemError> {
        let now = self.now_ms();
        let keep = self.keep()?;
        let db = self.db();
        let activities = self
            .gate()
            .store()
            .strip_payloads(db.conn(), now, payload_ttl_ms, &keep.agents)?;
        let tool_calls =
            ToolCallStore::default().strip_payloads(db.conn(), now, payload_ttl_ms, &keep.runs)?;
        Ok(SystemStripReport {
            activities,
            tool_calls,
        })
    }

    /// What a GC pass or a strip must leave (see [`Keep`]): read under one
    /// connection lock, after the runtime's state (no runtime step runs
    /// during a pass: `serve` runs it on its worker, between requests).
    fn keep(&self) -> Result<Keep, SystemError> {
        let runtime = self.runtime();
        let state = runtime.state();
        let store = ToolCallStore::default();
        let db = self.db();
        let mut keep = Keep::default();
        for (agent, view) in &state.agents {
            let session = view.session_id.as_str();
            let completed = state.conversations.get(agent).map_or(&[][..], Vec::as_slice);
            let resumable = runtime.open_turn(agent)?.is_some()
                || !runtime.unfinished_work(agent)?.is_empty()
                || has_uncompleted_calls(&db, &store, session, completed)?;
            if resumable {
                keep.agents.push(agent.as_str().to_string());
                keep.runs.push(session_run(session));
                keep.sessions.push(session.to_string());
            }
        }
        for run in store.unsettled_runs(db.conn())? {
            let bookkeeping = run.run_id.starts_with(BOOKKEEPING_RUN_PREFIX);
            if run.status == RunStatus::WaitingForHuman {
                keep.runs.push(run.run_id);
                keep.sessions.push(run.session_id);
            } else if !bookkeeping {
                // A job run still running: its agent resumes it (`run
                // --resume`, its RESUME trigger); its errors say why not yet.
                keep.sessions.push(run.session_id);
            }
        }
        for list in [&mut keep.agents, &mut keep.runs, &mut keep.sessions] {
            list.sort();
            list.dedup();
        }
        Ok(keep)
    }
}

/// The newest bucket row of each schedule in `all`: the only record that
/// the bucket was emitted (`store::triggers::scheduled`). Collected while
/// the bucket is current (a period longer than the TTL), the next boot
/// would emit and fire the bucket again (found reading the schedule's "at
/// most once" against GC; `worker::tests`).
fn schedule_marks(all: &[Trigger]) -> impl Iterator<Item = String> {
    scheduled::newest_buckets(all).into_values().map(|(_, id)| id)
}

/// Whether the tool-call ledger holds a call of `session` that none of
/// its completed turns (`completed`, the agent's conversation) made: a
/// call of a turn that never completed — open, or parked by a newer turn —
/// which a resume of that turn asks again with the same key.
fn has_uncompleted_calls(
    db: &Db,
    store: &ToolCallStore,
    session: &str,
    completed: &[ConversationItem],
) -> Result<bool, StoreError> {
    let ids = store.call_ids(db.conn(), &session_run(session))?;
    if ids.is_empty() {
        return Ok(false);
    }
    let made: std::collections::BTreeSet<&str> = completed
        .iter()
        .filter_map(|item| match item {
            ConversationItem::ToolCall { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    Ok(ids.iter().any(|id| !made.contains(id.as_str())))
}
