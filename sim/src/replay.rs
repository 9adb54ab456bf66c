//! Replaying a saved case (what `repro` and `durable-agent-sim repro` run).
//!
//! Invariant: a replay is `run_case` (or `sweep`) on the case exactly as
//! saved; the output is the same failure report the search printed.

use std::path::Path;

use crate::exec::{run_case, Case};
use crate::op::render;
use crate::sweep::{sweep, SweepOptions};

/// Replay the case at `path` (or sweep its ops at every I/O point).
/// Returns whether it passed, and what to print.
pub fn replay(path: &Path, sweep_points: bool) -> Result<(bool, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let case: Case =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a case file: {e}", path.display()))?;
    if sweep_points {
        let options = SweepOptions::default();
        let s = sweep(case.seed, &case.ops, &case.canaries, &options);
        let mut out = format!(
            "swept {} points × {} crash modes = {} crash points judged, {} failing\n",
            s.points,
            options.kinds.len(),
            s.runs,
            s.failures.len()
        );
        if let Some(first) = s.failures.first() {
            out.push_str(&first.report());
        }
        return Ok((s.failures.is_empty(), out));
    }
    Ok(match run_case(&case) {
        Ok(stats) => {
            let mut out = format!(
                "PASS: seed {:#x}, {} ops, {} I/O points, {} restarts judged\n",
                case.seed,
                case.ops.len(),
                stats.points,
                stats.restarts
            );
            for (i, op) in case.ops.iter().enumerate() {
                out.push_str(&format!("  {:>3}. {}\n", i + 1, render(op)));
            }
            (true, out)
        }
        Err(failure) => (false, failure.report()),
    })
}
