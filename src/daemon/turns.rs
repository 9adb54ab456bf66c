//! Driving a started turn ([`crate::runtime::turn_task`]) with the core
//! released across every call that leaves the process: the provider's
//! latency and the tool's are slept with no lock held, so other agents,
//! the scheduler and its handlers interleave between the turn's
//! persistence steps — each of which still runs alone, under the core.
//!
//! Invariant: the core is held only inside [`crate::runtime::Runtime::continue_turn`];
//! a step's error is returned to the caller, which decides (retry, or
//! stop the daemon) under the core.

use rand_chacha::ChaCha8Rng;

use crate::runtime::{Outside, OutsideCall, RuntimeError, TurnOutcome, TurnStep, TurnTask};

use super::agents::{draw_ms, sleep_ms};
use super::core::{Shared, Stopped};

/// Perform `task`'s calls, `step` first, until the turn ends.
pub(super) async fn drive(
    sh: &Shared,
    outside: &Outside,
    mut task: Box<TurnTask>,
    mut step: TurnStep,
    rng: &mut ChaCha8Rng,
) -> Result<Result<TurnOutcome, RuntimeError>, Stopped> {
    loop {
        let call = match step {
            TurnStep::Done(outcome) => return Ok(Ok(outcome)),
            TurnStep::Call(call) => call,
        };
        // The call is in flight: a completion, or a tool's round trip.
        let latency = match call {
            OutsideCall::Provider(_) => draw_ms(rng, sh.config.latency_ms),
            OutsideCall::Tool(_) => draw_ms(rng, sh.config.latency_ms) / 4,
        };
        sleep_ms(latency).await;
        let result = outside.perform(&call);
        let mut core = sh.lock().await?;
        step = match core.system.runtime_mut().continue_turn(&mut task, result) {
            Ok(step) => step,
            Err(e) => return Ok(Err(e)),
        };
    }
}
