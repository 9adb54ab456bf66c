//! Simulated API clients: what users do to a daemon, through the worker's
//! real request types ([`Request`]), concurrently, each client with its
//! own seeded stream of choices. They live on a node of their own, so a
//! crash of the daemon's node is, to them, a connection reset: the
//! outcome of the request in flight is unknown (`Lost`) and, for a turn or
//! an emit, retried later with the same work id or dedup key — as a
//! careful HTTP client would. Producers are at-least-once: now and then an
//! acknowledged emit is sent again (it must be answered `duplicate`).
//!
//! Now and then a client steers: it picks the first kind of operation
//! ([`super::coverage::STEERABLE`]) the run has not acknowledged yet and does it, or what
//! it needs first (an agent of its own to delete, a trigger that dies to
//! retry), so a run covers every kind whatever its seed.
//!
//! Invariant: a client records `Sent` before its request leaves and exactly
//! one of `Acked`, `Refused` or `Lost` after; what it chooses depends on
//! its seed and the answers it got, nothing else.

mod requests;
mod steer;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use durable_agent::worker::ops::{CreateAgent, Request};
use durable_agent::worker::schedule::Schedule;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use tokio::sync::oneshot;

use super::node::NodeCtx;
use super::{Event, Op, SimPlan};

use self::requests::{Human, Prefer, TriggerKind};

/// Whether `work` is a one-time trigger's (a client's emit, not a
/// poisoned one): the keys clients emit are `c{client}e{n}` (poisoned:
/// `c{client}p{n}`); schedule buckets' are `scheduled:…`, wake-ups'
/// `wake:…`.
pub(super) fn is_one_time_work(work: &str) -> bool {
    let Some(key) = work.strip_prefix("trigger:").and_then(|k| k.strip_prefix('c')) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    key.split_once('e')
        .is_some_and(|(client, n)| digits(client) && digits(n))
}

/// An emit, as sent (sent again as is).
#[derive(Debug, Clone)]
struct Emit {
    key: String,
    agent: String,
    delay_ms: u64,
    prompt: String,
}

/// One request's fate, as a client sees it.
enum Answer {
    Ok(Value),
    Refused,
    Lost,
}

struct Client {
    ctx: NodeCtx,
    index: usize,
    rng: ChaCha8Rng,
    /// Counter for this client's names (work ids, keys, agents).
    next: u64,
    /// Turns whose outcome the client does not know yet: retried.
    unsure: Vec<(String, String)>,
    /// Turns acknowledged: asked again now and then (must be `already_done`).
    acked: Vec<(String, String)>,
    /// Agents and schedules this client created (acknowledged).
    agents: Vec<String>,
    schedules: Vec<String>,
    /// Emits acknowledged, and those whose answer was lost.
    emits: Vec<Emit>,
    unsure_emits: Vec<Emit>,
    /// When this client last emitted a poisoned trigger.
    poisoned_at: Option<u64>,
    /// Triggers this client retried.
    retried: BTreeSet<String>,
}

impl Client {
    fn worker(&mut self) -> String {
        SimPlan::agent_name(self.rng.random_range(0..self.ctx.plan.agents.max(1)))
    }

    fn name(&mut self, kind: &str) -> String {
        self.next += 1;
        format!("c{}{kind}{}", self.index, self.next)
    }

    async fn call(&self, op: Op, request: Request) -> Answer {
        let ctx = &self.ctx;
        ctx.record(Event::Sent {
            client: self.index,
            op: op.clone(),
        });
        let inbox = ctx.inbox.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (tx, rx) = oneshot::channel();
        let sent = match inbox {
            Some(inbox) => inbox.send((request, tx)).await.is_ok(),
            None => false,
        };
        let client = self.index;
        let answer = if sent { rx.await.ok() } else { None };
        match answer {
            Some(Ok(reply)) => {
                ctx.record(Event::Acked {
                    client,
                    op,
                    reply: reply.clone(),
                });
                Answer::Ok(reply)
            }
            Some(Err(e)) => {
                ctx.record(Event::Refused {
                    client,
                    op,
                    status: e.http_status(),
                    error: e.to_string(),
                });
                Answer::Refused
            }
            None => {
                ctx.record(Event::Lost { client, op });
                Answer::Lost
            }
        }
    }

