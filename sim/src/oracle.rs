//! The oracle: what a recovered runtime may look like, and the invariants
//! that hold after every step.
//!
//! The rule: after a crash inside op k, the recovered state equals the
//! model after ops 1..k-1 ("before") or after ops 1..k ("after"), up to the
//! relaxations below and nothing else. A crash between ops (or a clean
//! restart) has a single candidate, the model after the last op; so does
//! the power cut that follows a reboot which left writes unsynced (a
//! crash chain: the second boot must show what the first showed); so does an
//! op the system answered `Ok` although a crash point inside it was hit
//! (acknowledged means durable). An injected I/O error (EIO, ENOSPC, lost
//! reply) that fails op k is judged the same way after the system reopens
//! in place. The state compared: live agents (parent, completed turns,
//! pending and delivered messages), each live agent's session record on
//! disk (`session.json`: its schema version, the provider and model the
//! system was booted with, and ACTIVE exactly while the session holds a
//! provider slot — [`Model::records`]), the external world's outbox
//! (counted per agent: an effect is the agent whose durable decision
//! carries its key, and the call's logical `key`; two agents' identical
//! calls are two effects), the durable triggers, and the checkpointed
//! loop's messages.
//!
//! Relaxations (the only ones; sim/RELAXATIONS.md mirrors this list):
//!
//! - **R1 A restart resets residency and leases.** Recovery holds no
//!   provider slots, so every surviving session is `suspended`, its
//!   record SUSPENDED on disk too (a promise: compared exactly); a reboot
//!   outlasts every trigger lease, so boot returns each CLAIMED trigger to
//!   PENDING (DEAD once out of attempts).
//! - **R2 In-flight op all-or-nothing.** The op the crash interrupted was
//!   never acknowledged: it may be entirely present ("after") or entirely
//!   absent ("before"). In particular an unacknowledged child spawn may
//!   vanish, and an interrupted turn is lost whole (no half turn survives).
//! - **R3 Re-delivery.** A delivered message may reappear as pending: for
//!   each agent the recovered delivered list is a prefix of the candidate's,
//!   and the rest comes back, in order, at the front of the pending list
//!   (at-least-once delivery; never lost, never reordered).
//! - **R4 Side effects of the lost turn.** When the interrupted op is a turn
//!   and the candidate is "before", the external world may already hold
//!   that turn's irreversible effects (the world is outside the crash).
//!   Each may appear at most once; it is never re-run (invariant I4). An
//!   effect absent at that recovery has an unknown fate (its INTENT may be
//!   in the ledger, awaiting confirmation): it may appear once later, or
//!   never, and a resumed turn (same keys) does not make it certain. A
//!   resumed turn that completes reports every step's scripted result (the
//!   ledger answers a settled key as it was settled, and a key with no
//!   INTENT runs afresh); one whose INTENT survived unsettled stops at that
//!   step, blocked on a human's confirmation ([`Model::blocked`]: only such
//!   a re-run may block; nothing of it is kept, and a fire's trigger is
//!   FAILED one attempt more — a candidate after a crash inside the op too).
//!   The key it stopped at waits for the `confirm` op (a human answering
//!   truthfully, [`Model::note_needs_human`]): after the answer no turn
//!   may stop at that key again until a crash, a `NotDelivered` answer
//!   makes the re-run's send expected, and the triggers blocked on it are
//!   PENDING again; a crash inside an answer leaves its key of unknown
//!   fate, never answered again ([`Model::forget_answer`]).
//!
//! - **R5 A fire's inner states.** A fire (claim → the trigger's turn →
//!   ack) commits three times; a crash between them leaves the trigger
//!   claimed (PENDING again after R1, one attempt more) with its turn
//!   either absent (R4 applies to the turn's effects) or complete. Its
//!   re-fire runs the same work; a completed turn only gets its ack.
//!
//! - **R7 A cut work turn may have started.** A work turn (API `work_id`)
//!   rolled back by a crash leaves either nothing, or — its `turn.start`
//!   durable — its RESUME trigger, which the boot emits PENDING
//!   ([`Model::started_work`]); the model cannot know which, so both are
//!   candidates. From then on the work is known started: its retry and its
//!   RESUME fire must run the prompt and read the messages it first
//!   started with, with the same effect keys (R4 for those).
//!
//! - **R8 A rolled-back turn's messages may stay.** A turn's
//!   `send_message` call enqueues its message to the recipient's log as
//!   its result becomes durable, before the turn completes (the tool's
//!   write-ahead result, `runtime::orchestration`). So a turn a crash
//!   rolled back may leave each message it sent pending, at most once;
//!   the candidate adopts those it finds, and the turn's re-run never
//!   sends them again. Its children, deferred to `turn.complete`, never
//!   exist without it.
//!
//! - **R9 A call replayed after crashes.** The tool-call ledger of a
//!   turn answered live is checked call by call against the rule the
//!   model states ([`crate::model::ledger_calls`]: settled as its result
//!   says, its side-effect class, no replay; no row at all for a call a
//!   hook denied; the session's run `running`) — except that a reversible
//!   call caught in flight by a crash is replayed when its turn runs
//!   again, each replay counted on its row as it begins
//!   (`ToolCallStore::begin_replay`); its answer settles the row, and a
//!   success clears the count. The count is held exactly where the boot
//!   read the calls in flight (`driver::replays`: one more than the boot
//!   found, or 0 after a success, for a call the boot found in flight; 0
//!   for any other) and otherwise only to "0 for a success". A call asked
//!   again after [`crate::model::MAX_REPLAYS`] replays that never
//!   answered is refused: not run, answered and settled failed with
//!   `system::parked_answer` (whatever the script says; the turn's
//!   answer is judged with it), its count unchanged, and its run waits
//!   for a human — which every later replay of the run is refused for
//!   too. The run waits for a human only if a call of it reached the
//!   limit. An irreversible call (the activity ledger decides it, never a
//!   replay) is never counted; a reversible one a hook parked for a human
//!   is counted on each run after their release (so its count may grow by
//!   one even when its answer is failed) and not when their word answers
//!   it.
//!
//! - **R10 A job run's inner states.** A job run (`Action::JobRun`: its
//!   root agent → its row `running` → its work turn `run:{id}` → its
//!   status) commits four times; a crash between them leaves the root
//!   alone (no row), the row `running` with no turn, the turn started
//!   (R7), or the turn complete with the row still `running`
//!   ([`Model::job_midpoints`]). The fire of a job run's RESUME trigger
//!   settles the run before its ack (`System::ack_fire`): a crash in
//!   between leaves the run settled and the trigger CLAIMED (its re-fire
//!   only acks) — never acked with the run left `running`, which no boot
//!   would repair. A fire that failed settles the run after its ack
//!   (`settle_fire`): a crash in between leaves the trigger FAILED and
//!   the run as it was, until a retry fires it. A resume
//!   (`Action::JobResume`, `run --resume`: the row `running` again → the
//!   turn → `succeeded` → the PENDING RESUME trigger DONE) may be cut
//!   between any two ([`Model::resume_midpoints`]; R4, R7 and R8 for a
//!   turn not complete). A collecting GC pass
//!   deletes every settled run whose agent is no longer live, and may
//!   delete or keep one whose agent is live (`System::gc` keeps the runs
//!   of an agent that may still resume, which the model does not track
//!   exactly): the next reading decides ([`Model::learn`]). Likewise a
//!   DONE or DEAD trigger fired and never completed: a crash may have
//!   left its own turn started (`System::gc` keeps it: only its retry
//!   resumes that turn) or not, which no compared state shows; the next
//!   reading decides, and once it showed the trigger kept, every later
//!   pass must keep it until its turn completes
//!   ([`Model::unfinished_fires`]).
//!
//! - **F1 An injected I/O fault is never called damage.** A boot an
//!   injected fault failed (EIO or ENOSPC at a point of the recovery, a
//!   write whose reply was lost) must fail with the I/O error — outcome
//!   unknown, boot again — and never refuse the root as damaged (a
//!   corrupt, lost or newer line, record, manifest or store): that answer
//!   sends the operator to restore or quarantine over a transient error.
//!   Checked where the harness boots again without the fault
//!   (`exec/restart.rs`), unless a rot struck the disk at rest.
//!
//! - **F2 `verify` under an injected I/O fault says it could not read**
//!   (`driver/verify_fault.rs`): at one boot in eight, the operator's
//!   `verify` of the disk runs again on a detached copy with one EIO at a
//!   point of its own reads; its report is the fault-free one, or names
//!   the file in an `unreadable` finding and is not healthy.
//!
//! - **R6 Bit rot is refused, never read (`PowerRot`).** A flipped bit in
//!   a complete, durable event-log line or session record destroys data
//!   that may be acknowledged, so "acknowledged means durable" cannot be
//!   asked of it. What is asked instead ([`judge_rot`]): the boot fails
//!   with the typed corruption error naming exactly that file, that line
//!   and the byte offset the line starts at; or, if the boot never read
//!   the file (a record-less orphan directory it removes unread), it may
//!   succeed; but if the line is the log's last and `events.pending` holds
//!   exactly its bytes (the append in flight, or the last acknowledged one:
//!   the writer keeps that copy durable), the boot must replace the line
//!   from that copy ([`RotVerdict::Replaced`]: the flipped byte is back)
//!   rather than refuse: nothing was lost, so refusing the root is a
//!   needless outage ([`crate::rot::Rot::replaceable`]). Never
//!   `Ok` after reading the damaged line as data, never another error. Then the bit is restored (an operator's restore from backup)
//!   and the same disk is booted again, judged as any restart. Only the
//!   line's content can rot here: a flipped final newline makes a durable
//!   line look like a torn, unacknowledged tail, which no reader can tell
//!   apart (a stated limit, not a relaxation); and a line with a hole of
//!   zeros (an fsync the crash cut short persisted a later page of the
//!   append, not an earlier one) is the torn append in flight, not a
//!   durable line, so it is never struck.
//!
//!   The same crash mode also hands the boot lines no run of this build
//!   wrote ([`crate::rot::Damage`]), each with a valid checksum so that
//!   only the reader's own checks can tell: a line as a **newer** version
//!   writes it (`schema_version` 9) must be refused with the typed
//!   newer-schema error naming that line (never as damage: an upgrade
//!   reads it); a **gap** (a line whose `seq` skips one, never the last)
//!   must be refused as corrupt naming that line; a line as the **older**
//!   version before checksums wrote it (unsealed, never the last) must be
//!   read as the same entry — it stays, and the recovery is judged as
//!   any is ([`RotVerdict::ReadOlder`]). And it loses at rest what no
//!   crash loses ([`crate::loss`]): `store.db` (gone or emptied while
//!   `root.json` names a store), lines off a log's end before the `seq`
//!   its `events.pending` holds, a `session.json` beside a log holding
//!   `agent.created`, `store.db` replaced by another root's store, or by
//!   an older copy of this root's own (the install's) while an open
//!   turn's log holds the result of an irreversible call its ledger has
//!   no row for — each must be refused with the typed damage error
//!   naming that file (`StoreMissing`; `LostEntries` with the expected
//!   and found counts; `MissingRecord`; `StoreReplaced`; `StoreBehind`
//!   naming `store.db`), never booted over (an older copy the logs do
//!   not contradict is never struck: the product does not promise to
//!   detect it); and a
//!   parent's whole directory, lost while a live session names it: the
//!   boot terminates every session so cut off (GUARANTEES 9), its
//!   `agent.terminated` past every tick of the logs it read. The whole
//!   disk is then restored and booted again.
//!
//! Invariants (checked after every step; after recovery also I2):
//!
//! - **I1 No orphans.** Every agent's parent is a live agent.
//! - **I2 Nothing active after recovery.** No session is resident right
//!   after a restart (R1 is a promise, not just a tolerance).
//! - **I3 Logs are valid JSONL.** Every `events.jsonl` on disk is a
//!   sequence of complete JSON lines after recovery (a torn tail may exist
//!   only between a crash and the next recovery), and their logical `ts`
//!   strictly increases down the file (the runtime's one clock, restored
//!   past every logged tick at boot: an entry recovery appends included).
//! - **I4 No duplicate side effect.** No effect reaches the external
//!   world twice, counted per agent and logical action (the scripted
//!   call's `key`), whatever idempotency key carried it: the harness's
//!   model words a re-asked round differently
//!   ([`crate::standins::Rewording`]), so an effect sent again under a new
//!   key is still one effect too many (the driver numbers a call's
//!   deliveries by the keys they came with, first seen first: the second
//!   key's is `effect@1`, which only an agent's second turn with the
//!   prompt may send). Per agent: a twin turn
//!   ([`crate::op::Op::TwinTurn`]) makes another agent's calls word for
//!   word, and each agent's call is an effect of its own — sent once
//!   each, never merged into the other's, never answered with the
//!   other's result. And per turn: a twin turn may be a repeat (an agent
//!   runs its own completed prompt again), whose calls are second
//!   effects — sent again, under new keys, never answered from the
//!   first turn's.
//! - **I6 No effect without a durable decision** (after every restart;
//!   `driver::project::undecided_effects`): every effect the world
//!   received carries the idempotency key of a `round.decided` entry in
//!   some event log — a call starts only after its round's decision is
//!   durable.
//! - **I5 The recovery report tells what recovery did** (after every
//!   restart; `driver::project::report_violations`): for each event log
//!   the boot kept, the bytes the report says it cut are the log's tail
//!   and the rest is byte for byte what the boot found; after them comes
//!   the pending copy if the report says it was replayed, else nothing;
//!   a pending copy found gets exactly one verdict (replayed, deduped — its
//!   line is in the kept log —, or torn). An operator reads that report to
//!   learn what a crash cost. And the boot settled every INTENT of the
//!   activity ledger (re-sent to a dedup sink, else NEEDS_CONFIRMATION:
//!   the scripted world always answers a live process), so none is left.
//!
//! - **I7 `verify` says what the next boot does** (before every boot;
//!   [`verify_agrees`]): the operator's read-only `durable-agent verify`,
//!   run on the disk the boot is about to open (a detached copy, so it
//!   moves no I/O point of the run), reports no damage when the boot then
//!   recovers a crash-model disk (every finding of the crash model is
//!   "repaired at boot"); when the boot refuses a damaged line (R6) it
//!   reports that file as damaged, at that line; and when the boot
//!   replaces the line from `events.pending`, or reads an older version's
//!   line, it does not call that file damaged; when the boot refuses a
//!   loss it reports a finding of that kind on that file
//!   ([`crate::loss::verify_agrees`]); and every log the boot cuts
//!   a torn tail from, it lists as repaired at boot, and every log it
//!   lists as repaired at boot the boot's report repaired
//!   ([`verify_saw_cuts`]); and it accounts for every event log on the
//!   disk, listed healthy or repaired at boot, or named by a finding
//!   ([`verify_lists_every_log`]).
//!   (A rotted file the boot
//!   never reads is not asked about: `verify` reads every file, the boot
//!   only what it needs.)
//! - **I8 A decision logs the operator's verdict** (after every restart;
//!   `driver::project::hook_violations`): every call of every durable
//!   `round.decided` carries the verdict the `PreToolUse` hooks gave
//!   ([`crate::standins::ScriptedHooks`]: deny, wait for a human, or
//!   rewrite the arguments — then the model's are kept and the call's
//!   are the rewritten ones), and no verdict when they allowed it as
//!   asked. A resumed round applies the logged verdict, so the log is
//!   what runs. With it, **a call a hook parks for a human never runs
//!   until a human releases it** (`exec`, after every op: a plain turn
//!   whose first call a hook parks must stop there, open, until a
//!   `confirm` releases the key — [`crate::model::Model::must_block`] —
//!   and then runs it once).
//! - **V1 Each line carries the version an older build goes by** (after
//!   every restart, every log line; `driver/stamps.rs`): sealed, unless
//!   it is an older build's line the rot strike planted, and stamped
//!   with the oldest schema version whose readers understand it — the
//!   hook version for a decision with a hook's verdict, the decision
//!   version for any other decision and for a `turn.resume` with its
//!   prompt, the checksum version for the rest.
//! - **T1 A failed boot's error is typed** (`driver/typed.rs`): no SQLite
//!   error in its chain is the generic variant when its code says what
//!   it was (a full disk, an I/O error, corruption, …), so an operator
//!   reads "disk full" or "outcome unknown, reopen", not "SQLite failed".
//!
//! - **Q1–Q6 The operator's repair does what it promises** (on every
//!   disk a boot refused as damaged, before the damage is undone;
//!   [`crate::repair`]): `repair --quarantine`, planned from that disk's
//!   `verify` and carried out on a detached copy, refuses exactly what
//!   needs `--force` or `--accept-store-loss`, moves exactly what the
//!   findings name (each given as a reason), whole, into a new batch
//!   (`NNNN-<UTC time>`) with a note naming them, touches nothing else,
//!   records a store given up in `root.json`'s history, and leaves a
//!   root `verify` finds healthy.
//!
//! And after every work turn the driver drives to completion, **M1**
//! (`driver/misuse.rs`): its task, now stale, is handed a step again and
//! must be refused with `TurnNotInFlight`, writing nothing and poisoning
//! nothing. And the model holds spawns to the product's default depth
//! limit ([`crate::model::MAX_DEPTH`]) and to low children and tree limits
//! ([`crate::model::MAX_CHILDREN`], [`crate::model::max_agents`]), each
//! counting the spawns pending in turns in flight or parked: a spawn past any is a
//! failed call that creates nothing (an op whose answer hangs on other
//! agents' open turns is skipped, `Model::limit_refusals`).
//!
//! And after every step and every restart, each live agent's bookkeeping
//! rows an operator reads: its token usage (U1–U3, `driver/usage.rs`)
//! and its `errors` rows (`driver/errors.rs`) — **E1** exactly the
//! failures the scripted provider handed to a live process running that
//! agent's turns (a script's `~`: the round's first asks fail; the turn
//! fails with `RuntimeError::Provider`, holds its slot, keeps its earlier
//! rounds' effects and sends, and its re-run resumes at that round —
//! [`Model::fails`]), in order, each under the turn's number, context
//! `llm_complete round N` and the provider's message; **E2** each row's
//! attempt the count of rows before it with the same turn and context (0,
//! 1, … across restarts: the store numbers it). Relaxed: the row of a
//! failure handed out in an op a crash, an injected I/O fault or a lost
//! answer cut may be missing, unless the op answered the failure (the row
//! is committed before the answer); an agent alive at a GC is not checked (the
//! GC deletes settled sessions' rows, as for U1–U3).
//!
//! And after every boot, the operator's views (`store::inspect`,
//! `driver/views.rs`): **V1** paging each one two rows at a time visits
//! exactly what one whole page holds, in order, as many as its total;
//! **V2** each holds what the stores hold (usage sums, `errors` rows,
//! trigger ids, user runs); **V3** every run of the tool-call ledger is
//! found by its id, as the ledger reads it.
//!
//! And after every turn the runtime answers live (`Driver::check_answer`):
//! its calls' rows in the tool-call ledger, and its session's run, are
//! what [`crate::model::ledger_calls`] says (up to R9).
//!
//! And after an op that failed under an injected I/O fault: a runtime
//! that says it is poisoned refuses the next change with `Poisoned` and
//! no I/O until reopened (`Driver::poisoned_probe`); and when the fault
//! failed a write, sync, truncate or rename of an event log, its pending
//! copy or a session record (data of unknown fate), the runtime must say
//! so (`Driver::failed_session_write`). And after every
//! completed turn: its answer (response and every call, those before a
//! crash it resumed from included: what the API returns) is what the turn
//! did (`Driver::check_answer`); and the id an emit answers for a dedup
//! key is the one every later emit and claim of that key shows
//! (`Driver::check_trigger_id`).
//!
//! Anything else a recovered runtime shows is a failure.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::model::{Action, Model, Msg, State, Status};

