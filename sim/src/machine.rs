//! The proptest-state-machine pair: [`RefMachine`] (the reference state
//! machine: generation, preconditions, the model's expectation) and
//! [`SimTest`] (the system under test: the real runtime on SimFs, driven
//! through [`Exec`]).
//!
//! Invariant: the reference state only steers generation and shrinking
//! (which ops make sense next). It is optimistic: it assumes every op is
//! acknowledged. The authoritative model lives in [`Exec`], which after a
//! crash adopts whichever candidate the oracle accepted; ops name agents by
//! index, so the two never need to agree on which agents exist.

use durable_agent::canary::Canaries;
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use crate::exec::Exec;
use crate::model::{Action, Model, TriggerStatus};
use crate::op::{op_strategy, AgentRef, Op};

/// The reference state: the seed of the run and the optimistic model.
#[derive(Debug, Clone)]
pub struct RefState {
    pub seed: u64,
    pub model: Model,
    /// The previous op armed a crash: the next turn may be rolled back, so
    /// it becomes a candidate for `resume_turn`.
    pub crash_armed: bool,
    /// That crash lies deep enough into the next op (40 points or more)
    /// to reach a turn's first call.
    pub deep_crash: bool,
    /// Ops applied so far: the clock the executor's model reads
    /// ([`Model::at_step`]).
    pub steps: u64,
}

/// The reference state machine.
#[derive(Debug, Clone, Copy)]
pub struct RefMachine;

impl ReferenceStateMachine for RefMachine {
    type State = RefState;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<RefState> {
        any::<u64>()
            .prop_map(|seed| RefState {
                seed,
                model: Model::for_seed(seed),
                crash_armed: false,
                deep_crash: false,
                steps: 0,
            })
            .boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Op> {
        if state.model.state.agents.is_empty() {
            // Nothing to act on yet: build, or crash an empty runtime —
            // or go on with the trigger chain, which needs no agent (a
            // zombie's ack after a restart, a claim's order).
            match trigger_steer(state) {
                Some(steer) => prop_oneof![4 => Just(Op::CreateRoot), 1 => steer, 1 => op_strategy()].boxed(),
                None => prop_oneof![4 => Just(Op::CreateRoot), 1 => op_strategy()].boxed(),
            }
        } else if let Some(retry) = work_retry(state) {
            // Before the trigger steer: the work's RESUME trigger is due
            // too, and its fire would take the retry's place.
            prop_oneof![1 => retry, 2 => op_strategy()].boxed()
        } else if let Some(steer) = trigger_steer(state) {
            prop_oneof![1 => steer, 2 => op_strategy()].boxed()
        } else if state.crash_armed {
            // A crash armed into a work turn: cut after its start, it gets
            // a RESUME trigger and a retry (see `work_retry`).
            let work =
                (0u8..8, prop::collection::vec(crate::op::tool_step(), 1..3)).prop_map(|(i, tools)| {
                    Op::WorkTurn {
                        agent: AgentRef(i),
                        work: i % 3,
                        tools,
                    }
                });
            if !state.deep_crash {
                return prop_oneof![1 => work, 3 => op_strategy()].boxed();
            }
            // Deep enough to reach a turn's first call (40–70 points in):
            // a turn that opens with an irreversible call, whose INTENT
            // window, effect and result the crash may cut — where a
            // runtime that sends before its INTENT is durable, or forgets
            // it, sends twice on the re-run (left to chance, the ci seed
            // of a generator reached that window in one run of five).
            let intent =
                (0u8..8, prop::collection::vec(crate::op::tool_step(), 0..2)).prop_map(|(i, rest)| {
                    let first = crate::op::ToolStep {
                        irreversible: true,
                        ok: true,
                        ..Default::default()
                    };
                    let tools = std::iter::once(first).chain(rest).collect();
                    Op::RunTurn {
                        agent: AgentRef(i),
                        tools,
                        final_fails: 0,
                    }
                });
            prop_oneof![1 => work, 1 => intent, 3 => op_strategy()].boxed()
        } else if !state.model.needs_human.is_empty() {
            // A turn stopped at a call waiting for a human: answer it, and
            // run the turn again (the ledger must then answer the call as
            // the human said, sending it once or never).
            prop_oneof![
                1 => any::<u8>().prop_map(|pick| Op::Confirm { pick }),
                1 => (0u8..8).prop_map(|i| Op::ResumeTurn { agent: crate::op::AgentRef(i) }),
                2 => op_strategy(),
            ]
            .boxed()
        } else if !state.model.lost_turns.is_empty() {
            // A turn may have been rolled back: resuming it is what checks
            // that the ledger never repeats its effects.
            prop_oneof![
                1 => (0u8..8).prop_map(|i| Op::ResumeTurn { agent: crate::op::AgentRef(i) }),
                2 => op_strategy(),
            ]
            .boxed()
        } else {
            op_strategy()
        }
    }

    fn apply(mut state: RefState, op: &Op) -> RefState {
        state.steps += 1;
        state.model.at_step(state.steps);
        if matches!(op, Op::Recover) {
            // A clean restart reclaims every lease (the optimistic model
            // has no crashes, but clean restarts leave zombies too).
            state.model = state.model.restarted();
        }
        if let Some(action) = state.model.resolve(op) {
            state.model.note_started(&action);
            if let (true, Action::Fire { key, .. }) = (state.crash_armed, &action) {
                // The fire may be cut between its commits: assume it left
                // the trigger due, and steer towards its re-fire (and a
                // turn of its agent in between; see `trigger_steer`).
                state.model.fire_work.insert(key.clone(), action.clone());
                state.crash_armed = false;
                return state;
            }
            if state.crash_armed {
                if let Some(started) = state.model.started_work(&action) {
                    // Assume the crash cut it after its start (R7).
                    state.model = started;
                    state.crash_armed = false;
                    return state;
                }
            }
            let blocked = state
                .model
                .must_block(&action)
                .then(|| state.model.blocked(&action))
                .flatten();
            if let (Some(blocked), Action::RunTurn { agent, prompt, .. }) = (blocked, &action) {
                // A hook parks its first call: steer towards a human's
                // answer (that releases it) and the re-run.
                let n = blocked.counter;
                state.model = blocked;
                let effect = state.model.effect(agent, prompt, 0);
                state.model.needs_human.insert(format!("steer{n}"), effect);
                state.crash_armed = false;
                return state;
            }
            if let Action::RunTurn { agent, tools, .. } = &action {
                if tools.iter().any(|t| !t.lost.is_none() && t.irreversible && t.ok) {
                    // The world keeps an answer of this turn: it fails and
                    // is rolled back, its effect's fate unknown. Run again,
                    // it stops at the call for a human (the world cannot
                    // dedup); steer towards the answer and the re-run.
                    if state.model.lost_turns.get(agent) == Some(&action) {
                        let n = state.model.counter;
                        state
                            .model
                            .needs_human
                            .insert(format!("steer{n}"), format!("steer{n}"));
                    } else {
                        state.model.lost_turns.insert(agent.clone(), action.clone());
                    }
                    state.model.counter += 1;
                    state.crash_armed = false;
                    return state;
                }
            }
            state.model.apply(&action);
            if let (true, Action::RunTurn { agent, .. }) = (state.crash_armed, &action) {
                state.model.lost_turns.insert(agent.clone(), action.clone());
            }
        }
        state.crash_armed = matches!(op, Op::Crash { .. });
        state.deep_crash = matches!(op, Op::Crash { offset, .. } if *offset >= 40);
        state
    }

    fn preconditions(state: &RefState, op: &Op) -> bool {
        // (The steering ops below may not resolve in the optimistic model;
        // the authoritative model skips them then, which is harmless.)
        op.is_control() || state.model.resolve(op).is_some()
    }
}

/// The system under test: the clean runtime (no canaries). Canary searches
/// go through [`crate::search`], which drives [`Exec`] the same way.
#[derive(Debug, Clone, Copy)]
pub struct SimTest;

impl StateMachineTest for SimTest {
    type SystemUnderTest = Exec;
    type Reference = RefMachine;

