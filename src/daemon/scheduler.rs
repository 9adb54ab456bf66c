//! The trigger scheduler: sleep until the next trigger is due (or a
//! producer wakes it, or `poll_ms` passed), reclaim expired leases, emit the
//! current bucket of each recurring schedule, claim every due trigger with a
//! lease and hand each to a handler task.
//!
//! A handler waits the provider's latency, then fires: the side effect goes
//! through the activity ledger under `fire:{dedup_key}` (so a re-claim after
//! a crash finds the ledger row and sends nothing), the agent runs a turn
//! with the prompt (and the overdue note, if late), and the trigger is
//! acked DONE — `System::fire`'s steps, with the core released across the
//! effect's send and the turn's provider and tool calls. A failed handler acks FAILED-retryable: the store puts it
//! back with exponential backoff in `not_before`, or dead-letters it.
//!
//! Invariant: a trigger is acked DONE only after its firing is committed in
//! the ledger, and the firing is sent at most once per key.

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::runtime::{RuntimeError, Started};
use crate::store::activities::{ActivityOutcome, IrreversibleCall};
use crate::store::triggers::{Trigger, TriggerSource, TriggerSpec, TriggerStatus};
use crate::store::StoreError;
use crate::system::{Fired, SystemError};

use super::agents::{draw_ms, retryable, sleep_ms};
use super::core::{emit, Core, Shared, Stopped};
use super::turns::drive;
use super::{DaemonConfig, DaemonError, DaemonEvent};