/// What a boot did with a rotted line (R6), when it did right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotVerdict {
    /// Refused with the typed corruption error naming the damaged line.
    Refused,
    /// Booted without ever reading the rotted file.
    Unread,
    /// Booted after replacing the rotted line with the whole copy
    /// `events.pending` held (the line was the last one): the flipped
    /// byte is back to its value, and
    /// nothing damaged was read as data.
    Replaced,
    /// Booted over an older version's line ([`crate::rot::Damage::Older`]),
    /// which stays: what the boot read of it is judged as any recovery is
    /// (the states must be equal).
    ReadOlder,
}

/// I7: does `verified` (the operator's `verify` of the disk before the
/// boot) agree with what the boot did? `rot`: the damaged line the boot
/// was handed and what it did with it (R6); `booted`: the boot succeeded.
/// Returns the disagreements.
pub fn verify_agrees(
    verified: Option<&durable_agent::recovery::verify::Verification>,
    rot: Option<(&crate::rot::Rot, RotVerdict)>,
    booted: bool,
) -> Vec<String> {
    let Some(verified) = verified else {
        return vec!["HARNESS BUG: no `verify` was taken before the boot".to_string()];
    };
    let on = |path: &std::path::Path| -> Vec<&durable_agent::recovery::verify::Finding> {
        verified.damaged.iter().filter(|f| f.path == path).collect()
    };
    match rot {
        Some((rot, _)) if matches!(rot.damage, crate::rot::Damage::Lost(_)) => {
            crate::loss::verify_agrees(verified, rot)
        }
        None if booted && !verified.is_healthy() => vec![format!(
            "I7: `verify` reported damage on a disk of the crash model, which the boot then recovered: {:?}",
            verified.damaged
        )],
        None => Vec::new(),
        Some((rot, RotVerdict::Refused)) => {
            if on(&rot.path).iter().any(|f| f.line == Some(rot.line)) {
                Vec::new()
            } else {
                vec![format!(
                    "I7: the boot refused {} line {}, but `verify` did not report that line damaged: {:?}",
                    rot.path.display(),
                    rot.line,
                    verified.damaged
                )]
            }
        }
        Some((rot, RotVerdict::Replaced | RotVerdict::ReadOlder)) => {
            let wrong = on(&rot.path);
            if wrong.is_empty() {
                Vec::new()
            } else {
                vec![format!(
                    "I7: the boot recovered {} (its line {} replaced from events.pending, or an older version's, read), \
                     but `verify` reported it damaged: {wrong:?}",
                    rot.path.display(),
                    rot.line
                )]
            }
        }
        Some((_, RotVerdict::Unread)) => Vec::new(),
    }
}

