//! The reference model: the runtime's ACKNOWLEDGED state as plain data, and
//! what each operation does to it.
//!
//! Invariant: [`Model::apply`] is pure and total over the actions
//! [`Model::resolve`] produces, and a [`State`] is exactly what the runtime
//! promises to keep across a crash: the agent tree, each agent's completed
//! turns, pending and delivered messages, and the irreversible effects the
//! external world received. Nothing here knows about files, fsync or the
//! runtime's types; the driver projects the runtime onto a [`State`] and the
//! oracle compares.

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::runtime::orchestration::OrchestrationTool;
use serde::{Deserialize, Serialize};

use crate::op::{Lost, Op, Orch, ToolStep};

mod triggers;

pub use triggers::{
    backoff_ms, TriggerRow, TriggerStatus, BACKOFF_BASE_MS, BACKOFF_CAP_MS, KEYS as TRIGGER_KEYS,
    MAX_ATTEMPTS,
};

/// Distinct trigger dedup keys (for rendering ops).
pub fn triggers_keys() -> u8 {
    TRIGGER_KEYS
}

/// Whether an agent's session holds a provider slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Holds a slot (created, restored, or used by a turn).
    Resident,
    /// Evicted, or recovered after a restart.
    Suspended,
}

/// A message as the model knows it (ids are the runtime's business).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Msg {
    pub from: String,
    pub payload: String,
}

/// A completed (acknowledged) turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Turn {
    pub prompt: String,
    pub tools: Vec<ToolStep>,
    pub response: String,
}

/// One live agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Agent {
    pub parent: Option<String>,
    pub status: Status,
    pub turns: Vec<Turn>,
    /// Enqueued, not yet delivered, in enqueue order.
    pub pending: Vec<Msg>,
    /// Delivered, in delivery order.
    pub delivered: Vec<Msg>,
}

/// The acknowledged state of the whole runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct State {
    /// Live agents by name (terminated agents are gone).
    pub agents: BTreeMap<String, Agent>,
    /// Idempotency keys of irreversible effects the world received, in order.
    pub outbox: Vec<String>,
    /// Durable triggers in emit (rowid) order.
    #[serde(default)]
    pub triggers: Vec<TriggerRow>,
    /// The checkpointed loop's messages (contents), up to its last
    /// checkpoint: what a resumed loop reloads.
    #[serde(default)]
    pub loop_messages: Vec<String>,
    /// Each live agent's session record (`session.json`) as the disk
    /// holds it. Derived, never kept: the model's own state leaves it
    /// empty and [`Model::expected`] fills it from the rule
    /// ([`Model::records`]) where a state is compared.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub records: BTreeMap<String, Record>,
    /// The job runs (the runs table's user runs, `durable-agent runs`) by
    /// id, with their status as the table spells it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runs: BTreeMap<String, String>,
}

/// A session record's fields the harness can predict (the provider's
/// blob and the write time are the runtime's business).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Record {
    pub schema_version: u32,
    pub provider: String,
    pub model: String,
    /// ACTIVE exactly while the session holds a provider slot; SUSPENDED
    /// otherwise (a live agent's record is never TERMINATED).
    pub active: bool,
}

/// The version this build writes session records with: a record of any
/// other version on disk was not written by this run.
pub const RECORD_VERSION: u32 = 2;
/// The scripted provider's names ([`crate::standins::ScriptedProvider`]),
/// which every record of a system booted with it carries.
pub const PROVIDER: (&str, &str) = ("scripted", "scripted-1");

/// A resolved operation: concrete names and payloads, ready for both the
/// model and the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    CreateRoot {
        name: String,
    },
    SpawnChild {
        parent: String,
        name: String,
    },
    RunTurn {
        agent: String,
        prompt: String,
        tools: Vec<ToolStep>,
        response: String,
        /// The turn reads the agent's pending messages (delivered with it).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reads: bool,
    },
    /// A work turn (API `work_id`) of `agent`: the caller `asked` with its
    /// prompt, the runtime runs `prompt` — the one the work first started
    /// with — reading `reads` (the messages pending when it first started,
    /// those still pending), then the work is done.
    WorkTurn {
        agent: String,
        work: String,
        asked: String,
        prompt: String,
        tools: Vec<ToolStep>,
        response: String,
        reads: Vec<Msg>,
    },
    /// A work turn of a work that completed: answered from the log, no turn.
    WorkDone {
        agent: String,
        work: String,
        asked: String,
    },
    SendMessage {
        from: String,
        to: String,
        payload: String,
    },
    Deliver {
        agent: String,
    },
    Evict {
        agent: String,
    },
    Restore {
        agent: String,
    },
    Terminate {
        agent: String,
    },
    Emit {
        key: String,
        /// When the row is due (`fire_at`, ms).
        #[serde(default)]
        fire_at: u64,
    },
    /// Claim the next due trigger, which the model predicts is `key`.
    Claim {
        key: String,
    },
    /// Claim when the model says no row is due (none pending, or each
    /// under its backoff floor): the store must hand out nothing. Asked,
    /// not skipped, so a claim that ignores time is seen.
    ClaimNothing,
    Ack {
        key: String,
        ok: bool,
    },
    /// Fire trigger `key` (the next due one): its turn on `agent`, then
    /// the ack. When the model knows the turn already completed (a crash
    /// lost only the ack) no turn runs.
    Fire {
        key: String,
        agent: String,
        prompt: String,
        tools: Vec<ToolStep>,
        response: String,
    },
    /// A zombie ack of `key` with a claim from before a restart: refused,
    /// nothing changes.
    StaleAck {
        key: String,
    },
    /// An operator's retry of DEAD or FAILED trigger `key`.
    Retry {
        key: String,
    },
    /// One pass of the daemon's GC (`worker::gc::collect`): a collecting
    /// pass deletes every settled row (see [`Model::collect`]); a
    /// stripping one (`strip`) runs when no settled row is past the TTL
    /// yet but every one is past the payload TTL, so it deletes nothing
    /// and strips the bodies of the settled rows no resume needs, which
    /// the state does not show.
    Gc {
        strip: bool,
    },
    /// A human's answer for the call with idempotency key `idem` (the
    /// effect `effect`): `delivered` when the world has it.
    Confirm {
        idem: String,
        effect: String,
        delivered: bool,
    },
    /// Loop round `round` with `tools` tool messages.
    LoopRound {
        round: u64,
        tools: u8,
    },
    /// A new job run `run` ([`Op::JobRun`]): root `agent`, then its row
    /// (`running`), then the work [`job_work`] with `prompt`, then
    /// `succeeded`. Its states between those commits are the oracle's
    /// candidates ([`Model::job_midpoints`]).
    JobRun {
        run: String,
        agent: String,
        prompt: String,
        tools: Vec<ToolStep>,
        response: String,
    },
    /// `durable-agent run --resume {run}` ([`Op::JobResume`]): the run
    /// `running` again if it was not, its work turn run again — answered
    /// from the log when it completed (`done`), else continued (a started
    /// work: the prompt, calls and messages it started with) or run (a
    /// work that never started: the job's prompt) —, then `succeeded`,
    /// and its RESUME trigger settled DONE if PENDING.
    JobResume {
        run: String,
        agent: String,
        prompt: String,
        tools: Vec<ToolStep>,
        response: String,
        done: bool,
    },
    /// An operator's release of `run` ([`Op::Release`]). Nothing the model
    /// holds changes: a job run is never released (one waiting waits on a
    /// confirmation), and whether a session run waits for a human is the
    /// ledger's (oracle R9); the driver holds the answer to the run's
    /// status just before.
    Release {
        run: RunRef,
    },
}

/// A run an operator names ([`Action::Release`]).
impl Action {
    /// The agent, prompt and tool steps of the turn `self` runs, for every
    /// action that runs one (a job resume's whether or not its work is
    /// done: callers that care check `done`).
    pub fn turn(&self) -> Option<(&String, &String, &[ToolStep])> {
        match self {
            Action::RunTurn {
                agent, prompt, tools, ..
            }
            | Action::WorkTurn {
                agent, prompt, tools, ..
            }
            | Action::Fire {
                agent, prompt, tools, ..
            }
            | Action::JobRun {
                agent, prompt, tools, ..
            }
            | Action::JobResume {
                agent, prompt, tools, ..
            } => Some((agent, prompt, tools)),
            _ => None,
        }
    }

