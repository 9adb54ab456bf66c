//! SQLite over the `Fs` seam: a VFS registered through libsqlite3-sys, and
//! connection setup.
//!
//! Every read, write, truncate, sync, delete and existence check SQLite
//! makes on a database, rollback journal or WAL is one labelled call on an
//! `Arc<dyn Fs>` ("sqlite wal write off=4096 len=4120", "sqlite wal sync",
//! "sqlite dir sync new wal", "sqlite journal delete"), so under `SimFs`
//! a commit is a run of counted crash points. Sync and directory-sync
//! behaviour copies `os_unix.c` (see [`file`]); the wal-index lives in
//! memory (see [`shm`]); one VFS is registered per `Fs` (see [`vfs`]).
//!
//! Entry point: [`open`] → [`Db`].

mod connection;
mod error;
mod file;
mod file_lock;
mod lock;
mod shm;
mod vfs;
#[cfg(test)]
mod vfs_tests;

pub use connection::{open, Db, JournalMode, SqliteOptions, Synchronous};
pub use error::SqliteError;
pub use vfs::Vfs;
