//! Stand-ins for the world outside the system: the scripted LLM provider,
//! the operator's `PreToolUse` hooks ([`ScriptedHooks`]), the reversible
//! tool, the outbox of the simulated external world (where the system's
//! activity ledger sends irreversible effects) and the clock.
//!
//! Invariant: both are pure functions of their inputs (the prompt carries
//! the tool script) and of what the world remembers — the provider's asks
//! so far ([`Rewording`]) and the asks it failed ([`ProviderFaults`]), each
//! recorded with the I/O point it happened after, so a run forked at a
//! crash point remembers exactly what a replay killed there would — so the
//! model can predict every turn.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::SimFs;
use durable_agent::runtime::{
    ConversationItem, HookDecision, Hooks, PreToolUse, Provider, ProviderError, ProviderReply,
    ProviderRequest, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest, ToolRetries, Usage,
};
use durable_agent::system::LogicalClock;
use durable_agent::world::{DeliveryError, Outbox, World};
use serde_json::{json, Value};

use crate::model::{call_key, failing_asks, script_rounds, send_by_id, IdFrom, OrchCall};
use crate::op::Lost;
use crate::oracle_context::Asks;
use durable_agent::runtime::orchestration::{LIST_AGENTS, SEND_MESSAGE, SPAWN_AGENT};

/// The LLM stand-in: round `r` asks for the `r`-th round of the script
/// (one call, or several asked together), then answers `r<n>` for prompt
/// `p<n>:…`.
///
/// Like a real model it need not repeat itself: with [`Rewording`], a
/// round asked again (the same prompt and round after a crash) is, when
/// the seed says so, answered with the same calls worded differently —
/// other arguments, so other idempotency keys — while each call's logical
/// `key` (what the world counts an effect by) stays. A runtime that asks
/// the model again for a round whose decision it had already acted on
/// then sends one effect twice under two keys, and the world sees it.
/// Without [`Rewording`] the answer is a pure function of the request.
#[derive(Debug, Clone, Default)]
pub struct ScriptedProvider {
    pub rewording: Option<Rewording>,
    /// Where every ask is recorded for the context oracle
    /// ([`crate::oracle_context`]).
    pub asked: Option<Asks>,
    /// The transient failures the script asks for
    /// ([`crate::op::ToolStep::provider_fails`]); `None`: it never fails.
    pub faults: Option<ProviderFaults>,
}

/// The provider's transient failures: the first `n` asks of a round
/// whose script says `~`×`n` fail, per agent (a twin is failed afresh),
/// with a message naming the ask. Every failure a live process was handed
/// is recorded, in order, with the I/O point count it happened after
/// (a fork at point `p` keeps those before `p`): what the oracle holds
/// the `errors` rows to ([`crate::driver`]'s E1–E2). Clones share the
/// record.
#[derive(Debug, Clone)]
pub struct ProviderFaults {
    pub fs: SimFs,
    pub failed: Arc<Mutex<Vec<FailedAsk>>>,
}

/// One failure the provider handed to a live process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedAsk {
    pub agent: String,
    pub prompt: String,
    pub round: u32,
    /// The error message ([`failure_message`]).
    pub message: String,
    /// I/O points done when it was handed out.
    pub point: u64,
    /// The turn's number (the agent's completed turns when its op began),
    /// noted by the driver once the op returns.
    pub turn: Option<u64>,
    /// Its op was cut (a crash, an injected I/O fault, a lost answer
    /// reopened): its row may be missing.
    pub cut: bool,
}

/// The message of the `nth` (from 1) failed ask of `round` of the turn
/// with `prompt`: what its `errors` row must say.
pub fn failure_message(prompt: &str, round: u32, nth: usize) -> String {
    format!("scripted transient failure {nth} of {prompt} round {round}")
}

