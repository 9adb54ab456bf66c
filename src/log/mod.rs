//! The append-only JSONL event log (one per session) and its pending-file WAL.
//!
//! Invariant: `events.jsonl` is always a valid JSONL prefix of the history
//! of its session up to a possibly partial trailing line, and every entry an
//! [`EventLog::append`] returned `Ok` for is in it durably (fsynced). Entries
//! carry a contiguous `seq` (from 0) so the pending-file replay can dedup.
//!
//! Write protocol (one entry): overwrite `events.pending` with the line +
//! fsync (the first append of an opened log also fsyncs the directory, so
//! the copy's entry is durable), then append the line to `events.jsonl` +
//! fsync. The pending file is never unlinked by the writer. Recovery
//! ([`repair()`]) truncates a partial trailing line (or a damaged last line
//! the pending copy holds whole), then replays a complete pending entry
//! unless its `seq` is already in the log (tail dedup), ignores a torn one,
//! and removes the file.
//!
//! Serialization contract: plain JSON only (strings, numbers, bools, lists,
//! objects); ids are hex strings, `ts` is the runtime's logical clock (u64
//! ticks), never wall-clock time. See [`entry`].

pub mod entry;
mod error;
mod memo;
pub mod repair;
mod writer;

pub use entry::{DecidedCall, Event, LogEntry, CHECKSUM_VERSION, SCHEMA_VERSION};
pub use error::LogError;
pub use repair::{parse_log, repair, LogRepair, ParsedLog};
pub use writer::EventLog;

/// Name of the event log inside a session directory.
pub const EVENTS_FILE: &str = "events.jsonl";
/// Name of the pending-entry WAL file inside a session directory.
pub const PENDING_FILE: &str = "events.pending";
