//! The operator's `verify` of a disk, memoized per thread by the disk's
//! content, with the number of I/O points it took (F2,
//! [`super::verify_fault`], draws its fault among them).
//!
//! Invariant: `verify` (`durable_agent::recovery::verify::verify_with`) is
//! a function of the disk's bytes — every path, directory and file, a
//! SQLite WAL's uncommitted tail included ([`crate::exec::content_key`]
//! with the tail kept) — so two disks with one key get one report, read
//! in the same I/O points. It
//! runs on a detached copy, so neither a miss nor a hit changes the run:
//! its points, draws and armed fault are untouched, and the memo changes
//! only how often the report is computed, never what a run judges. The
//! memo lives per thread (a job's search and sweeps) and is cleared when
//! full; every [`RECHECK_EVERY`]-th hit is verified afresh and compared,
//! and a difference (in the report or the point count) is a HARNESS BUG
//! naming both (a hash collision, or a `verify` that reads something
//! beyond the bytes).

use std::cell::RefCell;
use std::collections::HashMap;

use durable_agent::fs::SimFs;
use durable_agent::recovery::verify::Verification;

/// Reports kept before the memo is cleared (each a few hundred bytes).
const CAPACITY: usize = 4096;

/// One hit in this many is re-verified and compared.
pub const RECHECK_EVERY: u64 = 16;

#[derive(Default)]
struct Memo {
    reports: HashMap<u64, Verified>,
    hits: u64,
    misses: u64,
}

/// A report and the I/O points `verify` took to make it.
pub type Verified = (Verification, u64);

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// Hits and misses of this thread's memo so far.
pub fn stats() -> (u64, u64) {
    MEMO.with(|m| {
        let m = m.borrow();
        (m.hits, m.misses)
    })
}

/// `verify(fs)`, or the report (and point count) of an earlier disk with
/// the same content; `Err` with a HARNESS BUG message when a sampled hit's
/// fresh report or point count differs from the memoized one.
pub fn verified(fs: &SimFs, verify: impl Fn() -> Verified) -> Result<Verified, String> {
    let key = crate::exec::content_key(fs, false);
    let known = MEMO.with(|m| {
        let mut m = m.borrow_mut();
        let known = m.reports.get(&key).cloned();
        match known {
            Some(_) => m.hits += 1,
            None => m.misses += 1,
        }
        known.map(|v| (v, m.hits % RECHECK_EVERY == 0))
    });
    match known {
        Some((report, false)) => Ok(report),
        Some((report, true)) => {
            let fresh = verify();
            if fresh != report {
                return Err(format!(
                    "HARNESS BUG: verify of a disk (content key {key:016x}) differs from the memoized one of an equal disk (report, I/O points): fresh {fresh:?}, memoized {report:?}"
                ));
            }
            Ok(fresh)
        }
        None => {
            let report = verify();
            MEMO.with(|m| {
                let mut m = m.borrow_mut();
                if m.reports.len() >= CAPACITY {
                    m.reports.clear();
                }
                m.reports.insert(key, report.clone());
            });
            Ok(report)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::PathBuf;

    use durable_agent::fs::{SimConfig, SimFs};
    use durable_agent::recovery::verify::Verification;

    use super::*;

    fn report(root: &str, points: u64) -> Verified {
        let report = Verification {
            root: PathBuf::from(root),
            ..Verification::default()
        };
        (report, points)
    }

    #[test]
    fn an_equal_disk_is_answered_from_the_memo_and_a_sampled_hit_is_checked() {
        let runs = Cell::new(0);
        let verify = |root: &'static str, points: u64| {
            let runs = &runs;
            move || {
                runs.set(runs.get() + 1);
                report(root, points)
            }
        };
        // Two disks with equal content (both empty, other seeds).
        let a = SimFs::new(SimConfig::new(1));
        let b = SimFs::new(SimConfig::new(2));
        assert_eq!(verified(&a, verify("/r", 7)), Ok(report("/r", 7)));
        assert_eq!(runs.get(), 1);
        let (hits, misses) = stats();
        assert_eq!((hits, misses), (0, 1));
        // Hits answer from the memo, without verifying, until the sampled
        // one: verified afresh, and a different report is a harness bug.
        for _ in 1..RECHECK_EVERY {
            assert_eq!(verified(&b, verify("/other", 7)), Ok(report("/r", 7)));
        }
        assert_eq!(runs.get(), 1);
        let bug = verified(&b, verify("/other", 7)).expect_err("the sampled hit differs");
        assert!(bug.starts_with("HARNESS BUG"), "{bug}");
        assert_eq!(runs.get(), 2);
        // The same report read in another number of points is a bug too
        // (F2 draws its fault among them).
        for _ in 1..RECHECK_EVERY {
            assert_eq!(verified(&b, verify("/r", 8)), Ok(report("/r", 7)));
        }
        let bug = verified(&b, verify("/r", 8)).expect_err("the sampled hit's points differ");
        assert!(bug.starts_with("HARNESS BUG"), "{bug}");
        assert_eq!(runs.get(), 3);
    }
}
