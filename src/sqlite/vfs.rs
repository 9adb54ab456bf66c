//! Registration of one SQLite VFS per `Fs`, and its VFS-level callbacks
//! (open, delete, access, full pathname, randomness, sleep, time).
//!
//! Lifetime scheme: [`Vfs::for_fs`] returns the live VFS for an
//! `Arc<dyn Fs>` (looked up by the Arc's data pointer) or registers a new
//! one named `durable-agent-<counter>`. Every [`super::Db`] holds an
//! `Arc<Vfs>` and closes its connection before dropping it; the last drop
//! unregisters the VFS, after which nothing refers to it. So independent
//! `Fs`es (one per test or sim case) get independent VFSes, while
//! connections on one `Fs` share one lock table and one wal-index, like
//! connections of one process. Caveat: two *different* `Arc`s around clones
//! of one `SimFs` are two processes to this scheme; open every connection
//! of a simulated process from the same `Arc<dyn Fs>`.
//!
//! Invariant: `pAppData` of the registered `sqlite3_vfs` points at this
//! VFS's [`VfsInner`], which outlives the registration (the `Vfs` owns an
//! `Arc` to it, and open files own their own `Arc`).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use libsqlite3_sys as ffi;
use rand::RngCore;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::error::{io_to_code, IoStep, SqliteError};
use super::file::{self, Kind};
use super::lock::LockTable;
use super::shm::ShmTable;
use crate::canary::{Canaries, Canary};
use crate::fs::Fs;

/// Julian day number of 1970-01-01 in milliseconds (SQLite's epoch offset).
const UNIX_EPOCH_JULIAN_MS: i64 = 210_866_760_000_000;
const MAX_PATHNAME: c_int = 1024;

/// Run a callback body, turning a panic into `on_panic`: unwinding across
/// the FFI boundary into SQLite's C frames is undefined behaviour.
pub(crate) fn guard(on_panic: c_int, f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// State shared by the VFS and every file it opened.
#[derive(Debug)]
pub(crate) struct VfsInner {
    pub(crate) fs: Arc<dyn Fs>,
    pub(crate) locks: LockTable,
    pub(crate) shm: ShmTable,
    rng: Mutex<ChaCha8Rng>,
    clock_unix_ms: AtomicI64,
    last_error: Mutex<Option<String>>,
    /// The `NonLoopingReader` canary (always `false` in production).
    pub(crate) one_read_is_enough: bool,
}

impl VfsInner {
    /// Remember an io error so the typed error can say what the seam said.
    pub(crate) fn record(&self, what: String) {
        tracing::debug!(error = %what, "sqlite vfs io error");
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(what);
    }

    fn take_last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A registered SQLite VFS routing every file operation through one `Fs`.
pub struct Vfs {
    inner: Arc<VfsInner>,
    raw: Box<ffi::sqlite3_vfs>,
    name: CString,
}

// SAFETY: `raw` is only read by SQLite (under its own mutexes) after
// registration and never mutated by us; `inner` is Send + Sync.
unsafe impl Send for Vfs {}
// SAFETY: as above; no interior mutation through `&Vfs` touches `raw`.
unsafe impl Sync for Vfs {}

impl std::fmt::Debug for Vfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfs")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);
static REGISTRY: Mutex<BTreeMap<usize, Weak<Vfs>>> = Mutex::new(BTreeMap::new());

impl Vfs {
    /// The live VFS for `fs`, or a newly registered one. `seed` seeds
    /// `xRandomness` and `clock_unix_ms` starts the logical clock; both only
    /// apply when this call registers the VFS.
    pub fn for_fs(
        fs: &Arc<dyn Fs>,
        seed: u64,
        clock_unix_ms: i64,
        canaries: &Canaries,
    ) -> Result<Arc<Vfs>, SqliteError> {
        let key = Arc::as_ptr(fs).cast::<()>() as usize;
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|_, w| w.strong_count() > 0);
        if let Some(vfs) = registry.get(&key).and_then(Weak::upgrade) {
            return Ok(vfs);
        }
        let vfs = Arc::new(Vfs::register(fs.clone(), seed, clock_unix_ms, canaries)?);
        registry.insert(key, Arc::downgrade(&vfs));
        Ok(vfs)
    }

    fn register(
        fs: Arc<dyn Fs>,
        seed: u64,
        clock_unix_ms: i64,
        canaries: &Canaries,
    ) -> Result<Vfs, SqliteError> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name_str = format!("durable-agent-{id}");
        let name = CString::new(name_str.clone()).map_err(|e| SqliteError::BadPath {
            path: PathBuf::from(&name_str),
            reason: e.to_string(),
        })?;
        let inner = Arc::new(VfsInner {
            fs,
            locks: LockTable::default(),
            shm: ShmTable::default(),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            clock_unix_ms: AtomicI64::new(clock_unix_ms),
            last_error: Mutex::new(None),
            one_read_is_enough: canaries.has(Canary::NonLoopingReader),
        });
        let raw = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: file::RAW_FILE_SIZE,
            mxPathname: MAX_PATHNAME,
            pNext: std::ptr::null_mut(),
            zName: name.as_ptr(),
            pAppData: Arc::as_ptr(&inner) as *mut c_void,
            xOpen: Some(file::x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        let mut vfs = Vfs { inner, raw, name };
        // SAFETY: `raw` is a fully initialised sqlite3_vfs at a stable heap
        // address whose name and app data live as long as `vfs`; Drop
        // unregisters it before freeing either. makeDflt=0 keeps the default.
        let rc = unsafe { ffi::sqlite3_vfs_register(&mut *vfs.raw, 0) };
        if rc != ffi::SQLITE_OK {
            return Err(SqliteError::Register {
                name: name_str,
                code: rc,
            });
        }
        tracing::debug!(vfs = %name_str, "registered sqlite vfs");
        Ok(vfs)
    }

    /// The name the VFS is registered under.
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("durable-agent-?")
    }

    /// The registered `sqlite3_vfs`, for calling callbacks directly in tests.
    #[cfg(test)]
    pub(crate) fn raw_ptr(&self) -> *mut ffi::sqlite3_vfs {
        std::ptr::from_ref::<ffi::sqlite3_vfs>(&self.raw).cast_mut()
    }

    /// Set the logical clock SQLite reads through xCurrentTime.
    pub fn set_clock_unix_ms(&self, ms: i64) {
        self.inner.clock_unix_ms.store(ms, Ordering::SeqCst);
    }

    /// The last io error the seam returned through this VFS, if any.
    pub fn take_last_error(&self) -> Option<String> {
        self.inner.take_last_error()
    }
}

