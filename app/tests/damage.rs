//! Damage outside the crash model, on a real root through the binary: an
//! emptied `events.jsonl`, a log cut in the middle, a deleted or replaced
//! `store.db`. `status` fails with a message naming the file, and the
//! root's bytes are unchanged (hashed before and after); restoring the
//! file from a backup boots again. A torn tail (the crash model) still
//! boots silently.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;

/// Every file under `dir` with its bytes (the SQLite side files a refused
/// open may create and delete again are left out).
fn snapshot(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if path.is_dir() {
                todo.push(path);
            } else if !name.ends_with("-wal") && !name.ends_with("-shm") {
                out.insert(path.clone(), std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// A root with two agents, each after a job with one email: returns the
/// config and the longest log.
struct Root {
    _dir: tempfile::TempDir,
    _mock: MockLlm,
    _sink: WebhookSink,
    config: PathBuf,
    root: PathBuf,
    log: PathBuf,
}

fn root_with_two_jobs() -> Result<Root, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let sink = WebhookSink::start(loopback(), true)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        true,
        free_addr()?,
    )?;
    for (i, prompt) in ["mail ada", "mail bob"].iter().enumerate() {
        let job = write_job(
            dir.path(),
            &format!("job{i}.toml"),
            Some(&format!("job-{i}")),
            prompt,
        )?;
        let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
        assert!(out.status.success(), "{out:?}");
    }
    let root = dir.path().join("root");
    let mut logs: Vec<(usize, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(root.join("agents"))? {
        let log = entry?.path().join("events.jsonl");
        let lines = std::fs::read_to_string(&log)?.lines().count();
        logs.push((lines, log));
    }
    logs.sort();
    let (lines, log) = logs.pop().ok_or("no session")?;
    assert!(lines >= 5, "a job's log has several entries, got {lines}");
    Ok(Root {
        _dir: dir,
        _mock: mock,
        _sink: sink,
        config,
        root,
        log,
    })
}

/// `status` on `r` fails naming `file`, and changes no byte of the root.
fn refused(r: &Root, file: &Path, what: &str) -> Result<String, Box<dyn std::error::Error>> {
    let before = snapshot(&r.root)?;
    let out = run(&["status", "--config", path_str(&r.config)])?;
    assert!(
        !out.status.success(),
        "{what}: status booted a damaged root: {out:?}"
    );
    assert!(
        out.stderr.contains(&file.display().to_string()),
        "{what}: the error does not name {}: {}",
        file.display(),
        out.stderr
    );
    assert!(
        snapshot(&r.root)? == before,
        "{what}: the refused boot changed the root"
    );
    Ok(out.stderr)
}

fn status_ok(r: &Root, what: &str) -> TestResult {
    let out = run(&["status", "--config", path_str(&r.config)])?;
    assert!(out.status.success(), "{what}: {out:?}");
    Ok(())
}

#[test]
fn an_emptied_log_is_refused_naming_it_and_the_root_is_unchanged() -> TestResult {
    let r = root_with_two_jobs()?;
    status_ok(&r, "intact")?;
    let backup = std::fs::read(&r.log)?;
    std::fs::write(&r.log, b"")?;
    let stderr = refused(&r, &r.log, "emptied log")?;
    assert!(stderr.contains("acknowledged entries were lost"), "{stderr}");
    assert!(stderr.contains("ends after 0 entries"), "{stderr}");
    // Nothing was deleted: putting the file back restores everything.
    std::fs::write(&r.log, &backup)?;
    status_ok(&r, "restored")?;
    Ok(())
}

#[test]
fn a_log_cut_in_the_middle_is_refused_naming_expected_and_found() -> TestResult {
    let r = root_with_two_jobs()?;
    let backup = std::fs::read(&r.log)?;
    let lines = backup.iter().filter(|&&b| b == b'\n').count();
    std::fs::write(&r.log, &backup[..backup.len() / 2])?;
    let stderr = refused(&r, &r.log, "log cut in half")?;
    assert!(stderr.contains(&format!("{lines} were acknowledged")), "{stderr}");
    std::fs::write(&r.log, &backup)?;
    status_ok(&r, "restored")?;
    Ok(())
}

#[test]
fn a_torn_tail_is_still_repaired_silently() -> TestResult {
    let r = root_with_two_jobs()?;
    let mut bytes = std::fs::read(&r.log)?;
    bytes.extend_from_slice(b"{\"schema_version\":4,\"sess");
    std::fs::write(&r.log, &bytes)?;
    status_ok(&r, "torn tail")?;
    Ok(())
}

#[test]
fn a_deleted_store_is_refused_and_not_recreated() -> TestResult {
    let r = root_with_two_jobs()?;
    let db = r.root.join("store.db");
    let backup = std::fs::read(&db)?;
    std::fs::remove_file(&db)?;
    let stderr = refused(&r, &db, "deleted store.db")?;
    assert!(stderr.contains("root.json"), "{stderr}");
    assert!(!db.exists(), "the store was recreated");
    std::fs::write(&db, &backup)?;
    status_ok(&r, "restored")?;
    Ok(())
}

#[test]
fn another_roots_store_is_refused() -> TestResult {
    let r = root_with_two_jobs()?;
    let other = root_with_two_jobs()?;
    let db = r.root.join("store.db");
    std::fs::copy(other.root.join("store.db"), &db)?;
    let stderr = refused(&r, &db, "replaced store.db")?;
    assert!(stderr.contains("emptied or replaced"), "{stderr}");
    Ok(())
}
