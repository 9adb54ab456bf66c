//! Projection: the system's observable state (runtime, stores, world) as
//! a model [`State`], plus the loop-store and trigger-store helpers the
//! driver's ops share with it.
//!
//! Invariant: reading only. Nothing here changes the disk except through
//! the store calls an op asks for (`loop_round`, `checkpoint`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use durable_agent::fs::Fault;
use durable_agent::log::entry::HookOutcome;
use durable_agent::log::{DecidedCall, Event, LogEntry};
use durable_agent::world::Delivery;

use durable_agent::recovery::RecoveryReport;
use durable_agent::runtime::orchestration::{OrchestrationTool, SEND_MESSAGE, SPAWN_AGENT};
use durable_agent::runtime::{AgentId, ConversationItem, MessageId, SessionId};
use durable_agent::runtime::{RuntimeState, ToolOutput, ToolRequest, TurnOutcome};
use durable_agent::sqlite::Db;
use durable_agent::store::checkpoints::{CheckpointInput, CheckpointStore, Message, TokenUsage};
use durable_agent::store::session::{SessionRecord, SessionState, SESSION_FILE};
use durable_agent::store::tool_calls::{RunStatus, SideEffect, ToolCall, ToolCallStatus, ToolCallStore};
use durable_agent::store::triggers::TriggerStatus as StoreStatus;
use durable_agent::system::System;
use durable_agent::system::{parked_answer, session_run};

use super::replays::Expect;
use super::{Driver, LOOP_RUN, LOOP_SESSION};
use crate::model::{
    ledger_calls, round_messages, Agent, Msg, Record, State, Status, TriggerRow, TriggerStatus, Turn,
    MAX_REPLAYS,
};
use crate::op::{Lost, ToolStep};
use crate::standins::LOOKUP_RETRIES;

/// The loop's checkpoint after round `round`.
pub(super) fn checkpoint(checkpoints: &CheckpointStore, db: &Db, round: u64, now: u64) -> Result<(), String> {
    let input = CheckpointInput {
        run_id: LOOP_RUN.into(),
        session_id: LOOP_SESSION.into(),
        turn: round,
        total_usage: TokenUsage::default(),
        tool_calls_count: 0,
    };
    checkpoints
        .write_checkpoint(db.conn(), &input, now)
        .map(drop)
        .map_err(|e| format!("loop checkpoint: {e}"))
}

/// What [`Driver::ledger_violations`] found of one answered turn.
#[derive(Debug, Default)]
pub(super) struct LedgerVerdict {
    pub violations: Vec<String>,
    /// The calls refused for a parked run (R9): their answer is the
    /// refusal, whatever the script says.
    pub parked: BTreeSet<String>,
    /// The rows this turn's answers settled, as read after it: (id,
    /// replays begun, status).
    pub answered: Vec<(String, u32, ToolCallStatus)>,
}

impl Driver {
    pub(super) fn loop_round(&self, round: u64, tools: u8, now: u64) -> Result<(), String> {
        let system = self.system()?;
        let db = system.db();
        for (i, content) in round_messages(round, tools).iter().enumerate() {
            let role = if i == 0 { "assistant" } else { "tool" };
            system
                .checkpoints()
                .append_message(db.conn(), LOOP_SESSION, round, &Message::new(role, content), now)
                .map_err(|e| format!("loop message: {e}"))?;
        }
        checkpoint(system.checkpoints(), &db, round, now)
    }

    fn loop_messages(&self) -> Result<Vec<String>, String> {
        let system = self.system()?;
        let msgs = system
            .checkpoints()
            .messages_up_to(system.db().conn(), LOOP_SESSION, i64::MAX)
            .map_err(|e| e.to_string())?;
        Ok(msgs.into_iter().map(|m| m.message.content).collect())
    }

    /// The job runs, as the operator's runs view lists them (`GET /runs`,
    /// `durable-agent runs`: `store::inspect::user_runs`), by id.
    fn job_runs(&self) -> Result<BTreeMap<String, String>, String> {
        use durable_agent::store::inspect::{user_runs, Page, MAX_LIMIT};
        let system = self.system()?;
        let (rows, _) = user_runs(system.db().conn(), Page::new(MAX_LIMIT, 0)).map_err(|e| e.to_string())?;
        Ok(rows
            .into_iter()
            .map(|r| (r.run_id, r.status.as_str().to_string()))
            .collect())
    }

    /// A trigger's dedup key as the model writes it: a RESUME key names
    /// its agent by id (`resume:{work}@{id}`), the model by name.
    pub(super) fn model_key(&self, dedup_key: Option<&str>, id: &str) -> String {
        let Some(key) = dedup_key else {
            return format!("?{id} (no dedup key)");
        };
        let named = durable_agent::system::resume_key_parts(key).and_then(|(work, agent)| {
            let agent = AgentId::from_hex(agent).ok()?;
            Some(crate::model::work_key(self.names.get(&agent)?, work))
        });
        named.unwrap_or_else(|| key.to_string())
    }

