//! Hooks and tool retries through `System::boot` on SimFs with the
//! stand-ins: a call a `require_confirmation` hook parks waits as
//! NEEDS_CONFIRMATION in the activity ledger — across reboots — until
//! `System::confirm` answers it (approved: it runs once; abandoned: never);
//! a hard tool failure is retried with the same call id and key, each
//! failed attempt a numbered ledger row; an irreversible call is retried
//! only through the activity ledger, so a deduplicating endpoint absorbs
//! the re-send and one that cannot deduplicate is never sent twice.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, FakeProvider, HookDecision, Hooks, PreToolUse, PureTools, RuntimeError, ToolContext, ToolError,
    ToolExecutor, ToolOutput, ToolRequest, ToolRetries,
};
use durable_agent::store::activities::ActivityStatus;
use durable_agent::store::tool_calls::{ToolCallStatus, ToolCallStore};
use durable_agent::system::{Deps, LogicalClock, Resolution, System, SystemConfig};
use durable_agent::world::{Scripted, World};

const SEED: u64 = 7;
/// FakeProvider answers it with one `send_email` (irreversible).
const EMAIL: &str = "please send_email to bob";
/// FakeProvider answers it with one `lookup` (reversible).
const LOOKUP: &str = "lookup the weather";

#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Every call is to wait for a human.
#[derive(Debug)]
struct Confirm;

impl Hooks for Confirm {
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision> {
        vec![HookDecision::RequireConfirmation {
            reason: format!("hook `ask`: {} needs a human", call.tool_name),
        }]
    }
}

/// Retries every hard failure up to `max` times; records the waits.
#[derive(Debug, Default)]
struct Retry {
    max: u32,
    waits: Mutex<Vec<u64>>,
}

impl ToolRetries for Retry {
    fn delay_before(&self, _call: &ToolRequest, next_attempt: u32) -> Option<u64> {
        (next_attempt <= self.max + 1).then(|| 10 * u64::from(next_attempt))
    }
    fn wait(&self, delay_ms: u64) {
        self.waits.lock().unwrap().push(delay_ms);
    }
}

/// Reversible tools that fail hard `failures` times, then answer; every
/// key they were called with, in order.
#[derive(Debug, Default)]
struct Flaky {
    failures: AtomicU32,
    keys: Mutex<Vec<String>>,
}

impl ToolExecutor for Flaky {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        self.keys.lock().unwrap().push(ctx.idempotency_key.to_string());
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(ToolError::Transient("HTTP 503 Service Unavailable".into()));
        }
        PureTools.execute(ctx, call)
    }
}

struct Bench {
    fs: SimFs,
    world: World,
    tools: Arc<dyn ToolExecutor>,
    hooks: Option<Arc<dyn Hooks>>,
    retries: Option<Arc<dyn ToolRetries>>,
}

impl Bench {
    fn new(world: World) -> Bench {
        Bench {
            fs: SimFs::new(SimConfig::new(SEED)),
            world,
            tools: Arc::new(PureTools),
            hooks: None,
            retries: None,
        }
    }

    fn boot(&self) -> System {
        let mut config = SystemConfig::new("/root", SEED);
        if let Some(h) = &self.hooks {
            config.hooks = h.clone();
        }
        if let Some(r) = &self.retries {
            config.tool_retries = r.clone();
        }
        let deps = Deps {
            provider: Arc::new(FakeProvider::new(SEED)),
            tools: self.tools.clone(),
            outbox: Arc::new(self.world.clone()),
            clock: Arc::new(Clock::default()),
        };
        System::boot(Arc::new(self.fs.clone()), config, deps)
            .expect("boot")
            .0
    }
}

fn blocked_key(err: RuntimeError) -> String {
    match err {
        RuntimeError::NeedsConfirmation { idem_key, .. } => idem_key,
        other => panic!("expected NeedsConfirmation, got {other}"),
    }
}

fn agent(system: &mut System) -> AgentId {
    system.runtime_mut().create_root("mailer", "").unwrap()
}