    /// [`Action::turn`] for an action that runs its turn now: not a done
    /// job's resume, which answers from the log with no turn.
    pub fn turn_to_run(&self) -> Option<(&String, &String, &[ToolStep])> {
        match self {
            Action::JobResume { done: true, .. } => None,
            _ => self.turn(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunRef {
    /// A job run, by id.
    Job(String),
    /// The session run of the live agent so named.
    Session(String),
}

/// A run's status as the runs table spells it.
pub const RUNNING: &str = "running";
pub const SUCCEEDED: &str = "succeeded";
pub const WAITING_FOR_HUMAN: &str = "waiting_for_human";

/// The work id of job run `run` (`durable_agent::system::job_work`).
pub fn job_work(run: &str) -> String {
    durable_agent::system::job_work(run)
}

/// The job run whose work a RESUME trigger's key (a [`work_key`]) names.
pub fn job_of_key(key: &str) -> Option<&str> {
    key.strip_prefix("resume:run:")?.split('@').next()
}

/// The messages of loop round `round`: the assistant's, then each tool's.
pub fn round_messages(round: u64, tools: u8) -> Vec<String> {
    let mut out = vec![format!("a{round}")];
    out.extend((0..tools).map(|i| format!("t{round}.{i}")));
    out
}

/// Tools per turn, at most: the scripted provider asks for at least one
/// per round and the runtime allows 4 rounds
/// (`RuntimeConfig::max_tool_rounds`), the last of which must answer.
/// Longer scripts (from `arbitrary`) are cut.
pub const MAX_TOOLS_PER_TURN: usize = 3;

/// How the tool-call ledger (seed 004) must hold one tool call of a turn
/// the runtime answered: settled — `succeeded` exactly when its result
/// was ok —, classed irreversible exactly when it acts on the world, and
/// never replayed. The session's run is `running`. What a crash may
/// change (oracle R9): a reversible call of a turn re-run after a crash
/// that caught it in flight is replayed, once per such crash, each replay
/// counted as it begins; its answer settles it (a success clears the
/// count); asked again after [`MAX_REPLAYS`] replays that never answered,
/// it is refused — answered and settled failed with
/// `system::parked_answer` — and its run waits for a human, whose calls
/// in flight are all refused from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerCall {
    pub irreversible: bool,
    pub succeeded: bool,
    /// A hook parks it for a human first: run once they release it,
    /// each run then counted like a replay, or answered from their word
    /// uncounted (`ToolExecutor::execute_after_confirmation`).
    pub confirmed: bool,
    /// A lookup whose endpoint fails it hard ([`Lost`] on a reversible
    /// step; `None` for every other call): each failed attempt is a
    /// numbered row of the call's attempts, which continue across crashes
    /// and which the answer counts — a call that never answers fails
    /// "(failed N time(s))" with N its rows, at least
    /// `1 + LOOKUP_RETRIES` (exactly that when the boot's reading shows
    /// no earlier process ran it); one whose first attempt was lost
    /// answers as scripted with at most one row (exactly one then)
    /// ([`crate::standins::SimTools`]).
    pub hard: Lost,
}

/// Replays of one call (each counted as it begins) before the next ask
/// parks its run for a human (the system's tool-call ledger is built with
/// the default limit, 3).
pub const MAX_REPLAYS: u32 = 3;

/// Deepest child a spawn may create (a root is depth 0): the product's
/// default (`Orchestration::all`), which the driver boots with. A spawn
/// asked by an agent already at this depth is refused: the call fails,
/// nothing is created, the turn goes on ([`Model::within_depth`]).
pub const MAX_DEPTH: u32 = 2;

/// Children per agent (`orchestration.max_children`), live or being
/// spawned by its turns not completed (in flight, interrupted or parked):
/// the driver boots with this, far below the product's default (8), so
/// that cases reach it. A spawn past it is refused like one past
/// [`MAX_DEPTH`] ([`Model::limit_refusals`]).
pub const MAX_CHILDREN: usize = 2;

/// Agents in the tree (`orchestration.max_agents`), live or being spawned
/// by any turn not completed (in flight, interrupted or parked), that the
/// run with `seed` boots with: 9 for half the seeds, 5 or 3 for a quarter
/// each — far below the product's default (64), and small enough in some
/// runs that a turn's second spawn meets the limit with its first still
/// pending. Drawn from bits of the seed
/// [`dedup_world`] and [`installed_by`] do not read.
pub fn max_agents(seed: u64) -> usize {
    match (seed >> 5) % 4 {
        0 => 3,
        1 => 5,
        _ => MAX_AGENTS_MOST,
    }
}

/// The tree's limit of most runs ([`max_agents`]), and of a model not
/// made for a seed.
const MAX_AGENTS_MOST: usize = 9;

/// How many `spawn_agent` calls the script of `prompt` asks for.
fn spawn_calls(prompt: &str) -> usize {
    orch_calls(prompt)
        .iter()
        .filter(|c| matches!(c, OrchCall::Spawn { .. }))
        .count()
}

/// Agent names the driver's orchestration grants cover: `a000` to
/// `a999` ([`grants`]).
const GRANTED_NAMES: u64 = 1000;

/// Whether the agent named `name` may call `tool` under the grants the
/// driver boots with ([`grants`]): an agent named `a<n>` by `create_root`
/// or `spawn_child` may not spawn when `n % 7 == 3` and may not send when
/// `n % 7 == 5`; every other agent (a spawned child's name has an `s`)
/// has the default grant, every tool. A call not granted fails, and
/// nothing comes of it.
pub fn granted(name: &str, tool: OrchestrationTool) -> bool {
    let n = name
        .strip_prefix('a')
        .and_then(|d| d.parse::<u64>().ok())
        .filter(|n| *n < GRANTED_NAMES && format!("a{n:03}") == name);
    !matches!(
        (n.map(|n| n % 7), tool),
        (Some(3), OrchestrationTool::SpawnAgent) | (Some(5), OrchestrationTool::SendMessage)
    )
}

/// The per-agent grants [`granted`] describes, as the runtime's
/// configuration holds them (`Orchestration::grants`, the tools each named
/// agent may call, replacing the default). Built once: every boot clones
/// them.
pub fn grants() -> &'static BTreeMap<String, BTreeSet<OrchestrationTool>> {
    static GRANTS: std::sync::LazyLock<BTreeMap<String, BTreeSet<OrchestrationTool>>> =
        std::sync::LazyLock::new(build_grants);
    &GRANTS
}

fn build_grants() -> BTreeMap<String, BTreeSet<OrchestrationTool>> {
    (0..GRANTED_NAMES)
        .map(|n| format!("a{n:03}"))
        .filter_map(|name| {
            let tools: BTreeSet<OrchestrationTool> = OrchestrationTool::ALL
                .into_iter()
                .filter(|t| granted(&name, *t))
                .collect();
            (tools.len() < OrchestrationTool::ALL.len()).then_some((name, tools))
        })
        .collect()
}

/// The ledger's calls of a turn asked with `tools`, one per plain tool
/// step in order (orchestration calls are the runtime's own, not in the
/// ledger): `None` for a call a hook denied, which never reaches the
/// executor, so must have no row.
pub fn ledger_calls(tools: &[ToolStep]) -> Vec<Option<LedgerCall>> {
    tools
        .iter()
        .filter(|t| t.orch.is_none())
        .map(|t| {
            (!t.denied).then_some(LedgerCall {
                irreversible: t.irreversible,
                succeeded: t.ok,
                confirmed: t.confirm,
                hard: if t.irreversible { Lost::None } else { t.lost },
            })
        })
        .collect()
}

/// Whether `action` is a plain turn whose first call a hook parks for a
/// human ([`ToolStep::confirm`]): the one stop a world that dedups allows
/// ([`Model::blocked`]).
fn hook_parks(action: &Action) -> bool {
    matches!(action, Action::RunTurn { tools, .. } if tools.first().is_some_and(|t| t.confirm))
}

/// Whether `effect` ([`effect_key`]) is a call a hook parks for a human
/// ([`ToolStep::confirm`]), by its turn's script.
pub fn parked_by_hook(effect: &str) -> bool {
    let Some((prompt, index)) = effect.split_once('/').and_then(|(_, call)| call.rsplit_once('#')) else {
        return false;
    };
    // A repeat's effect carries its occurrence after the index.
    let index = index.split_once('@').map_or(index, |(i, _)| i);
    let Ok(index) = index.parse::<usize>() else {
        return false;
    };
    parse_script(prompt).get(index).is_some_and(|(_, t, _)| t.confirm)
}

/// The logical action the `index`-th tool of the turn with `prompt` asks
/// for (the call's `key` argument, what the world counts an effect by).
/// Every agent that runs the prompt asks for it with the same arguments:
/// a twin turn ([`crate::op::Op::TwinTurn`]) makes the same call.
pub fn call_key(prompt: &str, index: usize) -> String {
    format!("{prompt}#{index}")
}

/// Whether the run with `seed` talks to a world that dedups by
/// idempotency key (one seed in four), as an email or payments API with
/// idempotency keys does: the activity ledger then re-sends an
/// irreversible call a crash left in doubt with its key
/// (`ActivityStore::resume_record`), and the world delivers it at most
/// once; elsewhere such a call waits for a human. Both worlds are real
/// (`system::outbox` routes each action to one), and the driver and the
/// model read this one choice.
pub fn dedup_world(seed: u64) -> bool {
    seed % 4 == 2
}

/// The schema version of the build that ran on the root before this one
/// was installed there: this build's own for most seeds (a new install);
/// for three seeds in eight an older build's (1, 2 or 3), whose store the
/// install's boot migrates (an upgrade, crashed and judged like every
/// other boot: the store then holds nothing the model does not, and every
/// op after it must behave as on a new install). Drawn from bits of the
/// seed [`dedup_world`] does not read.
pub fn installed_by(seed: u64) -> u32 {
    use durable_agent::store::schema::SCHEMA_VERSION;
    match (seed >> 2) % 8 {
        older @ 1..=3 => (older as u32).min(SCHEMA_VERSION - 1),
        _ => SCHEMA_VERSION,
    }
}

/// The effect the `index`-th tool of `agent`'s turn with `prompt` has on
/// the world, when `occurrence` of the agent's completed turns had that
/// prompt before it ([`Model::effect`]): agent-scoped, since two agents'
/// identical calls are two effects, and numbered when an agent runs a
/// prompt again (a repeat, [`crate::op::Op::TwinTurn`]): the same call
/// asked in a second turn is a second effect, under the runtime's second
/// idempotency key (the driver numbers the world's deliveries of one call
/// by the keys they came with, first seen first). Within one occurrence a
/// duplicate in the outbox is a real double side effect.
pub fn effect_key(agent: &str, prompt: &str, index: usize, occurrence: usize) -> String {
    match occurrence {
        0 => format!("{agent}/{}", call_key(prompt, index)),
        n => format!("{agent}/{}@{n}", call_key(prompt, index)),
    }
}

/// A turn's prompt: unique (`p<n>`) and carrying the tool script, so the
/// stateless scripted provider can follow it: `p7:Ir` = an irreversible
/// tool that succeeds, then (next round) a reversible one that fails;
/// `p7:I+r` asks for both in one round; `p7:I~~r` has the provider fail
/// the first two asks of the second round ([`ToolStep::provider_fails`]),
/// and `p7:I~` the first ask for the final answer; `L` and `N` are irreversible ones
/// whose answer the world loses, having acted or not ([`Lost`]); `U` a
/// reversible one whose endpoint never answers, `F` and `f` one whose
/// first attempt the world loses, then answers ok or failed; `X` and
/// `x` an irreversible and a reversible one with nonsense arguments
/// ([`ToolStep::garbled`]); `D` and `d` an irreversible and a reversible
/// one a hook denies ([`ToolStep::denied`]); `Q` and `q` one a hook
/// parks for a human ([`ToolStep::confirm`]); `C`
/// spawns a child ([`spawn_name`]) and `M(a003)` sends agent `a003` a
/// message ([`Orch`]); `B` asks for a spawn the runtime must refuse
/// ([`refused_spawn_name`]), `K` for one named as the turn's last spawn
/// before it, and `K(a003)` for one named as the caller's child `a003`
/// ([`Orch::RefusedSpawn`]); `A` lists the agents ([`Orch::List`]).
/// `agents` are the live agents, in name order,
/// that a send's [`crate::op::AgentRef`] picks from; `children` the
/// caller's live children, in name order (none: a work's or a fire's,
/// whose caller is not known yet).
pub fn script_prompt(
    n: u64,
    tools: &[ToolStep],
    agents: &[&String],
    children: &[&String],
    final_fails: u8,
) -> String {
    let mut script = String::new();
    for (i, t) in tools.iter().enumerate() {
        if i > 0 && t.joins_round {
            script.push('+');
        }
        // A failing ask belongs to the round: only a step opening one
        // carries it (see [`normalized_failing`]).
        script.push_str(&"~".repeat(usize::from(t.provider_fails)));
        let last_spawn = spawn_before(tools, i);
        match t.orch {
            Orch::Spawn => script.push('C'),
            // A refused spawn: the name of an earlier spawn of the turn
            // (one in two, when there is one), else a name no agent may
            // take.
            Orch::RefusedSpawn if (n + i as u64).is_multiple_of(2) && last_spawn.is_some() => {
                script.push('K')
            }
            // Else the name of a child the caller has (two in three, when
            // it has one), else a name no agent may take.
            Orch::RefusedSpawn if !children.is_empty() && !(n + i as u64).is_multiple_of(3) => {
                let child = children[(n as usize + i) % children.len()];
                script.push_str(&format!("K({child})"));
            }
            Orch::RefusedSpawn => script.push('B'),
            Orch::List => script.push('A'),
            // A send after a spawn of the turn goes to that child, still
            // pending: the runtime resolves it among the turn's spawns, by
            // name, or by the id the spawn's result gave when it came
            // back in an earlier round ([`send_by_id`]).
            Orch::Send(to) => {
                let pending = last_spawn.map(|j| spawn_name(&format!("p{n}"), j));
                match pending.as_ref().or(pick(agents, to.0)) {
                    Some(name) => script.push_str(&format!("M({name})")),
                    // No agent to send to: a lookup instead.
                    None => script.push('R'),
                }
            }
            Orch::None if t.denied => script.push(if t.irreversible { 'D' } else { 'd' }),
            Orch::None if t.confirm => script.push(if t.irreversible { 'Q' } else { 'q' }),
            Orch::None if t.garbled => script.push(if t.irreversible { 'X' } else { 'x' }),
            Orch::None => script.push(match (t.irreversible, t.ok) {
                (true, true) if t.lost == Lost::Reply => 'L',
                (true, true) if t.lost == Lost::Request => 'N',
                (true, true) => 'I',
                (true, false) => 'i',
                (false, _) if t.lost == Lost::Reply => 'U',
                (false, true) if t.lost == Lost::Request => 'F',
                (false, false) if t.lost == Lost::Request => 'f',
                (false, true) => 'R',
                (false, false) => 'r',
            }),
        }
    }
    // Failing asks for the final answer trail the script.
    script.push_str(&"~".repeat(usize::from(final_fails.min(crate::op::MAX_PROVIDER_FAILS))));
    format!("p{n}:{script}")
}

/// The place of the turn's last spawn before its `i`-th step, if any: a
/// send at `i` goes to that child ([`script_prompt`]), and fails when the
/// spawn was refused ([`Model::within_depth`]).
fn spawn_before(tools: &[ToolStep], i: usize) -> Option<usize> {
    tools[..i].iter().rposition(|t| t.orch == Orch::Spawn)
}

/// How many asks for the final answer of the turn with `prompt` the
/// provider fails ([`crate::op::Op::RunTurn`]'s `final_fails`): the `~`
/// trailing its script (a `~` before a step is that step's round's).
pub fn final_fails(prompt: &str) -> u8 {
    let script = prompt.split_once(':').map(|(_, s)| s).unwrap_or("");
    let trailing = script.len() - script.trim_end_matches('~').len();
    u8::try_from(trailing).unwrap_or(u8::MAX)
}

/// How many times the provider fails each ask of the turn with `prompt`,
/// by ask (the provider's `round`): each tool round's failing asks
/// ([`ToolStep::provider_fails`], on the step that opens it), then the
/// final answer's ([`final_fails`]). The one reading of a script's
/// failures, for the scripted provider and the model.
pub fn failing_asks(prompt: &str) -> Vec<u8> {
    script_rounds(prompt)
        .iter()
        .map(|steps| steps.first().map_or(0, |(_, t, _)| t.provider_fails))
        .chain(std::iter::once(final_fails(prompt)))
        .collect()
}

/// An orchestration call of a turn's script, as its prompt names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrchCall {
    Spawn {
        name: String,
    },
    /// A spawn the runtime must refuse ([`Orch::RefusedSpawn`]).
    RefusedSpawn {
        name: String,
    },
    Send {
        to: String,
        payload: String,
    },
    /// `list_agents`: no effect.
    List,
}

/// One step of a prompt's script: its index in the turn, the step, and
/// the orchestration call it is, if any.
pub type ScriptStep = (usize, ToolStep, Option<OrchCall>);

/// The name of the child the `index`-th call of the turn with `prompt`
/// spawns (`a007s1`: never a name `create_root` or `spawn_child` gives).
/// By the prompt's number and the call's place, one in five joins with
/// each character a name may hold besides letters and digits (`-`, `_`,
/// `.`), and one in five is padded to exactly the length limit: names
/// the runtime must accept, at the edges of what it accepts.
pub fn spawn_name(prompt: &str, index: usize) -> String {
    let n = prompt_number(prompt);
    match (n + index as u64) % 5 {
        1 => format!("a{n:03}-s{index}"),
        2 => format!("a{n:03}_s{index}"),
        3 => format!("a{n:03}.s{index}"),
        4 => format!(
            "{:x<width$}",
            format!("a{n:03}s{index}"),
            width = durable_agent::runtime::orchestration::MAX_NAME_LEN
        ),
        _ => format!("a{n:03}s{index}"),
    }
}

/// The name the `index`-th call of the turn with `prompt` asks a spawn
/// for that the runtime must refuse (`B` in the script): empty, one over
/// the length limit, with a space, the reserved `parent`, or a 16-digit
/// hex id (names may not look like the ids that also address agents),
/// by the prompt's number and the call's place. (`K` asks for the name
/// of the turn's last spawn before it: a child it already has, pending.)
pub fn refused_spawn_name(prompt: &str, index: usize) -> String {
    let n = prompt_number(prompt);
    match (n + index as u64) % 5 {
        0 => String::new(),
        1 => "x".repeat(durable_agent::runtime::orchestration::MAX_NAME_LEN + 1),
        2 => format!("a{n} s{index}"),
        3 => "parent".into(),
        _ => format!("{:016x}", n * 16 + index as u64),
    }
}

/// Where a scripted send finds its recipient's id ([`send_by_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdFrom {
    /// The result of the turn's spawn of that child, in an earlier round.
    Spawn,
    /// The result of the turn's `list_agents` call, in an earlier round.
    List,
}

