//! SQLite over the `Fs` seam: a VFS registered through libsqlite3-sys, and
//! connection setup.
