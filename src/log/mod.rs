//! The append-only JSONL event log (one per session) and its pending-file WAL.
