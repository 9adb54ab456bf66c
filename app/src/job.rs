//! Job files (seed 004's `--job`): one agent, its instructions and one
//! prompt, run as one work turn.
//!
//! ```toml
//! run_id = "weekly-report"   # optional: default `<file stem>-<n>`
//! agent = "reporter"
//! instructions = "You write short reports."
//! prompt = "Summarise this week's notes."
//! ```
//!
//! Invariant: a [`Job`] that [`Job::load`] or [`Job::from_stored`] returns
//! is valid — a non-empty agent name and prompt, a run id (if given) made
//! of `[A-Za-z0-9._-]`, 1–64 characters — and round-trips through
//! [`Job::to_json`], which is what the runs table keeps (so `--resume`
//! and `--fork` run exactly the job the run was started with).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{path}: cannot read job file: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
    #[error("run {run_id}: its stored job is unreadable ({message}); the runs table was written by another version?")]
    Stored { run_id: String, message: String },
}

/// One job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The name of the root agent the job runs on.
    pub agent: String,
    #[serde(default)]
    pub instructions: String,
    pub prompt: String,
}

impl Job {
    /// Read, parse and validate a TOML job file.
    pub fn load(path: &Path) -> Result<Job, JobError> {
        let text = std::fs::read_to_string(path).map_err(|source| JobError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let job: Job = toml::from_str(&text).map_err(|e| JobError::Parse {
            path: path.to_path_buf(),
            // toml's message names the line and column and quotes it.
            message: e.to_string().trim_end().to_string(),
        })?;
        job.validate().map_err(|(key, message)| JobError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        })?;
        Ok(job)
    }

    /// The job of run `run_id`, as the runs table keeps it.
    pub fn from_stored(run_id: &str, json: Option<&str>) -> Result<Job, JobError> {
        let stored = |message: String| JobError::Stored {
            run_id: run_id.to_string(),
            message,
        };
        let json = json.ok_or_else(|| stored("the run has no job (not started by `run`)".into()))?;
        let job: Job = serde_json::from_str(json).map_err(|e| stored(e.to_string()))?;
        job.validate().map_err(|(key, m)| stored(format!("{key}: {m}")))?;
        Ok(job)
    }

    pub fn to_json(&self) -> String {
        // A struct of strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.agent.trim().is_empty() {
            return Err(("agent", "must not be empty".into()));
        }
        if self.prompt.trim().is_empty() {
            return Err(("prompt", "must not be empty".into()));
        }
        if let Some(id) = &self.run_id {
            check_run_id(id).map_err(|m| ("run_id", m))?;
        }
        Ok(())
    }
}

/// Run ids name runs on the command line and in the API: keep them plain.
pub fn check_run_id(id: &str) -> Result<(), String> {
    durable_agent::worker::check_plain_id(id)
}

/// `{stem}-{n}` with `n` one past the largest `n` already used with this
/// stem (1 for the first), so ids never repeat within a root.
pub fn next_run_id(stem: &str, existing: &[String]) -> String {
    let stem: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    let stem = if stem.is_empty() { "run".to_string() } else { stem };
    let prefix = format!("{stem}-");
    let last = existing
        .iter()
        .filter_map(|id| id.strip_prefix(&prefix)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    format!("{prefix}{}", last + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_count_up_per_stem() {
        let existing = vec![
            "job-1".to_string(),
            "job-7".into(),
            "job-x".into(),
            "other-9".into(),
        ];
        assert_eq!(next_run_id("job", &existing), "job-8");
        assert_eq!(next_run_id("new job", &existing), "new_job-1");
        assert_eq!(next_run_id("", &[]), "run-1");
    }

    #[test]
    fn jobs_validate_and_round_trip() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("j.toml");
        std::fs::write(&path, "agent = \"a\"\nprompt = \"p\"\nrun_id = \"r-1\"\n")?;
        let job = Job::load(&path)?;
        assert_eq!(Job::from_stored("r-1", Some(&job.to_json()))?, job);
        std::fs::write(&path, "agent = \"a\"\nprompt = \" \"\n")?;
        let e = Job::load(&path).expect_err("empty prompt").to_string();
        assert!(e.contains("`prompt`"), "{e}");
        std::fs::write(&path, "agent = \"a\"\nprompt = \"p\"\nrun_id = \"a b\"\n")?;
        assert!(Job::load(&path).is_err());
        std::fs::write(&path, "agent = \"a\"\npromt = \"p\"\n")?;
        let e = Job::load(&path).expect_err("typo").to_string();
        assert!(e.contains("line 2"), "{e}");
        Ok(())
    }
}
