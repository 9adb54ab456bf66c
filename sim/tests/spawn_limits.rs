//! The model's spawn limits (`model::MAX_CHILDREN`, `model::max_agents`):
//! a spawn past either is a failed call that creates nothing, counted as
//! the runtime counts (a turn's own spawns still pending count), and an op
//! whose answer the model cannot know — other agents' turns left open with
//! spawns of unknown fate — is skipped. Built on model states only.

use durable_agent_sim::model::{max_agents, Action, Model, MAX_CHILDREN};
use durable_agent_sim::op::{AgentRef, Op, Orch, ToolStep};

fn step(orch: Orch) -> ToolStep {
    ToolStep {
        orch,
        ..ToolStep::default()
    }
}

fn turn(agent: u8, tools: Vec<ToolStep>) -> Op {
    Op::RunTurn {
        agent: AgentRef(agent),
        tools,
        final_fails: 0,
    }
}

/// A seed whose runs boot with the tree's limit `limit`.
fn seed_with(limit: usize) -> u64 {
    (0..).find(|s| max_agents(*s) == limit).expect("a seed")
}

/// `ops` resolved and applied in turn (each must resolve).
fn run(seed: u64, ops: &[Op]) -> Model {
    let mut m = Model::for_seed(seed);
    for op in ops {
        let action = m.resolve(op).unwrap_or_else(|| panic!("{op:?} did not resolve"));
        m.note_started(&action);
        m.apply(&action);
    }
    m
}

/// Whether each spawn of the turn `op` resolves to succeeds.
fn spawns_ok(m: &Model, op: &Op) -> Vec<bool> {
    let Some(Action::RunTurn { tools, .. }) = m.resolve(op) else {
        panic!("{op:?} did not resolve to a turn");
    };
    tools
        .iter()
        .filter(|t| t.orch == Orch::Spawn)
        .map(|t| t.ok)
        .collect()
}

fn children_of(m: &Model, parent: &str) -> usize {
    m.state
        .agents
        .values()
        .filter(|a| a.parent.as_deref() == Some(parent))
        .count()
}

#[test]
fn a_fan_out_past_the_children_limit_creates_only_what_fits() {
    assert_eq!(MAX_CHILDREN, 2);
    let seed = seed_with(9);
    let fan_out = turn(0, vec![step(Orch::Spawn), step(Orch::Spawn), step(Orch::Spawn)]);
    let m = run(seed, &[Op::CreateRoot]);
    assert_eq!(spawns_ok(&m, &fan_out), [true, true, false]);
    let m = run(seed, &[Op::CreateRoot, fan_out.clone()]);
    assert_eq!(children_of(&m, "a000"), 2);
    // With two children, every further spawn of that parent is refused,
    // and so is a send to the child it did not make.
    let again = turn(0, vec![step(Orch::Spawn), step(Orch::Send(AgentRef(0)))]);
    let Some(Action::RunTurn { tools, .. }) = m.resolve(&again) else {
        panic!("no turn");
    };
    assert!(!tools[0].ok && !tools[1].ok, "{tools:?}");
    let mut after = m.clone();
    after.apply(&m.resolve(&again).expect("resolves"));
    assert_eq!(children_of(&after, "a000"), 2);
}

#[test]
fn a_turns_own_pending_spawn_counts_against_the_tree_limit() {
    let seed = seed_with(3);
    let m = run(seed, &[Op::CreateRoot, Op::CreateRoot]);
    // Two live agents and a limit of three: the first spawn fits, the
    // second meets the limit with the first still pending.
    let fan_out = turn(0, vec![step(Orch::Spawn), step(Orch::Spawn)]);
    assert_eq!(spawns_ok(&m, &fan_out), [true, false]);
    let mut after = m.clone();
    after.apply(&m.resolve(&fan_out).expect("resolves"));
    assert_eq!(after.state.agents.len(), 3);
    // The tree is full: any agent's spawn is refused now.
    assert_eq!(spawns_ok(&after, &turn(1, vec![step(Orch::Spawn)])), [false]);
}

#[test]
fn a_spawn_whose_answer_hangs_on_another_agents_open_turn_is_skipped() {
    let seed = seed_with(3);
    let mut m = run(seed, &[Op::CreateRoot, Op::CreateRoot]);
    // a000's turn with a spawn starts and never completes (a crash, a
    // provider failure, a hook): its spawn may be pending or not.
    let started = m.resolve(&turn(0, vec![step(Orch::Spawn)])).expect("resolves");
    m.note_started(&started);
    // For a001, two live agents plus that unknown spawn straddle the
    // limit of three: the runtime may answer either way.
    assert!(m.resolve(&turn(1, vec![step(Orch::Spawn)])).is_none());
    // A turn without spawns is unaffected, and a000 running that turn
    // again (the same prompt: it resumes) makes the spawn that is pending,
    // not a second one. (A parked turn's spawn does count against a
    // different turn of its agent: `Model::limit_refusals`.)
    assert!(m.resolve(&turn(1, vec![step(Orch::None)])).is_some());
    assert_eq!(spawns_ok(&m, &turn(0, vec![step(Orch::Spawn)])), [true]);
    // Once that turn completes, its child is live and a001's answer known.
    m.apply(&started);
    assert_eq!(spawns_ok(&m, &turn(1, vec![step(Orch::Spawn)])), [false]);
}

#[test]
fn a_resumed_turn_whose_spawn_answers_changed_is_skipped() {
    let seed = seed_with(9);
    let mut m = run(seed, &[Op::CreateRoot, Op::CreateRoot]);
    // a000's turn spawning once was lost by a crash: resume_turn would
    // run it again with the decision it carries (the spawn succeeds).
    let lost = m.resolve(&turn(0, vec![step(Orch::Spawn)])).expect("resolves");
    m.note_started(&lost);
    m.lost_turns.insert("a000".into(), lost);
    let resume = Op::ResumeTurn { agent: AgentRef(0) };
    assert!(m.resolve(&resume).is_some());
    // The operator gives a000 two children meanwhile: a spawn the lost
    // run logged keeps its success, one it did not is refused now.
    for _ in 0..2 {
        let spawn = m
            .resolve(&Op::SpawnChild { parent: AgentRef(0) })
            .expect("resolves");
        m.apply(&spawn);
    }
    assert!(m.resolve(&resume).is_none());
}

#[test]
fn an_answer_from_the_log_is_never_skipped_for_the_limits() {
    let seed = seed_with(9);
    // A job run whose turn spawns two children: its root then has both.
    let job = Op::JobRun {
        tools: vec![step(Orch::Spawn), step(Orch::Spawn)],
    };
    let m = run(seed, &[job]);
    assert_eq!(children_of(&m, "a000"), 2);
    // Its resume answers from the log (the work completed): no spawn call
    // runs, so the limits, which would refuse both now, say nothing.
    let resume = m
        .resolve(&Op::JobResume { run: 0 })
        .expect("the resume of a done job resolves");
    assert!(
        matches!(resume, Action::JobResume { done: true, .. }),
        "{resume:?}"
    );
    // And it opens no turn that other agents' spawns would wait on.
    let mut after = m.clone();
    after.note_started(&resume);
    assert!(after.open_spawns.is_empty(), "{:?}", after.open_spawns);
}
