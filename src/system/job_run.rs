//! A job run's bookkeeping: ONE work turn `run:{run_id}` on its own root
//! agent, recorded in the runs table (`durable-agent run`, and the fuzzer's
//! `job_run` op, both through these functions).
//!
//! Order of a new run: the root agent is created (durable), then the run
//! is recorded ([`System::start_job_run`]: `create_job_run`, status
//! `running`, with the job as JSON), then the caller runs the work turn
//! ([`job_work`]), then [`System::finish_job_run`] sets the status the
//! turn's end decides ([`settled_status`]) and, once it succeeded, settles
//! the RESUME trigger a boot may have emitted for the work. A crash
//! between the first two leaves an agent with no run (harmless: nothing
//! refers to it); after the second, the run is `running` until a resume
//! (`run --resume`, or the daemon firing the work's RESUME trigger, which
//! settles the status the same way: [`System::settle_resumed_run`]) finishes it; a
//! crash after the turn and before its status leaves the run `running`
//! with its work done, which a resume answers from the log.
//!
//! Invariant: a run's turn is only ever the work `run:{run_id}` of the
//! agent its row names, so a resumed run either finds the turn done or
//! continues it from its logged decisions with the same idempotency keys.

use crate::runtime::{AgentId, RuntimeError, WorkTurn};
use crate::store::tool_calls::{RunRecord, RunStatus, ToolCallStore};
use crate::store::triggers::{Trigger, TriggerSource};
use crate::store::StoreError;

use super::System;

/// The work id of run `run_id`'s turn.
pub fn job_work(run_id: &str) -> String {
    format!("run:{run_id}")
}

