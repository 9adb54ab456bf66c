//! One task per worker agent: think, then run a turn that reads its pending
//! messages (its provider and tool calls in flight with the core released,
//! see [`super::turns`]; retried with exponential backoff when the provider
//! fails; the messages count as delivered only with the turn), send a peer
//! a message, or schedule a one-time reminder.
//!
//! Invariant: the agent never holds the core across a sleep, and reports an
//! action to the observer only after the runtime or store acknowledged it
//! (so the observer's "acked" set is exactly what must survive a crash).

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::runtime::{RuntimeError, Started, TurnKind};
use crate::store::triggers::{TriggerSource, TriggerSpec};

use super::core::{emit, Shared, Stopped};
use super::turns::drive;
use super::{DaemonConfig, DaemonEvent};

/// A uniform draw from `[lo, hi]` (milliseconds).
pub(super) fn draw_ms(rng: &mut ChaCha8Rng, (lo, hi): (u64, u64)) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

pub(super) async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Worker `i`'s loop; returns when the daemon stops.
pub(super) async fn agent_loop(sh: Arc<Shared>, i: usize) {
    let mut rng = sh.rng(i as u64 + 1);
    loop {
        sleep_ms(draw_ms(&mut rng, sh.config.think_ms)).await;
        let roll: f64 = rng.random();
        let reminder = sh.config.reminder_probability;
        let done = if roll < reminder {
            schedule_reminder(&sh, i, &mut rng).await
        } else if roll < reminder + 0.35 && sh.config.agents > 1 {
            send(&sh, i, &mut rng).await
        } else {
            turn(&sh, i, &mut rng).await
        };
        if done.is_err() {
            return;
        }
    }
}

/// Errors a retry can fix: the provider failed, nothing was acknowledged
/// (or the agent is in a trigger's turn, or every slot is pinned by a turn
/// in flight: nothing was attempted).
pub(super) fn retryable(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::Provider { .. }
            | RuntimeError::TooManyToolRounds { .. }
            | RuntimeError::TurnInFlight(_)
            | RuntimeError::SlotsBusy { .. }
    )
}

async fn turn(sh: &Shared, i: usize, rng: &mut ChaCha8Rng) -> Result<(), Stopped> {
    let name = DaemonConfig::agent_name(i);
    // The retry loop of `store::retry::call_with_retry`, made async: its
    // `Sleeper` blocks, and a blocked task would stall every agent.
    let policy = sh.config.turn_retry;
    let mut attempt = 0u32;
    loop {
        let mut core = sh.lock().await?;
        let id = core.agents[i].clone();
        // The turn reads the pending messages; they count as delivered
        // only with the turn (in its turn.complete): a failed or crashed
        // attempt leaves them pending for the next one.
        let pending = core.system.runtime().pending(&id).to_vec();
        let ids: Vec<_> = pending.iter().map(|m| m.id.clone()).collect();
        let inbox: Vec<&str> = pending.iter().map(|m| m.payload.as_str()).collect();
        let prompt = format!("{name} at {} ms, attempt {attempt}, inbox {inbox:?}", sh.now());
        if !ids.is_empty() {
            sh.record(DaemonEvent::Reading {
                agent: name.clone(),
                ids: ids.iter().map(ToString::to_string).collect(),
            });
        }
        let started = core
            .system
            .runtime_mut()
            .start_turn(&id, &prompt, TurnKind::Consuming(&ids));
        let outside = core.system.runtime().outside();
        drop(core);
        // The provider and tool calls run with the core released.
        let ended = match started {
            Ok(Started::Running(task, step)) => drive(sh, &outside, task, step, rng).await?,
            Ok(Started::AlreadyDone) => Err(RuntimeError::TurnNotInFlight(id.clone())),
            Err(e) => Err(e),
        };
        match ended {
            Ok(outcome) => {
                if !ids.is_empty() {
                    sh.record(DaemonEvent::Delivered {
                        agent: name.clone(),
                        ids: ids.iter().map(ToString::to_string).collect(),
                    });
                }
                sh.record(DaemonEvent::TurnCompleted {
                    agent: name,
                    tool_calls: outcome.tool_calls.len(),
                });
                return Ok(());
            }
            Err(e) if retryable(&e) => {
                if attempt >= policy.max_retries {
                    sh.record(DaemonEvent::TurnGaveUp {
                        agent: name,
                        attempts: attempt + 1,
                    });
                    return Ok(());
                }
                let backoff_ms = policy.backoff_ms(attempt);
                sh.record(DaemonEvent::TurnRetry {
                    agent: name.clone(),
                    attempt,
                    backoff_ms,
                });
                attempt += 1;
                sleep_ms(backoff_ms).await;
            }
            Err(RuntimeError::NeedsConfirmation { .. }) => {
                // Blocked on a human (the simulation has none): the turn
                // stays open, its messages pending; the agent goes on.
                sh.record(DaemonEvent::TurnGaveUp {
                    agent: name,
                    attempts: attempt + 1,
                });
                return Ok(());
            }
            Err(e) => {
                let mut core = sh.lock().await?;
                return Err(sh.fail(&mut core, format!("turn of {name}: {e}")));
            }
        }
    }
}

async fn send(sh: &Shared, i: usize, rng: &mut ChaCha8Rng) -> Result<(), Stopped> {
    let n = sh.config.agents;
    let j = (i + rng.random_range(1..n)) % n;
    let (from, to) = (DaemonConfig::agent_name(i), DaemonConfig::agent_name(j));
    let payload = format!("note {:08x} from {from}", rng.random::<u32>());
    let mut core = sh.lock().await?;
    let (a, b) = (core.agents[i].clone(), core.agents[j].clone());
    match core.system.runtime_mut().send_message(&a, &b, &payload) {
        Ok(id) => {
            sh.record(DaemonEvent::MessageAcked {
                id: id.to_string(),
                from,
                to,
            });
            Ok(())
        }
        Err(e) => Err(sh.fail(&mut core, format!("send {from} -> {to}: {e}"))),
    }
}

async fn schedule_reminder(sh: &Shared, i: usize, rng: &mut ChaCha8Rng) -> Result<(), Stopped> {
    let delay_ms = rng.random_range(1_000..=120_000u64);
    let mut core = sh.lock().await?;
    let now = sh.now();
    let name = DaemonConfig::agent_name(i);
    let key = DaemonConfig::once_key(&format!("{name}-{now}"));
    let spec = TriggerSpec {
        source: TriggerSource::Scheduled,
        payload: DaemonConfig::trigger_payload(&key, i),
        dedup_key: Some(key),
        session_id: None,
        fire_at_ms: now + delay_ms,
        priority: 0,
        description: format!("reminder for {name}"),
    };
    if let Err(e) = emit(&mut core, &spec, now, &|ev| sh.record(ev)) {
        return Err(sh.fail(&mut core, format!("emit reminder of {name}: {e}")));
    }
    drop(core);
    sh.wake.notify_one();
    Ok(())
}
