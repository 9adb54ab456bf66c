//! Stand-ins for the world outside the runtime: the scripted LLM provider
//! and the tool executor whose irreversible tool goes through the activity
//! ledger to the simulated external world.
//!
//! Invariant: both are pure functions of their inputs (the prompt carries
//! the tool script), so the model can predict every turn.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use durable_agent::fs::SimFs;
use durable_agent::runtime::{
    ConversationItem, Provider, ProviderError, ProviderReply, ProviderRequest, ToolContext, ToolError,
    ToolExecutor, ToolOutput, ToolRequest,
};
use durable_agent::store::activities::{ActivityGate, ActivityOutcome, IrreversibleCall};
use durable_agent::world::{DeliveryError, Outbox, World};
use serde_json::json;

use crate::model::effect_key;
use crate::op::ToolStep;

fn parse_script(prompt: &str) -> Vec<ToolStep> {
    let script = prompt.split_once(':').map(|(_, s)| s).unwrap_or("");
    script
        .chars()
        .map(|c| ToolStep {
            irreversible: c.eq_ignore_ascii_case(&'i'),
            ok: c.is_ascii_uppercase(),
        })
        .collect()
}

/// The LLM stand-in: round `r` asks for the `r`-th scripted tool, then
/// answers `r<n>` for prompt `p<n>:…`. A pure function of the request.
#[derive(Debug)]
pub struct ScriptedProvider;

impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }
    fn model(&self) -> &str {
        "scripted-1"
    }
    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        let prompt = request
            .history
            .iter()
            .rev()
            .find_map(|i| match i {
                ConversationItem::Prompt { text } => Some(text.as_str()),
                _ => None,
            })
            .ok_or_else(|| ProviderError("no prompt in the open turn".into()))?;
        let tools = parse_script(prompt);
        let round = request.round as usize;
        if let Some(step) = tools.get(round) {
            let key = effect_key(prompt, round);
            let tool = if step.irreversible { "effect" } else { "lookup" };
            let call = ToolRequest {
                tool: tool.into(),
                args: json!({ "key": key, "ok": step.ok }),
                irreversible: step.irreversible,
            };
            return Ok(ProviderReply {
                text: String::new(),
                tool_calls: vec![call],
            });
        }
        let n = prompt.split(':').next().unwrap_or("").trim_start_matches('p');
        Ok(ProviderReply {
            text: format!("r{n}"),
            tool_calls: Vec::new(),
        })
    }
}

/// Tools: `lookup` is pure; `effect` is irreversible and goes through the
/// activity ledger ([`ActivityGate`]: INTENT, send to the world, DONE). The
/// gate is swapped at every boot (it holds that boot's connection).
#[derive(Debug, Clone, Default)]
pub struct SimTools {
    pub gate: Arc<Mutex<Option<ActivityGate>>>,
    pub world: World,
    /// The logical clock in ms, set by the driver before each op.
    pub now_ms: Arc<AtomicU64>,
}

impl ToolExecutor for SimTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let key = call
            .args
            .get("key")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let ok = call.args.get("ok").and_then(|v| v.as_bool()).unwrap_or(false);
        if !call.irreversible {
            return Ok(ToolOutput {
                ok,
                output: format!("lookup:{key}"),
            });
        }
        let gate = self.gate.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let gate = gate.ok_or_else(|| ToolError("harness: no activity gate (store not open)".into()))?;
        let call = IrreversibleCall::with_key(
            &key,
            ctx.agent.as_str(),
            "effect",
            json!({ "key": key, "ok": ok }),
        );
        let now = self.now_ms.load(Ordering::SeqCst);
        match gate.execute(&call, now) {
            Ok(ActivityOutcome::Done { .. }) => Ok(ToolOutput {
                ok: true,
                output: format!("effect:{key}"),
            }),
            Ok(ActivityOutcome::Failed { error, .. }) => Ok(ToolOutput {
                ok: false,
                output: error,
            }),
            // The fate of an earlier attempt is unknown and the world cannot
            // dedup: not re-sent. Reported with the scripted result so the
            // model's turn matches; the outbox check (R4) judges the effect.
            Ok(ActivityOutcome::NeedsConfirmation { .. }) => Ok(ToolOutput {
                ok,
                output: format!("effect:{key} needs confirmation"),
            }),
            Err(e) => Err(ToolError(e.to_string())),
        }
    }
}

/// The world as the ledger sees it: a call whose script says it fails is
/// refused (nothing delivered); every other call goes to the [`World`].
/// Decided per call from its payload, so a re-send fails the same way.
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
}

impl Outbox for ScriptedOutbox {
    fn supports_dedup(&self) -> bool {
        self.world.supports_dedup()
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
        let result = self.world.send(idem_key, action, payload);
        // One entry per delivery made (none for a refusal or a dedup).
        let mut sent_at = self.sent_at.lock().unwrap_or_else(|e| e.into_inner());
        sent_at.resize(self.world.deliveries_len(), self.fs.points());
        result
    }
}
