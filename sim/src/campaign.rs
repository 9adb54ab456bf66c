//! One fuzz campaign in one process: rounds of the proptest search, each
//! followed by crash-point sweeps (the tour in round 1, then the profile's
//! generated sequences), until the time budget is spent or something
//! fails. Several campaigns run side by side as worker processes
//! ([`crate::jobs`]): SQLite's PRNG is process-global, so threads would
//! share it and lose determinism.
//!
//! Invariant: a campaign is a pure function of (profile, campaign seed,
//! canaries) and of how many rounds its budget allows. Round 1 searches
//! with the campaign seed itself and sweeps with it (so the `ci` profile's
//! single campaign is exactly the PR gate's derandomized run); every later
//! round's seeds are derived from it ([`round_seeds`]), never drawn at
//! random, so `fuzz --seed S` replays a whole campaign round by round.
//! Wall-clock time only decides when to stop, between rounds.
//!
//! A round's search and its sweeps share nothing but the round's seeds
//! (the sweeps' sequences are generated from the sweep seed, not from
//! what the search found), so a one-round campaign may run them in two
//! processes ([`Stages`]) and judge exactly what one process would.

use std::time::{Duration, Instant};

use durable_agent::canary::Canaries;
use serde::{Deserialize, Serialize};

use crate::exec::Case;
use crate::profile::Profile;
use crate::search::search_with_progress;
use crate::sweep::{generated, sweep, SweepOptions};
use crate::tour::tour;

/// What a campaign runs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub profile: Profile,
    /// The campaign seed (see the module doc).
    pub seed: u64,
    pub canaries: Canaries,
    /// Keep going round after round until this much time has passed
    /// (checked between rounds); `None`: one round.
    pub budget: Option<Duration>,
    /// Which stages of each round run here.
    pub stages: Stages,
}

/// The stages of a round a campaign runs: both (a campaign), or one of
/// them when a one-round campaign is split over two processes (the `ci`
/// profile on a machine with two cores: `fuzz` without `--jobs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stages {
    #[default]
    Both,
    /// The search only (with its persisted regressions).
    Search,
    /// The sweeps only (the tour in round 1, then the generated ones).
    Sweeps,
}

/// Counts of a campaign (or of several, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub rounds: u32,
    /// Search cases run, shrink replays included.
    pub cases: u64,
    /// Crash/restart recoveries the oracle judged in the search.
    pub restarts: u64,
    /// I/O points the search's runs performed.
    pub points: u64,
    pub search_secs: f64,
    /// Op sequences crash-swept.
    pub sequences: u64,
    /// I/O points of the swept sequences (each judged under every mode).
    pub sweep_points: u64,
    /// Crash points judged by the sweeps (points × modes).
    pub judged: u64,
    /// Of those, the ones whose verdict the cache reused, and the reuses
    /// re-judged as a check ([`crate::verdicts`]).
    #[serde(default)]
    pub reused: u64,
    #[serde(default)]
    pub rechecked: u64,
    pub sweep_secs: f64,
    /// The operator's `verify` before each boot (search and sweeps): the
    /// reports an equal disk's memoized one answered, and those computed
    /// ([`crate::driver::verified`]).
    #[serde(default)]
    pub verify_hits: u64,
    #[serde(default)]
    pub verify_misses: u64,
}

impl Totals {
    pub fn add(&mut self, o: &Totals) {
        self.rounds += o.rounds;
        self.cases += o.cases;
        self.restarts += o.restarts;
        self.points += o.points;
        self.search_secs += o.search_secs;
        self.sequences += o.sequences;
        self.sweep_points += o.sweep_points;
        self.judged += o.judged;
        self.reused += o.reused;
        self.rechecked += o.rechecked;
        self.sweep_secs += o.sweep_secs;
        self.verify_hits += o.verify_hits;
        self.verify_misses += o.verify_misses;
    }
}

/// Where a campaign is (reported while it runs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub round: u32,
    pub cases: u64,
    pub sequences: u64,
    pub judged: u64,
}

/// A failure a campaign found: what a human (or CI) needs to replay it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// The seed of the campaign that found it.
    pub campaign_seed: u64,
    pub round: u32,
    /// `search` or `sweep`.
    pub stage: String,
    pub what: String,
    /// The failing case's own run seed.
    pub case_seed: u64,
    /// The command that replays the saved case.
    pub repro: String,
    /// The full report (ops, crash site, trace, diff, repro command).
    pub report: String,
}

/// What a campaign ended with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub totals: Totals,
    pub found: Option<Found>,
}

/// Round `round`'s (search seed, sweep seed) of the campaign `seed`.
/// Round 1 uses the campaign seed for both (the `ci` gate's run); the
/// sweep seeds then step by one as they always have, the search seeds are
/// mixed (SplitMix64) so no two rounds search alike.
pub fn round_seeds(seed: u64, round: u32) -> (u64, u64) {
    let sweep = seed.wrapping_add(u64::from(round.saturating_sub(1)));
    let search = if round <= 1 {
        seed
    } else {
        splitmix64(seed ^ u64::from(round))
    };
    (search, sweep)
}

