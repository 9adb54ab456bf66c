//! Simulated API clients: what users do to a daemon, through the worker's
//! real request types ([`Request`]), concurrently, each client with its
//! own seeded stream of choices. They live on a node of their own, so a
//! crash of the daemon's node is, to them, a connection reset: the
//! outcome of the request in flight is unknown (`Lost`) and, for a turn,
//! retried later with the same work id — as a careful HTTP client would.
//!
//! Invariant: a client records `Sent` before its request leaves and exactly
//! one of `Acked`, `Refused` or `Lost` after; what it chooses depends on
//! its seed and the answers it got, nothing else.

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

use super::node::NodeCtx;
use super::{Event, Op, SimPlan};

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
    /// what happened; now and then abandon it instead.
    async fn confirm_from(&mut self, status: &Value) {
        let Some(key) = status["needs_confirmation"][0]["idem_key"].as_str() else {
            return;
        };
        let key = key.to_string();
        let (delivered, provider_ref) = match self.ctx.world.honest_answer(&key) {
            Resolution::Delivered { provider_ref } => (true, Some(provider_ref)),
            _ => (false, None),
        };
        let abandon = self.rng.random_bool(0.2);
        let op = Op::Confirm {
            key: key.clone(),
            delivered,
        };
        let request = Request::Confirm(ConfirmRequest {
            idem_key: key,
            delivered,
            provider_ref,
            abandon,
        });
        self.call(op, request).await;
    }

    async fn one(&mut self) {
        let roll = self.rng.random_range(0..100u32);
        match roll {
            0..=29 => {
                let (agent, work) = (self.worker(), self.name("t"));
                self.turn(agent, work).await;
            }
            30..=37 if !self.unsure.is_empty() => {
                // A client retry: the same work id, whatever happened.
                let i = self.rng.random_range(0..self.unsure.len());
                let (agent, work) = self.unsure.swap_remove(i);
                self.turn(agent, work).await;
            }
            30..=37 if !self.acked.is_empty() => {
                let i = self.rng.random_range(0..self.acked.len());
                let (agent, work) = self.acked.swap_remove(i);
                self.turn(agent, work).await;
            }
            38..=52 => {
                let (from, to) = (self.worker(), self.worker());
                let op = Op::Message {
                    from: from.clone(),
                    to: to.clone(),
                };
                let payload = self.name("m");
                let request = Request::Message(MessageRequest { from, to, payload });
                self.call(op, request).await;
            }
            53..=67 => {
                let (key, agent) = (self.name("e"), self.worker());
                let delay_ms = self.rng.random_range(0..=120_000u64);
                let op = Op::Emit {
                    key: key.clone(),
                    agent: agent.clone(),
                    delay_ms,
                };
                let request = Request::Emit(EmitRequest {
                    dedup_key: key.clone(),
                    fire_at_ms: None,
                    delay_ms: Some(delay_ms),
                    agent,
                    prompt: format!("trigger {key}"),
                });
                self.call(op, request).await;
            }
            68..=72 => {
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
            73..=76 if !self.agents.is_empty() => {
                let name = self.agents.swap_remove(0);
                let op = Op::DeleteAgent { name: name.clone() };
                self.call(op, Request::DeleteAgent(name)).await;
            }
            77..=80 => {
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
            81..=83 if !self.schedules.is_empty() => {
                let id = self.schedules.swap_remove(0);
                let op = Op::DeleteSchedule { id: id.clone() };
                self.call(op, Request::DeleteSchedule(id)).await;
            }
            84..=89 => {
                if let Some(status) = self.status().await {
                    self.confirm_from(&status).await;
                }
            }
            90..=95 => {
                let Some(status) = self.status().await else { return };
                let stuck = ["DEAD", "FAILED"]
                    .iter()
                    .find_map(|s| status["triggers"][*s][0]["id"].as_str().map(str::to_string));
                if let Some(id) = stuck {
                    let op = Op::RetryTrigger { id: id.clone() };
                    self.call(op, Request::RetryTrigger(id)).await;
                }
            }
            96..=97 => {
                // Settled rows older than a day: none in a simulated run,
                // so the oracle's rows stay; the pass itself is exercised.
                let day = 86_400_000;
                let request = Request::Gc(GcRequest {
                    ttl_ms: day,
                    payload_ttl_ms: day,
                });
                self.call(Op::Gc, request).await;
            }
            _ => {
                // A human reads the status and answers what waits for them.
                if let Some(status) = self.status().await {
                    self.confirm_from(&status).await;
                }
            }
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
