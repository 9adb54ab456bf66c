//! The operator's API on a booted [`System`] (seed 001 §9 phase 5), through
//! `System::boot` on SimFs with the stand-ins: a DEAD trigger a human
//! retries runs again; a NEEDS_CONFIRMATION action confirmed `Delivered` is
//! never sent again, `NotDelivered` is sent exactly once on the re-run,
//! `Abandon` never; runs parked `waiting_for_human` are listed; `gc` after
//! the TTL collects settled rows and keeps what recovery and humans need.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest, PureTools, RuntimeError,
    WorkTurn,
};
use durable_agent::store::activities::{ActivityOutcome, ActivityStatus, IrreversibleCall};
use durable_agent::store::tool_calls::{
    NewToolCall, ReplayOf, ReplayStart, RunStatus, SideEffect, ToolCallStore,
};
use durable_agent::store::triggers::{EmitOutcome, TriggerPolicy, TriggerSource, TriggerSpec, TriggerStatus};
use durable_agent::store::StoreError;
use durable_agent::system::{
    resume_key, Deps, Fired, LogicalClock, Resolution, System, SystemConfig, SystemError, DEFAULT_GC_TTL_MS,
};
use durable_agent::world::{Scripted, World};
use serde_json::json;

const SEED: u64 = 7;
/// A prompt FakeProvider answers with one `send_email` (irreversible).
const EMAIL: &str = "please send_email to bob";

/// A clock the test moves.
#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl Clock {
    fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// FakeProvider that fails every call while `down` is set, and — like a
/// real model — never words a tool call the same way twice (each ask's
/// arguments name the ask), so a call asked for again gets another
/// idempotency key: only the durable decision keeps a call's key.
#[derive(Debug)]
struct Flaky {
    inner: FakeProvider,
    down: Mutex<bool>,
    asks: AtomicU64,
}

impl Flaky {
    fn set_down(&self, down: bool) {
        *self.down.lock().unwrap_or_else(|e| e.into_inner()) = down;
    }
}

impl Provider for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    fn model(&self) -> &str {
        "flaky-1"
    }
    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        if *self.down.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(ProviderError("provider down".into()));
        }
        let ask = self.asks.fetch_add(1, Ordering::SeqCst);
        let mut reply = self.inner.complete(request)?;
        for call in &mut reply.tool_calls {
            if let Some(args) = call.args.as_object_mut() {
                args.insert("wording".into(), json!(format!("ask {ask}")));
            }
        }
        Ok(reply)
    }
}

/// One root on one SimFs, rebooted at will; the world and clock outlive
/// every boot, as the outside world does.
struct Bench {
    fs: SimFs,
    world: World,
    clock: Arc<Clock>,
    provider: Arc<Flaky>,
    policy: TriggerPolicy,
}

impl Bench {
    fn new(world: World) -> Self {
        Bench {
            fs: SimFs::new(SimConfig::new(SEED)),
            world,
            clock: Arc::new(Clock::default()),
            provider: Arc::new(Flaky {
                inner: FakeProvider::new(SEED),
                down: Mutex::new(false),
                asks: AtomicU64::new(0),
            }),
            policy: TriggerPolicy::default(),
        }
    }

    fn boot(&self) -> System {
        let mut config = SystemConfig::new("/root", SEED);
        config.trigger_policy = self.policy;
        let deps = Deps {
            provider: self.provider.clone(),
            tools: Arc::new(PureTools),
            outbox: Arc::new(self.world.clone()),
            clock: self.clock.clone(),
        };
        System::boot(Arc::new(self.fs.clone()), config, deps)
            .expect("boot")
            .0
    }
}

fn spec(key: &str, fire_at_ms: u64) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(key.to_string()),
        session_id: None,
        fire_at_ms,
        priority: 0,
        description: key.to_string(),
        payload: json!({}),
    }
}

fn emit(system: &System, key: &str, fire_at_ms: u64) -> EmitOutcome {
    let now = system.now_ms();
    system
        .triggers()
        .emit(system.db().conn(), &spec(key, fire_at_ms), now)
        .expect("emit")
}

fn wrong_state(e: SystemError) -> String {
    match e {
        SystemError::Store(StoreError::WrongState { actual, .. }) => actual,
        other => panic!("expected WrongState, got {other}"),
    }
}

