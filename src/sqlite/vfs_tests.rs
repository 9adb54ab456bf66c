//! Calls the VFS callbacks directly, as SQLite would, to pin behaviour SQL
//! cannot reach reliably: short reads, error-code mapping, one-time
//! directory sync, delete semantics, and panics caught at the boundary.

use std::ffi::{c_int, c_void, CString};
use std::io;
use std::path::Path;
use std::sync::Arc;

use libsqlite3_sys as ffi;

use super::vfs::Vfs;
use crate::canary::Canaries;
use crate::fs::sim::FailKind;
use crate::fs::{Fault, Fs, OpenMode, SimConfig, SimFs};

/// Memory for one `sqlite3_file` of `vfs`, 8-byte aligned.
fn file_mem(vfs: *mut ffi::sqlite3_vfs) -> Vec<u64> {
    // SAFETY: a registered, live VFS.
    let size = unsafe { (*vfs).szOsFile } as usize;
    vec![0u64; size.div_ceil(8)]
}

fn open_file(vfs: *mut ffi::sqlite3_vfs, mem: &mut [u64], name: &CString, flags: c_int) -> c_int {
    let mut out = 0;
    // SAFETY: `mem` holds szOsFile bytes; `name` is NUL-terminated.
    unsafe { (*vfs).xOpen.unwrap()(vfs, name.as_ptr(), mem.as_mut_ptr().cast(), flags, &mut out) }
}

fn methods(mem: &mut [u64]) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    let file = mem.as_mut_ptr().cast::<ffi::sqlite3_file>();
    // SAFETY: the file was opened successfully, so pMethods is our static table.
    (file, unsafe { &*(*file).pMethods })
}

fn sim_vfs() -> (SimFs, Arc<Vfs>) {
    let sim = SimFs::new(SimConfig::new(5));
    sim.create_dir_all(Path::new("/v"), "test").unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let vfs = Vfs::for_fs(&fs, 5, 0, &Canaries::none()).unwrap();
    (sim, vfs)
}

const RW_CREATE: c_int = ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE;

#[test]
fn short_read_zero_fills_and_io_errors_map_to_sqlite_codes() {
    let (sim, vfs) = sim_vfs();
    let p = vfs.raw_ptr();
    let mut mem = file_mem(p);
    let name = CString::new("/v/f.db").unwrap();
    assert_eq!(
        open_file(p, &mut mem, &name, RW_CREATE | ffi::SQLITE_OPEN_MAIN_DB),
        ffi::SQLITE_OK
    );
    let (f, m) = methods(&mut mem);
    let data = [7u8; 10];
    let mut buf = [0xAAu8; 20];
    // SAFETY: `f` is open; buffers are valid for the lengths given.
    unsafe {
        assert_eq!(m.xWrite.unwrap()(f, data.as_ptr().cast(), 10, 0), ffi::SQLITE_OK);
        let rc = m.xRead.unwrap()(f, buf.as_mut_ptr().cast::<c_void>(), 20, 0);
        assert_eq!(rc, ffi::SQLITE_IOERR_SHORT_READ);
        assert_eq!(&buf[..10], &data);
        assert_eq!(&buf[10..], &[0u8; 10], "short read must zero-fill");

        sim.set_fault(Some(Fault::FailAt(sim.points() + 1, FailKind::Enospc)));
        assert_eq!(
            m.xWrite.unwrap()(f, data.as_ptr().cast(), 10, 4096),
            ffi::SQLITE_FULL
        );
        sim.set_fault(Some(Fault::FailAt(sim.points() + 1, FailKind::Eio)));
        assert_eq!(
            m.xSync.unwrap()(f, ffi::SQLITE_SYNC_FULL),
            ffi::SQLITE_IOERR_FSYNC
        );
        sim.set_fault(Some(Fault::FailAt(sim.points() + 1, FailKind::Eio)));
        assert_eq!(
            m.xRead.unwrap()(f, buf.as_mut_ptr().cast(), 4, 0),
            ffi::SQLITE_IOERR_READ
        );
        let mut size = 0;
        assert_eq!(m.xFileSize.unwrap()(f, &mut size), ffi::SQLITE_OK);
        assert_eq!(size, 10);
        assert_eq!(m.xClose.unwrap()(f), ffi::SQLITE_OK);
    }
    assert!(vfs.take_last_error().is_some_and(|e| e.contains("/v/f.db")));
}

