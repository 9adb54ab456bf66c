//! Aimed crashes: a crash that waits for a one-time trigger's turn (a
//! client's emit, `trigger:{key}`) to be in flight and kills the node in a
//! chosen [`TurnPhase`] of it. A crash at a random instant lands inside one
//! turn's few seconds only by luck; the exactly-once chain of a trigger
//! (claim, turn, effects, ack) is what crashes must cut, so the supervisor
//! aims some of them ([`SimPlan::aimed_probability`]).
//!
//! The supervisor arms an [`Aim`]; the node reports its turns' progress
//! ([`Sights::turn_started`], [`Sights::call_out`], [`Sights::result_in`])
//! and, at the aimed point, either arms the SimFs to die a few I/O points
//! later (inside the writes of that step) or asks the supervisor to kill it
//! now (a call out has no I/O point to die at).
//!
//! Invariant: at most one hit per arming; every choice (phase, which call,
//! how many points ahead) is drawn by the supervisor from the seed, and the
//! node's reports come in the simulation's deterministic order.
//!
//! [`SimPlan::aimed_probability`]: super::SimPlan::aimed_probability

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use durable_agent::fs::{Fault, SimFs};
use durable_agent::runtime::CallResult;

use super::clients::is_one_time_work;
use super::{AimedAt, TurnPhase};

/// Where to kill: the `nth` call (or result; the completing result
/// whatever its number) of the first one-time trigger's turn to get
/// there, in `phase`; for the phases that die at an I/O point,
/// `points_ahead` points after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Aim {
    pub phase: TurnPhase,
    pub nth: u32,
    pub points_ahead: u64,
}

#[derive(Debug, Default)]
struct State {
    aim: Option<Aim>,
    /// Calls handed out and results back, per work, since the arming.
    calls_out: BTreeMap<String, u32>,
    results_in: BTreeMap<String, u32>,
    hit: Option<AimedAt>,
    kill_now: bool,
}

/// The aim, shared by the supervisor and the node; survives restarts.
#[derive(Debug, Clone, Default)]
pub(super) struct Sights {
    state: Arc<Mutex<State>>,
}

impl Sights {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Aim at the next one-time trigger's turn to reach `aim`.
    pub fn arm(&self, aim: Aim) {
        *self.lock() = State {
            aim: Some(aim),
            ..State::default()
        };
    }

    /// Stop aiming; the turn hit, if one was.
    pub fn disarm(&self) -> Option<AimedAt> {
        let mut s = self.lock();
        s.aim = None;
        s.kill_now = false;
        s.hit.take()
    }

    /// The node must be killed now (the aimed call is out).
    pub fn kill_now(&self) -> bool {
        self.lock().kill_now
    }

    /// The aim's phase, if it is `phase` and `work` is a one-time trigger's.
    fn aimed(s: &State, work: &str, phase: TurnPhase) -> Option<Aim> {
        s.aim.filter(|a| a.phase == phase && is_one_time_work(work))
    }

    fn hit(s: &mut State, work: &str, agent: &str, phase: TurnPhase) {
        s.aim = None;
        s.hit = Some(AimedAt {
            work: work.to_string(),
            agent: agent.to_string(),
            phase,
        });
    }

    fn die_after(fs: &SimFs, points: u64) {
        if !fs.crashed() {
            fs.set_fault(Some(Fault::CrashAt(fs.points() + points.max(1))));
        }
    }

    /// A turn of `agent` performing `work` started (`turn.start` written).
    pub fn turn_started(&self, work: &str, agent: &str, fs: &SimFs) {
        let mut s = self.lock();
        if let Some(aim) = Self::aimed(&s, work, TurnPhase::Started) {
            Self::die_after(fs, aim.points_ahead);
            Self::hit(&mut s, work, agent, TurnPhase::Started);
        }
    }

    /// A call of the turn performing `work` was handed out.
    pub fn call_out(&self, work: &str, agent: &str) {
        let mut s = self.lock();
        let n = s.calls_out.entry(work.to_string()).or_insert(0);
        *n += 1;
        let n = *n;
        if let Some(aim) = Self::aimed(&s, work, TurnPhase::CallOut) {
            if n >= aim.nth {
                s.kill_now = true;
                Self::hit(&mut s, work, agent, TurnPhase::CallOut);
            }
        }
    }

    /// `result` of a call of the turn performing `work` came back; the
    /// worker persists it next.
    pub fn result_in(&self, work: &str, agent: &str, result: &CallResult, fs: &SimFs) {
        let mut s = self.lock();
        let n = s.results_in.entry(work.to_string()).or_insert(0);
        *n += 1;
        let n = *n;
        let phase = match completes_turn(result) {
            true => TurnPhase::Completing,
            false => TurnPhase::Persisting,
        };
        if let Some(aim) = Self::aimed(&s, work, phase) {
            if n >= aim.nth || phase == TurnPhase::Completing {
                Self::die_after(fs, aim.points_ahead);
                Self::hit(&mut s, work, agent, phase);
            }
        }
    }
}

/// Whether `result` ends its turn with `turn.complete`: a reply asking for
/// no tool.
fn completes_turn(result: &CallResult) -> bool {
    match result {
        CallResult::Provider(Ok(reply)) | CallResult::Reviewed(reply, _) => reply.tool_calls.is_empty(),
        _ => false,
    }
}