impl ProviderFaults {
    pub fn new(fs: SimFs) -> ProviderFaults {
        ProviderFaults {
            fs,
            failed: Arc::default(),
        }
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Vec<FailedAsk>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this ask fails (`Some` message): it is one of the first
    /// `fails` asks of the round by this agent. Recorded when the
    /// process lives (a dead one's ask reaches no one).
    fn fail(&self, agent: &str, prompt: &str, round: u32, fails: u8) -> Option<String> {
        if fails == 0 {
            return None;
        }
        let mut failed = self.record();
        let before = failed
            .iter()
            .filter(|f| f.agent == agent && f.prompt == prompt && f.round == round)
            .count();
        if before >= usize::from(fails) {
            return None;
        }
        let message = failure_message(prompt, round, before + 1);
        if !self.fs.crashed() {
            failed.push(FailedAsk {
                agent: agent.to_string(),
                prompt: prompt.to_string(),
                round,
                message: message.clone(),
                point: self.fs.points(),
                turn: None,
                cut: false,
            });
        }
        Some(message)
    }

    /// The record as a run forked at `point` has it.
    pub fn fork(&self, fs: SimFs, point: u64) -> ProviderFaults {
        let kept = self
            .record()
            .iter()
            .take_while(|f| f.point < point)
            .cloned()
            .collect();
        ProviderFaults {
            fs,
            failed: Arc::new(Mutex::new(kept)),
        }
    }

    /// Every failure handed out so far, in order.
    pub fn all(&self) -> Vec<FailedAsk> {
        self.record().clone()
    }

    /// How many asks of each round the provider failed, by
    /// [`crate::model::ask_key`] (the model's [`crate::model::Model::provider_failed`]).
    pub fn counts(&self) -> std::collections::BTreeMap<String, u8> {
        let mut out = std::collections::BTreeMap::new();
        for f in self.record().iter() {
            let n: &mut u8 = out
                .entry(crate::model::ask_key(&f.agent, &f.prompt, f.round))
                .or_default();
            *n = n.saturating_add(1);
        }
        out
    }

    /// Number the failures handed out since point `since` as turn `turn`.
    pub fn note_turn(&self, since: u64, turn: u64) {
        for f in self.record().iter_mut().filter(|f| f.point >= since) {
            f.turn.get_or_insert(turn);
        }
    }

    /// The op that began after point `since` was cut: its failures' rows
    /// may be missing.
    pub fn cut_since(&self, since: u64) {
        for f in self.record().iter_mut().filter(|f| f.point >= since) {
            f.cut = true;
        }
    }
}

/// How [`ScriptedProvider`] varies its answers: every ask it answered (a
/// hash of its prompt and round) with the I/O point count it happened
/// after, so a run forked at point `n` knows the asks made before `n`
/// (as [`ScriptedOutbox`] does for deliveries). Clones share the record.
#[derive(Debug, Clone)]
pub struct Rewording {
    pub seed: u64,
    pub fs: SimFs,
    pub asks: Arc<Mutex<Vec<(u64, u64)>>>,
}

/// Share of the re-asks answered with other words (the rest repeat the
/// first answer, as a model at temperature 0 may), out of 4.
const REWORD_OF_4: u64 = 3;

impl Rewording {
    /// Record this ask (a live process only: a dead one asks nothing) and
    /// say how to word it: `None` for the script's own words, else a
    /// variant tag. Asks are counted per agent: another agent running the
    /// same prompt (a twin turn) is asked afresh, so its calls are the
    /// first agent's calls word for word.
    fn ask(&self, agent: &str, prompt: &str, round: u32) -> Option<String> {
        let id = durable_agent::runtime::ids::fnv1a(format!("{agent}\n{prompt}\n{round}").as_bytes());
        let mut asks = self.asks.lock().unwrap_or_else(|e| e.into_inner());
        let before = asks.iter().filter(|(a, _)| *a == id).count() as u64;
        if !self.fs.crashed() {
            asks.push((id, self.fs.points()));
        }
        if before == 0 {
            return None;
        }
        let draw = durable_agent::runtime::ids::fnv1a(format!("{}:{id}:{before}", self.seed).as_bytes());
        (draw % 4 < REWORD_OF_4).then(|| format!("ask {before}, variant {:x}", draw >> 48))
    }

