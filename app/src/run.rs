//! `durable-agent run`: a job as ONE work turn `run:{run_id}` on its own
//! root agent, recorded in the runs table; `--resume` and `--fork`.
//!
//! The run's bookkeeping (its root agent, its row, its final status, its
//! RESUME trigger settled) is the library's
//! ([`durable_agent::system::System::start_job_run`] and `finish_job_run`:
//! the order, and what a crash between two steps leaves), the same the
//! fuzzer's `job_run` op crashes. This module adds the job file, the ids,
//! `--resume`/`--fork`, telemetry and the summary.
//!
//! Invariant: a run's turn is only ever run through
//! `run_work_turn(agent, prompt, "run:{run_id}")`, so a resumed run either
//! finds the turn done (`AlreadyDone`, nothing sent: its stored response
//! and calls are reported) or continues it from its logged decisions with
//! the same idempotency keys (the model is not asked again for a decided
//! round), and every irreversible call in flight is decided by the
//! activity ledger (DONE: not re-sent; INTENT: re-sent with its key only
//! to a deduplicating endpoint, else needs confirmation). The summary
//! lists every call of the turn, from the ledgers where the turn has no
//! outcome ([`crate::effects`]).
//!
//! The completion summary is printed, not written to a file: the run's
//! outcome is already durable twice (its status in the runs table, its
//! response in the agent's session log), and a third copy would be one
//! more file to keep consistent through the `Fs` seam for no reader.

use std::path::Path;

use durable_agent::runtime::{AgentId, ConversationItem, RuntimeError, WorkTurn};
use durable_agent::store::tool_calls::{RunRecord, ToolCallStore};
use durable_agent::store::StoreError;
use durable_agent::system::{job_work, settled_status, JobRunError, JobStart, System};
use serde::Serialize;

pub use crate::effects::CallSummary;
use crate::effects::{needs_confirmation, turn_calls};
use crate::interrupt::{Stop, INTERRUPTED};
use crate::job::{next_run_id, Job, JobError};
use crate::lifecycle::Lifecycle;
use crate::progress::Progress;

/// Largest rendering of a parent run's conversation handed to a fork.
const MAX_FORK_CONTEXT_BYTES: usize = 16 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub enum RunMode<'a> {
    /// A new run of a job file.
    New { job_file: &'a Path },
    /// Boot (recovery runs) and finish run `run_id`.
    Resume { run_id: &'a str },
    /// A new run of the job of `run_id`, with its conversation as context.
    Fork { run_id: &'a str },
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("run {run_id} already exists; continue it with `run --resume {run_id}` or start another with `run --fork {run_id}`")]
    Exists { run_id: String },
    #[error("no run {run_id} in this root (runs: {known})")]
    NoSuchRun { run_id: String, known: String },
    #[error("run {run_id}: its agent (session {session_id}) is gone (terminated?); start it again with `run --fork {run_id}`")]
    AgentGone { run_id: String, session_id: String },
    #[error("stores: {0}")]
    Store(#[from] StoreError),
    /// The outcome of the last step is unknown (an I/O error, a lost
    /// delivery answer): the root must be booted again.
    #[error("run {run_id}: {source}; its outcome is unknown — {hint}`run --resume {run_id}` boots, recovers and finishes it")]
    UnknownOutcome {
        run_id: String,
        #[source]
        source: RuntimeError,
        /// What to do first, when the cause is known (a full disk).
        hint: &'static str,
    },
    #[error("runtime: {0}")]
    Runtime(RuntimeError),
}

/// How a run ended this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The turn ran now and completed.
    Succeeded,
    /// The turn had completed before (`--resume` of a finished run).
    AlreadyDone,
    /// A stop signal arrived; the run is still `running`: `--resume` it.
    Interrupted,
    /// The turn failed (provider error, too many tool rounds); the run is
    /// `failed` and can be resumed.
    Failed,
    /// The turn stopped at an irreversible call a human must confirm (its
    /// key is in `needs_confirmation`); the run is `waiting_for_human`:
    /// `confirm` the key, then `--resume` it.
    NeedsConfirmation,
}

/// The completion summary (printed as JSON).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub parent_run_id: Option<String>,
    pub agent: String,
    pub agent_id: String,
    pub outcome: RunOutcome,
    pub response: Option<String>,
    /// Every call of the run's turn: the completed turn's, and the calls
    /// a crash, a stop or a failure left behind, from the ledgers (each
    /// irreversible one with its `effect`).
    pub tool_calls: Vec<CallSummary>,
    pub error: Option<String>,
    /// Irreversible calls of this agent whose fate a human must confirm
    /// (`durable-agent confirm`).
    pub needs_confirmation: Vec<String>,
}

impl RunSummary {
    /// Exit status: a failed turn, or one blocked on a human, did not do
    /// its work.
    pub fn is_failure(&self) -> bool {
        matches!(self.outcome, RunOutcome::Failed | RunOutcome::NeedsConfirmation)
    }
}

