//! A fixed 40-op sequence that touches every op kind (the sweep's and the
//! benchmark's workload, and a readable example of a case).
//!
//! Invariant: every op resolves to an action on the model it is applied to
//! (none is skipped), so a sweep of it covers every runtime code path the
//! harness can reach.

use crate::op::{AgentRef as A, Lost, Op, Orch, ToolStep};

const REV: ToolStep = ToolStep {
    irreversible: false,
    ok: true,
    joins_round: false,
    lost: Lost::None,
    orch: Orch::None,
    provider_fails: 0,
    garbled: false,
    denied: false,
    confirm: false,
};
const IRREV: ToolStep = ToolStep {
    irreversible: true,
    ok: true,
    joins_round: false,
    lost: Lost::None,
    orch: Orch::None,
    provider_fails: 0,
    garbled: false,
    denied: false,
    confirm: false,
};
const FAILING: ToolStep = ToolStep {
    irreversible: true,
    ok: false,
    joins_round: false,
    lost: Lost::None,
    orch: Orch::None,
    provider_fails: 0,
    garbled: false,
    denied: false,
    confirm: false,
};

/// The tour: a tree of four agents, turns with every tool kind, messages
/// delivered and pending, eviction, restore, termination and a clean
/// restart in the middle; a turn that reads its messages; then durable
/// triggers (a deduplicated re-emit,
/// fires whose turns have effects, a failed ack retried by a fire) and a
/// checkpointed loop round.
pub fn tour() -> Vec<Op> {
    vec![
        Op::CreateRoot,
        Op::SpawnChild { parent: A(0) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(0),
            tools: vec![],
        },
        Op::SendMessage { from: A(0), to: A(1) },
        Op::SpawnChild { parent: A(1) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(1),
            tools: vec![REV],
        },
        Op::SendMessage { from: A(1), to: A(0) },
        Op::Deliver { agent: A(0) },
        Op::CreateRoot,
        Op::RunTurn {
            final_fails: 0,
            agent: A(2),
            tools: vec![IRREV, REV],
        },
        Op::Evict { agent: A(0) },
        Op::SendMessage { from: A(2), to: A(0) },
        Op::Restore { agent: A(0) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(0),
            tools: vec![FAILING],
        },
        Op::Recover,
        Op::Deliver { agent: A(0) },
        Op::SendMessage { from: A(3), to: A(2) },
        Op::Terminate { agent: A(0) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(1),
            tools: vec![IRREV],
        },
        Op::SpawnChild { parent: A(3) },
        Op::SendMessage { from: A(0), to: A(3) },
        Op::Evict { agent: A(1) },
        Op::Deliver { agent: A(0) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(3),
            tools: vec![REV, IRREV, REV],
        },
        Op::SendMessage { from: A(1), to: A(1) },
        Op::Terminate { agent: A(0) },
        Op::Restore { agent: A(0) },
        Op::Deliver { agent: A(0) },
        Op::RunTurn {
            final_fails: 0,
            agent: A(1),
            tools: vec![],
        },
        Op::CreateRoot,
        Op::SendMessage { from: A(0), to: A(1) },
        Op::ReadTurn {
            final_fails: 0,
            agent: A(1),
            tools: vec![REV],
        },
        Op::EmitTrigger { key: 0, due_in: 0 },
        Op::FireTrigger {
            agent: A(1),
            tools: vec![IRREV, REV],
        },
        Op::EmitTrigger { key: 1, due_in: 0 },
        Op::EmitTrigger { key: 1, due_in: 0 },
        Op::ClaimTrigger,
        Op::AckTrigger {
            trigger: 0,
            ok: false,
        },
        Op::FireTrigger {
            agent: A(0),
            tools: vec![IRREV],
        },
        Op::LoopRound { tools: 2 },
    ]
}
