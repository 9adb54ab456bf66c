//! The recovery procedure, in one place. [`crate::runtime::Runtime::open`]
//! runs it before anything else touches the disk.
//!
//! Invariant: afterwards no session is ACTIVE, every log is a repaired valid
//! JSONL prefix (no partial line, no pending file), every non-terminated
//! session has `agent.created` and a live parent (roots first), and the
//! inboxes hold exactly the enqueued-minus-delivered messages. Running it
//! twice (a crash during recovery) gives the same result.
//!
//! Before any step, [`preflight`] (run by the boot, read-only) refuses
//! damage outside the crash model — a log that lost acknowledged entries, a
//! session whose `agent.created` is gone although a child names it, a
//! missing or replaced store — so no step below mistakes it for a crash.
//!
//! Steps:
//! 0. the SQLite stores first ([`recover_stores`]): decide every INTENT in
//!    the activity ledger, reclaim expired trigger leases;
//! 1. scan session records (removing `.tmp` leftovers); record-less
//!    directories are orphans from a crash in session creation: cleaned;
//! 2. repair each log (cut a partial trailing line, replay or clean the
//!    pending entry);
//! 3. `agent.terminated` sessions are skipped (their record is made
//!    TERMINATED if the crash hit before it was; the ids their durable
//!    tool results reserved are observed, never handed out again); ACTIVE
//!    becomes SUSPENDED (persisted);
//! 4. sessions without `agent.created` are orphans: their files are removed;
//! 5. the tree is rebuilt from `agent.created` in dependency order; a
//!    session whose parent never resolves is terminated and reported;
//! 6. pending messages (enqueued minus delivered) are re-injected into the
//!    inboxes without logging anything;
//! 7. roots are listed as resumable: a bare-LLM provider gets the
//!    conversation rebuilt from the log on its next turn; an interrupted
//!    turn is kept as the agent's open turn up to its last durable
//!    `round.complete` (running it again resumes there).

pub mod damage;
// The oracle's on-disk checker (the harness and the tests call it after a
// recovery; the product never does): behind `fakes`, with the stand-ins.
#[cfg(feature = "fakes")]
mod invariants;
mod placement;
mod stores;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

pub use damage::{preflight, store_behind, DamageError};
#[cfg(feature = "fakes")]
pub use invariants::check_invariants;
pub use stores::{recover_stores, StoreRecovery, StoreRecoveryError};

use crate::fs::Fs;
use crate::log::{self, Event, EventLog, LogEntry, LogRepair};
use crate::runtime::inbox::{Inboxes, Message};
use crate::runtime::orchestration::max_reserved_in_log;
use crate::runtime::tree::AgentTree;
use crate::runtime::turn::replay_turns;
use crate::runtime::{AgentId, AgentSlot, MessageId, RuntimeConfig, RuntimeError, SessionId};
use crate::store::session::{ScannedSession, SessionRecord, SessionState, SessionStore};

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// Session directories seen.
    pub sessions_scanned: u64,
    /// `session.json.tmp` leftovers removed.
    pub tmp_files_removed: u64,
    /// Logs that needed repair, with what was done (truncated bytes, pending).
    pub logs_repaired: BTreeMap<SessionId, LogRepair>,
    /// Sessions flipped ACTIVE → SUSPENDED.
    pub suspended: Vec<SessionId>,
    /// Sessions whose record was made TERMINATED to match their log.
    pub terminated_records_fixed: Vec<SessionId>,
    /// Orphan sessions cleaned (no record, or no `agent.created`).
    pub orphans_cleaned: Vec<SessionId>,
    /// Sessions terminated because their parent never resolved.
    pub dangling_terminated: Vec<SessionId>,
    /// Messages re-injected into inboxes, per recipient.
    pub messages_reinjected: BTreeMap<AgentId, Vec<MessageId>>,
    /// Messages the orchestration tools promised in a durable result that
    /// a crash left unsent, enqueued by the boot (`Runtime::open`), per
    /// recipient session: each is one `message.enqueued` line appended to
    /// that session's log after its repair.
    pub orchestration_enqueued: BTreeMap<SessionId, Vec<MessageId>>,
    /// Sessions of children a durable `spawn_agent` result promised that
    /// a crash left uncreated (or half created: an orphan directory this
    /// recovery cleaned), created by the boot with their reserved ids: each
    /// log is new, its one line `agent.created`.
    pub orchestration_spawned: Vec<SessionId>,
    /// Entries of `agents/` that are not session directories (left alone).
    pub foreign_entries: Vec<String>,
    /// Agents back in the tree.
    pub agents_recovered: u64,
    /// Root agents, resumable (conversation rebuilt from the log).
    pub roots_resumable: Vec<AgentId>,
    /// Agents whose last turn was interrupted, with the round it resumes
    /// at when run again (after its last durable `round.complete`).
    pub turns_interrupted: BTreeMap<AgentId, u32>,
}

