//! Payload stripping of settled ledger rows after a TTL (seed 001 §10's
//! privacy note): `ActivityStore::strip_payloads` and
//! `ToolCallStore::strip_payloads` replace the bodies of DONE/FAILED
//! (succeeded/failed) rows settled more than the TTL ago — keys, statuses,
//! times and provider references kept — never an INTENT, NEEDS_CONFIRMATION
//! or in-flight row, never a row of a kept task/run, one transaction per
//! table (all or nothing at every crash point), idempotent.
//!
//! Why a replayed settled call still answers correctly: the activity
//! ledger answers a repeated key from its status and provider reference
//! (never the payload), shown below after a strip; the tool-call ledger
//! answers a repeated call from its stored result, so `System::strip_payloads`
//! never strips the rows of an agent that may still resume (an open turn or
//! unfinished work) — the only agents whose calls can be asked again —
//! shown on a booted system whose interrupted agent then resumes and sends
//! nothing twice.

mod store_crash_common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::runtime::{
    FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest, PureTools, WorkTurn,
};
use durable_agent::sqlite::Db;
use durable_agent::store::activities::{
    ActivityOutcome, ActivityStatus, ActivityStore, IrreversibleCall, STRIPPED_JSON,
};
use durable_agent::store::schema::migrate;
use durable_agent::store::tool_calls::{
    NewToolCall, SideEffect, ToolCallStatus, ToolCallStore, STRIPPED_TEXT,
};
use durable_agent::store::StoreError;
use durable_agent::system::{session_run, Deps, LogicalClock, System, SystemConfig, DEFAULT_GC_TTL_MS};
use durable_agent::world::{Scripted, World};
use rusqlite::Connection;
use serde_json::{json, Value};
use store_crash_common::{sweep, KILLS};

/// Settled rows of the fixtures are last updated at this instant.
const OLD_MS: u64 = 10;
const YOUNG_MS: u64 = 500;
const TTL_MS: u64 = 1_000;
/// Old rows are past the TTL, young ones are not.
const NOW_MS: u64 = OLD_MS + TTL_MS + 1;

fn db() -> Connection {
    let c = Connection::open_in_memory().expect("in-memory db");
    migrate(&c, "mem").expect("migrate");
    c
}

fn stripped() -> Value {
    serde_json::from_str(STRIPPED_JSON).expect("the sentinel is JSON")
}

fn email(key: &str, task: &str) -> IrreversibleCall {
    IrreversibleCall::with_key(key, task, "send_email", json!({"to": "bob", "body": "secret"}))
}

/// Activity rows: which keys a strip at [`NOW_MS`] keeping task `kept`
/// must strip, and which it must leave as they are.
fn activity_fixture(
    c: &Connection,
    a: &ActivityStore,
    world: &World,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let exec = |key: &str, task: &str, at_ms: u64| a.execute_irreversible(c, world, &email(key, task), at_ms);
    world.script([Scripted::DropSilently]);
    assert!(exec("nc-old", "idle", OLD_MS).is_err(), "outcome unknown");
    a.recover(c, world, OLD_MS).expect("recover");
    world.script([Scripted::DropSilently]);
    assert!(exec("intent-old", "idle", OLD_MS).is_err(), "outcome unknown");
    world.script([Scripted::Reject]);
    assert!(matches!(
        exec("failed-old", "idle", OLD_MS),
        Ok(ActivityOutcome::Failed { .. })
    ));
    assert!(matches!(
        exec("done-old", "idle", OLD_MS),
        Ok(ActivityOutcome::Done { .. })
    ));
    assert!(matches!(
        exec("done-young", "idle", YOUNG_MS),
        Ok(ActivityOutcome::Done { .. })
    ));
    assert!(matches!(
        exec("kept-old", "kept", OLD_MS),
        Ok(ActivityOutcome::Done { .. })
    ));
    let strip = ["done-old", "failed-old"].map(String::from).into();
    let keep = ["nc-old", "intent-old", "done-young", "kept-old"]
        .map(String::from)
        .into();
    (strip, keep)
}

