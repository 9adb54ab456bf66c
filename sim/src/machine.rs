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
use crate::model::{Action, Model};
use crate::op::{op_strategy, Op};

/// The reference state: the seed of the run and the optimistic model.
#[derive(Debug, Clone)]
pub struct RefState {
    pub seed: u64,
    pub model: Model,
    /// The previous op armed a crash: the next turn may be rolled back, so
    /// it becomes a candidate for `resume_turn`.
    pub crash_armed: bool,
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
                model: Model::default(),
                crash_armed: false,
            })
            .boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Op> {
        if state.model.state.agents.is_empty() {
            // Nothing to act on yet: build, or crash an empty runtime.
            prop_oneof![4 => Just(Op::CreateRoot), 1 => op_strategy()].boxed()
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
        if let Some(action) = state.model.resolve(op) {
            state.model.apply(&action);
            if let (true, Action::RunTurn { agent, .. }) = (state.crash_armed, &action) {
                state.model.lost_turns.insert(agent.clone(), action.clone());
            }
        }
        state.crash_armed = matches!(op, Op::Crash { .. });
        state
    }

    fn preconditions(state: &RefState, op: &Op) -> bool {
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