impl RecoveryReport {
    /// Total bytes cut from partial trailing lines.
    pub fn truncated_bytes(&self) -> u64 {
        self.logs_repaired.values().map(|r| r.truncated_bytes).sum()
    }

    /// Total messages re-injected.
    pub fn reinjected_count(&self) -> usize {
        self.messages_reinjected.values().map(Vec::len).sum()
    }
}

/// In-memory state rebuilt by recovery, handed to the runtime.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub store: SessionStore,
    pub tree: AgentTree,
    pub agents: BTreeMap<AgentId, AgentSlot>,
    pub inbox: Inboxes,
    pub max_id_counter: u64,
    pub max_ts: u64,
}

struct Candidate {
    record: SessionRecord,
    entries: Vec<LogEntry>,
    agent_id: AgentId,
    name: String,
    instructions: String,
    parent_session: Option<SessionId>,
}

/// Run recovery on the runtime rooted at `root`.
pub(crate) fn recover(
    fs: &Arc<dyn Fs>,
    root: &Path,
    config: &RuntimeConfig,
) -> Result<(Recovered, RecoveryReport), RuntimeError> {
    let store = SessionStore::open(fs.clone(), root, config.canaries.clone())?;
    let mut report = RecoveryReport::default();
    let mut max_id = 0u64;
    let mut max_ts = 0u64;
    let (scanned, tmp_removed) = store.scan()?;
    report.tmp_files_removed = tmp_removed;
    report.sessions_scanned = scanned.len() as u64;
    let mut candidates = Vec::new();
    for s in scanned {
        let mut record = match s {
            ScannedSession::NoRecord(id) => {
                max_id = max_id.max(id.counter());
                store.remove_files(&id)?;
                report.orphans_cleaned.push(id);
                continue;
            }
            ScannedSession::Foreign(name) => {
                report.foreign_entries.push(name);
                continue;
            }
            ScannedSession::Record(r) => r,
        };
        let id = record.session_id.clone();
        max_id = max_id.max(id.counter()).max(record.agent_id.counter());
        let dir = store.dir(&id);
        let (entries, repair) = log::repair(fs.as_ref(), &dir, &id, &config.canaries)?;
        if repair != LogRepair::default() {
            report.logs_repaired.insert(id.clone(), repair);
        }
        for e in &entries {
            max_ts = max_ts.max(e.ts);
            if let Event::MessageEnqueued { message_id, .. } = &e.event {
                max_id = max_id.max(message_id.counter());
            }
        }
        let terminated = entries
            .iter()
            .any(|e| matches!(e.event, Event::AgentTerminated { .. }));
        if terminated || record.state == SessionState::Terminated {
            // Recovery rebuilds no turn of a terminated agent, yet the ids
            // its durable results reserved stay reserved.
            max_id = max_id.max(max_reserved_in_log(&entries));
            if record.state != SessionState::Terminated {
                record.state = SessionState::Terminated;
                store.write(&record)?;
                report.terminated_records_fixed.push(id);
            }
            continue;
        }
        let created = entries.iter().find_map(|e| match &e.event {
            Event::AgentCreated {
                agent_id,
                name,
                parent_session_id,
                instructions,
            } => Some((
                agent_id.clone(),
                name.clone(),
                instructions.clone(),
                parent_session_id.clone(),
            )),
            _ => None,
        });
        let Some((agent_id, name, instructions, parent_session)) = created else {
            store.remove_files(&id)?;
            report.orphans_cleaned.push(id);
            continue;
        };
        max_id = max_id.max(agent_id.counter());
        if agent_id != record.agent_id {
            return Err(RuntimeError::Recovery(format!(
                "{}: agent.created names agent {agent_id} but session.json names {} \
                 (one of them is damaged: inspect or quarantine the session)",
                dir.join(log::EVENTS_FILE).display(),
                record.agent_id
            )));
        }
        if record.state == SessionState::Active {
            record.state = SessionState::Suspended;
            store.write(&record)?;
            report.suspended.push(id.clone());
        }
        candidates.push(Candidate {
            record,
            entries,
            agent_id,
            name,
            instructions,
            parent_session,
        });
    }
    let (tree, agents, inbox) = rebuild(fs, &store, config, candidates, &mut report, max_ts, &mut max_id)?;
    // Postcondition, checked in production too: a broken tree here would
    // be acknowledged state silently misread.
    let violations = tree.violations();
    if !violations.is_empty() {
        return Err(RuntimeError::Recovery(format!(
            "rebuilt agent tree is inconsistent: {violations:?} (inspect {})",
            root.display()
        )));
    }
    report.agents_recovered = agents.len() as u64;
    tracing::info!(
        agents = agents.len(),
        orphans = report.orphans_cleaned.len(),
        reinjected = report.reinjected_count(),
        "recovery done"
    );
    Ok((
        Recovered {
            store,
            tree,
            agents,
            inbox,
            max_id_counter: max_id,
            max_ts,
        },
        report,
    ))
}

