//! `durable-agent inspect VIEW` and `durable-agent transcript AGENT|RUN`:
//! the view from the daemon's API when a daemon holds the root, else from
//! a [`super::snapshot`] of the stopped root; printed as a table (or the
//! Markdown) or, with `--json`, as the API's JSON answer.
//!
//! Invariant: the same view gives the same JSON both ways (one
//! [`super::answer`]; the daemon's answer is printed as it came), and
//! neither way writes to the root (see [`super::snapshot`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_agent::store::inspect::Page;
use durable_agent::store::triggers::TriggerStatus;
use serde_json::Value;

use super::snapshot::{self, SnapshotError};
use super::{answer, table, Source, View};
use crate::access::Token;
use crate::api::{Client, ClientError};
use crate::config::Config;

/// How long a view may take the daemon to answer.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(30);

/// The views `durable-agent inspect` offers.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum InspectCommand {
    /// User runs, newest first; or one run: status, rounds, calls (tool,
    /// key, status, replays), effects, outcome, usage, errors.
    Runs {
        /// A run id: show that run.
        run: Option<String>,
    },
    /// Live agents as a tree (a page of root agents, newest first); or one
    /// agent with its conversation.
    Agents {
        /// An agent name or id: show that agent.
        agent: Option<String>,
    },
    /// The stored answer of a completed work turn (an API turn's work id,
    /// `run:RUN` or `trigger:KEY`).
    Work { work_id: String },
    /// Tokens: totals, per model, per agent, per run.
    Usage,
    /// Provider-call failures (context, message, attempt), newest first.
    Errors {
        /// Only this run's.
        #[arg(long)]
        run: Option<String>,
    },
    /// Triggers with their attempts and last error; or one trigger and its work.
    Triggers {
        /// A trigger id (`trg-N`): show that trigger.
        trigger: Option<String>,
        /// Only these: PENDING, CLAIMED, DONE, FAILED, DEAD.
        #[arg(long)]
        status: Option<String>,
    },
    /// Irreversible calls waiting for a human (`confirm` answers them).
    Confirmations,
    /// Recurring schedules.
    Schedules,
}

impl InspectCommand {
    /// The view it asks for, lists paged by `page`.
    pub fn view(self, page: Page) -> Result<View, String> {
        Ok(match self {
            InspectCommand::Runs { run: Some(id) } => View::Run(id),
            InspectCommand::Runs { run: None } => View::Runs(page),
            InspectCommand::Agents { agent: Some(name) } => View::Agent(name),
            InspectCommand::Agents { agent: None } => View::Agents(page),
            InspectCommand::Work { work_id } => View::Work(work_id),
            InspectCommand::Usage => View::Usage(page),
            InspectCommand::Errors { run } => View::Errors { run, page },
            InspectCommand::Triggers {
                trigger: Some(id), ..
            } => View::Trigger(id),
            InspectCommand::Triggers {
                trigger: None,
                status,
            } => View::Triggers {
                status: status
                    .map(|s| {
                        TriggerStatus::parse(&s.to_ascii_uppercase()).map_err(|_| {
                            format!("--status must be PENDING, CLAIMED, DONE, FAILED or DEAD, not {s:?}")
                        })
                    })
                    .transpose()?,
                page,
            },
            InspectCommand::Confirmations => View::Confirmations(page),
            InspectCommand::Schedules => View::Schedules(page),
        })
    }
}

/// The host clock in ms since the UNIX epoch (the stores' clock).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `view`'s JSON answer for the root of `config`.
pub fn fetch(config: &Config, view: &View) -> Result<Value, String> {
    match snapshot::open(&config.runtime.root) {
        Ok(snap) => {
            let source = Source {
                runtime: &snap.runtime,
                db: &snap.db,
                schedules: snap.schedules.clone(),
                now_ms: now_ms(),
            };
            answer(&source, view).map_err(|e| e.to_string())
        }
        Err(SnapshotError::Held(root)) => {
            tracing::debug!(addr = %config.api.listen, "the root is held (a daemon?): asking its API");
            let token = Token::for_client(config).map_err(|t| {
                format!(
                    "{} is held by another process; its API token: {t}",
                    root.display()
                )
            })?;
            Client::new(config.api.listen, DAEMON_TIMEOUT)
                .with_token(token)
                .call("GET", &view.path(), None)
                .map_err(|e| match e {
                    ClientError::Api { .. } => format!("the daemon holding the root answered: {e}"),
                    _ => format!(
                        "{} is held by another process and its API did not answer: {e}",
                        root.display()
                    ),
                })
        }
        Err(e) => Err(e.to_string()),
    }
}

/// What `inspect`/`transcript` print: the JSON (`--json`) or the text.
pub fn print(config: &Config, view: &View, json: bool) -> Result<String, String> {
    let value = fetch(config, view)?;
    match json {
        true => serde_json::to_string_pretty(&value).map_err(|e| e.to_string()),
        false => Ok(table::render(view, &value).trim_end().to_string()),
    }
}