    /// Asks made before I/O point `point` (the length of [`Rewording::fork`]'s record).
    pub fn count_before(&self, point: u64) -> usize {
        let asks = self.asks.lock().unwrap_or_else(|e| e.into_inner());
        asks.iter().take_while(|(_, p)| *p < point).count()
    }

    /// The record as a run forked at `point` has it.
    pub fn fork(&self, fs: SimFs, point: u64) -> Rewording {
        let n = self.count_before(point);
        let asks = self.asks.lock().unwrap_or_else(|e| e.into_inner());
        let kept = asks[..n].to_vec();
        Rewording {
            seed: self.seed,
            fs,
            asks: Arc::new(Mutex::new(kept)),
        }
    }
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }
    fn model(&self) -> &str {
        "scripted-1"
    }
    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        if let Some(asked) = &self.asked {
            asked.record(request);
        }
        let prompt = request
            .history
            .iter()
            .rev()
            .find_map(|i| match i {
                ConversationItem::Prompt { text } => Some(text.as_str()),
                _ => None,
            })
            .ok_or_else(|| ProviderError("no prompt in the open turn".into()))?;
        let rounds = script_rounds(prompt);
        let wording = self
            .rewording
            .as_ref()
            .and_then(|r| r.ask(request.agent_name, prompt, request.round));
        if let Some(faults) = &self.faults {
            let fails = failing_asks(prompt)
                .get(request.round as usize)
                .copied()
                .unwrap_or(0);
            if let Some(message) = faults.fail(request.agent_name, prompt, request.round, fails) {
                return Err(ProviderError(message));
            }
        }
        if let Some(round) = rounds.get(request.round as usize) {
            let tool_calls = round
                .iter()
                .map(|(index, step, call)| match call {
                    // The runtime performs these itself; never reworded, so
                    // a re-asked round names the same child and payload.
                    Some(OrchCall::Spawn { name } | OrchCall::RefusedSpawn { name }) => ToolRequest {
                        tool: SPAWN_AGENT.into(),
                        args: json!({ "name": name, "instructions": "a spawned worker" }),
                        irreversible: false,
                        invalid_args: None,
                    },
                    Some(OrchCall::List) => ToolRequest {
                        tool: LIST_AGENTS.into(),
                        args: json!({}),
                        irreversible: false,
                        invalid_args: None,
                    },
                    Some(OrchCall::Send { to, payload }) => ToolRequest {
                        tool: SEND_MESSAGE.into(),
                        args: json!({ "to": recipient(request.history, prompt, *index, to), "payload": payload }),
                        irreversible: false,
                        invalid_args: None,
                    },
                    // Nonsense arguments: the raw text, as a provider
                    // adapter hands them on when they do not parse.
                    None if step.garbled => {
                        let raw = format!("{{\"key\": \"{}\", \"ok\": tr", call_key(prompt, *index));
                        let why = match serde_json::from_str::<serde_json::Value>(&raw) {
                            Ok(_) => "not a JSON object".to_string(),
                            Err(e) => format!("not JSON ({e})"),
                        };
                        ToolRequest {
                            tool: tool_name(step.irreversible).into(),
                            args: serde_json::Value::String(raw),
                            irreversible: step.irreversible,
                            invalid_args: Some(why),
                        }
                    }
                    // A call the operator's hooks deny (they deny what
                    // carries `deny`): never run, whatever its kind.
                    None if step.denied => ToolRequest {
                        tool: tool_name(step.irreversible).into(),
                        args: json!({ "key": call_key(prompt, *index), "ok": true, "deny": true }),
                        irreversible: step.irreversible,
                        invalid_args: None,
                    },
                    None => {
                        let mut args = json!({ "key": call_key(prompt, *index), "ok": step.ok });
                        if let (true, Some(map)) = (step.confirm, args.as_object_mut()) {
                            map.insert("confirm".into(), json!(true));
                        }
                        let lost = match step.lost {
                            Lost::None => None,
                            Lost::Reply => Some("reply"),
                            Lost::Request => Some("request"),
                        };
                        if let (Some(lost), Some(map)) = (lost, args.as_object_mut()) {
                            map.insert("lost".into(), json!(lost));
                        }
                        if let (Some(w), Some(map)) = (&wording, args.as_object_mut()) {
                            map.insert("wording".into(), json!(w));
                        }
                        ToolRequest {
                            tool: tool_name(step.irreversible).into(),
                            args,
                            irreversible: step.irreversible,
                            invalid_args: None,
                        }
                    }
                })
                .collect();
            return Ok(ProviderReply {
                text: String::new(),
                tool_calls,
                usage: Some(Usage {
                    input_tokens: request.history.len() as u64,
                    output_tokens: 1,
                }),
            });
        }
        let n = prompt.split(':').next().unwrap_or("").trim_start_matches('p');
        Ok(ProviderReply {
            text: format!("r{n}"),
            tool_calls: Vec::new(),
            usage: Some(Usage {
                input_tokens: request.history.len() as u64,
                output_tokens: 1,
            }),
        })
    }
}

