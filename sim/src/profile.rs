//! Search profiles, chosen by `DA_PROFILE` (the port of seed 002's
//! Hypothesis profiles):
//!
//! - `ci`: the PR gate. Fixed proptest seed (derandomized: the same cases
//!   every run, so a failure means the change broke something), a case count
//!   that finishes in a few minutes on 2 cores in a debug build.
//! - `nightly`: random seeds, many cases (`DA_CASES` overrides), longer
//!   sequences; shards by running several processes.
//! - `default` (anything else): local runs, random seeds, moderate counts.
//!
//! Each also says how many generated sequences the `fuzz` command
//! crash-sweeps per round ([`Profile::sweeps`]).
//!
//! Invariant: a profile is plain data; [`Profile::config`] is the only place
//! that turns it into a proptest `Config`, so every entry point (tests,
//! benches, `repro`) searches the same way.

use std::any::Any;

use proptest::test_runner::{Config, FailurePersistence, FileFailurePersistence, PersistedSeed, RngSeed};

/// Failures of the clean runtime are persisted here (committed) and replayed
/// before any new case.
pub const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/runtime.txt");

/// The `ci` profile's fixed proptest seed.
pub const CI_SEED: u64 = 0x0DA5_EED0_0000_00C1;

/// How a search runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    /// New cases to run (persisted failures are replayed in addition).
    pub cases: u32,
    /// Ops per case: 1..=max_steps.
    pub max_steps: usize,
    /// `Some`: derandomized with this seed.
    pub seed: Option<u64>,
    /// Bound on shrink iterations (a shrink step replays a whole case).
    pub max_shrink_iters: u32,
    /// Generated sequences (of `max_steps` ops) the `fuzz` command
    /// crash-sweeps, every point and mode, after each search round, besides
    /// the tour. Forked sweeps judge crash points ~5x faster than the
    /// search, so this is the cheap way to more crash states.
    pub sweeps: u32,
    /// The sweeps judge `PowerRot` at every `rot_every`-th point
    /// ([`crate::SweepOptions::rot_every`]).
    pub rot_every: u64,
    /// The sweeps' verdict cache re-judges every `recheck_every`-th reuse
    /// ([`crate::verdicts`]; 0: no cache, every fork recovered).
    pub recheck_every: u64,
}

impl Profile {
    pub fn ci() -> Profile {
        Profile {
            name: "ci",
            cases: 512,
            max_steps: 30,
            seed: Some(CI_SEED),
            max_shrink_iters: 400,
            sweeps: 2,
            // The PR gate's time budget (`fuzz --profile ci` under 10 s):
            // bit rot at one sweep point in sixteen; the search's crashes
            // are `PowerRot` one time in four anyway.
            rot_every: 16,
            // And one reuse in 64 judged afresh (the other profiles: 16):
            // ~130 re-judged verdicts a run, where 16 re-judged ~500, a
            // tenth of the gate's boots; a campaign checks the cache at 16.
            recheck_every: 64,
        }
    }

    pub fn nightly() -> Profile {
        Profile {
            name: "nightly",
            cases: 20_000,
            max_steps: 50,
            seed: None,
            max_shrink_iters: 4_000,
            sweeps: 8,
            rot_every: 1,
            recheck_every: crate::verdicts::DEFAULT_RECHECK_EVERY,
        }
    }

    pub fn local() -> Profile {
        Profile {
            name: "default",
            cases: 512,
            max_steps: 30,
            seed: None,
            max_shrink_iters: 1_000,
            sweeps: 4,
            rot_every: 1,
            recheck_every: crate::verdicts::DEFAULT_RECHECK_EVERY,
        }
    }

    /// The profile `--profile` names (`ci`, `nightly`, `default` or
    /// `local`); `None`: [`Profile::from_env`].
    pub fn named(name: Option<&str>) -> Result<Profile, String> {
        match name {
            None => Ok(Profile::from_env()),
            Some("ci") => Ok(Profile::ci()),
            Some("nightly") => Ok(Profile::nightly()),
            Some("default") | Some("local") => Ok(Profile::local()),
            Some(other) => Err(format!("unknown profile {other:?}: use ci, nightly or default")),
        }
    }

    /// The profile `DA_PROFILE` names (`ci`, `nightly`, else default), with
    /// `DA_CASES` overriding the case count.
    pub fn from_env() -> Profile {
        let mut p = match std::env::var("DA_PROFILE").as_deref() {
            Ok("ci") => Profile::ci(),
            Ok("nightly") => Profile::nightly(),
            _ => Profile::local(),
        };
        if let Some(n) = std::env::var("DA_CASES").ok().and_then(|s| s.parse().ok()) {
            p.cases = n;
        }
        p
    }