#[test]
fn a_dead_trigger_retried_by_a_human_runs_again() {
    let mut bench = Bench::new(World::without_dedup());
    bench.policy.max_attempts = 1;
    let mut system = bench.boot();
    let agent = system.runtime_mut().create_root("a", "work").expect("agent");
    let id = emit(&system, "scheduled-once:report", 0).id().to_string();
    // Its one attempt fails (the provider is down): dead-lettered.
    let claim = {
        let db = system.db();
        system
            .triggers()
            .claim(db.conn(), 0, 60_000)
            .expect("claim")
            .expect("due")
    };
    bench.provider.set_down(true);
    let failed = system.fire(&claim, &agent, "write the report");
    assert!(
        matches!(failed, Err(SystemError::Runtime(RuntimeError::Provider { .. }))),
        "{failed:?}"
    );
    let status = {
        let db = system.db();
        system
            .triggers()
            .ack_failed(db.conn(), &claim, 1, "provider down", true)
            .expect("ack")
    };
    assert_eq!(status, TriggerStatus::Dead);

    let dead = system.dead_triggers().expect("dead");
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id.as_str(), dead[0].attempts), (id.as_str(), 1));
    assert_eq!(dead[0].last_error.as_deref(), Some("provider down"));
    assert!(system.failed_triggers().expect("failed").is_empty());

    // The human retries it; the restart in between changes nothing.
    drop(system);
    let mut system = bench.boot();
    bench.provider.set_down(false);
    let retried = system.retry_trigger(&id).expect("retry");
    assert_eq!((retried.status, retried.attempts), (TriggerStatus::Pending, 0));
    assert_eq!(wrong_state(system.retry_trigger(&id).unwrap_err()), "PENDING");
    assert!(system.dead_triggers().expect("dead").is_empty());

    let claim = {
        let db = system.db();
        system
            .triggers()
            .claim(db.conn(), 2, 60_000)
            .expect("claim")
            .expect("due again")
    };
    assert_eq!((claim.id.as_str(), claim.attempts), (id.as_str(), 1));
    assert!(matches!(
        system.fire(&claim, &agent, "write the report"),
        Ok(Fired::Ran { .. })
    ));
    assert_eq!(wrong_state(system.retry_trigger(&id).unwrap_err()), "DONE");
    assert!(matches!(
        system.retry_trigger("trg-404"),
        Err(SystemError::Store(StoreError::NotFound { .. }))
    ));
}

#[test]
fn a_permanently_failed_trigger_is_listed_and_can_be_retried() {
    let bench = Bench::new(World::without_dedup());
    let system = bench.boot();
    let id = emit(&system, "living_ui:p:build", 0).id().to_string();
    {
        let db = system.db();
        let claim = system
            .triggers()
            .claim(db.conn(), 0, 60_000)
            .expect("claim")
            .expect("due");
        system
            .triggers()
            .ack_failed(db.conn(), &claim, 1, "bad payload", false)
            .expect("ack");
    }
    let failed = system.failed_triggers().expect("failed");
    assert_eq!(
        failed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert_eq!(failed[0].last_error.as_deref(), Some("bad payload"));
    assert_eq!(
        system.retry_trigger(&id).expect("retry").status,
        TriggerStatus::Pending
    );
}

/// Run `EMAIL` as work `job` on a fresh agent with the world answering the
/// send with `answer`: the reply is lost, the runtime poisons itself, and
/// the reboot's recovery turns the INTENT into NEEDS_CONFIRMATION (the
/// world cannot deduplicate). Returns the rebooted system, the agent and
/// the action's key.
fn leave_needs_confirmation(bench: &Bench, answer: Scripted, job: &str) -> (System, AgentId, String) {
    let mut system = bench.boot();
    let agent = system
        .runtime_mut()
        .create_root("mailer", "send mail")
        .expect("agent");
    bench.world.script([answer]);
    let lost = system.runtime_mut().run_work_turn(&agent, EMAIL, job);
    assert!(matches!(lost, Err(RuntimeError::Tool { .. })), "{lost:?}");
    drop(system);
    let system = bench.boot();
    let waiting = system.needs_confirmation().expect("list");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].action, "send_email");
    assert_eq!(waiting[0].status, ActivityStatus::NeedsConfirmation);
    assert!(waiting[0].payload.get("to").is_some(), "{:?}", waiting[0].payload);
    let key = waiting[0].idem_key.clone();
    (system, agent, key)
}

