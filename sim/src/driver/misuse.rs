//! A host's misuse of the turn API, probed where the driver holds a turn
//! task ([`drive_keeping`]): the promise (`Runtime::continue_turn`) is
//! that only the runtime that started a turn, while the turn is in
//! flight, advances it. A task whose turn completed is stale: a step
//! handed to it is refused with `TurnNotInFlight`, changes nothing on
//! disk (no I/O point) and does not poison the runtime.
//!
//! M1: after every work turn the driver drives to completion, its task
//! is handed a provider reply once more, and the answer must be that
//! refusal, with no I/O.
//!
//! M2: while the driver holds the task of a turn not yet done, the
//! runtime says the agent has a turn in flight (`Runtime::turn_in_flight`,
//! what the worker reads to refuse a second turn on the agent); once the
//! turn is done, it says none. Not judged once the disk crashed.

use durable_agent::fs::SimFs;
use durable_agent::runtime::{
    CallResult, ProviderError, Runtime, RuntimeError, TurnOutcome, TurnStep, TurnTask,
};

/// [`Runtime::drive`], step by step, keeping the task, with M2 at every
/// step; then M1 on it. The outcome, and the probes' violations.
pub(super) fn drive_keeping(
    rt: &mut Runtime,
    fs: &SimFs,
    mut task: Box<TurnTask>,
    mut step: TurnStep,
) -> Result<(TurnOutcome, Vec<String>), RuntimeError> {
    let outside = rt.outside();
    let mut violations = Vec::new();
    let mut in_flight = |rt: &Runtime, task: &TurnTask, expected: bool| {
        let said = rt.turn_in_flight(task.agent());
        if !fs.crashed() && !matches!(said, Ok(b) if b == expected) {
            violations.push(format!(
                "M2: agent {} {} its turn, but the runtime says a turn is in flight: {said:?}",
                task.agent(),
                if expected {
                    "is in the middle of"
                } else {
                    "has completed"
                }
            ));
        }
    };
    let outcome = loop {
        match step {
            TurnStep::Done(outcome) => break outcome,
            TurnStep::Call(call) => {
                in_flight(rt, &task, true);
                let result = outside.perform(&call);
                step = rt.continue_turn(&mut task, result)?;
            }
        }
    };
    in_flight(rt, &task, false);
    // A crash point the turn passed leaves a doomed process: nothing to
    // probe (its answers reach no one).
    if fs.crashed() {
        return Ok((outcome, violations));
    }
    let points = fs.points();
    let stale = rt.continue_turn(
        &mut task,
        CallResult::Provider(Err(ProviderError("a reply for a turn that completed".into()))),
    );
    let io = fs.points() - points;
    match stale {
        Err(RuntimeError::TurnNotInFlight(_)) if io == 0 && !rt.is_poisoned() => {}
        other => violations.push(format!(
            "M1: a step handed to the task of a completed turn of agent {} answered {other:?} after {io} I/O point(s) (poisoned: {}); the promise is TurnNotInFlight, nothing written",
            task.agent(),
            rt.is_poisoned()
        )),
    }
    Ok((outcome, violations))
}
