//! The driver: runs resolved [`Action`]s on the real runtime
//! (`durable_agent::runtime::Runtime`) over [`SimFs`], restarts it after a
//! crash, and projects its observable state onto the model's [`State`].
//!
//! Invariant: the driver only translates. It never repairs, retries or
//! interprets the runtime's behaviour; the external world (the outbox) and
//! the id↔name maps live here because they outlive every crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use durable_agent::canary::Canaries;
use durable_agent::fs::{CrashMode, Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, ConversationItem, MessageId, Provider, ProviderError, ProviderReply, ProviderRequest, Runtime,
    RuntimeConfig, RuntimeError, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest,
};
use durable_agent::store::session::SessionState;
use serde_json::json;

use crate::model::{effect_key, Action, Agent, Msg, State, Status, Turn};
use crate::op::ToolStep;

/// Where the runtime lives on the simulated disk.
pub const ROOT: &str = "/da";

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
struct ScriptedProvider;

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

/// The simulated external world: every irreversible effect that happened,
/// by idempotency key, in order. Outside the disk, so it survives crashes.
#[derive(Debug, Clone, Default)]
pub struct World(Arc<Mutex<Vec<String>>>);

impl World {
    pub fn outbox(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Tools: `lookup` is pure, `effect` delivers its key to the [`World`].
#[derive(Debug)]
struct SimTools(World);

impl ToolExecutor for SimTools {
    fn execute(&self, _ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let key = call
            .args
            .get("key")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let ok = call.args.get("ok").and_then(|v| v.as_bool()).unwrap_or(false);
        if call.irreversible && ok {
            self.0
                 .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(key.clone());
        }
        Ok(ToolOutput {
            ok,
            output: format!("{}:{key}", call.tool),
        })
    }
}

/// One runtime on one simulated disk.
#[derive(Debug)]
pub struct Driver {
    pub fs: SimFs,
    pub world: World,
    config: RuntimeConfig,
    rt: Option<Runtime>,
    /// Every agent ever seen, so messages from terminated senders resolve.
    names: BTreeMap<AgentId, String>,
    msgs: BTreeMap<MessageId, Msg>,
}

impl Driver {
    /// A fresh disk; the runtime is not open yet (see [`Driver::open`]).
    pub fn new(seed: u64, canaries: Canaries) -> Driver {
        let world = World::default();
        let mut config = RuntimeConfig::new(seed).with_canaries(canaries);
        config.provider = Arc::new(ScriptedProvider);
        config.tools = Arc::new(SimTools(world.clone()));
        Driver {
            fs: SimFs::new(SimConfig::new(seed)),
            world,
            config,
            rt: None,
            names: BTreeMap::new(),
            msgs: BTreeMap::new(),
        }
    }

    /// Open the runtime (running recovery).
    pub fn open(&mut self) -> Result<(), RuntimeError> {
        self.rt = None;
        let fs: Arc<dyn Fs> = Arc::new(self.fs.clone());
        let (rt, _report) = Runtime::open(fs, Path::new(ROOT), self.config.clone())?;
        self.rt = Some(rt);
        Ok(())
    }

    /// Kill the process, apply `mode` to the disk, reboot the disk. The
    /// runtime must be [`Driver::open`]ed again.
    pub fn crash(&mut self, mode: CrashMode) {
        self.rt = None;
        self.fs.restart(mode);
    }

    fn rt(&mut self) -> Result<&mut Runtime, RuntimeError> {
        self.rt
            .as_mut()
            .ok_or_else(|| RuntimeError::Recovery("harness: runtime not open".into()))
    }

    fn id(&self, name: &str) -> Result<AgentId, RuntimeError> {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| RuntimeError::Recovery("harness: runtime not open".into()))?;
        rt.tree()
            .nodes()
            .iter()
            .find(|(_, v)| v.name == name)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| RuntimeError::Recovery(format!("harness: no live agent named {name}")))
    }