/// Whether the `index`-th call of the turn with `prompt`, a send to
/// `to`, addresses its recipient by agent id rather than by name, and
/// where it reads the id: when `to` is a child the turn spawned in an
/// earlier round, from that spawn's result (one in two sends, by the
/// prompt's number and the call's place); else when the turn listed the
/// agents in an earlier round, from the listing. The scripted provider
/// then sends to the id it reads from that result, as a model given the
/// result would.
pub fn send_by_id(prompt: &str, index: usize, to: &str) -> Option<IdFrom> {
    let rounds = script_rounds(prompt);
    let round = rounds
        .iter()
        .position(|r| r.iter().any(|(j, _, _)| *j == index))?;
    let earlier = || rounds[..round].iter().flatten().map(|(_, _, c)| c);
    if earlier().any(|c| matches!(c, Some(OrchCall::Spawn { name }) if name == to)) {
        return (prompt_number(prompt) / 2 + index as u64)
            .is_multiple_of(2)
            .then_some(IdFrom::Spawn);
    }
    earlier()
        .any(|c| matches!(c, Some(OrchCall::List)))
        .then_some(IdFrom::List)
}

/// The payload of the message the `index`-th call of the turn with
/// `prompt` sends (`m7.1`: never one `send_message` gives).
pub fn sent_payload(prompt: &str, index: usize) -> String {
    format!("m{}.{index}", prompt_number(prompt))
}

fn prompt_number(prompt: &str) -> u64 {
    let head = prompt.split(':').next().unwrap_or("");
    head.trim_start_matches('p').parse().unwrap_or(0)
}

/// The script of a prompt ([`script_prompt`]'s inverse), step by step:
/// the one reading of it, for the scripted provider and the model.
pub fn parse_script(prompt: &str) -> Vec<ScriptStep> {
    let script = prompt.split_once(':').map(|(_, s)| s).unwrap_or("");
    let mut out = Vec::new();
    let mut joins = false;
    let mut fails = 0u8;
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '+' {
            joins = true;
            continue;
        }
        if c == '~' {
            fails = fails.saturating_add(1);
            continue;
        }
        let index = out.len();
        let mut step = ToolStep {
            irreversible: matches!(c, 'I' | 'i' | 'L' | 'N' | 'X' | 'D' | 'Q'),
            ok: (c.is_ascii_uppercase() && !matches!(c, 'X' | 'D' | 'U')) || c == 'q',
            joins_round: joins,
            lost: match c {
                'L' | 'U' => Lost::Reply,
                'N' | 'F' | 'f' => Lost::Request,
                _ => Lost::None,
            },
            orch: Orch::None,
            provider_fails: std::mem::take(&mut fails),
            garbled: matches!(c, 'X' | 'x'),
            denied: matches!(c, 'D' | 'd'),
            confirm: matches!(c, 'Q' | 'q'),
        };
        let call = match c {
            'C' => {
                step.orch = Orch::Spawn;
                Some(OrchCall::Spawn {
                    name: spawn_name(prompt, index),
                })
            }
            'M' => {
                let to = parenthesised(&mut chars);
                // The recipient's index is not in the prompt; the model
                // reads the call by name.
                step.orch = Orch::Send(crate::op::AgentRef(0));
                Some(OrchCall::Send {
                    to,
                    payload: sent_payload(prompt, index),
                })
            }
            'A' => {
                step.orch = Orch::List;
                Some(OrchCall::List)
            }
            'B' | 'K' => {
                step.orch = Orch::RefusedSpawn;
                step.ok = false;
                let named = match c {
                    'K' => parenthesised(&mut chars),
                    _ => String::new(),
                };
                let earlier = out
                    .iter()
                    .rev()
                    .find(|(_, t, _): &&ScriptStep| t.orch == Orch::Spawn)
                    .map(|(j, _, _)| spawn_name(prompt, *j));
                Some(OrchCall::RefusedSpawn {
                    name: match (c, earlier) {
                        ('K', _) if !named.is_empty() => named,
                        ('K', Some(name)) => name,
                        _ => refused_spawn_name(prompt, index),
                    },
                })
            }
            _ => None,
        };
        out.push((index, step, call));
        joins = false;
    }
    out
}

/// The name a script step carries in parentheses right after its letter
/// (`M(a003)`, `K(a003)`), consumed from `chars`; empty when none.
fn parenthesised(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut name = String::new();
    if chars.peek() == Some(&'(') {
        chars.next();
        for c in chars.by_ref() {
            if c == ')' {
                break;
            }
            name.push(c);
        }
    }
    name
}

/// The orchestration calls of the turn with `prompt`, in order.
pub fn orch_calls(prompt: &str) -> Vec<OrchCall> {
    parse_script(prompt)
        .into_iter()
        .filter_map(|(_, _, c)| c)
        .collect()
}

/// The key of `agent`'s work `work` in the model's bookkeeping, which is
/// also the dedup key of its RESUME trigger as the driver projects it
/// (`resume:{work}@{agent id}`, the agent by name).
pub fn work_key(agent: &str, work: &str) -> String {
    format!("resume:{work}@{agent}")
}

/// The RESUME trigger key of job run `run`'s work on `agent`.
pub fn job_work_key(agent: &str, run: &str) -> String {
    work_key(agent, &job_work(run))
}

/// A turn's steps as the provider asks them: at most
/// [`MAX_TOOLS_PER_TURN`], each [`ToolStep::normalized`], and no failing
/// ask (a work turn's or a fire's: their failure is the caller's retry —
/// an API 502, a trigger acked failed with backoff — which the model does
/// not state; see [`normalized_failing`]).
pub fn normalized(tools: &[ToolStep]) -> Vec<ToolStep> {
    normalized_failing(tools)
        .into_iter()
        .map(|t| ToolStep {
            provider_fails: 0,
            // A work's or a fire's stop at a parked call is the caller's
            // retry, which the model does not state (as a failing ask).
            confirm: false,
            ..t
        })
        .collect()
}

/// A plain turn's steps as the provider asks them: as [`normalized`], but
/// a step that opens a round keeps its failing asks
/// ([`ToolStep::provider_fails`]); one joining a round has none.
pub fn normalized_failing(tools: &[ToolStep]) -> Vec<ToolStep> {
    tools
        .iter()
        .take(MAX_TOOLS_PER_TURN)
        .enumerate()
        .map(|(i, t)| {
            let t = t.normalized();
            // A parked call opens its turn ([`ToolStep::confirm`]).
            let t = ToolStep {
                confirm: t.confirm && i == 0,
                ..t
            };
            match i > 0 && t.joins_round {
                true => ToolStep {
                    provider_fails: 0,
                    ..t
                },
                false => t,
            }
        })
        .collect()
}

/// The prompt's script as provider rounds: each round's steps with their
/// index in the turn (`+` joins a step to the round before it).
pub fn script_rounds(prompt: &str) -> Vec<Vec<ScriptStep>> {
    let mut rounds: Vec<Vec<ScriptStep>> = Vec::new();
    for step in parse_script(prompt) {
        match rounds.last_mut() {
            Some(round) if step.1.joins_round => round.push(step),
            _ => rounds.push(vec![step]),
        }
    }
    rounds
}

/// The key of one round's asks by one agent, in the provider's failure
/// bookkeeping ([`Model::provider_failed`]).
pub fn ask_key(agent: &str, prompt: &str, round: u32) -> String {
    format!("{agent}/{prompt}@{round}")
}

/// Provider slots of the system under test (`SystemConfig::new`'s 3): the
/// model's LRU evicts as the runtime's does.
pub const SLOTS: usize = 3;

