//! durable-agent-cli: the network-facing pieces of the durable-agent
//! product — config, an OpenAI-compatible provider, HTTP tools and their
//! outbox, a scripted mock LLM, a webhook sink, telemetry (JSONL, HTTP POST,
//! OpenTelemetry traces) — and the
//! `durable-agent` binary.
//!
//! Invariant: everything here is synchronous (blocking I/O on plain
//! threads), because the system crate's `Provider`, `Outbox` and
//! `ToolExecutor` traits are — with one exception, `serve`'s API
//! listener ([`api::listen`]): hyper on a tokio runtime that the daemon
//! owns and runs for the listener only. The worker thread, the calls it
//! starts and every other command stay synchronous and never see the
//! runtime; a request crosses to the worker as one message on a channel,
//! and its task awaits the reply on a one-shot channel, so nothing on the
//! runtime blocks. No other runtime is started by this crate.
//! Nothing here persists runtime state: that crosses the system crate's
//! `Fs` seam only.

pub mod access;
pub mod api;
pub mod boot;
pub mod config;
pub mod daemon;
pub mod effects;
pub mod gc;
pub mod hooks;
mod http;
pub mod inspect;
pub mod interrupt;
pub mod job;
pub mod lifecycle;
pub mod mock_llm;
pub mod observe;
pub mod openai;
pub mod ops;
pub mod otel;
pub mod progress;
pub mod retry;
pub mod run;
pub mod schedule;
pub mod server;
pub mod telemetry;
pub mod tools;
pub mod verify;
pub mod webhook_sink;
