//! The orchestration tools under a crash at every I/O point: a boss spawns
//! two children and messages them in one turn, each child answers its
//! parent, the boss reads the answers — driven the way `serve` drives it
//! (one work per pending message, reading that message). Crashed at any
//! point under every crash mode, then recovered and driven to the end, the
//! root holds each child once, each message once, and every message read.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use crate::log::{parse_log, Event};
use crate::runtime::{
    AgentId, ConversationItem, Orchestration, Provider, ProviderError, ProviderReply, ProviderRequest,
    Runtime, RuntimeConfig, RuntimeError, Started, ToolRequest, TurnKind,
};

const ROOT: &str = "/data";
const BOSS: &str = "You run the team.";
const CHILD: &str = "You do one task and report to your parent.";
const SEED: u64 = 7;

/// The model: a pure function of the request, so a re-asked round gets
/// the same answer (the runtime must not depend on that: see the sweep).
#[derive(Debug)]
struct Script;

fn call(tool: &str, args: Value) -> ToolRequest {
    ToolRequest {
        tool: tool.into(),
        args,
        irreversible: false,
        invalid_args: None,
    }
}

impl Provider for Script {
    fn name(&self) -> &str {
        "script"
    }
    fn model(&self) -> &str {
        "script-1"
    }
    fn complete(&self, r: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        let prompt = r
            .history
            .iter()
            .rev()
            .find_map(|i| match i {
                ConversationItem::Prompt { text } => Some(text.as_str()),
                _ => None,
            })
            .unwrap_or("");
        let tool_calls = match (r.round, r.instructions) {
            (0, BOSS) if prompt == "go" => vec![
                call("spawn_agent", json!({"name": "a", "instructions": CHILD})),
                call("spawn_agent", json!({"name": "b", "instructions": CHILD})),
                call("send_message", json!({"to": "a", "payload": "task a"})),
                call("send_message", json!({"to": "b", "payload": "task b"})),
            ],
            (0, CHILD) => {
                let task = prompt.rsplit(':').next().unwrap_or("").trim();
                vec![call(
                    "send_message",
                    json!({"to": "parent", "payload": format!("answer to {task}")}),
                )]
            }
            _ => Vec::new(),
        };
        Ok(ProviderReply {
            text: if tool_calls.is_empty() {
                "done".into()
            } else {
                String::new()
            },
            tool_calls,
            usage: None,
        })
    }
}

fn open(sim: &SimFs) -> Result<Runtime, RuntimeError> {
    let mut config = RuntimeConfig::new(SEED).with_slots(2);
    config.provider = Arc::new(Script);
    config.orchestration = Some(Orchestration::all());
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    Runtime::open(fs, Path::new(ROOT), config).map(|(rt, _)| rt)
}

fn find(rt: &Runtime, name: &str) -> Option<AgentId> {
    rt.tree()
        .nodes()
        .iter()
        .find(|(_, n)| n.name == name)
        .map(|(id, _)| id.clone())
}

fn run_work(rt: &mut Runtime, agent: &AgentId, prompt: &str, kind: TurnKind<'_>) -> Result<(), RuntimeError> {
    if let Started::Running(task, step) = rt.start_turn(agent, prompt, kind)? {
        rt.drive(task, step)?;
    }
    Ok(())
}

/// Drive the exchange to its end as `serve` would: the boss's job, then
/// every unfinished work, then one work per pending message.
fn drive(rt: &mut Runtime) -> Result<(), RuntimeError> {
    let boss = match find(rt, "boss") {
        Some(b) => b,
        None => rt.create_root("boss", BOSS)?,
    };
    run_work(rt, &boss, "go", TurnKind::Work("job:go"))?;
    for _ in 0..16 {
        let agents: Vec<AgentId> = rt.tree().nodes().keys().cloned().collect();
        let mut ran = false;
        for agent in agents {
            let unfinished: Vec<(String, String)> = rt
                .unfinished_work(&agent)?
                .into_iter()
                .map(|(w, p)| (w.to_string(), p.to_string()))
                .collect();
            for (work, prompt) in unfinished {
                run_work(rt, &agent, &prompt, TurnKind::Work(&work))?;
                ran = true;
            }
            let pending = rt.pending(&agent).to_vec();
            for m in pending {
                let work = format!("trigger:wake:{}", m.id);
                let prompt = format!("Message {}: {}", m.id, m.payload);
                run_work(
                    rt,
                    &agent,
                    &prompt,
                    TurnKind::WorkReading(&work, std::slice::from_ref(&m.id)),
                )?;
                ran = true;
            }
        }
        if !ran {
            return Ok(());
        }
    }
    Err(RuntimeError::Recovery("the exchange did not settle".into()))
}

/// Every `agent.created` and `message.enqueued` on disk, from every
/// session's log (terminated and orphaned ones included).
fn on_disk(sim: &SimFs) -> (Vec<String>, Vec<String>) {
    let agents_dir = Path::new(ROOT).join("agents");
    let (mut created, mut messages) = (Vec::new(), Vec::new());
    for name in sim.list(&agents_dir, "test list").unwrap_or_default() {
        let parsed = parse_log(sim, &agents_dir.join(&name), None).expect("a recovered log parses");
        for e in parsed.entries {
            match e.event {
                Event::AgentCreated { name, .. } => created.push(name),
                Event::MessageEnqueued { payload, .. } => messages.push(payload),
                _ => {}
            }
        }
    }
    created.sort();
    messages.sort();
    (created, messages)
}