/// The model: acknowledged state plus the counter that names new things.
/// The counter is harness bookkeeping, never compared with the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Model {
    pub state: State,
    pub counter: u64,
    /// The world dedups by idempotency key ([`dedup_world`]): an
    /// irreversible call a crash left in doubt is re-sent with its key at
    /// the re-run, never parked for a human.
    #[serde(default)]
    pub dedup_world: bool,
    /// Turns a crash rolled back, by agent: `resume_turn` re-runs them with
    /// the same prompt (so the same idempotency keys). Bookkeeping.
    #[serde(default)]
    pub lost_turns: BTreeMap<String, Action>,
    /// Effect keys whose delivery is unknown (a lost turn's effect that the
    /// world did not show at recovery): each may appear in the outbox at
    /// most once, at any later time, or never (R4). Bookkeeping.
    #[serde(default)]
    pub maybe_effects: BTreeSet<String>,
    /// The work each fired trigger was given (its first `Fire`), by key: a
    /// re-fire after a crash runs the same work. Bookkeeping.
    #[serde(default)]
    pub fire_work: BTreeMap<String, Action>,
    /// Triggers whose turn completed (durably), by key. Bookkeeping.
    #[serde(default)]
    pub done_work: BTreeSet<String>,
    /// Resident agents, least recently used first: the runtime's provider
    /// slots ([`SLOTS`]), so residency is compared exactly. Bookkeeping.
    #[serde(default)]
    pub lru: Vec<String>,
    /// Keys a process claimed before a restart (a zombie may ack them).
    /// Bookkeeping.
    #[serde(default)]
    pub stale_claims: BTreeSet<String>,
    /// Works that started durably and never completed, by [`work_key`]:
    /// the `WorkTurn` that started them (a retry, or their RESUME
    /// trigger's fire, runs it). Known from the RESUME row the boot after
    /// the crash emitted. Bookkeeping.
    #[serde(default)]
    pub works: BTreeMap<String, Action>,
    /// Completed works, by [`work_key`], with their agent. Bookkeeping.
    #[serde(default)]
    pub works_done: BTreeMap<String, String>,
    /// The work id each work turn that completed ran its prompt as, by
    /// prompt: a twin of that turn runs the same work id on its own agent
    /// ([`Model::resolve_twin`]). Bookkeeping.
    #[serde(default)]
    pub work_prompts: BTreeMap<String, String>,
    /// Calls a turn stopped at, waiting for a human (NEEDS_CONFIRMATION
    /// in the ledger): idempotency key -> effect key. Only keys a turn
    /// reported: the ledger may hold others no re-run has met yet.
    /// Bookkeeping.
    #[serde(default)]
    pub needs_human: BTreeMap<String, String>,
    /// FAILED triggers whose fire stopped at a call, with its idempotency
    /// key (`None`: unknown, a crash candidate's). Bookkeeping.
    #[serde(default)]
    pub blocked_on: BTreeMap<String, Option<String>>,
    /// Keys a human answered since the last restart: no turn may stop at
    /// one again until a crash makes its fate unknown anew. Bookkeeping.
    #[serde(default)]
    pub confirmed: BTreeSet<String>,
    /// The op's logical time (ms), as the driver's clock reads it
    /// ([`Model::at_step`]): what decides whether a row is due.
    /// Bookkeeping.
    #[serde(default)]
    pub now: u64,
    /// Asks the scripted provider failed, by [`ask_key`]: the world's
    /// memory (a round's first [`ToolStep::provider_fails`] asks fail),
    /// which a crash does not roll back — after a restart it is what the
    /// world says (`Driver::provider_failures`), not a candidate's guess.
    /// Bookkeeping.
    #[serde(default)]
    pub provider_failed: BTreeMap<String, u8>,
    /// Plain turns a crash rolled back, by [`Model::turn_identity`]: their
    /// irreversible calls' INTENT rows may be in the ledger, of unknown
    /// fate, for as long as the identity can recur — the runtime keys a
    /// turn's calls by its prompt and how many completed turns of its
    /// agent had that prompt (`turn_identity`), so a turn with the same
    /// prompt run after other turns meets the same keys and may stop for
    /// a human ([`Model::blocked`]). Never pruned: a completed turn with
    /// that prompt moves the identity on, and a dead entry permits
    /// nothing. Bookkeeping.
    #[serde(default)]
    pub rolled_back: BTreeSet<String>,
    /// Effects of calls a hook parked for a human ([`ToolStep::confirm`])
    /// that a human released ("not delivered": run it). The answer is one
    /// autocommitted statement, durable once acknowledged, so a crash
    /// never takes it back: until then a turn with the call must stop at
    /// it ([`Model::must_block`]). Bookkeeping.
    #[serde(default)]
    pub hook_released: BTreeSet<String>,
    /// Settled job runs of live agents a collecting GC pass may have
    /// deleted: `System::gc` keeps the runs of an agent that may still
    /// resume (an open turn, an unfinished work, a call not completed),
    /// which the model does not track exactly, so it learns each one's
    /// fate from the next reading of the store ([`Model::learn_runs`]).
    /// A settled run of an agent no longer live must go (G1's rule).
    /// Bookkeeping.
    #[serde(default)]
    pub runs_maybe_collected: BTreeSet<String>,
    /// DONE or DEAD triggers a collecting GC pass may have kept: ones
    /// fired whose turn never completed ([`Model::done_work`]) may have an
    /// unfinished turn of their own — durably started or not, which a
    /// crash leaves unknown — and `System::gc` keeps such a trigger (only
    /// its retry resumes that turn), so the next reading decides
    /// ([`Model::learn`]). Bookkeeping.
    #[serde(default)]
    pub triggers_maybe_kept: BTreeSet<String>,
    /// Fired triggers a reading showed kept by GC for their unfinished
    /// turn: every later pass must keep them too, until their turn
    /// completes. Bookkeeping.
    #[serde(default)]
    pub unfinished_fires: BTreeSet<String>,
    /// Each job run as it was made (its [`Action::JobRun`]), by run: a
    /// resume runs its prompt. Bookkeeping.
    #[serde(default)]
    pub jobs: BTreeMap<String, Action>,
    /// Prompts with spawns whose turn started and has not completed, by
    /// agent ([`Model::note_started`]): what may still count against the
    /// limits ([`MAX_CHILDREN`], [`max_agents`]) while that turn is open
    /// or parked. Bookkeeping.
    #[serde(default)]
    pub open_spawns: BTreeMap<String, BTreeSet<String>>,
    /// The tree's limit the system was booted with ([`max_agents`];
    /// [`MAX_AGENTS_MOST`] when not set).
    #[serde(default)]
    pub max_agents: Option<usize>,
}

fn pick<'a>(names: &[&'a String], r: u8) -> Option<&'a String> {
    if names.is_empty() {
        None
    } else {
        Some(names[r as usize % names.len()])
    }
}

impl Model {
    /// The model of a fresh run with `seed`: nothing yet, in the world
    /// the seed chooses ([`dedup_world`]).
    pub fn for_seed(seed: u64) -> Model {
        Model {
            dedup_world: dedup_world(seed),
            max_agents: Some(max_agents(seed)),
            ..Model::default()
        }
    }

    fn names(&self, keep: impl Fn(&Agent) -> bool) -> Vec<&String> {
        self.state
            .agents
            .iter()
            .filter(|(_, a)| keep(a))
            .map(|(n, _)| n)
            .collect()
    }

    /// How deep `agent` sits in the tree (a root is 0).
    fn depth(&self, agent: &str) -> u32 {
        let mut depth = 0u32;
        let mut at = self.state.agents.get(agent).and_then(|a| a.parent.as_deref());
        while let Some(p) = at {
            depth += 1;
            at = self.state.agents.get(p).and_then(|a| a.parent.as_deref());
        }
        depth
    }

    /// Whether a spawn asked by `agent` is refused for its depth
    /// ([`MAX_DEPTH`]).
    fn spawn_too_deep(&self, agent: &str) -> bool {
        self.depth(agent) >= MAX_DEPTH
    }

    /// Whether the runtime refuses every spawn `agent` asks for: from
    /// [`MAX_DEPTH`], or not [`granted`] to it.
    fn spawn_refused(&self, agent: &str) -> bool {
        self.spawn_too_deep(agent) || !granted(agent, OrchestrationTool::SpawnAgent)
    }

