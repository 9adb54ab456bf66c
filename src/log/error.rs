//! Typed errors of the event log: each names the file, and where relevant
//! the line and byte offset, and says what to do.

use std::io;
use std::path::PathBuf;

/// An event log operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An I/O call failed; its outcome is unknown (it may have taken
    /// effect). Stop using this runtime and reopen it to run recovery.
    #[error("{step} on {path}: {source} (outcome unknown: reopen to recover)")]
    Io {
        path: PathBuf,
        step: String,
        #[source]
        source: io::Error,
    },
    /// An entry was written by a newer version of durable-agent.
    #[error(
        "{path}: line {line} (byte {offset}) has schema_version {found}, newer than the \
         supported {supported}: upgrade durable-agent to read this log"
    )]
    NewerSchema {
        path: PathBuf,
        line: u64,
        offset: u64,
        found: u32,
        supported: u32,
    },
    /// A complete line in the middle of the log is not a valid entry. The
    /// log is never silently cut here: inspect or quarantine the file.
    #[error("{path}: line {line} (byte {offset}) is corrupt: {reason} (inspect or quarantine the file; nothing was dropped)")]
    Corrupt {
        path: PathBuf,
        line: u64,
        offset: u64,
        reason: String,
    },
    /// An entry could not be serialized (a bug: entries are plain data).
    #[error("cannot serialize {event} for {path}: {source}")]
    Serialize {
        path: PathBuf,
        event: String,
        #[source]
        source: serde_json::Error,
    },
}

impl LogError {
    pub(crate) fn io(path: &std::path::Path, step: &str, source: io::Error) -> Self {
        LogError::Io {
            path: path.to_path_buf(),
            step: step.to_string(),
            source,
        }
    }
}
