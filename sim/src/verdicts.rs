//! The fast sweep's verdict cache: each distinct crash state is judged
//! once.
//!
//! Invariant: the verdict of a fork (the oracle's side and the model the
//! run would go on from) is a function of what its recovery can observe —
//! its phase ([`Judging`]: the models before and after the op in flight,
//! the names and the op history), the rebooted disk's content, and the
//! deliveries, model asks and lost lookup attempts the world saw before
//! the point ([`Observed`]). Two forks of one phase with equal keys therefore
//! get the same verdict, and the second reuses the first's. Many do: a
//! read, a `len`, an `exists`, or a write whose page a power loss drops
//! leaves the rebooted disk as the point before it left it.
//!
//! What the key leaves out, and why that is sound:
//! - the crash mode: it makes the rebooted disk (which is in the key) and
//!   nothing else — the oracle's candidates and relaxations do not depend
//!   on it, and a fork is never crashed again; so a kill -9 and a power
//!   loss that leave the same disk share a verdict;
//! - the point number: it reaches a recovery only through SimFs's short
//!   reads (a pure function of the point), which every reader loops over
//!   (the `NonLoopingReader` canary is caught by the search, which never
//!   uses this cache);
//! - SimFs's RNG position: it decides only crash draws, and a fork is
//!   never crashed again;
//! - SQLite's PRNG: saved around every fork's boot; what it feeds (WAL
//!   salts, temp names) is not something recovery reads back as data.
//!
//! Judged every time, never cached: `PowerRot` forks (the flipped bit is
//! drawn from the point) and failures (a failing fork is confirmed by a
//! replay and reported, see `sweep::Sweeper::confirm`).
//!
//! Checked, not assumed: every `recheck_every`-th reuse is judged afresh
//! as well, and a fresh verdict that differs from the cached one is
//! reported as a HARNESS BUG, as a fork that disagrees with its replay is.

use std::collections::HashMap;
use std::sync::Arc;

use durable_agent::fs::CrashImage;

use crate::exec::{Exec, Judging, Observed};
use crate::model::Model;
use crate::op::CrashKind;
use crate::oracle::Side;
use crate::report::Failure;

/// How many reuses pass between two fresh re-judgements.
pub const DEFAULT_RECHECK_EVERY: u64 = 16;

/// Verdicts of the current phase, keyed by what recovery sees.
#[derive(Debug)]
pub struct VerdictCache {
    phase: Option<Arc<Judging>>,
    seen: HashMap<Observed, (Side, Model)>,
    recheck_every: u64,
    /// Forks judged by a recovery (cache misses, rot forks and rechecks).
    pub judged: u64,
    /// Forks whose verdict was reused.
    pub reused: u64,
    /// Reuses judged afresh as well, all found equal.
    pub rechecked: u64,
}

impl VerdictCache {
    /// A cache re-judging every `recheck_every`-th reuse (0: never reuse,
    /// judge every fork).
    pub fn new(recheck_every: u64) -> VerdictCache {
        VerdictCache {
            phase: None,
            seen: HashMap::new(),
            recheck_every,
            judged: 0,
            reused: 0,
            rechecked: 0,
        }
    }

    /// Judge `image` (a fork of phase `judging`) killed with `kind`, as
    /// [`Exec::judge_fork`] would, reusing the verdict of an earlier fork
    /// of the same phase that left recovery the same thing to observe.
    pub fn judge(
        &mut self,
        exec: &Exec,
        image: CrashImage,
        judging: &Arc<Judging>,
        kind: CrashKind,
    ) -> Result<(Side, Model), Box<Failure>> {
        // Phases come in point order and never return: a new one empties
        // the cache (its verdicts were against other models).
        if !self.phase.as_ref().is_some_and(|p| Arc::ptr_eq(p, judging)) {
            self.phase = Some(Arc::clone(judging));
            self.seen.clear();
        }
        if kind == CrashKind::PowerRot || self.recheck_every == 0 {
            self.judged += 1;
            return exec.judge_fork(image, judging, kind);
        }
        let point = image.point();
        let disk = image.reboot(kind.mode());
        let key = exec.observed(&disk, point);
        let Some(cached) = self.seen.get(&key).cloned() else {
            self.judged += 1;
            let verdict = exec.judge_disk(disk, None, point, judging, kind)?;
            self.seen.insert(key, verdict.clone());
            return Ok(verdict);
        };
        self.reused += 1;
        if self.reused.is_multiple_of(self.recheck_every) {
            self.judged += 1;
            self.rechecked += 1;
            let what = format!(
                "HARNESS BUG: the verdict cache reused a verdict at point {point} ({kind:?}) that a fresh judgement does not give"
            );
            match exec.judge_disk(disk, None, point, judging, kind) {
                Ok(fresh) if fresh == cached => {}
                Ok(fresh) => {
                    let detail = format!(
                        "key {key:?}\ncached: {:?} {:#?}\nfresh:  {:?} {:#?}",
                        cached.0, cached.1, fresh.0, fresh.1
                    );
                    return Err(exec.harness_bug(judging, point, kind, what, detail));
                }
                Err(mut f) => {
                    f.what = format!("{what}; fresh: {}", f.what);
                    return Err(f);
                }
            }
        }
        Ok(cached)
    }
}
