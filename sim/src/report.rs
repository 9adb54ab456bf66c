//! Failure reports, written for a tired human at 2 a.m.: the seed, the
//! shrunk ops, the crash point with its I/O label and the trace around it,
//! expected vs recovered as a diff, and ONE command that reproduces it.
//!
//! Invariant: a [`Failure`] carries its [`Case`], and the case file it
//! points to ([`Failure::save`]) replays to the same failure with the
//! `repro` binary.

use std::fmt;
use std::path::PathBuf;

use durable_agent::fs::TraceEntry;
use serde::{Deserialize, Serialize};
use similar::{ChangeTag, TextDiff};

use crate::exec::Case;
use crate::model::State;
use crate::op::{render, CrashKind};

/// Trace entries shown on each side of the crash point.
pub const TRACE_CONTEXT: usize = 5;

/// Where the injected crash hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashSite {
    pub point: u64,
    pub label: String,
    pub path: String,
    /// The crash fell between ops, right after `point` (the armed point lay
    /// past the op), rather than at `point`.
    pub between_ops: bool,
    pub mode: Option<CrashKind>,
    /// The trace around the point (±[`TRACE_CONTEXT`] entries).
    pub window: Vec<TraceEntry>,
}

impl CrashSite {
    /// The site of `trace[index]` with its window.
    pub fn around(trace: &[TraceEntry], index: usize, between_ops: bool) -> CrashSite {
        let lo = index.saturating_sub(TRACE_CONTEXT);
        let hi = (index + TRACE_CONTEXT + 1).min(trace.len());
        let e = &trace[index];
        CrashSite {
            point: e.point,
            label: e.label.clone(),
            path: e.path.clone(),
            between_ops,
            mode: None,
            window: trace[lo..hi].to_vec(),
        }
    }
}

/// A property violation with everything needed to understand and replay it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The ops up to and including the failing one.
    pub case: Case,
    /// Index (0-based) of the op during which the failure was detected.
    pub step: usize,
    /// One-line headline.
    pub what: String,
    /// The oracle's or invariant's explanation.
    pub detail: String,
    pub crash: Option<CrashSite>,
    pub expected: Option<State>,
    pub recovered: Option<State>,
    /// Earlier restarts the oracle accepted (context for the failing one).
    #[serde(default)]
    pub earlier_restarts: Vec<String>,
}

/// FNV-1a 64: a stable file name for a case (six lines instead of a
/// dependency; std's hasher is not stable across releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `target/da-failures/` of this workspace (or `$CARGO_TARGET_DIR`).
pub fn failures_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        });
    target.join("da-failures")
}

impl Case {
    /// Write the case as JSON under [`failures_dir`]; returns the path.
    pub fn save(&self) -> std::io::Result<PathBuf> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let dir = failures_dir();
        std::fs::create_dir_all(&dir)?;
        let hash = fnv1a(json.as_bytes());
        let path = dir.join(format!("{hash:016x}.json"));
        // Written aside and renamed in, so the file is whole or absent:
        // a campaign's jobs are processes that may save the same case at
        // once, and after one `fuzz --jobs 2` failure (2026-11-28) its case
        // file was found empty (the cause was not pinned down).
        let tmp = dir.join(format!(".{hash:016x}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}

/// The unified diff of two states as pretty JSON (`-` expected, `+` recovered).
pub fn state_diff(expected: &State, recovered: &State) -> String {
    let a = serde_json::to_string_pretty(expected).unwrap_or_else(|e| format!("<unserializable: {e}>"));
    let b = serde_json::to_string_pretty(recovered).unwrap_or_else(|e| format!("<unserializable: {e}>"));
    let diff = TextDiff::from_lines(&a, &b);
    let mut out = String::new();
    for group in diff.grouped_ops(3) {
        out.push_str("  @@\n");
        for op in group {
            for change in diff.iter_changes(&op) {
                let sign = match change.tag() {
                    ChangeTag::Delete => '-',
                    ChangeTag::Insert => '+',
                    ChangeTag::Equal => ' ',
                };
                out.push_str(&format!("  {sign} {}", change.value()));
                if change.missing_newline() {
                    out.push('\n');
                }
            }
        }
    }
    out
}

impl Failure {
    /// Save the case and render the report with the command that replays it.
    pub fn report(&self) -> String {
        format!("{self}\nREPRODUCE WITH:\n  {}\n", self.repro_command())
    }

    /// Save the case under [`failures_dir`] and return the one command
    /// that replays it (or, if it cannot be saved, why, and the case JSON).
    pub fn repro_command(&self) -> String {
        match self.case.save() {
            Ok(path) => format!(
                "cargo run -p durable-agent-sim --bin repro -- --case {}",
                path.display()
            ),
            Err(e) => format!(
                "(could not save the case: {e}; the JSON is below)\n{}",
                serde_json::to_string(&self.case).unwrap_or_default()
            ),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\n=== durable-agent-sim FAILURE: {} ===", self.what)?;
        writeln!(
            f,
            "seed: {:#x}   canaries: {:?}",
            self.case.seed, self.case.canaries
        )?;
        if let Some(g) = &self.case.crash_at {
            writeln!(f, "sweep crash: point {} under {:?}", g.point, g.kind)?;
        }
        if self.case.ops.is_empty() {
            writeln!(
                f,
                "ops (none: failed installing or booting the system, before op #1)"
            )?;
        } else {
            writeln!(
                f,
                "ops ({}; failed in op #{}):",
                self.case.ops.len(),
                self.step + 1
            )?;
        }
        for (i, op) in self.case.ops.iter().enumerate() {
            let mark = if i == self.step { ">>" } else { "  " };
            writeln!(f, "  {mark} {:>3}. {}", i + 1, render(op))?;
        }
        if !self.earlier_restarts.is_empty() {
            writeln!(f, "earlier restarts (accepted):")?;
            for note in &self.earlier_restarts {
                writeln!(f, "  {note}")?;
            }
        }
        writeln!(f, "why:\n  {}", self.detail.replace('\n', "\n  "))?;
        match &self.crash {
            Some(site) => {
                let at = if site.between_ops {
                    "right after point"
                } else {
                    "point"
                };
                let mode = site
                    .mode
                    .map(|m| format!("{m:?}"))
                    .unwrap_or_else(|| "injected I/O error, no crash".into());
                writeln!(
                    f,
                    "crash ({mode}) at {at} {} \"{}\" on {}",
                    site.point, site.label, site.path
                )?;
                writeln!(f, "trace around it:")?;
                for e in &site.window {
                    let mark = if e.point == site.point { ">>" } else { "  " };
                    writeln!(
                        f,
                        "  {mark} {:>6} {:<9} {:<24} {} [{:?}]",
                        e.point,
                        format!("{:?}", e.op),
                        e.label,
                        e.path,
                        e.outcome
                    )?;
                }
            }
            None => writeln!(
                f,
                "crash point: none hit (failure without an injected crash, or a crash between ops)"
            )?,
        }
        if let (Some(e), Some(r)) = (&self.expected, &self.recovered) {
            writeln!(f, "expected (-) vs recovered (+):")?;
            write!(f, "{}", state_diff(e, r))?;
        }
        Ok(())
    }
}
