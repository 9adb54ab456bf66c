//! The committed case corpus (`sim/cases/`): plain cases replay clean,
//! shrunk canary cases fail only with their canary, and the known runtime
//! bugs in `known-bugs/` can be checked with `--ignored` (a fixed one moves
//! up into the clean corpus).

use std::path::PathBuf;

use durable_agent_sim::{run_case, Case};

fn cases(dir: &str) -> Vec<(PathBuf, Case)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) == Some("json") {
            let case: Case = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            out.push((path, case));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn committed_cases_replay_clean() {
    // The clean corpus: hand-picked cases plus fixed former known bugs.
    for (path, case) in cases("cases") {
        if let Err(f) = run_case(&case) {
            panic!("{}: {}", path.display(), f.report());
        }
    }
}

#[test]
#[ignore = "known runtime bugs: run with --ignored to see whether they are fixed"]
fn known_runtime_bugs_are_fixed() {
    let mut still_failing = Vec::new();
    for (path, case) in cases("cases/known-bugs") {
        if let Err(f) = run_case(&case) {
            eprintln!("{}", f);
            still_failing.push(path);
        }
    }
    assert!(still_failing.is_empty(), "still failing: {still_failing:?}");
}

/// Each shrunk canary case still fails with its canary and passes on the
/// clean runtime: the oracle can fail, and fails for the bug, not the ops.
#[test]
fn canary_cases_fail_only_with_their_canary() {
    let all = cases("cases/canary");
    assert!(!all.is_empty());
    for (path, case) in all {
        assert!(
            run_case(&case).is_err(),
            "{} no longer fails with {:?}",
            path.display(),
            case.canaries
        );
        let clean = Case {
            canaries: Default::default(),
            ..case
        };
        if let Err(f) = run_case(&clean) {
            panic!("{} fails on the CLEAN runtime: {}", path.display(), f.report());
        }
    }
}

/// An injected EIO / ENOSPC / lost reply inside an op makes the system
/// reopen in place (no crash) and the oracle judge it, at every offset of a
/// turn with an irreversible tool and of a trigger emit.
#[test]
fn injected_io_errors_are_judged_like_crashes_at_every_offset() {
    use durable_agent_sim::op::{AgentRef, FaultKind, Op, ToolStep};
    let mut judged = 0;
    for kind in [FaultKind::Eio, FaultKind::Enospc, FaultKind::LostReply] {
        for offset in 0..40 {
            let ops = vec![
                Op::CreateRoot,
                Op::Fault { offset, kind },
                Op::RunTurn {
                    final_fails: 0,
                    agent: AgentRef(0),
                    tools: vec![ToolStep {
                        irreversible: true,
                        ok: true,
                        joins_round: false,
                        lost: Default::default(),
                        orch: Default::default(),
                        provider_fails: 0,
                        garbled: false,
                        denied: false,
                        confirm: false,
                    }],
                },
                Op::Fault { offset, kind },
                Op::EmitTrigger { key: 1, due_in: 0 },
                Op::RunTurn {
                    final_fails: 0,
                    agent: AgentRef(0),
                    tools: vec![],
                },
            ];
            let case = Case {
                seed: 3,
                ops,
                canaries: Default::default(),
                crash_at: None,
            };
            // The same ops without the fault: the restarts every run has
            // (the judged boot after the install) are not the fault's.
            let baseline = Case {
                ops: case
                    .ops
                    .iter()
                    .filter(|op| !matches!(op, Op::Fault { .. }))
                    .cloned()
                    .collect(),
                ..case.clone()
            };
            match (run_case(&case), run_case(&baseline)) {
                (Ok(stats), Ok(base)) => judged += stats.restarts - base.restarts,
                (Err(f), _) | (_, Err(f)) => panic!("{}", f.report()),
            }
        }
    }
    assert!(
        judged > 60,
        "faults should force many in-place reopens, got {judged}"
    );
}

/// An I/O fault armed into a recovery lands in the boot, or past it: at
/// every offset the boot either fails and is booted again without it, or
/// succeeds and is judged — the harness's own post-boot reads (the INTENT
/// check) never trip the fault meant for the system (random campaigns
/// found "cannot read the INTENT rows after the boot: disk I/O error").
#[test]
fn an_io_fault_armed_into_a_recovery_never_fails_the_harness_own_reads() {
    use durable_agent_sim::op::{AgentRef, FaultKind, Op, ToolStep};
    for kind in [FaultKind::Eio, FaultKind::Enospc, FaultKind::LostReply] {
        for offset in 0..300u16 {
            let ops = vec![
                Op::CreateRoot,
                Op::RunTurn {
                    final_fails: 0,
                    agent: AgentRef(0),
                    tools: vec![ToolStep {
                        irreversible: true,
                        ok: true,
                        joins_round: false,
                        lost: Default::default(),
                        orch: Default::default(),
                        provider_fails: 0,
                        garbled: false,
                        denied: false,
                        confirm: false,
                    }],
                },
                Op::Fault { offset, kind },
                Op::Recover,
                Op::RunTurn {
                    final_fails: 0,
                    agent: AgentRef(0),
                    tools: vec![],
                },
            ];
            let case = Case {
                seed: 5,
                ops,
                canaries: Default::default(),
                crash_at: None,
            };
            if let Err(f) = run_case(&case) {
                panic!("offset {offset} {kind:?}: {}", f.report());
            }
        }
    }
}