/// Worker `index`'s campaign seed under the whole run's seed: worker 0
/// keeps it (so `--jobs 1` is the single-process campaign), the others are
/// mixed apart.
pub fn worker_seed(seed: u64, index: u32) -> u64 {
    if index == 0 {
        seed
    } else {
        splitmix64(seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

/// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective
/// mixer, written out because it is five lines and no crate exports just it.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Run the campaign, calling `progress` as it goes.
pub fn run(plan: &Plan, progress: &(dyn Fn(Progress) + Sync)) -> Outcome {
    let started = Instant::now();
    let mut t = Totals::default();
    let persist = plan.canaries == Canaries::none();
    let memo = crate::driver::verified::stats();
    let stamp = |t: &mut Totals| {
        let (hits, misses) = crate::driver::verified::stats();
        t.verify_hits = hits - memo.0;
        t.verify_misses = misses - memo.1;
    };
    loop {
        t.rounds += 1;
        let round = t.rounds;
        let (search_seed, sweep_seed) = round_seeds(plan.seed, round);
        let mut p = plan.profile.clone();
        p.seed = Some(search_seed);
        let searched = Instant::now();
        let base = t;
        let out = if plan.stages == Stages::Sweeps {
            crate::search::SearchOutcome::default()
        } else {
            search_with_progress(&p, &plan.canaries, persist, &|n| {
                progress(Progress {
                    round,
                    cases: base.cases + n,
                    sequences: base.sequences,
                    judged: base.judged,
                })
            })
        };
        t.search_secs += searched.elapsed().as_secs_f64();
        t.cases += out.runs;
        t.points += out.points;
        t.restarts += out.restarts;
        if let Some(f) = out.failure {
            let first = out.first_failure_at.unwrap_or(out.runs);
            let report = format!(
                "{}found at case {first} of round {round} ({} runs with shrinking) in {:.1?}\n",
                f.report(),
                out.runs,
                started.elapsed()
            );
            stamp(&mut t);
            return Outcome {
                totals: t,
                found: Some(found(plan, round, "search", &f, report)),
            };
        }
        let swept = Instant::now();
        let failure = match plan.stages {
            Stages::Search => None,
            Stages::Both | Stages::Sweeps => sweep_round(plan, round, sweep_seed, &mut t, progress),
        };
        t.sweep_secs += swept.elapsed().as_secs_f64();
        if let Some(f) = failure {
            let report = f.report();
            stamp(&mut t);
            return Outcome {
                totals: t,
                found: Some(found(plan, round, "sweep", &f, report)),
            };
        }
        if plan.budget.is_none_or(|b| started.elapsed() >= b) {
            stamp(&mut t);
            return Outcome {
                totals: t,
                found: None,
            };
        }
    }
}

fn found(plan: &Plan, round: u32, stage: &str, f: &crate::report::Failure, report: String) -> Found {
    Found {
        campaign_seed: plan.seed,
        round,
        stage: stage.to_string(),
        what: f.what.clone(),
        case_seed: f.case.seed,
        repro: f.repro_command(),
        report,
    }
}

/// One round's sweeps: the tour (round 1 only: it is deterministic), then
/// `profile.sweeps` generated sequences from `seed`, every point and mode,
/// stopping at the first failure.
fn sweep_round(
    plan: &Plan,
    round: u32,
    seed: u64,
    t: &mut Totals,
    progress: &(dyn Fn(Progress) + Sync),
) -> Option<Box<crate::report::Failure>> {
    let p = &plan.profile;
    let mut sequences = Vec::new();
    if round == 1 {
        sequences.push(Case {
            seed: 7,
            ops: tour(),
            canaries: plan.canaries.clone(),
            crash_at: None,
        });
    }
    for mut case in generated(seed, p.sweeps as usize, p.max_steps) {
        case.canaries = plan.canaries.clone();
        sequences.push(case);
    }
    let options = SweepOptions {
        stop_at_first: true,
        rot_every: p.rot_every,
        recheck_every: p.recheck_every,
        ..SweepOptions::default()
    };
    for case in &sequences {
        let s = sweep(case.seed, &case.ops, &case.canaries, &options);
        t.sequences += 1;
        t.sweep_points += s.points;
        t.judged += s.runs;
        t.reused += s.reused;
        t.rechecked += s.rechecked;
        progress(Progress {
            round,
            cases: t.cases,
            sequences: t.sequences,
            judged: t.judged,
        });
        if let Some(f) = s.failures.into_iter().next() {
            return Some(f);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_one_and_worker_zero_keep_the_campaign_seed() {
        assert_eq!(round_seeds(42, 1), (42, 42));
        assert_eq!(worker_seed(42, 0), 42);
    }

    #[test]
    fn rounds_and_workers_get_distinct_seeds() {
        let mut seen = std::collections::BTreeSet::new();
        for w in 0..8 {
            for r in 1..50 {
                assert!(
                    seen.insert(round_seeds(worker_seed(7, w), r).0),
                    "worker {w} round {r}"
                );
            }
        }
    }
}
