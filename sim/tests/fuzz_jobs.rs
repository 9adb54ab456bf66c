//! `fuzz --jobs N --seed S --json FILE`: worker processes with distinct
//! seeds derived from the campaign seed, one summary, a failure found by a
//! worker saved and reported with its repro command (and the other workers
//! stopped), and the replay command in the summary.

use std::process::Command;

use durable_agent_sim::campaign::worker_seed;
use durable_agent_sim::fuzz::Summary;

const BIN: &str = env!("CARGO_BIN_EXE_durable-agent-sim");

#[test]
fn two_workers_find_a_canary_and_report_it_with_its_repro_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("summary.json");
    let out = Command::new(BIN)
        .args([
            "fuzz",
            "--profile",
            "default",
            "--cases",
            "64",
            "--jobs",
            "2",
            "--seed",
            "0x3",
        ])
        .args(["--canary", "no_dir_fsync", "--json"])
        .arg(&json)
        .output()
        .expect("run the fuzz binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a failure exits 1:\n{stdout}");
    assert!(
        stdout.contains("REPRODUCE WITH:"),
        "the failure's report is printed:\n{stdout}"
    );

    let summary: Summary =
        serde_json::from_slice(&std::fs::read(&json).expect("summary written")).expect("the summary is JSON");
    assert_eq!(summary.jobs, 2);
    assert_eq!(summary.seed, 3);
    assert!(!summary.passed);
    let seeds: Vec<u64> = summary.workers.iter().map(|w| w.seed).collect();
    assert_eq!(
        seeds,
        vec![worker_seed(3, 0), worker_seed(3, 1)],
        "one worker per job, derived seeds"
    );
    assert_ne!(seeds[0], seeds[1]);
    assert!(!summary.failures.is_empty(), "NoDirFsync is caught");
    for f in &summary.failures {
        assert!(seeds.contains(&f.campaign_seed), "found by one of the workers");
        let case = f
            .repro
            .split("--case ")
            .nth(1)
            .unwrap_or_else(|| panic!("a repro command with a case file: {}", f.repro));
        assert!(
            std::path::Path::new(case.trim()).exists(),
            "the case is saved: {case}"
        );
    }
    // A worker that found nothing either finished or was stopped; none died.
    for w in &summary.workers {
        assert!(
            w.totals.is_some() || w.stopped,
            "worker {} ended without a summary: {}",
            w.index,
            w.status
        );
    }
    assert!(
        summary.replay.contains("--seed 0x3 --jobs 2") && summary.replay.contains("--canary no_dir_fsync"),
        "the replay command reruns the same campaigns: {}",
        summary.replay
    );
    assert!(summary.totals.cases > 0 && summary.cases_per_sec > 0.0);
}

/// `fuzz --profile ci` without `--jobs` on two cores runs the one round's
/// search and sweeps in two processes: it judges exactly what `--jobs 1`
/// judges in one (the same cases, recoveries, I/O points and crash points),
/// and its replay command is the one-process run.
#[test]
fn the_ci_profile_split_over_two_processes_judges_what_one_process_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |jobs: &[&str], name: &str| -> Summary {
        let json = dir.path().join(name);
        let out = Command::new(BIN)
            .args(["fuzz", "--profile", "ci", "--cases", "6"])
            .args(jobs)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run the fuzz binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "the clean runtime passes:\n{stdout}");
        serde_json::from_slice(&std::fs::read(&json).expect("summary written")).expect("the summary is JSON")
    };
    let split = run(&[], "split.json");
    let one = run(&["--jobs", "1"], "one.json");
    let two_cores = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    assert_eq!(split.split, two_cores, "split exactly when there are two cores");
    assert!(!one.split, "--jobs 1 runs in one process");
    if two_cores {
        assert_eq!(split.workers.len(), 2, "a search process and a sweeps process");
        assert!(
            split.workers.iter().all(|w| w.seed == one.seed),
            "both halves keep the campaign seed"
        );
    }
    let (a, b) = (&split.totals, &one.totals);
    assert_eq!(
        (
            a.cases,
            a.restarts,
            a.points,
            a.sequences,
            a.sweep_points,
            a.judged,
            a.reused
        ),
        (
            b.cases,
            b.restarts,
            b.points,
            b.sequences,
            b.sweep_points,
            b.judged,
            b.reused
        ),
        "the same judgements"
    );
    assert!(a.cases > 0 && a.judged > 0, "both stages ran");
    assert!(
        split.replay.contains("--jobs 1"),
        "the replay runs one process: {}",
        split.replay
    );
}