/// Run `mode` on a booted system.
/// `lifecycle` exports the telemetry of the agent created and the turn;
/// `progress` shows the run's start and end (its rounds, calls and
/// retries it sees through the system it watches, see [`crate::boot::boot_watched`]).
pub fn run(
    system: &mut System,
    lifecycle: &Lifecycle,
    mode: RunMode<'_>,
    stop: &Stop,
    progress: &Progress,
) -> Result<RunSummary, RunError> {
    let store = ToolCallStore::default();
    let (run, job, agent) = match mode {
        RunMode::New { job_file } => {
            let job = Job::load(job_file)?;
            let run_id = match &job.run_id {
                Some(id) => id.clone(),
                None => {
                    let stem = job_file.file_stem().map(|s| s.to_string_lossy().into_owned());
                    next_run_id(
                        stem.as_deref().unwrap_or("run"),
                        &store.run_ids(system.db().conn())?,
                    )
                }
            };
            let instructions = job.instructions.clone();
            start(system, lifecycle, progress, run_id, job, None, &instructions)?
        }
        RunMode::Resume { run_id } => {
            let run = stored_run(system, run_id)?;
            let job = Job::from_stored(run_id, run.job_json.as_deref())?;
            let (run, agent) = system.resume_job_run(run_id).map_err(job_error)?;
            tracing::info!(run_id, agent = %agent, was = run.status.as_str(), "resuming run");
            progress.line(&format!(
                "run {run_id}: resuming (agent {} ({agent}), was {})",
                job.agent,
                run.status.as_str()
            ));
            (run, job, agent)
        }
        RunMode::Fork { run_id: parent } => {
            let parent_run = stored_run(system, parent)?;
            let mut job = Job::from_stored(parent, parent_run.job_json.as_deref())?;
            let context = agent_of(system, &parent_run)
                .ok()
                .map(|agent| render_conversation(system, &agent))
                .unwrap_or_default();
            let run_id = next_run_id(&format!("{parent}-fork"), &store.run_ids(system.db().conn())?);
            job.run_id = None;
            let mut instructions = job.instructions.clone();
            if !context.is_empty() {
                instructions.push_str(&format!(
                    "\n\nThis run is a fork of run {parent}, which went like this:\n{context}"
                ));
            }
            start(
                system,
                lifecycle,
                progress,
                run_id,
                job,
                Some(parent.to_string()),
                &instructions,
            )?
        }
    };
    let summary = execute(system, lifecycle, &run, &job, &agent, stop, progress)?;
    progress.end(&summary);
    Ok(summary)
}

/// Create the run's root agent, then record the run
/// ([`System::start_job_run`]).
fn start(
    system: &mut System,
    lifecycle: &Lifecycle,
    progress: &Progress,
    run_id: String,
    job: Job,
    parent_run_id: Option<String>,
    instructions: &str,
) -> Result<(RunRecord, Job, AgentId), RunError> {
    let started = system.start_job_run(&JobStart {
        run_id: &run_id,
        agent: &job.agent,
        instructions,
        parent_run_id: parent_run_id.as_deref(),
        job_json: Some(job.to_json()),
    });
    let (run, agent) = started.map_err(|e| match e {
        // Creating the root agent: its outcome may be unknown.
        JobRunError::Runtime(e) => unknown_or_runtime(&run_id, e),
        e => job_error(e),
    })?;
    lifecycle.agent_start(system, &agent, &job.agent, None);
    progress.line(&format!(
        "run {}: agent {} ({agent}){}",
        run.run_id,
        job.agent,
        run.parent_run_id
            .as_ref()
            .map_or(String::new(), |p| format!(", forked from {p}"))
    ));
    Ok((run, job, agent))
}

