//! `durable-agent run`'s live progress on stderr, and the same events for
//! the API's streamed turns: a step per provider round, per piece of
//! streamed reply text, per tool call (its name, its idempotency key
//! shortened, its outcome), per provider retry ("retry in N s, attempt
//! k"), per resumed round, and (for `run`) one line at the end.
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
//! attempts and streamed text ([`CallObserver`], after telemetry, through
//! [`Progress::observer`]) — and turns each into one [`Step`], the one
//! vocabulary both `run`'s lines and the API's event stream
//! ([`crate::api::stream`], through [`Progress::subscribe`]) are made of.
//! Watching never changes behaviour: the wrapped hooks answer
//! `pre_tool_use` unchanged and see every event first, a progress line that
//! cannot be written is dropped, and a subscriber that went away is
//! skipped. Streamed text is shown, never kept: what the run logs is the
//! complete reply.
//!
//! On a terminal the lines are printed above an `indicatif` spinner that
//! says what the run is waiting for (streamed text shows in it as it
//! arrives, and is printed line by line); elsewhere (a pipe, a file) each
//! event is one plain line, and streamed text is written as it arrives on
//! a line of its own.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_agent::runtime::{
    work_idempotency_key, AgentId, HookDecision, HookEvent, Hooks, PreToolUse, SessionId, ToolRequest,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::Value;

use crate::observe::{Attempt, AttemptOutcome, CallObserver, TextDelta};
use crate::run::RunSummary;

/// Longest tool error or provider error shown on a line.
const MAX_DETAIL_CHARS: usize = 120;

/// Longest tail of streamed text the spinner shows.
const MAX_SPINNER_TEXT_CHARS: usize = 60;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Nothing (`--quiet`; `serve`, whose watchers are its API streams).
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

/// One thing that happened in a watched turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Step {
    /// A provider round begins: the model is asked.
    Round { round: u32 },
    /// A turn found open resumes at `round`: from its logged decision
    /// (`decided`, the model is not asked again) or by asking the model.
    Resumed { round: u32, decided: bool },
    /// A piece of the reply's text as it streams in (`[provider] stream
    /// = true`). A retried attempt streams its text again.
    Text {
        round: Option<u32>,
        attempt: u32,
        delta: String,
    },
    /// A call's result is logged: `key` is its idempotency key shortened
    /// (`r{round}-c{index}-{hash:8}`, see [`shorten`]).
    Tool {
        round: Option<u32>,
        tool: String,
        key: String,
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A provider attempt failed and attempt `attempt` follows after
    /// `retry_in_ms`.
    Retry {
        round: Option<u32>,
        error: String,
        retry_in_ms: u64,
        attempt: u32,
    },
    /// A provider attempt failed and none follows (not retryable, or the
    /// retries are spent): the turn fails.
    ProviderFailed {
        round: Option<u32>,
        error: String,
        attempt: u32,
    },
}

impl Step {
    /// Its name (the `event` tag; the SSE event name).
    pub fn name(&self) -> &'static str {
        match self {
            Step::Round { .. } => "round",
            Step::Resumed { .. } => "resumed",
            Step::Text { .. } => "text",
            Step::Tool { .. } => "tool",
            Step::Retry { .. } => "retry",
            Step::ProviderFailed { .. } => "provider_failed",
        }
    }
}

/// Whose calls' keys are derived how: a turn's session, and its work id
/// (None: a consuming turn, whose key's short form has no work in it).
#[derive(Debug, Clone)]
struct Watched {
    agent: AgentId,
    session: SessionId,
    work: Option<String>,
}

/// Where a subscriber's steps go (quick, never blocking: a channel send).
pub type Sink = Arc<dyn Fn(&Step) + Send + Sync>;

struct Subscriber {
    id: u64,
    watched: Watched,
    sink: Sink,
}

#[derive(Default)]
struct State {
    /// `run`'s turn.
    watched: Option<Watched>,
    /// The provider round in progress per agent (from the hook events);
    /// an agent's entry goes when its turn completes.
    rounds: BTreeMap<String, u32>,
    subscribers: Vec<Subscriber>,
    next_subscriber: u64,
}

/// Streamed text being shown (`run`'s stderr).
#[derive(Debug, Default)]
struct Out {
    /// Some: a text line is open — its prefix, and (terminal) the text
    /// not printed yet.
    text: Option<(String, String)>,
}

/// The progress of one `run` (or the watchers of one `serve`), shared by
/// the watchers it hands out.
pub struct Progress {
    style: Style,
    bar: Option<ProgressBar>,
    state: Mutex<State>,
    out: Mutex<Out>,
}

// By hand: the subscribers' sinks have no Debug.
impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