    fn init_test(state: &RefState) -> Exec {
        Exec::new(state.seed, Canaries::none(), None).unwrap_or_else(|f| panic!("{}", f.report()))
    }

    fn apply(mut exec: Exec, _state: &RefState, op: Op) -> Exec {
        if let Err(f) = exec.step(&op) {
            panic!("{}", f.report());
        }
        exec
    }
}

/// A work was (assumed) cut after it started: its retry by the same agent
/// and work id, with a new prompt (and new messages waiting), must run
/// what it first started with — whether or not the authoritative model
/// learned that it started (a missing RESUME trigger shows there).
fn work_retry(state: &RefState) -> Option<BoxedStrategy<Op>> {
    let model = &state.model;
    // An API work (a job run's work is resumed by `job_resume` or its
    // RESUME trigger).
    let (agent, k) = model.works.values().find_map(|w| match w {
        Action::WorkTurn { agent, work, .. } => {
            Some((agent, work.strip_prefix("api:w")?.parse::<u8>().ok()?))
        }
        _ => None,
    })?;
    let i = model.state.agents.keys().position(|n| n == agent)?;
    let agent = AgentRef(u8::try_from(i).ok()?);
    Some(
        prop::collection::vec(crate::op::tool_step(), 0..3)
            .prop_map(move |tools| Op::WorkTurn {
                agent,
                work: k,
                tools,
            })
            .boxed(),
    )
}

/// Ops that exercise the trigger chain's crash windows, when the state
/// makes them meaningful: with a trigger due, a crash armed into the next
/// fire (late offsets too: a fire crosses ~45-80 I/O points and the
/// generic offsets, 0..40, stop short of its last commits, turn.complete
/// and the ack), then that fire; after a fire ran with a crash armed, a
/// turn of its agent (so its turn count moves on) and its re-fire; with a
/// claim held, a restart (and, a row due, a claim); with zombie claims around (a restart reclaimed
/// leases), a fresh claim and a stale ack; with a row not yet due, an emit
/// due at once, and with two due rows the later emitted due first, a claim
/// (the claim's order among due rows).
fn trigger_steer(state: &RefState) -> Option<BoxedStrategy<Op>> {
    let model = &state.model;
    let due = model
        .state
        .triggers
        .iter()
        .any(|t| t.status == TriggerStatus::Pending);
    let any_agent = !model.state.agents.is_empty();
    if state.crash_armed && due && any_agent {
        return Some(
            (0u8..8, prop::collection::vec(crate::op::tool_step(), 1..3))
                .prop_map(|(i, tools)| Op::FireTrigger {
                    agent: AgentRef(i),
                    tools,
                })
                .boxed(),
        );
    }
    let agents = model.state.agents.len().max(1);
    let index_of = |name: &str| model.state.agents.keys().position(|n| n == name).unwrap_or(0);
    let mut arms: Vec<BoxedStrategy<Op>> = Vec::new();
    let interrupted = model
        .fire_work
        .iter()
        .find(|(key, _)| !model.done_work.contains(*key))
        .map(|(_, work)| work);
    if let Some(Action::Fire { agent, .. }) = interrupted {
        let i = u8::try_from(index_of(agent) % agents).unwrap_or(0);
        arms.push(
            Just(Op::RunTurn {
                final_fails: 0,
                agent: AgentRef(i),
                tools: Vec::new(),
            })
            .boxed(),
        );
        arms.push(
            Just(Op::FireTrigger {
                agent: AgentRef(i),
                tools: Vec::new(),
            })
            .boxed(),
        );
    }
    if due {
        // A due row is claimed (a daemon claims promptly): a claim held
        // across a restart is what leaves a zombie.
        arms.push(Just(Op::ClaimTrigger).boxed());
    }
    if due && any_agent {
        arms.push(
            ((8u16..96), crate::op::crash_kind())
                .prop_map(|(offset, kind)| Op::Crash { offset, kind })
                .boxed(),
        );
    }
    if model
        .state
        .triggers
        .iter()
        .any(|t| t.status == TriggerStatus::Claimed)
    {
        // A restart while a claim is held leaves a zombie behind.
        arms.push(Just(Op::Recover).boxed());
    }
    if model
        .state
        .triggers
        .iter()
        .any(|t| matches!(t.status, TriggerStatus::Dead | TriggerStatus::Failed))
    {
        // An operator notices a given-up trigger.
        arms.push(
            any::<u8>()
                .prop_map(|trigger| Op::RetryTrigger { trigger })
                .boxed(),
        );
    }
    if model
        .state
        .triggers
        .iter()
        .any(|t| t.status == TriggerStatus::Pending && (t.not_before > model.now || t.fire_at > model.now))
    {
        // A row under its backoff floor, or not yet due: claim or fire
        // before it is due.
        arms.push(Just(Op::ClaimTrigger).boxed());
        arms.push(
            (0u8..8)
                .prop_map(|i| Op::FireTrigger {
                    agent: AgentRef(i),
                    tools: Vec::new(),
                })
                .boxed(),
        );
    }
    let pending = || {
        model
            .state
            .triggers
            .iter()
            .filter(|t| t.status == TriggerStatus::Pending)
    };
    if pending().any(|t| t.fire_at > model.now) {
        // A row not yet due: a later emit due at once puts the emit order
        // and the `fire_at` order apart (the claim's `ORDER BY fire_at`).
        arms.push(
            any::<u8>()
                .prop_map(|key| Op::EmitTrigger { key, due_in: 0 })
                .boxed(),
        );
    }
    let due: Vec<u64> = pending()
        .filter(|t| t.not_before <= model.now && t.fire_at <= model.now)
        .map(|t| t.fire_at)
        .collect();
    if due.windows(2).any(|w| w[1] < w[0]) {
        // Two due rows, the later emitted due first: a claim tells a store
        // that orders by `fire_at` from one that orders by emit order.
        arms.push(Just(Op::ClaimTrigger).boxed());
        arms.push(Just(Op::ClaimTrigger).boxed());
    }
    if !model.stale_claims.is_empty() {
        // A zombie's ack tells most once its row is claimed again (a new
        // claim owns it then, and only the lease check refuses the ack):
        // claim first, then ack.
        let reclaimed = model
            .state
            .triggers
            .iter()
            .any(|t| t.status == TriggerStatus::Claimed && model.stale_claims.contains(&t.key));
        let stale_ack = || any::<u8>().prop_map(|trigger| Op::StaleAck { trigger }).boxed();
        if reclaimed {
            arms.push(stale_ack());
            arms.push(stale_ack());
        } else {
            arms.push(Just(Op::ClaimTrigger).boxed());
            arms.push(stale_ack());
        }
    }
    if arms.is_empty() {
        return None;
    }
    Some(proptest::strategy::Union::new(arms).boxed())
}
