//! The worker driven by hand, as quinn-proto's tests drive a `Connection`:
//! no thread, no socket, a clock the test moves. The third driver of the
//! one core (after `serve` and the madsim simulation), small enough to read
//! each step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::fs::{Fs, SimConfig, SimFs};
use crate::runtime::{ConversationItem, FakeProvider, PureTools};
use crate::system::{Deps, LogicalClock, System, SystemConfig};
use crate::world::World;

use super::ops::{CreateAgent, EmitRequest, OpError, Request, TurnRequest};
use super::schedule::{Schedule, Schedules};
use super::{Action, Settings, Silent, Worker};

/// A clock the test moves.
#[derive(Debug, Default)]
struct Manual(AtomicU64);

impl LogicalClock for Manual {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn worker(clock: &Arc<Manual>) -> Result<Worker, Box<dyn std::error::Error>> {
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    boot_on(&fs, clock, false)
}

/// A worker booted on `fs` (again, for a restart), wake-ups on or off
/// (`[orchestration] wake`).
fn boot_on(fs: &Arc<dyn Fs>, clock: &Arc<Manual>, wake: bool) -> Result<Worker, Box<dyn std::error::Error>> {
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(7)),
        tools: Arc::new(PureTools),
        outbox: Arc::new(World::with_dedup()),
        clock: clock.clone(),
    };
    let (system, _) = System::boot(fs.clone(), SystemConfig::new("/root", 7), deps)?;
    let schedules = Schedules::load(fs.clone(), std::path::Path::new("/root"))?;
    let settings = Settings {
        poll_ms: 100,
        lease_ms: 60_000,
        slots: 2,
        wake,
        gc: None,
        gc_period_ms: 60_000,
    };
    Ok(Worker::new(system, schedules, Box::new(Silent), settings))
}

