//! Power cuts on a real kernel path: a FUSE filesystem whose unsynced data
//! and unsynced directory operations live in a volatile layer, made
//! durable only by `fsync`/`fsyncdir`, and dropped on command.
//!
//! A real program (the `durable-agent` binary, or anything else) does real
//! syscalls on the mount — `open`, `pwrite`, `fsync`, `rename`, `fsync` of
//! a directory, `flock` — and the kernel's FUSE client forwards them here.
//! [`PowerCutMount::cut_power`] then does to the disk what a power loss
//! does, and the disk is remounted for the program's restart.
//!
//! # Invariant
//!
//! The volatile layer *is* a [`SimFs`](durable_agent::fs::SimFs): every
//! kernel request is translated into the same `Fs` call the runtime makes
//! on the seam, so what `fsync` and `fsyncdir` make durable, and what a cut
//! keeps of the rest, are exactly SimFs's `PowerLoss` choices (see
//! `src/fs/sim/mod.rs`, the one place the fault model is written down):
//! strict or eager directory model, each unsynced write kept or lost
//! independently from the mount's seed, a kept write possibly torn to a
//! prefix, each unsynced create/rename/remove/mkdir kept or lost, a rename
//! atomic, an entry whose directory did not survive dropped. There is no
//! second model to drift from the first.
//!
//! Between mounts the disk rests in a backing directory: a mount loads it
//! (all of it durable), a cut writes back what survived, a clean unmount
//! writes back everything the program wrote (as a clean shutdown flushes
//! the page cache). The backing directory is therefore always the disk as
//! it is after the last power cut — the thing to inspect when a restart
//! fails to recover.
//!
//! # Compared with SimFs and LazyFS
//!
//! Agrees with SimFs: the whole fault model (above), since it is SimFs.
//! Differs from SimFs *in use*: the I/O points come from the kernel, not
//! from the runtime's calls, so they carry no caller labels (they are
//! labelled by FUSE operation), a `write(2)` larger than the kernel's
//! `max_write` arrives as several writes (each its own unsynced op that a
//! cut keeps or drops), and the moment of a cut is wall-clock, between
//! requests, chosen by the soak driver: no cut lands *inside* one op (the
//! crash counter's torn op at `CrashAt(n)` has no counterpart here; a torn
//! unsynced write does). No I/O errors (EIO, ENOSPC, lost replies) are
//! injected. A failed `fsync` cannot happen, so the "unknown" state after
//! one is never reached.
//!
//! LazyFS (dsrhaslab/lazyfs, VLDB 2024 "When Amnesia Strikes") is the
//! closest existing tool: a FUSE filesystem with a private page cache that
//! reaches the backing filesystem only on `fsync`/`fdatasync`/`sync`, and a
//! `clear-cache` fault that drops all unsynced data. It agrees with us that
//! unsynced file data is volatile and that `fsync` of a file persists that
//! file's data. It differs: LazyFS passes metadata operations (create,
//! rename, unlink, mkdir) straight to the backing filesystem, so a created
//! or renamed entry survives a cut without any directory fsync — it cannot
//! find a missing `fsyncdir`, which the strict model here does (and the
//! `RealFsSyncDirNoop` canary proves). LazyFS's `clear-cache` drops *all*
//! unsynced data; here each unsynced write survives or not from the seed,
//! possibly torn, which covers LazyFS's separately-configured `torn-op`
//! (part of a write persisted) and `torn-seq` (a later write persisted
//! without an earlier one) faults as draws of one cut. LazyFS can crash
//! before or after a named operation on a named file and caches by page
//! with eviction (so unsynced data may reach disk early); we cut between
//! requests at moments the soak driver picks and never evict early.
//!
//! Not covered: hard links, symlinks, `rmdir`, renaming directories,
//! permissions, timestamps (all report the epoch), extended attributes and
//! `mmap` writes with `MAP_SHARED` (the runtime uses none of them: its seam,
//! `Fs`, has no such calls). `flock` is handled by the kernel locally
//! (FUSE without `FUSE_FLOCK_LOCKS`), as on any local filesystem.

mod disk;
mod errno;
mod fuse;
mod inodes;
mod mount;

pub use mount::{Cut, MountConfig, PowerCutError, PowerCutMount};