#[test]
fn confirmed_delivered_is_answered_from_the_ledger_and_never_sent_again() {
    let bench = Bench::new(World::without_dedup());
    let (mut system, agent, key) = leave_needs_confirmation(&bench, Scripted::DeliverLoseReply, "job:1");
    assert_eq!(bench.world.deliveries_for(&key), 1, "delivered, reply lost");

    let done = system.confirm(
        &key,
        &Resolution::Delivered {
            provider_ref: "msg-42".into(),
        },
    );
    assert_eq!(done.expect("confirm").status, Some(ActivityStatus::Done));
    assert!(system.needs_confirmation().expect("list").is_empty());
    assert_eq!(
        wrong_state(system.confirm(&key, &Resolution::NotDelivered).unwrap_err()),
        "DONE",
        "a settled key cannot be released"
    );

    // The interrupted turn runs again: the same call, the same key.
    let WorkTurn::Ran(outcome) = system
        .runtime_mut()
        .run_work_turn(&agent, EMAIL, "job:1")
        .expect("re-run")
    else {
        panic!("the lost turn had not completed");
    };
    assert!(
        outcome.tool_calls.iter().any(|c| c.2.output.contains("msg-42")),
        "{outcome:?}"
    );
    assert_eq!(
        bench.world.deliveries_for(&key),
        1,
        "re-sent after confirmed delivered"
    );
}

#[test]
fn confirmed_not_delivered_is_sent_exactly_once_on_the_rerun() {
    let bench = Bench::new(World::without_dedup());
    let (mut system, agent, key) = leave_needs_confirmation(&bench, Scripted::DropSilently, "job:2");
    assert_eq!(bench.world.deliveries_for(&key), 0, "dropped: never delivered");

    assert_eq!(
        system
            .confirm(&key, &Resolution::NotDelivered)
            .expect("confirm")
            .status,
        None
    );
    assert!(system.needs_confirmation().expect("list").is_empty());
    assert!(matches!(
        system.confirm(&key, &Resolution::NotDelivered),
        Err(SystemError::Store(StoreError::NotFound { .. }))
    ));

    let rerun = system
        .runtime_mut()
        .run_work_turn(&agent, EMAIL, "job:2")
        .expect("re-run");
    assert!(matches!(rerun, WorkTurn::Ran(_)));
    assert_eq!(bench.world.deliveries_for(&key), 1, "sent once after release");
    // Sent with its decided key, not as a reworded call under another.
    assert_eq!(bench.world.deliveries_len(), 1, "{:?}", bench.world.deliveries());
    // Any later run of the same key is answered from the ledger.
    let again = system
        .runtime_mut()
        .run_work_turn(&agent, EMAIL, "job:2")
        .expect("again");
    assert_eq!(again, WorkTurn::AlreadyDone);
    // The done work's stored answer: its response and its one call.
    let stored = system
        .runtime()
        .work_outcome(&agent, "job:2")
        .expect("agent")
        .expect("a stored answer");
    let WorkTurn::Ran(ran) = rerun else { unreachable!() };
    assert_eq!(stored, ran, "the stored answer is what the turn returned");
    assert_eq!(stored.tool_calls.len(), 1, "{stored:?}");
    let call = IrreversibleCall::with_key(&key, agent.as_str(), "send_email", json!({}));
    let direct = system.gate().execute(&call, system.now_ms()).expect("execute");
    assert!(
        matches!(
            direct,
            ActivityOutcome::Done {
                from_ledger: true,
                ..
            }
        ),
        "{direct:?}"
    );
    drop(system);
    let system = bench.boot();
    assert!(system.needs_confirmation().expect("list").is_empty());
    assert_eq!(bench.world.deliveries_for(&key), 1);
}