/// The tool a plain step calls: the irreversible `effect` (through the
/// activity ledger to [`ScriptedOutbox`]) or the reversible `lookup`.
/// Whom a scripted send names: `to`, or, when the script sends by id
/// ([`send_by_id`]), the id of `to` read from an earlier result in the
/// open turn's conversation — the spawn of that child, or the turn's
/// `list_agents` — as a model given the result would. A spawn refused
/// (a failed result) gave no id: the send names the child, and fails, as
/// the model expects. A result that succeeded yet names no id for `to`
/// is the runtime's fault: the send then names no agent (`to?`), and
/// fails where the model expects it to succeed.
fn recipient(history: &[ConversationItem], prompt: &str, index: usize, to: &str) -> String {
    let Some(from) = send_by_id(prompt, index, to) else {
        return to.to_string();
    };
    let open = history
        .iter()
        .rposition(|i| matches!(i, ConversationItem::Prompt { .. }))
        .map_or(history, |p| &history[p..]);
    let call = open.iter().find_map(|i| match i {
        ConversationItem::ToolCall {
            call_id, tool, args, ..
        } => match from {
            IdFrom::Spawn if tool == SPAWN_AGENT && args.get("name").and_then(Value::as_str) == Some(to) => {
                Some(call_id)
            }
            IdFrom::List if tool == LIST_AGENTS => Some(call_id),
            _ => None,
        },
        _ => None,
    });
    let result = call.and_then(|call| {
        open.iter().find_map(|i| match i {
            ConversationItem::ToolResult { call_id, ok, output } if call_id == call => Some((*ok, output)),
            _ => None,
        })
    });
    let Some((true, output)) = result else {
        return to.to_string();
    };
    let shown: Option<Value> = serde_json::from_str(output).ok();
    let id = match from {
        IdFrom::Spawn => shown.as_ref().and_then(|v| v.pointer("/spawned/agent_id")),
        IdFrom::List => shown
            .as_ref()
            .and_then(|v| v.get("agents"))
            .and_then(Value::as_array)
            .and_then(|agents| {
                agents
                    .iter()
                    .find(|a| a.get("name").and_then(Value::as_str) == Some(to))
            })
            .and_then(|a| a.get("id")),
    };
    match id.and_then(Value::as_str) {
        Some(id) => id.to_string(),
        None => format!("{to}?"),
    }
}

fn tool_name(irreversible: bool) -> &'static str {
    if irreversible {
        "effect"
    } else {
        "lookup"
    }
}

/// The operator's `PreToolUse` hooks, as the system is configured with
/// them (`SystemConfig::hooks`): a call whose arguments carry `"deny":
/// true` ([`crate::op::ToolStep::denied`]) is denied; one that carries
/// `"confirm": true` ([`crate::op::ToolStep::confirm`]) waits for a
/// human; one the model expects to fail (`"ok": false`) has its
/// arguments rewritten (an `audited` tag, so its idempotency key is the
/// rewritten arguments'); every other call is left to the model's
/// asking. The oracle reads the logged verdicts against this policy
/// (`driver::project::hook_violations`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedHooks;