/// The scheduler's loop; returns when the daemon stops.
pub(super) async fn scheduler_loop(sh: Arc<Shared>) {
    let mut rng = sh.rng(0);
    let mut emitted = BTreeSet::new();
    loop {
        let next_ms = {
            let Ok(mut core) = sh.lock().await else { return };
            match step(&sh, &mut core, &mut rng, &mut emitted) {
                Ok(next) => next,
                Err(e) => {
                    sh.fail(&mut core, format!("scheduler: {e}"));
                    return;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(sh.clock.instant_at(next_ms)) => {}
            _ = sh.wake.notified() => {}
        }
    }
}

/// One pass; returns the logical time to wake up at.
fn step(
    sh: &Arc<Shared>,
    core: &mut Core,
    rng: &mut ChaCha8Rng,
    emitted: &mut BTreeSet<String>,
) -> Result<u64, DaemonError> {
    let now = sh.now();
    let system = &core.system;
    let reclaimed = system.triggers().reclaim_expired(system.db().conn(), now)?;
    if !reclaimed.is_empty() {
        sh.record(DaemonEvent::LeasesReclaimed { ids: reclaimed });
    }
    let mut next = now.saturating_add(sh.config.poll_ms);
    for rec in &sh.config.recurring {
        let period = rec.period_ms.max(1);
        let bucket = now / period;
        next = next.min((bucket + 1) * period);
        let key = DaemonConfig::recurring_key(&rec.id, bucket);
        if emitted.insert(key.clone()) {
            let spec = TriggerSpec {
                source: TriggerSource::Scheduled,
                payload: DaemonConfig::trigger_payload(&key, rec.agent),
                dedup_key: Some(key),
                session_id: None,
                fire_at_ms: bucket * period,
                priority: 1,
                description: format!("recurring task {}", rec.id),
            };
            emit(core, &spec, now, &|ev| sh.record(ev))?;
        }
    }
    loop {
        let system = &core.system;
        let claimed = system
            .triggers()
            .claim(system.db().conn(), now, sh.config.lease_ms)?;
        let Some(trigger) = claimed else { break };
        sh.record(DaemonEvent::TriggerClaimed {
            key: key_of(&trigger),
            attempt: trigger.attempts,
            overdue_ms: trigger.overdue_by_ms,
        });
        let latency = draw_ms(rng, sh.config.latency_ms);
        let fail = rng.random_bool(sh.config.trigger_failure.clamp(0.0, 1.0));
        let handler_rng = ChaCha8Rng::seed_from_u64(rng.random());
        tokio::spawn(handle(sh.clone(), trigger, latency, fail, handler_rng));
    }
    let system = &core.system;
    for t in system.triggers().pending(system.db().conn(), now)? {
        let due = t.fire_at_ms.max(t.not_before_ms.unwrap_or(0));
        next = next.min(due);
    }
    Ok(next.max(now + 1))
}

/// The task a trigger stands for: its payload's `task`, else its dedup
/// key, else its id.
fn key_of(trigger: &Trigger) -> String {
    trigger
        .payload
        .get("task")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .or_else(|| trigger.dedup_key.clone())
        .unwrap_or_else(|| trigger.id.clone())
}

/// How many provider latencies a handler waits for its agent's own turn
/// to end before it retries the trigger with backoff.
const BUSY_WAITS: u32 = 10;

/// Run one claimed trigger; returns when done (or the daemon stopped).
async fn handle(sh: Arc<Shared>, trigger: Trigger, latency_ms: u64, fail: bool, mut rng: ChaCha8Rng) {
    sleep_ms(latency_ms).await;
    let key = key_of(&trigger);
    match fire(&sh, &trigger, fail, &mut rng).await {
        Ok(Ok(())) | Err(Stopped) => {}
        Ok(Err(e)) => {
            if let Ok(mut core) = sh.lock().await {
                sh.fail(&mut core, format!("trigger {key}: {e}"));
            }
        }
    }
}

/// The firing: its effect through the activity ledger, then the agent's
/// turn, then the ack — each persistence step under the core, the effect
/// and the turn's calls with it released.
async fn fire(
    sh: &Shared,
    trigger: &Trigger,
    fail: bool,
    rng: &mut ChaCha8Rng,
) -> Result<Result<(), DaemonError>, Stopped> {
    let key = key_of(trigger);
    let gate = {
        let mut core = sh.lock().await?;
        match still_claimed(sh, &core, trigger) {
            Err(e) => return Ok(Err(e)),
            Ok(false) => {
                // The lease ran out before we got here; it was reclaimed (and
                // maybe claimed again): the newer claim owns the trigger now.
                sh.record(DaemonEvent::LeaseLost {
                    key,
                    attempt: trigger.attempts,
                });
                return Ok(Ok(()));
            }
            Ok(true) => {}
        }
        if fail {
            return Ok(retry_later(sh, &mut core, trigger, "simulated handler failure"));
        }
        core.system.gate().clone()
    };
    let call = IrreversibleCall::with_key(
        &DaemonConfig::fire_key(&key),
        &trigger.id,
        "fire",
        json!({ "key": key, "fire_at_ms": trigger.fire_at_ms }),
    );
    // The ledger commits under its own connection lock; the send itself
    // holds nothing.
    let outcome = match gate.execute(&call, sh.now()) {
        Ok(outcome) => outcome,
        Err(e) => return Ok(Err(e.into())),
    };
    let mut core = sh.lock().await?;
    let (from_ledger, needs_confirmation) = match outcome {
        ActivityOutcome::Done { from_ledger, .. } => (from_ledger, false),
        ActivityOutcome::NeedsConfirmation { .. } => (false, true),
        ActivityOutcome::Failed { error, .. } => return Ok(retry_later(sh, &mut core, trigger, &error)),
    };
    let agent = trigger
        .payload
        .get("agent")
        .and_then(serde_json::Value::as_u64)
        .and_then(|a| usize::try_from(a).ok())
        .unwrap_or(0);
    // An unknown worker index falls back to worker 0 (the task still runs).
    let Some(id) = core.agents.get(agent).or(core.agents.first()).cloned() else {
        return Ok(retry_later(
            sh,
            &mut core,
            trigger,
            "no worker agent to run the trigger",
        ));
    };
    let note = trigger.overdue_note();
    let prompt = format!(
        "trigger {key}: {}{}",
        trigger.description,
        note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
    );
    // The turn and the ack: exactly-once for the turn's effects across any
    // crash and re-claim (see `System::fire`, whose steps these are).
    // The agent may be in a turn of its own (pinned): wait for it a few
    // provider latencies, then retry with backoff like any busy handler.
    let mut waits = 0;
    let started = loop {
        let started = core.system.start_fire(trigger, &id, &prompt);
        let busy = matches!(
            started,
            Err(SystemError::Runtime(
                RuntimeError::TurnInFlight(_) | RuntimeError::SlotsBusy { .. }
            ))
        );
        if !busy || waits >= BUSY_WAITS {
            break started;
        }
        waits += 1;
        drop(core);
        sleep_ms(draw_ms(rng, sh.config.latency_ms)).await;
        core = sh.lock().await?;
    };
    let outside = core.system.runtime().outside();
    drop(core);
    let ended = match started {
        Ok(Started::Running(task, step)) => match drive(sh, &outside, task, step, rng).await? {
            Ok(outcome) => Ok(Fired::Ran {
                tool_calls: outcome.tool_calls.len(),
            }),
            Err(e) => Err(SystemError::Runtime(e)),
        },
        Ok(Started::AlreadyDone) => Ok(Fired::AlreadyDone),
        Err(e) => Err(e),
    };
    let mut core = sh.lock().await?;
    let acked = match ended {
        Ok(fired) => core.system.ack_fire(trigger, fired),
        Err(e) => Err(e),
    };
    match acked {
        Ok(_) => {}
        Err(SystemError::Runtime(e)) if retryable(&e) => {
            return Ok(retry_later(sh, &mut core, trigger, &e.to_string()))
        }
        Err(SystemError::Runtime(e @ RuntimeError::NeedsConfirmation { .. })) => {
            // Blocked on a human (the simulation has none): FAILED, with
            // the key in its last error; nothing re-sent, nothing skipped.
            return Ok(ack_failed(sh, &mut core, trigger, &e.to_string(), false));
        }
        Err(SystemError::Store(StoreError::LeaseLost { .. })) => {
            // The lease ran out mid-firing and a newer claim owns the
            // trigger: its handler finds the work done and only acks.
            sh.record(DaemonEvent::LeaseLost {
                key,
                attempt: trigger.attempts,
            });
            return Ok(Ok(()));
        }
        Err(e) => return Ok(Err(e.into())),
    }
    sh.record(DaemonEvent::TriggerFired {
        key,
        overdue_note: note.is_some(),
        from_ledger,
        needs_confirmation,
    });
    Ok(Ok(()))
}

/// Whether `trigger` is still CLAIMED by this claim with a live lease: a
/// handler whose lease expired must not start the work (the acks would be
/// refused anyway, as they prove the claim; this keeps the turn from
/// running for a claim that lost its lease).
fn still_claimed(sh: &Shared, core: &Core, trigger: &Trigger) -> Result<bool, DaemonError> {
    let now = sh.now();
    let system = &core.system;
    let row = system.triggers().get(system.db().conn(), &trigger.id, now)?;
    Ok(row.is_some_and(|r| {
        r.status == TriggerStatus::Claimed
            && r.attempts == trigger.attempts
            && r.lease_until_ms.is_some_and(|until| until > now)
    }))
}

fn retry_later(sh: &Shared, core: &mut Core, trigger: &Trigger, error: &str) -> Result<(), DaemonError> {
    ack_failed(sh, core, trigger, error, true)
}

/// Ack `trigger` failed: retried with backoff (`retryable`), else FAILED.
fn ack_failed(
    sh: &Shared,
    core: &mut Core,
    trigger: &Trigger,
    error: &str,
    retryable: bool,
) -> Result<(), DaemonError> {
    let system = &core.system;
    let acked = system
        .triggers()
        .ack_failed(system.db().conn(), trigger, sh.now(), error, retryable);
    let status = match acked {
        Ok(status) => status,
        Err(StoreError::LeaseLost { .. }) => {
            // The lease ran out while the handler worked: the newer claim
            // owns the trigger and retries it itself.
            sh.record(DaemonEvent::LeaseLost {
                key: key_of(trigger),
                attempt: trigger.attempts,
            });
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    sh.record(DaemonEvent::TriggerFailed {
        key: key_of(trigger),
        attempt: trigger.attempts,
        status: status.as_str().to_string(),
    });
    sh.wake.notify_one();
    Ok(())
}
