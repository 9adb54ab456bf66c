//! Tool execution goes through the `ToolExecutor` seam, and the
//! idempotency key it gets is stable for a turn retried after a crash (so a
//! dedup-capable ledger performs an irreversible side effect at most once)
//! and different for a different call.

use std::path::Path;
use std::sync::{Arc, Mutex};

use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    Runtime, RuntimeConfig, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest,
};

/// Records (idempotency key, irreversible) of every call; survives crashes
/// like the external world does.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<(String, bool)>>);

impl ToolExecutor for Recorder {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let mut calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        calls.push((ctx.idempotency_key.to_string(), call.irreversible));
        Ok(ToolOutput {
            ok: true,
            output: "done".into(),
        })
    }
}

fn open(sim: &SimFs, tools: &Arc<Recorder>) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut config = RuntimeConfig::new(8);
    config.tools = tools.clone();
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

/// The I/O point of `label` in the first turn after create.
fn point_of(prompt: &str, label: &str) -> u64 {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, &Arc::new(Recorder::default()));
    let a = rt.create_root("a", "").unwrap();
    let start = sim.points();
    rt.run_turn(&a, prompt).unwrap();
    sim.trace()
        .iter()
        .find(|t| t.point > start && t.label == label)
        .unwrap()
        .point
}

#[test]
fn a_turn_retried_after_a_crash_reuses_the_idempotency_key_of_its_tool_call() {
    let prompt = "send_email to bob";
    // The call ran; its result did not make it to the log: the retried
    // turn runs the call of its durable decision again, with its key.
    let point = point_of(prompt, "events.pending create tool.result");
    for mode in [CrashMode::ProcessCrash, CrashMode::PowerLoss(DirModel::Strict)] {
        let sim = SimFs::new(SimConfig::new(8));
        let tools = Arc::new(Recorder::default());
        let mut rt = open(&sim, &tools);
        let a = rt.create_root("a", "").unwrap();
        sim.set_fault(Some(Fault::CrashAt(point)));
        assert!(rt.run_turn(&a, prompt).is_err());
        drop(rt);
        sim.restart(mode);
        let first = tools.0.lock().unwrap().clone();
        assert_eq!(first.len(), 1, "the side effect ran before the crash");
        assert!(first[0].1, "send_email is irreversible");

        let mut rt = open(&sim, &tools);
        assert!(rt.state().conversations[&a].is_empty(), "the lost turn is gone");
        rt.run_turn(&a, prompt).unwrap();
        let calls = tools.0.lock().unwrap().clone();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].0, calls[0].0, "{mode:?}: the retried turn got a new key");
        let ran = calls.len();

        // The next turn asking for the same call is a new turn: a new key.
        rt.run_turn(&a, prompt).unwrap();
        let calls = tools.0.lock().unwrap().clone();
        assert_eq!(calls.len(), ran + 1);
        assert_ne!(calls[ran].0, calls[ran - 1].0);
    }
}

#[test]
fn a_call_whose_result_is_logged_is_not_run_again_when_its_round_resumes() {
    let prompt = "send_email to bob";
    // The call's result is durable; the round's checkpoint is not.
    let point = point_of(prompt, "events.pending create round.complete");
    for mode in [CrashMode::ProcessCrash, CrashMode::PowerLoss(DirModel::Strict)] {
        let sim = SimFs::new(SimConfig::new(8));
        let tools = Arc::new(Recorder::default());
        let mut rt = open(&sim, &tools);
        let a = rt.create_root("a", "").unwrap();
        sim.set_fault(Some(Fault::CrashAt(point)));
        assert!(rt.run_turn(&a, prompt).is_err());
        drop(rt);
        sim.restart(mode);
        let mut rt = open(&sim, &tools);
        let open_turn = rt.open_turn(&a).unwrap().cloned().expect("an open turn");
        assert!(open_turn.decided.is_some(), "{mode:?}: the decision was durable");
        let outcome = rt.run_turn(&a, prompt).unwrap();
        assert_eq!(tools.0.lock().unwrap().len(), 1, "{mode:?}: the call ran again");
        assert_eq!(outcome.tool_calls.len(), 1, "{mode:?}: the answer lost the call");
    }
}

#[test]
fn a_turn_crashed_after_its_round_checkpoint_resumes_without_running_the_call_again() {
    let prompt = "send_email to bob";
    let point = point_of(prompt, "events.pending create turn.complete");
    for mode in [CrashMode::ProcessCrash, CrashMode::PowerLoss(DirModel::Strict)] {
        let sim = SimFs::new(SimConfig::new(8));
        let tools = Arc::new(Recorder::default());
        let mut rt = open(&sim, &tools);
        let a = rt.create_root("a", "").unwrap();
        sim.set_fault(Some(Fault::CrashAt(point)));
        assert!(rt.run_turn(&a, prompt).is_err());
        drop(rt);
        sim.restart(mode);
        let mut rt = open(&sim, &tools);
        assert!(
            rt.state().conversations[&a].is_empty(),
            "the turn is not complete"
        );
        let outcome = rt.run_turn(&a, prompt).unwrap();
        assert_eq!(
            tools.0.lock().unwrap().len(),
            1,
            "{mode:?}: a completed round's call ran again"
        );
        assert_eq!(
            outcome.tool_calls.len(),
            1,
            "the resumed turn reports the logged call"
        );
        assert!(outcome.tool_calls[0].2.ok);
    }
}