/// I7, the repairs: every log the boot cut a torn tail from (its report's
/// `logs_repaired`), `verify` listed as repaired at boot.
pub fn verify_saw_cuts(
    verified: &durable_agent::recovery::verify::Verification,
    report: &durable_agent::recovery::RecoveryReport,
    root: &std::path::Path,
) -> Vec<String> {
    report
        .logs_repaired
        .iter()
        .filter(|(_, repair)| repair.truncated_bytes > 0)
        .map(|(session, _)| session_log(root, session))
        .filter(|log| !verified.repaired_at_boot.iter().any(|c| &c.path == log))
        .map(|log| {
            format!(
                "I7: the boot cut a torn tail from {}, which `verify` did not list as repaired at boot: {:?}",
                log.display(),
                verified.repaired_at_boot
            )
        })
        .chain(verify_listed_no_repair(verified, report, root))
        .collect()
}

/// I7, the listing: `verify` accounts for every event log on the disk
/// (`logs`, the disk's log files before the boot): each is listed healthy
/// (with its entries and mark) or repaired at boot (a damaged last line
/// `events.pending` replaces), or a finding names it or its session's
/// directory — an operator
/// reading the report sees every session, none silently left out.
pub fn verify_lists_every_log<'a>(
    verified: &durable_agent::recovery::verify::Verification,
    logs: impl Iterator<Item = &'a std::path::PathBuf>,
) -> Vec<String> {
    logs.filter(|p| p.file_name().is_some_and(|n| n == durable_agent::log::EVENTS_FILE))
        .filter(|log| {
            let dir = log.parent();
            !verified.healthy.iter().any(|c| &c.path == *log)
                && !verified.repaired_at_boot.iter().any(|c| &c.path == *log)
                && !verified.damaged.iter().any(|f| {
                    dir.is_some_and(|d| f.path.starts_with(d))
                        || f.session.as_ref().is_some_and(|s| dir.and_then(|d| d.file_name()) == Some(s.as_str().as_ref()))
                })
        })
        .map(|log| {
            format!(
                "I7: `verify` does not account for {}: neither listed healthy or repaired at boot nor named by a finding (healthy: {:?}; repaired at boot: {:?}; damaged: {:?})",
                log.display(),
                verified.healthy.iter().map(|c| &c.path).collect::<Vec<_>>(),
                verified.repaired_at_boot.iter().map(|c| &c.path).collect::<Vec<_>>(),
                verified.damaged.iter().map(|f| &f.path).collect::<Vec<_>>()
            )
        })
        .collect()
}

