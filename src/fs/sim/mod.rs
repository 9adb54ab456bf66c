//! [`SimFs`]: an in-memory, fault-injecting [`Fs`](crate::fs::Fs), deterministic from a seed.
//!
//! # The fault model
//!
//! This is the one place the fault model is written down. Every other test,
//! harness and oracle refers here.
//!
//! **State.** Per file (an inode: identity independent of its name): the
//! *visible* bytes (the page cache; what `read` returns) and a *durable*
//! base plus a log of unsynced writes/truncates. Per directory: the visible
//! entries and the durable entries plus a log of unsynced creates, renames,
//! removes and mkdirs. `rename` moves an entry to the same inode, so a
//! file's data durability (`sync`) and its entry's durability (`sync_dir`)
//! are separate facts, as on a real filesystem. Limit: no file grows past
//! [`SimConfig::max_file_bytes`] (`ErrorKind::FileTooLarge`, no effect).
//!
//! **I/O points.** Every [`Fs`](crate::fs::Fs) call is one numbered point (from 1), recorded
//! in [`SimFs::trace`] with the caller's label and its [`Outcome`] (a
//! rename's path reads `"<from> -> <to>"`). A
//! [`Fault`] is armed at one point number. All random choices draw from one
//! ChaCha8 RNG seeded by [`SimConfig::seed`], in a fixed order, so a seed and
//! an op sequence replay to byte-identical disks and traces
//! ([`SimFs::image_hash`], [`SimFs::trace_hash`]).
//!
//! | Fault | Stands for | Effect |
//! |---|---|---|
//! | `CrashAt(n)` | the process dies mid-syscall (kill -9, OOM kill, panic in another thread) or the machine loses power during it | points `1..n` happened; point `n` took effect with probability `crash_point_done_probability` — a `write_at`/`append` then possibly as a prefix (`torn_write_probability`), a `create_dir_all` possibly only its outer directories, a `sync`/`sync_dir` possibly only partly (the two rows below), any other op whole — else not at all; every later call errors, uncounted and untraced, until [`SimFs::restart`] |
//! | power cut during `fsync` | the drive was writing the file's dirty pages back when the power went: some reached the platter, some did not, in no particular order (FoundationDB's `AsyncFileNonDurable`, Turso's power-loss simulator) | a `sync` at a `CrashAt` point cut midway (the same draw as a torn write): the file's unsynced writes are split at 4096-byte page boundaries and each page — with its current content, so never torn inside a page — became durable by a fair coin seeded from that draw; the other pages stay unsynced (a power loss decides them like any unsynced write: writeback may have taken them earlier). A multi-page write can so land as any subset of its pages, not only a prefix. No journal commit happened, so the Eager rule does not apply |
//! | power cut during a directory `fsync` | the journal committed the directory's changes in more than one transaction, or the filesystem has none (ext2, FAT), and the power went between them | a `sync_dir` cut midway: each of the directory's undecided changes became durable by a seeded fair coin, the rest stay undecided (a rename still all-or-nothing) |
//! | short read | `pread(2)` returning fewer bytes than asked, which POSIX allows (a signal, NFS/FUSE, a network block device) | a `read_at` of two or more available bytes returns `1..available` bytes with `short_read_probability`; which reads and how short is a pure function of the point number (splitmix64), never a draw from the seed's RNG, so reads change no later choice and a copied install or rebooted crash image reads as the run it came from. `read` (whole file) is never short: its contract is the whole file. Readers loop ([`crate::fs::read_full_at`]) |
//! | bit rot at rest ([`SimFs::rot`]) | a latent sector error the drive did not report, a bit flipped in DRAM, on the bus or by firmware (TigerBeetle's and FoundationDB's corruption faults) | one byte of a file's durable bytes XORed with a mask, between a crash and the reboot; not an I/O point. The harness's `PowerRot` mode aims it at a complete, durable event-log line or session record, whose checksum must catch it ([`crate::checksum`]) |
//! | `FailAt(n, Eio)` | a media error, a yanked or dm-error'd device, a failing NFS/FUSE backend | point `n` returns EIO (`ErrorKind::Other`) and changes nothing — except a failed `sync`, see below |
//! | `FailAt(n, Enospc)` | a full disk or quota (ext4 can also report it from `fsync` under delayed allocation) | as EIO, with `ErrorKind::StorageFull` |
//! | `LostReplyAt(n)` | the kernel completed the op but the caller saw an error (EINTR after completion, a dropped NFS reply, an error from a different page reported on this `fsync`) | point `n` takes full effect; the caller gets EIO |
//! | unsynced write lost | the page cache, or the drive's volatile write cache, dies with the power | at power loss each unsynced write/truncate survives with `unsynced_write_survival`, independently: any subset, applied in original order (writeback reorders; a lost append before a kept one leaves zeros) |
//! | torn write | only some sectors of a multi-sector write reached the platter | a surviving unsynced write lands as a strict prefix with `torn_write_probability` (byte granular: harsher than 512-byte sectors) |
//! | unsynced directory op lost or kept | the journal commit holding the create/rename/remove had or had not happened | each undecided dir op reaches disk with `dir_op_survival`; a rename is atomic (both halves or neither) |
//! | failed `fsync` | Linux since 4.13 ("fsyncgate", PostgreSQL 2018): after a writeback error the dirty pages are marked clean and the error is reported once | the file's unsynced writes become *unknown*: a power loss may keep or drop each, and a later successful `sync` does **not** make them durable; the process still reads them (they stay in the page cache). A failed `sync_dir` changes nothing: its dir ops stay undecided and a later `sync_dir` makes them durable (journal commits are retried) |
//!
//! **Restart.** [`SimFs::restart`] applies a [`CrashMode`] and reboots:
//! - `ProcessCrash`: the OS survives, so the disk is exactly the visible
//!   image; nothing becomes durable that was not (a later power loss can
//!   still drop unsynced writes made before the process crash).
//! - `PowerLoss(model)`: each inode falls back to its durable image plus the
//!   seeded subset of undecided writes; the namespace to its durable entries
//!   plus the seeded subset of undecided dir ops; entries whose directory did
//!   not survive are dropped, and inodes no entry names are gone (a file
//!   `sync`ed but never `sync_dir`ed can vanish).
//!
//! A directory op is durable under [`DirModel::Strict`] once `sync_dir` of a
//! directory it changes completes (for a cross-directory rename either
//! directory suffices: the rename is one journal transaction).
//! Under [`DirModel::Eager`] (ext4 data=ordered, where `fsync` commits the
//! running journal transaction) it is also durable once a later `sync` of a
//! file `f` completes, when the op (a) changes an entry of `f`'s directory,
//! (b) creates or renames `f`'s inode (wherever), or (c) creates a directory
//! that is an ancestor of `f`. Removes elsewhere stay undecided.
//!
//! **Capture mode.** [`SimFs::set_capture`] makes every point first record
//! the [`CrashImage`] a `CrashAt` there would leave — the same draws, made
//! on a copy of the image and the RNG — and then run normally, so one
//! crash-free run yields the crash state of every point;
//! [`CrashImage::reboot`] applies a [`CrashMode`] to one. The harness's
//! forked sweep is built on it (ALICE and CrashMonkey construct crash
//! states from a recorded trace the same way).
//!
//! **Inspecting.** [`SimFs::disk_image`] is the process's view (the disk,
//! right after a restart); [`SimFs::durable_image`] the disk if nothing
//! undecided reached it; [`SimFs::undecided`] lists what a power loss could
//! still decide, for failure reports.
//!
//! # Compared with turmoil-fs
//!
//! Read: `tokio-rs/turmoil`, `crates/turmoil-fs/src/lib.rs`. It agrees with
//! us that writes are pending until `sync_all` (data only, not the entry),
//! that `sync_dir` makes a directory's creates/renames/removes durable, that
//! a never-dir-synced file is deleted by a crash, that torn writes are
//! prefixes, and that one seeded RNG makes every choice; its options are
//! plain config fields, as ours are. It differs: turmoil-fs drops *all*
//! pending data at a crash and instead flushes randomly during the run
//! (`sync_probability`), where we decide at power-loss time which subset of
//! unsynced writes survived (so the same op sequence can be ended by any
//! crash mode and every undecided write is a real choice); it tears by `block_size`, we by byte; it injects EIO
//! by probability (`io_error_probability`) and ENOSPC by `capacity`, where
//! we name the exact I/O point; it tracks pending ops by path, we by inode. It models file
//! descriptors, permissions, timestamps, links, O_DIRECT, latency, a page
//! cache and read corruption, which our path-based seam does not need.
//! Ours adds: the crash counter (`CrashAt`, sweepable point by point), the
//! labelled trace, lost replies, failed-fsync "unknown" data, a process
//! crash distinct from power loss, both directory models, a power cut in
//! the middle of an `fsync` (a seeded subset of the file's dirty pages,
//! each whole, in no order) and of a directory fsync, and it backs a
//! SQLite VFS and runs under madsim (an explicit handle, no thread-local
//! context), not turmoil. Short reads both have (ours keyed by point
//! number, so they never shift a later draw). Its read corruption returns
//! wrong bytes from a read; our [`SimFs::rot`] changes the bytes at rest,
//! which is what a checksum on the next read must catch.
//!
//! # Compared with LazyFS
//!
//! LazyFS (`dsrhaslab/lazyfs`, the FUSE layer Jepsen uses) keeps unsynced
//! data in its own page cache and drops it on a `clear-cache` command, and
//! its recent releases tear writes and crash before or after a named
//! operation. That is our power loss with every unsynced write lost, on a
//! real kernel path (our FUSE layer applies SimFs's choices the same way).
//! Beyond its documented faults, SimFs decides each unsynced write's fate
//! by seed (any subset, torn), cuts an `fsync` midway at page
//! granularity, models both directory models, failed-fsync "unknown" data,
//! lost replies, short reads and bit rot at rest; LazyFS runs unmodified
//! binaries, which SimFs cannot.

