//! The daemon users run (the worker core `serve` drives) under madsim:
//! simulated API clients, latency and time, stopped and crashed at seeded
//! simulated instants, and checked by the daemon oracle. Run with `cargo sim` (the alias adds
//! `--cfg madsim`); one seed: `MADSIM_TEST_SEED=<seed> cargo sim`.
//!
//! Without `--cfg madsim` only the guard below builds: it fails when the
//! alias ran (it sets `DA_SIM_ALIAS`) but the cfg was lost — an exported
//! `RUSTFLAGS` overrides the alias's `build.rustflags` — so the gate can
//! never pass by running nothing.

#[cfg(not(madsim))]
#[test]
fn cargo_sim_builds_with_cfg_madsim() {
    assert!(
        std::env::var("DA_SIM_ALIAS").is_err(),
        "`cargo sim` ran without --cfg madsim: RUSTFLAGS is set and overrides the alias's \
         build.rustflags; unset it or add `--cfg madsim` to it"
    );
}

#[cfg(madsim)]
mod sim {
    use durable_agent::canary::{Canaries, Canary};
    use durable_agent_sim::madsim_sim::coverage::REQUIRED;
    use durable_agent_sim::madsim_sim::{run_sim, Coverage, SimOutcome, SimPlan, TurnPhase};

    /// The seeds to run: `MADSIM_TEST_SEED=<seed>` alone, or a nightly range
    /// `MADSIM_TEST_SEEDS=<start>..<end>` (end exclusive), else `fixed`.
    fn seeds(fixed: std::ops::RangeInclusive<u64>) -> Vec<u64> {
        let var = |name| std::env::var(name).ok();
        if let Some(seed) = var("MADSIM_TEST_SEED").and_then(|s| s.parse().ok()) {
            return vec![seed];
        }
        let range = var("MADSIM_TEST_SEEDS").and_then(|r| {
            let (a, b) = r.split_once("..")?;
            Some(a.parse::<u64>().ok()?..b.parse::<u64>().ok()?)
        });
        match range {
            Some(r) => r.collect(),
            None => fixed.collect(),
        }
    }

    /// Whether the fixed seed list runs (coverage assertions apply to it).
    fn fixed_seeds() -> bool {
        std::env::var("MADSIM_TEST_SEED").is_err() && std::env::var("MADSIM_TEST_SEEDS").is_err()
    }

    /// `DA_SIM_TRACE=<text>`: print the trace's events whose text holds it.
    fn assert_clean(out: &SimOutcome) {
        if let Ok(needle) = std::env::var("DA_SIM_TRACE") {
            for (at, e) in &out.events {
                let text = format!("{e:?}");
                if text.contains(&needle) {
                    eprintln!("{at:>8} {text}");
                }
            }
        }
        assert!(out.violations.is_empty(), "{}", out.report());
    }

    /// Three workers, three clients, 15 simulated minutes, three crashes
    /// and a stop.
    fn busy_plan(seed: u64) -> SimPlan {
        SimPlan::new(seed, 3, 15 * 60_000, 3)
    }

    #[test]
    fn daemon_keeps_every_guarantee_across_seeded_crashes_and_stops() {
        let mut covered = Coverage::default();
        for seed in seeds(1..=12) {
            let out = run_sim(&busy_plan(seed));
            assert_clean(&out);
            assert!(!out.crashes.is_empty(), "seed {seed}: no crash happened");
            let c = out.coverage();
            eprintln!(
                "seed {seed}: {} events, {} io points, crashes {:?}\n  not covered by this seed alone: {:?}",
                out.events.len(),
                out.io_points,
                out.crashes
                    .iter()
                    .map(|c| (
                        c.killed_ms,
                        c.mode,
                        c.point.clone(),
                        c.aimed.as_ref().map(|a| a.phase)
                    ))
                    .collect::<Vec<_>>(),
                c.missing(REQUIRED)
            );
            covered.merge(&c);
        }
        eprintln!("covered over the seeds: {:?}", covered.0);
        if fixed_seeds() {
            // Every API operation (each branch that matters: confirmations
            // delivered, not delivered and abandoned, retries of DEAD and
            // FAILED triggers, duplicate emits, turns already done), every
            // crash mode, deaths inside an I/O call and inside a trigger's
            // turn, stops, and the daemon's own paths, at least once.
            let missing = covered.missing(REQUIRED);
            assert!(
                missing.is_empty(),
                "never covered over seeds 1..=12: {missing:?}\ncovered: {:?}",
                covered.0
            );
        }
    }