/// The log of `session` under `root`, as the recovery report's sessions
/// and `verify`'s paths name it.
fn session_log(root: &std::path::Path, session: &durable_agent::runtime::SessionId) -> std::path::PathBuf {
    root.join("agents")
        .join(session.as_str())
        .join(durable_agent::log::EVENTS_FILE)
}

/// I7's converse for logs: a log `verify` lists as repaired at boot (a
/// torn tail, a damaged last line `events.pending` replaces) is one the
/// boot's report says it repaired — an operator told "the next boot cuts
/// this" must see that boot cut it.
fn verify_listed_no_repair(
    verified: &durable_agent::recovery::verify::Verification,
    report: &durable_agent::recovery::RecoveryReport,
    root: &std::path::Path,
) -> Vec<String> {
    let repaired: Vec<std::path::PathBuf> = report
        .logs_repaired
        .iter()
        .filter(|(_, repair)| **repair != durable_agent::log::repair::LogRepair::default())
        .map(|(session, _)| session_log(root, session))
        .collect();
    verified
        .repaired_at_boot
        .iter()
        .filter(|c| c.path.file_name().and_then(|n| n.to_str()) == Some(durable_agent::log::EVENTS_FILE))
        .filter(|c| !repaired.contains(&c.path))
        .map(|c| {
            format!(
                "I7: `verify` listed {} as repaired at boot ({}), but the boot's report repaired nothing there: {:?}",
                c.path.display(),
                c.what,
                report.logs_repaired
            )
        })
        .collect()
}