type Rebuilt = (AgentTree, BTreeMap<AgentId, AgentSlot>, Inboxes);

/// Steps 5–7: tree in dependency order, slots, inboxes.
fn rebuild(
    fs: &Arc<dyn Fs>,
    store: &SessionStore,
    config: &RuntimeConfig,
    candidates: Vec<Candidate>,
    report: &mut RecoveryReport,
    max_ts: u64,
    max_id: &mut u64,
) -> Result<Rebuilt, RuntimeError> {
    let mut tree = AgentTree::default();
    let mut agents = BTreeMap::new();
    let mut inbox = Inboxes::default();
    let mut by_session: BTreeMap<SessionId, AgentId> = BTreeMap::new();
    // Roots first, then children whose parent is placed (`placement`:
    // the rule `verify` follows too).
    let (placed, mut cut_off) = placement::place(
        candidates,
        |c| &c.record.session_id,
        |c| c.parent_session.as_ref(),
    );
    for c in placed {
        let parent = match &c.parent_session {
            None => None,
            Some(ps) => match by_session.get(ps) {
                Some(p) => Some(p.clone()),
                // Not reached: `place` puts every parent before its
                // children. Should it be, the child dangles: cut it off.
                None => {
                    cut_off.push(c);
                    continue;
                }
            },
        };
        tree.add(c.agent_id.clone(), c.name.clone(), parent.clone())?;
        if parent.is_none() {
            report.roots_resumable.push(c.agent_id.clone());
        }
        by_session.insert(c.record.session_id.clone(), c.agent_id.clone());
        let c_agent = c.agent_id.clone();
        let slot = rebuild_slot(fs, store, config, c, parent, &mut inbox, report);
        if let Some(open) = &slot.open {
            report.turns_interrupted.insert(c_agent.clone(), open.round);
        }
        agents.insert(c_agent, slot);
    }
    let mut ts = max_ts;
    for mut c in cut_off {
        // Parent unknown: the tree would dangle. Terminate durably, keep the
        // files for inspection (and the ids its results reserved, as a
        // terminated agent's).
        *max_id = (*max_id).max(max_reserved_in_log(&c.entries));
        let dir = store.dir(&c.record.session_id);
        let next = c.entries.len() as u64;
        let mut log = EventLog::reopen(
            fs.clone(),
            &dir,
            c.record.session_id.clone(),
            next,
            config.canaries.clone(),
        );
        ts += 1;
        log.append(
            ts,
            Event::AgentTerminated {
                agent_id: c.agent_id.clone(),
            },
        )?;
        c.record.state = SessionState::Terminated;
        store.write(&c.record)?;
        tracing::warn!(session = %c.record.session_id, "terminated: parent session never resolved");
        report.dangling_terminated.push(c.record.session_id);
    }
    Ok((tree, agents, inbox))
}

fn rebuild_slot(
    fs: &Arc<dyn Fs>,
    store: &SessionStore,
    config: &RuntimeConfig,
    c: Candidate,
    parent: Option<AgentId>,
    inbox: &mut Inboxes,
    report: &mut RecoveryReport,
) -> AgentSlot {
    let mut delivered = BTreeSet::new();
    for e in &c.entries {
        if let Event::MessageDelivered { message_ids }
        | Event::TurnComplete {
            delivered: message_ids,
            ..
        } = &e.event
        {
            delivered.extend(message_ids.iter().cloned());
        }
    }
    let mut seen = BTreeSet::new();
    for e in &c.entries {
        if let Event::MessageEnqueued {
            message_id,
            sender,
            recipient,
            payload,
        } = &e.event
        {
            if delivered.contains(message_id) || !seen.insert(message_id.clone()) {
                continue;
            }
            inbox.push(Message {
                id: message_id.clone(),
                from: sender.clone(),
                to: recipient.clone(),
                payload: payload.clone(),
            });
            report
                .messages_reinjected
                .entry(recipient.clone())
                .or_default()
                .push(message_id.clone());
        }
    }
    let dir = store.dir(&c.record.session_id);
    let log = EventLog::reopen(
        fs.clone(),
        &dir,
        c.record.session_id.clone(),
        c.entries.len() as u64,
        config.canaries.clone(),
    );
    let turns = replay_turns(&c.entries);
    AgentSlot {
        name: c.name,
        instructions: c.instructions,
        parent,
        conversation: turns.conversation,
        done_work: turns.done_work,
        started_work: turns.started_work,
        open: turns.open,
        parked: turns.parked,
        in_turn: None,
        delivered,
        log,
        record: c.record,
    }
}