#[test]
fn abandoned_is_failed_and_never_sent() {
    let bench = Bench::new(World::without_dedup());
    let (mut system, agent, key) = leave_needs_confirmation(&bench, Scripted::DropSilently, "job:3");
    assert_eq!(
        system
            .confirm(&key, &Resolution::Abandon)
            .expect("confirm")
            .status,
        Some(ActivityStatus::Failed)
    );
    let WorkTurn::Ran(outcome) = system
        .runtime_mut()
        .run_work_turn(&agent, EMAIL, "job:3")
        .expect("re-run")
    else {
        panic!("the lost turn had not completed");
    };
    assert!(outcome.tool_calls.iter().all(|c| !c.2.ok), "{outcome:?}");
    assert_eq!(bench.world.deliveries_for(&key), 0);
    assert_eq!(bench.world.deliveries_len(), 0);
}

#[test]
fn runs_parked_waiting_for_human_are_listed_with_their_stuck_calls() {
    let bench = Bench::new(World::without_dedup());
    let system = bench.boot();
    let store = ToolCallStore { max_replays: 1 };
    let call = NewToolCall {
        id: "call-1".into(),
        run_id: "session:s2".into(),
        tool_name: "charge".into(),
        raw_tool_name: "charge".into(),
        input: json!({ "amount": 5 }),
        idempotency_key: "run-stuck-c1".into(),
        side_effect: SideEffect::Irreversible,
    };
    {
        let db = system.db();
        store.create_run(db.conn(), "session:s1", "s1", 0).expect("run");
        store.create_run(db.conn(), "session:s2", "s2", 1).expect("run");
        store.prepare(db.conn(), &call, 1).expect("prepare");
        // One replay began and never answered; the next ask parks the run.
        let first = store
            .begin_replay(db.conn(), "call-1", ReplayOf::Crash, 2)
            .expect("replay");
        assert_eq!(first, ReplayStart::Started { replay_attempts: 1 });
        let parked = store
            .begin_replay(db.conn(), "call-1", ReplayOf::Crash, 3)
            .expect("replay");
        assert_eq!(parked, ReplayStart::Parked { replay_attempts: 1 });
    }
    let waiting = system.waiting_for_human().expect("list");
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].run.run_id, "session:s2");
    assert_eq!(waiting[0].stuck.len(), 1);
    assert_eq!(waiting[0].stuck[0].replay_attempts, 1);

    // The human fixed the cause and releases it: running again, its
    // stuck call's replay count restarted (a full set of replays ahead).
    let released = system.release_run("session:s2").expect("release");
    assert_eq!(released.status, RunStatus::Running);
    assert!(system.waiting_for_human().expect("list").is_empty());
    {
        let db = system.db();
        let call = store.get(db.conn(), "call-1").expect("get").expect("call");
        assert_eq!(call.replay_attempts, 0);
        // (The system's ledger allows 3 replays: the count starts over.)
        let again = ToolCallStore::default()
            .begin_replay(db.conn(), "call-1", ReplayOf::Crash, 4)
            .expect("replay");
        assert_eq!(
            again,
            ReplayStart::Started { replay_attempts: 1 },
            "not parked at once"
        );
    }
    assert_eq!(
        wrong_state(system.release_run("session:s2").unwrap_err()),
        "running",
        "only a parked run is released"
    );
    assert!(matches!(
        system.release_run("run-404"),
        Err(SystemError::Store(StoreError::NotFound { .. }))
    ));
    // A job run waits for a human only on a confirmation, which a release
    // cannot answer: refused, unchanged, pointing at `confirm`.
    {
        let db = system.db();
        store.create_run(db.conn(), "job-1", "s3", 4).expect("run");
        store
            .set_run_status(db.conn(), "job-1", RunStatus::WaitingForHuman, 5)
            .expect("park");
    }
    let refused = system.release_run("job-1").unwrap_err();
    assert!(
        matches!(&refused, SystemError::AwaitsConfirmation { run_id } if run_id == "job-1"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("`confirm`"), "{refused}");
    let db = system.db();
    assert_eq!(
        store.run_status(db.conn(), "job-1").expect("status"),
        RunStatus::WaitingForHuman
    );
}

