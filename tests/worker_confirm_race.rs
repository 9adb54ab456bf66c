//! A human's `confirm` that lands while the blocked trigger's call is
//! still out (the daemon's calls run outside the worker): the trigger must
//! still run again and finish (README, "Needs-confirmation blocks the work
//! that depends on it"). Found by a review: `confirm` re-pends only FAILED
//! triggers; this one was still CLAIMED, and when the call's "needs
//! confirmation" came back it was acked FAILED naming a key nobody could
//! answer again (409), with no crash anywhere. `settle_fire` now gives the
//! claim back when the key no longer waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::runtime::{FakeProvider, PureTools};
use durable_agent::store::triggers::TriggerStatus;
use durable_agent::system::{Deps, LogicalClock, System, SystemConfig};
use durable_agent::worker::ops::{ConfirmRequest, CreateAgent, EmitRequest, Request};
use durable_agent::worker::schedule::Schedules;
use durable_agent::worker::{Action, Settings, Silent, Worker};
use durable_agent::world::{Scripted, World};

/// A prompt FakeProvider answers with one `send_email` (irreversible).
const EMAIL: &str = "please send_email to bob";

#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn boot(fs: &Arc<dyn Fs>, world: &World, clock: &Arc<Clock>) -> Worker {
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(7)),
        tools: Arc::new(PureTools),
        outbox: Arc::new(world.clone()),
        clock: clock.clone(),
    };
    let (system, _) = System::boot(fs.clone(), SystemConfig::new("/root", 7), deps).expect("boot");
    let schedules = Schedules::load(fs.clone(), std::path::Path::new("/root")).expect("schedules");
    let settings = Settings {
        poll_ms: 100,
        lease_ms: 60_000,
        slots: 2,
        wake: false,
        gc: None,
        gc_period_ms: 60_000,
    };
    Worker::new(system, schedules, Box::new(Silent), settings)
}

/// Perform every call the worker hands out until none is left; a worker
/// that stopped (unknown outcome) ends it.
fn settle(w: &mut Worker) -> bool {
    let outside = w.system().runtime().outside();
    for _ in 0..1_000 {
        match w.poll_action() {
            Some(Action::Call(call)) => {
                if w.handle_result(call.turn, outside.perform(&call.call)).is_err() {
                    return false;
                }
            }
            Some(Action::Reply(_, _)) => {}
            None => return true,
        }
    }
    panic!("the worker kept handing out calls");
}

fn status_of(w: &Worker, key: &str) -> (TriggerStatus, Option<String>) {
    let system = w.system();
    let all = system
        .triggers()
        .all(system.db().conn(), system.now_ms())
        .expect("triggers");
    let t = all
        .into_iter()
        .find(|t| t.dedup_key.as_deref() == Some(key))
        .expect("the trigger");
    (t.status, t.last_error)
}

#[test]
fn a_confirm_answered_while_the_blocked_call_is_out_still_unblocks_the_trigger() {
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    let world = World::without_dedup();
    let clock = Arc::new(Clock::default());

    // Process 1: the trigger's email is delivered and its answer lost; the
    // outcome is unknown, the worker stops (a crash, as far as the root
    // is concerned).
    let mut w = boot(&fs, &world, &clock);
    w.handle_request(
        1,
        Request::CreateAgent(CreateAgent {
            name: "mailer".into(),
            instructions: "mail".into(),
            parent: None,
        }),
    )
    .expect("create");
    w.handle_request(
        2,
        Request::Emit(EmitRequest {
            dedup_key: "mail:1".into(),
            fire_at_ms: None,
            delay_ms: None,
            agent: "mailer".into(),
            prompt: EMAIL.into(),
        }),
    )
    .expect("emit");
    assert!(settle(&mut w));
    world.script([Scripted::DeliverLoseReply]);
    w.handle_timeout().expect("pass");
    assert!(!settle(&mut w), "the lost answer must stop the worker");
    drop(w);

    // Process 2: the boot turns the INTENT into NEEDS_CONFIRMATION and
    // gives the trigger back.
    clock.0.store(1_000, Ordering::SeqCst);
    let mut w = boot(&fs, &world, &clock);
    let waiting = w.system().needs_confirmation().expect("list");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let key = waiting[0].idem_key.clone();
    assert_eq!(world.deliveries_for(&key), 1);

    // The scheduler re-fires the trigger; its turn's calls go out.
    w.handle_timeout().expect("pass");
    let outside = w.system().runtime().outside();
    let mut answered = false;
    for _ in 0..100 {
        let Some(action) = w.poll_action() else { break };
        let Action::Call(call) = action else { continue };
        let is_tool = matches!(call.call, durable_agent::runtime::OutsideCall::Tool(_));
        // The call runs outside the worker: the ledger says the key waits.
        let result = outside.perform(&call.call);
        if is_tool && !answered {
            // Meanwhile the operator, who saw the key listed by `status`,
            // answers it truthfully: the email was delivered.
            w.handle_request(
                10,
                Request::Confirm(ConfirmRequest {
                    idem_key: key.clone(),
                    delivered: true,
                    provider_ref: Some("dlv-1".into()),
                    abandon: false,
                }),
            )
            .expect("confirm");
            answered = true;
        }
        w.handle_result(call.turn, result).expect("result");
    }
    assert!(answered, "the trigger's email call never went out");
    assert!(settle(&mut w));
    assert!(
        w.system().needs_confirmation().expect("list").is_empty(),
        "the human answered the key"
    );

    // The key is answered; the work must resume and the trigger settle.
    for step in 1..=20u64 {
        clock.0.store(1_000 + step * 3_600_000, Ordering::SeqCst);
        w.handle_timeout().expect("pass");
        assert!(settle(&mut w));
    }
    let (status, last_error) = status_of(&w, "mail:1");
    // What a human who answers again gets: the key no longer waits.
    w.handle_request(
        11,
        Request::Confirm(ConfirmRequest {
            idem_key: key.clone(),
            delivered: true,
            provider_ref: Some("dlv-1".into()),
            abandon: false,
        }),
    )
    .expect("confirm again");
    let again = match w.poll_action() {
        Some(Action::Reply(11, r)) => format!("{r:?}"),
        other => format!("{other:?}"),
    };
    assert_eq!(
        status,
        TriggerStatus::Done,
        "the key {key} was answered, yet trigger mail:1 is left {status:?} \
         ({last_error:?}); confirming again: {again}"
    );
    assert_eq!(world.deliveries_for(&key), 1, "never sent twice");
}
