//! durable-agent: a crash-proof runtime for LLM agents.
//!
//! Every byte the runtime persists crosses one seam, [`fs::Fs`]. Production
//! uses [`fs::RealFs`]; tests and the harness use [`fs::SimFs`], which
//! injects crashes, I/O errors, lost replies and power loss at numbered I/O
//! points. SQLite crosses the same seam through the VFS in [`sqlite`].
//!
//! Layout (one job per module):
//! - [`fs`]: the I/O seam and its two implementations.
//! - [`sqlite`]: a SQLite VFS over any `Fs`, and connection setup.
//! - [`log`]: the append-only JSONL event log with its pending-file WAL.
//! - [`store`]: session records and the SQLite-backed stores.
//! - [`runtime`]: the orchestrator: agents, tree, inbox, turns, tools.
//! - [`recovery`]: the one recovery procedure.
//! - [`system`]: the one composition and its boot ([`system::System::boot`]).
//! - [`worker`]: the daemon's logic once, sans-IO: API requests, scheduler
//!   passes and call results in; calls and replies out. `serve` and the
//!   madsim simulation are its two drivers.
//! - [`world`]: the outside world's interface ([`world::Outbox`]).

pub mod canary;
pub mod checksum;
pub mod fs;
pub mod log;
pub mod recovery;
pub mod runtime;
pub mod sqlite;
pub mod store;
pub mod system;
pub mod worker;
pub mod world;