/// R6: judge a boot of a disk with one damaged line. `opened` is the
/// boot's result, `named` the line its error reported (if typed as a
/// corruption, or — `newer` — as written by a newer version), `read`
/// whether it read the damaged file at all, `replaced` whether the
/// changed bytes hold their original values again.
pub fn judge_rot(
    rot: &crate::rot::Rot,
    opened: &Result<(), String>,
    named: Option<&durable_agent::system::CorruptLine>,
    newer: bool,
    read: bool,
    replaced: bool,
) -> Result<RotVerdict, String> {
    let want_newer = rot.damage == crate::rot::Damage::Newer;
    if rot.damage == crate::rot::Damage::Older {
        return match (opened, named) {
            (Ok(()), _) => Ok(RotVerdict::ReadOlder),
            (Err(e), Some(n)) if n.path == rot.path && n.line == rot.line => Err(format!(
                "the boot refused {} line {}, an older version's line an upgrade must read: {e}",
                rot.path.display(),
                rot.line
            )),
            (Err(e), _) => Err(format!(
                "the boot failed over an older version's line it must read: {e}"
            )),
        };
    }
    match (opened, named) {
        (Ok(()), _) if read && replaced => Ok(RotVerdict::Replaced),
        (Err(e), Some(n)) if n.path == rot.path && n.line == rot.line && n.offset == rot.line_offset => {
            if rot.replaceable {
                Err(format!(
                    "the boot refused {} line {}, the log's last, which events.pending holds whole: it must replace the line from that copy: {e}",
                    rot.path.display(),
                    rot.line
                ))
            } else if newer != want_newer {
                Err(format!(
                    "the boot refused {} line {} as {}, but it is {}: {e}",
                    rot.path.display(),
                    rot.line,
                    if newer { "a newer version's" } else { "corrupt" },
                    if want_newer {
                        "a newer version's line (an upgrade reads it: never damage to quarantine)"
                    } else {
                        "damaged (no version of durable-agent wrote it)"
                    }
                ))
            } else {
                Ok(RotVerdict::Refused)
            }
        }
        (Err(e), Some(n)) => Err(format!(
            "the boot named {} line {} (byte {}) instead of line {} (byte {}): {e}",
            n.path.display(),
            n.line,
            n.offset,
            rot.line,
            rot.line_offset
        )),
        (Err(e), None) => Err(format!("the boot failed without naming a damaged line: {e}")),
        (Ok(()), _) if read => Err(format!(
            "the boot read {} and returned Ok: the changed line was accepted as data (silent corruption)",
            rot.path.display()
        )),
        (Ok(()), _) => Ok(RotVerdict::Unread),
    }
}

/// Which candidate a recovered state matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The interrupted op is absent (ops 1..k-1).
    Before,
    /// The interrupted op is present (ops 1..k), or there was none.
    After,
}

/// The oracle accepted the recovered state; the harness continues from
/// `adopted` (the candidate with the relaxations the runtime actually took).
#[derive(Debug, Clone)]
pub struct Accepted {
    pub side: Side,
    pub adopted: Model,
}