mod hash;
mod inode;
mod key;
mod ops;
mod pages;
mod power;
mod report;
mod state;
mod types;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use types::{CrashMode, DirModel, FailKind, Fault, IoOp, Outcome, SimConfig, TraceEntry};

use state::Image;

/// How much of the op at a crash point took effect (decided by `point`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Apply {
    Whole,
    /// A write lands as a strict prefix chosen by this draw.
    Torn(u64),
}

impl Apply {
    /// The bytes of `data` this application writes.
    fn cut(self, data: &[u8]) -> &[u8] {
        match self {
            Apply::Torn(draw) if data.len() > 1 => {
                let keep = 1 + (draw % (data.len() as u64 - 1)) as usize;
                &data[..keep]
            }
            _ => data,
        }
    }
}

#[derive(Debug)]
struct State {
    image: Image,
    points: u64,
    fault: Option<Fault>,
    crashed: bool,
    trace: Vec<TraceEntry>,
    rng: ChaCha8Rng,
    /// Capture mode: the crash image of every point, in order.
    captures: Option<Vec<CrashImage>>,
}

/// A whole disk image kept aside ([`SimFs::backup`]): an operator's
/// backup of the root, put back with [`SimFs::restore_backup`].
#[derive(Debug, Clone)]
pub struct DiskBackup(Image);