#[test]
fn activity_strip_replaces_settled_old_payloads_only_and_keeps_the_rest_of_the_row() {
    let c = db();
    let a = ActivityStore::default();
    let world = World::without_dedup();
    let (strip, keep) = activity_fixture(&c, &a, &world);
    let before: Vec<_> = ["done-old", "failed-old"]
        .iter()
        .map(|k| a.get(&c, k).expect("get").expect("row"))
        .collect();

    let report = a
        .strip_payloads(&c, NOW_MS, TTL_MS, &["kept".to_string()])
        .expect("strip");
    assert_eq!(report.cutoff_ms, NOW_MS - TTL_MS);
    assert_eq!(report.stripped.iter().cloned().collect::<BTreeSet<_>>(), strip);
    for old in before {
        let now = a.get(&c, &old.idem_key).expect("get").expect("row");
        assert_eq!(now.payload, stripped(), "{}", old.idem_key);
        // Everything but the body is as it was (times included: the GC
        // TTL still counts from the settlement).
        assert_eq!(
            (
                now.status,
                &now.provider_ref,
                &now.error,
                now.created_at_ms,
                now.updated_at_ms
            ),
            (
                old.status,
                &old.provider_ref,
                &old.error,
                old.created_at_ms,
                old.updated_at_ms
            )
        );
    }
    for key in &keep {
        let row = a.get(&c, key).expect("get").expect("row");
        assert_eq!(row.payload["body"], "secret", "{key} was stripped");
    }
    // Idempotent: nothing left to strip.
    let again = a
        .strip_payloads(&c, NOW_MS, TTL_MS, &["kept".to_string()])
        .expect("strip again");
    assert!(again.stripped.is_empty(), "{again:?}");

    // A repeated key is answered from the ledger as before: same provider
    // reference, nothing sent.
    let sent = world.deliveries_for("done-old");
    let ref_before = a.get(&c, "done-old").expect("get").and_then(|r| r.provider_ref);
    match a
        .execute_irreversible(&c, &world, &email("done-old", "idle"), NOW_MS)
        .expect("replay")
    {
        ActivityOutcome::Done {
            provider_ref,
            from_ledger,
            ..
        } => {
            assert!(from_ledger);
            assert_eq!(Some(provider_ref), ref_before);
        }
        other => panic!("a stripped DONE key answered {other:?}"),
    }
    assert_eq!(world.deliveries_for("done-old"), sent);
    assert!(matches!(
        a.execute_irreversible(&c, &world, &email("failed-old", "idle"), NOW_MS),
        Ok(ActivityOutcome::Failed { .. })
    ));
}

fn call(id: &str, run: &str) -> NewToolCall {
    NewToolCall {
        id: id.to_string(),
        run_id: run.to_string(),
        tool_name: "lookup".into(),
        raw_tool_name: "Lookup".into(),
        input: json!({"query": "private"}),
        idempotency_key: format!("key-{id}"),
        side_effect: SideEffect::Reversible,
    }
}

/// How a fixture call ends.
#[derive(Clone, Copy)]
enum End {
    Succeeded,
    Failed,
    Running,
}

/// Tool calls: the ids a strip at [`NOW_MS`] keeping run `kept` must
/// strip, and the ids it must leave.
fn tool_call_fixture(c: &Connection, s: &ToolCallStore) -> (BTreeSet<String>, BTreeSet<String>) {
    s.create_run(c, "idle", "s-idle", 0).expect("run");
    s.create_run(c, "kept", "s-kept", 0).expect("run");
    for (id, run, end, at) in [
        ("ok-old", "idle", End::Succeeded, OLD_MS),
        ("failed-old", "idle", End::Failed, OLD_MS),
        ("running-old", "idle", End::Running, OLD_MS),
        ("ok-young", "idle", End::Succeeded, YOUNG_MS),
        ("kept-old", "kept", End::Succeeded, OLD_MS),
    ] {
        s.prepare(c, &call(id, run), at).expect("prepare");
        s.mark_running(c, id, at).expect("running");
        match end {
            End::Succeeded => s
                .mark_succeeded(c, id, &json!("private answer"), at)
                .expect("succeeded"),
            End::Failed => s.mark_failed(c, id, "private error", at).expect("failed"),
            End::Running => {}
        }
    }
    let strip = ["ok-old", "failed-old"].map(String::from).into();
    let keep = ["running-old", "ok-young", "kept-old"].map(String::from).into();
    (strip, keep)
}

