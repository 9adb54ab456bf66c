//! `durable-agent run`'s live progress on stderr: a line per provider
//! round, per tool call (its name, its idempotency key shortened, its
//! outcome), per provider retry ("retry in N s, attempt k"), per resumed
//! round, and one at the end.
//!
//! Invariant: stdout carries only the run's JSON summary (scripts parse
//! it); every progress line goes to stderr, and `--quiet` prints none.
//! Progress lines are output for the person watching, not logs: `tracing`
//! stays for logs (filtered by `RUST_LOG`, possibly JSON), and these lines
//! are neither filtered by it nor formatted as log records.
//!
//! No event mechanism of its own: [`Progress`] watches what the product
//! already observes — the runtime's hook events ([`Hooks::observe`], after
//! the configured hooks, through [`Progress::hooks`]) and the provider's
//! attempts ([`CallObserver`], after telemetry, through
//! [`Progress::observer`]). Watching never changes behaviour: the wrapped
//! hooks answer `pre_tool_use` unchanged and see every event first, and a
//! progress line that cannot be written is dropped.
//!
//! On a terminal the lines are printed above an `indicatif` spinner that
//! says what the run is waiting for; elsewhere (a pipe, a file) each event
//! is one plain line.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_agent::runtime::{
    work_idempotency_key, AgentId, HookDecision, HookEvent, Hooks, PreToolUse, SessionId, ToolRequest,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::observe::{Attempt, AttemptOutcome, CallObserver};
use crate::run::RunSummary;

/// Longest tool error or provider error shown on a line.
const MAX_DETAIL_CHARS: usize = 120;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Nothing (`--quiet`).
    Quiet,
    /// One plain line per event.
    Plain,
    /// Lines above an `indicatif` spinner.
    Terminal,
}

impl Style {
    /// Quiet if asked; a spinner when stderr is a terminal; else plain.
    pub fn detect(quiet: bool) -> Style {
        match (quiet, std::io::stderr().is_terminal()) {
            (true, _) => Style::Quiet,
            (false, true) => Style::Terminal,
            (false, false) => Style::Plain,
        }
    }
}

/// The turn whose calls are described: keys are derived for its agent.
#[derive(Debug, Clone)]
struct Watched {
    agent: AgentId,
    session: SessionId,
    work: String,
}

#[derive(Debug, Default)]
struct State {
    watched: Option<Watched>,
    /// The provider round in progress (from the hook events).
    round: Option<u32>,
}

/// The progress of one `run`, shared by the watchers it hands out.
#[derive(Debug)]
pub struct Progress {
    style: Style,
    bar: Option<ProgressBar>,
    state: Mutex<State>,
}