/// The disk of a process killed at one I/O point, before the reboot:
/// exactly what `Fault::CrashAt(point)` leaves, random draws included (see
/// [`SimFs::set_capture`]).
#[derive(Debug, Clone)]
pub struct CrashImage {
    point: u64,
    image: Image,
    rng: ChaCha8Rng,
    config: Arc<SimConfig>,
}

impl CrashImage {
    /// The point the process died at.
    pub fn point(&self) -> u64 {
        self.point
    }

    /// The durable floor of this crash image (see
    /// [`SimFs::durable_image`]) restricted to the paths `wanted` accepts.
    pub fn durable_image_where(&self, wanted: impl Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
        durable_where(&self.image, wanted)
    }

    /// The disk after rebooting from this crash with `mode`: the same
    /// image, point count and later random draws as the [`SimFs`] that ran
    /// into `CrashAt(point)` and was then [`SimFs::restart`]ed with `mode`.
    /// Its trace starts empty (at point `point + 1`).
    /// (By value: the image is the disk; clone the `CrashImage` to reboot
    /// it under several modes.)
    pub fn reboot(self, mode: CrashMode) -> SimFs {
        let fs = SimFs {
            config: self.config,
            state: Arc::new(Mutex::new(State {
                image: self.image,
                points: self.point,
                fault: None,
                crashed: true,
                trace: Vec::new(),
                rng: self.rng,
                captures: None,
            })),
            locks: Default::default(),
        };
        fs.restart(mode);
        fs
    }
}