#[test]
fn tool_call_strip_replaces_args_results_and_errors_of_settled_old_calls_only() {
    let c = db();
    let s = ToolCallStore::default();
    let (strip, keep) = tool_call_fixture(&c, &s);
    let report = s
        .strip_payloads(&c, NOW_MS, TTL_MS, &["kept".to_string()])
        .expect("strip");
    assert_eq!(report.stripped.iter().cloned().collect::<BTreeSet<_>>(), strip);
    let ok = s.get(&c, "ok-old").expect("get").expect("row");
    assert_eq!(
        (ok.input.clone(), ok.result.clone()),
        (stripped(), Some(stripped()))
    );
    assert_eq!(
        (ok.status, ok.idempotency_key.as_str(), ok.raw_tool_name.as_str()),
        (ToolCallStatus::Succeeded, "key-ok-old", "Lookup")
    );
    let failed = s.get(&c, "failed-old").expect("get").expect("row");
    assert_eq!(
        (
            failed.input.clone(),
            failed.result.clone(),
            failed.error.as_deref()
        ),
        (stripped(), None, Some(STRIPPED_TEXT))
    );
    assert_eq!(failed.status, ToolCallStatus::Failed);
    for id in &keep {
        let row = s.get(&c, id).expect("get").expect("row");
        assert_eq!(row.input["query"], "private", "{id} was stripped");
    }
    assert!(s
        .strip_payloads(&c, NOW_MS, TTL_MS, &["kept".to_string()])
        .expect("strip again")
        .stripped
        .is_empty());
}

/// What the swept strip acknowledged.
#[derive(Default)]
struct Acked {
    activities: bool,
    tool_calls: bool,
}

