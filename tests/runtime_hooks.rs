//! `PreToolUse` hooks in the turn loop, on SimFs: a denial never runs the
//! call and the model reads the reason; rewritten arguments are what the
//! idempotency key derives from and what the tool receives; and the
//! verdict is part of the round's durable decision — after a crash at any
//! I/O point of the turn, a resumed round applies the LOGGED verdict and
//! never asks the hooks again, even when the hooks now answer otherwise.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::log::EVENTS_FILE;
use durable_agent::runtime::{
    idempotency_key, turn_identity, CallResult, HookDecision, HookEvent, Hooks, PreToolUse, ProviderReply,
    Runtime, RuntimeConfig, Started, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest, TurnKind,
    TurnStep,
};
use serde_json::{json, Value};

const EMAIL: &str = "please send_email to bob";

/// Answers the `n`-th ask with `answers[n]` (the last one from then on),
/// counting asks and keeping every observed event's name.
#[derive(Debug)]
struct Script {
    answers: Vec<Vec<HookDecision>>,
    asked: AtomicUsize,
    seen: Mutex<Vec<&'static str>>,
}

impl Script {
    fn new(answers: Vec<Vec<HookDecision>>) -> Arc<Script> {
        Arc::new(Script {
            answers,
            asked: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

impl Hooks for Script {
    fn pre_tool_use(&self, _call: &PreToolUse<'_>) -> Vec<HookDecision> {
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        let last = self.answers.len().saturating_sub(1);
        self.answers.get(n.min(last)).cloned().unwrap_or_default()
    }

    fn observe(&self, event: &HookEvent) {
        self.seen.lock().unwrap().push(event.kind().name());
    }
}

/// Every call the tools received: (key, tool, args). Outlives crashes,
/// as the outside world does.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<(String, String, Value)>>);

impl Recorder {
    fn calls(&self) -> Vec<(String, String, Value)> {
        self.0.lock().unwrap().clone()
    }
}

impl ToolExecutor for Recorder {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        self.0.lock().unwrap().push((
            ctx.idempotency_key.to_string(),
            call.tool.clone(),
            call.args.clone(),
        ));
        Ok(ToolOutput {
            ok: true,
            output: "sent".into(),
        })
    }
}

fn open(sim: &SimFs, tools: &Arc<Recorder>, hooks: Arc<dyn Hooks>) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut config = RuntimeConfig::new(8);
    config.tools = tools.clone();
    config.hooks = hooks;
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

fn deny(reason: &str) -> HookDecision {
    HookDecision::Deny {
        reason: reason.into(),
    }
}

fn patch(p: Value) -> HookDecision {
    HookDecision::ModifyArgs { patch: p }
}

#[test]
fn a_denied_call_never_runs_and_the_model_reads_the_reason() {
    let sim = SimFs::new(SimConfig::new(8));
    let tools = Arc::new(Recorder::default());
    let hooks = Script::new(vec![vec![
        HookDecision::Allow,
        deny("no email on fridays"),
        patch(json!({"to": "x"})),
    ]]);
    let mut rt = open(&sim, &tools, hooks.clone());
    let a = rt.create_root("a", "").unwrap();
    let outcome = rt.run_turn(&a, EMAIL).unwrap();
    assert!(tools.calls().is_empty(), "a denied call reached the tools");
    let (_, request, output) = &outcome.tool_calls[0];
    assert!(!output.ok);
    assert!(
        output.output.contains("denied by policy: no email on fridays"),
        "{output:?}"
    );
    assert_ne!(
        request.args["to"], "x",
        "a denied call keeps the model's arguments"
    );
    assert_eq!(hooks.asked(), 1);
    let seen = hooks.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "AgentStart",
            "TurnStart",
            "PostToolUseFailure",
            "TurnEnd",
            "TurnStart",
            "AgentStop"
        ]
    );
    // The denial is in the log, on the decision's line — at version 5, so
    // a version-4 build refuses it instead of running the denied call —
    // and a reboot rebuilds the same conversation.
    let log = rt.session_dir(&a).unwrap().join(EVENTS_FILE);
    let text = String::from_utf8(sim.read(&log, "test read").unwrap()).unwrap();
    let decided: Vec<&str> = text.lines().filter(|l| l.contains("\"round.decided\"")).collect();
    assert_eq!(decided.len(), 1, "{text}");
    assert!(decided[0].starts_with("{\"schema_version\":5,"), "{}", decided[0]);
    assert!(
        decided[0].contains("\"denied\":\"no email on fridays\""),
        "{}",
        decided[0]
    );
    assert!(text
        .lines()
        .filter(|l| !l.contains("round.decided"))
        .all(|l| !l.contains("\"schema_version\":5")));
    let state = rt.state().normalized();
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let rt = open(&sim, &tools, Script::new(vec![]));
    assert_eq!(rt.state().normalized(), state);
}

#[test]
fn modified_arguments_are_what_the_key_derives_from_and_the_tool_receives() {
    let sim = SimFs::new(SimConfig::new(8));
    let tools = Arc::new(Recorder::default());
    let hooks = Script::new(vec![vec![
        patch(json!({"to": "audit@example.com"})),
        HookDecision::Allow,
        patch(json!({"body": null, "bcc": "log@example.com"})),
    ]]);
    let mut rt = open(&sim, &tools, hooks);
    let a = rt.create_root("a", "").unwrap();
    let session = rt.session_id(&a).unwrap().clone();
    let outcome = rt.run_turn(&a, EMAIL).unwrap();
    let calls = tools.calls();
    assert_eq!(calls.len(), 1);
    let (key, tool, args) = &calls[0];
    assert_eq!(tool, "send_email");
    assert_eq!(
        args,
        &json!({"to": "audit@example.com", "bcc": "log@example.com"})
    );
    let patched = ToolRequest {
        tool: "send_email".into(),
        args: args.clone(),
        irreversible: true,
        invalid_args: None,
    };
    let want = idempotency_key(&session, &turn_identity(EMAIL, 0), 0, 0, &patched);
    assert_eq!(key, &want, "the key derives from the modified arguments");
    assert_eq!(outcome.tool_calls[0].1.args, *args, "the turn reports what ran");
}

/// A completion handed to the turn unreviewed (not through
/// `Outside::perform`) is reviewed when it is decided: no path skips the
/// hooks.
#[test]
fn an_unreviewed_reply_is_reviewed_when_decided() {
    let sim = SimFs::new(SimConfig::new(8));
    let tools = Arc::new(Recorder::default());
    let hooks = Script::new(vec![vec![deny("never")]]);
    let mut rt = open(&sim, &tools, hooks.clone());
    let a = rt.create_root("a", "").unwrap();
    let Started::Running(mut task, TurnStep::Call(_)) = rt.start_turn(&a, EMAIL, TurnKind::Plain).unwrap()
    else {
        panic!("expected a provider call");
    };
    let reply = ProviderReply {
        text: String::new(),
        tool_calls: vec![ToolRequest {
            tool: "send_email".into(),
            args: json!({"to": "bob"}),
            irreversible: true,
            invalid_args: None,
        }],
        usage: None,
    };
    let step = rt
        .continue_turn(&mut task, CallResult::Provider(Ok(reply)))
        .unwrap();
    // The denied call never went out: the next step is round 1's ask.
    assert!(
        matches!(step, TurnStep::Call(durable_agent::runtime::OutsideCall::Provider(ref p)) if p.round == 1),
        "{step:?}"
    );
    assert_eq!(hooks.asked(), 1);
    assert!(tools.calls().is_empty());
}

/// The property the log format carries: at every I/O point of a turn whose
/// hook rewrote its call, under every crash mode, a reboot with hooks that
/// now DENY everything resumes a decided round with the logged, rewritten
/// call — the new hooks are never asked for it — while a round whose
/// decision never became durable is asked again (none of its calls ran),
/// and a completed round is history.
#[test]
fn a_resumed_round_applies_the_logged_verdict_and_never_asks_the_hooks_again() {
    let first = || Script::new(vec![vec![patch(json!({"to": "first@example.com"}))]]);
    // The I/O points of the turn, from a crash-free run.
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, &Arc::new(Recorder::default()), first());
    let a = rt.create_root("a", "").unwrap();
    let start = sim.points() + 1;
    rt.run_turn(&a, EMAIL).unwrap();
    let end = sim.points();
    drop(rt);
    let modes = [
        CrashMode::ProcessCrash,
        CrashMode::PowerLoss(DirModel::Strict),
        CrashMode::PowerLoss(DirModel::Eager),
    ];
    let (mut resumed_decided, mut asked_again) = (0, 0);
    for point in start..=end {
        for mode in modes {
            let sim = SimFs::new(SimConfig::new(8));
            let tools = Arc::new(Recorder::default());
            let mut rt = open(&sim, &tools, first());
            let a = rt.create_root("a", "").unwrap();
            sim.set_fault(Some(Fault::CrashAt(point)));
            if rt.run_turn(&a, EMAIL).is_ok() {
                continue; // the crash point was never reached
            }
            drop(rt);
            sim.restart(mode);
            let later = Script::new(vec![vec![deny("changed my mind")]]);
            let mut rt = open(&sim, &tools, later.clone());
            let Some(open_turn) = rt.open_turn(&a).unwrap().cloned() else {
                continue; // the turn completed durably, or never started
            };
            let outcome = rt.run_turn(&a, EMAIL).unwrap();
            let (_, request, output) = &outcome.tool_calls[0];
            match open_turn.decided {
                Some(decided) => {
                    resumed_decided += 1;
                    let logged = &decided[0];
                    assert_eq!(logged.args["to"], "first@example.com", "point {point} {mode:?}");
                    assert_eq!(
                        later.asked(),
                        0,
                        "point {point} {mode:?}: the hooks were asked again"
                    );
                    assert!(output.ok, "point {point} {mode:?}: {output:?}");
                    assert_eq!(request.args["to"], "first@example.com");
                    for (key, _, args) in tools.calls() {
                        assert_eq!(key, logged.idempotency_key, "point {point} {mode:?}");
                        assert_eq!(args["to"], "first@example.com");
                    }
                }
                // The round's checkpoint is durable: its call is history.
                None if open_turn.round > 0 => {
                    assert_eq!(later.asked(), 0, "point {point} {mode:?}");
                    assert!(
                        output.ok && request.args["to"] == "first@example.com",
                        "{output:?}"
                    );
                }
                None => {
                    asked_again += 1;
                    assert_eq!(later.asked(), 1, "point {point} {mode:?}");
                    assert!(!output.ok, "the new decision denies: {output:?}");
                    assert_eq!(
                        tools.calls().len(),
                        0,
                        "point {point} {mode:?}: a call ran undecided"
                    );
                }
            }
        }
    }
    assert!(
        resumed_decided > 0 && asked_again > 0,
        "{resumed_decided} {asked_again}"
    );
}

/// A runtime with no ledger to park a call in never runs a call a hook
/// wants confirmed: the turn stops at it, open.
#[test]
fn without_a_ledger_a_call_that_needs_confirmation_blocks() {
    let sim = SimFs::new(SimConfig::new(8));
    let tools = Arc::new(Recorder::default());
    let hooks = Script::new(vec![vec![HookDecision::RequireConfirmation {
        reason: "ask a human".into(),
    }]]);
    let mut rt = open(&sim, &tools, hooks);
    let a = rt.create_root("a", "").unwrap();
    let err = rt.run_turn(&a, EMAIL).unwrap_err();
    assert!(
        matches!(
            err,
            durable_agent::runtime::RuntimeError::NeedsConfirmation { .. }
        ),
        "{err}"
    );
    assert!(tools.calls().is_empty());
    assert!(rt.open_turn(&a).unwrap().is_some());
}
