//! The worker's turns in flight: each turn's provider and tool calls are
//! handed to the driver ([`Call`]) to perform wherever it likes (a thread
//! in `serve`, a simulated task under madsim) while the worker goes on
//! answering requests, firing other triggers and advancing other turns;
//! each call's result comes back as an event and the worker persists it
//! ([`crate::runtime::Runtime::continue_turn`]) before the next call goes
//! out. A completion that takes seconds stalls nothing.
//!
//! Invariants: the system is touched by the worker only — a call holds the
//! call and the turn's telemetry scope, nothing else (the tool-call and
//! activity ledgers commit under their own connection lock, never across
//! the tool itself). A turn's steps stay in order: its next
//! call goes out only after the previous result is durable. An agent has at
//! most one turn in flight (the runtime pins it); a due trigger whose agent
//! is busy keeps its claim and waits here, in claim order, instead of
//! burning an attempt. At most `limit` turns are in flight or waiting.

use std::collections::{BTreeMap, VecDeque};

use crate::canary::Canary;
use crate::runtime::{CallResult, OutsideCall, RuntimeError, Started, TurnStep, TurnTask};
use crate::system::{Fired, System, SystemError};

use super::ops::{self, Claimed, FireResult, OpError, PreparedTurn, StartedTurn};
use super::{Lifecycle, RequestId, TurnScope};

/// A call for the driver to perform; its result comes back to
/// [`super::Worker::handle_result`] with the same `turn`.
#[derive(Debug)]
pub struct Call {
    pub turn: u64,
    pub call: OutsideCall,
    pub scope: TurnScope,
}

/// A request's answer, for the driver to deliver.
pub type Answer = (RequestId, Result<serde_json::Value, OpError>);

/// What ends a turn.
#[derive(Debug)]
pub enum End {
    /// An API turn: answer the request.
    Api {
        prepared: PreparedTurn,
        request: RequestId,
    },
    /// A trigger's turn: ack the claim (`acked`: already acked, only
    /// under the `TriggerAckedBeforeTurn` canary).
    Fire { claimed: Claimed, acked: bool },
}

#[derive(Debug)]
struct InFlight {
    task: Box<TurnTask>,
    scope: TurnScope,
    end: End,
}

/// The worker's turns in flight.
#[derive(Debug)]
pub struct Turns {
    live: BTreeMap<u64, InFlight>,
    next: u64,
    waiting: VecDeque<Claimed>,
    limit: usize,
    /// Calls to hand to the driver, in order.
    pub(super) calls: VecDeque<Call>,
    /// Answers to hand to the driver, in order.
    pub(super) answers: VecDeque<Answer>,
}

impl Turns {
    /// At most `limit` turns in flight or waiting.
    pub fn new(limit: usize) -> Turns {
        Turns {
            live: BTreeMap::new(),
            next: 1,
            waiting: VecDeque::new(),
            limit: limit.max(1),
            calls: VecDeque::new(),
            answers: VecDeque::new(),
        }
    }

    /// Turns in flight (their calls out).
    pub fn in_flight(&self) -> usize {
        self.live.len()
    }

    /// Claims waiting for their agent.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A stop: every claim waiting for its agent goes back uncounted
    /// (`TriggerStore::release`), as a turn the stop interrupted does. Best
    /// effort: a claim not given back is reclaimed at boot, counted.
    pub fn release_waiting(&mut self, system: &System) {
        for claimed in self.waiting.drain(..) {
            let now = system.now_ms();
            if let Err(e) = system.triggers().release(system.db().conn(), &claimed.claim, now) {
                tracing::warn!(id = %claimed.claim.id, error = %e, "a waiting claim was not given back; boot reclaims it");
            }
        }
    }

    /// Track `started` and send its first call out.
    pub fn launch(&mut self, started: StartedTurn, end: End) {
        let id = self.next;
        self.next += 1;
        let StartedTurn { task, call, scope } = started;
        self.calls.push_back(Call {
            turn: id,
            call,
            scope: scope.clone(),
        });
        self.live.insert(id, InFlight { task, scope, end });
    }