/// The work turn, then the run's final status.
fn execute(
    system: &mut System,
    lifecycle: &Lifecycle,
    run: &RunRecord,
    job: &Job,
    agent: &AgentId,
    stop: &Stop,
    progress: &Progress,
) -> Result<RunSummary, RunError> {
    let mut summary = RunSummary {
        run_id: run.run_id.clone(),
        parent_run_id: run.parent_run_id.clone(),
        agent: job.agent.clone(),
        agent_id: agent.to_string(),
        outcome: RunOutcome::Interrupted,
        response: None,
        tool_calls: Vec::new(),
        error: None,
        needs_confirmation: Vec::new(),
    };
    let work = job_work(&run.run_id);
    progress.watch(agent, system.runtime().session_id(agent), &work);
    let result = lifecycle.turn(
        system,
        agent,
        &work,
        |system| system.runtime_mut().run_work_turn(agent, &job.prompt, &work),
        |turn| match turn {
            WorkTurn::Ran(outcome) => serde_json::json!({"tool_calls": outcome.tool_calls.len()}),
            WorkTurn::AlreadyDone => serde_json::json!({"already_done": true}),
        },
    );
    let mut outcome = None;
    // A stop's provider error is not the turn's own end: the run stays
    // `running` for `--resume`.
    let interrupted = matches!(&result, Err(RuntimeError::Provider { source, .. }) if source.0 == INTERRUPTED || stop.requested());
    let status = if interrupted {
        None
    } else {
        settled_status(&result)
    };
    match result {
        Ok(WorkTurn::Ran(ran)) => {
            summary.outcome = RunOutcome::Succeeded;
            summary.response = Some(ran.response.clone());
            outcome = Some(ran);
        }
        Ok(WorkTurn::AlreadyDone) => {
            // The stored response and calls, not only "done".
            summary.outcome = RunOutcome::AlreadyDone;
            outcome = system
                .runtime()
                .work_outcome(agent, &work)
                .map_err(|e| unknown_or_runtime(&run.run_id, e))?;
            summary.response = match &outcome {
                Some(done) => Some(done.response.clone()),
                None => last_response(system, agent),
            };
        }
        Err(RuntimeError::Provider { .. }) if interrupted => {
            summary.outcome = RunOutcome::Interrupted;
            summary.error = Some(format!(
                "stopped before the turn completed; `durable-agent run --resume {}` finishes it",
                run.run_id
            ));
        }
        Err(e) if e.is_unknown_outcome() || matches!(e, RuntimeError::Poisoned { .. }) => {
            return Err(unknown_or_runtime(&run.run_id, e))
        }
        Err(e @ RuntimeError::NeedsConfirmation { .. }) => {
            summary.outcome = RunOutcome::NeedsConfirmation;
            summary.error = Some(format!(
                "{e}; `durable-agent confirm <key> --delivered|--not-delivered|--abandon`, then `durable-agent run --resume {}`",
                run.run_id
            ));
        }
        Err(e @ (RuntimeError::Provider { .. } | RuntimeError::TooManyToolRounds { .. })) => {
            summary.outcome = RunOutcome::Failed;
            summary.error = Some(e.to_string());
        }
        Err(e) => return Err(RunError::Runtime(e)),
    }
    if let Some(status) = status {
        system.finish_job_run(&run.run_id, agent, status)?;
    }
    // Every effect: the outcome's calls, and what the ledgers hold of a
    // turn that stopped before it completed.
    summary.tool_calls = turn_calls(system, agent, Some(&work), outcome.as_ref())?;
    summary.needs_confirmation = needs_confirmation(system, agent)?;
    tracing::info!(run_id = %run.run_id, outcome = ?summary.outcome, "run ended");
    Ok(summary)
}

fn unknown_or_runtime(run_id: &str, e: RuntimeError) -> RunError {
    if e.is_unknown_outcome() || matches!(e, RuntimeError::Poisoned { .. }) {
        let hint = if disk_full(&e) {
            "the disk is full: free space on it, then "
        } else {
            ""
        };
        RunError::UnknownOutcome {
            run_id: run_id.to_string(),
            source: e,
            hint,
        }
    } else {
        RunError::Runtime(e)
    }
}

/// Whether an `ENOSPC` is somewhere in `e`'s chain of causes.
fn disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(err) = cause {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
        {
            return true;
        }
        cause = err.source();
    }
    false
}

fn stored_run(system: &System, run_id: &str) -> Result<RunRecord, RunError> {
    system.job_run(run_id).map_err(job_error)
}

/// The live agent whose session the run records.
fn agent_of(system: &System, run: &RunRecord) -> Result<AgentId, RunError> {
    system.job_agent(run).ok_or_else(|| RunError::AgentGone {
        run_id: run.run_id.clone(),
        session_id: run.session_id.clone(),
    })
}

/// The library's job-run error as this command reports it.
fn job_error(e: JobRunError) -> RunError {
    match e {
        JobRunError::Exists { run_id } => RunError::Exists { run_id },
        JobRunError::NoSuchRun { run_id, known } => RunError::NoSuchRun {
            run_id,
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        },
        JobRunError::AgentGone { run_id, session_id } => RunError::AgentGone { run_id, session_id },
        JobRunError::Store(e) => RunError::Store(e),
        JobRunError::Runtime(e) => RunError::Runtime(e),
    }
}

fn last_response(system: &System, agent: &AgentId) -> Option<String> {
    let state = system.runtime().state();
    state
        .conversations
        .get(agent)?
        .iter()
        .rev()
        .find_map(|item| match item {
            ConversationItem::Response { text } => Some(text.clone()),
            _ => None,
        })
}

/// The agent's completed turns as plain text, capped.
fn render_conversation(system: &System, agent: &AgentId) -> String {
    let state = system.runtime().state();
    let Some(items) = state.conversations.get(agent) else {
        return String::new();
    };
    let mut out = String::new();
    for item in items {
        let line = match item {
            ConversationItem::Prompt { text } => format!("user: {text}"),
            ConversationItem::ToolCall { tool, args, .. } => format!("tool call {tool} {args}"),
            ConversationItem::ToolResult { ok, output, .. } => {
                format!("tool result ({}): {output}", if *ok { "ok" } else { "failed" })
            }
            ConversationItem::Response { text } => format!("assistant: {text}"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    if out.len() > MAX_FORK_CONTEXT_BYTES {
        let mut end = MAX_FORK_CONTEXT_BYTES;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("\n[truncated]\n");
    }
    out
}