    /// How many generated ops the reference machine's preconditions may
    /// refuse before the search gives up. proptest counts these across the
    /// whole run, not per case (`TestRunner::reject_local`), so a fixed
    /// bound caps the run's length: at 100,000 a `nightly` round (20,000
    /// cases of up to 50 ops, ~6 refusals a case) aborted at its 16,573rd
    /// case with "Too many local rejects" (seed 0x5d94145de1107a9c). The
    /// bound scales with the ops the round may draw; it still stops a
    /// generator that can draw nothing acceptable.
    pub fn max_local_rejects(&self) -> u32 {
        let draws = u64::from(self.cases) * (self.max_steps as u64) * 8;
        u32::try_from(draws.max(100_000)).unwrap_or(u32::MAX)
    }

    /// The proptest config. `persist`: replay and record failures in
    /// [`REGRESSIONS`] (off for canary searches, whose failures are expected
    /// and must not be replayed first, or the case counts would lie).
    pub fn config(&self, persist: bool) -> Config {
        Config {
            cases: self.cases,
            max_shrink_iters: self.max_shrink_iters,
            // A case is a whole simulated run; never time it (seed 002's
            // `deadline=None`).
            timeout: 0,
            max_shrink_time: 0,
            rng_seed: match self.seed {
                Some(s) => RngSeed::Fixed(s),
                None => RngSeed::Random,
            },
            failure_persistence: match (persist, regressions_read_only()) {
                (false, _) => None,
                (true, false) => Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
                (true, true) => Some(Box::new(ReadOnly(FileFailurePersistence::Direct(REGRESSIONS)))),
            },
            max_global_rejects: 100_000,
            max_local_rejects: self.max_local_rejects(),
            ..Config::default()
        }
    }
}

/// `DA_REGRESSIONS=read-only`: replay the committed failures but record no
/// new one. Mutation testing (`.ci/mutants`) sets it: it runs the search
/// once per mutant in place, and a failure one mutant recorded would replay
/// first for every later mutant, so a mutant could be killed by a seed that
/// is in no commit and the report would not be the committed fuzzer's.
fn regressions_read_only() -> bool {
    std::env::var("DA_REGRESSIONS").is_ok_and(|v| v == "read-only")
}

/// A failure persistence that loads like the one it wraps and never saves.
#[derive(Debug, Clone, PartialEq)]
struct ReadOnly(FileFailurePersistence);

impl FailurePersistence for ReadOnly {
    fn load_persisted_failures2(&self, source_file: Option<&'static str>) -> Vec<PersistedSeed> {
        self.0.load_persisted_failures2(source_file)
    }

    fn save_persisted_failure2(
        &mut self,
        _source_file: Option<&'static str>,
        _seed: PersistedSeed,
        _shrunken_value: &dyn std::fmt::Debug,
    ) {
    }

    fn box_clone(&self) -> Box<dyn FailurePersistence> {
        Box::new(self.clone())
    }

    fn eq(&self, other: &dyn FailurePersistence) -> bool {
        other.as_any().downcast_ref::<ReadOnly>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use proptest::test_runner::{FailurePersistence, FileFailurePersistence};

    use super::{Profile, ReadOnly};

    /// proptest counts refused draws over the whole run, so each profile's
    /// bound must allow several refusals for every op its round may draw
    /// (a `nightly` round aborted at case 16,573 under a fixed 100,000).
    #[test]
    fn the_reject_bound_grows_with_the_ops_a_round_draws() {
        for p in [Profile::ci(), Profile::nightly(), Profile::local()] {
            let draws = u64::from(p.cases) * p.max_steps as u64;
            let bound = u64::from(p.config(false).max_local_rejects);
            assert!(
                bound >= 4 * draws,
                "{}: {bound} refusals allowed for {draws} ops",
                p.name
            );
        }
    }

    fn regressions_file(dir: &std::path::Path, name: &str, seed_hex: &str) -> &'static str {
        let path = dir.join(name);
        std::fs::write(&path, format!("cc {seed_hex} # a failure\n")).unwrap();
        Box::leak(path.to_string_lossy().into_owned().into_boxed_str())
    }

    /// The read-only persistence replays what the file holds, and a failure
    /// saved through it leaves the file byte for byte as it was (the same
    /// save through the writable one adds a line).
    #[test]
    fn read_only_regressions_load_and_never_save() {
        let dir = std::env::temp_dir().join(format!("da-readonly-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kept = regressions_file(&dir, "kept.txt", &"0d".repeat(32));
        let other = regressions_file(&dir, "other.txt", &"7e".repeat(32));
        let new_seed = FileFailurePersistence::Direct(other).load_persisted_failures2(None);
        assert_eq!(new_seed.len(), 1);
        let before = std::fs::read(kept).unwrap();

        let mut read_only = ReadOnly(FileFailurePersistence::Direct(kept));
        assert_eq!(read_only.load_persisted_failures2(None).len(), 1);
        read_only.save_persisted_failure2(None, new_seed[0].clone(), &"shrunk");
        assert_eq!(std::fs::read(kept).unwrap(), before);

        let mut writable = FileFailurePersistence::Direct(kept);
        writable.save_persisted_failure2(None, new_seed[0].clone(), &"shrunk");
        assert_eq!(writable.load_persisted_failures2(None).len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
