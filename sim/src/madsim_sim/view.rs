//! The final look: at the horizon the disk is recovered once more — one
//! more boot through the same composition as every node boot, without the
//! canaries — and what survived is read into the oracle's [`FinalView`]:
//! live agents and their messages, the prompts of their completed turns and
//! how often each work completed in their logs, trigger rows by the key
//! their producer gave them, the activity ledger, the schedules, the
//! world's deliveries and the on-disk invariants.
//!
//! Invariant: reads only; nothing here decides a verdict (the oracle does).

use std::collections::BTreeMap;
use std::sync::Arc;

use durable_agent::fs::Fs;
use durable_agent::log::{parse_log, Event as LogEvent, LogEntry};
use durable_agent::recovery;
use durable_agent::runtime::ConversationItem;
use durable_agent::sqlite::Db;
use durable_agent::store::activities::{ActivityStatus, ActivityStore};
use durable_agent::store::triggers::{Trigger, TriggerStore};
use durable_agent::system::System;
use durable_agent::worker::schedule::Schedules;

use super::node::NodeCtx;
use super::oracle::{works_to_check, AgentMessages, FinalView, TriggerRow};
use super::SimPlan;

/// Recover the disk once more (outside the node) and read what survived.
pub(super) fn final_view(ctx: &NodeCtx, end_ms: u64, events: &[(u64, super::Event)]) -> FinalView {
    let plan = &ctx.plan;
    let fs: Arc<dyn Fs> = Arc::new(ctx.fs.clone());
    let mut view = FinalView {
        end_ms,
        ..FinalView::default()
    };
    // The final look is one more boot: the same composition as every node
    // boot (no second, read-only composition that could disagree with it),
    // without the canaries (the look must not re-introduce a bug).
    let mut sc = ctx.system_config();
    sc.canaries = durable_agent::canary::Canaries::none();
    match System::boot(fs.clone(), sc, ctx.deps(u32::MAX, 0.0)) {
        Ok((system, _)) => {
            let runtime = system.runtime();
            let state = runtime.state();
            let name_of = |id| state.agents.get(id).map(|a| a.name.clone());
            let mut ids = BTreeMap::new();
            for (id, agent) in &state.agents {
                let prompts = state.conversations.get(id).into_iter().flatten();
                let mut msgs = AgentMessages {
                    parent: agent.parent.as_ref().and_then(name_of),
                    pending: state.pending[id].iter().map(|m| m.id.to_string()).collect(),
                    delivered: state.delivered[id].iter().map(|m| m.to_string()).collect(),
                    prompts: prompts
                        .filter_map(|item| match item {
                            ConversationItem::Prompt { text } => Some(text.clone()),
                            _ => None,
                        })
                        .collect(),
                    ..AgentMessages::default()
                };
                match runtime.session_dir(id).map(|dir| parse_log(&*fs, &dir, None)) {
                    Some(Ok(log)) => {
                        for (work, n) in completions(&log.entries) {
                            view.completions.insert((agent.name.clone(), work), n);
                        }
                        (msgs.enqueued, msgs.deliveries) = message_order(&log.entries);
                    }
                    Some(Err(e)) => view
                        .runtime_violations
                        .push(format!("reading {}'s log: {e}", agent.name)),
                    None => {}
                }
                view.agents.insert(agent.name.clone(), msgs);
                ids.insert(agent.name.clone(), id.clone());
                ids.insert(id.to_string(), id.clone());
            }
            view.runtime_violations = runtime.check_invariants();
            read_stores(&system.db(), plan, end_ms, &mut view, &ids, &state);
            let mut works = works_to_check(events);
            works.extend(
                view.triggers
                    .values()
                    .filter_map(|t| Some((t.agent.clone()?, t.work.clone()))),
            );
            for (agent, work) in works {
                let Some(id) = ids.get(&agent) else { continue };
                if runtime.work_done(id, &work).unwrap_or(false) {
                    view.completed.insert((agent, work));
                }
            }
        }
        Err(e) => view.runtime_violations.push(format!("final boot failed: {e}")),
    }
    match Schedules::load(fs.clone(), &plan.root) {
        Ok(s) => view.schedules = s.list().into_iter().map(|s| s.id).collect(),
        Err(e) => view.disk_violations.push(format!("schedules: {e}")),
    }
    view.disk_violations.extend(
        recovery::check_invariants(&*fs, &plan.root)
            .err()
            .unwrap_or_default(),
    );
    // The fuzzer's I3 (every events.jsonl is complete JSON lines), reused.
    view.disk_violations
        .extend(crate::oracle::log_invariants(&ctx.fs.disk_image()));
    let mut deliveries = BTreeMap::new();
    for d in ctx.world.deliveries() {
        *deliveries.entry(d.idem_key).or_insert(0) += 1;
    }
    view.deliveries = deliveries;
    view
}

