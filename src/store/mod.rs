//! Durable stores: session records (atomic write) and the SQLite tables
//! (triggers, activities, checkpoints, tool calls, token usage, errors).
//!
//! The SQLite stores are stateless: each call takes the `&Connection` to
//! act on (a `crate::sqlite` connection over the `Fs` seam in production, an
//! in-memory one in unit tests), after [`schema::migrate`] has run on it.
//! Their statements go through the connection's statement cache
//! (`cached`): a statement is parsed once per connection.

pub mod activities;
mod cached;
pub mod checkpoints;
pub mod inspect;
pub mod manifest;
pub mod schema;
pub mod session;
pub mod tool_calls;
pub mod triggers;
pub mod usage;

pub use schema::StoreError;