impl ScriptedHooks {
    /// The policy: what the hooks answer for a call of `tool` asked with
    /// `input` (the one statement of it, for the system and the oracle).
    pub fn decide(tool: &str, input: &serde_json::Value) -> Vec<HookDecision> {
        let marked = |name: &str| input.get(name).and_then(|v| v.as_bool());
        if marked("deny") == Some(true) {
            return vec![HookDecision::Deny {
                reason: format!("{tool} is not allowed here"),
            }];
        }
        if marked("confirm") == Some(true) {
            return vec![HookDecision::RequireConfirmation {
                reason: format!("{tool} needs a human's approval"),
            }];
        }
        if marked("ok") == Some(false) {
            // An auditing policy: a call expected to fail is tagged.
            return vec![HookDecision::ModifyArgs {
                patch: json!({ "audited": true }),
            }];
        }
        Vec::new()
    }
}

impl Hooks for ScriptedHooks {
    fn pre_tool_use(&self, call: &PreToolUse<'_>) -> Vec<HookDecision> {
        Self::decide(call.tool_name, call.tool_input)
    }
}

/// The reversible tool `lookup`: a pure function of its arguments, at an
/// endpoint that may not answer ([`Lost`] on a reversible step): a hard
/// failure (`ToolError::Transient`), which the system retries
/// ([`LookupRetries`]) and numbers in the ledger's attempts. `"lost":
/// "reply"`: the endpoint never answers. `"lost": "request"`: the first
/// attempt of the call's idempotency key is lost, every later one answers
/// (the key is remembered in `lost_first` with the I/O point count it was
/// lost after, so a crash image forked at point `n` keeps the losses
/// before `n`, as the world would; a dead process reaches nothing and
/// loses nothing). The irreversible `effect` never reaches here: the
/// system routes it through its activity ledger to [`ScriptedOutbox`].
#[derive(Debug, Clone)]
pub struct SimTools {
    fs: SimFs,
    lost_first: Arc<Mutex<Vec<(String, u64)>>>,
}

impl SimTools {
    pub fn new(fs: SimFs) -> SimTools {
        SimTools {
            fs,
            lost_first: Arc::default(),
        }
    }

    /// The tools of a run killed at I/O point `point` on `fs`: the world
    /// keeps the first attempts it lost before that point.
    pub fn fork(&self, fs: SimFs, point: u64) -> SimTools {
        let kept = self
            .lost_first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, at)| *at < point)
            .cloned()
            .collect();
        SimTools {
            fs,
            lost_first: Arc::new(Mutex::new(kept)),
        }
    }

    /// How many first attempts the world lost before I/O point `point`
    /// (counted in place: the sweep's verdict key asks at every point).
    pub fn lost_before(&self, point: u64) -> usize {
        self.lost_first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, at)| *at < point)
            .count()
    }
}

/// A lookup's hard failure as the executor reports it.
fn unreachable_lookup(idem_key: &str) -> String {
    format!("lookup {idem_key}: its endpoint did not answer")
}

impl ToolExecutor for SimTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let key = call.args.get("key").and_then(|v| v.as_str()).unwrap_or("");
        let ok = call.args.get("ok").and_then(|v| v.as_bool()).unwrap_or(false);
        let unreachable = || Err(ToolError::Transient(unreachable_lookup(ctx.idempotency_key)));
        match call.args.get("lost").and_then(|v| v.as_str()) {
            Some("reply") => return unreachable(),
            Some("request") if self.fs.crashed() => return unreachable(),
            Some("request") => {
                let mut lost = self.lost_first.lock().unwrap_or_else(|e| e.into_inner());
                if !lost.iter().any(|(k, _)| k == ctx.idempotency_key) {
                    lost.push((ctx.idempotency_key.to_string(), self.fs.points()));
                    return unreachable();
                }
            }
            _ => {}
        }
        Ok(ToolOutput {
            ok,
            output: format!("lookup:{key}"),
        })
    }
}

/// Retries of a lookup's hard failure the harness boots with, as an
/// operator's `[retries.tools.lookup] max_retries = 1` would: a call whose
/// endpoint never answers fails after `1 + LOOKUP_RETRIES` attempts.
pub const LOOKUP_RETRIES: u32 = 1;