/// A quiet [`SimFs`]'s disk, point count and trace (see
/// [`SimFs::snapshot`]).
#[derive(Debug, Clone)]
pub struct SimSnapshot {
    image: Image,
    points: u64,
    trace: Vec<TraceEntry>,
}

impl SimSnapshot {
    /// I/O points the snapshot's run performed.
    pub fn points(&self) -> u64 {
        self.points
    }
}

/// The simulated disk. Cheap to clone: clones share one disk.
#[derive(Debug, Clone)]
pub struct SimFs {
    config: Arc<SimConfig>,
    state: Arc<Mutex<State>>,
    /// Exclusive locks held by the simulated process (not disk state).
    locks: super::lock::SimLocks,
}

fn crash_error() -> io::Error {
    io::Error::other("simulated crash: the process is dead; call SimFs::restart")
}

impl SimFs {
    pub fn new(config: SimConfig) -> Self {
        let config = config.sanitized();
        let state = State {
            image: Image::new(),
            points: 0,
            fault: None,
            crashed: false,
            trace: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            captures: None,
        };
        SimFs {
            config: Arc::new(config),
            state: Arc::new(Mutex::new(state)),
            locks: Default::default(),
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic mid-operation in a test; the state is
        // still consistent between ops, so keep going rather than cascade.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arm a fault at a future I/O point (replaces any armed fault).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.lock().fault = fault;
    }

    /// The armed fault, if any (not yet reached).
    pub fn fault(&self) -> Option<Fault> {
        self.lock().fault
    }

    /// Capture mode (ALICE-style crash states from one run): while on, every
    /// I/O point first records the [`CrashImage`] a `CrashAt` there would
    /// leave (the same draws, on a copy of the image and the RNG), then
    /// runs normally. The run itself is unchanged: same trace, same disk.
    /// Turning it off drops what was not taken.
    pub fn set_capture(&self, on: bool) {
        self.lock().captures = on.then(Vec::new);
    }

    /// The crash images captured since the last call, in point order.
    pub fn take_captures(&self) -> Vec<CrashImage> {
        self.lock()
            .captures
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Number of I/O points so far.
    pub fn points(&self) -> u64 {
        self.lock().points
    }

    /// Whether the armed crash point was hit (the process is dead).
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Whether a power loss now would change nothing: every write and
    /// directory change so far is durable (a strict directory model's
    /// `sync_dir`s included). What a recovery must leave behind before it
    /// is relied on.
    pub fn is_durable(&self) -> bool {
        self.lock().image.is_durable()
    }

    /// Apply a crash with `mode` and reboot: the process's view becomes what
    /// survived on disk, the fault is disarmed, I/O works again. Point
    /// numbering and the trace continue.
    pub fn restart(&self, mode: CrashMode) {
        let mut s = self.lock();
        let s = &mut *s;
        if let CrashMode::PowerLoss(model) = mode {
            let mut chooser = power::Seeded {
                rng: &mut s.rng,
                config: &self.config,
            };
            let disk = power::resolve(&s.image, model, &mut chooser);
            s.image.install(disk.ns, disk.data);
        }
        s.crashed = false;
        s.fault = None;
        // The process that held them is gone.
        self.locks.clear();
        tracing::debug!(?mode, points = s.points, "simfs restart");
    }

    /// The disk as it is now, with the point count and the trace, to start
    /// other runs from ([`SimFs::from_snapshot`]). `None` unless the disk
    /// is quiet: not crashed, no fault armed, and no random draw made yet
    /// (a run from the snapshot then differs from one that made the same
    /// calls only by its seed, which decides later draws).
    pub fn snapshot(&self) -> Option<SimSnapshot> {
        let s = self.lock();
        let quiet = !s.crashed && s.fault.is_none() && s.rng.get_word_pos() == 0;
        quiet.then(|| SimSnapshot {
            image: s.image.clone(),
            points: s.points,
            trace: s.trace.clone(),
        })
    }

    /// A disk in `snapshot`'s state whose later random draws come from
    /// `config`'s seed: the same disk a fresh `SimFs::new(config)` would be
    /// after the snapshot's calls, since those made no draws.
    pub fn from_snapshot(snapshot: &SimSnapshot, config: SimConfig) -> Self {
        let fs = SimFs::new(config);
        {
            let mut s = fs.lock();
            s.image = snapshot.image.clone();
            s.points = snapshot.points;
            s.trace = snapshot.trace.clone();
        }
        fs
    }

    /// A disk of its own holding this one's image (visible, durable and
    /// undecided state alike; pages shared copy-on-write, so it is cheap),
    /// with no fault, no trace and point count 0, drawing from `config`'s
    /// seed. For a check that reads the disk beside the run: its calls
    /// count no point here, draw nothing from this disk's RNG and cannot
    /// trip a fault armed here, so the run's trace is the same with or
    /// without the check.
    pub fn detached(&self, config: SimConfig) -> SimFs {
        let fs = SimFs::new(config);
        let image = self.lock().image.clone();
        fs.lock().image = image;
        fs
    }

    /// The labelled trace of every I/O point so far.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.lock().trace.clone()
    }

    /// The trace from point `first` on: what a report around a recent
    /// point needs, without copying the whole run's trace.
    pub fn trace_from(&self, first: u64) -> Vec<TraceEntry> {
        let s = self.lock();
        let start = s.trace.partition_point(|e| e.point < first);
        s.trace[start..].to_vec()
    }

    /// The files the process sees, by path. Right after a `restart` this is
    /// the disk.
    pub fn disk_image(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.lock().image.visible_files()
    }

    /// [`SimFs::disk_image`] restricted to the paths `wanted` accepts: a
    /// checker that reads only the logs need not copy the database.
    pub fn disk_image_where(&self, wanted: impl Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
        self.lock().image.visible_files_where(wanted)
    }

    /// The disk a power loss leaves if nothing undecided reached it (under
    /// either [`DirModel`]): synced data under `sync_dir`ed entries. This
    /// is the floor for a file nothing touched since its last `sync` and
    /// `sync_dir`; a later, undecided write, rename or remove may still
    /// change it on the real post-crash disk.
    pub fn durable_image(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let s = self.lock();
        let disk = power::resolve(&s.image, DirModel::Strict, &mut power::Nothing);
        state::files_of(&disk.ns, |ino| disk.data.get(&ino))
    }

    /// [`SimFs::durable_image`] restricted to the paths `wanted` accepts.
    pub fn durable_image_where(&self, wanted: impl Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
        let s = self.lock();
        durable_where(&s.image, wanted)
    }

    /// Bit rot at rest (a latent sector error the drive did not report, a
    /// bit flipped in DRAM or on the bus on its way to the platter):
    /// XOR byte `offset` of `path` with `mask`, on the disk and in the
    /// process's view alike. Not an I/O point (nothing traced, nothing
    /// counted, no draw): the harness places it right after a
    /// [`SimFs::restart`], when the page cache is cold. It hits the durable
    /// bytes; the process sees it wherever no later write covers the byte.
    /// Past the durable bytes: an `InvalidInput` error and no change.
    pub fn rot(&self, path: &Path, offset: u64, mask: u8) -> io::Result<()> {
        let mut s = self.lock();
        let inode = s.image.inode_mut(&key::Arg::new(path))?;
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at >= inode.base.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: cannot rot byte {offset}: past the durable bytes ({})",
                    path.display(),
                    inode.base.len()
                ),
            ));
        }
        inode.base.xor(at, mask);
        let mut visible = inode.base.clone();
        inode.log.iter().for_each(|e| e.op.apply(&mut visible));
        inode.visible = visible;
        Ok(())
    }

    /// A copy of the disk at rest, for [`SimFs::restore_backup`] (pages
    /// shared copy-on-write, so it is cheap). Not an I/O point.
    pub fn backup(&self) -> DiskBackup {
        DiskBackup(self.lock().image.clone())
    }

    /// The operator restored the whole root from `backup`: the disk and
    /// the process's view are that image again. Not an I/O point (nothing
    /// traced, counted or drawn); the harness calls it only between boots.
    pub fn restore_backup(&self, backup: &DiskBackup) {
        self.lock().image = backup.0.clone();
    }

    /// A file or directory lost at rest (deleted by hand, a lost directory
    /// block): `path` and everything under it leave the disk and the
    /// process's view. Not an I/O point; as [`SimFs::rot`], only right
    /// after a [`SimFs::restart`] (nothing pending). `NotFound` if absent.
    pub fn lose(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        debug_assert!(s.image.dir_log.is_empty(), "lose: only on a disk at rest");
        let gone = |k: &key::Key| k.to_path_buf().starts_with(path);
        if !s.image.ns.keys().any(gone) {
            return Err(state::not_found(path));
        }
        s.image.ns.retain(|k, _| !gone(k));
        s.image.ns_base.retain(|k, _| !gone(k));
        // Its files' inodes die with the names (no name reaches them).
        s.image.collect_garbage();
        Ok(())
    }

    /// Files copied in at rest from another disk (an operator copies
    /// `store.db` back from an older backup, or from another root): every
    /// file `wanted` accepts leaves this disk, and each file `wanted`
    /// accepts in `from` takes its place with the bytes the process saw
    /// there, durable. Not an I/O point; as [`SimFs::lose`], only on a disk
    /// at rest, and the files' directories must exist here. Returns the
    /// paths copied in.
    pub fn copy_in(&self, from: &DiskBackup, wanted: impl Fn(&Path) -> bool) -> io::Result<Vec<PathBuf>> {
        let mut s = self.lock();
        debug_assert!(s.image.dir_log.is_empty(), "copy_in: only on a disk at rest");
        let copies: Vec<(PathBuf, pages::Pages)> = from
            .0
            .ns
            .iter()
            .filter_map(|(k, n)| match n {
                state::Node::File(ino) => Some((k.to_path_buf(), *ino)),
                state::Node::Dir => None,
            })
            .filter(|(p, _)| wanted(p))
            .filter_map(|(p, ino)| from.0.inodes.get(&ino).map(|i| (p, i.visible.clone())))
            .collect();
        for (path, _) in &copies {
            let parent = path.parent().map(key::Key::new);
            if !parent.is_some_and(|d| matches!(s.image.ns.get(&d), Some(state::Node::Dir))) {
                return Err(state::not_found(path));
            }
        }
        s.image
            .ns
            .retain(|k, n| !(matches!(n, state::Node::File(_)) && wanted(&k.to_path_buf())));
        s.image
            .ns_base
            .retain(|k, n| !(matches!(n, state::Node::File(_)) && wanted(&k.to_path_buf())));
        for (path, bytes) in &copies {
            s.image.adopt_file(key::Key::new(path), bytes.clone());
        }
        s.image.collect_garbage();
        Ok(copies.into_iter().map(|(p, _)| p).collect())
    }

    /// A file cut short at rest to `len` bytes (emptied, or lines lost off
    /// its end by a hand edit or a bad restore), on the disk and in the
    /// process's view. Not an I/O point; as [`SimFs::lose`].
    pub fn cut(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        let inode = s.image.inode_mut(&key::Arg::new(path))?;
        debug_assert!(inode.log.is_empty(), "cut: only on a disk at rest");
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(inode.base.len());
        inode.base.truncate(len);
        inode.visible = inode.base.clone();
        Ok(())
    }

    /// Stable hash (FNV-1a) of the visible image: paths, directories and
    /// file bytes.
    pub fn image_hash(&self) -> u64 {
        let mut h = hash::ImageHasher::default();
        self.visit_pages(|path, bytes| h.entry(path, bytes));
        h.finish()
    }

    /// Visit the visible image in path order: `f(path, Some(bytes))` for
    /// a file, `f(path, None)` for a directory. For a checker that hashes
    /// the disk its own way (the harness's verdict cache hashes a SQLite
    /// WAL only as far as its last commit frame).
    pub fn visit_image(&self, mut f: impl FnMut(&Path, Option<&[u8]>)) {
        // The visitor wants each file's bytes contiguous: a file of more
        // than one page is copied once per version (`Pages::contiguous`).
        self.visit_pages(|path, bytes| f(path, bytes.map(pages::Pages::contiguous)));
    }

    /// [`SimFs::visit_image`] with each file as its [`FileVersion`]: a
    /// checker that digests every crash image of a sweep digests each
    /// version of a file once ([`FileVersion::digest`]), however many
    /// images share it.
    pub fn visit_versions(&self, mut f: impl FnMut(&Path, Option<FileVersion<'_>>)) {
        self.visit_pages(|path, bytes| f(path, bytes.map(FileVersion)));
    }

    /// [`SimFs::visit_image`] with each file's bytes as its pages.
    fn visit_pages(&self, mut f: impl FnMut(&Path, Option<&pages::Pages>)) {
        let s = self.lock();
        let empty = pages::Pages::default();
        let mut spelled = Vec::new();
        for (key, node) in &s.image.ns {
            spelled.clear();
            key.as_ref().spell_into(&mut spelled);
            let path = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
                &spelled,
            ));
            match node {
                state::Node::Dir => f(path, None),
                state::Node::File(ino) => {
                    f(path, Some(s.image.inodes.get(ino).map_or(&empty, |i| &i.visible)))
                }
            }
        }
    }

    /// Stable hash (FNV-1a) of the trace: point, op, outcome, path, label.
    pub fn trace_hash(&self) -> u64 {
        hash::trace_hash(&self.lock().trace)
    }

    /// Run one I/O point: count it, fire the armed fault if it is this
    /// point, apply `f` to the image as the fault dictates, trace it.
    fn point<T>(
        &self,
        op: IoOp,
        path: &Path,
        to: Option<&Path>,
        label: &str,
        mut f: impl FnMut(&mut Image, Apply) -> io::Result<T>,
    ) -> io::Result<T> {
        self.numbered_point(op, path, to, label, |image, apply, _| f(image, apply))
    }

    /// [`SimFs::point`] for an op whose effect depends on its point number
    /// (a short read).
    fn numbered_point<T>(
        &self,
        op: IoOp,
        path: &Path,
        to: Option<&Path>,
        label: &str,
        mut f: impl FnMut(&mut Image, Apply, u64) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut s = self.lock();
        let s = &mut *s;
        if s.crashed {
            return Err(crash_error());
        }
        s.points += 1;
        let point = s.points;
        let fault = s.fault.filter(|f| match f {
            Fault::CrashAt(n) | Fault::FailAt(n, _) | Fault::LostReplyAt(n) => *n == point,
        });
        if fault.is_none() {
            if let Some(captures) = s.captures.as_mut() {
                let mut image = s.image.clone();
                let mut rng = s.rng.clone();
                crash_effect(&self.config, &mut rng, &mut image, &mut |i, a| f(i, a, point));
                captures.push(CrashImage {
                    point,
                    image,
                    rng,
                    config: Arc::clone(&self.config),
                });
            }
        }
        let (result, outcome) = match fault {
            Some(Fault::CrashAt(_)) => {
                s.crashed = true;
                crash_effect(&self.config, &mut s.rng, &mut s.image, &mut |i, a| f(i, a, point));
                (Err(crash_error()), Outcome::Crashed)
            }
            Some(Fault::FailAt(_, kind)) => {
                if op == IoOp::Sync {
                    if let Ok(inode) = s.image.inode_mut(&key::Arg::new(path)) {
                        inode.sync_failed();
                    }
                }
                let err = match kind {
                    FailKind::Eio => io::Error::other(format!(
                        "simulated EIO at I/O point {point} on {}",
                        path.display()
                    )),
                    FailKind::Enospc => io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!("simulated ENOSPC at I/O point {point} on {}", path.display()),
                    ),
                };
                (Err(err), Outcome::Failed(kind))
            }
            Some(Fault::LostReplyAt(_)) => {
                let _ = f(&mut s.image, Apply::Whole, point);
                let err = io::Error::other(format!(
                    "simulated lost reply at I/O point {point} on {}: the op may have happened",
                    path.display()
                ));
                (Err(err), Outcome::LostReply)
            }
            None => {
                let r = f(&mut s.image, Apply::Whole, point);
                let o = if r.is_ok() { Outcome::Ok } else { Outcome::Err };
                (r, o)
            }
        };
        let mut traced = shown(path);
        if let Some(to) = to {
            traced.push_str(" -> ");
            traced.push_str(&shown(to));
        }
        s.trace.push(TraceEntry {
            point,
            op,
            path: traced,
            label: label.to_string(),
            outcome,
        });
        result
    }
}

