//! The token-usage bookkeeping a live system shows, against what its
//! turns asked of the model (issue 27's "bookkeeping the oracle never
//! compares").
//!
//! The promise (`src/system/calls.rs`): every completed provider call
//! leaves one `token_usage` row, committed before the agent loop goes on
//! with the call's answer, under the turn's number in the agent's
//! conversation (the completed turns before it), with the provider's
//! model; rows are append-only until a GC. So, for every live agent:
//!
//! - **U1** for each completed turn `i` of its conversation, the rows
//!   numbered `i` or lower are at least as many as the provider calls
//!   turns `0..=i` needed (a turn's script rounds, plus its final answer;
//!   [`asks_of`]). Cumulative, not per turn: a round re-asked after a crash
//!   adds a row (that call was paid twice), and a turn parked on a
//!   confirmation left the rows of its first rounds under the number the
//!   next turn then took;
//! - **U2** no row is numbered above the completed turns (the turn in
//!   flight, or parked, is numbered by the turns completed before it);
//! - **U3** each row names the provider's model and the usage the
//!   scripted provider reports (one output token, at least one input
//!   message);
//! - **U4** the session's usage total (`UsageStore::total_token_usage`,
//!   what a report of the agent's spend reads) is the sum of its rows.
//!
//! Relaxation: a GC (TTL 0) deletes the rows of sessions whose work is
//! settled, a rule the model does not state; an agent alive at any GC —
//! one a crash cut short included — is no longer checked
//! ([`Driver::forget_usage`]), **unless its log ends in a turn still
//! open** (started, never completed): its runtime holds that turn to
//! resume, and a GC keeps the session of an agent with a turn to resume
//! (`System::gc`'s keep), so its rows stay checked through that GC —
//! **nor if its session has a run still unsettled** (a job run
//! `running`, or any run `waiting_for_human`: `System::gc` keeps that
//! session's rows too, for the operator who resumes it; read from a
//! detached copy of the disk with the harness's own SQL).
//! Agents created after it are checked too.

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::log::{Event, LogEntry};
use durable_agent::runtime::{AgentId, ConversationItem};
use durable_agent::store::usage::UsageStore;

use super::Driver;

/// The provider calls a completed turn with `prompt` made: one per round
/// of its script, and the final answer's.
pub fn asks_of(prompt: &str) -> usize {
    crate::model::script_rounds(prompt).len() + 1
}

/// Whether a log's last turn is open, as the runtime's replay of it
/// (`replay_turns`) leaves it: a `turn.start` with no `turn.complete`
/// after it. Conservative: a resume that brings a parked turn back
/// (`turn.resume` with a prompt), or a line that does not parse, answers
/// `false` (the agent is then left unchecked, as before).
fn ends_in_open_turn(log: &[u8]) -> bool {
    let mut open = false;
    for line in log.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match LogEntry::parse(line).map(|e| e.event) {
            Ok(Event::TurnStart { .. }) => open = true,
            Ok(Event::TurnComplete { .. }) => open = false,
            Ok(Event::TurnResume { prompt: Some(_), .. }) | Err(_) => return false,
            Ok(_) => {}
        }
    }
    open
}

/// The model the scripted provider names (`Provider::model`).
const MODEL: &str = "scripted-1";

impl Driver {
    /// From now on, the usage rows of every agent known so far are the GC's
    /// to delete, but those of a live agent whose log ends in an open turn
    /// (called before a GC op starts, so a crash image forked inside it
    /// knows too).
    pub fn forget_usage(&mut self) {
        let mut kept = self.open_in_logs();
        kept.extend(self.unsettled_run_agents());
        self.usage_unchecked
            .extend(self.names.keys().filter(|id| !kept.contains(*id)).cloned());
    }