#[test]
fn new_journal_dir_syncs_once_and_delete_dir_syncs_when_asked() {
    let (sim, vfs) = sim_vfs();
    let p = vfs.raw_ptr();
    let mut mem = file_mem(p);
    let name = CString::new("/v/f.db-journal").unwrap();
    let flags = RW_CREATE | ffi::SQLITE_OPEN_MAIN_JOURNAL;
    assert_eq!(open_file(p, &mut mem, &name, flags), ffi::SQLITE_OK);
    let (f, m) = methods(&mut mem);
    // SAFETY: `f` is open; `p` is our VFS; names are NUL-terminated.
    unsafe {
        assert_eq!(m.xSync.unwrap()(f, ffi::SQLITE_SYNC_NORMAL), ffi::SQLITE_OK);
        assert_eq!(
            m.xSync.unwrap()(f, ffi::SQLITE_SYNC_FULL | ffi::SQLITE_SYNC_DATAONLY),
            ffi::SQLITE_OK
        );
        assert_eq!(m.xClose.unwrap()(f), ffi::SQLITE_OK);
        assert_eq!((*p).xDelete.unwrap()(p, name.as_ptr(), 0), ffi::SQLITE_OK);
        assert_eq!(
            (*p).xDelete.unwrap()(p, name.as_ptr(), 1),
            ffi::SQLITE_IOERR_DELETE_NOENT
        );
    }
    let ops: Vec<String> = sim
        .trace()
        .into_iter()
        .map(|t| format!("{} {}", t.label, t.path))
        .collect();
    let dir_syncs: Vec<&String> = ops.iter().filter(|l| l.starts_with("sqlite dir sync")).collect();
    assert_eq!(dir_syncs, ["sqlite dir sync new journal /v"], "{ops:#?}");
    assert!(ops.contains(&"sqlite journal sync /v/f.db-journal".to_string()));

    // With dirSync set (synchronous=EXTRA), the unlink is made durable.
    sim.open(Path::new("/v/g.db-journal"), OpenMode::Create, "test")
        .unwrap();
    let g = CString::new("/v/g.db-journal").unwrap();
    // SAFETY: our VFS; NUL-terminated name.
    assert_eq!(unsafe { (*p).xDelete.unwrap()(p, g.as_ptr(), 1) }, ffi::SQLITE_OK);
    let last: Vec<String> = sim.trace().into_iter().rev().take(2).map(|t| t.label).collect();
    assert_eq!(
        last,
        ["sqlite dir sync after journal delete", "sqlite journal delete"]
    );
}

/// An `Fs` whose every call panics, to prove no panic crosses into C.
#[derive(Debug)]
struct PanicFs;

impl Fs for PanicFs {
    fn create_dir_all(&self, _: &Path, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn open(&self, _: &Path, _: OpenMode, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn write_at(&self, _: &Path, _: u64, _: &[u8], _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn append(&self, _: &Path, _: &[u8], _: &str) -> io::Result<u64> {
        panic!("PanicFs")
    }
    fn read_at(&self, _: &Path, _: u64, _: &mut [u8], _: &str) -> io::Result<usize> {
        panic!("PanicFs")
    }
    fn read(&self, _: &Path, _: &str) -> io::Result<Vec<u8>> {
        panic!("PanicFs")
    }
    fn len(&self, _: &Path, _: &str) -> io::Result<u64> {
        panic!("PanicFs")
    }
    fn truncate(&self, _: &Path, _: u64, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn sync(&self, _: &Path, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn sync_dir(&self, _: &Path, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn rename(&self, _: &Path, _: &Path, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn remove(&self, _: &Path, _: &str) -> io::Result<()> {
        panic!("PanicFs")
    }
    fn list(&self, _: &Path, _: &str) -> io::Result<Vec<String>> {
        panic!("PanicFs")
    }
    fn exists(&self, _: &Path, _: &str) -> io::Result<bool> {
        panic!("PanicFs")
    }
}

#[test]
fn a_panicking_fs_becomes_an_error_code_not_an_abort() {
    let fs: Arc<dyn Fs> = Arc::new(PanicFs);
    let vfs = Vfs::for_fs(&fs, 0, 0, &Canaries::none()).unwrap();
    let p = vfs.raw_ptr();
    let mut mem = file_mem(p);
    let name = CString::new("/x.db").unwrap();
    assert_eq!(
        open_file(p, &mut mem, &name, RW_CREATE | ffi::SQLITE_OPEN_MAIN_DB),
        ffi::SQLITE_CANTOPEN
    );
    let mut out = 0;
    // SAFETY: our VFS; NUL-terminated name; valid out pointer.
    let rc = unsafe { (*p).xAccess.unwrap()(p, name.as_ptr(), ffi::SQLITE_ACCESS_EXISTS, &mut out) };
    assert_eq!(rc, ffi::SQLITE_IOERR_ACCESS);
    let err = super::open(fs, Path::new("/x.db"), &super::SqliteOptions::default()).unwrap_err();
    assert!(matches!(err, super::SqliteError::CantOpen { .. }), "{err:?}");
}

#[test]
fn vfs_is_unregistered_when_its_last_db_is_dropped() {
    let (_sim, vfs) = sim_vfs();
    let name = CString::new(vfs.name()).unwrap();
    // SAFETY: sqlite3_vfs_find only reads SQLite's VFS list under its mutex.
    assert!(!unsafe { ffi::sqlite3_vfs_find(name.as_ptr()) }.is_null());
    drop(vfs);
    // SAFETY: as above.
    assert!(unsafe { ffi::sqlite3_vfs_find(name.as_ptr()) }.is_null());
}
