//! SQLite over the `Fs` seam: a VFS registered through libsqlite3-sys, and
//! connection setup.
//!
//! Every read, write, truncate, sync, delete and existence check SQLite
//! makes on a database, rollback journal or WAL is one labelled call on an
//! `Arc<dyn Fs>` (`sqlite wal write off=4152 len=24`, `sqlite wal sync`,
//! `sqlite dir sync new wal`, `sqlite journal delete`,
//! `sqlite dir sync after journal delete`), so under `SimFs` a commit is a
//! run of counted crash points.
//!
//! Module map (one job each):
//! - `vfs`: one registered `sqlite3_vfs` per `Fs` (`durable-agent-<n>`),
//!   unregistered when the last [`Db`] on it is dropped; VFS-level
//!   callbacks (open/delete/access/pathname/randomness/time).
//! - `file`: per-file methods; sync and directory-sync rules copied from
//!   `os_unix.c` (directory fsync on the first sync of a newly created main
//!   journal, WAL or super-journal; on delete when SQLite asks, i.e.
//!   synchronous=EXTRA); short reads zero-fill.
//! - `file_lock`, `lock`: in-process database locks (one VFS = one process).
//! - `shm`: the wal-index in memory. It is not durable data: SQLite rebuilds
//!   it from the WAL after every crash, which is what a fresh VFS instance
//!   (a restarted process) forces.
//! - `connection`: [`open`], [`SqliteOptions`], [`Db`]; deterministic PRNG
//!   seeding and a logical clock.
//! - `error`: [`SqliteError`] and the io → SQLite result-code mapping.
//!
//! Entry point: [`open`] → [`Db`]. Default options are the runtime's:
//! WAL + synchronous=FULL.

mod connection;
mod error;
mod file;
mod file_lock;
mod lock;
mod shm;
mod vfs;
#[cfg(test)]
mod vfs_tests;

pub use connection::{open, with_saved_prng, Db, JournalMode, SqliteOptions, Synchronous};
pub use error::SqliteError;
pub use vfs::Vfs;
