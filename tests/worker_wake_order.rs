//! `serve`'s wake-ups deliver a recipient's messages in enqueue order: the
//! wake-up of a message runs only after every message enqueued to its
//! recipient before it is delivered — even when the earlier one's turn
//! fails and its trigger backs off, and across a restart meanwhile — unless
//! the earlier one's wake-up was given up (DEAD after its attempts): then
//! the later ones are woken, never starved behind a message the model
//! cannot answer (src/system/wake.rs).
//!
//! Held to:
//! - README.md, "What the runtime guarantees": "**Messages whose enqueue
//!   was acknowledged are never lost**; re-delivery is allowed
//!   (at-least-once, never reordered)."
//! - src/runtime/inbox.rs: "order is enqueue order".
//!
//! Found by a review: the first message's wake-up failed once (a 503), the
//! second's ran at once, superseded the failed turn and delivered "second"
//! while "first" was still pending.
//!
//! Driven through the daemon's own core (`Worker`, as `serve` drives it),
//! wake-ups on (`[orchestration] wake = true`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, ConversationItem, MessageId, Provider, ProviderError, ProviderReply, ProviderRequest, PureTools,
};
use durable_agent::store::triggers::TriggerStatus;
use durable_agent::system::{wake_key, Deps, LogicalClock, System, SystemConfig};
use durable_agent::worker::ops::{CreateAgent, MessageRequest, Request};
use durable_agent::worker::schedule::Schedules;
use durable_agent::worker::{Action, Settings, Silent, Worker};
use durable_agent::world::World;

#[derive(Debug, Default)]
struct Manual(AtomicU64);

impl LogicalClock for Manual {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Answers every ask with text, except an ask of a turn whose prompt
/// quotes the message "first": that one fails (a 503) — once, or always.
#[derive(Debug)]
struct FailsFirst {
    always: bool,
    failed: AtomicBool,
}

impl Provider for FailsFirst {
    fn name(&self) -> &str {
        "fails-first"
    }
    fn model(&self) -> &str {
        "fails-first-1"
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
        if prompt.ends_with("first") && (!self.failed.swap(true, Ordering::SeqCst) || self.always) {
            return Err(ProviderError("HTTP 503".into()));
        }
        Ok(ProviderReply {
            text: "read it".into(),
            tool_calls: Vec::new(),
            usage: None,
        })
    }
}

/// Boot the system on `fs` and a worker on it, wake-ups on (two slots:
/// room for both wake-ups at once).
fn boot(fs: &Arc<dyn Fs>, clock: &Arc<Manual>, provider: &Arc<FailsFirst>) -> Worker {
    let deps = Deps {
        provider: provider.clone(),
        tools: Arc::new(PureTools),
        outbox: Arc::new(World::with_dedup()),
        clock: clock.clone(),
    };
    let (system, _) = System::boot(fs.clone(), SystemConfig::new("/root", 7), deps).expect("boot");
    let schedules = Schedules::load(fs.clone(), Path::new("/root")).expect("schedules load");
    let settings = Settings {
        poll_ms: 100,
        lease_ms: 60_000,
        slots: 2,
        wake: true,
        gc: None,
        gc_period_ms: 60_000,
    };
    Worker::new(system, schedules, Box::new(Silent), settings)
}

/// Perform every call the worker hands out until it has none.
fn settle(w: &mut Worker) {
    let outside = w.system().runtime().outside();
    for _ in 0..1_000 {
        match w.poll_action() {
            Some(Action::Call(call)) => w
                .handle_result(call.turn, outside.perform(&call.call))
                .expect("the worker takes the call's result"),
            Some(Action::Reply(id, r)) => {
                r.unwrap_or_else(|e| panic!("request {id} failed: {e}"));
            }
            None => return,
        }
    }
    panic!("the worker kept handing out calls");
}

fn agent(w: &Worker, name: &str) -> AgentId {
    w.system()
        .runtime()
        .tree()
        .nodes()
        .iter()
        .find(|(_, n)| n.name == name)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("agent {name} is live"))
}

/// The status of `message`'s wake-up trigger, if it has one.
fn wake_status(w: &Worker, message: &MessageId) -> Option<TriggerStatus> {
    let system = w.system();
    let rows = system
        .triggers()
        .all(system.db().conn(), system.now_ms())
        .expect("trigger rows");
    let key = wake_key(message);
    rows.into_iter()
        .find(|t| t.dedup_key.as_deref() == Some(key.as_str()))
        .map(|t| t.status)
}