/// The oracle rejected the recovered state: the closest candidate and why.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// The candidate the report diffs against (with R1 applied).
    pub expected: State,
    pub side: Side,
    pub reason: String,
}

/// [`against`] after a clean restart: also no delivered message may come
/// back as pending (R3 does not apply).
fn against_strict(candidate: &Model, recovered: &State) -> Result<Model, String> {
    let adopted = against(candidate, recovered, &BTreeSet::new(), &BTreeSet::new())?;
    for (name, a) in &adopted.state.agents {
        let want = candidate
            .state
            .agents
            .get(name)
            .map(|w| w.delivered.len())
            .unwrap_or(0);
        if a.delivered.len() != want {
            return Err(format!(
                "agent {name}: {} delivered messages came back as pending after a clean restart (re-delivery is allowed after a crash only)",
                want - a.delivered.len().min(want)
            ));
        }
    }
    Ok(adopted)
}

/// Check `recovered` against one candidate; `Ok` gives the adopted model.
fn against(
    candidate: &Model,
    recovered: &State,
    lost_effects: &BTreeSet<String>,
    lost_msgs: &BTreeSet<(String, Msg)>,
) -> Result<Model, String> {
    let mut adopted = candidate.restarted(); // R1
    adopted.learn(recovered);
    let records = adopted.records(); // every one SUSPENDED (R1)
    let want = &mut adopted.state;
    let want_names: Vec<&String> = want.agents.keys().collect();
    let got_names: Vec<&String> = recovered.agents.keys().collect();
    if want_names != got_names {
        return Err(format!(
            "live agents differ: expected {want_names:?}, recovered {got_names:?}"
        ));
    }
    for (name, w) in want.agents.iter_mut() {
        let Some(g) = recovered.agents.get(name) else {
            return Err(format!("agent {name} missing"));
        };
        if w.parent != g.parent {
            return Err(format!(
                "agent {name}: parent {:?} expected, {:?} recovered",
                w.parent, g.parent
            ));
        }
        if w.turns != g.turns {
            return Err(format!(
                "agent {name}: {} turns expected, {} recovered (or their content differs)",
                w.turns.len(),
                g.turns.len()
            ));
        }
        // R8: a message a rolled-back turn sent (its call's result was
        // durable) may be pending, at most once; the candidate knows it
        // from then on (adopted below).
        let unsure: Vec<&Msg> = lost_msgs
            .iter()
            .filter(|(to, m)| to == name && !w.pending.contains(m) && !w.delivered.contains(m))
            .map(|(_, m)| m)
            .collect();
        if let Some(m) = unsure
            .iter()
            .find(|m| g.pending.iter().filter(|p| p == *m).count() > 1)
        {
            return Err(format!(
                "agent {name}: message {m:?} of a rolled-back turn enqueued twice"
            ));
        }
        let g_pending: Vec<Msg> = g
            .pending
            .iter()
            .filter(|m| !unsure.contains(m))
            .cloned()
            .collect();
        // R3: recovered.delivered is a prefix of the candidate's; the rest
        // returns to the front of pending.
        let ok_delivery = g.delivered.len() <= w.delivered.len()
            && w.delivered[..g.delivered.len()] == g.delivered[..]
            && {
                let mut pending = w.delivered[g.delivered.len()..].to_vec();
                pending.extend(w.pending.iter().cloned());
                pending == g_pending
            };
        if !ok_delivery {
            return Err(format!(
                "agent {name}: messages lost, duplicated or reordered (pending {} / delivered {} expected, {} / {} recovered)",
                w.pending.len(),
                w.delivered.len(),
                g.pending.len(),
                g.delivered.len()
            ));
        }
        w.pending = g.pending.clone();
        w.delivered = g.delivered.clone();
    }
    if recovered.records != records {
        let differ: Vec<&String> = records
            .keys()
            .chain(recovered.records.keys())
            .filter(|n| records.get(*n) != recovered.records.get(*n))
            .collect();
        return Err(format!(
            "session records differ (agents {differ:?}): expected {records:?}, on disk {:?}",
            recovered.records
        ));
    }
    if want.loop_messages != recovered.loop_messages {
        return Err(format!(
            "loop messages differ: expected {:?}, recovered {:?}",
            want.loop_messages, recovered.loop_messages
        ));
    }
    if want.triggers != recovered.triggers {
        return Err(format!(
            "triggers differ: expected {:?}, recovered {:?}",
            want.triggers, recovered.triggers
        ));
    }
    if want.runs != recovered.runs {
        return Err(format!(
            "job runs differ: expected {:?}, recovered {:?}",
            want.runs, recovered.runs
        ));
    }
    // R4: the candidate's outbox, then possibly effects of the lost turn;
    // effects of unknown fate may sit anywhere, at most once (I4).
    let maybe = &adopted.maybe_effects;
    let got: Vec<&String> = recovered.outbox.iter().filter(|k| !maybe.contains(*k)).collect();
    let base = want.outbox.len();
    if got.len() < base || got[..base].iter().zip(&want.outbox).any(|(g, w)| *g != w) {
        return Err(format!(
            "outbox: acknowledged effects {:?} expected first, recovered {:?}",
            want.outbox, recovered.outbox
        ));
    }
    if let Some(extra) = got[base..].iter().find(|k| !lost_effects.contains(**k)) {
        return Err(format!(
            "outbox: effect {extra:?} belongs to no acknowledged or in-flight turn"
        ));
    }
    want.outbox = recovered.outbox.clone();
    let outbox = want.outbox.clone();
    adopted.maybe_effects.retain(|k| !outbox.contains(k));
    Ok(adopted)
}

/// The irreversible effects `action` would cause (R4), from `model`
/// (the state it starts from).
pub fn effects_of(model: &Model, action: Option<&Action>) -> BTreeSet<String> {
    // A done job's resume answers from the log: no turn, no effect.
    let Some((agent, prompt, tools)) = action.and_then(Action::turn_to_run) else {
        return BTreeSet::new();
    };
    tools
        .iter()
        .enumerate()
        .filter(|(_, t)| t.irreversible && t.ok)
        .map(|(i, _)| model.effect(agent, prompt, i))
        .collect()
}