/// The retry plan the harness boots with: [`LOOKUP_RETRIES`] immediate
/// retries of the lookup, none of anything else (an irreversible call
/// whose answer was lost keeps its unknown fate, as before).
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupRetries;

impl ToolRetries for LookupRetries {
    fn delay_before(&self, call: &ToolRequest, next_attempt: u32) -> Option<u64> {
        (call.tool == tool_name(false) && next_attempt <= 1 + LOOKUP_RETRIES).then_some(0)
    }

    fn wait(&self, _delay_ms: u64) {}
}

/// The harness's logical clock: set by the driver before each op (and
/// for the boot). Clones share the reading.
#[derive(Debug, Clone, Default)]
pub struct SteppedClock(Arc<AtomicU64>);

impl SteppedClock {
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl LogicalClock for SteppedClock {
    fn now_ms(&self) -> u64 {
        self.get()
    }
}

/// The world as the ledger sees it: a call whose script says it fails is
/// refused (nothing delivered); every other call goes to the [`World`].
/// Decided per call from its payload, so a re-send fails the same way.
///
/// A call whose script says the world loses its answer ([`Lost`]) gets
/// no answer ([`DeliveryError::Unknown`]): `"lost": "reply"` each time
/// the world records a new delivery for it (a re-send the world dedups is
/// answered); `"lost": "request"` on the first send of its key only,
/// delivering nothing (the key is remembered in `lost_keys`; a fork
/// starts with none, like the run it stands for when the point lies
/// before that first send; a boot sends only to a world that dedups, and
/// its send may then be the first). Each lost answer's key is logged in
/// `lost`, so the harness tells this op's unknown outcome (the world's
/// doing) from a runtime that refused a valid op, and a boot's INTENT
/// left for next time from one it forgot.
///
/// A dead process reaches nothing: once the disk's crash point was hit,
/// a send gets no answer and delivers nothing (a killed process makes no
/// more calls; the harness only lets its code run on until it returns).
/// Each delivery records the I/O point count it happened after, so a
/// crash image forked at point `n` sees exactly the deliveries made
/// before point `n`.
#[derive(Debug, Clone)]
pub struct ScriptedOutbox {
    pub world: World,
    pub fs: SimFs,
    pub sent_at: Arc<Mutex<Vec<u64>>>,
    pub lost: Arc<Mutex<Vec<String>>>,
    pub lost_keys: Arc<Mutex<BTreeSet<String>>>,
}

impl ScriptedOutbox {
    fn lose(&self, idem_key: &str) {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(idem_key.to_string());
    }
}

impl Outbox for ScriptedOutbox {
    fn supports_dedup(&self, action: &str) -> bool {
        self.world.supports_dedup(action)
    }

    fn send(
        &self,
        idem_key: &str,
        action: &str,
        payload: &serde_json::Value,
    ) -> Result<String, DeliveryError> {
        if self.fs.crashed() {
            return Err(DeliveryError::Unknown {
                idem_key: idem_key.to_string(),
            });
        }
        if payload.get("ok").and_then(|v| v.as_bool()) == Some(false) {
            return Err(DeliveryError::Rejected {
                idem_key: idem_key.to_string(),
                reason: "scripted failure".into(),
            });
        }
        let lost = payload.get("lost").and_then(|v| v.as_str());
        if lost == Some("request") {
            let mut keys = self.lost_keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys.insert(idem_key.to_string()) {
                self.lose(idem_key);
                return Err(DeliveryError::Unknown {
                    idem_key: idem_key.to_string(),
                });
            }
        }
        let before = self.world.deliveries_len();
        let result = self.world.send(idem_key, action, payload);
        // One entry per delivery made (none for a refusal or a dedup).
        let mut sent_at = self.sent_at.lock().unwrap_or_else(|e| e.into_inner());
        sent_at.resize(self.world.deliveries_len(), self.fs.points());
        let delivered_now = self.world.deliveries_len() > before;
        if delivered_now && lost == Some("reply") {
            self.lose(idem_key);
            return Err(DeliveryError::Unknown {
                idem_key: idem_key.to_string(),
            });
        }
        result
    }
}