    /// Ask until answered (acknowledged or refused, e.g. "exists").
    async fn until_answered(&self, op: Op, request: Request) {
        loop {
            match self.call(op.clone(), request.clone()).await {
                Answer::Ok(_) | Answer::Refused => return,
                Answer::Lost => tokio::time::sleep(Duration::from_millis(2_000)).await,
            }
        }
    }

    /// The lead, the workers and the recurring schedules.
    async fn set_up(&self) {
        let create = |name: &str, parent: Option<&str>| {
            let op = Op::CreateAgent {
                name: name.into(),
                parent: parent.map(str::to_string),
            };
            let request = Request::CreateAgent(CreateAgent {
                name: name.into(),
                instructions: String::new(),
                parent: parent.map(str::to_string),
            });
            (op, request)
        };
        let (op, request) = create("lead", None);
        self.until_answered(op, request).await;
        for i in 0..self.ctx.plan.agents {
            let (op, request) = create(&SimPlan::agent_name(i), Some("lead"));
            self.until_answered(op, request).await;
        }
        for r in &self.ctx.plan.recurring {
            let agent = SimPlan::agent_name(r.agent);
            let op = Op::AddSchedule {
                id: r.id.clone(),
                agent: agent.clone(),
                period_ms: r.period_ms,
            };
            let request = Request::AddSchedule(Schedule {
                id: r.id.clone(),
                agent,
                prompt: format!("recurring {}", r.id),
                period_ms: r.period_ms,
            });
            self.until_answered(op, request).await;
        }
    }

    async fn one(&mut self) {
        if self.steers().await {
            return;
        }
        let roll = self.rng.random_range(0..100u32);
        match roll {
            0..=29 => self.new_turn().await,
            30..=37 => {
                if !self.turn_again(Prefer::Unsure).await {
                    self.new_turn().await;
                }
            }
            38..=52 => self.message().await,
            53..=67 => {
                let again = self.rng.random_bool(0.15);
                if !(again && self.emit_again(Prefer::Unsure).await) {
                    let kind = match self.rng.random_bool(self.ctx.plan.poison_share) {
                        true => TriggerKind::Poisoned,
                        false => TriggerKind::Plain,
                    };
                    self.emit_new(kind).await;
                }
            }
            68..=72 => self.create_agent().await,
            73..=76 => {
                self.delete_agent().await;
            }
            77..=80 => self.add_schedule().await,
            81..=83 => {
                if self.rng.random_bool(0.5) {
                    self.reschedule().await;
                } else {
                    self.delete_schedule().await;
                }
            }
            84..=89 => self.confirm(Human::Honest).await,
            90..=95 => {
                self.retry_stuck(&["DEAD", "FAILED"]).await;
            }
            96..=97 => self.gc().await,
            // A human reads the status and answers what waits for them.
            _ => self.confirm(Human::Honest).await,
        }
    }
}

/// Client `index`: client 0 sets the root up, then every client issues
/// requests with a seeded think time until the supervisor's horizon.
pub(super) async fn run_client(ctx: NodeCtx, index: usize) {
    let seed = ctx.plan.seed ^ (index as u64 + 1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    let mut client = Client {
        ctx,
        index,
        rng: ChaCha8Rng::seed_from_u64(seed),
        next: 0,
        unsure: Vec::new(),
        acked: Vec::new(),
        agents: Vec::new(),
        schedules: Vec::new(),
        emits: Vec::new(),
        unsure_emits: Vec::new(),
        poisoned_at: None,
        retried: BTreeSet::new(),
    };
    if index == 0 {
        client.set_up().await;
        client.ctx.ready.store(true, Ordering::SeqCst);
    }
    while !client.ctx.ready.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    loop {
        let (lo, hi) = client.ctx.plan.think_ms;
        let think = client.rng.random_range(lo..=hi.max(lo));
        tokio::time::sleep(Duration::from_millis(think)).await;
        client.one().await;
    }
}