impl Progress {
    pub fn new(style: Style) -> Arc<Progress> {
        let bar = (style == Style::Terminal).then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(s) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                bar.set_style(s);
            }
            bar.set_message("booting (recovery runs first)");
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Arc::new(Progress {
            style,
            bar,
            state: Mutex::new(State::default()),
        })
    }

    /// Shows nothing.
    pub fn quiet() -> Arc<Progress> {
        Progress::new(Style::Quiet)
    }

    pub fn style(&self) -> Style {
        self.style
    }

    /// `inner`, with this progress watching the events it observes.
    pub fn hooks(self: &Arc<Self>, inner: Arc<dyn Hooks>) -> Arc<dyn Hooks> {
        Arc::new(WatchedHooks {
            inner,
            progress: self.clone(),
        })
    }

    /// `inner`, with this progress watching the provider's attempts.
    pub fn observer(self: &Arc<Self>, inner: Arc<dyn CallObserver>) -> Arc<dyn CallObserver> {
        Arc::new(WatchedAttempts {
            inner,
            progress: self.clone(),
        })
    }

    /// The run's turn is about to run: `work` of `agent` in `session`.
    pub fn watch(&self, agent: &AgentId, session: Option<&SessionId>, work: &str) {
        let mut state = self.lock();
        state.watched = session.map(|session| Watched {
            agent: agent.clone(),
            session: session.clone(),
            work: work.to_string(),
        });
        state.round = None;
    }

    /// A line of its own (the run's start).
    pub fn line(&self, text: &str) {
        match (&self.style, &self.bar) {
            (Style::Quiet, _) => {}
            (_, Some(bar)) => bar.println(text),
            (_, None) => {
                let mut err = std::io::stderr().lock();
                // A closed stderr loses the line, never the run.
                let _ = writeln!(err, "{text}").and_then(|()| err.flush());
            }
        }
    }

    /// What the spinner says the run waits for (terminal only).
    fn waiting(&self, text: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(text);
        }
    }

    /// The spinner goes (the run ended, or failed before its summary).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// The run ended as `summary` says: the last line; the spinner goes.
    pub fn end(&self, summary: &RunSummary) {
        self.finish();
        let outcome = serde_json::to_value(summary.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let calls = summary.tool_calls.len();
        self.line(&format!(
            "run {}: {outcome} ({calls} tool call{})",
            summary.run_id,
            if calls == 1 { "" } else { "s" }
        ));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave two plain fields half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn on_event(&self, event: &HookEvent) {
        if self.style == Style::Quiet {
            return;
        }
        let mut state = self.lock();
        let line = match event {
            HookEvent::AgentStart {
                resumed: Some(at), ..
            } => {
                state.round = Some(at.round);
                if at.decided {
                    self.waiting(format!("round {}: running its logged calls", at.round));
                    format!("resuming round {} from its logged decision", at.round)
                } else {
                    format!("resuming round {}: not decided yet, asking the model", at.round)
                }
            }
            HookEvent::TurnStart { turn, .. } => {
                state.round = Some(*turn);
                self.waiting(format!("round {turn}: waiting for the model"));
                format!("round {turn}: asking the model")
            }
            HookEvent::PostToolUse {
                agent,
                tool_name,
                tool_input,
                tool_use_id,
                ..
            } => {
                let key = short_key(&state, agent, tool_name, tool_input, tool_use_id);
                self.waiting(format!("{}running tools", round_prefix(&state)));
                format!("{}tool {tool_name} [{key}] ok", round_prefix(&state))
            }
            HookEvent::PostToolUseFailure {
                agent,
                tool_name,
                tool_input,
                tool_use_id,
                error,
            } => {
                let key = short_key(&state, agent, tool_name, tool_input, tool_use_id);
                format!(
                    "{}tool {tool_name} [{key}] failed: {}",
                    round_prefix(&state),
                    detail(error)
                )
            }
            HookEvent::AgentStart { .. } | HookEvent::TurnEnd { .. } | HookEvent::AgentStop { .. } => return,
        };
        drop(state);
        self.line(&line);
    }

    fn on_attempt(&self, attempt: &Attempt) {
        if self.style == Style::Quiet {
            return;
        }
        let AttemptOutcome::Failure { error, retry_in_ms } = &attempt.outcome else {
            return;
        };
        let prefix = round_prefix(&self.lock());
        let line = match retry_in_ms {
            Some(ms) => {
                let secs = seconds(*ms);
                self.waiting(format!("{prefix}provider retry in {secs} s"));
                format!(
                    "{prefix}provider failed: {}; retry in {secs} s, attempt {}",
                    detail(&error.to_string()),
                    attempt.number.saturating_add(1)
                )
            }
            None => format!(
                "{prefix}provider failed: {}; no retry after attempt {}",
                detail(&error.to_string()),
                attempt.number
            ),
        };
        self.line(&line);
    }
}

/// `ms` in seconds, to the millisecond, without trailing zeros (`0.01`,
/// `1.5`, `2`).
fn seconds(ms: u64) -> String {
    let text = format!("{}.{:03}", ms / 1000, ms % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `round R: `, when the round is known.
fn round_prefix(state: &State) -> String {
    state.round.map_or(String::new(), |r| format!("round {r}: "))
}

/// The first line of `text`, at most [`MAX_DETAIL_CHARS`] characters.
fn detail(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    match first.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &first[..cut]),
        None => first.to_string(),
    }
}

/// The call's idempotency key as the runtime derived it at the decision
/// (the watched turn's work, its round, the call's index in it, the
/// arguments the hooks left), shortened to `r{round}-c{index}-{hash:8}`;
/// the call id when the call is not the watched turn's.
fn short_key(state: &State, agent: &AgentId, tool: &str, args: &Value, call_id: &str) -> String {
    let index = call_id
        .rsplit_once('.')
        .and_then(|(_, i)| i.parse::<usize>().ok());
    let (Some(w), Some(round), Some(index)) = (&state.watched, state.round, index) else {
        return call_id.to_string();
    };
    if &w.agent != agent {
        return call_id.to_string();
    }
    let request = ToolRequest {
        tool: tool.to_string(),
        args: args.clone(),
        irreversible: false,
        invalid_args: None,
    };
    shorten(
        &work_idempotency_key(&w.session, &w.work, round, index, &request),
        &w.work,
    )
}

/// `{work}-r0-c0-{16 hex}@{session}` → `r0-c0-{8 hex}`; anything else as is.
pub fn shorten(key: &str, work: &str) -> String {
    let body = key.split_once('@').map_or(key, |(body, _)| body);
    let body = body
        .strip_prefix(work)
        .and_then(|b| b.strip_prefix('-'))
        .unwrap_or(body);
    match body.rsplit_once('-') {
        Some((head, hash)) if hash.len() > 8 && hash.is_ascii() => format!("{head}-{}", &hash[..8]),
        _ => body.to_string(),
    }
}

/// Hooks with a [`Progress`] watching what they observe.
#[derive(Debug)]
struct WatchedHooks {
    inner: Arc<dyn Hooks>,
    progress: Arc<Progress>,
}

impl Hooks for WatchedHooks {
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision> {
        // The model asked for calls: they run once the round is decided.
        self.progress
            .waiting(format!("round {}: running tools", call.round));
        self.inner.pre_tool_use(call)
    }

    fn observe(&self, event: &HookEvent) {
        self.inner.observe(event);
        self.progress.on_event(event);
    }
}

/// A call observer with a [`Progress`] watching the attempts.
#[derive(Debug)]
struct WatchedAttempts {
    inner: Arc<dyn CallObserver>,
    progress: Arc<Progress>,
}

impl CallObserver for WatchedAttempts {
    fn on_attempt(&self, attempt: &Attempt) {
        self.inner.on_attempt(attempt);
        self.progress.on_attempt(attempt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_shortened_to_round_call_and_hash() {
        let key = "run:job-1-r0-c1-0123456789abcdef@s-000001";
        assert_eq!(shorten(key, "run:job-1"), "r0-c1-01234567");
        assert_eq!(shorten("other", "run:job-1"), "other");
    }

    #[test]
    fn waits_are_shown_in_seconds() {
        assert_eq!(seconds(10), "0.01");
        assert_eq!(seconds(1_500), "1.5");
        assert_eq!(seconds(2_000), "2");
        assert_eq!(seconds(0), "0");
    }

    #[test]
    fn details_keep_the_first_line_capped() {
        assert_eq!(detail("a\nb"), "a");
        let long = "x".repeat(300);
        assert_eq!(detail(&long).chars().count(), MAX_DETAIL_CHARS + 1);
    }
}
