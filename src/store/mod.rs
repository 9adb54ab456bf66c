//! Durable stores: session records (atomic write) and the SQLite tables
//! (triggers, activities, checkpoints, tool calls, token usage, errors).

pub mod activities;
pub mod checkpoints;
pub mod retry;
pub mod session;
pub mod tool_calls;
pub mod triggers;
pub mod usage;
