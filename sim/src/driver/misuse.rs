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

use durable_agent::fs::SimFs;
use durable_agent::runtime::{
    CallResult, ProviderError, Runtime, RuntimeError, TurnOutcome, TurnStep, TurnTask,
};

/// [`Runtime::drive`], step by step, keeping the task; then M1 on it. The
/// outcome, and the probe's violation if any.
pub(super) fn drive_keeping(
    rt: &mut Runtime,
    fs: &SimFs,
    mut task: Box<TurnTask>,
    mut step: TurnStep,
) -> Result<(TurnOutcome, Option<String>), RuntimeError> {
    let outside = rt.outside();
    let outcome = loop {
        match step {
            TurnStep::Done(outcome) => break outcome,
            TurnStep::Call(call) => {
                let result = outside.perform(&call);
                step = rt.continue_turn(&mut task, result)?;
            }
        }
    };
    // A crash point the turn passed leaves a doomed process: nothing to
    // probe (its answers reach no one).
    if fs.crashed() {
        return Ok((outcome, None));
    }
    let points = fs.points();
    let stale = rt.continue_turn(
        &mut task,
        CallResult::Provider(Err(ProviderError("a reply for a turn that completed".into()))),
    );
    let io = fs.points() - points;
    let violation = match stale {
        Err(RuntimeError::TurnNotInFlight(_)) if io == 0 && !rt.is_poisoned() => None,
        other => Some(format!(
            "M1: a step handed to the task of a completed turn of agent {} answered {other:?} after {io} I/O point(s) (poisoned: {}); the promise is TurnNotInFlight, nothing written",
            task.agent(),
            rt.is_poisoned()
        )),
    };
    Ok((outcome, violation))
}