fn read_stores(
    db: &Db,
    plan: &SimPlan,
    end_ms: u64,
    view: &mut FinalView,
    ids: &BTreeMap<String, durable_agent::runtime::AgentId>,
    state: &durable_agent::runtime::RuntimeState,
) {
    let triggers = TriggerStore::new(plan.trigger_policy, Default::default());
    match triggers.all(db.conn(), end_ms) {
        Ok(rows) => {
            for t in rows {
                // The agent its payload names, by name (or id).
                let agent = t.payload["agent"]
                    .as_str()
                    .and_then(|a| ids.get(a))
                    .and_then(|id| state.agents.get(id))
                    .map(|a| a.name.clone());
                let row = TriggerRow {
                    id: t.id.clone(),
                    status: t.status.as_str().to_string(),
                    fire_at_ms: t.fire_at_ms,
                    attempts: t.attempts,
                    agent,
                    work: System::trigger_work(&t),
                };
                if let (Some(schedule), Some(bucket)) =
                    (t.payload["schedule"].as_str(), t.payload["bucket"].as_u64())
                {
                    *view.buckets.entry((schedule.to_string(), bucket)).or_insert(0) += 1;
                }
                let key = producer_key(&t);
                *view.rows_per_key.entry(key.clone()).or_insert(0) += 1;
                view.triggers.insert(key, row);
            }
        }
        Err(e) => view.runtime_violations.push(format!("reading triggers: {e}")),
    }
    let ledger = ActivityStore::default();
    for status in [
        ActivityStatus::Intent,
        ActivityStatus::Done,
        ActivityStatus::Failed,
        ActivityStatus::NeedsConfirmation,
    ] {
        match ledger.with_status(db.conn(), status) {
            Ok(rows) => {
                for r in rows {
                    view.ledger.insert(r.idem_key, status.as_str().to_string());
                }
            }
            Err(e) => view.runtime_violations.push(format!("reading the ledger: {e}")),
        }
    }
}

/// The dedup key `t`'s producer gave it: its `dedup_key` column, or — if
/// the store dropped it (a broken emit) — the one its payload shows: a
/// schedule bucket's, a wake-up's message, or a client's emit prompt
/// (`trigger {key}`). So two rows of one key are seen as such.
fn producer_key(t: &Trigger) -> String {
    if let Some(key) = &t.dedup_key {
        return key.clone();
    }
    let p = &t.payload;
    if let (Some(schedule), Some(bucket)) = (p["schedule"].as_str(), p["bucket"].as_u64()) {
        return format!("scheduled:{schedule}:{bucket}");
    }
    if let Some(message) = p["reads"][0].as_str() {
        return format!("wake:{message}");
    }
    let client_key = p["prompt"]
        .as_str()
        .and_then(|prompt| prompt.strip_prefix("trigger "))
        .and_then(|rest| rest.split_whitespace().next());
    client_key.map_or_else(|| t.id.clone(), str::to_string)
}

/// One agent's log's messages in enqueue order, and its deliveries in log
/// order (each entry's delivered messages).
fn message_order(entries: &[LogEntry]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut enqueued = Vec::new();
    let mut deliveries = Vec::new();
    for entry in entries {
        let ids = match &entry.event {
            LogEvent::MessageEnqueued { message_id, .. } => {
                enqueued.push(message_id.to_string());
                continue;
            }
            LogEvent::TurnComplete { delivered, .. } => delivered,
            LogEvent::MessageDelivered { message_ids } => message_ids,
            _ => continue,
        };
        if !ids.is_empty() {
            deliveries.push(ids.iter().map(ToString::to_string).collect());
        }
    }
    (enqueued, deliveries)
}

/// How many times each work completed in one agent's log: a replay of the
/// turn events that follows which turn is open (a newer turn parks the
/// open one; a resume naming a parked one brings it back) and counts each
/// `turn.complete` for the open turn's work.
fn completions(entries: &[LogEntry]) -> BTreeMap<String, u32> {
    let mut done = BTreeMap::new();
    let mut open: Option<Option<String>> = None;
    let mut parked: Vec<Option<String>> = Vec::new();
    for entry in entries {
        match &entry.event {
            LogEvent::TurnStart { work, .. } => {
                parked.extend(open.take());
                open = Some(work.clone());
            }
            LogEvent::TurnResume {
                prompt: Some(_),
                work,
                ..
            } => {
                parked.extend(open.take());
                if let Some(i) = parked.iter().position(|w| w == work) {
                    parked.remove(i);
                }
                open = Some(work.clone());
            }
            LogEvent::TurnComplete { .. } => {
                if let Some(Some(work)) = open.take() {
                    *done.entry(work).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    done
}