impl Drop for Vfs {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; every Db holding this Vfs has
        // closed its connection first (Db drops its Connection before its
        // Arc<Vfs>), so SQLite holds no reference to it any more.
        unsafe { ffi::sqlite3_vfs_unregister(&mut *self.raw) };
    }
}

/// The VfsInner behind a `sqlite3_vfs` pointer.
///
/// # Safety
/// `vfs` must be a VFS registered by [`Vfs::register`] and still alive.
pub(crate) unsafe fn inner<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a VfsInner {
    // SAFETY: per the contract, pAppData points at a live VfsInner.
    unsafe { &*((*vfs).pAppData as *const VfsInner) }
}

/// Copy a C path into a PathBuf (None for NULL).
///
/// # Safety
/// `z` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn c_path(z: *const c_char) -> Option<PathBuf> {
    if z.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let s = unsafe { CStr::from_ptr(z) };
    Some(PathBuf::from(s.to_string_lossy().into_owned()))
}

/// The directory whose entry names `path` (`.` for a bare name).
pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

unsafe extern "C" fn x_delete(vfs: *mut ffi::sqlite3_vfs, z: *const c_char, dir_sync: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_DELETE, || {
        // SAFETY: SQLite passes our registered VFS and a valid name.
        let (inner, path) = unsafe { (inner(vfs), c_path(z)) };
        let Some(path) = path else {
            return ffi::SQLITE_IOERR_DELETE;
        };
        let kind = Kind::from_name(&path);
        if let Err(e) = inner.fs.remove(&path, &format!("sqlite {kind} delete")) {
            inner.record(format!("{}: delete: {e}", path.display()));
            return io_to_code(IoStep::Delete, &e);
        }
        // os_unix.c unixDelete: fsync the directory when asked (the pager
        // asks for the journal under synchronous=EXTRA).
        if dir_sync & 1 != 0 {
            let dir = parent_dir(&path);
            if let Err(e) = inner
                .fs
                .sync_dir(&dir, &format!("sqlite dir sync after {kind} delete"))
            {
                inner.record(format!("{}: dir sync: {e}", dir.display()));
                return io_to_code(IoStep::DirSync, &e);
            }
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    z: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    guard(ffi::SQLITE_IOERR_ACCESS, || {
        // SAFETY: SQLite passes our registered VFS and a valid name.
        let (inner, path) = unsafe { (inner(vfs), c_path(z)) };
        let Some(path) = path else {
            return ffi::SQLITE_IOERR_ACCESS;
        };
        let kind = Kind::from_name(&path);
        // Like unixAccess: an empty regular file counts as absent, so a
        // zero-length journal is never mistaken for a hot one.
        let found = match inner.fs.exists(&path, &format!("sqlite {kind} access")) {
            Ok(false) => Ok(false),
            Ok(true) => match inner.fs.len(&path, &format!("sqlite {kind} access size")) {
                Ok(n) => Ok(n > 0),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true), // a directory
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match found {
            Ok(b) => {
                // SAFETY: SQLite passes a valid out pointer.
                unsafe { *out = c_int::from(b) };
                ffi::SQLITE_OK
            }
            Err(e) => {
                inner.record(format!("{}: access: {e}", path.display()));
                io_to_code(IoStep::Access, &e)
            }
        }
    })
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    z: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    guard(ffi::SQLITE_CANTOPEN_FULLPATH, || {
        // The Fs seam is path-based and resolves paths itself, so the name
        // SQLite was given is already the full name for this VFS.
        // SAFETY: SQLite passes a NUL-terminated name.
        let bytes = unsafe { CStr::from_ptr(z) }.to_bytes_with_nul();
        if bytes.len() > n_out as usize {
            return ffi::SQLITE_CANTOPEN_FULLPATH;
        }
        // SAFETY: `out` has room for n_out >= bytes.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len()) };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_dl_open(_vfs: *mut ffi::sqlite3_vfs, _z: *const c_char) -> *mut c_void {
    std::ptr::null_mut() // extensions are not loaded through this VFS
}

unsafe extern "C" fn x_dl_error(_vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) {
    let msg = b"extension loading is not supported by the durable-agent VFS\0";
    if n > 0 && !out.is_null() {
        let len = msg.len().min(n as usize);
        // SAFETY: `out` has room for n bytes; we write at most n and end with NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr().cast::<c_char>(), out, len);
            *out.add(len - 1) = 0;
        }
    }
}

type DlSym = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn x_dl_sym(_vfs: *mut ffi::sqlite3_vfs, _h: *mut c_void, _z: *const c_char) -> DlSym {
    None
}

unsafe extern "C" fn x_dl_close(_vfs: *mut ffi::sqlite3_vfs, _h: *mut c_void) {}

// Deterministic from the VFS seed. SQLite itself seeds its PRNG from the
// *default* VFS's xRandomness, or, once SQLITE_TESTCTRL_PRNG_SEED set a
// seed (as `connection::open` does), from that seed alone; this callback
// covers any other caller.
unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    guard(0, || {
        // SAFETY: our VFS; `out` has room for n bytes.
        let (inner, buf) = unsafe {
            (
                inner(vfs),
                std::slice::from_raw_parts_mut(out.cast::<u8>(), n.max(0) as usize),
            )
        };
        inner
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fill_bytes(buf);
        n
    })
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    // Never sleep: a simulated process has no wall clock, and a busy lock in
    // one process cannot clear by waiting.
    micros
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    guard(ffi::SQLITE_ERROR, || {
        // SAFETY: our VFS; valid out pointer.
        let inner = unsafe { inner(vfs) };
        let ms = UNIX_EPOCH_JULIAN_MS + inner.clock_unix_ms.load(Ordering::SeqCst);
        // SAFETY: valid out pointer from SQLite.
        unsafe { *out = ms as f64 / 86_400_000.0 };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_current_time_int64(vfs: *mut ffi::sqlite3_vfs, out: *mut ffi::sqlite3_int64) -> c_int {
    guard(ffi::SQLITE_ERROR, || {
        // SAFETY: our VFS.
        let inner = unsafe { inner(vfs) };
        // SAFETY: valid out pointer from SQLite.
        unsafe { *out = UNIX_EPOCH_JULIAN_MS + inner.clock_unix_ms.load(Ordering::SeqCst) };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_get_last_error(_vfs: *mut ffi::sqlite3_vfs, _n: c_int, _out: *mut c_char) -> c_int {
    0
}