/// The messages the interrupted op's turn sends through `send_message`,
/// by recipient: each may be pending after a crash that rolled the turn
/// back (R8).
pub fn messages_of(action: Option<&Action>) -> BTreeSet<(String, Msg)> {
    // A done job's resume answers from the log: no turn, no send.
    let Some((agent, prompt, _)) = action.and_then(Action::turn_to_run) else {
        return BTreeSet::new();
    };
    crate::model::orch_calls(prompt)
        .into_iter()
        .filter_map(|c| match c {
            crate::model::OrchCall::Send { to, payload } => Some((
                to,
                Msg {
                    from: agent.clone(),
                    payload,
                },
            )),
            crate::model::OrchCall::Spawn { .. }
            | crate::model::OrchCall::RefusedSpawn { .. }
            | crate::model::OrchCall::List => None,
        })
        .collect()
}

/// Judge a recovered state. `before` is the model before the interrupted
/// op; `after` is the model with it (`None` when the crash fell between
/// ops, so `before` is the only candidate); `action` is the interrupted op.
pub fn judge(
    before: &Model,
    after: Option<&Model>,
    action: Option<&Action>,
    recovered: &State,
    clean: bool,
) -> Result<Accepted, Box<Rejected>> {
    if clean {
        // A clean stop and start: nothing was cut short, so the one
        // candidate is the model, and no message comes back (R3 is for
        // crashes and I/O errors only).
        return match against_strict(before, recovered) {
            Ok(adopted) => Ok(Accepted {
                side: Side::After,
                adopted,
            }),
            Err(reason) => Err(Box::new(Rejected {
                expected: before.restarted().expected(),
                side: Side::After,
                reason,
            })),
        };
    }
    let none = BTreeSet::new();
    let after_err = match after {
        Some(after) => match against(after, recovered, &none, &BTreeSet::new()) {
            Ok(adopted) => {
                return Ok(Accepted {
                    side: Side::After,
                    adopted,
                })
            }
            Err(e) => Some((after, e)),
        },
        None => None,
    };
    let lost = if after.is_some() {
        effects_of(before, action)
    } else {
        none
    };
    let msgs = if after.is_some() {
        messages_of(action)
    } else {
        BTreeSet::new()
    };
    // R10: a job run is four commits (its root agent, its row, its turn,
    // its status), its resume three or four (the row `running` again, its
    // turn, its status, its RESUME trigger settled); the states between
    // them are candidates too, later commits first (a turn's start is
    // R7's, below). `true`: the turn is not complete (R4, R8 for what it
    // sent).
    let job_states =
        match (after, action) {
            (Some(after), Some(job @ Action::JobRun { .. })) => {
                before
                    .job_midpoints(after, job)
                    .map(|[rooted, recorded, turned]| {
                        vec![
                            (turned, Side::After, false),
                            (recorded, Side::Before, false),
                            (rooted, Side::Before, false),
                        ]
                    })
            }
            (Some(after), Some(resume @ Action::JobResume { .. })) => before
                .resume_midpoints(after, resume)
                .map(|[statused, turned, reset]| {
                    vec![
                        (statused, Side::After, false),
                        (turned, Side::After, false),
                        (reset, Side::Before, true),
                    ]
                }),
            _ => None,
        };
    for (m, side, cut) in job_states.into_iter().flatten() {
        let whole = (BTreeSet::new(), BTreeSet::new());
        let (lost, msgs) = if cut { (&lost, &msgs) } else { (&whole.0, &whole.1) };
        if let Ok(adopted) = against(&m, recovered, lost, msgs) {
            return Ok(Accepted { side, adopted });
        }
    }
    // R10: a collecting GC pass is one transaction per store, triggers
    // first, the tool-call ledger (with the runs) later: a crash between
    // them leaves the triggers collected and the runs not yet.
    if let (Some(after), Some(Action::Gc { strip: false })) = (after, action) {
        let mut triggers_only = after.clone();
        triggers_only.state.runs = before.state.runs.clone();
        if let Ok(adopted) = against(&triggers_only, recovered, &BTreeSet::new(), &BTreeSet::new()) {
            return Ok(Accepted {
                side: Side::After,
                adopted,
            });
        }
    }
    // R5: a fire is three commits (claim, the turn, the ack); the two
    // states between them are candidates too.
    if let (Some(after), Some(fire @ Action::Fire { .. })) = (after, action) {
        let (turned, settled, claimed) = fire_midpoints(before, after, fire);
        for m in [Some(turned), settled].into_iter().flatten() {
            if let Ok(adopted) = against(&m, recovered, &BTreeSet::new(), &BTreeSet::new()) {
                return Ok(Accepted {
                    side: Side::After,
                    adopted,
                });
            }
        }
        if let Ok(adopted) = against(&claimed, recovered, &lost, &msgs) {
            return Ok(Accepted {
                side: Side::Before,
                adopted,
            });
        }
    }
    // A re-run turn may stop at a key needing confirmation (R4); a fire
    // then acks its trigger FAILED, which a crash may find committed.
    if let Some(blocked) = action.and_then(|a| before.blocked(a)) {
        // (A job run's RESUME trigger acked FAILED, its run not yet parked.)
        let unsettled = action.and_then(|a| unsettled_job(before, &blocked, a));
        for m in [Some(blocked), unsettled].into_iter().flatten() {
            if let Ok(adopted) = against(&m, recovered, &lost, &msgs) {
                return Ok(Accepted {
                    side: Side::Before,
                    adopted,
                });
            }
        }
    }
    // A fresh work turn cut after its `turn.start` became durable: boot
    // emitted its RESUME trigger (R7).
    if let Some(started) = action
        .filter(|_| after.is_some())
        .and_then(|a| before.started_work(a))
    {
        if let Ok(adopted) = against(&started, recovered, &lost, &msgs) {
            return Ok(Accepted {
                side: Side::Before,
                adopted,
            });
        }
    }
    match against(before, recovered, &lost, &msgs) {
        Ok(adopted) => Ok(Accepted {
            side: if after.is_some() {
                Side::Before
            } else {
                Side::After
            },
            adopted,
        }),
        Err(before_err) => {
            // Diff against the candidate the recovered state is closer to:
            // the one with the same agent set, else "after".
            let (expected, side, reason) = match after_err {
                Some((after, after_e)) => {
                    let same_agents = |m: &Model| m.state.agents.keys().eq(recovered.agents.keys());
                    let reason = format!("neither candidate matches.\n  vs after  (ops 1..k):   {after_e}\n  vs before (ops 1..k-1): {before_err}");
                    if same_agents(before) && !same_agents(after) {
                        (before.restarted().expected(), Side::Before, reason)
                    } else {
                        (after.restarted().expected(), Side::After, reason)
                    }
                }
                None => (before.restarted().expected(), Side::After, before_err),
            };
            Err(Box::new(Rejected {
                expected,
                side,
                reason,
            }))
        }
    }
}