#[test]
fn a_parked_call_waits_across_reboots_and_runs_once_when_approved() {
    let mut bench = Bench::new(World::without_dedup());
    bench.hooks = Some(Arc::new(Confirm));
    let mut system = bench.boot();
    let a = agent(&mut system);
    let key = blocked_key(system.runtime_mut().run_turn(&a, EMAIL).unwrap_err());
    assert_eq!(bench.world.sends(), 0, "a parked call was sent");
    let waiting = system.needs_confirmation().unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].idem_key, key);
    assert!(
        waiting[0].error.as_deref().unwrap_or("").contains("hook `ask`"),
        "{waiting:?}"
    );
    // Still parked after a reboot, and asking again sends nothing.
    drop(system);
    let mut system = bench.boot();
    assert_eq!(
        blocked_key(system.runtime_mut().run_turn(&a, EMAIL).unwrap_err()),
        key
    );
    assert_eq!(bench.world.sends(), 0);
    // Approved: it runs once, under its key.
    system.confirm(&key, &Resolution::NotDelivered).unwrap();
    let outcome = system.runtime_mut().run_turn(&a, EMAIL).unwrap();
    assert!(outcome.tool_calls[0].2.ok, "{outcome:?}");
    assert_eq!(bench.world.deliveries_for(&key), 1);
    assert_eq!(bench.world.sends(), 1);
    let row = ToolCallStore::default()
        .by_key(system.db().conn(), &key)
        .unwrap()
        .unwrap();
    assert_eq!(row.status, ToolCallStatus::Succeeded);
}

#[test]
fn an_abandoned_or_hand_done_parked_call_never_runs() {
    for (resolution, ok) in [
        (Resolution::Abandon, false),
        (
            Resolution::Delivered {
                provider_ref: "by-hand-1".into(),
            },
            true,
        ),
    ] {
        for prompt in [EMAIL, LOOKUP] {
            let flaky = Arc::new(Flaky::default());
            let mut bench = Bench::new(World::without_dedup());
            bench.hooks = Some(Arc::new(Confirm));
            bench.tools = flaky.clone();
            let mut system = bench.boot();
            let a = agent(&mut system);
            let key = blocked_key(system.runtime_mut().run_turn(&a, prompt).unwrap_err());
            let status = system.confirm(&key, &resolution).unwrap().status;
            assert!(matches!(
                status,
                Some(ActivityStatus::Done | ActivityStatus::Failed)
            ));
            let outcome = system.runtime_mut().run_turn(&a, prompt).unwrap();
            let output = &outcome.tool_calls[0].2;
            assert_eq!(output.ok, ok, "{resolution:?} {prompt}: {output:?}");
            assert_eq!(bench.world.sends(), 0, "{resolution:?} {prompt}");
            assert!(flaky.keys.lock().unwrap().is_empty(), "{resolution:?} {prompt}");
        }
    }
}

#[test]
fn an_approved_reversible_call_runs_after_confirm() {
    let flaky = Arc::new(Flaky::default());
    let mut bench = Bench::new(World::without_dedup());
    bench.hooks = Some(Arc::new(Confirm));
    bench.tools = flaky.clone();
    let mut system = bench.boot();
    let a = agent(&mut system);
    let key = blocked_key(system.runtime_mut().run_turn(&a, LOOKUP).unwrap_err());
    assert!(flaky.keys.lock().unwrap().is_empty());
    system.confirm(&key, &Resolution::NotDelivered).unwrap();
    let outcome = system.runtime_mut().run_turn(&a, LOOKUP).unwrap();
    assert!(outcome.tool_calls[0].2.ok);
    assert_eq!(*flaky.keys.lock().unwrap(), [key]);
}

/// A reversible tool whose every run kills the process (the executor
/// errs and nothing after it runs), counting its runs.
#[derive(Debug, Default)]
struct Deadly(AtomicU32);

impl ToolExecutor for Deadly {
    fn execute(&self, _ctx: &ToolContext<'_>, _call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::Failed("the process died inside the tool".into()))
    }
}

/// An approved call's runs are counted like replays: a tool that brings
/// the process down runs `max_replays` times, then the next ask is
/// refused and the run waits for a human. Before, each boot ran it again
/// with nothing counted (found by a review).
#[test]
fn an_approved_call_that_kills_every_process_is_run_at_most_max_replays_times() {
    let deadly = Arc::new(Deadly::default());
    let mut bench = Bench::new(World::without_dedup());
    bench.hooks = Some(Arc::new(Confirm));
    bench.tools = deadly.clone();
    let mut system = bench.boot();
    let a = agent(&mut system);
    let key = blocked_key(system.runtime_mut().run_turn(&a, LOOKUP).unwrap_err());
    system.confirm(&key, &Resolution::NotDelivered).unwrap();
    let max = ToolCallStore::default().max_replays;
    let mut answered = None;
    for _ in 0..=(max + 3) {
        match system.runtime_mut().run_turn(&a, LOOKUP) {
            Ok(outcome) => {
                answered = Some(outcome);
                break;
            }
            Err(_) => {
                drop(system);
                system = bench.boot();
            }
        }
    }
    assert_eq!(deadly.0.load(Ordering::SeqCst), max, "runs after the approval");
    let outcome = answered.expect("answered once refused");
    assert!(!outcome.tool_calls[0].2.ok, "{outcome:?}");
    assert!(
        outcome.tool_calls[0].2.output.contains("waits for a human"),
        "{outcome:?}"
    );
    assert_eq!(system.waiting_for_human().unwrap().len(), 1);
}