    /// The trigger rows as the model writes them, and the ids of the rows
    /// there are.
    fn trigger_rows(&self) -> Result<(Vec<TriggerRow>, BTreeSet<String>), String> {
        let system = self.system()?;
        let all = system
            .triggers()
            .all(system.db().conn(), self.now())
            .map_err(|e| e.to_string())?;
        let ids = all.iter().map(|t| t.id.clone()).collect();
        let rows = all
            .into_iter()
            .map(|t| TriggerRow {
                key: self.model_key(t.dedup_key.as_deref(), &t.id),
                status: match t.status {
                    StoreStatus::Pending => TriggerStatus::Pending,
                    StoreStatus::Claimed => TriggerStatus::Claimed,
                    StoreStatus::Done => TriggerStatus::Done,
                    StoreStatus::Failed => TriggerStatus::Failed,
                    StoreStatus::Dead => TriggerStatus::Dead,
                },
                attempts: t.attempts,
                not_before: t.not_before_ms.unwrap_or(0),
                fire_at: t.fire_at_ms,
            })
            .collect();
        Ok((rows, ids))
    }

    /// The runtime's observable state as a model [`State`] (empty when not
    /// open), plus its own in-memory invariant violations.
    pub fn state(&mut self) -> (State, Vec<String>) {
        let Some(rt) = self.system.as_ref().map(System::runtime) else {
            return (State::default(), Vec::new());
        };
        let rs = rt.state();
        let mut violations = rt.check_invariants();
        violations.append(&mut self.answer_violations);
        violations.extend(self.usage_violations(&rs.conversations));
        violations.extend(self.error_violations());
        violations.extend(self.context.check(&rs));
        for (id, v) in &rs.agents {
            self.names.insert(id.clone(), v.name.clone());
        }
        let name = |names: &BTreeMap<AgentId, String>, id: &AgentId| {
            names.get(id).cloned().unwrap_or_else(|| format!("?{id}"))
        };
        // The stores change only through store ops and boots, which drop
        // this cache; other ops reuse the last reading (SQL is the cost).
        let (triggers, loop_messages, runs) = match self.store_cache.clone() {
            Some(cached) => cached,
            None => {
                let read = self
                    .trigger_rows()
                    .and_then(|(t, ids)| Ok((t, self.loop_messages()?, self.job_runs()?, ids)));
                match read {
                    Ok((rows, loop_messages, runs, ids)) => {
                        // A key whose row is gone (collected by a GC, even
                        // one a crash cut short and recovery kept) may be
                        // emitted again as a new row: forget the old id.
                        // A row lost any other way is the model's to catch.
                        self.trigger_ids.retain(|_, id| ids.contains(id));
                        // Once per boot: the views read what the stores
                        // read, so one look at each recovered state is
                        // enough (and each look is SQL).
                        if std::mem::take(&mut self.views_due) {
                            violations.extend(self.view_violations(&ids));
                        }
                        let fresh = (rows, loop_messages, runs);
                        self.store_cache = Some(fresh.clone());
                        fresh
                    }
                    Err(e) => {
                        violations.push(format!("the stores cannot be read: {e}"));
                        (Vec::new(), Vec::new(), BTreeMap::new())
                    }
                }
            }
        };
        // The world counts effects per agent and logical action (the
        // scripted call's `key`), whatever idempotency key the runtime
        // derived: an effect sent twice under two runtime keys is still a
        // duplicate, and two agents' identical calls are two effects.
        let deliveries = self.world.deliveries();
        if deliveries.iter().any(|d| !self.owners.contains_key(&d.idem_key)) {
            self.attribute();
        }
        let mut outbox = Vec::with_capacity(deliveries.len());
        for d in &deliveries {
            let owner = self
                .owners
                .get(&d.idem_key)
                .map_or("?", String::as_str)
                .to_string();
            outbox.push(match d.payload.get("key").and_then(|k| k.as_str()) {
                Some(k) => self.occurrence_of(format!("{owner}/{k}"), &d.idem_key),
                None => format!("{owner}/?{} (no logical key)", d.idem_key),
            });
        }
        let (records, mut record_violations) = self.records(&rs);
        violations.append(&mut record_violations);
        let mut state = State {
            agents: BTreeMap::new(),
            outbox,
            triggers,
            loop_messages,
            records,
            runs,
        };
        for (id, view) in &rs.agents {
            let pending: Vec<Msg> = rs
                .pending
                .get(id)
                .map(|ms| {
                    ms.iter()
                        .map(|m| Msg {
                            from: name(&self.names, &m.from),
                            payload: m.payload.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(ms) = rs.pending.get(id) {
                for (m, p) in ms.iter().zip(&pending) {
                    self.msgs.insert(m.id.clone(), p.clone());
                }
            }
            let delivered = rs
                .delivered
                .get(id)
                .map(|ids| {
                    ids.iter()
                        .map(|mid| {
                            self.msgs.get(mid).cloned().unwrap_or_else(|| Msg {
                                from: "?".into(),
                                payload: format!("?{mid}"),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let status = match view.session_state {
                SessionState::Active => Status::Resident,
                SessionState::Suspended | SessionState::Terminated => Status::Suspended,
            };
            let agent = Agent {
                parent: view.parent.as_ref().map(|p| name(&self.names, p)),
                status,
                turns: turns(rs.conversations.get(id).map(Vec::as_slice).unwrap_or(&[])),
                pending,
                delivered,
            };
            state.agents.insert(view.name.clone(), agent);
        }
        (state, violations)
    }

    /// The tool-call ledger's bookkeeping of the turn `outcome` of `agent`
    /// just answered, against the rule the model states
    /// ([`crate::model::ledger_calls`]; the relaxation is oracle R9): each
    /// call's row (its own, or the row of the same call a rolled-back run
    /// of the turn left, which the ledger answers it from) in the agent's
    /// session run, settled as the call's result says, with its
    /// side-effect class, no replay unless R9; the run `running` unless a
    /// call reached the replay limit, and waiting for a human once a call
    /// was refused for it. Read through the system's own connection, as an
    /// operator's `runs` view would. Returns the violations, and the calls
    /// refused for a parked run (R9), whose answer is the refusal.
    pub(super) fn ledger_violations(
        &self,
        agent: &str,
        outcome: &TurnOutcome,
        tools: &[ToolStep],
    ) -> LedgerVerdict {
        let mut verdict = LedgerVerdict::default();
        let expected = ledger_calls(tools);
        if expected.iter().all(Option::is_none) {
            // No call of this turn is in the ledger; the SQL is the cost.
            return verdict;
        }
        let calls: Vec<_> = outcome
            .tool_calls
            .iter()
            // Every orchestration call is the runtime's own, never the
            // ledger's, as `ledger_calls` says: `list_agents` too (left
            // in, it shifted every later call onto the wrong expectation:
            // found by the gate's unseeded libFuzzer smoke, 2026-11-28).
            .filter(|(_, req, _)| OrchestrationTool::from_name(&req.tool).is_none())
            .collect();
        // The attempts of the calls an endpoint failed hard, by row,
        // through the store's own reading (what an operator's `inspect`
        // shows): numbered `1..=n`.
        type Attempts = BTreeMap<String, Vec<u32>>;
        let read = || -> Result<(Vec<ToolCall>, RunStatus, Attempts, String), String> {
            let system = self.system()?;
            let run = self.session_run_of(agent)?;
            let store = ToolCallStore::default();
            let db = system.db();
            let rows = store.calls_of(db.conn(), &run).map_err(|e| e.to_string())?;
            if rows.is_empty() {
                return Ok((rows, RunStatus::Running, Attempts::new(), run));
            }
            let status = store.run_status(db.conn(), &run).map_err(|e| e.to_string())?;
            let mut attempts = Attempts::new();
            for ((call_id, req, _), want) in calls.iter().zip(&expected) {
                if !want.is_some_and(|w| !w.hard.is_none()) {
                    continue;
                }
                if let Some(row) = row_of(&rows, call_id, req) {
                    let numbers = store
                        .attempts(db.conn(), &row.id)
                        .map_err(|e| e.to_string())?
                        .into_iter()
                        .map(|a| a.attempt)
                        .collect();
                    attempts.insert(row.id.clone(), numbers);
                }
            }
            Ok((rows, status, attempts, run))
        };
        // An I/O fault armed for the op, not reached by it, is not the
        // harness's to trip (suspended for the read, as the boot's check
        // does); a crash point reached here is a crash after the op, whose
        // process never reads its answer: nothing is judged.
        let armed = self.fs.fault();
        let suspended = matches!(armed, Some(Fault::FailAt(..) | Fault::LostReplyAt(..)));
        if suspended {
            self.fs.set_fault(None);
        }
        let read = read();
        if suspended {
            self.fs.set_fault(armed);
        }
        if self.fs.crashed() {
            return verdict;
        }
        let (rows, run_status, attempts, run) = match read {
            Ok(read) => read,
            Err(e) => {
                verdict
                    .violations
                    .push(format!("ledger of {agent}: cannot be read: {e}"));
                return verdict;
            }
        };
        let LedgerVerdict {
            violations: out,
            parked,
            answered,
        } = &mut verdict;
        for ((call_id, req, answer), want) in calls.into_iter().zip(expected) {
            let row = row_of(&rows, call_id, req);
            let Some(want) = want else {
                // Denied by a hook: never handed to the executor.
                if let Some(row) = row {
                    out.push(format!(
                        "ledger of {agent}: call {call_id} ({} {}) was denied by a hook, yet the ledger has a row for it ({:?})",
                        req.tool, req.args, row.status
                    ));
                }
                continue;
            };
            let Some(row) = row else {
                out.push(format!(
                    "ledger of {agent}: no row for call {call_id} ({} {})",
                    req.tool, req.args
                ));
                continue;
            };
            let class = if want.irreversible {
                SideEffect::Irreversible
            } else {
                SideEffect::Reversible
            };
            // R9: refused for a parked run — answered, and settled, with
            // the refusal (judged by the row: a release since leaves the
            // refusal, which the model read, and the run running).
            let refused = !want.irreversible
                && !answer.ok
                && row.status == ToolCallStatus::Failed
                && row.error.as_deref() == Some(answer.output.as_str())
                && answer.output == parked_answer(&req.tool, row.replay_attempts);
            if refused {
                parked.insert(call_id.clone());
            }
            // R9: a reversible call caught in flight by crashes is
            // replayed after each, counted as it begins; a success clears
            // the count. Where the boot's reading is known, the count is
            // exact ([`super::replays`]).
            let n = row.replay_attempts;
            // A call a hook parked runs after its release counted like a
            // replay, or is answered from the human's word uncounted.
            let counted = !want.irreversible;
            let expect = self.in_flight.expect(&row.id, call_id);
            if let (false, Some(numbers)) = (refused, attempts.get(&row.id)) {
                if let Some(why) = attempts_violation(want.hard, numbers, answer, expect == Expect::FirstRun)
                {
                    out.push(format!("ledger of {agent}: call {call_id} ({}): {why}", req.tool));
                }
            }
            let replays_ok = match expect {
                Expect::Unknown => n == 0 || (counted && (refused || !want.succeeded)),
                Expect::FirstRun => n == 0 && !refused,
                Expect::Unstarted(c) => n == c && !refused,
                Expect::Settled(c) => n == c,
                Expect::Replayed(c) if !counted || refused => n == c,
                Expect::Replayed(c) if want.confirmed && !want.succeeded => n == c || n == c + 1,
                Expect::Replayed(_) if want.succeeded => n == 0,
                Expect::Replayed(c) => n == c + 1,
            };
            let status = match (refused, want.succeeded) {
                (true, _) | (false, false) => ToolCallStatus::Failed,
                (false, true) => ToolCallStatus::Succeeded,
            };
            let settled = row.status == status && replays_ok;
            answered.push((row.id.clone(), row.replay_attempts, row.status));
            if row.side_effect != class || !settled {
                out.push(format!(
                    "ledger of {agent}: call {call_id} ({}) is {:?}, {:?}, {} replays; the turn answered it {} ({:?} expected)",
                    req.tool,
                    row.status,
                    row.side_effect,
                    row.replay_attempts,
                    if want.succeeded { "ok" } else { "failed" },
                    class
                ));
            }
        }
        // Parked only by a call asked again after its limit of replays
        // (whose count then stays); a call at the limit whose last replay
        // answered leaves the run running.
        let at_limit = rows.iter().any(|r| r.replay_attempts >= MAX_REPLAYS);
        let fine = match run_status {
            RunStatus::WaitingForHuman => at_limit,
            _ => (parked.is_empty() || self.released_runs.contains(&run)) && run_status == RunStatus::Running,
        };
        if !fine {
            out.push(format!(
                "ledger of {agent}: run is {run_status:?} (a call at the replay limit: {at_limit}; calls refused for a parked run: {parked:?})"
            ));
        }
        verdict
    }

    /// The tool-call ledger's run of `agent`'s calls (`session:<id>`).
    pub(super) fn session_run_of(&self, agent: &str) -> Result<String, String> {
        let session = self
            .system()?
            .runtime()
            .session_id(&self.id(agent)?)
            .cloned()
            .ok_or_else(|| format!("{agent} has no session"))?;
        Ok(session_run(session.as_str()))
    }

    /// Each live agent's session record as the process sees it on disk
    /// (read outside the I/O trace: no point is added to the run), and
    /// what is wrong with a record beyond the model's fields: missing,
    /// unreadable, or naming another agent or session.
    fn records(&self, rs: &RuntimeState) -> (BTreeMap<String, Record>, Vec<String>) {
        let is_record = |p: &Path| p.file_name().is_some_and(|n| n == SESSION_FILE);
        let disk = self.fs.disk_image_where(is_record);
        let mut records = BTreeMap::new();
        let mut bad = Vec::new();
        for (id, view) in &rs.agents {
            let path = Path::new(super::ROOT)
                .join("agents")
                .join(view.session_id.as_str())
                .join(SESSION_FILE);
            let Some(bytes) = disk.get(&path) else {
                bad.push(format!(
                    "{}: the live agent {}'s record is missing",
                    path.display(),
                    view.name
                ));
                continue;
            };
            match serde_json::from_slice::<SessionRecord>(bytes) {
                Ok(r) => {
                    if r.agent_id != *id || r.session_id != view.session_id {
                        bad.push(format!(
                            "{}: the record of {} names agent {} and session {}",
                            path.display(),
                            view.name,
                            r.agent_id,
                            r.session_id
                        ));
                    }
                    let record = Record {
                        schema_version: r.schema_version,
                        provider: r.provider,
                        model: r.model,
                        active: r.state == SessionState::Active,
                    };
                    if r.state == SessionState::Terminated {
                        bad.push(format!(
                            "{}: the live agent {}'s record is TERMINATED",
                            path.display(),
                            view.name
                        ));
                    }
                    records.insert(view.name.clone(), record);
                }
                Err(e) => bad.push(format!("{}: unreadable record: {e}", path.display())),
            }
        }
        (records, bad)
    }

    /// Learn which agent each delivered effect's idempotency key belongs
    /// to: the session whose event log holds the durable decision
    /// (`round.decided`) that carries it (I6: every delivery has one), by
    /// the agent its record names. A key two sessions' decisions carry is
    /// no one's (`?a+b`): keys are per agent, so it shows as a difference.
    fn attribute(&mut self) {
        let wanted = |p: &Path| {
            p.file_name()
                .is_some_and(|n| n == SESSION_FILE || n == "events.jsonl")
        };
        let disk = self.fs.disk_image_where(wanted);
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (path, bytes) in &disk {
            if path.file_name().is_some_and(|n| n != "events.jsonl") {
                continue;
            }
            let owner = disk
                .get(&path.with_file_name(SESSION_FILE))
                .and_then(|b| serde_json::from_slice::<SessionRecord>(b).ok())
                .and_then(|r| self.names.get(&r.agent_id).cloned())
                .unwrap_or_else(|| format!("?{}", path.display()));
            for event in events_in(bytes, "round.decided") {
                if let Event::RoundDecided { calls, .. } = event {
                    for call in calls {
                        seen.entry(call.idempotency_key)
                            .or_default()
                            .insert(owner.clone());
                    }
                }
            }
        }
        for (key, owners) in seen {
            let owner = owners.into_iter().collect::<Vec<_>>().join("+");
            self.owners.insert(
                key,
                if owner.contains('+') {
                    format!("?{owner}")
                } else {
                    owner
                },
            );
        }
    }

    /// The event logs as the process sees them (for the log invariant):
    /// those the last boot left when nothing wrote since, else read now.
    pub fn logs(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let is_log = |p: &Path| p.file_name().is_some_and(|n| n == "events.jsonl");
        match &self.boot_logs {
            Some(logs) => logs
                .iter()
                .filter(|(p, _)| is_log(p))
                .map(|(p, b)| (p.clone(), b.clone()))
                .collect(),
            None => self.fs.disk_image_where(is_log),
        }
    }

    /// The runtime's own on-disk invariants after a recovery
    /// ([`durable_agent::recovery::check_invariants`]: records agree with
    /// their logs, no leftover tmp or pending file, a consistent tree),
    /// checked on a detached copy of the disk
    /// ([`durable_agent::fs::SimFs::detached`]) so
    /// that reading it adds no I/O point to the run (a sweep's point
    /// numbers stay the run's).
    pub fn disk_violations(&self) -> Vec<String> {
        use durable_agent::fs::SimConfig;
        let root = std::path::Path::new(super::ROOT);
        let copy = self.fs.detached(SimConfig::new(0));
        match durable_agent::recovery::check_invariants(&copy, root) {
            Ok(()) => Vec::new(),
            Err(v) => v.into_iter().map(|v| format!("disk: {v}")).collect(),
        }
    }
}

/// Fold a conversation (completed turns) into model turns.
fn turns(items: &[ConversationItem]) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::new();
    for item in items {
        match item {
            ConversationItem::Prompt { text } => out.push(Turn {
                prompt: text.clone(),
                tools: Vec::new(),
                response: String::new(),
            }),
            ConversationItem::ToolCall { irreversible, .. } => {
                if let Some(t) = out.last_mut() {
                    t.tools.push(ToolStep {
                        irreversible: *irreversible,
                        ..ToolStep::default()
                    });
                }
            }
            ConversationItem::ToolResult { ok, .. } => {
                if let Some(step) = out.last_mut().and_then(|t| t.tools.last_mut()) {
                    step.ok = *ok;
                }
            }
            ConversationItem::Response { text } => {
                if let Some(t) = out.last_mut() {
                    t.response = text.clone();
                }
            }
        }
    }
    out
}

/// The event logs and their pending copies: what recovery repairs.
pub(super) fn is_log_file(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("events.jsonl" | "events.pending")
    )
}

/// Every call of every durable decision (`round.decided`) in the event
/// logs `logs` (the disk after a boot), for the checks that read the
/// decisions ([`undecided_effects`], [`hook_violations`]). Only the lines
/// that name the event are parsed.
pub(super) fn decided_calls(logs: &BTreeMap<PathBuf, Vec<u8>>) -> Vec<DecidedCall> {
    events_named(logs, "round.decided")
        .flat_map(|event| match event {
            Event::RoundDecided { calls, .. } => calls,
            _ => Vec::new(),
        })
        .collect()
}

/// The events named `name` (`Event::name`) in the event logs `logs`
/// (`events.jsonl` only), in each log's order. Only the lines that name
/// the event are parsed; a line that does not parse is not one.
pub(super) fn events_named<'a>(
    logs: &'a BTreeMap<PathBuf, Vec<u8>>,
    name: &str,
) -> impl Iterator<Item = Event> + 'a {
    let name = name.to_string();
    logs.iter()
        .filter(|(path, _)| path.file_name().and_then(|n| n.to_str()) == Some("events.jsonl"))
        .flat_map(move |(_, bytes)| events_in(bytes, &name))
}

/// The events named `name` in one event log's bytes, as
/// [`events_named`] reads them.
fn events_in<'a>(log: &'a [u8], name: &str) -> impl Iterator<Item = Event> + 'a {
    let needle = format!("\"{name}\"").into_bytes();
    log.split(|b| *b == b'\n')
        .filter(move |line| line.windows(needle.len()).any(|w| w == needle.as_slice()))
        .filter_map(|line| LogEntry::parse(line).ok().map(|entry| entry.event))
}

/// I6: every irreversible effect the world received carries the
/// idempotency key of a durable decision (`decided`, every log's): a call
/// starts only after its round's decision is durable, so no effect can
/// outlive the record of the decision that made it.
pub(super) fn undecided_effects(decided: &[DecidedCall], deliveries: &[Delivery]) -> Vec<String> {
    let decided: BTreeSet<&str> = decided.iter().map(|c| c.idempotency_key.as_str()).collect();
    deliveries
        .iter()
        .filter(|d| !decided.contains(d.idem_key.as_str()))
        .map(|d| {
            format!(
                "I6 an effect with no durable decision: {:?} reached the world under key {}, which no round.decided in any log carries",
                d.payload.get("key").and_then(|k| k.as_str()).unwrap_or("?"),
                d.idem_key
            )
        })
        .collect()
}

/// I8: every durable decision logs the verdict the operator's hooks gave
/// its call ([`crate::standins::ScriptedHooks::decide`], asked with the
/// arguments the model gave): a denial; else a wait for a human, with
/// the arguments every rewrite left — then the model's kept as
/// `original_args` — and no verdict for a call allowed as asked (nor for
/// the runtime's own orchestration tools, nor for arguments that were
/// not JSON: never shown to the hooks). The decisions are resolved here
/// in the order the runtime promises (deny, then every patch, then the
/// wait), not by its `resolve`. A resumed round applies the logged
/// verdict, so a wrong one is what runs.
pub(super) fn hook_violations(decided: &[DecidedCall]) -> Vec<String> {
    use durable_agent::runtime::HookDecision;
    let mut out = Vec::new();
    for call in decided {
        let logged = call.hook.clone().unwrap_or_default();
        let asked = logged.original_args.as_ref().unwrap_or(&call.args);
        let shown = call.invalid_args.is_none() && call.tool != SPAWN_AGENT && call.tool != SEND_MESSAGE;
        let decisions = match shown {
            true => crate::standins::ScriptedHooks::decide(&call.tool, asked),
            false => Vec::new(),
        };
        let mut patched = asked.clone();
        let mut expected = HookOutcome::default();
        if let Some(reason) = decisions.iter().find_map(|d| match d {
            HookDecision::Deny { reason } => Some(reason.clone()),
            _ => None,
        }) {
            expected.denied = Some(reason);
        } else {
            for d in &decisions {
                match d {
                    // The policy's patches are flat objects of non-null
                    // members: RFC 7386's merge is a member-wise insert.
                    HookDecision::ModifyArgs { patch } => {
                        if let (Some(map), Some(patch)) = (patched.as_object_mut(), patch.as_object()) {
                            map.extend(patch.clone());
                        }
                    }
                    HookDecision::RequireConfirmation { reason } => {
                        expected.needs_confirmation.get_or_insert_with(|| reason.clone());
                    }
                    _ => {}
                }
            }
            // The policy's patch adds what the model never sends, so a
            // patched call always keeps the model's arguments (read from
            // the log: a verdict that lost them shows patched args here).
            let rewritten = decisions
                .iter()
                .any(|d| matches!(d, HookDecision::ModifyArgs { .. }));
            expected.original_args = rewritten.then(|| asked.clone());
        }
        if logged != expected || call.args != patched {
            out.push(format!(
                "I8 a decision logged another verdict than the hooks gave: call {} ({} asked with {}) was decided with args {} and hook verdict {:?}; the hooks' verdict is {:?} with args {}",
                call.call_id, call.tool, asked, call.args, call.hook, expected, patched
            ));
        }
    }
    out
}

/// The message id of each of `lines` that is a `message.enqueued` entry,
/// `None` for any other line.
fn enqueued_ids<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Vec<Option<MessageId>> {
    lines
        .map(
            |line| match LogEntry::parse(line.strip_suffix(b"\n").unwrap_or(line)) {
                Ok(LogEntry {
                    event: Event::MessageEnqueued { message_id, .. },
                    ..
                }) => Some(message_id),
                _ => None,
            },
        )
        .collect()
}

/// What the boot's recovery report says it did to each event log must be
/// what it did (an operator reads the report to learn what a crash cost):
/// `before` and `after` hold the logs and pending copies the boot found
/// and left ([`is_log_file`]). For each log the boot kept: the bytes it
/// says it cut are the log's tail and the rest is untouched; what follows
/// them is the pending copy if it says it replayed one, else nothing; and
/// a pending copy found gets exactly one verdict — replayed, deduped
/// (its line is in the kept log) or torn (it is not).
pub(super) fn report_violations(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
    report: &RecoveryReport,
) -> Vec<String> {
    let mut out = Vec::new();
    for (path, old) in before {
        if path.file_name().and_then(|n| n.to_str()) != Some("events.jsonl") {
            continue;
        }
        let Some(new) = after.get(path) else { continue }; // an orphan removed
        let session = path
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        // The report's entries are keyed by session id; a directory whose
        // name is not one has none.
        let id = SessionId::from_hex(session)
            .ok()
            .filter(|id| id.as_str() == session);
        // The messages the boot says it enqueued to this session for sends
        // a crash left half done (`orchestration_enqueued`), in order.
        let promised = id
            .as_ref()
            .and_then(|id| report.orchestration_enqueued.get(id))
            .map(Vec::as_slice)
            .unwrap_or_default();
        if report.orchestration_spawned.iter().any(|s| s.as_str() == session) {
            // A half-created child's orphan, cleaned, then created anew by
            // the boot for the spawn its parent's result promised: a new
            // log holding `agent.created`, then the messages the parent's
            // turn sent the child while it was pending.
            let mut lines = new.split_inclusive(|b| *b == b'\n');
            let created = matches!(
                lines
                    .next()
                    .map(|l| LogEntry::parse(l.strip_suffix(b"\n").unwrap_or(l))),
                Some(Ok(LogEntry {
                    event: Event::AgentCreated { .. },
                    ..
                }))
            );
            let enqueued = enqueued_ids(lines);
            let cleaned = report.orphans_cleaned.iter().any(|s| s.as_str() == session);
            if !created || !cleaned || enqueued.iter().map(Option::as_ref).ne(promised.iter().map(Some)) {
                out.push(format!(
                    "report: {shown}: says the boot created this child for a promised spawn and enqueued {promised:?}, but its log is not one agent.created line of a new session and those messages (orphan cleaned first: {cleaned}; enqueued: {enqueued:?})",
                    shown = path.display()
                ));
            }
            continue;
        }
        let repair = id
            .as_ref()
            .and_then(|id| report.logs_repaired.get(id))
            .cloned()
            .unwrap_or_default();
        let shown = path.display();
        let Some(kept) = old
            .len()
            .checked_sub(usize::try_from(repair.truncated_bytes).unwrap_or(usize::MAX))
        else {
            out.push(format!(
                "report: {shown}: {} bytes cut from a {}-byte log",
                repair.truncated_bytes,
                old.len()
            ));
            continue;
        };
        if new.get(..kept) != old.get(..kept) {
            out.push(format!(
                "report: {shown}: says {} bytes were cut, but the boot changed the {kept} bytes before them ({} bytes before, {} after)",
                repair.truncated_bytes,
                old.len(),
                new.len()
            ));
            continue;
        }
        let pending = before.get(&path.with_file_name("events.pending"));
        let tail = new.get(kept..).unwrap_or_default();
        let replayed: &[u8] = match pending {
            Some(p) if repair.pending_replayed => p,
            _ => &[],
        };
        // Then one `message.enqueued` line per message the boot says it
        // enqueued to this session, in that order.
        let (tail, appended) = match tail.strip_prefix(replayed) {
            Some(rest) if !promised.is_empty() => (replayed, rest),
            _ => (tail, &[][..]),
        };
        let enqueued = enqueued_ids(appended.split_inclusive(|b| *b == b'\n'));
        if enqueued.iter().map(Option::as_ref).ne(promised.iter().map(Some)) {
            out.push(format!(
                "report: {shown}: says the boot enqueued {promised:?} for half-done sends, but it appended {} line(s) after the log's repair: {enqueued:?}",
                enqueued.len()
            ));
        }
        if tail != replayed {
            out.push(format!(
                "report: {shown}: says {} bytes were cut and {} replayed, but the boot left {} bytes after the {kept} it kept ({} bytes before, {} after)",
                repair.truncated_bytes,
                replayed.len(),
                tail.len(),
                old.len(),
                new.len()
            ));
        }
        let verdicts = [
            repair.pending_replayed,
            repair.pending_deduped,
            repair.pending_torn,
        ];
        let given = verdicts.iter().filter(|v| **v).count();
        if given != usize::from(pending.is_some()) {
            out.push(format!(
                "report: {shown}: {given} verdicts on events.pending (replayed {}, deduped {}, torn {}), the boot found {} pending copy",
                repair.pending_replayed,
                repair.pending_deduped,
                repair.pending_torn,
                if pending.is_some() { "a" } else { "no" }
            ));
        }
        if let Some(p) = pending {
            let logged = old[..kept]
                .split_inclusive(|b| *b == b'\n')
                .any(|line| line == p.as_slice());
            if repair.pending_deduped != logged && !repair.pending_replayed {
                out.push(format!(
                    "report: {shown}: events.pending's line {} the kept log, but the report says {}",
                    if logged { "is in" } else { "is not in" },
                    if repair.pending_deduped { "deduped" } else { "torn" }
                ));
            }
        }
    }
    out
}

/// The ledger's row of the call `call_id` of an answered turn: its own,
/// or the row of the same call a rolled-back run of the turn left, which
/// the ledger answers it from.
fn row_of<'a>(rows: &'a [ToolCall], call_id: &str, req: &ToolRequest) -> Option<&'a ToolCall> {
    rows.iter().find(|r| r.id == call_id).or_else(|| {
        rows.iter()
            .find(|r| r.input == req.args && r.raw_tool_name == req.tool)
    })
}

/// What is wrong with the attempts (`numbers`, as the store lists them)
/// a lookup's hard failures left ([`crate::model::LedgerCall::hard`]),
/// given its `answer`: numbered `1..=n`; an endpoint that never answers
/// makes at least `1 + LOOKUP_RETRIES` of them (exactly that on a
/// `first_run`: no earlier process ran the call), every one counted in
/// the failed answer; a lost first attempt makes at most one (exactly
/// one on a first run: the world loses a key's first attempt once, and
/// a key has one row).
fn attempts_violation(hard: Lost, numbers: &[u32], answer: &ToolOutput, first_run: bool) -> Option<String> {
    let n = numbers.len() as u32;
    if !numbers.iter().copied().eq(1..=n) {
        return Some(format!(
            "its failed attempts are numbered {numbers:?}, not 1 to {n}"
        ));
    }
    let least = 1 + LOOKUP_RETRIES;
    match hard {
        Lost::Reply
            if !answer.output.ends_with(&format!("(failed {n} time(s))"))
                || n < least
                || (first_run && n != least) =>
        {
            Some(format!(
                "its endpoint never answers, and the ledger holds {n} failed attempts ({least} {} expected), the answer {:?}",
                if first_run { "exactly, on a first run," } else { "at least" },
                answer.output
            ))
        }
        Lost::Request if n > 1 || (first_run && n != 1) => Some(format!(
            "only its first attempt was lost, and the ledger holds {n} failed attempts (at most 1{} expected)",
            if first_run { ", exactly 1 on a first run," } else { "" }
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(n: u32) -> ToolOutput {
        ToolOutput {
            ok: false,
            output: format!("lookup k: its endpoint did not answer (failed {n} time(s))"),
        }
    }

    #[test]
    fn an_endpoint_that_never_answers_is_held_to_its_numbered_attempts() {
        assert_eq!(attempts_violation(Lost::Reply, &[1, 2], &failed(2), true), None);
        // Continued across a crash: more rows, the answer counts them all.
        assert_eq!(
            attempts_violation(Lost::Reply, &[1, 2, 3, 4], &failed(4), false),
            None
        );
        for (numbers, answer, first) in [
            (&[1, 2][..], failed(1), true),    // the answer miscounts
            (&[][..], failed(0), true),        // no attempt recorded
            (&[1][..], failed(1), false),      // fewer than 1 + the retries
            (&[1, 2, 3][..], failed(3), true), // a first run made more
            (&[1, 3][..], failed(2), false),   // a gap in the numbers
        ] {
            assert!(
                attempts_violation(Lost::Reply, numbers, &answer, first).is_some(),
                "{numbers:?} {answer:?} first run {first}"
            );
        }
    }

    #[test]
    fn a_lost_first_attempt_leaves_at_most_one() {
        let ok = ToolOutput {
            ok: true,
            output: "lookup:k".into(),
        };
        assert_eq!(attempts_violation(Lost::Request, &[], &ok, false), None);
        assert_eq!(attempts_violation(Lost::Request, &[1], &ok, true), None);
        assert!(attempts_violation(Lost::Request, &[1, 2], &ok, false).is_some());
        assert!(attempts_violation(Lost::Request, &[], &ok, true).is_some());
    }
}