/// The durable states inside a fire (R5): `turned` — the claim and the
/// turn committed, the ack not (the trigger is still CLAIMED, its work
/// done); for a job run's RESUME trigger, `settled` — `turned` with the
/// run settled too, a commit before the ack (`System::ack_fire`);
/// `claimed` — only the claim committed (CLAIMED, one more attempt, no
/// turn). All remember the work the trigger was given, so its re-fire
/// runs the same work (or, once done, only acks).
fn fire_midpoints(before: &Model, after: &Model, fire: &Action) -> (Model, Option<Model>, Model) {
    let Action::Fire { key, .. } = fire else {
        return (after.clone(), None, before.clone());
    };
    let claimed_row = |m: &mut Model| {
        if let Some(t) = m.state.triggers.iter_mut().find(|t| &t.key == key) {
            t.status = crate::model::TriggerStatus::Claimed;
        }
    };
    let (mut turned, mut settled) = match unsettled_job(before, after, fire) {
        Some(unsettled) => (unsettled, Some(after.clone())),
        None => (after.clone(), None),
    };
    for m in settled.iter_mut().chain([&mut turned]) {
        claimed_row(m);
    }
    let mut claimed = before.clone();
    if let Some(t) = claimed.state.triggers.iter_mut().find(|t| &t.key == key) {
        t.attempts += 1;
    }
    claimed_row(&mut claimed);
    claimed.fire_work.insert(key.clone(), fire.clone());
    (turned, settled, claimed)
}

/// `after` with the job run a fire's RESUME trigger resumed still in
/// its status of `before` (the fire's turn done, or its trigger acked
/// FAILED, and its run not settled yet), when the fire changes it.
fn unsettled_job(before: &Model, after: &Model, fire: &Action) -> Option<Model> {
    let Action::Fire { key, .. } = fire else {
        return None;
    };
    let run = crate::model::job_of_key(key)?;
    let was = before.state.runs.get(run)?;
    if after.state.runs.get(run) == Some(was) {
        return None;
    }
    let mut m = after.clone();
    m.state.runs.insert(run.to_string(), was.clone());
    Some(m)
}

/// I1 and I4 on a state (any step). Returns the violations.
pub fn state_invariants(state: &State) -> Vec<String> {
    let mut out = Vec::new();
    for (name, a) in &state.agents {
        if let Some(p) = &a.parent {
            if !state.agents.contains_key(p) {
                out.push(format!(
                    "I1 orphan: agent {name} has parent {p}, which is not live"
                ));
            }
        }
    }
    let mut seen = BTreeSet::new();
    for k in &state.outbox {
        if !seen.insert(k) {
            out.push(format!(
                "I4 duplicate side effect: key {k:?} reached the world twice"
            ));
        }
    }
    out
}

/// I2 right after a restart.
pub fn recovery_invariants(state: &State) -> Vec<String> {
    state
        .agents
        .iter()
        .filter(|(_, a)| a.status != Status::Suspended)
        .map(|(n, _)| format!("I2 agent {n} is resident right after recovery"))
        .collect()
}

/// A log line's logical time (the rest of the line is skipped unread).
#[derive(serde::Deserialize)]
struct Stamp {
    ts: Option<u64>,
}

/// I3: every `events.jsonl` in `disk` is complete, valid JSON lines whose
/// `ts` strictly increases.
pub fn log_invariants(disk: &std::collections::BTreeMap<PathBuf, Vec<u8>>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, bytes) in disk {
        if path.file_name().and_then(|n| n.to_str()) != Some("events.jsonl") {
            continue;
        }
        if !bytes.is_empty() && bytes.last() != Some(&b'\n') {
            out.push(format!(
                "I3 {}: partial trailing line after recovery",
                path.display()
            ));
        }
        let mut offset = 0usize;
        let mut last_ts: Option<u64> = None;
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            // UTF-8, then the JSON syntax (IgnoredAny builds no tree, and
            // skips strings without re-checking their encoding).
            let valid = |l: &[u8]| {
                std::str::from_utf8(l).is_ok() && serde_json::from_slice::<serde::de::IgnoredAny>(l).is_ok()
            };
            if line.ends_with(b"\n") && !valid(&line[..line.len() - 1]) {
                out.push(format!(
                    "I3 {} offset {offset}: line is not valid JSON",
                    path.display()
                ));
            } else if let Ok(Stamp { ts: Some(ts) }) = serde_json::from_slice::<Stamp>(line) {
                if last_ts.is_some_and(|last| ts <= last) {
                    out.push(format!(
                        "I3 {} offset {offset}: ts {ts} does not follow ts {} of the line before",
                        path.display(),
                        last_ts.unwrap_or_default()
                    ));
                }
                last_ts = Some(ts);
            }
            offset += line.len();
        }
    }
    out
}
