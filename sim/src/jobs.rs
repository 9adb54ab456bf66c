//! `fuzz --jobs N`: N campaigns ([`crate::campaign`]) in N worker
//! processes of this same binary (its hidden `worker` subcommand), merged
//! into one progress view and one summary.
//!
//! Why processes and not threads: SQLite's PRNG (which names its temp and
//! WAL files) is process-global, and a case's trace must depend on its
//! seed alone.
//!
//! Invariant: the parent never judges anything. Each worker runs a
//! complete campaign under [`crate::campaign::worker_seed`]`(seed, index)`
//! and talks to the parent only through JSON lines on its stdout
//! ([`Message`]): progress, then exactly one `Done` with its totals and
//! what it found. Failing cases are saved by the worker itself under the
//! one [`crate::report::failures_dir`] every worker shares. A worker that
//! ends without `Done` (and was not stopped by the parent because another
//! one failed) is itself reported as a failure.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use serde::{Deserialize, Serialize};

use crate::campaign::{Outcome, Progress};

/// What one worker runs (passed as JSON on its command line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub index: u32,
    /// Profile name as `--profile` takes it.
    pub profile: String,
    pub cases: Option<u32>,
    /// The worker's campaign seed (already derived).
    pub seed: u64,
    /// A canary's snake_case name.
    pub canary: Option<String>,
    pub budget_secs: Option<u64>,
    /// `fuzz --no-verdict-cache`.
    #[serde(default)]
    pub no_verdict_cache: bool,
    /// The stages of its rounds it runs (a split one-round campaign).
    #[serde(default)]
    pub stages: crate::campaign::Stages,
}

/// One line of a worker's stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    Progress(Progress),
    Done(Outcome),
}

impl Message {
    /// Write as one JSON line and flush (the parent reads line by line).
    pub fn emit(&self, out: &mut impl Write) -> std::io::Result<()> {
        let line = serde_json::to_string(self).map_err(std::io::Error::other)?;
        writeln!(out, "{line}")?;
        out.flush()
    }
}

/// How a worker ended.
#[derive(Debug, Clone)]
pub struct WorkerResult {
    pub spec: WorkerSpec,
    /// `None`: it ended without a summary.
    pub outcome: Option<Outcome>,
    /// The parent stopped it (another worker had failed).
    pub stopped: bool,
    /// Its exit status, as text.
    pub status: String,
    /// Last progress it reported.
    pub progress: Progress,
}

/// Run `specs` as workers of `exe`, calling `on_progress` with every
/// worker's latest progress whenever one reports. When one worker finds a
/// failure the others are stopped (a campaign ends at its first failure).
pub fn run_workers(
    exe: &Path,
    specs: &[WorkerSpec],
    mut on_progress: impl FnMut(&[Progress]),
) -> Result<Vec<WorkerResult>, String> {
    let (tx, rx) = mpsc::channel::<(usize, Option<Message>)>();
    let mut children: Vec<Child> = Vec::new();
    let mut readers = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let arg = serde_json::to_string(spec).map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["worker", "--spec", &arg])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start worker {i} ({}): {e}", exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| format!("worker {i}: no stdout pipe"))?;
        children.push(child);
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Message>(&line) {
                    Ok(m) => {
                        let _ = tx.send((i, Some(m)));
                    }
                    // Anything else a worker prints goes to our stderr.
                    Err(_) => eprintln!("[worker {i}] {line}"),
                }
            }
            let _ = tx.send((i, None));
        }));
    }
    drop(tx);
    let mut progress = vec![Progress::default(); specs.len()];
    let mut outcomes: Vec<Option<Outcome>> = vec![None; specs.len()];
    let mut stopped = vec![false; specs.len()];
    for (i, message) in rx {
        match message {
            Some(Message::Progress(p)) => {
                progress[i] = p;
                on_progress(&progress);
            }
            Some(Message::Done(outcome)) => {
                let failed = outcome.found.is_some();
                outcomes[i] = Some(outcome);
                if failed {
                    for (j, child) in children.iter_mut().enumerate() {
                        if j != i && outcomes[j].is_none() && !stopped[j] {
                            stopped[j] = true;
                            // Stop it by its own handle (already gone is fine).
                            let _ = child.kill();
                        }
                    }
                }
            }
            None => {}
        }
    }
    for r in readers {
        let _ = r.join();
    }
    let mut results = Vec::new();
    for (i, mut child) in children.into_iter().enumerate() {
        let status = child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"));
        results.push(WorkerResult {
            spec: specs[i].clone(),
            outcome: outcomes[i].take(),
            stopped: stopped[i],
            status,
            progress: progress[i],
        });
    }
    Ok(results)
}
