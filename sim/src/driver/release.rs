//! An operator's `release` of a run ([`crate::model::Action::Release`]),
//! judged against what the operator's view showed just before.
//!
//! Invariant: a release changes a run only when the run waits for a human
//! and is the tool-call ledger's run of an agent's session (`session:`):
//! then the run is `running` again and the calls it left in flight start a
//! fresh replay count. Any other release is refused with the typed answer
//! that says why — a job run waiting on a confirmation
//! (`SystemError::AwaitsConfirmation`), a run not waiting
//! (`StoreError::WrongState`), a session run the ledger never opened
//! (`StoreError::NotFound`) — and changes nothing. A wrong answer is an
//! answer violation; an error of any other kind fails the op (the I/O
//! fault armed for it, or the runtime refusing a valid op).

use durable_agent::store::tool_calls::{RunStatus, ToolCallStore};
use durable_agent::store::StoreError;
use durable_agent::system::SystemError;

use super::Driver;
use crate::model::RunRef;

impl Driver {
    pub(super) fn release(&mut self, run: &RunRef) -> Result<(), String> {
        let (id, session) = match run {
            RunRef::Job(id) => (id.clone(), false),
            RunRef::Session(agent) => (self.session_run_of(agent)?, true),
        };
        let system = self.system()?;
        // What `durable-agent status` shows the operator first.
        let before = ToolCallStore::default()
            .get_run(system.db().conn(), &id)
            .map_err(|e| e.to_string())?
            .map(|r| r.status);
        let waiting = before == Some(RunStatus::WaitingForHuman);
        let answer = system.release_run(&id);
        self.released_runs.insert(id.clone());
        let right = match &answer {
            Ok(released) => waiting && session && released.status == RunStatus::Running,
            Err(SystemError::AwaitsConfirmation { .. }) => waiting && !session,
            Err(SystemError::Store(StoreError::WrongState { .. })) => before.is_some() && !waiting,
            Err(SystemError::Store(StoreError::NotFound { .. })) => before.is_none() && session,
            Err(e) => return Err(format!("release {id}: {e}")),
        };
        // The released calls in flight count their replays afresh: the
        // boot's reading of them no longer holds (R9's looser rule).
        if answer.is_ok() {
            self.in_flight.forget();
        }
        // A doomed process's answer reached no one.
        if !right && !self.fs.crashed() {
            self.answer_violations.push(format!(
                "release of run {id} ({}; {before:?} just before) answered {answer:?}: only a session run waiting for a human is released, anything else refused with the reason",
                if session { "a session run" } else { "a job run" }
            ));
        }
        Ok(())
    }
}