    /// Persist a call's result and send the turn's next call out, or end
    /// the turn. `Err`: the outcome is unknown (the worker stops).
    pub fn finished(
        &mut self,
        system: &mut System,
        lifecycle: &dyn Lifecycle,
        turn_id: u64,
        result: CallResult,
    ) -> Result<(), OpError> {
        let Some(mut turn) = self.live.remove(&turn_id) else {
            tracing::warn!(turn = turn_id, "a result for no turn in flight; dropped");
            return Ok(());
        };
        let ended = match system.runtime_mut().continue_turn(&mut turn.task, result) {
            Ok(TurnStep::Call(call)) => {
                self.calls.push_back(Call {
                    turn: turn_id,
                    call,
                    scope: turn.scope.clone(),
                });
                self.live.insert(turn_id, turn);
                return Ok(());
            }
            Ok(TurnStep::Done(outcome)) => Ok(outcome),
            Err(e) => Err(e),
        };
        match turn.end {
            End::Api { prepared, request } => {
                let answer = ops::end_api_turn(system, lifecycle, &turn.scope, &prepared, ended.map(Some));
                let fatal = match &answer {
                    Err(e) if e.is_fatal() => Some(OpError::UnknownOutcome(e.to_string())),
                    _ => None,
                };
                // The client may have gone away; the turn stands.
                self.answers.push_back((request, answer));
                fatal.map_or(Ok(()), Err)
            }
            End::Fire { claimed, acked } => {
                let fired = ended.map(|o| Fired::Ran {
                    tool_calls: o.tool_calls.len(),
                });
                let fired = fired.map_err(SystemError::Runtime);
                end_fire(system, lifecycle, &turn.scope, &claimed, fired, acked)
            }
        }
    }

    /// Start the turns of due triggers: first the claims waiting for their
    /// agent, then new claims, while fewer than `limit` turns are in flight
    /// or waiting.
    pub fn fire_due(
        &mut self,
        system: &mut System,
        lifecycle: &dyn Lifecycle,
        lease_ms: u64,
    ) -> Result<(), OpError> {
        for _ in 0..self.waiting.len() {
            let Some(claimed) = self.waiting.pop_front() else {
                break;
            };
            self.start_fire(system, lifecycle, claimed)?;
        }
        let mut results = Vec::new();
        while self.live.len() + self.waiting.len() < self.limit {
            let Some(claimed) = ops::claim_next(system, lease_ms, &mut results)? else {
                break;
            };
            self.start_fire(system, lifecycle, claimed)?;
        }
        for result in results {
            tracing::debug!(?result, "scheduler");
        }
        Ok(())
    }

    fn start_fire(
        &mut self,
        system: &mut System,
        lifecycle: &dyn Lifecycle,
        claimed: Claimed,
    ) -> Result<(), OpError> {
        let c = &claimed;
        let started = system.start_fire(&c.claim, &c.agent, &c.prompt);
        if let Err(SystemError::Runtime(RuntimeError::TurnInFlight(_) | RuntimeError::SlotsBusy { .. })) =
            started
        {
            // The agent is in a turn (or every slot is): the claim waits.
            self.waiting.push_back(claimed);
            return Ok(());
        }
        let scope = lifecycle.turn_started(system, &c.agent, &System::trigger_work(&c.claim));
        let fired = match started {
            Ok(Started::Running(task, TurnStep::Call(call))) => {
                let acked = system.config().canaries.has(Canary::TriggerAckedBeforeTurn);
                if acked {
                    // The bug: DONE before the turn's effects are durable.
                    system
                        .ack_fire(&claimed.claim, Fired::Ran { tool_calls: 0 })
                        .map_err(|e| OpError::UnknownOutcome(e.to_string()))?;
                }
                self.launch(StartedTurn { task, call, scope }, End::Fire { claimed, acked });
                return Ok(());
            }
            Ok(Started::Running(_, TurnStep::Done(o))) => Ok(Fired::Ran {
                tool_calls: o.tool_calls.len(),
            }),
            Ok(Started::AlreadyDone) => Ok(Fired::AlreadyDone),
            Err(e) => Err(e),
        };
        end_fire(system, lifecycle, &scope, &claimed, fired, false)
    }
}

/// A trigger's turn ended: ack it DONE (proving the lease; unless it was
/// `acked` already) or settle the failure ([`ops::settle_fire`]), and
/// report `turn_end`.
fn end_fire(
    system: &mut System,
    lifecycle: &dyn Lifecycle,
    scope: &TurnScope,
    claimed: &Claimed,
    fired: Result<Fired, SystemError>,
    acked: bool,
) -> Result<(), OpError> {
    let outcome = match acked {
        true => fired,
        false => fired.and_then(|fired| system.ack_fire(&claimed.claim, fired)),
    };
    lifecycle.turn_ended(
        scope,
        outcome
            .as_ref()
            .map(ops::describe_fired)
            .map_err(ToString::to_string),
    );
    match ops::settle_fire(system, &claimed.claim, outcome)? {
        Some(FireResult::Fired { id, fired }) => tracing::debug!(id, ?fired, "trigger fired"),
        Some(other) => tracing::debug!(?other, "trigger settled"),
        None => tracing::info!(id = %claimed.claim.id, "trigger's claim given back"),
    }
    Ok(())
}