/// The end state every run must reach, whatever crashed on the way.
fn check_end(sim: &SimFs, rt: &Runtime) -> Result<(), String> {
    let (created, messages) = on_disk(sim);
    if created != ["a", "b", "boss"] {
        return Err(format!("agents created (each must be once): {created:?}"));
    }
    let expected = ["answer to task a", "answer to task b", "task a", "task b"];
    if messages != expected {
        return Err(format!("messages enqueued (each must be once): {messages:?}"));
    }
    let boss = find(rt, "boss").ok_or("no boss")?;
    let node = rt.tree().get(&boss).ok_or("no boss node")?;
    let children: Vec<&str> = node
        .children
        .iter()
        .filter_map(|c| rt.tree().get(c).map(|n| n.name.as_str()))
        .collect();
    if children.len() != 2 || !children.contains(&"a") || !children.contains(&"b") {
        return Err(format!("the boss's children: {children:?}"));
    }
    for agent in rt.tree().nodes().keys() {
        if !rt.pending(agent).is_empty() {
            return Err(format!(
                "agent {agent} has unread messages: {:?}",
                rt.pending(agent)
            ));
        }
    }
    let violations = rt.check_invariants();
    if !violations.is_empty() {
        return Err(format!("invariants: {violations:?}"));
    }
    Ok(())
}

#[test]
fn the_exchange_without_a_crash_creates_each_child_once_and_delivers_every_message() {
    let sim = SimFs::new(SimConfig::new(SEED));
    let mut rt = open(&sim).expect("open");
    drive(&mut rt).expect("drive");
    check_end(&sim, &rt).expect("end state");
    // A clean restart changes nothing and finds nothing missing.
    drop(rt);
    let mut rt = open(&sim).expect("reopen");
    drive(&mut rt).expect("drive again");
    check_end(&sim, &rt).expect("end state after a restart");
}

#[test]
fn a_spawn_is_created_only_when_its_turn_completes() {
    let sim = SimFs::new(SimConfig::new(SEED));
    let mut rt = open(&sim).expect("open");
    let boss = rt.create_root("boss", BOSS).expect("boss");
    let Started::Running(mut task, mut step) = rt
        .start_turn(&boss, "go", TurnKind::Work("job:go"))
        .expect("start")
    else {
        panic!("the turn did not start");
    };
    let outside = rt.outside();
    while let crate::runtime::TurnStep::Call(call) = step {
        // Before the turn's end, no child exists (seed 002's deferral).
        assert_eq!(
            rt.tree().nodes().len(),
            1,
            "a child exists before its parent's turn ended"
        );
        step = rt.continue_turn(&mut task, outside.perform(&call)).expect("step");
    }
    assert_eq!(
        rt.tree().nodes().len(),
        3,
        "the children exist once the turn completed"
    );
    assert_eq!(rt.pending(&find(&rt, "a").expect("a")).len(), 1);
}

#[test]
fn limits_and_grants_answer_a_failed_call_and_create_nothing() {
    let sim = SimFs::new(SimConfig::new(SEED));
    let mut config = RuntimeConfig::new(SEED);
    config.provider = Arc::new(Script);
    let mut policy = Orchestration::all();
    policy.max_children = 1;
    policy.grants.insert(
        "boss".into(),
        [crate::runtime::OrchestrationTool::SpawnAgent].into(),
    );
    config.orchestration = Some(policy);
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let (mut rt, _) = Runtime::open(fs, Path::new(ROOT), config).expect("open");
    let boss = rt.create_root("boss", BOSS).expect("boss");
    let outcome = rt.run_turn(&boss, "go").expect("turn");
    let results: Vec<(bool, &str)> = outcome
        .tool_calls
        .iter()
        .map(|(_, _, o)| (o.ok, o.output.as_str()))
        .collect();
    assert!(results[0].0, "{results:?}");
    assert!(
        !results[1].0 && results[1].1.contains("orchestration.max_children"),
        "{results:?}"
    );
    assert!(
        !results[2].0 && results[2].1.contains("not granted"),
        "{results:?}"
    );
    assert_eq!(rt.tree().nodes().len(), 2, "one child, not two");
}

/// Crash at every I/O point of the exchange under every crash mode, then
/// recover and drive it to the end.
#[test]
fn a_crash_at_any_point_loses_no_acknowledged_message_and_creates_no_child_twice() {
    let dry = SimFs::new(SimConfig::new(SEED));
    let mut rt = open(&dry).expect("open");
    drive(&mut rt).expect("dry run");
    drop(rt);
    let points = dry.points();
    assert!(points > 50, "the dry run did {points} I/O points");
    let modes = [
        CrashMode::ProcessCrash,
        CrashMode::PowerLoss(DirModel::Strict),
        CrashMode::PowerLoss(DirModel::Eager),
    ];
    for mode in modes {
        for point in 1..=points {
            let sim = SimFs::new(SimConfig::new(SEED ^ point));
            sim.set_fault(Some(Fault::CrashAt(point)));
            let crashed = open(&sim).and_then(|mut rt| drive(&mut rt));
            assert!(
                crashed.is_err() || !sim.crashed(),
                "point {point}: the run succeeded past its crash"
            );
            sim.restart(mode);
            let mut rt = open(&sim).unwrap_or_else(|e| panic!("{mode:?} point {point}: recovery: {e}"));
            drive(&mut rt).unwrap_or_else(|e| panic!("{mode:?} point {point}: drive after recovery: {e}"));
            if let Err(e) = check_end(&sim, &rt) {
                panic!("{mode:?} crash at point {point}: {e}");
            }
        }
    }
}