    /// `tools` as `caller` runs them: a spawn it asks from [`MAX_DEPTH`],
    /// without the grant, or past the limits ([`Model::limit_refusals`]),
    /// fails (the script still says `C`; the runtime refuses the call),
    /// and so does a send after it, to the child it did not make (a send
    /// after a spawn of the turn goes to that child: [`script_prompt`]); a
    /// send without the grant fails too. (Where the limits' answer is not
    /// known, spawns pass here; [`Model::limits_hold`] then skips the op.)
    fn within_depth(&self, caller: &str, tools: &[ToolStep]) -> Vec<ToolStep> {
        let no_spawn = self.spawn_refused(caller);
        let no_send = !granted(caller, OrchestrationTool::SendMessage);
        let limited = self.limit_refusals(caller, None, tools).unwrap_or_default();
        let spawn_refused = |i: usize| no_spawn || limited.get(i).copied().unwrap_or(false);
        tools
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let refused = match t.orch {
                    Orch::Spawn => spawn_refused(i),
                    Orch::Send(_) => no_send || spawn_before(tools, i).is_some_and(spawn_refused),
                    Orch::None | Orch::RefusedSpawn | Orch::List => false,
                };
                ToolStep {
                    ok: t.ok && !refused,
                    ..*t
                }
            })
            .collect()
    }

    /// Which of the spawns of a turn of `caller` with `prompt` (`None`: a
    /// new one) running `tools` (by step) the limits refuse, as the
    /// runtime checks them when each call runs: the caller's live
    /// children plus the spawns of its turns not completed — this one's
    /// before this call, and its other turns' — against [`MAX_CHILDREN`],
    /// then the live tree plus the spawns of every turn not completed
    /// against the tree's limit ([`max_agents`]). Spawns refused for depth
    /// or grant count for nothing. The other turns not completed, the
    /// caller's and other agents', are the one unknown: a crash, a
    /// provider failure or a hook leaves a turn open with as many of its
    /// spawns decided as got logged, and the runtime counts them until
    /// that turn completes — a newer turn of its agent that supersedes it
    /// parks it, and a parked turn still counts (run again, it creates its
    /// children). Their number lies between none and every spawn of the
    /// turns that started and never completed ([`Model::open_spawns`]);
    /// `None` when the answer differs across that range (the op is then
    /// skipped: [`Model::limits_hold`]). A retried or resumed turn reuses
    /// the decisions its earlier run logged, so it counts the same way
    /// only if the limits answer now as they did then, which `limits_hold`
    /// checks too.
    fn limit_refusals(&self, caller: &str, prompt: Option<&str>, tools: &[ToolStep]) -> Option<Vec<bool>> {
        let mut refused = vec![false; tools.len()];
        if self.spawn_refused(caller) || !tools.iter().any(|t| t.orch == Orch::Spawn) {
            return Some(refused);
        }
        let children = self
            .state
            .agents
            .values()
            .filter(|a| a.parent.as_deref() == Some(caller))
            .count();
        // A job run's turn runs on the root the run makes first.
        let live = self.state.agents.len() + usize::from(!self.state.agents.contains_key(caller));
        // The spawns of the turns not completed besides this one: the
        // caller's own (its parked turns count against its children too)
        // and the other live agents'.
        let open = |agent: &String| -> usize {
            self.open_spawns
                .get(agent)
                .into_iter()
                .flatten()
                .filter(|p| !(agent == caller && Some(p.as_str()) == prompt))
                .map(|p| spawn_calls(p))
                .sum()
        };
        let own = self.open_spawns.get_key_value(caller).map_or(0, |(a, _)| open(a));
        let others: usize = self
            .open_spawns
            .keys()
            .filter(|agent| *agent != caller && self.state.agents.contains_key(*agent))
            .filter(|agent| !self.spawn_refused(agent))
            .map(open)
            .sum();
        let max_agents = self.max_agents.unwrap_or(MAX_AGENTS_MOST);
        let mut mine = 0;
        for (i, t) in tools.iter().enumerate() {
            if t.orch != Orch::Spawn {
                continue;
            }
            if children + mine >= MAX_CHILDREN || live + mine >= max_agents {
                refused[i] = true;
            } else if children + mine + own < MAX_CHILDREN && live + mine + own + others < max_agents {
                mine += 1;
            } else {
                return None;
            }
        }
        Some(refused)
    }

    /// Whether the spawn decisions `action`'s turn carries are the ones
    /// the limits give now ([`Model::limit_refusals`]): always for a turn
    /// resolved now, and for a retried or resumed one unless the tree
    /// changed under it since (a spawn its earlier run logged keeps the
    /// answer it got, one it did not gets today's, and the model cannot
    /// tell which are which), or unless the answer is not known.
    fn limits_hold(&self, action: &Action) -> bool {
        let Some((agent, prompt, tools)) = action.turn().filter(|_| !self.runs_no_turn(action)) else {
            return true;
        };
        if self.spawn_refused(agent) {
            return true;
        }
        let Some(refused) = self.limit_refusals(agent, Some(prompt), tools) else {
            return false;
        };
        tools
            .iter()
            .zip(refused)
            .all(|(t, refused)| t.orch != Orch::Spawn || t.ok != refused)
    }

    /// `action` starts a turn whose spawns the runtime counts against the
    /// limits ([`MAX_CHILDREN`], [`max_agents`]) while it is in flight (or
    /// left open, or parked by a newer turn): remembered in
    /// [`Model::open_spawns`] until that turn completes (an answer from
    /// the log, [`Model::runs_no_turn`], starts none). Called on the model before the op's candidates are
    /// cloned from it, so every one of them remembers it.
    pub fn note_started(&mut self, action: &Action) {
        let Some((agent, prompt, _)) = action.turn().filter(|_| !self.runs_no_turn(action)) else {
            return;
        };
        if spawn_calls(prompt) > 0 {
            self.open_spawns
                .entry(agent.clone())
                .or_default()
                .insert(prompt.clone());
        }
    }

    /// Whether `action` answers from the log without a turn: the resume
    /// of a job run whose work completed, or a re-fire of a trigger whose
    /// turn completed (`AlreadyDone`). No spawn call runs, so the limits
    /// say nothing of it and it opens no turn.
    fn runs_no_turn(&self, action: &Action) -> bool {
        match action {
            Action::JobResume { done, .. } => *done,
            Action::Fire { key, .. } => self.done_work.contains(key),
            _ => false,
        }
    }

    fn has_children(&self, name: &str) -> bool {
        self.state
            .agents
            .values()
            .any(|a| a.parent.as_deref() == Some(name))
    }

    /// A new agent `name` under `parent`: resident, most recently used,
    /// nothing in it yet (a create or a spawn takes a slot, evicting the
    /// least recently used if none is free).
    fn add_agent(&mut self, name: &str, parent: Option<String>) {
        self.make_room(None);
        self.lru.push(name.to_string());
        self.state.agents.insert(
            name.to_string(),
            Agent {
                parent,
                status: Status::Resident,
                turns: Vec::new(),
                pending: Vec::new(),
                delivered: Vec::new(),
            },
        );
    }

    /// Suspend least recently used agents (never `keep`) until one more
    /// fits in the [`SLOTS`] (the runtime's `make_room`).
    fn make_room(&mut self, keep: Option<&str>) {
        while self.lru.len() >= SLOTS {
            let Some(i) = self.lru.iter().position(|a| Some(a.as_str()) != keep) else {
                break;
            };
            let victim = self.lru.remove(i);
            if let Some(a) = self.state.agents.get_mut(&victim) {
                a.status = Status::Suspended;
            }
        }
    }

    /// `agent` is used (a turn, a restore): resident and most recently
    /// used, restored into a slot if it was suspended (the runtime's
    /// `acquire`).
    fn touch(&mut self, agent: &str) {
        if let Some(i) = self.lru.iter().position(|a| a == agent) {
            let a = self.lru.remove(i);
            self.lru.push(a);
            return;
        }
        self.make_room(Some(agent));
        self.lru.push(agent.to_string());
        if let Some(a) = self.state.agents.get_mut(agent) {
            a.status = Status::Resident;
        }
    }

    /// A completed turn of `agent` and its irreversible effects.
    /// A completed call's effect reaches the world's outbox: an irreversible
    /// call that succeeded. A resumed turn reuses its keys: the ledger never
    /// sends a key twice, and one of unknown fate stays unknown.
    fn sent_by_turn(&mut self, key: String, t: &ToolStep) {
        if t.irreversible && t.ok && !self.maybe_effects.contains(&key) && !self.state.outbox.contains(&key) {
            self.state.outbox.push(key);
        }
    }

    fn add_turn(&mut self, agent: &str, prompt: &str, tools: &[ToolStep], response: &str) {
        self.touch(agent);
        let occurrence = self.occurrence(agent, prompt);
        if let Some(a) = self.state.agents.get_mut(agent) {
            a.turns.push(Turn {
                prompt: prompt.to_string(),
                // What the turn did, not how it was asked: no rounds.
                tools: tools
                    .iter()
                    .map(|t| ToolStep {
                        joins_round: false,
                        lost: Lost::None,
                        orch: Orch::None,
                        provider_fails: 0,
                        garbled: false,
                        denied: false,
                        confirm: false,
                        ..*t
                    })
                    .collect(),
                response: response.to_string(),
            });
        }
        for (i, t) in tools.iter().enumerate() {
            // Numbered by the turns with the prompt before this one.
            self.sent_by_turn(effect_key(agent, prompt, i, occurrence), t);
        }
        self.orchestrate(agent, prompt, tools);
        // Its spawns are children now (or refused). A turn it superseded
        // is parked, and the runtime still counts a parked turn's spawns
        // (run again, it creates its children): only this one's leave.
        if let Some(prompts) = self.open_spawns.get_mut(agent) {
            prompts.remove(prompt);
            if prompts.is_empty() {
                self.open_spawns.remove(agent);
            }
        }
    }

    /// The effects of a completed turn's orchestration calls: each child
    /// it spawned (SUSPENDED: it takes a slot at its first turn), each
    /// message it sent — once: a send a rolled-back run of the turn left
    /// (adopted at recovery) is not sent again by its re-run. Whether a
    /// spawn succeeded is its step's in `tools` (refused for the caller's
    /// depth, grant or the limits: [`Model::within_depth`]).
    fn orchestrate(&mut self, agent: &str, prompt: &str, tools: &[ToolStep]) {
        let no_send = !granted(agent, OrchestrationTool::SendMessage);
        for (index, _, call) in parse_script(prompt) {
            let Some(call) = call else { continue };
            match call {
                // Refused: nothing is created.
                OrchCall::Spawn { .. } if !tools.get(index).is_some_and(|t| t.ok) => {}
                OrchCall::Send { .. } if no_send => {}
                OrchCall::Spawn { name } => {
                    self.state.agents.entry(name).or_insert_with(|| Agent {
                        parent: Some(agent.to_string()),
                        status: Status::Suspended,
                        turns: Vec::new(),
                        pending: Vec::new(),
                        delivered: Vec::new(),
                    });
                }
                OrchCall::Send { to, payload } => {
                    let msg = Msg {
                        from: agent.to_string(),
                        payload,
                    };
                    if let Some(a) = self.state.agents.get_mut(&to) {
                        if !a.pending.contains(&msg) && !a.delivered.contains(&msg) {
                            a.pending.push(msg);
                        }
                    }
                }
                // Refused: nothing is created; a listing changes nothing.
                OrchCall::RefusedSpawn { .. } | OrchCall::List => {}
            }
        }
    }

    /// The round at which the provider fails `agent`'s turn with `prompt`
    /// now, if it does: the first round whose failing asks
    /// ([`ToolStep::provider_fails`]) the provider has not all failed yet.
    /// Each failure ends the run there, so every run of the turn — fresh,
    /// resumed after a crash or a failure, a twin's — meets the rounds'
    /// failures in order.
    pub fn failing_round(&self, agent: &str, prompt: &str) -> Option<u32> {
        failing_asks(prompt)
            .into_iter()
            .enumerate()
            .find_map(|(r, fails)| {
                let round = u32::try_from(r).unwrap_or(u32::MAX);
                let failed = self
                    .provider_failed
                    .get(&ask_key(agent, prompt, round))
                    .copied()
                    .unwrap_or(0);
                (failed < fails).then_some(round)
            })
    }

    /// The round at which the provider fails `action` now, if it is a
    /// plain turn it fails ([`Model::failing_round`]).
    pub fn fails(&self, action: &Action) -> Option<u32> {
        match action {
            Action::RunTurn { agent, prompt, .. } => self.failing_round(agent, prompt),
            _ => None,
        }
    }

    /// The plain turn `action` fails at `round`'s ask: the runtime logs the
    /// error row and answers `RuntimeError::Provider`. Nothing of the turn
    /// is acknowledged, but it is not lost either: its rounds before
    /// `round` ran (their irreversible effects are in the world, their
    /// sends pending at the recipients — a spawn waits for
    /// `turn.complete`), it holds its agent's slot, its messages stay
    /// pending, and running it again (`resume_turn`) resumes at `round`.
    fn provider_fails(&mut self, action: &Action, agent: &str, prompt: &str, round: u32) {
        self.lost_turns.insert(agent.to_string(), action.clone());
        *self
            .provider_failed
            .entry(ask_key(agent, prompt, round))
            .or_default() += 1;
        self.touch(agent);
        let done: Vec<ScriptStep> = script_rounds(prompt)
            .into_iter()
            .take(round as usize)
            .flatten()
            .collect();
        let no_send = !granted(agent, OrchestrationTool::SendMessage);
        for (i, t, call) in done {
            match call {
                None => {
                    self.sent_by_turn(self.effect(agent, prompt, i), &t);
                }
                Some(OrchCall::Send { .. }) if no_send => {}
                Some(OrchCall::Send { to, payload }) => {
                    let msg = Msg {
                        from: agent.to_string(),
                        payload,
                    };
                    if let Some(a) = self.state.agents.get_mut(&to) {
                        if !a.pending.contains(&msg) && !a.delivered.contains(&msg) {
                            a.pending.push(msg);
                        }
                    }
                }
                Some(OrchCall::Spawn { .. } | OrchCall::RefusedSpawn { .. } | OrchCall::List) => {}
            }
        }
    }

    /// Whether a turn that may still run (rolled back, a started work, a
    /// job run not completed, a fire not done) sends to `name`, or asks to
    /// spawn a child of that name it must be refused: terminating it would
    /// make the re-run's send fail (or its spawn succeed), which the model
    /// does not predict.
    fn awaited_by_a_send(&self, name: &str) -> bool {
        let prompts = self
            .lost_turns
            .values()
            .chain(self.works.values())
            .chain(
                self.fire_work
                    .iter()
                    .filter(|(k, _)| !self.done_work.contains(*k))
                    .map(|(_, a)| a),
            )
            // A job run whose turn has not completed: `run --resume` runs
            // it (from its prompt when it never started, so `works` does
            // not hold it yet).
            .chain(self.jobs.iter().filter_map(|(run, a)| match a {
                Action::JobRun { agent, .. } if !self.works_done.contains_key(&job_work_key(agent, run)) => {
                    Some(a)
                }
                _ => None,
            }))
            .filter_map(|a| match a {
                Action::RunTurn { prompt, .. }
                | Action::WorkTurn { prompt, .. }
                | Action::Fire { prompt, .. }
                | Action::JobRun { prompt, .. } => Some(prompt),
                _ => None,
            });
        for prompt in prompts {
            // (A refused spawn named after a child counts too: gone, the
            // name would be free and the spawn taken.)
            if orch_calls(prompt).iter().any(|c| {
                matches!(c, OrchCall::Send { to, .. } | OrchCall::RefusedSpawn { name: to } if to == name)
            })
            {
                return true;
            }
        }
        false
    }

    /// Work `work` of `agent` completed (durably) with this turn.
    fn complete_work(
        &mut self,
        agent: &str,
        work: &str,
        prompt: &str,
        tools: &[ToolStep],
        response: &str,
        reads: &[Msg],
    ) {
        let key = work_key(agent, work);
        self.works.remove(&key);
        self.works_done.insert(key.clone(), agent.to_string());
        self.work_prompts.insert(prompt.to_string(), work.to_string());
        // Its RESUME trigger, if boot emitted one, only acks.
        self.done_work.insert(key);
        self.add_turn(agent, prompt, tools, response);
        self.deliver_read(agent, reads);
    }

    /// The job run whose RESUME trigger `key` is, if its row exists, gets
    /// `status` (`settle_fire`'s `settle_run`).
    fn settle_job(&mut self, key: &str, status: &str) {
        if let Some(run) = job_of_key(key) {
            if let Some(s) = self.state.runs.get_mut(run) {
                *s = status.to_string();
            }
        }
    }

    /// The candidate states inside a job run (`action`, from this model),
    /// in the order of its commits, before the turn: `rooted` (the root
    /// agent created, no row: harmless, nothing refers to it) and
    /// `recorded` (the row `running`, the turn not started). The turn's
    /// start is [`Model::started_work`]'s candidate; `turned` is `after`
    /// with the row still `running` (the turn completed, its status not
    /// set yet).
    /// Job run `run`'s agent.
    fn job_agent(&self, run: &str) -> Option<&String> {
        match self.jobs.get(run) {
            Some(Action::JobRun { agent, .. }) => Some(agent),
            _ => None,
        }
    }

    /// The candidate states inside a job run's resume (`action`, from
    /// this model), later commits first: `statused` (the run `succeeded`,
    /// its RESUME trigger not settled yet), `turned` (the turn complete,
    /// the run `running`), `reset` (the run `running` again, no turn).
    /// The turn's start is [`Model::started_work`]'s candidate.
    pub fn resume_midpoints(&self, after: &Model, action: &Action) -> Option<[Model; 3]> {
        let Action::JobResume { run, .. } = action else {
            return None;
        };
        let mut statused = after.clone();
        statused.state.triggers = self.state.triggers.clone();
        let mut turned = statused.clone();
        turned.state.runs.insert(run.clone(), RUNNING.into());
        let mut reset = self.clone();
        reset.state.runs.insert(run.clone(), RUNNING.into());
        Some([statused, turned, reset])
    }

    pub fn job_midpoints(&self, after: &Model, action: &Action) -> Option<[Model; 3]> {
        let Action::JobRun { run, agent, .. } = action else {
            return None;
        };
        let mut rooted = self.clone();
        rooted.counter += 1;
        rooted.add_agent(agent, None);
        let mut recorded = rooted.clone();
        recorded.state.runs.insert(run.clone(), RUNNING.into());
        recorded.jobs.insert(run.clone(), action.clone());
        let mut turned = after.clone();
        turned.state.runs.insert(run.clone(), RUNNING.into());
        Some([rooted, recorded, turned])
    }

    /// The work turn a job run runs, as a [`Action::WorkTurn`] of its
    /// agent.
    pub fn job_turn(action: &Action) -> Option<Action> {
        let (Action::JobRun {
            run,
            agent,
            prompt,
            tools,
            response,
        }
        | Action::JobResume {
            run,
            agent,
            prompt,
            tools,
            response,
            ..
        }) = action
        else {
            return None;
        };
        Some(Action::WorkTurn {
            agent: agent.clone(),
            work: job_work(run),
            asked: prompt.clone(),
            prompt: prompt.clone(),
            tools: tools.clone(),
            response: response.clone(),
            reads: Vec::new(),
        })
    }

    /// Learn from `read` (the store as read now) which of the job runs a
    /// GC pass may have deleted ([`Model::runs_maybe_collected`]) it did,
    /// and which of the triggers it may have kept
    /// ([`Model::triggers_maybe_kept`]) it kept.
    pub fn learn(&mut self, read: &State) {
        for run in std::mem::take(&mut self.runs_maybe_collected) {
            if !read.runs.contains_key(&run) {
                self.state.runs.remove(&run);
            }
        }
        for key in std::mem::take(&mut self.triggers_maybe_kept) {
            if read.triggers.iter().any(|t| t.key == key) {
                self.unfinished_fires.insert(key);
            } else {
                self.state.triggers.retain(|t| t.key != key);
            }
        }
    }

    /// A completed work turn delivers the messages it read that are still
    /// pending (a `deliver` may have taken some since it first started),
    /// in their pending order.
    fn deliver_read(&mut self, agent: &str, reads: &[Msg]) {
        if let Some(a) = self.state.agents.get_mut(agent) {
            let (read, rest): (Vec<Msg>, Vec<Msg>) = std::mem::take(&mut a.pending)
                .into_iter()
                .partition(|m| reads.contains(m));
            a.pending = rest;
            a.delivered.extend(read);
        }
    }

    /// The candidate state in which a crash cut a fresh work turn after its
    /// `turn.start` became durable: nothing of the turn is kept, but the
    /// boot emitted the work's RESUME trigger (PENDING, last in emit
    /// order), and the work is known started. `None` for anything else.
    pub fn started_work(&self, action: &Action) -> Option<Model> {
        if let Action::JobRun { .. } = action {
            let turn = Model::job_turn(action)?;
            let [_, recorded, _] = self.job_midpoints(self, action)?;
            return recorded.started_work(&turn);
        }
        if let Action::JobResume { done: false, .. } = action {
            let turn = Model::job_turn(action)?;
            let [_, _, reset] = self.resume_midpoints(self, action)?;
            return reset.started_work(&turn);
        }
        let Action::WorkTurn { agent, work, .. } = action else {
            return None;
        };
        let key = work_key(agent, work);
        if self.works.contains_key(&key) {
            return None; // a retry: its row was emitted when it first started
        }
        let mut m = self.clone();
        m.works.insert(key.clone(), action.clone());
        if !m.state.triggers.iter().any(|t| t.key == key) {
            m.state.triggers.push(TriggerRow {
                key,
                status: TriggerStatus::Pending,
                attempts: 0,
                not_before: 0,
                // Due at the time of the boot that emitted it: this op's.
                fire_at: self.now + crate::driver::BOOT_MS,
            });
        }
        m.counter += 1;
        Some(m)
    }

    /// Turn an abstract op into a concrete action against this state, or
    /// `None` when no agent fits, or when the spawn limits' answer to its
    /// turn is not known ([`Model::limits_hold`]) (the op is then
    /// skipped). Control ops (crash, recover) have no action.
    pub fn resolve(&self, op: &Op) -> Option<Action> {
        let action = self.resolve_any(op)?;
        self.limits_hold(&action).then_some(action)
    }

    fn resolve_any(&self, op: &Op) -> Option<Action> {
        let n = self.counter;
        let all = self.names(|_| true);
        Some(match op {
            Op::CreateRoot => Action::CreateRoot {
                name: format!("a{n:03}"),
            },
            Op::SpawnChild { parent } => Action::SpawnChild {
                parent: pick(&all, parent.0)?.clone(),
                name: format!("a{n:03}"),
            },
            Op::RunTurn {
                agent,
                tools,
                final_fails,
            }
            | Op::ReadTurn {
                agent,
                tools,
                final_fails,
            } => {
                let tools: &[ToolStep] = &normalized_failing(tools);
                let caller = pick(&all, agent.0)?;
                let children = self.names(|a| a.parent.as_deref() == Some(caller.as_str()));
                Action::RunTurn {
                    agent: caller.clone(),
                    prompt: script_prompt(n, tools, &all, &children, *final_fails),
                    tools: self.within_depth(caller, tools),
                    response: format!("r{n}"),
                    reads: matches!(op, Op::ReadTurn { .. }),
                }
            }
            Op::WorkTurn { agent, work, tools } => {
                let tools: &[ToolStep] = &normalized(tools);
                let asked = script_prompt(n, tools, &all, &[], 0);
                // (agent, work) of a started work of a live agent.
                let started: Vec<(&String, &String)> = self
                    .works
                    .values()
                    .filter_map(|w| match w {
                        Action::WorkTurn { agent, work, .. } if self.state.agents.contains_key(agent) => {
                            Some((agent, work))
                        }
                        _ => None,
                    })
                    .collect();
                let (agent, work) = match *work {
                    128.. => started
                        .get(usize::from(*work - 128) % started.len().max(1))
                        .map(|(a, w)| ((*a).clone(), (*w).clone()))?,
                    _ => (pick(&all, agent.0)?.clone(), format!("api:w{}", work % 3)),
                };
                let key = work_key(&agent, &work);
                if let Some(mut retry) = self.works.get(&key).cloned() {
                    // The work it first was, asked with the new prompt.
                    if let Action::WorkTurn { asked: a, .. } = &mut retry {
                        *a = asked;
                    }
                    return Some(retry);
                }
                if self.works_done.contains_key(&key) {
                    return Some(Action::WorkDone { agent, work, asked });
                }
                let reads = self.state.agents.get(&agent)?.pending.clone();
                Action::WorkTurn {
                    tools: self.within_depth(&agent, tools),
                    agent,
                    work,
                    prompt: asked.clone(),
                    asked,
                    response: format!("r{n}"),
                    reads,
                }
            }
            Op::TwinTurn { agent, of } => return self.resolve_twin(agent.0, *of),
            Op::SendMessage { from, to } => Action::SendMessage {
                from: pick(&all, from.0)?.clone(),
                to: pick(&all, to.0)?.clone(),
                payload: format!("m{n}"),
            },
            Op::Deliver { agent } => Action::Deliver {
                agent: pick(&self.names(|a| !a.pending.is_empty()), agent.0)?.clone(),
            },
            Op::Evict { agent } => Action::Evict {
                agent: pick(&all, agent.0)?.clone(),
            },
            Op::Restore { agent } => Action::Restore {
                agent: pick(&all, agent.0)?.clone(),
            },
            Op::Terminate { agent } => {
                let leaves: Vec<&String> = all
                    .iter()
                    .copied()
                    .filter(|n| !self.has_children(n) && !self.awaited_by_a_send(n))
                    .collect();
                Action::Terminate {
                    agent: pick(&leaves, agent.0)?.clone(),
                }
            }
            Op::ResumeTurn { agent } => {
                let lost: Vec<&String> = self
                    .lost_turns
                    .keys()
                    .filter(|n| self.state.agents.contains_key(*n))
                    .collect();
                return self.lost_turns.get(pick(&lost, agent.0)?).cloned();
            }
            Op::EmitTrigger { .. }
            | Op::ClaimTrigger
            | Op::AckTrigger { .. }
            | Op::FireTrigger { .. }
            | Op::StaleAck { .. }
            | Op::RetryTrigger { .. } => return self.resolve_trigger(op),
            // A FAILED trigger whose blocking key the model does not know
            // may or may not still be blocked (kept or collected).
            Op::Gc if self.blocked_on.values().any(Option::is_none) => return None,
            // Every other GC pass strips (the op numbers alternate).
            Op::Gc => Action::Gc { strip: n % 2 == 1 },
            Op::Confirm { pick } => {
                // A trigger blocked on a key the model does not know might
                // be re-pended by this answer: not predictable, skipped.
                if self.blocked_on.values().any(Option::is_none) || self.needs_human.is_empty() {
                    return None;
                }
                let (idem, effect) = self
                    .needs_human
                    .iter()
                    .nth(*pick as usize % self.needs_human.len())?;
                Action::Confirm {
                    idem: idem.clone(),
                    effect: effect.clone(),
                    delivered: self.state.outbox.contains(effect),
                }
            }
            Op::LoopRound { tools } => Action::LoopRound {
                round: n,
                tools: tools % 3,
            },
            Op::Release { run } => {
                let mut runs: Vec<RunRef> = self.state.runs.keys().cloned().map(RunRef::Job).collect();
                runs.extend(all.iter().map(|a| RunRef::Session((*a).clone())));
                if runs.is_empty() {
                    return None;
                }
                Action::Release {
                    run: runs[usize::from(*run) % runs.len()].clone(),
                }
            }
            Op::JobResume { run } => {
                // A run whose agent is live (else `run --resume` refuses:
                // its agent is gone), in any status.
                let runs: Vec<&String> = self
                    .state
                    .runs
                    .keys()
                    .filter(|r| {
                        self.job_agent(r)
                            .is_some_and(|a| self.state.agents.contains_key(a))
                    })
                    .collect();
                let run = pick(&runs, *run)?.clone();
                let Some(Action::JobRun {
                    agent,
                    prompt,
                    tools,
                    response,
                    ..
                }) = self.jobs.get(&run).cloned()
                else {
                    return None;
                };
                let key = job_work_key(&agent, &run);
                match self.works.get(&key) {
                    // Started: the turn it started with.
                    Some(Action::WorkTurn {
                        prompt,
                        tools,
                        response,
                        ..
                    }) => Action::JobResume {
                        run,
                        agent,
                        prompt: prompt.clone(),
                        tools: tools.clone(),
                        response: response.clone(),
                        done: false,
                    },
                    _ => Action::JobResume {
                        done: self.works_done.contains_key(&key),
                        run,
                        agent,
                        prompt,
                        tools,
                        response,
                    },
                }
            }
            Op::JobRun { tools } => {
                let tools: &[ToolStep] = &normalized(tools);
                let agent = format!("a{n:03}");
                // Its turn may send to any live agent, itself included (it
                // exists by then), in name order as ever.
                let mut names = all.clone();
                names.push(&agent);
                names.sort();
                Action::JobRun {
                    run: format!("j{n:03}"),
                    prompt: script_prompt(n, tools, &names, &[], 0),
                    tools: self.within_depth(&agent, tools),
                    agent,
                    response: format!("r{n}"),
                }
            }
            Op::Crash { .. } | Op::Fault { .. } | Op::Recover => return None,
        })
    }

    /// A twin turn ([`Op::TwinTurn`]): the `of`-th completed turn without
    /// orchestration calls (over all agents, in name order) is run again
    /// by another live agent, the `agent`-th of those that never ran that
    /// prompt (completed, or rolled back and awaiting `resume_turn`) or
    /// that may repeat it (below): the same prompt, so the same calls
    /// word for word. A spawn or a send is
    /// named by its prompt, so a turn with one is never twinned. The twin
    /// of a work turn is a work turn of the same work id (work ids are the
    /// caller's, per agent: two agents may run the same one), when its
    /// agent never started that work; else a plain turn.
    fn resolve_twin(&self, agent: u8, of: u8) -> Option<Action> {
        let sources: Vec<(&String, &Turn)> = self
            .state
            .agents
            .iter()
            .flat_map(|(name, a)| a.turns.iter().map(move |t| (name, t)))
            .filter(|(_, t)| !t.tools.is_empty() && orch_calls(&t.prompt).is_empty())
            .collect();
        let (source, turn) = *sources.get(usize::from(of) % sources.len().max(1))?;
        let ran = |name: &String, a: &Agent| {
            a.turns.iter().any(|t| t.prompt == turn.prompt)
                || matches!(self.lost_turns.get(name), Some(Action::RunTurn { prompt, .. }) if *prompt == turn.prompt)
                || self.works.values().any(|w| {
                    matches!(w, Action::WorkTurn { agent, prompt, .. } if agent == name && *prompt == turn.prompt)
                })
        };
        // Or an agent runs its own completed prompt again (a repeat): the
        // same calls, a second time — each a second effect, under the
        // runtime's next turn identity. Only once every effect of its
        // earlier runs showed (none of unknown fate, so the world's
        // deliveries of the call come in order), never a work's or a
        // fire's prompt (their work ids name them), and never while a
        // turn with it is lost.
        let repeats = |name: &String, a: &Agent| {
            a.turns.iter().any(|t| t.prompt == turn.prompt)
                && !self.work_prompts.contains_key(&turn.prompt)
                && !self
                    .fire_work
                    .values()
                    .any(|w| matches!(w, Action::Fire { prompt, .. } if *prompt == turn.prompt))
                && !matches!(self.lost_turns.get(name), Some(Action::RunTurn { prompt, .. }) if *prompt == turn.prompt)
                // Each of its own turns with the prompt, as that turn did
                // (a resumed step may have failed in one and not another).
                && a.turns
                    .iter()
                    .filter(|t| t.prompt == turn.prompt)
                    .enumerate()
                    .all(|(n, own)| {
                        own.tools.iter().enumerate().all(|(i, t)| {
                            let effect = effect_key(name, &turn.prompt, i, n);
                            !(t.irreversible && t.ok)
                                || (self.state.outbox.contains(&effect) && !self.maybe_effects.contains(&effect))
                        })
                    })
        };
        let twins: Vec<&String> = self
            .state
            .agents
            .iter()
            .filter(|(name, a)| (*name != source && !ran(name, a)) || repeats(name, a))
            .map(|(name, _)| name)
            .collect();
        let twin = pick(&twins, agent)?.clone();
        // As the script asks them (rounds, lost answers): the recorded
        // turn keeps only what it did.
        let tools: Vec<ToolStep> = parse_script(&turn.prompt)
            .into_iter()
            .map(|(_, t, _)| t)
            .collect();
        let work = self.work_prompts.get(&turn.prompt).filter(|work| {
            let key = work_key(&twin, work);
            !self.works.contains_key(&key) && !self.works_done.contains_key(&key)
        });
        if let Some(work) = work {
            let reads = self.state.agents.get(&twin)?.pending.clone();
            return Some(Action::WorkTurn {
                agent: twin,
                work: work.clone(),
                asked: turn.prompt.clone(),
                prompt: turn.prompt.clone(),
                tools,
                response: turn.response.clone(),
                reads,
            });
        }
        Some(Action::RunTurn {
            agent: twin,
            prompt: turn.prompt.clone(),
            tools,
            response: turn.response.clone(),
            reads: false,
        })
    }

    /// The state after `action` is acknowledged. Actions come from
    /// [`Model::resolve`] on this same model, so they always fit.
    pub fn apply(&mut self, action: &Action) {
        self.counter += 1;
        let agents = &mut self.state.agents;
        match action {
            Action::CreateRoot { name } => self.add_agent(name, None),
            Action::SpawnChild { parent, name } => self.add_agent(name, Some(parent.clone())),
            Action::RunTurn {
                agent,
                prompt,
                tools,
                response,
                reads,
            } => {
                self.lost_turns.remove(agent);
                if let Some(round) = self.failing_round(agent, prompt) {
                    self.provider_fails(action, agent, prompt, round);
                    return;
                }
                // The messages it read were pending when it started: what
                // it sends itself stays pending.
                if *reads {
                    if let Some(a) = self.state.agents.get_mut(agent) {
                        let msgs = std::mem::take(&mut a.pending);
                        a.delivered.extend(msgs);
                    }
                }
                self.add_turn(agent, prompt, tools, response);
            }
            Action::WorkTurn {
                agent,
                work,
                prompt,
                tools,
                response,
                reads,
                ..
            } => self.complete_work(agent, work, prompt, tools, response, reads),
            Action::JobRun {
                run,
                agent,
                prompt,
                tools,
                response,
            } => {
                self.add_agent(agent, None);
                self.complete_work(agent, &job_work(run), prompt, tools, response, &[]);
                self.state.runs.insert(run.clone(), SUCCEEDED.into());
                self.jobs.insert(run.clone(), action.clone());
            }
            Action::JobResume {
                run,
                agent,
                prompt,
                tools,
                response,
                done,
            } => {
                let work = job_work(run);
                if !*done {
                    self.complete_work(agent, &work, prompt, tools, response, &[]);
                }
                self.state.runs.insert(run.clone(), SUCCEEDED.into());
                let key = work_key(agent, &work);
                if let Some(t) = self
                    .state
                    .triggers
                    .iter_mut()
                    .find(|t| t.key == key && t.status == TriggerStatus::Pending)
                {
                    t.status = TriggerStatus::Done;
                    t.not_before = 0;
                }
            }
            Action::WorkDone { .. } => {}
            Action::Fire {
                key,
                agent,
                prompt,
                tools,
                response,
            } => {
                if self.done_work.insert(key.clone()) {
                    self.add_turn(agent, prompt, tools, response);
                    // A RESUME trigger's fire completes its work, reading
                    // what the work first read.
                    if let Some(Action::WorkTurn { reads, .. }) = self.works.remove(key) {
                        self.works_done.insert(key.clone(), agent.clone());
                        self.deliver_read(agent, &reads);
                    }
                }
                self.fire_work.insert(key.clone(), action.clone());
                self.apply_trigger(action);
                // The daemon settles a job run its RESUME trigger resumed
                // (`settle_fire`), done now or before.
                self.settle_job(key, SUCCEEDED);
            }
            Action::SendMessage { from, to, payload } => {
                if let Some(a) = agents.get_mut(to) {
                    a.pending.push(Msg {
                        from: from.clone(),
                        payload: payload.clone(),
                    });
                }
            }
            Action::Deliver { agent } => {
                if let Some(a) = agents.get_mut(agent) {
                    let msgs = std::mem::take(&mut a.pending);
                    a.delivered.extend(msgs);
                }
            }
            Action::Evict { agent } => {
                self.lru.retain(|a| a != agent);
                if let Some(a) = agents.get_mut(agent) {
                    a.status = Status::Suspended;
                }
            }
            Action::Restore { agent } => self.touch(agent),
            Action::Terminate { agent } => {
                self.lru.retain(|a| a != agent);
                self.state.agents.remove(agent);
            }
            Action::Emit { .. }
            | Action::Claim { .. }
            | Action::ClaimNothing
            | Action::Ack { .. }
            | Action::StaleAck { .. }
            | Action::Retry { .. } => self.apply_trigger(action),
            Action::LoopRound { round, tools } => {
                self.state.loop_messages.extend(round_messages(*round, *tools))
            }
            Action::Gc { strip: false } => self.collect(),
            Action::Gc { strip: true } | Action::Release { .. } => {}
            Action::Confirm {
                idem,
                effect,
                delivered,
            } => {
                self.needs_human.remove(idem);
                self.confirmed.insert(idem.clone());
                if parked_by_hook(effect) {
                    self.hook_released.insert(effect.clone());
                }
                if !*delivered {
                    // Released: the turn's re-run sends it, once.
                    self.maybe_effects.remove(effect);
                }
                // Every FAILED trigger blocked on it runs again
                // (`System::confirm` retries each: attempts reset, no
                // backoff floor).
                let unblocked: Vec<String> = self
                    .blocked_on
                    .iter()
                    .filter(|(_, k)| k.as_deref() == Some(idem.as_str()))
                    .map(|(t, _)| t.clone())
                    .collect();
                for key in unblocked {
                    self.blocked_on.remove(&key);
                    if let Some(t) = self
                        .state
                        .triggers
                        .iter_mut()
                        .find(|t| t.key == key && t.status == TriggerStatus::Failed)
                    {
                        t.repend();
                    }
                }
            }
        }
    }

    /// What `System::gc` with a TTL of 0 leaves of the triggers: DONE and
    /// DEAD rows go, except the newest row (its rowid stays the maximum,
    /// so a later emit never reuses it); FAILED rows are all blocked on a
    /// call waiting for a human here, so they stay ([`Model::blocked_on`]
    /// has no unknown key when this is resolved); live rows stay. The
    /// ledger's settled rows go too, which the state does not show: a
    /// resumed turn must still never repeat an effect (I4).
    ///
    /// A DEAD or DONE RESUME row of a work still unfinished stays too: it
    /// records that the work was given up or settled by hand (collected,
    /// the next boot would emit it afresh and run the work again). So does
    /// a fired trigger whose own turn, on an agent still live, started and
    /// never completed (only its retry resumes it): known after a reading
    /// showed it kept ([`Model::unfinished_fires`]), else maybe
    /// ([`Model::triggers_maybe_kept`]).
    fn collect(&mut self) {
        let last = self.state.triggers.len().saturating_sub(1);
        let given_up = |key: &str| match self.works.get(key) {
            Some(Action::WorkTurn { agent, .. }) => self.state.agents.contains_key(agent),
            _ => false,
        };
        // Only a live agent's unfinished turn keeps its trigger: the
        // runtime asks the live agents for their unfinished work, so a
        // terminated agent's fire is collected like any settled row.
        let unfinished = |key: &str| {
            !self.done_work.contains(key)
                && self
                    .fire_work
                    .get(key)
                    .and_then(Action::turn)
                    .is_some_and(|(agent, _, _)| self.state.agents.contains_key(agent))
        };
        let mut maybe = BTreeSet::new();
        let keep: Vec<bool> = self
            .state
            .triggers
            .iter()
            .enumerate()
            .map(|(i, t)| match t.status {
                TriggerStatus::Done | TriggerStatus::Dead => {
                    let kept = i == last || given_up(&t.key);
                    let unfinished = unfinished(&t.key);
                    if !kept && unfinished && !self.unfinished_fires.contains(&t.key) {
                        maybe.insert(t.key.clone());
                    }
                    kept || unfinished
                }
                _ => true,
            })
            .collect();
        self.triggers_maybe_kept.extend(maybe);
        let mut keep = keep.into_iter();
        self.state.triggers.retain(|_| keep.next().unwrap_or(true));
        // Settled job runs: gone with their agent; else kept exactly while
        // the agent may resume, which the next reading tells.
        let settled: Vec<String> = self
            .state
            .runs
            .iter()
            .filter(|(_, status)| status.as_str() == SUCCEEDED)
            .map(|(run, _)| run.clone())
            .collect();
        for run in settled {
            let live = self
                .job_agent(&run)
                .is_some_and(|agent| self.state.agents.contains_key(agent));
            if live {
                self.runs_maybe_collected.insert(run);
            } else {
                self.state.runs.remove(&run);
            }
        }
    }

    /// A turn (`action`) stopped at the call `idem` (effect `effect`, when
    /// the ledger named it): it waits for a human, and a fire's trigger is
    /// blocked on it. `Err` when a human already answered for that key
    /// since the last restart (the ledger must then answer the call).
    pub fn note_needs_human(
        &mut self,
        action: &Action,
        idem: &str,
        effect: Option<&str>,
    ) -> Result<(), String> {
        if self.confirmed.contains(idem) {
            return Err(format!(
                "{idem}: a turn stopped at a call a human already confirmed (no crash since)"
            ));
        }
        if let Some(effect) = effect {
            self.needs_human.insert(idem.to_string(), effect.to_string());
        }
        if let Action::Fire { key, .. } = action {
            self.blocked_on
                .insert(key.clone(), effect.map(|_| idem.to_string()));
        }
        Ok(())
    }

    /// A crash inside a human's answer for `idem`: it may or may not have
    /// been applied (the ledger row, then each blocked trigger, each in its
    /// own transaction), so the model forgets the key — never answered
    /// again, its effect of unknown fate as before — and a trigger still
    /// FAILED on it waits for an operator's retry. A call a hook parked
    /// may then run or stop again: it no longer must stop
    /// ([`Model::must_block`]), and a stop stays allowed (its turn is
    /// lost, [`Model::blocked`]), answerable once it is reported again.
    pub fn forget_answer(&mut self, idem: &str, effect: &str) {
        self.needs_human.remove(idem);
        self.confirmed.remove(idem);
        if parked_by_hook(effect) {
            self.hook_released.insert(effect.to_string());
        }
        if !self.state.outbox.iter().any(|k| k == effect) {
            self.maybe_effects.insert(effect.to_string());
        }
        for (t, k) in self.blocked_on.iter_mut() {
            let failed = self
                .state
                .triggers
                .iter()
                .any(|r| &r.key == t && r.status == TriggerStatus::Failed);
            if failed && k.as_deref() == Some(idem) {
                *k = None;
            }
        }
        self.blocked_on.retain(|t, _| {
            self.state
                .triggers
                .iter()
                .any(|r| &r.key == t && r.status == TriggerStatus::Failed)
        });
    }

    /// The identity the runtime gives `agent`'s next turn with `prompt`
    /// (`runtime::tools::turn_identity`): the prompt and how many of the
    /// agent's completed turns had it.
    pub fn turn_identity(&self, agent: &str, prompt: &str) -> String {
        format!("{agent}/{prompt}#{}", self.occurrence(agent, prompt))
    }

    /// How many of `agent`'s completed turns had `prompt`.
    fn occurrence(&self, agent: &str, prompt: &str) -> usize {
        self.state
            .agents
            .get(agent)
            .map_or(0, |a| a.turns.iter().filter(|t| t.prompt == prompt).count())
    }

    /// The effect the `index`-th tool of `agent`'s next turn with `prompt`
    /// has on the world ([`effect_key`]).
    pub fn effect(&self, agent: &str, prompt: &str, index: usize) -> String {
        effect_key(agent, prompt, index, self.occurrence(agent, prompt))
    }

    /// The state after `action`'s turn stopped at an irreversible call that
    /// needs a human's confirmation (seed 001: blocked, not skipped and not
    /// re-sent), or `None` when it cannot need one: only a turn with the
    /// identity of one a crash rolled back can ([`Model::rolled_back`]:
    /// its INTENT may be in the ledger, of unknown fate), or a work or
    /// fire a crash cut. Nothing of the turn is kept: a plain turn stays lost
    /// and its messages pending; a fire's trigger is acked FAILED, one
    /// attempt more.
    pub fn blocked(&self, action: &Action) -> Option<Model> {
        let mut m = self.clone();
        match action {
            // A world that dedups takes every call in doubt again with its
            // key: only a hook parks a turn there — it must
            // ([`Model::must_block`]), or, when a crash lost a human's
            // answer to it ([`Model::forget_answer`]), it may again.
            _ if self.dedup_world && !hook_parks(action) => return None,
            // Parked by a hook: the turn holds its agent's slot and stays
            // open (resumable), in place of any turn lost before it, as a
            // failing ask leaves it ([`Model::provider_fails`]).
            Action::RunTurn { agent, .. } if self.must_block(action) => {
                m.touch(agent);
                m.lost_turns.insert(agent.clone(), action.clone());
            }
            // The turn took its agent's slot before it stopped. It stays
            // lost (resumable) whether it is the rolled-back turn itself or
            // a later turn with its identity.
            Action::RunTurn { agent, prompt, .. }
                if self.lost_turns.get(agent) == Some(action)
                    || self.rolled_back.contains(&self.turn_identity(agent, prompt)) =>
            {
                m.touch(agent);
                m.lost_turns
                    .entry(agent.clone())
                    .or_insert_with(|| action.clone());
            }
            Action::WorkTurn { agent, work, .. } if self.works.contains_key(&work_key(agent, work)) => {
                m.touch(agent)
            }
            // A resumed job run's started work: the run waits for a human
            // (`run --resume` answers NeedsConfirmation).
            Action::JobResume { run, agent, .. } if self.works.contains_key(&job_work_key(agent, run)) => {
                m.touch(agent);
                m.state.runs.insert(run.clone(), WAITING_FOR_HUMAN.into());
            }
            Action::Fire { key, agent, .. }
                if (self.fire_work.get(key) == Some(action) || self.works.contains_key(key))
                    && !self.done_work.contains(key) =>
            {
                m.touch(agent);
                let t = m.state.triggers.iter_mut().find(|t| &t.key == key)?;
                t.status = TriggerStatus::Failed;
                t.attempts += 1;
                // Blocked on a key the ledger names ([`Model::note_needs_human`]).
                m.blocked_on.insert(key.clone(), None);
                // A job run's RESUME trigger parks its run (`settle_fire`).
                m.settle_job(key, WAITING_FOR_HUMAN);
            }
            _ => return None,
        }
        m.counter += 1;
        Some(m)
    }

    /// Whether the plain turn `action` must stop at its first call, parked
    /// by a hook for a human ([`ToolStep::confirm`]), because no human has
    /// released it: the runtime may not run it, complete the turn, or
    /// skip it.
    pub fn must_block(&self, action: &Action) -> bool {
        match action {
            Action::RunTurn {
                agent, prompt, tools, ..
            } => {
                tools.first().is_some_and(|t| t.confirm)
                    && !self.hook_released.contains(&self.effect(agent, prompt, 0))
                    // A failing first ask fails the turn before the call.
                    && self.failing_round(agent, prompt) != Some(0)
            }
            _ => false,
        }
    }

    /// Every live agent's session record as the runtime must have
    /// written it: the current version, the provider the system was
    /// booted with, and the residency the model predicts — each change of
    /// slot (a create, an LRU eviction, a turn's or a restore's
    /// acquisition, an evict, a restart) is written through to the record
    /// before the op is acknowledged.
    pub fn records(&self) -> BTreeMap<String, Record> {
        self.state
            .agents
            .iter()
            .map(|(name, a)| {
                let record = Record {
                    schema_version: RECORD_VERSION,
                    provider: PROVIDER.0.to_string(),
                    model: PROVIDER.1.to_string(),
                    active: a.status == Status::Resident,
                };
                (name.clone(), record)
            })
            .collect()
    }

    /// The state to compare a projection with: the acknowledged state and
    /// what derives from it ([`Model::records`]).
    pub fn expected(&self) -> State {
        let mut state = self.state.clone();
        state.records = self.records();
        state
    }

    /// Set the clock to op number `step`'s time (the driver's
    /// `set_step`): the executor and the reference machine call it before
    /// each op.
    pub fn at_step(&mut self, step: u64) {
        self.now = step * crate::driver::OP_MS;
    }

    /// What a restart does to acknowledged state: every session is
    /// suspended (nothing holds a slot until it is used again).
    pub fn restarted(&self) -> Model {
        let mut m = self.clone();
        for a in m.state.agents.values_mut() {
            a.status = Status::Suspended;
        }
        m.lru.clear();
        // A crash may leave a released call's fate unknown again.
        m.confirmed.clear();
        // Boot reclaims every lease (the root lock proves their holders
        // dead); a zombie holder may still try to ack.
        for t in &mut m.state.triggers {
            if t.status == TriggerStatus::Claimed {
                m.stale_claims.insert(t.key.clone());
                t.status = if t.attempts >= MAX_ATTEMPTS {
                    TriggerStatus::Dead
                } else {
                    TriggerStatus::Pending
                };
            }
        }
        m
    }
}