    /// The live agents whose session has a run a GC must keep the session
    /// of: a job run still `running`, or any run `waiting_for_human`. Read
    /// from a detached copy of the disk (no I/O point of the run) with the
    /// harness's own SQL; an unreadable store keeps none (the agents are
    /// then left unchecked, as before).
    fn unsettled_run_agents(&self) -> BTreeSet<AgentId> {
        use durable_agent::store::inspect::BOOKKEEPING_RUN_PREFIX;
        let Ok(system) = self.system() else {
            return BTreeSet::new();
        };
        let Ok(db) = self.store_copy() else {
            return BTreeSet::new();
        };
        let sessions: BTreeSet<String> = db
            .conn()
            .prepare(
                "SELECT session_id FROM runs WHERE status = 'waiting_for_human' \
                 OR (status = 'running' AND run_id NOT LIKE ?1 || '%')",
            )
            .and_then(|mut stmt| {
                stmt.query_map([BOOKKEEPING_RUN_PREFIX], |r| r.get::<_, String>(0))?
                    .collect::<Result<_, _>>()
            })
            .unwrap_or_default();
        let rt = system.runtime();
        rt.tree()
            .nodes()
            .keys()
            .filter(|id| rt.session_id(id).is_some_and(|s| sessions.contains(s.as_str())))
            .cloned()
            .collect()
    }

    /// The live agents whose log, as the process wrote it, ends in an open
    /// turn ([`ends_in_open_turn`]); none when no system is open.
    fn open_in_logs(&self) -> BTreeSet<AgentId> {
        let Ok(system) = self.system() else {
            return BTreeSet::new();
        };
        let rt = system.runtime();
        let logs = self.fs.disk_image_where(super::project::is_log_file);
        rt.tree()
            .nodes()
            .keys()
            .filter(|id| {
                rt.session_dir(id)
                    .and_then(|dir| logs.get(&dir.join("events.jsonl")))
                    .is_some_and(|log| ends_in_open_turn(log))
            })
            .cloned()
            .collect()
    }

    /// U1–U3 for every live agent of `conversations` not alive at a GC.
    pub(super) fn usage_violations(
        &self,
        conversations: &BTreeMap<AgentId, Vec<ConversationItem>>,
    ) -> Vec<String> {
        let Ok(system) = self.system() else {
            return Vec::new();
        };
        let rt = system.runtime();
        let db = system.db();
        let mut out = Vec::new();
        for (id, items) in conversations {
            if self.usage_unchecked.contains(id) {
                continue;
            }
            let Some(session) = rt.session_id(id) else {
                continue;
            };
            let agent = self.names.get(id).map_or_else(|| format!("?{id}"), String::clone);
            let rows = match UsageStore.token_usage(db.conn(), session.as_str()) {
                Ok(rows) => rows,
                Err(e) => {
                    out.push(format!("usage of {agent}: cannot be read: {e}"));
                    continue;
                }
            };
            let summed = rows.iter().fold((0u64, 0u64), |(i, o), r| {
                (i + r.input_tokens, o + r.output_tokens)
            });
            match UsageStore.total_token_usage(db.conn(), session.as_str()) {
                Ok(total) if total == summed => {}
                Ok(total) => out.push(format!(
                    "U4: usage of {agent}: the total reads {total:?} (input, output) tokens, but its {} rows sum to {summed:?}",
                    rows.len()
                )),
                Err(e) => out.push(format!("usage of {agent}: the total cannot be read: {e}")),
            }
            let prompts: Vec<&str> = items
                .iter()
                .filter_map(|i| match i {
                    ConversationItem::Prompt { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            let completed = prompts.len() as u64;
            let mut by_turn: BTreeMap<u64, usize> = BTreeMap::new();
            for row in &rows {
                *by_turn.entry(row.turn).or_default() += 1;
                if row.turn > completed {
                    out.push(format!(
                        "U2: usage of {agent}: a row of turn {}, but {completed} turns completed",
                        row.turn
                    ));
                }
                if row.model.as_deref() != Some(MODEL) || row.output_tokens != 1 || row.input_tokens == 0 {
                    out.push(format!(
                        "U3: usage of {agent}: a row of turn {} records model {:?}, {} input and {} output tokens; the provider {MODEL:?} reported 1 output token for at least one message",
                        row.turn, row.model, row.input_tokens, row.output_tokens
                    ));
                }
            }
            let (mut asked, mut recorded) = (0, 0);
            for (turn, prompt) in prompts.iter().enumerate() {
                asked += asks_of(prompt);
                recorded += by_turn.get(&(turn as u64)).copied().unwrap_or(0);
                if recorded < asked {
                    out.push(format!(
                        "U1: usage of {agent}: turns 0..={turn} made at least {asked} provider calls, but {recorded} usage rows are numbered {turn} or lower (rows by turn: {by_turn:?})"
                    ));
                    break;
                }
            }
        }
        out
    }
}
