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
//! ([`STEERABLE`]) the run has not acknowledged yet and does it, or what
//! it needs first (an agent of its own to delete, a trigger that dies to
//! retry), so a run covers every kind whatever its seed.
//!
//! Invariant: a client records `Sent` before its request leaves and exactly
//! one of `Acked`, `Refused` or `Lost` after; what it chooses depends on
//! its seed and the answers it got, nothing else.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use durable_agent::store::activities::Resolution;
use durable_agent::worker::gc::GcRequest;
use durable_agent::worker::ops::{
    ConfirmRequest, CreateAgent, EmitRequest, MessageRequest, Request, TurnRequest,
};
use durable_agent::worker::schedule::Schedule;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use tokio::sync::oneshot;

use super::coverage::STEERABLE;
use super::node::NodeCtx;
use super::provider::POISON;
use super::{Event, Op, SimPlan};

/// Chance that a client's next request steers toward a kind not yet seen.
const STEER_PROBABILITY: f64 = 0.25;

/// A client steering toward a DEAD trigger emits another poisoned one only
/// this long after its last (one dies within seconds: the policy's
/// backoffs, a few provider latencies).
const POISON_AGAIN_MS: u64 = 120_000;

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

    async fn turn(&mut self, agent: String, work_id: String) {
        let op = Op::Turn {
            agent: agent.clone(),
            work_id: work_id.clone(),
        };
        let request = Request::Turn(
            agent.clone(),
            TurnRequest {
                prompt: format!("task {work_id}"),
                work_id: Some(work_id.clone()),
            },
        );
        match self.call(op, request).await {
            Answer::Ok(_) => self.acked.push((agent, work_id)),
            Answer::Refused | Answer::Lost => self.unsure.push((agent, work_id)),
        }
    }

    /// The status, for the requests that act on what it lists.
    async fn status(&self) -> Option<Value> {
        match self.call(Op::Status, Request::Status).await {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }

    /// Answer the first key `status` lists as needing confirmation, as an
    /// honest human would: look it up in the world (their outbox) and say
    /// what happened; now and then (or if `abandon`) give up on it instead.
    async fn confirm_from(&mut self, status: &Value, abandon: bool) {
        let Some(key) = status["needs_confirmation"][0]["idem_key"].as_str() else {
            return;
        };
        let key = key.to_string();
        let (delivered, provider_ref) = match self.ctx.world.honest_answer(&key) {
            Resolution::Delivered { provider_ref } => (true, Some(provider_ref)),
            _ => (false, None),
        };
        let abandon = abandon || self.rng.random_bool(0.2);
        let op = Op::Confirm {
            key: key.clone(),
            delivered,
            abandon,
        };
        let request = Request::Confirm(ConfirmRequest {
            idem_key: key,
            delivered,
            provider_ref,
            abandon,
        });
        self.call(op, request).await;
    }

    /// Read the status and answer what waits for a human there.
    async fn confirm(&mut self, abandon: bool) {
        if let Some(status) = self.status().await {
            self.confirm_from(&status, abandon).await;
        }
    }

    /// Retry the first trigger the status lists with one of `statuses`
    /// (DEAD, FAILED) that this client has not retried before, as an
    /// operator would (one whose retry died again is left for a closer
    /// look). `false`: none was listed.
    async fn retry_stuck(&mut self, statuses: &[&str]) -> bool {
        let Some(status) = self.status().await else {
            return true;
        };
        let stuck = statuses.iter().find_map(|s| {
            let listed = status["triggers"][*s].as_array()?;
            let id = listed
                .iter()
                .filter_map(|t| t["id"].as_str())
                .find(|id| !self.retried.contains(*id))?;
            Some((id.to_string(), s.to_string()))
        });
        let Some((id, status)) = stuck else { return false };
        self.retried.insert(id.clone());
        let op = Op::RetryTrigger {
            id: id.clone(),
            status,
        };
        self.call(op, Request::RetryTrigger(id)).await;
        true
    }

    async fn new_turn(&mut self) {
        let (agent, work) = (self.worker(), self.name("t"));
        self.turn(agent, work).await;
    }

    /// Ask a turn again: one whose outcome is unknown (a client retry,
    /// the same work id whatever happened), else an acknowledged one
    /// (must answer `already_done`). `false`: there is none.
    async fn turn_again(&mut self, unsure_first: bool) -> bool {
        let list = match (unsure_first && !self.unsure.is_empty(), self.acked.is_empty()) {
            (true, _) => &mut self.unsure,
            (false, false) => &mut self.acked,
            (false, true) if !self.unsure.is_empty() => &mut self.unsure,
            (false, true) => return false,
        };
        let i = self.rng.random_range(0..list.len());
        let (agent, work) = list.swap_remove(i);
        self.turn(agent, work).await;
        true
    }

    async fn message(&mut self) {
        let (from, to) = (self.worker(), self.worker());
        // Bracketed: found in a prompt that quotes it by a substring search.
        let payload = format!("[{}]", self.name("m"));
        let op = Op::Message {
            from: from.clone(),
            to: to.clone(),
            payload: payload.clone(),
        };
        let request = Request::Message(MessageRequest { from, to, payload });
        self.call(op, request).await;
    }

    async fn emit(&mut self, emit: Emit) {
        let op = Op::Emit {
            key: emit.key.clone(),
            agent: emit.agent.clone(),
            delay_ms: emit.delay_ms,
        };
        let request = Request::Emit(EmitRequest {
            dedup_key: emit.key.clone(),
            fire_at_ms: None,
            delay_ms: Some(emit.delay_ms),
            agent: emit.agent.clone(),
            prompt: emit.prompt.clone(),
        });
        match self.call(op, request).await {
            Answer::Ok(_) if !self.emits.iter().any(|e| e.key == emit.key) => self.emits.push(emit),
            Answer::Ok(_) => {}
            // A careful producer emits again with the same key.
            Answer::Lost => self.unsure_emits.push(emit),
            Answer::Refused => {}
        }
    }

    /// A new one-time trigger (poisoned: its provider always fails; keyed
    /// `c{client}p{n}`, so aimed crashes leave it alone).
    async fn emit_new(&mut self, poison: bool) {
        let key = self.name(if poison { "p" } else { "e" });
        let agent = self.worker();
        let delay_ms = self.rng.random_range(0..=120_000u64);
        let mut prompt = format!("trigger {key}");
        if poison {
            prompt.push_str(&format!(" {POISON}"));
            self.poisoned_at = Some(self.ctx.clock.now_ms());
        }
        self.emit(Emit {
            key,
            agent,
            delay_ms,
            prompt,
        })
        .await;
    }

    /// Emit a key again: one whose answer was lost (a retry), else an
    /// acknowledged one (an at-least-once producer's duplicate: must be
    /// answered `duplicate`). `false`: there is none.
    async fn emit_again(&mut self, unsure_first: bool) -> bool {
        let emit = if unsure_first && !self.unsure_emits.is_empty() {
            let i = self.rng.random_range(0..self.unsure_emits.len());
            self.unsure_emits.swap_remove(i)
        } else if !self.emits.is_empty() {
            let i = self.rng.random_range(0..self.emits.len());
            self.emits[i].clone()
        } else {
            return false;
        };
        self.emit(emit).await;
        true
    }

    async fn create_agent(&mut self) {
        let name = self.name("a");
        let op = Op::CreateAgent {
            name: name.clone(),
            parent: Some("lead".into()),
        };
        let request = Request::CreateAgent(CreateAgent {
            name: name.clone(),
            instructions: String::new(),
            parent: Some("lead".into()),
        });
        if let Answer::Ok(_) = self.call(op, request).await {
            self.agents.push(name);
        }
    }

    /// Delete an agent this client created; `false`: it has none.
    async fn delete_agent(&mut self) -> bool {
        if self.agents.is_empty() {
            return false;
        }
        let name = self.agents.swap_remove(0);
        let op = Op::DeleteAgent { name: name.clone() };
        self.call(op, Request::DeleteAgent(name)).await;
        true
    }

    async fn add_schedule(&mut self) {
        let id = self.name("s");
        let agent = self.worker();
        let period_ms = self.rng.random_range(60_000..=240_000u64);
        let op = Op::AddSchedule {
            id: id.clone(),
            agent: agent.clone(),
            period_ms,
        };
        let request = Request::AddSchedule(Schedule {
            id: id.clone(),
            agent,
            prompt: format!("schedule {id}"),
            period_ms,
        });
        if let Answer::Ok(_) = self.call(op, request).await {
            self.schedules.push(id);
        }
    }

    /// Delete a schedule this client added; `false`: it has none.
    async fn delete_schedule(&mut self) -> bool {
        if self.schedules.is_empty() {
            return false;
        }
        let id = self.schedules.swap_remove(0);
        let op = Op::DeleteSchedule { id: id.clone() };
        self.call(op, Request::DeleteSchedule(id)).await;
        true
    }

    async fn gc(&self) {
        // Settled rows older than a day: none in a simulated run, so the
        // oracle's rows stay; the pass itself is exercised.
        let day = 86_400_000;
        let request = Request::Gc(GcRequest {
            ttl_ms: day,
            payload_ttl_ms: day,
        });
        self.call(Op::Gc, request).await;
    }

    /// The first steerable kind (from this client's place in the list)
    /// the run has not acknowledged yet.
    fn unseen(&self) -> Option<&'static str> {
        let n = STEERABLE.len();
        (0..n)
            .map(|i| STEERABLE[(self.index + i) % n])
            .find(|kind| !self.ctx.recorder.acked(kind))
    }

    /// An op aimed at `kind`, or a step toward one (what it needs first:
    /// an agent or schedule of its own, a trigger that dies). `false`:
    /// nothing to do for it now.
    async fn steer(&mut self, kind: &str) -> bool {
        match kind {
            "delete_agent" => {
                if !self.delete_agent().await {
                    self.create_agent().await;
                }
            }
            "delete_schedule" => {
                if !self.delete_schedule().await {
                    self.add_schedule().await;
                }
            }
            "retry DEAD" => {
                let recently = self
                    .poisoned_at
                    .is_some_and(|at| self.ctx.clock.now_ms() < at + POISON_AGAIN_MS);
                if !self.retry_stuck(&["DEAD"]).await && !recently {
                    self.emit_new(true).await;
                }
            }
            "retry FAILED" => return self.retry_stuck(&["FAILED"]).await,
            "confirm abandoned" => self.confirm(true).await,
            "confirm delivered" | "confirm not delivered" => self.confirm(false).await,
            "emit duplicate" => return self.emit_again(false).await,
            "turn already done" => return self.turn_again(false).await,
            "gc" => self.gc().await,
            _ => return false,
        }
        true
    }

    async fn one(&mut self) {
        if self.rng.random_bool(STEER_PROBABILITY) {
            if let Some(kind) = self.unseen() {
                if self.steer(kind).await {
                    return;
                }
            }
        }
        let roll = self.rng.random_range(0..100u32);
        match roll {
            0..=29 => self.new_turn().await,
            30..=37 => {
                if !self.turn_again(true).await {
                    self.new_turn().await;
                }
            }
            38..=52 => self.message().await,
            53..=67 => {
                let again = self.rng.random_bool(0.15);
                if !(again && self.emit_again(true).await) {
                    let poison = self.rng.random_bool(self.ctx.plan.poison_share);
                    self.emit_new(poison).await;
                }
            }
            68..=72 => self.create_agent().await,
            73..=76 => {
                self.delete_agent().await;
            }
            77..=80 => self.add_schedule().await,
            81..=83 => {
                self.delete_schedule().await;
            }
            84..=89 => self.confirm(false).await,
            90..=95 => {
                self.retry_stuck(&["DEAD", "FAILED"]).await;
            }
            96..=97 => self.gc().await,
            // A human reads the status and answers what waits for them.
            _ => self.confirm(false).await,
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