#[test]
fn gc_after_the_ttl_collects_settled_rows_and_keeps_what_recovery_and_humans_need() {
    let bench = Bench::new(World::without_dedup());
    let (mut system, mailer, nc_key) = leave_needs_confirmation(&bench, Scripted::DropSilently, "job:nc");
    // Boot turned the interrupted job into its RESUME trigger; fired, the
    // turn stops at its email, which waits for a human: FAILED, blocked.
    let resume = {
        let db = system.db();
        system
            .triggers()
            .claim(db.conn(), 0, 60_000)
            .expect("claim")
            .expect("the RESUME trigger is due")
    };
    assert_eq!(resume.dedup_key, Some(resume_key(&mailer, "job:nc")));
    let blocked = system.fire(&resume, &mailer, EMAIL);
    assert!(
        matches!(
            blocked,
            Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { .. }))
        ),
        "{blocked:?}"
    );
    {
        let error = blocked.map(|_| ()).unwrap_err().to_string();
        let db = system.db();
        system
            .triggers()
            .ack_failed(db.conn(), &resume, 0, &error, false)
            .expect("ack");
    }
    let agent = system.runtime_mut().create_root("a", "work").expect("agent");
    // A trigger fired at t=0 whose turn sends one email: DONE in both stores.
    let id = emit(&system, "scheduled-once:mail", 0).id().to_string();
    let claim = {
        let db = system.db();
        system
            .triggers()
            .claim(db.conn(), 0, 60_000)
            .expect("claim")
            .expect("due")
    };
    assert!(matches!(
        system.fire(&claim, &agent, EMAIL),
        Ok(Fired::Ran { tool_calls: 1 })
    ));
    let sent = bench.world.deliveries_len();
    assert_eq!(sent, 1);
    // Still to come (and the newest row).
    let later = emit(&system, "scheduled-once:later", 10 * DEFAULT_GC_TTL_MS)
        .id()
        .to_string();

    bench.clock.set(DEFAULT_GC_TTL_MS);
    let kept = system.gc(DEFAULT_GC_TTL_MS).expect("gc at exactly the TTL");
    assert!(
        kept.triggers.deleted.is_empty() && kept.activities.deleted.is_empty(),
        "{kept:?}"
    );

    bench.clock.set(DEFAULT_GC_TTL_MS + 1);
    let report = system.gc(DEFAULT_GC_TTL_MS).expect("gc");
    // The blocked RESUME trigger is kept with its key: the answer re-pends it.
    assert_eq!(report.triggers.deleted, vec![id.clone()]);
    assert_eq!(report.activities.deleted.len(), 1, "{report:?}");
    // The fired turn's settled tool call and its provider calls' usage go
    // too; the blocked job's (its agent resumes) stay.
    assert_eq!(report.tool_calls.calls.len(), 1, "{report:?}");
    assert_eq!(report.usage.token_usage, 2, "{report:?}");
    assert_eq!(system.gc(DEFAULT_GC_TTL_MS).expect("gc again"), {
        let mut empty = report.clone();
        empty.triggers.deleted.clear();
        empty.activities.deleted.clear();
        empty.tool_calls.calls.clear();
        empty.usage.token_usage = 0;
        empty
    });
    // Kept: the PENDING trigger and the action waiting for a human.
    let left: Vec<_> = {
        let db = system.db();
        system
            .triggers()
            .all(db.conn(), 0)
            .expect("all")
            .into_iter()
            .map(|t| t.id)
            .collect()
    };
    assert_eq!(left, vec![resume.id.clone(), later]);
    let waiting = system.needs_confirmation().expect("list");
    assert_eq!(
        waiting.iter().map(|a| a.idem_key.as_str()).collect::<Vec<_>>(),
        [nc_key.as_str()]
    );

    // After the TTL the key is a new trigger to the store; the agent's log
    // still knows its turn ran, so firing it sends nothing.
    assert!(matches!(
        emit(&system, "scheduled-once:mail", 0),
        EmitOutcome::Inserted(_)
    ));
    let claim = {
        let db = system.db();
        system
            .triggers()
            .claim(db.conn(), DEFAULT_GC_TTL_MS + 1, 60_000)
            .expect("claim")
            .expect("due")
    };
    assert_eq!(
        system.fire(&claim, &agent, EMAIL).expect("fire"),
        Fired::AlreadyDone
    );
    assert_eq!(bench.world.deliveries_len(), sent);
}