/// Messages "first" then "second" from p to q; the scheduler runs, time
/// passing (past any backoff) between passes, the process restarting
/// after pass `restart_after` if given (no time passing across it). Returns the worker at the end and
/// the two messages' ids.
fn run(always: bool, restart_after: Option<usize>, passes: usize) -> (Worker, MessageId, MessageId) {
    let clock = Arc::new(Manual::default());
    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(7)));
    let provider = Arc::new(FailsFirst {
        always,
        failed: AtomicBool::new(false),
    });
    let mut w = boot(&fs, &clock, &provider);
    for (i, name) in ["p", "q"].into_iter().enumerate() {
        let create = CreateAgent {
            name: name.into(),
            instructions: String::new(),
            parent: None,
        };
        w.handle_request(i as u64, Request::CreateAgent(create))
            .expect("create agent");
    }
    for (i, payload) in ["first", "second"].into_iter().enumerate() {
        let send = MessageRequest {
            from: "p".into(),
            to: "q".into(),
            payload: payload.into(),
        };
        w.handle_request(10 + i as u64, Request::Message(send))
            .expect("send message");
    }
    settle(&mut w);
    let q = agent(&w, "q");
    let ids: Vec<MessageId> = w
        .system()
        .runtime()
        .pending(&q)
        .iter()
        .map(|m| m.id.clone())
        .collect();
    assert_eq!(ids.len(), 2, "both messages pending, in enqueue order");
    let (first, second) = (ids[0].clone(), ids[1].clone());

    for pass in 0..passes {
        w.handle_timeout().expect("scheduler pass");
        settle(&mut w);
        let state = w.system().runtime().state();
        let delivered = &state.delivered[&q];
        let first_given_up = wake_status(&w, &first) == Some(TriggerStatus::Dead);
        assert!(
            !delivered.contains(&second) || delivered.contains(&first) || first_given_up,
            "pass {pass}: message {second} (\"second\") was delivered while {first} (\"first\"), enqueued \
             before it, is still pending and its wake-up is {:?}: {:?}",
            wake_status(&w, &first),
            state.pending[&q].iter().map(|m| &m.payload).collect::<Vec<_>>()
        );
        if restart_after == Some(pass) {
            // At once: the next pass comes while the failed wake-up of
            // "first" still backs off.
            drop(w.into_system());
            w = boot(&fs, &clock, &provider);
            continue;
        }
        clock.0.fetch_add(1_000, Ordering::SeqCst);
    }
    (w, first, second)
}

#[test]
fn a_recipients_messages_are_delivered_in_enqueue_order_by_its_wake_ups() {
    let (w, first, second) = run(false, None, 20);
    let q = agent(&w, "q");
    let state = w.system().runtime().state();
    assert!(state.delivered[&q].contains(&first) && state.delivered[&q].contains(&second));
    assert_eq!(wake_status(&w, &first), Some(TriggerStatus::Done));
    assert_eq!(wake_status(&w, &second), Some(TriggerStatus::Done));
}

#[test]
fn enqueue_order_holds_across_a_restart_while_the_first_wake_up_backs_off() {
    // Pass 0 fails the first message's turn; the restarted process's first
    // pass, while that wake-up still backs off, has emitted nothing yet and
    // must still not wake "second" first.
    let (w, first, second) = run(false, Some(0), 20);
    let q = agent(&w, "q");
    let state = w.system().runtime().state();
    assert!(state.delivered[&q].contains(&first) && state.delivered[&q].contains(&second));
}

#[test]
fn a_dead_wake_up_holds_no_later_message_back() {
    // "first" always fails: its wake-up dies after the policy's attempts
    // (backoff 1 + 2 + 4 + 8 s); "second" is then woken, never starved.
    let (w, first, second) = run(true, None, 40);
    let q = agent(&w, "q");
    let state = w.system().runtime().state();
    assert_eq!(wake_status(&w, &first), Some(TriggerStatus::Dead));
    assert!(
        state.delivered[&q].contains(&second),
        "\"second\" is delivered after \"first\"'s wake-up died"
    );
    assert!(
        state.pending[&q].iter().any(|m| m.id == first),
        "\"first\" stays pending (never lost) for the next turn that reads it"
    );
}
