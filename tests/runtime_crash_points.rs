//! The named fault-injection points of seed 002 ("Fault injection"): each
//! test finds the I/O point by its trace label on a dry run, crashes there
//! with `Fault::CrashAt`, restarts under ProcessCrash, PowerLoss(Strict) and
//! PowerLoss(Eager), recovers, and asserts the recovery invariants plus the
//! point's specific expectation.

mod runtime_support;

use durable_agent::canary::Canaries;
use durable_agent::fs::CrashMode;
use durable_agent::runtime::ConversationItem;
use runtime_support::{
    check_all_or_nothing, crash_run, dry_run, point_after, point_of, CrashRun, DryRun, Op, MODES,
};

const SEED: u64 = 11;

/// Crash at the first point labelled `label` in op `op_index`, under every
/// mode; `check` gets the dry run and each recovered run.
fn at_label(ops: &[Op], op_index: usize, label: &str, check: impl Fn(&DryRun, &CrashRun, CrashMode)) {
    let dry = dry_run(SEED, ops);
    crash_everywhere(&dry, ops, op_index, point_of(&dry, op_index, label), label, check);
}

/// Like [`at_label`], for the first `label` after `anchor` in the op.
fn after_label(
    ops: &[Op],
    op_index: usize,
    anchor: &str,
    label: &str,
    check: impl Fn(&DryRun, &CrashRun, CrashMode),
) {
    let dry = dry_run(SEED, ops);
    let point = point_after(&dry, op_index, anchor, label);
    crash_everywhere(&dry, ops, op_index, point, label, check);
}

/// Like [`at_label`], at the I/O point right after the one labelled
/// `label`: the crash falls just after that I/O. When it was the op's last
/// I/O, the op returned before the crash, which the next op observes.
fn just_after(ops: &[Op], op_index: usize, label: &str, check: impl Fn(&DryRun, &CrashRun, CrashMode)) {
    let dry = dry_run(SEED, ops);
    let point = point_of(&dry, op_index, label) + 1;
    let observer = if point <= dry.op_points[op_index].1 {
        op_index
    } else {
        assert_eq!(
            dry.op_points.get(op_index + 1).map(|p| p.0),
            Some(point),
            "{label:?} ends the run"
        );
        op_index + 1
    };
    crash_everywhere(&dry, ops, observer, point, label, check);
}

fn crash_everywhere(
    dry: &DryRun,
    ops: &[Op],
    op_index: usize,
    point: u64,
    label: &str,
    check: impl Fn(&DryRun, &CrashRun, CrashMode),
) {
    for mode in MODES {
        let run = crash_run(SEED, ops, point, mode, &Canaries::none())
            .unwrap_or_else(|e| panic!("{mode:?}, crash at {point} ({label}): {e}"))
            .expect("the crash point was reached");
        assert_eq!(
            run.failed_op, op_index,
            "{mode:?}: crash observed by the wrong op"
        );
        check_all_or_nothing(dry, &run).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        check(dry, &run, mode);
    }
}

fn base() -> Vec<Op> {
    vec![Op::CreateRoot("alpha"), Op::Spawn(0, "worker")]
}

#[test]
fn crash_after_session_dir_before_record_leaves_no_agent_and_cleans_the_orphan() {
    let mut ops = base();
    ops.push(Op::CreateRoot("beta"));
    after_label(
        &ops,
        2,
        "session dir mkdir",
        "session.json.tmp create",
        |dry, run, _mode| {
            assert_eq!(run.runtime.state().normalized(), dry.states[2]);
            assert_eq!(run.report.orphans_cleaned.len(), 1);
        },
    );
}

#[test]
fn crash_after_record_before_agent_created_cleans_the_orphan_session() {
    let mut ops = base();
    ops.push(Op::CreateRoot("beta"));
    at_label(
        &ops,
        2,
        "events.pending create agent.created",
        |dry, run, _mode| {
            assert_eq!(run.runtime.state().normalized(), dry.states[2]);
            assert_eq!(run.report.orphans_cleaned.len(), 1, "{:?}", run.report);
        },
    );
}