/// The prompts of the worker's agents' turns that start with `start`.
fn prompts_starting(w: &Worker, start: &str) -> Vec<String> {
    w.system()
        .runtime()
        .state()
        .conversations
        .values()
        .flatten()
        .filter_map(|i| match i {
            ConversationItem::Prompt { text } if text.starts_with(start) => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// A reply the worker gave: the request's id and its answer.
type Reply = (u64, Result<Value, OpError>);

/// Perform every call the worker hands out (inline, at once) until none is
/// left; return the replies it gave.
fn settle(worker: &mut Worker) -> Result<Vec<Reply>, OpError> {
    let outside = worker.system().runtime().outside();
    let mut replies = Vec::new();
    for _ in 0..1_000 {
        match worker.poll_action() {
            Some(Action::Call(call)) => worker.handle_result(call.turn, outside.perform(&call.call))?,
            Some(Action::Reply(id, result)) => replies.push((id, result)),
            None => return Ok(replies),
        }
    }
    panic!("the worker kept handing out calls");
}

fn trigger_status(worker: &mut Worker, key: &str) -> Result<Option<String>, Box<dyn std::error::Error>> {
    worker.handle_request(99, Request::Status)?;
    let status = settle(worker)?
        .into_iter()
        .find(|(id, _)| *id == 99)
        .ok_or("no status reply")?
        .1?;
    let found = status["triggers"].as_object().and_then(|by_status| {
        by_status.iter().find_map(|(s, rows)| {
            rows.as_array()?
                .iter()
                .any(|r| r["dedup_key"] == key)
                .then(|| s.clone())
        })
    });
    Ok(found)
}

#[test]
fn a_delayed_trigger_fires_when_the_clock_reaches_it_and_not_before() -> Result<(), Box<dyn std::error::Error>>
{
    let clock = Arc::new(Manual::default());
    let mut w = worker(&clock)?;
    let create = CreateAgent {
        name: "ada".into(),
        instructions: String::new(),
        parent: None,
    };
    w.handle_request(1, Request::CreateAgent(create))?;
    let emit = EmitRequest {
        dedup_key: "later".into(),
        fire_at_ms: None,
        delay_ms: Some(5_000),
        agent: "ada".into(),
        prompt: "remind me".into(),
    };
    w.handle_request(2, Request::Emit(emit))?;
    let replies = settle(&mut w)?;
    assert!(replies.iter().all(|(_, r)| r.is_ok()), "{replies:?}");
    w.handle_timeout()?;
    assert!(w.poll_action().is_none(), "nothing is due yet");
    assert_eq!(trigger_status(&mut w, "later")?.as_deref(), Some("PENDING"));
    assert_eq!(w.poll_timeout_ms(), 100, "the poll bounds the wait");
    clock.0.store(5_000, Ordering::SeqCst);
    w.handle_timeout()?;
    settle(&mut w)?;
    assert_eq!(trigger_status(&mut w, "later")?.as_deref(), Some("DONE"));
    Ok(())
}

#[test]
fn a_turn_is_answered_when_its_calls_come_back_and_a_retry_finds_it_done(
) -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    let mut w = worker(&clock)?;
    let create = CreateAgent {
        name: "ada".into(),
        instructions: String::new(),
        parent: None,
    };
    w.handle_request(1, Request::CreateAgent(create))?;
    settle(&mut w)?;
    let turn = || {
        Request::Turn(
            "ada".into(),
            TurnRequest {
                prompt: "hello".into(),
                work_id: Some("w1".into()),
            },
        )
    };
    w.handle_request(2, turn())?;
    let first = settle(&mut w)?;
    let answer = first.iter().find(|(id, _)| *id == 2).ok_or("no answer")?;
    assert!(
        answer.1.as_ref().is_ok_and(|v| v.get("already_done").is_none()),
        "{answer:?}"
    );
    w.handle_request(3, turn())?;
    let again = settle(&mut w)?;
    let answer = again.iter().find(|(id, _)| *id == 3).ok_or("no answer")?;
    assert!(
        answer.1.as_ref().is_ok_and(|v| v["already_done"] == true),
        "{answer:?}"
    );
    Ok(())
}

#[test]
fn a_schedule_fires_each_bucket_once_and_a_stopped_worker_refuses_requests(
) -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    let mut w = worker(&clock)?;
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "ada".into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    let schedule = Schedule {
        id: "tick".into(),
        agent: "ada".into(),
        prompt: "tick".into(),
        period_ms: 1_000,
    };
    w.handle_request(2, Request::AddSchedule(schedule))?;
    settle(&mut w)?;
    for now in [0, 500, 999, 1_000, 1_500] {
        clock.0.store(now, Ordering::SeqCst);
        w.handle_timeout()?;
        settle(&mut w)?;
    }
    assert_eq!(
        trigger_status(&mut w, "scheduled:tick:0")?.as_deref(),
        Some("DONE")
    );
    assert_eq!(
        trigger_status(&mut w, "scheduled:tick:1")?.as_deref(),
        Some("DONE")
    );
    assert_eq!(trigger_status(&mut w, "scheduled:tick:2")?, None);
    w.stop();
    w.handle_request(4, Request::Status)?;
    let refused = settle(&mut w)?;
    assert!(
        matches!(refused.as_slice(), [(4, Err(OpError::Conflict(_)))]),
        "{refused:?}"
    );
    Ok(())
}

/// A period longer than the GC's TTL: bucket 0's DONE trigger is old
/// enough to collect while bucket 0 is still current. The daemon is then
/// down for two whole periods; the boot's firing of bucket 3 must still
/// say that two were missed: the newest bucket row is the schedule's only
/// record of its progress, and GC keeps it.
#[test]
fn a_schedule_counts_the_periods_it_missed_though_gc_ran_after_its_last_firing(
) -> Result<(), Box<dyn std::error::Error>> {
    use super::gc::GcRequest;
    let clock = Arc::new(Manual::default());
    let fs = SimFs::new(SimConfig::new(7));
    let fs: Arc<dyn Fs> = Arc::new(fs);
    let day = 24 * 3_600_000;
    let mut w = boot_on(&fs, &clock, false)?;
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "ada".into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    let weekly = Schedule {
        id: "weekly".into(),
        agent: "ada".into(),
        prompt: "the weekly report".into(),
        period_ms: 7 * day,
    };
    w.handle_request(2, Request::AddSchedule(weekly))?;
    settle(&mut w)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    assert_eq!(
        trigger_status(&mut w, "scheduled:weekly:0")?.as_deref(),
        Some("DONE")
    );
    // A later one-shot trigger, so the bucket's row is not the newest.
    let emit = EmitRequest {
        dedup_key: "other".into(),
        fire_at_ms: None,
        delay_ms: Some(0),
        agent: "ada".into(),
        prompt: "something else".into(),
    };
    clock.0.store(day, Ordering::SeqCst);
    w.handle_request(3, Request::Emit(emit))?;
    settle(&mut w)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    clock.0.store(3 * day, Ordering::SeqCst);
    w.handle_request(
        4,
        Request::Gc(GcRequest {
            ttl_ms: day,
            payload_ttl_ms: day,
        }),
    )?;
    settle(&mut w)?;
    assert_eq!(prompts_starting(&w, "the weekly report").len(), 1);
    drop(w.into_system());
    // Down for buckets 1 and 2; back in bucket 3.
    clock.0.store(22 * day, Ordering::SeqCst);
    let mut w = boot_on(&fs, &clock, false)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    let turns = prompts_starting(&w, "the weekly report");
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert!(
        turns[1].contains("missed 2 earlier period(s)"),
        "bucket 3's prompt does not count the periods missed: {:?}",
        turns[1]
    );
    Ok(())
}

/// A schedule deleted and added again under the same id with a longer
/// period is a new schedule: it fires in its current bucket, though the
/// old one's bucket numbers (of a shorter period) run higher.
#[test]
fn a_schedule_added_again_with_a_longer_period_fires_in_its_current_bucket(
) -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    let mut w = worker(&clock)?;
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "ada".into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    let day = 24 * 3_600_000;
    let every = |period_ms| Schedule {
        id: "digest".into(),
        agent: "ada".into(),
        prompt: "the digest".into(),
        period_ms,
    };
    clock.0.store(10 * day, Ordering::SeqCst);
    w.handle_request(2, Request::AddSchedule(every(day)))?;
    settle(&mut w)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    assert_eq!(
        trigger_status(&mut w, "scheduled:digest:10")?.as_deref(),
        Some("DONE")
    );
    clock.0.store(11 * day + 1, Ordering::SeqCst);
    w.handle_request(3, Request::DeleteSchedule("digest".into()))?;
    w.handle_request(4, Request::AddSchedule(every(7 * day)))?;
    settle(&mut w)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    assert_eq!(
        trigger_status(&mut w, "scheduled:digest:1")?.as_deref(),
        Some("DONE"),
        "the weekly schedule did not fire in its first bucket"
    );
    Ok(())
}