    /// A one-time trigger whose turn is in flight when the node is killed —
    /// right after it started, while one of its calls is out, while a
    /// call's result is being persisted (its effect happened, its record
    /// partly durable), or while the result that completes it is (inside
    /// `turn.complete` or the ack) — runs its work exactly once after the
    /// restart and settles (the oracle's D2, D3 and D4 for aimed crashes).
    #[test]
    fn one_time_trigger_killed_mid_turn_runs_its_work_once_and_settles() {
        let mut phases = std::collections::BTreeMap::new();
        let mut done_once = 0;
        for seed in seeds(40..=45) {
            // As many crashes as phases: each seed's aimed crashes take
            // every phase in turn.
            let out = run_sim(&SimPlan::new(seed, 3, 8 * 60_000, 4).aimed_at_triggers());
            assert_clean(&out);
            for aimed in out.crashes.iter().filter_map(|c| c.aimed.as_ref()) {
                *phases.entry(aimed.phase).or_insert(0) += 1;
                let key = aimed.work.trim_start_matches("trigger:");
                let completions = out
                    .view
                    .completions
                    .get(&(aimed.agent.clone(), aimed.work.clone()))
                    .copied()
                    .unwrap_or(0);
                let status = out.view.triggers.get(key).map(|t| t.status.clone());
                eprintln!("seed {seed}: {aimed:?} -> {status:?}, completed {completions} times");
                if status.as_deref() == Some("DONE") && completions == 1 {
                    done_once += 1;
                }
            }
        }
        eprintln!("aimed crashes by phase {phases:?}; {done_once} of their triggers DONE with the work once");
        if fixed_seeds() {
            for phase in TurnPhase::ALL {
                assert!(
                    phases.contains_key(&phase),
                    "no crash in phase {phase:?}: {phases:?}"
                );
            }
            assert!(
                done_once > 0,
                "no aimed trigger settled DONE after its crash: exactly-once was never exercised"
            );
        }
    }

    /// Trigger leases shorter than one provider call: every trigger's turn
    /// outlives its lease. Its holder must still own the trigger (no second
    /// claim, no second turn of the work, no duplicate effect) and ack it.
    #[test]
    fn lease_shorter_than_a_turn_gives_no_second_holder() {
        let mut outlived = 0;
        for seed in seeds(70..=72) {
            let out = run_sim(&SimPlan::new(seed, 3, 8 * 60_000, 2).with_short_leases());
            assert_clean(&out);
            let n = out.coverage().count("trigger acked after its lease expired");
            eprintln!("seed {seed}: {n} triggers acked after their lease expired");
            outlived += n;
        }
        assert!(
            outlived > 0,
            "no trigger's turn outlived its lease: the plan tests nothing"
        );
    }

    #[test]
    fn same_seed_gives_the_same_trace_hash_and_another_seed_does_not() {
        let seed = seeds(7..=7)[0];
        let short = |s| SimPlan::new(s, 2, 6 * 60_000, 2);
        let a = run_sim(&short(seed));
        let b = run_sim(&short(seed));
        assert_eq!(
            a.hash,
            b.hash,
            "nondeterminism: seed {seed} gave two traces; reproduce: {}",
            a.repro()
        );
        assert_eq!(a.events, b.events, "reproduce: {}", a.repro());
        assert_eq!(a.crashes, b.crashes, "reproduce: {}", a.repro());
        eprintln!("seed {seed}: trace hash {:016x}", a.hash);
        let c = run_sim(&short(seed + 1));
        assert_ne!(
            a.hash,
            c.hash,
            "seeds {seed} and {} gave the same trace",
            seed + 1
        );
    }

