//! Every `Fs` method of `RealFs` on a temp dir, through one conformance
//! suite that SimFs must pass too: SimFs's visible semantics are checked
//! against the real kernel's, so the simulation cannot drift into a
//! friendlier filesystem than production runs on.

use std::io::ErrorKind;
use std::path::Path;

use durable_agent::fs::{Fs, OpenMode, RealFs, SimConfig, SimFs};

fn kind<T: std::fmt::Debug>(r: std::io::Result<T>) -> ErrorKind {
    r.unwrap_err().kind()
}

/// The POSIX behaviour both implementations promise, run under `root`.
fn conformance(fs: &dyn Fs, root: &Path) {
    let d = root.join("d");
    let f = d.join("f");
    let g = d.join("g");

    // create_dir_all: nested, idempotent.
    fs.create_dir_all(&d.join("sub/deeper"), "mkdir -p").unwrap();
    fs.create_dir_all(&d.join("sub"), "mkdir again").unwrap();
    assert!(fs.exists(&d.join("sub/deeper"), "exists dir").unwrap());

    // open: every mode and its errors.
    assert_eq!(
        kind(fs.open(&f, OpenMode::Existing, "open missing")),
        ErrorKind::NotFound
    );
    fs.open(&f, OpenMode::CreateNew, "create new").unwrap();
    assert_eq!(
        kind(fs.open(&f, OpenMode::CreateNew, "create twice")),
        ErrorKind::AlreadyExists
    );
    fs.open(&f, OpenMode::Existing, "open existing").unwrap();
    fs.open(&f, OpenMode::Create, "open create existing").unwrap();
    let orphan = root.join("nope/x");
    assert_eq!(
        kind(fs.open(&orphan, OpenMode::Create, "no parent")),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(fs.open(&d, OpenMode::Create, "open a dir")),
        ErrorKind::IsADirectory
    );

    // append returns the offset written at; write_at overwrites and
    // zero-fills past the end.
    assert_eq!(fs.append(&f, b"hello", "append 1").unwrap(), 0);
    assert_eq!(fs.append(&f, b" world", "append 2").unwrap(), 5);
    fs.write_at(&f, 0, b"J", "overwrite").unwrap();
    fs.write_at(&f, 13, b"!", "write past end").unwrap();
    assert_eq!(fs.read(&f, "read").unwrap(), b"Jello world\0\0!");
    assert_eq!(fs.len(&f, "len").unwrap(), 14);

    // read_at: full, short at EOF, empty past EOF.
    let mut buf = [0u8; 5];
    assert_eq!(fs.read_at(&f, 6, &mut buf, "read_at").unwrap(), 5);
    assert_eq!(&buf, b"world");
    assert_eq!(fs.read_at(&f, 12, &mut buf, "read_at eof").unwrap(), 2);
    assert_eq!(&buf[..2], b"\0!");
    assert_eq!(fs.read_at(&f, 100, &mut buf, "read_at past").unwrap(), 0);

    // truncate: shrink, then zero-extend.
    fs.truncate(&f, 4, "shrink").unwrap();
    fs.truncate(&f, 6, "extend").unwrap();
    assert_eq!(fs.read(&f, "read truncated").unwrap(), b"Jell\0\0");

    // Truncate mode empties an existing file.
    fs.open(&g, OpenMode::Create, "create g").unwrap();
    fs.append(&g, b"old g", "write g").unwrap();
    fs.open(&g, OpenMode::Truncate, "truncate g").unwrap();
    assert_eq!(fs.len(&g, "len g").unwrap(), 0);
    fs.append(&g, b"new g", "write g").unwrap();

    // sync and sync_dir succeed on what exists, fail on what does not.
    fs.sync(&f, "sync f").unwrap();
    fs.sync_dir(&d, "sync d").unwrap();
    fs.sync_dir(root, "sync root").unwrap();
    assert_eq!(
        kind(fs.sync(&d.join("missing"), "sync missing")),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(fs.sync_dir(&d.join("nodir"), "sync_dir missing")),
        ErrorKind::NotFound
    );

    // list: sorted names of files and directories.
    assert_eq!(fs.list(&d, "list").unwrap(), ["f", "g", "sub"]);
    assert_eq!(
        kind(fs.list(&d.join("nodir"), "list missing")),
        ErrorKind::NotFound
    );

    // rename replaces the target atomically; the source name is gone.
    fs.rename(&g, &f, "rename g over f").unwrap();
    assert_eq!(fs.read(&f, "read renamed").unwrap(), b"new g");
    assert!(!fs.exists(&g, "exists g").unwrap());
    assert_eq!(kind(fs.rename(&g, &f, "rename missing")), ErrorKind::NotFound);
    let h = d.join("sub/h");
    fs.rename(&f, &h, "rename across dirs").unwrap();
    assert_eq!(fs.read(&h, "read moved").unwrap(), b"new g");

    // remove.
    fs.remove(&h, "remove").unwrap();
    assert!(!fs.exists(&h, "exists removed").unwrap());
    assert_eq!(kind(fs.remove(&h, "remove twice")), ErrorKind::NotFound);
    assert_eq!(kind(fs.read(&h, "read removed")), ErrorKind::NotFound);
    assert_eq!(kind(fs.append(&h, b"x", "append removed")), ErrorKind::NotFound);
    assert_eq!(kind(fs.len(&h, "len removed")), ErrorKind::NotFound);

    // create_dir_all over a file.
    fs.open(&f, OpenMode::Create, "recreate f").unwrap();
    assert_eq!(
        kind(fs.create_dir_all(&f, "mkdir over file")),
        ErrorKind::AlreadyExists
    );
    assert_eq!(fs.list(&d, "final list").unwrap(), ["f", "sub"]);
}

