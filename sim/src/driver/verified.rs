//! The operator's `verify` of a disk, memoized per thread by the disk's
//! content.
//!
//! Invariant: `verify` (`durable_agent::recovery::verify::verify_with`) is
//! a function of the disk's bytes — every path, directory and file, a
//! SQLite WAL's uncommitted tail included ([`crate::exec::content_key`]
//! with the tail kept) — so two disks with one key get one report. It
//! runs on a detached copy, so neither a miss nor a hit changes the run:
//! its points, draws and armed fault are untouched, and the memo changes
//! only how often the report is computed, never what a run judges. The
//! memo lives per thread (a job's search and sweeps) and is cleared when
//! full; every [`RECHECK_EVERY`]-th hit is verified afresh and compared,
//! and a difference is a HARNESS BUG naming both reports (a hash
//! collision, or a `verify` that reads something beyond the bytes).

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
    reports: HashMap<u64, Verification>,
    hits: u64,
    misses: u64,
}

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

/// `verify(fs)`, or the report of an earlier disk with the same content;
/// `Err` with a HARNESS BUG message when a sampled hit's fresh report
/// differs from the memoized one.
pub fn verified(fs: &SimFs, verify: impl Fn() -> Verification) -> Result<Verification, String> {
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
                    "HARNESS BUG: verify of a disk (content key {key:016x}) differs from the memoized report of an equal disk: fresh {fresh:?}, memoized {report:?}"
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