/// A subscriber's registration; dropping it ends the subscription.
pub struct Subscription {
    progress: Arc<Progress>,
    id: u64,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("id", &self.id).finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.progress.lock().subscribers.retain(|s| s.id != self.id);
    }
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
            out: Mutex::new(Out::default()),
        })
    }

    /// Shows nothing (its subscribers still get every step).
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
            work: Some(work.to_string()),
        });
        state.rounds.remove(agent.as_str());
    }

    /// Every step of `agent`'s turns goes to `sink` until the returned
    /// subscription is dropped. `session` and `work` (None: a consuming
    /// turn) are the turn's, for its calls' shortened keys. An agent runs
    /// one turn at a time, so while the subscriber waits for its turn,
    /// every step of the agent's is that turn's.
    pub fn subscribe(
        self: &Arc<Self>,
        agent: AgentId,
        session: SessionId,
        work: Option<String>,
        sink: Sink,
    ) -> Subscription {
        let mut state = self.lock();
        let id = state.next_subscriber;
        state.next_subscriber += 1;
        // The agent's round is left alone: a turn of the agent may be in
        // flight (a second client's turn is refused only after it
        // subscribed), and each turn sets its own at its start
        // (`TurnStart`, `AgentStart` resumed) and clears it at its stop.
        state.subscribers.push(Subscriber {
            id,
            watched: Watched { agent, session, work },
            sink,
        });
        Subscription {
            progress: self.clone(),
            id,
        }
    }

    /// A line of its own (the run's start).
    pub fn line(&self, text: &str) {
        if self.style == Style::Quiet {
            return;
        }
        let mut out = self.out();
        self.close_text(&mut out);
        self.print(text);
    }

    fn print(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => {
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
        if self.style != Style::Quiet {
            let mut out = self.out();
            self.close_text(&mut out);
        }
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
        // A panic elsewhere cannot leave these plain fields half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sinks of `agent`'s subscribers.
    fn sinks(state: &State, agent: &str) -> Vec<Sink> {
        state
            .subscribers
            .iter()
            .filter(|s| s.watched.agent.as_str() == agent)
            .map(|s| s.sink.clone())
            .collect()
    }

    /// Hand `step` to `sinks` and show it.
    fn publish(&self, step: &Step, sinks: &[Sink]) {
        for sink in sinks {
            sink(step);
        }
        if self.style != Style::Quiet {
            self.show(step);
        }
    }

    fn on_event(&self, event: &HookEvent) {
        let mut state = self.lock();
        let step = match event {
            HookEvent::AgentStart {
                agent,
                resumed: Some(at),
                ..
            } => {
                state.rounds.insert(agent.to_string(), at.round);
                Step::Resumed {
                    round: at.round,
                    decided: at.decided,
                }
            }
            HookEvent::TurnStart { agent, turn } => {
                state.rounds.insert(agent.to_string(), *turn);
                Step::Round { round: *turn }
            }
            HookEvent::PostToolUse {
                agent,
                tool_name,
                tool_input,
                tool_use_id,
                ..
            } => Step::Tool {
                round: state.rounds.get(agent.as_str()).copied(),
                tool: tool_name.clone(),
                key: short_key(&state, agent, tool_name, tool_input, tool_use_id),
                ok: true,
                error: None,
            },
            HookEvent::PostToolUseFailure {
                agent,
                tool_name,
                tool_input,
                tool_use_id,
                error,
            } => Step::Tool {
                round: state.rounds.get(agent.as_str()).copied(),
                tool: tool_name.clone(),
                key: short_key(&state, agent, tool_name, tool_input, tool_use_id),
                ok: false,
                error: Some(error.clone()),
            },
            HookEvent::AgentStop { agent, .. } => {
                state.rounds.remove(agent.as_str());
                return;
            }
            HookEvent::AgentStart { .. } | HookEvent::TurnEnd { .. } => return,
        };
        let agent = match event {
            HookEvent::AgentStart { agent, .. }
            | HookEvent::TurnStart { agent, .. }
            | HookEvent::TurnEnd { agent, .. }
            | HookEvent::PostToolUse { agent, .. }
            | HookEvent::PostToolUseFailure { agent, .. }
            | HookEvent::AgentStop { agent, .. } => agent,
        };
        let sinks = Self::sinks(&state, agent.as_str());
        drop(state);
        self.publish(&step, &sinks);
    }

    fn on_attempt(&self, attempt: &Attempt) {
        let state = self.lock();
        let round = state.rounds.get(&attempt.agent).copied();
        let step = match &attempt.outcome {
            AttemptOutcome::Success { .. } => {
                // The streamed text (if any) is complete.
                drop(state);
                if self.style != Style::Quiet {
                    let mut out = self.out();
                    self.close_text(&mut out);
                }
                return;
            }
            AttemptOutcome::Failure {
                error,
                retry_in_ms: Some(ms),
            } => Step::Retry {
                round,
                error: error.to_string(),
                retry_in_ms: *ms,
                attempt: attempt.number.saturating_add(1),
            },
            AttemptOutcome::Failure {
                error,
                retry_in_ms: None,
            } => Step::ProviderFailed {
                round,
                error: error.to_string(),
                attempt: attempt.number,
            },
        };
        let sinks = Self::sinks(&state, &attempt.agent);
        drop(state);
        self.publish(&step, &sinks);
    }

    fn on_text_delta(&self, delta: &TextDelta<'_>) {
        let state = self.lock();
        let step = Step::Text {
            round: state.rounds.get(delta.agent).copied(),
            attempt: delta.attempt,
            delta: delta.text.to_string(),
        };
        let sinks = Self::sinks(&state, delta.agent);
        drop(state);
        self.publish(&step, &sinks);
    }

    /// `step` on stderr: a line (and the spinner's message), or streamed
    /// text.
    fn show(&self, step: &Step) {
        let mut out = self.out();
        let prefix = |round: &Option<u32>| round.map_or(String::new(), |r| format!("round {r}: "));
        let line = match step {
            Step::Resumed { round, decided: true } => {
                self.waiting(format!("round {round}: running its logged calls"));
                format!("resuming round {round} from its logged decision")
            }
            Step::Resumed {
                round,
                decided: false,
            } => format!("resuming round {round}: not decided yet, asking the model"),
            Step::Round { round } => {
                self.waiting(format!("round {round}: waiting for the model"));
                format!("round {round}: asking the model")
            }
            Step::Text { round, delta, .. } => return self.show_text(&mut out, &prefix(round), delta),
            Step::Tool {
                round,
                tool,
                key,
                ok: true,
                ..
            } => {
                self.waiting(format!("{}running tools", prefix(round)));
                format!("{}tool {tool} [{key}] ok", prefix(round))
            }
            Step::Tool {
                round,
                tool,
                key,
                error,
                ..
            } => format!(
                "{}tool {tool} [{key}] failed: {}",
                prefix(round),
                detail(error.as_deref().unwrap_or_default())
            ),
            Step::Retry {
                round,
                error,
                retry_in_ms,
                attempt,
            } => {
                let secs = seconds(*retry_in_ms);
                self.waiting(format!("{}provider retry in {secs} s", prefix(round)));
                format!(
                    "{}provider failed: {}; retry in {secs} s, attempt {attempt}",
                    prefix(round),
                    detail(error)
                )
            }
            Step::ProviderFailed {
                round,
                error,
                attempt,
            } => format!(
                "{}provider failed: {}; no retry after attempt {attempt}",
                prefix(round),
                detail(error)
            ),
        };
        self.close_text(&mut out);
        self.print(&line);
    }

    /// Streamed text: on a terminal, whole lines above the spinner and the
    /// latest in it; elsewhere written as it arrives.
    fn show_text(&self, out: &mut Out, prefix: &str, delta: &str) {
        let label = format!("{prefix}reply: ");
        let (_, pending) = out.text.get_or_insert_with(|| {
            if self.bar.is_none() {
                self.write_raw(&label);
            }
            (label.clone(), String::new())
        });
        match &self.bar {
            None => self.write_raw(delta),
            Some(bar) => {
                pending.push_str(delta);
                while let Some(at) = pending.find('\n') {
                    let whole: String = pending.drain(..=at).collect();
                    bar.println(format!("{label}{}", whole.trim_end_matches('\n')));
                }
                let tail: String = {
                    let chars: Vec<char> = pending.chars().collect();
                    let from = chars.len().saturating_sub(MAX_SPINNER_TEXT_CHARS);
                    chars[from..].iter().collect()
                };
                bar.set_message(format!("{label}{tail}"));
            }
        }
    }

    /// End an open text line before anything else is printed.
    fn close_text(&self, out: &mut Out) {
        let Some((label, pending)) = out.text.take() else {
            return;
        };
        match &self.bar {
            None => self.write_raw("\n"),
            Some(bar) if !pending.is_empty() => bar.println(format!("{label}{pending}")),
            Some(_) => {}
        }
    }

    fn write_raw(&self, text: &str) {
        let mut err = std::io::stderr().lock();
        // A closed stderr loses the text, never the run.
        let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
    }
}

/// `ms` in seconds, to the millisecond, without trailing zeros (`0.01`,
/// `1.5`, `2`).
fn seconds(ms: u64) -> String {
    let text = format!("{}.{:03}", ms / 1000, ms % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
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
/// (the turn's work, its round, the call's index in it, the arguments the
/// hooks left), shortened to `r{round}-c{index}-{hash:8}` — for `run`'s
/// turn or a subscriber's; the call id for a turn nobody watches. A
/// consuming turn's key (`{session}-t{turn}-r…`) ends the same way as a
/// work's, so its short form is derived with no work.
fn short_key(state: &State, agent: &AgentId, tool: &str, args: &Value, call_id: &str) -> String {
    let index = call_id
        .rsplit_once('.')
        .and_then(|(_, i)| i.parse::<usize>().ok());
    let watched = state
        .watched
        .iter()
        .chain(state.subscribers.iter().map(|s| &s.watched))
        .find(|w| &w.agent == agent);
    let round = state.rounds.get(agent.as_str()).copied();
    let (Some(w), Some(round), Some(index)) = (watched, round, index) else {
        return call_id.to_string();
    };
    let request = ToolRequest {
        tool: tool.to_string(),
        args: args.clone(),
        irreversible: false,
        invalid_args: None,
    };
    let work = w.work.as_deref().unwrap_or_default();
    shorten(
        &work_idempotency_key(&w.session, work, round, index, &request),
        work,
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

    fn on_text_delta(&self, delta: &TextDelta<'_>) {
        self.inner.on_text_delta(delta);
        self.progress.on_text_delta(delta);
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