#[test]
fn realfs_implements_every_method_with_posix_semantics() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&RealFs::new(), dir.path());
}

#[test]
fn simfs_visible_semantics_match_realfs() {
    let fs = SimFs::new(SimConfig::new(0));
    fs.create_dir_all(Path::new("/tmp/t"), "mkdir root").unwrap();
    conformance(&fs, Path::new("/tmp/t"));
}

#[test]
fn realfs_data_is_on_disk_after_sync_and_sync_dir() {
    // Not a power-loss test (that needs a VM); it checks the calls reach the
    // kernel and a fresh open sees the bytes.
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::new();
    let path = dir.path().join("durable.log");
    fs.open(&path, OpenMode::CreateNew, "create").unwrap();
    fs.append(&path, b"record\n", "append").unwrap();
    fs.sync(&path, "sync").unwrap();
    fs.sync_dir(dir.path(), "sync dir").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"record\n");
}

#[test]
fn realfs_errors_name_the_step_and_the_file_and_keep_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let err = RealFs::new().read(&missing, "session.json read").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let msg = err.to_string();
    assert!(msg.contains("session.json read"), "{msg}");
    assert!(msg.contains("missing.json"), "{msg}");
}

/// Descriptors of this process whose target is `path`.
fn fds_on(path: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(entry.path()).is_ok_and(|t| t == path) {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// fsyncgate: the fsync must go to the descriptor open when the data was
/// written, or a writeback error in between can be missed. So RealFs
/// opens a file once, writes and syncs through that one descriptor, and
/// keeps it across renames until the file is removed.
#[test]
fn realfs_syncs_through_the_descriptor_that_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let fs = RealFs::new();
    let tmp = root.join("session.json.tmp");
    let done = root.join("session.json");
    fs.open(&tmp, OpenMode::CreateNew, "create").unwrap();
    let first = fds_on(&tmp);
    assert_eq!(first.len(), 1, "one descriptor from the create on: {first:?}");
    fs.append(&tmp, b"{}", "write").unwrap();
    fs.write_at(&tmp, 0, b"[", "write").unwrap();
    fs.sync(&tmp, "fsync").unwrap();
    assert_eq!(fds_on(&tmp), first, "the fsync reopened the file");
    fs.rename(&tmp, &done, "rename").unwrap();
    fs.sync_dir(&root, "fsync dir").unwrap();
    assert_eq!(fds_on(&done), first, "the descriptor follows the rename");
    let dir_fds = fds_on(&root);
    assert_eq!(
        dir_fds.len(),
        1,
        "the directory's descriptor is held: {dir_fds:?}"
    );
    fs.append(&done, b"]", "write").unwrap();
    fs.sync(&done, "fsync").unwrap();
    assert_eq!(fds_on(&done), first);
    assert_eq!(std::fs::read(&done).unwrap(), b"[}]");
    fs.remove(&done, "remove").unwrap();
    let deleted = root.join("session.json (deleted)");
    assert!(
        fds_on(&deleted).is_empty(),
        "a removed file's descriptor is closed"
    );
}

#[test]
fn realfs_keeps_a_bounded_number_of_clean_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::new();
    let n = RealFs::MAX_KEPT + 50;
    for i in 0..n {
        let p = dir.path().join(format!("f{i}"));
        fs.open(&p, OpenMode::CreateNew, "create").unwrap();
        fs.append(&p, b"x", "write").unwrap();
        fs.sync(&p, "fsync").unwrap();
    }
    assert!(fs.kept_len() <= RealFs::MAX_KEPT + 1, "{}", fs.kept_len());
    // Unsynced files are never closed before their fsync.
    let fs = RealFs::new();
    for i in 0..n {
        fs.append(&dir.path().join(format!("f{i}")), b"y", "write")
            .unwrap();
    }
    assert_eq!(fs.kept_len(), n, "a dirty descriptor was closed");
}