#[test]
fn gc_keeps_the_ledger_rows_of_an_agent_with_an_interrupted_turn() {
    let bench = Bench::new(World::without_dedup());
    let mut system = bench.boot();
    let agent = system.runtime_mut().create_root("a", "work").expect("agent");
    // A completed turn leaves a DONE ledger row for the agent.
    let done = system.runtime_mut().run_work_turn(&agent, EMAIL, "job:done");
    assert!(matches!(done, Ok(WorkTurn::Ran(_))), "{done:?}");
    let gate_key = bench.world.deliveries()[0].idem_key.clone();
    // A second turn on the same agent is interrupted (provider down): its
    // resume may re-run keys of the agent, so GC keeps the agent's rows.
    bench.provider.set_down(true);
    let interrupted = system
        .runtime_mut()
        .run_work_turn(&agent, "another send_email", "job:open-2");
    assert!(interrupted.is_err());
    assert!(
        system.runtime().open_turn(&agent).expect("agent").is_some(),
        "turn not kept open"
    );
    bench.clock.set(2 * DEFAULT_GC_TTL_MS);
    let report = system.gc(DEFAULT_GC_TTL_MS).expect("gc");
    assert!(report.activities.deleted.is_empty(), "{report:?}");
    let db = system.db();
    let row = system.gate().store().get(db.conn(), &gate_key).expect("get");
    assert_eq!(row.map(|r| r.status), Some(ActivityStatus::Done));
}

fn claim_due(system: &System, now_ms: u64) -> durable_agent::store::triggers::Trigger {
    let db = system.db();
    system
        .triggers()
        .claim(db.conn(), now_ms, 60_000)
        .expect("claim")
        .expect("due")
}

/// Trigger `mail:1` blocked on a human: its first firing on a new agent
/// sends `EMAIL` and the reply is lost (the process dies, the trigger
/// CLAIMED, the INTENT in the ledger); after the reboot its re-fire (at
/// 10 ms) stops at that call — blocked, not re-sent — and is acked FAILED
/// (at 11 ms). Returns the system, the agent, the trigger's id and the
/// NEEDS_CONFIRMATION key.
fn block_a_trigger_on_confirmation(bench: &Bench) -> (System, AgentId, String, String) {
    let mut system = bench.boot();
    let agent = system.runtime_mut().create_root("mailer", "mail").expect("agent");
    let id = emit(&system, "mail:1", 0).id().to_string();
    let claim = claim_due(&system, 0);
    bench.world.script([Scripted::DeliverLoseReply]);
    let lost = system.fire(&claim, &agent, EMAIL);
    assert!(
        matches!(lost, Err(SystemError::Runtime(RuntimeError::Tool { .. }))),
        "{lost:?}"
    );
    drop(system);
    let mut system = bench.boot();
    let waiting = system.needs_confirmation().expect("list");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let key = waiting[0].idem_key.clone();
    assert!(key.starts_with("trigger:mail:1-r0-"), "{key}");

    bench.clock.set(10);
    let claim = claim_due(&system, 10);
    let blocked = system.fire(&claim, &agent, EMAIL);
    match &blocked {
        Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { idem_key, tool, .. })) => {
            assert_eq!((idem_key.as_str(), tool.as_str()), (key.as_str(), "send_email"));
        }
        other => panic!("expected a blocked turn, got {other:?}"),
    }
    assert_eq!(bench.world.deliveries_for(&key), 1);
    assert_eq!(bench.world.sends(), 1, "nothing sent while blocked");
    let error = blocked.map(|_| ()).unwrap_err().to_string();
    {
        let db = system.db();
        let status = system
            .triggers()
            .ack_failed(db.conn(), &claim, 11, &error, false)
            .expect("ack");
        assert_eq!(status, TriggerStatus::Failed);
    }
    (system, agent, id, key)
}