    /// Run one action on the runtime.
    pub fn exec(&mut self, action: &Action) -> Result<(), RuntimeError> {
        match action {
            Action::CreateRoot { name } => {
                let id = self.rt()?.create_root(name, "root")?;
                self.names.insert(id, name.clone());
            }
            Action::SpawnChild { parent, name } => {
                let parent = self.id(parent)?;
                let id = self.rt()?.spawn_child(&parent, name, "child")?;
                self.names.insert(id, name.clone());
            }
            Action::RunTurn { agent, prompt, .. } => {
                let id = self.id(agent)?;
                self.rt()?.run_turn(&id, prompt)?;
            }
            Action::SendMessage { from, to, payload } => {
                let (f, t) = (self.id(from)?, self.id(to)?);
                let mid = self.rt()?.send_message(&f, &t, payload)?;
                self.msgs.insert(
                    mid,
                    Msg {
                        from: from.clone(),
                        payload: payload.clone(),
                    },
                );
            }
            Action::Deliver { agent } => {
                let id = self.id(agent)?;
                self.rt()?.deliver(&id)?;
            }
            Action::Evict { agent } => {
                let id = self.id(agent)?;
                self.rt()?.evict(&id)?;
            }
            Action::Restore { agent } => {
                let id = self.id(agent)?;
                self.rt()?.restore(&id)?;
            }
            Action::Terminate { agent } => {
                let id = self.id(agent)?;
                self.rt()?.terminate(&id)?;
            }
        }
        Ok(())
    }

    /// The runtime's observable state as a model [`State`] (empty when not
    /// open), plus its own in-memory invariant violations.
    pub fn state(&mut self) -> (State, Vec<String>) {
        let Some(rt) = self.rt.as_ref() else {
            return (State::default(), Vec::new());
        };
        let rs = rt.state();
        let violations = rt.check_invariants();
        for (id, v) in &rs.agents {
            self.names.insert(id.clone(), v.name.clone());
        }
        let name = |names: &BTreeMap<AgentId, String>, id: &AgentId| {
            names.get(id).cloned().unwrap_or_else(|| format!("?{id}"))
        };
        let mut state = State {
            agents: BTreeMap::new(),
            outbox: self.world.outbox(),
        };
        for (id, view) in &rs.agents {
            let pending: Vec<Msg> = rs
                .pending
                .get(id)
                .map(|ms| {
                    ms.iter()
                        .map(|m| Msg {
                            from: name(&self.names, &m.from),
                            payload: m.payload.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            if let Some(ms) = rs.pending.get(id) {
                for (m, p) in ms.iter().zip(&pending) {
                    self.msgs.insert(m.id.clone(), p.clone());
                }
            }
            let delivered = rs
                .delivered
                .get(id)
                .map(|ids| {
                    ids.iter()
                        .map(|mid| {
                            self.msgs.get(mid).cloned().unwrap_or_else(|| Msg {
                                from: "?".into(),
                                payload: format!("?{mid}"),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let status = match view.session_state {
                SessionState::Active => Status::Resident,
                SessionState::Suspended | SessionState::Terminated => Status::Suspended,
            };
            let agent = Agent {
                parent: view.parent.as_ref().map(|p| name(&self.names, p)),
                status,
                turns: turns(rs.conversations.get(id).map(Vec::as_slice).unwrap_or(&[])),
                pending,
                delivered,
            };
            state.agents.insert(view.name.clone(), agent);
        }
        (state, violations)
    }

    /// The process's view of the disk (for the log invariant).
    pub fn disk(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.fs.disk_image()
    }
}

/// Fold a conversation (completed turns) into model turns.
fn turns(items: &[ConversationItem]) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::new();
    for item in items {
        match item {
            ConversationItem::Prompt { text } => out.push(Turn {
                prompt: text.clone(),
                tools: Vec::new(),
                response: String::new(),
            }),
            ConversationItem::ToolCall { irreversible, .. } => {
                if let Some(t) = out.last_mut() {
                    t.tools.push(ToolStep {
                        irreversible: *irreversible,
                        ok: false,
                    });
                }
            }
            ConversationItem::ToolResult { ok, .. } => {
                if let Some(step) = out.last_mut().and_then(|t| t.tools.last_mut()) {
                    step.ok = *ok;
                }
            }
            ConversationItem::Response { text } => {
                if let Some(t) = out.last_mut() {
                    t.response = text.clone();
                }
            }
        }
    }
    out
}