#[test]
fn crash_after_pending_agent_created_replays_it_and_keeps_the_agent() {
    let mut ops = base();
    ops.push(Op::CreateRoot("beta"));
    at_label(&ops, 2, "events.jsonl append agent.created", |dry, run, mode| {
        // The pending copy is durable (data and directory entry) before
        // the log append starts, so the unacknowledged create completes
        // from it in every crash mode, power cuts included.
        let replayed = run.report.logs_repaired.values().any(|r| r.pending_replayed);
        assert!(replayed, "{mode:?}: {:?}", run.report);
        assert_eq!(run.runtime.state().normalized(), dry.states[3], "{mode:?}");
    });
}

#[test]
fn crash_after_agent_created_before_spawn_success_keeps_the_child() {
    let mut ops = base();
    ops.push(Op::Spawn(1, "grandchild"));
    ops.push(Op::CreateRoot("beta"));
    just_after(&ops, 2, "events.jsonl fsync agent.created", |dry, run, _mode| {
        assert_eq!(run.runtime.state().normalized(), dry.states[3]);
        assert_eq!(run.runtime.tree().nodes().len(), 3);
    });
}

#[test]
fn crash_before_spawn_is_logged_makes_the_unacknowledged_child_vanish() {
    let mut ops = base();
    ops.push(Op::Spawn(1, "grandchild"));
    at_label(&ops, 2, "session dir mkdir", |dry, run, _mode| {
        assert_eq!(run.runtime.state().normalized(), dry.states[2]);
        assert_eq!(run.runtime.tree().nodes().len(), 2);
    });
}

#[test]
fn crash_after_provider_reply_before_logging_response_loses_only_that_turn() {
    let mut ops = base();
    ops.push(Op::Turn(0, "first question"));
    ops.push(Op::Turn(0, "second question"));
    at_label(
        &ops,
        3,
        "events.pending create turn.complete",
        |dry, run, _mode| {
            let got = run.runtime.state().normalized();
            assert_eq!(got, dry.states[3]);
            let conv = &got.conversations[&run.agents[0]];
            assert!(!conv.contains(&ConversationItem::Prompt {
                text: "second question".into()
            }));
        },
    );
}

#[test]
fn crash_after_logging_response_before_delivering_reply_keeps_the_turn_without_the_reply() {
    let mut ops = base();
    ops.push(Op::Turn(1, "work on it"));
    ops.push(Op::Send(1, 0, "the reply"));
    at_label(
        &ops,
        3,
        "events.pending create message.enqueued",
        |dry, run, _mode| {
            let got = run.runtime.state().normalized();
            assert_eq!(got, dry.states[3]);
            let worker = &run.agents[1];
            assert!(matches!(
                got.conversations[worker].last(),
                Some(ConversationItem::Response { .. })
            ));
            assert!(got.pending[&run.agents[0]].is_empty());
        },
    );
}

#[test]
fn crash_after_enqueue_before_logging_delivery_reinjects_the_message() {
    let mut ops = base();
    ops.push(Op::Send(1, 0, "hello parent"));
    ops.push(Op::Deliver(0));
    at_label(
        &ops,
        3,
        "events.pending create message.delivered",
        |dry, run, _mode| {
            let got = run.runtime.state().normalized();
            assert_eq!(got, dry.states[3]);
            let root = &run.agents[0];
            assert_eq!(got.pending[root].len(), 1);
            assert_eq!(got.pending[root][0].payload, "hello parent");
            assert_eq!(
                run.report.messages_reinjected[root],
                vec![got.pending[root][0].id.clone()]
            );
        },
    );
}

#[test]
fn crash_after_agent_terminated_before_tree_removal_keeps_it_terminated() {
    let mut ops = base();
    ops.push(Op::Terminate(1));
    just_after(
        &ops,
        2,
        "events.jsonl fsync agent.terminated",
        |dry, run, _mode| {
            assert_eq!(run.runtime.state().normalized(), dry.states[3]);
            assert_eq!(run.report.terminated_records_fixed.len(), 1);
            assert_eq!(run.runtime.tree().nodes().len(), 1);
        },
    );
}