/// Needs-confirmation blocks the work that depends on it (seed 001): a
/// trigger's turn that reaches an irreversible call of unknown fate stops
/// there — nothing sent, nothing skipped, the runtime still usable — and
/// is acked FAILED; the human's answer puts it back to PENDING, and the
/// re-fire resumes at that call and completes with the ledger's answer.
#[test]
fn a_trigger_blocked_on_confirmation_waits_for_the_answer_then_resumes() {
    let bench = Bench::new(World::without_dedup());
    // The re-fire stops at the call whose reply was lost: blocked, not
    // re-sent, not poisoned.
    let (mut system, agent, id, key) = block_a_trigger_on_confirmation(&bench);
    let other = system.runtime_mut().create_root("other", "idle").expect("agent");
    system
        .runtime_mut()
        .run_turn(&other, "hello")
        .expect("the runtime is not poisoned by a blocked turn");
    let open = system.runtime().open_turn(&agent).expect("open");
    assert!(open.is_some(), "the blocked turn stays open");

    // A reboot changes nothing: still blocked, still listed.
    drop(system);
    let system = bench.boot();
    assert_eq!(system.needs_confirmation().expect("list").len(), 1);
    let failed = system.failed_triggers().expect("failed");
    assert_eq!(failed.len(), 1);
    assert!(failed[0].last_error.as_deref().is_some_and(|e| e.contains(&key)));

    // The human's answer unblocks it.
    let done = system
        .confirm(
            &key,
            &Resolution::Delivered {
                provider_ref: "msg-7".into(),
            },
        )
        .expect("confirm");
    assert_eq!(done.status, Some(ActivityStatus::Done));
    assert_eq!(
        done.retried
            .iter()
            .map(|t| (t.id.as_str(), t.status))
            .collect::<Vec<_>>(),
        [(id.as_str(), TriggerStatus::Pending)]
    );
    let mut system = system;
    bench.clock.set(20);
    let claim = claim_due(&system, 20);
    assert!(matches!(
        system.fire(&claim, &agent, EMAIL),
        Ok(Fired::Ran { .. })
    ));
    assert_eq!(bench.world.deliveries_for(&key), 1, "never sent again");
    assert!(system.runtime().open_turn(&agent).expect("open").is_none());
    let convo = &system.runtime().state().conversations[&agent];
    assert!(
        convo.iter().any(|i| matches!(i,
            durable_agent::runtime::ConversationItem::ToolResult { ok: true, output, .. } if output.contains("msg-7"))),
        "{convo:?}"
    );
}

/// A trigger that failed for another reason is not re-pended by an
/// unrelated confirmation.
#[test]
fn confirming_a_key_retries_only_the_triggers_blocked_on_it() {
    let bench = Bench::new(World::without_dedup());
    let (system, _agent, key) = leave_needs_confirmation(&bench, Scripted::DropSilently, "job:9");
    emit(&system, "other", 0);
    // Both fail, neither on the key: the job's RESUME trigger (whose work
    // owns the key) because the provider was down, the other naming it.
    for error in ["provider down".to_string(), format!("bad payload, not {key}")] {
        let claim = claim_due(&system, 0);
        let db = system.db();
        system
            .triggers()
            .ack_failed(db.conn(), &claim, 1, &error, false)
            .expect("ack");
    }
    let done = system.confirm(&key, &Resolution::NotDelivered).expect("confirm");
    assert_eq!(
        done,
        durable_agent::system::Confirmed {
            status: None,
            retried: Vec::new()
        }
    );
    assert_eq!(system.failed_triggers().expect("failed").len(), 2);
}

/// A wake-up trigger dead-lettered (its message still pending: the turn
/// that reads it never completed) survives GC after the TTL, as a given-up
/// RESUME trigger does. Collected (the bug a review proved on 8f2b315), the
/// next boot's first wake-up pass found the key `wake:{message}` free and
/// emitted a fresh PENDING trigger (attempts 0): the dead-letter silently
/// undone and the work run again. Two cases: its turn started (the
/// provider was down) and never completed, or its last attempt failed
/// before its turn started (no turn at all: only the message keeps it).
#[test]
fn gc_keeps_a_dead_wake_up_whose_message_is_still_pending() {
    gc_keeps_a_dead_wake_up(true);
    gc_keeps_a_dead_wake_up(false);
}

