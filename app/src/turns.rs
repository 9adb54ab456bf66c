//! The turns in flight on the `serve` worker: each turn's provider and tool
//! calls run on a thread of their own while the worker goes on answering
//! requests, firing other triggers and advancing other turns; each call's
//! result comes back to the worker as a message and the worker persists it
//! ([`durable_agent::runtime::Runtime::continue_turn`]) before the next
//! call goes out. A completion that takes seconds stalls nothing.
//!
//! Invariants: the system is touched on the worker thread only — a call's
//! thread holds the call and the turn's telemetry scope, nothing else (the
//! tool-call and activity ledgers commit under their own connection lock,
//! never across the tool itself). A turn's steps stay in order: its next
//! call goes out only after the previous result is durable. An agent has at
//! most one turn in flight (the runtime pins it); a due trigger whose agent
//! is busy keeps its claim and waits here, in claim order, instead of
//! burning an attempt. At most `limit` turns are in flight or waiting.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;

use durable_agent::runtime::{
    CallResult, Outside, OutsideCall, ProviderError, RuntimeError, Started, ToolError, TurnStep, TurnTask,
};
use durable_agent::system::{Fired, System, SystemError};
use serde_json::Value;

use crate::interrupt::Stop;
use crate::lifecycle::{Lifecycle, TurnScope};
use crate::ops::{self, Claimed, FireResult, OpError, PreparedTurn, StartedTurn};

/// Where a turn's answer goes.
pub type Reply = mpsc::SyncSender<Result<Value, OpError>>;

/// A call's result, on its way back to the worker.
#[derive(Debug)]
pub struct Finished {
    pub turn: u64,
    pub result: CallResult,
}

/// What ends a turn.
#[derive(Debug)]
pub enum End {
    /// An API turn: answer the request.
    Api { prepared: PreparedTurn, reply: Reply },
    /// A trigger's turn: ack the claim.
    Fire { claimed: Claimed },
}

#[derive(Debug)]
struct InFlight {
    task: Box<TurnTask>,
    scope: TurnScope,
    end: End,
}

/// The worker's turns in flight.
pub struct Turns {
    live: BTreeMap<u64, InFlight>,
    next: u64,
    waiting: VecDeque<Claimed>,
    outside: Outside,
    limit: usize,
    back: Arc<dyn Fn(Finished) + Send + Sync>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("live", &self.live.len())
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

impl Turns {
    /// `back` hands a call's result to the worker (from the call's thread).
    pub fn new(system: &System, limit: usize, back: Arc<dyn Fn(Finished) + Send + Sync>) -> Turns {
        Turns {
            live: BTreeMap::new(),
            next: 1,
            waiting: VecDeque::new(),
            outside: system.runtime().outside(),
            limit: limit.max(1),
            back,
        }
    }

    /// Turns in flight (their calls out).
    pub fn in_flight(&self) -> usize {
        self.live.len()
    }

    /// Track `started` and send its first call out.
    pub fn launch(&mut self, started: StartedTurn, end: End) {
        let id = self.next;
        self.next += 1;
        let StartedTurn { task, call, scope } = started;
        self.spawn(id, call, scope.clone());
        self.live.insert(id, InFlight { task, scope, end });
    }

    fn spawn(&self, turn: u64, call: OutsideCall, scope: TurnScope) {
        let outside = self.outside.clone();
        let back = self.back.clone();
        let name = match &call {
            OutsideCall::Provider(_) => "provider-call",
            OutsideCall::Tool(_) => "tool-call",
        };
        let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
            let result = Lifecycle::in_scope(&scope, || outside.perform(&call));
            back(Finished { turn, result });
        });
        if let Err(e) = spawned {
            // Nothing ran: the call fails as it would have without a thread.
            let failure = format!("cannot start a thread for the call: {e}");
            let result = match name {
                "provider-call" => CallResult::Provider(Err(ProviderError(failure))),
                _ => CallResult::Tool(Err(ToolError::Failed(failure))),
            };
            (self.back)(Finished { turn, result });
        }
    }

    /// Persist a call's result and send the turn's next call out, or end
    /// the turn. `Err`: the outcome is unknown (the worker stops).
    pub fn finished(
        &mut self,
        system: &mut System,
        lifecycle: &Lifecycle,
        done: Finished,
    ) -> Result<(), OpError> {
        let Some(mut turn) = self.live.remove(&done.turn) else {
            tracing::warn!(turn = done.turn, "a result for no turn in flight; dropped");
            return Ok(());
        };
        let ended = match system.runtime_mut().continue_turn(&mut turn.task, done.result) {
            Ok(TurnStep::Call(call)) => {
                self.spawn(done.turn, call, turn.scope.clone());
                self.live.insert(done.turn, turn);
                return Ok(());
            }
            Ok(TurnStep::Done(outcome)) => Ok(outcome),
            Err(e) => Err(e),
        };
        match turn.end {
            End::Api { prepared, reply } => {
                let answer = ops::end_api_turn(system, lifecycle, &turn.scope, &prepared, ended.map(Some));
                let fatal = match &answer {
                    Err(e) if e.is_fatal() => Some(OpError::UnknownOutcome(e.to_string())),
                    _ => None,
                };
                // The client may have gone away; the turn stands.
                let _ = reply.send(answer);
                fatal.map_or(Ok(()), Err)
            }
            End::Fire { claimed } => {
                let fired = ended.map(|o| Fired::Ran {
                    tool_calls: o.tool_calls.len(),
                });
                end_fire(
                    system,
                    lifecycle,
                    &turn.scope,
                    &claimed,
                    fired.map_err(SystemError::Runtime),
                )
            }
        }
    }

    /// Start the turns of due triggers: first the claims waiting for their
    /// agent, then new claims, while fewer than `limit` turns are in flight
    /// or waiting.
    pub fn fire_due(
        &mut self,
        system: &mut System,
        lifecycle: &Lifecycle,
        lease_ms: u64,
        stop: &Stop,
    ) -> Result<(), OpError> {
        for _ in 0..self.waiting.len() {
            let Some(claimed) = self.waiting.pop_front() else {
                break;
            };
            self.start_fire(system, lifecycle, claimed)?;
        }
        let mut results = Vec::new();
        while !stop.requested() && self.live.len() + self.waiting.len() < self.limit {
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
        lifecycle: &Lifecycle,
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
                self.launch(StartedTurn { task, call, scope }, End::Fire { claimed });
                return Ok(());
            }
            Ok(Started::Running(_, TurnStep::Done(o))) => Ok(Fired::Ran {
                tool_calls: o.tool_calls.len(),
            }),
            Ok(Started::AlreadyDone) => Ok(Fired::AlreadyDone),
            Err(e) => Err(e),
        };
        end_fire(system, lifecycle, &scope, &claimed, fired)
    }
}

/// A trigger's turn ended: ack it DONE (proving the lease) or settle the
/// failure ([`ops::settle_fire`]), and report `turn_end`.
fn end_fire(
    system: &mut System,
    lifecycle: &Lifecycle,
    scope: &TurnScope,
    claimed: &Claimed,
    fired: Result<Fired, SystemError>,
) -> Result<(), OpError> {
    let outcome = fired.and_then(|fired| system.ack_fire(&claimed.claim, fired));
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
        None => tracing::info!(id = %claimed.claim.id, "trigger turn interrupted; boot reclaims it"),
    }
    Ok(())
}