#[test]
fn strip_crashed_at_every_io_point_is_all_or_nothing_per_table_and_never_touches_a_kept_row() {
    let a = ActivityStore::default();
    let s = ToolCallStore::default();
    let kept = ["kept".to_string()];
    let (a_strip, a_keep) = activity_fixture(&db(), &a, &World::without_dedup());
    let (t_strip, t_keep) = tool_call_fixture(&db(), &s);
    let setup = |db: &Db| {
        activity_fixture(db.conn(), &a, &World::without_dedup());
        tool_call_fixture(db.conn(), &s);
    };
    let run = |db: &Db, m: &mut Acked| -> Result<(), String> {
        let e = |e: StoreError| e.to_string();
        a.strip_payloads(db.conn(), NOW_MS, TTL_MS, &kept).map_err(e)?;
        m.activities = true;
        s.strip_payloads(db.conn(), NOW_MS, TTL_MS, &kept).map_err(e)?;
        m.tool_calls = true;
        Ok(())
    };
    let check = |db: &Db, m: &Acked| -> Vec<String> {
        let c = db.conn();
        let mut bad = Vec::new();
        let mut verdict = |what: &str,
                           strip: &BTreeSet<String>,
                           keep: &BTreeSet<String>,
                           acked: bool,
                           is_stripped: &dyn Fn(&str) -> Result<bool, String>| {
            let mut done = BTreeSet::new();
            for k in strip.iter().chain(keep) {
                match is_stripped(k) {
                    Ok(true) => {
                        done.insert(k.clone());
                    }
                    Ok(false) => {}
                    Err(e) => bad.push(format!("{what} {k}: {e}")),
                }
            }
            if !done.is_empty() && &done != strip {
                bad.push(format!(
                    "{what}: strip half applied or too wide: {done:?} of {strip:?}"
                ));
            }
            if acked && done.is_empty() {
                bad.push(format!(
                    "{what}: strip returned Ok but nothing survived the restart"
                ));
            }
        };
        let activity = |k: &str| -> Result<bool, String> {
            let row = a.get(c, k).map_err(|e| e.to_string())?.ok_or("row gone")?;
            Ok(row.payload == stripped())
        };
        verdict("activities", &a_strip, &a_keep, m.activities, &activity);
        let tool_call = |k: &str| -> Result<bool, String> {
            let row = s.get(c, k).map_err(|e| e.to_string())?.ok_or("row gone")?;
            Ok(row.input == stripped())
        };
        verdict("tool calls", &t_strip, &t_keep, m.tool_calls, &tool_call);
        bad
    };
    let report = sweep(&KILLS, &Acked::default, &setup, &run, &check);
    report.assert_clean("strip");
    // Two commits (one per table), each a WAL write and its fsync at least.
    assert!(
        report.points >= 4,
        "suspiciously short strip: {} points",
        report.points
    );
    eprintln!(
        "strip: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

/// A clock the test moves.
#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// FakeProvider that fails every call while `down` is set.
#[derive(Debug)]
struct Flaky {
    inner: FakeProvider,
    down: Mutex<bool>,
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
        self.inner.complete(request)
    }
}

/// A prompt FakeProvider answers with one `send_email` (irreversible).
const EMAIL: &str = "please send_email to bob";
const SEED: u64 = 7;

#[test]
fn system_strip_keeps_the_rows_of_an_agent_that_may_resume_and_its_resume_sends_nothing_twice() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let world = World::without_dedup();
    let clock = Arc::new(Clock::default());
    let provider = Arc::new(Flaky {
        inner: FakeProvider::new(SEED),
        down: Mutex::new(false),
    });
    let deps = Deps {
        provider: provider.clone(),
        tools: Arc::new(PureTools),
        outbox: Arc::new(world.clone()),
        clock: clock.clone(),
    };
    let (mut system, _) = System::boot(Arc::new(fs), SystemConfig::new("/root", SEED), deps).expect("boot");
    let idle = system.runtime_mut().create_root("idle", "work").expect("agent");
    let busy = system.runtime_mut().create_root("busy", "work").expect("agent");
    for (agent, work) in [(&idle, "job:idle"), (&busy, "job:busy-1")] {
        let done = system.runtime_mut().run_work_turn(agent, EMAIL, work);
        assert!(matches!(done, Ok(WorkTurn::Ran(_))), "{done:?}");
    }
    assert_eq!(world.deliveries_len(), 2);
    // `busy` starts another work the provider never answers, then a third
    // work supersedes it: no open turn, but an unfinished work that may
    // still resume (its RESUME trigger, or `run --resume`).
    provider.set_down(true);
    assert!(system
        .runtime_mut()
        .run_work_turn(&busy, EMAIL, "job:busy-2")
        .is_err());
    provider.set_down(false);
    let third = system.runtime_mut().run_work_turn(&busy, EMAIL, "job:busy-3");
    assert!(matches!(third, Ok(WorkTurn::Ran(_))), "{third:?}");
    assert!(system.runtime().open_turn(&busy).expect("agent").is_none());
    assert_eq!(world.deliveries_len(), 3);

    clock.0.store(2 * DEFAULT_GC_TTL_MS, Ordering::SeqCst);
    let report = system.strip_payloads(DEFAULT_GC_TTL_MS).expect("strip");
    let session = |a| {
        system
            .runtime()
            .session_id(a)
            .map(|s| session_run(s.as_str()))
            .expect("session")
    };
    let (idle_run, busy_run) = (session(&idle), session(&busy));
    let calls = |run: &str| {
        let db = system.db();
        ToolCallStore::default().calls_of(db.conn(), run).expect("calls")
    };
    // The idle agent's settled rows are stripped, the busy one's are not.
    assert_eq!(report.activities.stripped.len(), 1, "{report:?}");
    assert_eq!(report.tool_calls.stripped.len(), 1, "{report:?}");
    assert!(calls(&idle_run).iter().all(|c| c.input == stripped()));
    let busy_calls = calls(&busy_run);
    assert!(!busy_calls.is_empty());
    assert!(busy_calls.iter().all(|c| c.input != stripped()), "{busy_calls:?}");
    {
        let db = system.db();
        let rows = system
            .gate()
            .store()
            .with_status(db.conn(), ActivityStatus::Done)
            .expect("rows");
        for row in rows {
            let is_busy = row.task_id == busy.as_str();
            assert_eq!(row.payload == stripped(), !is_busy, "{row:?}");
        }
    }
    // GC past the TTL keeps the busy agent's rows for the same reason.
    let collected = system.gc(DEFAULT_GC_TTL_MS).expect("gc");
    assert_eq!(collected.activities.deleted.len(), 1, "{collected:?}");
    // The busy agent resumes its work; the idle one's done work is still
    // done: nothing is sent twice.
    let resumed = system.runtime_mut().run_work_turn(&busy, EMAIL, "job:busy-2");
    assert!(matches!(resumed, Ok(WorkTurn::Ran(_))), "{resumed:?}");
    let again = system.runtime_mut().run_work_turn(&idle, EMAIL, "job:idle");
    assert!(matches!(again, Ok(WorkTurn::AlreadyDone)), "{again:?}");
    assert_eq!(world.deliveries_len(), 4, "one more email: busy-2's own");
    assert!(world.duplicates().is_empty(), "{:?}", world.duplicates());
}