/// What a new run is.
#[derive(Debug, Clone)]
pub struct JobStart<'a> {
    pub run_id: &'a str,
    /// The root agent's name (the job's `agent`).
    pub agent: &'a str,
    /// The root agent's instructions.
    pub instructions: &'a str,
    /// The run this one was forked from.
    pub parent_run_id: Option<&'a str>,
    /// The job, as JSON, for `--resume` and `--fork`.
    pub job_json: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum JobRunError {
    #[error("run {run_id} already exists")]
    Exists { run_id: String },
    /// No such run (`known`: the run ids there are, oldest first).
    #[error("no run {run_id}")]
    NoSuchRun { run_id: String, known: Vec<String> },
    /// The run's agent is not live (terminated, or never acknowledged).
    #[error("run {run_id}: its agent (session {session_id}) is gone")]
    AgentGone { run_id: String, session_id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Creating the root agent failed (its outcome may be unknown).
    #[error(transparent)]
    Runtime(RuntimeError),
}

/// The status a run's work turn leaves it in: `None` when the turn's
/// outcome is unknown (an I/O error, a poisoned runtime: the process must
/// boot again) or not the turn's own (a stop, which the caller tells
/// apart first).
pub fn settled_status(result: &Result<WorkTurn, RuntimeError>) -> Option<RunStatus> {
    match result {
        Ok(_) => Some(RunStatus::Succeeded),
        Err(RuntimeError::NeedsConfirmation { .. }) => Some(RunStatus::WaitingForHuman),
        Err(e) if e.is_unknown_outcome() => None,
        Err(RuntimeError::Provider { .. } | RuntimeError::TooManyToolRounds { .. }) => {
            Some(RunStatus::Failed)
        }
        Err(_) => None,
    }
}

impl System {
    /// Create the run's root agent, then record the run (`running`).
    /// Refused, with nothing created, when the run id is taken.
    pub fn start_job_run(&mut self, start: &JobStart<'_>) -> Result<(RunRecord, AgentId), JobRunError> {
        let store = ToolCallStore::default();
        if store.get_run(self.db().conn(), start.run_id)?.is_some() {
            return Err(JobRunError::Exists {
                run_id: start.run_id.to_string(),
            });
        }
        let agent = self
            .runtime_mut()
            .create_root(start.agent, start.instructions)
            .map_err(JobRunError::Runtime)?;
        let session_id = self
            .runtime()
            .session_id(&agent)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let run = RunRecord {
            run_id: start.run_id.to_string(),
            session_id,
            status: RunStatus::Running,
            parent_run_id: start.parent_run_id.map(str::to_string),
            job_json: start.job_json.clone(),
        };
        let now = self.now_ms();
        store.create_job_run(self.db().conn(), &run, now)?;
        Ok((run, agent))
    }

    /// Run `run_id` as recorded: a job run (the per-session bookkeeping
    /// runs, `session:…`, are not runs `run --resume` or `--fork` can
    /// take, and are neither found nor listed as known).
    pub fn job_run(&self, run_id: &str) -> Result<RunRecord, JobRunError> {
        let store = ToolCallStore::default();
        let db = self.db();
        let is_job = |id: &str| !id.starts_with(crate::store::inspect::BOOKKEEPING_RUN_PREFIX);
        match store
            .get_run(db.conn(), run_id)?
            .filter(|run| is_job(&run.run_id))
        {
            Some(run) => Ok(run),
            None => Err(JobRunError::NoSuchRun {
                run_id: run_id.to_string(),
                known: store
                    .run_ids(db.conn())?
                    .into_iter()
                    .filter(|id| is_job(id))
                    .collect(),
            }),
        }
    }

    /// The live agent whose session `run` records, if any.
    pub fn job_agent(&self, run: &RunRecord) -> Option<AgentId> {
        self.runtime()
            .state()
            .agents
            .into_iter()
            .find(|(_, view)| view.session_id.as_str() == run.session_id)
            .map(|(id, _)| id)
    }

    /// Resume run `run_id` (`run --resume`): its record as it was and its
    /// agent, the run `running` again if it was not. The caller then runs
    /// its work turn ([`job_work`]) and [`System::finish_job_run`]s it.
    pub fn resume_job_run(&self, run_id: &str) -> Result<(RunRecord, AgentId), JobRunError> {
        let run = self.job_run(run_id)?;
        let agent = self.job_agent(&run).ok_or_else(|| JobRunError::AgentGone {
            run_id: run.run_id.clone(),
            session_id: run.session_id.clone(),
        })?;
        if run.status != RunStatus::Running {
            let now = self.now_ms();
            ToolCallStore::default().set_run_status(self.db().conn(), run_id, RunStatus::Running, now)?;
        }
        Ok((run, agent))
    }

    /// The job run a RESUME trigger resumes (`claim`'s work `run:{id}`),
    /// if it is one and its row exists, gets `status`: the daemon settles
    /// a run it resumed as `run --resume` would. A success is settled
    /// before the trigger's ack ([`System::ack_fire`]): a crash in between
    /// leaves the trigger CLAIMED, and its re-fire finds the work done and
    /// acks. Settled after the ack, the crash left the run `running` for
    /// good — its work done, so no boot gives it a RESUME trigger again
    /// (found by a review). A failure is settled after its ack (the ack
    /// decides whether the trigger retries), so a crash in between leaves
    /// the run `running` and its trigger FAILED or DEAD, kept by GC for a
    /// retry, whose fire settles it.
    pub fn settle_resumed_run(&self, claim: &Trigger, status: RunStatus) -> Result<(), StoreError> {
        let work = Self::trigger_work(claim);
        let Some(run_id) = work
            .strip_prefix("run:")
            .filter(|_| claim.source == TriggerSource::Resume)
        else {
            return Ok(());
        };
        let store = ToolCallStore::default();
        let db = self.db();
        if store.get_run(db.conn(), run_id)?.is_some() {
            store.set_run_status(db.conn(), run_id, status, self.now_ms())?;
            tracing::info!(
                run_id,
                status = status.as_str(),
                "run resumed by its RESUME trigger"
            );
        }
        Ok(())
    }

    /// Set run `run_id`'s status after its work turn ended; once it
    /// succeeded, settle the work's PENDING RESUME trigger (a boot emitted
    /// it for a run interrupted before): it must not stay PENDING as if
    /// the work were not done. After the status: a crash in between leaves
    /// the trigger, whose firing finds the work done and only acks.
    pub fn finish_job_run(&self, run_id: &str, agent: &AgentId, status: RunStatus) -> Result<(), StoreError> {
        let now = self.now_ms();
        ToolCallStore::default().set_run_status(self.db().conn(), run_id, status, now)?;
        if status == RunStatus::Succeeded {
            if let Some(t) = self.settle_resume(agent, &job_work(run_id))? {
                tracing::info!(run_id, trigger = %t.id, "the run's RESUME trigger settled");
            }
        }
        Ok(())
    }
}