#[test]
fn a_hard_failure_is_retried_with_the_same_key_and_each_attempt_recorded() {
    let flaky = Arc::new(Flaky::default());
    flaky.failures.store(2, Ordering::SeqCst);
    let retry = Arc::new(Retry {
        max: 2,
        ..Retry::default()
    });
    let mut bench = Bench::new(World::without_dedup());
    bench.tools = flaky.clone();
    bench.retries = Some(retry.clone());
    let mut system = bench.boot();
    let a = agent(&mut system);
    let outcome = system.runtime_mut().run_turn(&a, LOOKUP).unwrap();
    let (call_id, _, output) = &outcome.tool_calls[0];
    assert!(output.ok, "{output:?}");
    let keys = flaky.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "a retry changed the key: {keys:?}"
    );
    let store = ToolCallStore::default();
    let attempts = store.attempts(system.db().conn(), call_id).unwrap();
    let numbers: Vec<u32> = attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2]);
    assert!(attempts[0].error.contains("503"));
    assert_eq!(*retry.waits.lock().unwrap(), [20, 30]);
    let row = store.get(system.db().conn(), call_id).unwrap().unwrap();
    assert_eq!(row.status, ToolCallStatus::Succeeded);

    // Out of retries: the last failure is the model's to read.
    flaky.failures.store(5, Ordering::SeqCst);
    let outcome = system.runtime_mut().run_turn(&a, LOOKUP).unwrap();
    let (call_id, _, output) = &outcome.tool_calls[0];
    assert!(
        !output.ok && output.output.contains("failed 3 time(s)"),
        "{output:?}"
    );
    assert_eq!(store.attempts(system.db().conn(), call_id).unwrap().len(), 3);
}

#[test]
fn an_irreversible_retry_goes_through_the_ledger_with_the_same_key() {
    // Deduplicating endpoint: the lost reply is re-sent under the same
    // key and absorbed; one delivery.
    let world = World::with_dedup();
    world.script([Scripted::DeliverLoseReply]);
    let mut bench = Bench::new(world);
    bench.retries = Some(Arc::new(Retry {
        max: 1,
        ..Retry::default()
    }));
    let mut system = bench.boot();
    let a = agent(&mut system);
    let outcome = system.runtime_mut().run_turn(&a, EMAIL).unwrap();
    let (call_id, _, output) = &outcome.tool_calls[0];
    assert!(output.ok, "{output:?}");
    assert_eq!((bench.world.sends(), bench.world.deliveries_len()), (2, 1));
    let attempts = ToolCallStore::default()
        .attempts(system.db().conn(), call_id)
        .unwrap();
    assert_eq!(attempts.len(), 1);

    // An endpoint that cannot deduplicate (a retry plan that forgot it):
    // the ledger turns the re-send into NEEDS_CONFIRMATION — sent once.
    let world = World::without_dedup();
    world.script([Scripted::DeliverLoseReply]);
    let mut bench = Bench::new(world);
    bench.retries = Some(Arc::new(Retry {
        max: 3,
        ..Retry::default()
    }));
    let mut system = bench.boot();
    let a = agent(&mut system);
    let key = blocked_key(system.runtime_mut().run_turn(&a, EMAIL).unwrap_err());
    assert_eq!((bench.world.sends(), bench.world.deliveries_for(&key)), (1, 1));
}

#[test]
fn without_retries_an_irreversible_lost_reply_stays_unknown() {
    let world = World::with_dedup();
    world.script([Scripted::DeliverLoseReply]);
    let bench = Bench::new(world);
    let mut system = bench.boot();
    let a = agent(&mut system);
    let err = system.runtime_mut().run_turn(&a, EMAIL).unwrap_err();
    assert!(err.is_unknown_outcome(), "{err}");
    assert_eq!(bench.world.sends(), 1);
}