fn gc_keeps_a_dead_wake_up(turn_started: bool) {
    let mut bench = Bench::new(World::without_dedup());
    bench.policy.max_attempts = 1;
    let mut system = bench.boot();
    let sender = system.runtime_mut().create_root("boss", "boss").expect("agent");
    let reader = system.runtime_mut().create_root("reader", "read").expect("agent");
    let message = system
        .runtime_mut()
        .send_message(&sender, &reader, "write the report")
        .expect("send");
    let mut wakeups = durable_agent::system::WakeUps::default();
    let emitted = system.emit_wakeups(&mut wakeups).expect("wake-ups");
    assert_eq!(emitted, [durable_agent::system::wake_key(&message)]);
    // Its one attempt fails: dead-lettered.
    let claim = claim_due(&system, 0);
    if turn_started {
        // The provider is down: the turn starts and stops at its first call.
        let prompt = claim.payload["prompt"].as_str().expect("prompt").to_string();
        bench.provider.set_down(true);
        let failed = system.fire(&claim, &reader, &prompt);
        assert!(
            matches!(failed, Err(SystemError::Runtime(RuntimeError::Provider { .. }))),
            "{failed:?}"
        );
    }
    assert_eq!(
        system.runtime().unfinished_work(&reader).expect("works").len(),
        usize::from(turn_started)
    );
    let status = {
        let db = system.db();
        system
            .triggers()
            .ack_failed(db.conn(), &claim, 1, "provider down", true)
            .expect("ack")
    };
    assert_eq!(status, TriggerStatus::Dead);
    assert!(
        system.runtime().pending(&reader).iter().any(|m| m.id == message),
        "the message is still pending: no turn read it"
    );
    // Later triggers exist (the dead one is not the newest row).
    emit(&system, "scheduled-once:later", 0);

    // A day and more later, a GC pass, then a restart of the daemon.
    bench.clock.set(DEFAULT_GC_TTL_MS + 10);
    let report = system.gc(DEFAULT_GC_TTL_MS).expect("gc");
    drop(system);
    let system = bench.boot();
    let mut wakeups = durable_agent::system::WakeUps::default();
    let emitted = system.emit_wakeups(&mut wakeups).expect("wake-ups");
    assert!(
        emitted.is_empty(),
        "turn started: {turn_started}: the dead-lettered wake-up was emitted afresh after GC (collected: {:?}): {:?}",
        report.triggers.deleted,
        system
            .triggers()
            .pending(system.db().conn(), system.now_ms())
            .expect("pending")
    );
    assert_eq!(system.dead_triggers().expect("dead").len(), 1);
}

/// `System::confirm` is two steps (the activity row, then the blocked
/// triggers); a crash between them leaves the trigger FAILED, listed, for
/// `retry_trigger` — and GC keeps it, though its key is answered and no
/// longer NEEDS_CONFIRMATION, because its own turn is unfinished. Before
/// (the bug a review proved on 8f2b315), the worker's first GC pass after
/// the reboot collected it when the human answered more than the TTL after
/// the block: the answer acknowledged, the work it unblocks lost.
#[test]
fn a_crash_inside_confirm_leaves_the_blocked_trigger_for_retry_not_for_gc() {
    let bench = Bench::new(World::without_dedup());
    let (system, _agent, id, key) = block_a_trigger_on_confirmation(&bench);
    emit(&system, "scheduled-once:later", 12);

    // Two days later the human answers: `System::confirm`'s first step
    // commits, and the process dies before its second.
    bench.clock.set(2 * DEFAULT_GC_TTL_MS);
    {
        let now = system.now_ms();
        let db = system.db();
        system
            .gate()
            .store()
            .confirm(
                db.conn(),
                &key,
                &Resolution::Delivered {
                    provider_ref: "msg-7".into(),
                },
                now,
            )
            .expect("confirm's first step");
    }
    drop(system);
    // The reboot's first GC pass (the worker runs one at once).
    let system = bench.boot();
    let report = system.gc(DEFAULT_GC_TTL_MS).expect("gc");
    assert!(
        !report.triggers.deleted.contains(&id),
        "GC collected the trigger the human's answer unblocked: {:?}",
        report.triggers.deleted
    );
    let retried = system
        .retry_trigger(&id)
        .expect("the trigger is still there to retry");
    assert_eq!(retried.status, TriggerStatus::Pending);
}