    /// The harness proves itself: a re-introduced bug must make the oracle fail
    /// on at least one seed, for the right reason (a violation holding one
    /// of `needles`), and name the seed to reproduce it.
    fn caught(canary: Canary, plans: impl Iterator<Item = SimPlan>, needles: &[&str]) -> u64 {
        let mut tried = Vec::new();
        for mut plan in plans {
            plan.canaries = Canaries::only(canary);
            tried.push(plan.seed);
            let out = run_sim(&plan);
            let hit = out
                .violations
                .iter()
                .find(|v| needles.iter().any(|n| v.contains(n)));
            if let Some(hit) = hit {
                eprintln!("{canary:?} caught for the right reason: {hit}\n{}", out.report());
                return plan.seed;
            }
        }
        panic!(
            "canary {canary:?} was not caught by the daemon oracle (no violation holding {needles:?}) \
             on seeds {tried:?}; reproduce one: {}",
            durable_agent_sim::madsim_sim::repro_command(tried.first().copied().unwrap_or_default())
        );
    }

    #[test]
    fn canary_ack_before_log_loses_acked_entries_and_is_caught() {
        let plans = seeds(300..=309).into_iter().map(|seed| {
            let mut plan = SimPlan::new(seed, 3, 8 * 60_000, 3);
            plan.crash_window_ms = (60_000, 4 * 60_000);
            plan.mid_io_probability = 0.0;
            plan
        });
        // Unsynced appends torn by power loss: the log no longer recovers
        // (boot refuses it) or acknowledged entries are gone.
        caught(
            Canary::AckBeforeLog,
            plans,
            &["is lost", "is corrupt", "is gone", "not durable", "boot"],
        );
    }

    /// A core canary: the worker acks a trigger DONE as its turn starts. A
    /// crash (or the horizon) mid-turn leaves DONE with the work unfinished.
    #[test]
    fn canary_trigger_acked_before_its_turn_is_caught() {
        let plans = seeds(500..=519)
            .into_iter()
            .map(|seed| SimPlan::new(seed, 3, 6 * 60_000, 2));
        let seed = caught(
            Canary::TriggerAckedBeforeTurn,
            plans,
            &["acked before its effects"],
        );
        eprintln!("TriggerAckedBeforeTurn caught with seed {seed}");
    }

    /// A core canary: a schedule bucket's trigger without its dedup key. A
    /// restart inside the bucket emits it again: the bucket fires twice.
    #[test]
    fn canary_schedule_bucket_refired_after_a_restart_is_caught() {
        let plans = seeds(600..=619)
            .into_iter()
            .map(|seed| SimPlan::new(seed, 3, 6 * 60_000, 2));
        let seed = caught(Canary::ScheduleBucketWithoutKey, plans, &["(fires twice)"]);
        eprintln!("ScheduleBucketWithoutKey caught with seed {seed}");
    }

    /// A core canary: messages a turn reads are logged delivered when
    /// collected, before the turn. A crash that cuts that turn (a client
    /// that never asks it again) loses them: delivered, read by no turn.
    #[test]
    fn canary_message_delivered_at_collect_is_caught() {
        let plans = seeds(800..=819).into_iter().map(|seed| {
            let mut plan = SimPlan::new(seed, 3, 8 * 60_000, 3);
            plan.wake = false;
            plan
        });
        let seed = caught(Canary::DeliveredAtCollect, plans, &["no completed turn of"]);
        eprintln!("DeliveredAtCollect caught with seed {seed}");
    }

    /// A core canary: `emit` forgets the dedup key. A producer's second
    /// emit of a key (a retry after a lost answer, an at-least-once
    /// duplicate) inserts a second trigger: the key runs twice.
    #[test]
    fn canary_trigger_without_dedup_is_caught() {
        let plans = seeds(900..=919)
            .into_iter()
            .map(|seed| SimPlan::new(seed, 3, 6 * 60_000, 2));
        let seed = caught(
            Canary::TriggerWithoutDedup,
            plans,
            &["its dedup key did not hold"],
        );
        eprintln!("TriggerWithoutDedup caught with seed {seed}");
    }

    /// A core canary: a re-claimed trigger runs its turn again although it
    /// completed before the crash. Caught by the aimed crashes' check: the
    /// trigger killed mid-turn completed its work twice.
    #[test]
    fn canary_trigger_turn_rerun_after_a_crash_mid_turn_is_caught() {
        let plans = seeds(40..=59).into_iter().map(|seed| {
            let mut plan = SimPlan::new(seed, 3, 6 * 60_000, 3).aimed_at_triggers();
            plan.aimed_phases = vec![TurnPhase::Completing];
            plan
        });
        let seed = caught(Canary::TriggerTurnRerun, plans, &["in flight at the crash"]);
        eprintln!("TriggerTurnRerun caught with seed {seed}");
    }
}