/// A schedule added in the middle of its period fires at once, and its
/// agent is not told the firing is late (no restart or backlog delayed
/// it): the catch-up note is for a bucket the daemon was down for.
#[test]
fn a_new_schedule_fires_at_once_without_a_catch_up_note() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    let mut w = worker(&clock)?;
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "ada".into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    let day = 24 * 3_600_000;
    // 15:00 on day 100.
    clock.0.store(100 * day + 15 * 3_600_000, Ordering::SeqCst);
    let daily = Schedule {
        id: "daily".into(),
        agent: "ada".into(),
        prompt: "the daily digest".into(),
        period_ms: day,
    };
    w.handle_request(2, Request::AddSchedule(daily))?;
    settle(&mut w)?;
    w.handle_timeout()?;
    settle(&mut w)?;
    let prompts = prompts_starting(&w, "the daily digest");
    assert_eq!(prompts, vec!["the daily digest".to_string()]);
    Ok(())
}

fn agent_named(
    w: &mut Worker,
    id: u64,
    name: &str,
) -> Result<crate::runtime::AgentId, Box<dyn std::error::Error>> {
    w.handle_request(
        id,
        Request::CreateAgent(CreateAgent {
            name: name.into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    settle(w)?;
    Ok(super::ops::resolve(w.system(), name)?)
}

/// A client's `POST /triggers` may not take the dedup key of the
/// system's own wake-up for a message (`wake:{message_id}`, the id `POST
/// /messages` answered): the wake-up would be a duplicate of the client's
/// trigger, never emitted, and the message would wait with no turn to
/// read it. The emit is refused, and the message is woken for.
#[test]
fn a_client_trigger_cannot_take_a_wake_up_key() -> Result<(), Box<dyn std::error::Error>> {
    use super::ops::MessageRequest;
    let clock = Arc::new(Manual::default());
    clock.0.store(1_764_288_000_000, Ordering::SeqCst);
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    let mut w = boot_on(&fs, &clock, true)?;
    agent_named(&mut w, 1, "ada")?;
    let bob = agent_named(&mut w, 2, "bob")?;
    w.handle_request(
        3,
        Request::Message(MessageRequest {
            from: "ada".into(),
            to: "bob".into(),
            payload: "the report is ready".into(),
        }),
    )?;
    let replies = settle(&mut w)?;
    let message_id = replies
        .iter()
        .find(|(id, _)| *id == 3)
        .and_then(|(_, r)| r.as_ref().ok())
        .and_then(|v| v["message_id"].as_str())
        .ok_or("no message id")?
        .to_string();
    for (id, key) in [
        (4, format!("wake:{message_id}")),
        (5, "resume:x@y".into()),
        (6, "scheduled:s:1".into()),
    ] {
        w.handle_request(
            id,
            Request::Emit(EmitRequest {
                dedup_key: key.clone(),
                fire_at_ms: None,
                delay_ms: Some(24 * 3_600_000),
                agent: "bob".into(),
                prompt: "follow up on the report".into(),
            }),
        )?;
        let replies = settle(&mut w)?;
        assert!(
            matches!(replies.as_slice(), [(_, Err(OpError::BadRequest(_)))]),
            "{key}: {replies:?}"
        );
    }
    w.handle_timeout()?;
    settle(&mut w)?;
    assert_eq!(
        w.system().runtime().pending(&bob).len(),
        0,
        "the message was not woken for"
    );
    Ok(())
}

/// The answer to an API turn lists the calls of its work (`tool_calls`,
/// from the ledger rows whose key is the work's: `worker::effects`). A
/// work id that extends another by `-r{n}-c{m}` has keys the other's
/// filter also accepts: the answer to work `w` lists, as its own, the
/// call work `w-r0-c0` made (here an irreversible email it never sent).
#[test]
fn a_turn_answer_lists_only_its_own_works_calls() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    clock.0.store(1_764_288_000_000, Ordering::SeqCst);
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    let mut w = boot_on(&fs, &clock, false)?;
    agent_named(&mut w, 1, "ada")?;
    let turn = |work: &str, prompt: &str| {
        Request::Turn(
            "ada".into(),
            TurnRequest {
                prompt: prompt.into(),
                work_id: Some(work.into()),
            },
        )
    };
    w.handle_request(2, turn("w-r0-c0", "please send_email to the team"))?;
    let first = settle(&mut w)?;
    let first = first.iter().find(|(id, _)| *id == 2).ok_or("no answer")?;
    let first = first.1.as_ref().map_err(|e| e.to_string())?;
    assert_eq!(first["tool_calls"].as_array().map(Vec::len), Some(1), "{first}");
    w.handle_request(3, turn("w", "please lookup the weather"))?;
    let second = settle(&mut w)?;
    let second = second.iter().find(|(id, _)| *id == 3).ok_or("no answer")?;
    let second = second.1.as_ref().map_err(|e| e.to_string())?;
    let tools: Vec<&str> = second["tool_calls"]
        .as_array()
        .ok_or("no tool_calls")?
        .iter()
        .filter_map(|c| c["tool"].as_str())
        .collect();
    assert_eq!(tools, vec!["lookup"], "work w's answer: {second}");
    Ok(())
}

/// A stop is no failure of a trigger: the claims it keeps from running —
/// a turn it interrupts (the provider call gives up with
/// [`super::INTERRUPTED`]) and a claim waiting for its busy agent — go
/// back PENDING with their attempt uncounted. Before, each stayed CLAIMED
/// for boot to reclaim, an attempt used: five restarts of the daemon
/// during one long turn dead-lettered its trigger, "its lease was lost 5
/// times (the process running it died each time)", though none died.
#[test]
fn a_stop_gives_back_the_claims_it_keeps_from_running_uncounted() -> Result<(), Box<dyn std::error::Error>> {
    use crate::runtime::{CallResult, ProviderError};
    use crate::store::triggers::{Trigger, TriggerStatus};
    let clock = Arc::new(Manual::default());
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    let mut w = boot_on(&fs, &clock, false)?;
    agent_named(&mut w, 1, "ada")?;
    for (id, key) in [(2, "first"), (3, "second")] {
        let emit = EmitRequest {
            dedup_key: key.into(),
            fire_at_ms: None,
            delay_ms: None,
            agent: "ada".into(),
            prompt: format!("the {key} job"),
        };
        w.handle_request(id, Request::Emit(emit))?;
    }
    let replies = settle(&mut w)?;
    assert!(replies.iter().all(|(_, r)| r.is_ok()), "{replies:?}");
    let rows = |w: &Worker| -> Result<Vec<Trigger>, Box<dyn std::error::Error>> {
        let system = w.system();
        Ok(system.triggers().all(system.db().conn(), system.now_ms())?)
    };
    // "first" runs (its provider call out), "second" waits for ada.
    w.handle_timeout()?;
    let Some(Action::Call(call)) = w.poll_action() else {
        return Err("the first turn's provider call was not handed out".into());
    };
    let claimed: Vec<(Option<String>, TriggerStatus, u32)> = rows(&w)?
        .into_iter()
        .map(|t| (t.dedup_key, t.status, t.attempts))
        .collect();
    assert_eq!(
        claimed,
        [
            (Some("first".into()), TriggerStatus::Claimed, 1),
            (Some("second".into()), TriggerStatus::Claimed, 1)
        ]
    );
    w.stop();
    let interrupted = CallResult::Provider(Err(ProviderError(super::INTERRUPTED.into())));
    w.handle_result(call.turn, interrupted)?;
    settle(&mut w)?;
    for t in rows(&w)? {
        assert_eq!((t.status, t.attempts), (TriggerStatus::Pending, 0), "{t:?}");
    }
    // The next boot fires both, each on its first counted attempt.
    drop(w);
    let mut w = boot_on(&fs, &clock, false)?;
    for _ in 0..3 {
        w.handle_timeout()?;
        settle(&mut w)?;
    }
    for t in rows(&w)? {
        assert_eq!((t.status, t.attempts), (TriggerStatus::Done, 1), "{t:?}");
    }
    Ok(())
}

/// Names address agents, so `POST /agents` refuses a name any live agent
/// has — also when several do (children the model spawned may share a
/// name across the tree), where the lookup is ambiguous rather than
/// found (found by review: a third agent of that name was created).
#[test]
fn a_name_several_live_agents_share_is_taken() -> Result<(), Box<dyn std::error::Error>> {
    let clock = Arc::new(Manual::default());
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    {
        let deps = Deps {
            provider: Arc::new(FakeProvider::new(7)),
            tools: Arc::new(PureTools),
            outbox: Arc::new(World::with_dedup()),
            clock: clock.clone(),
        };
        let (mut system, _) = System::boot(fs.clone(), SystemConfig::new("/root", 7), deps)?;
        let rt = system.runtime_mut();
        for parent in ["a", "b"] {
            let parent = rt.create_root(parent, "")?;
            rt.spawn_child(&parent, "x", "")?;
        }
    }
    let mut w = boot_on(&fs, &clock, false)?;
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "x".into(),
            instructions: String::new(),
            parent: None,
        }),
    )?;
    let reply = settle(&mut w)?
        .into_iter()
        .find(|(id, _)| *id == 1)
        .ok_or("no reply")?;
    match reply.1 {
        Err(OpError::Conflict(message)) => assert!(message.contains("\"x\""), "{message}"),
        other => panic!("a third agent named x: {other:?}"),
    }
    let named_x = w
        .system()
        .runtime()
        .tree()
        .nodes()
        .values()
        .filter(|n| n.name == "x")
        .count();
    assert_eq!(named_x, 2);
    Ok(())
}