/// One version of a file's bytes in an image ([`SimFs::visit_versions`]):
/// the same version (bytes no write has changed since) is shared by every
/// image that holds it, and so is what is remembered of it.
pub struct FileVersion<'a>(&'a pages::Pages);

impl FileVersion<'_> {
    /// The bytes, contiguous (copied once per version).
    pub fn bytes(&self) -> &[u8] {
        self.0.contiguous()
    }

    /// `digest` of the bytes, remembered in `slot` (0 or 1) for this
    /// version: computed by the first caller, then shared. Each slot must
    /// always be filled by one function (the harness's verdict cache is
    /// the one user); a slot out of range computes afresh.
    pub fn digest(&self, slot: usize, digest: impl FnOnce(&[u8]) -> u64) -> u64 {
        self.0.digest(slot, digest)
    }
}

/// The files of `image`'s durable floor whose path `wanted` accepts.
fn durable_where(image: &Image, wanted: impl Fn(&Path) -> bool) -> BTreeMap<PathBuf, Vec<u8>> {
    let disk = power::resolve(image, DirModel::Strict, &mut power::Nothing);
    // Copy only the bytes of the files wanted.
    disk.ns
        .iter()
        .filter_map(|(key, node)| match node {
            state::Node::File(ino) => Some((key.to_path_buf(), *ino)),
            state::Node::Dir => None,
        })
        .filter(|(path, _)| wanted(path))
        .filter_map(|(path, ino)| disk.data.get(&ino).map(|bytes| (path, bytes.to_vec())))
        .collect()
}

/// What a crash at a point does to the op it interrupts: done with
/// `crash_point_done_probability` (a write possibly torn), else nothing.
/// The process is dead: nobody sees the op's result.
fn crash_effect<T>(
    config: &SimConfig,
    rng: &mut ChaCha8Rng,
    image: &mut Image,
    f: &mut impl FnMut(&mut Image, Apply) -> io::Result<T>,
) {
    if rng.random_bool(config.crash_point_done_probability) {
        let apply = if rng.random_bool(config.torn_write_probability) {
            Apply::Torn(rng.random())
        } else {
            Apply::Whole
        };
        let _ = f(image, apply);
    }
}

/// `path.display().to_string()`, without the formatter for UTF-8 paths.
fn shown(path: &Path) -> String {
    match path.to_str() {
        Some(s) => s.to_owned(),
        None => path.display().to_string(),
    }
}
