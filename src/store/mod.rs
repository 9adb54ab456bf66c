//! Durable stores: session records (atomic write) and the SQLite tables
//! (triggers, activities, checkpoints, tool calls, token usage, errors).
