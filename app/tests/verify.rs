//! `durable-agent verify` and `repair --quarantine` on real roots through
//! the binary. For each damage case (an emptied `events.jsonl`, a log cut
//! in the middle, a deleted `store.db`, a flipped bit in a log line):
//! `verify` exits 1 naming the file and changes no byte of the root (every
//! file hashed before and after, SQLite side files included);
//! `repair --quarantine` moves it aside (the batch holds the file and a
//! NOTE.txt) and then `status` boots the rest. A healthy root verifies
//! with exit 0, also while `serve` runs on it and works (which `repair`
//! refuses: the daemon holds the lock).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;

/// Every directory and file under `dir`, with the files' bytes.
fn snapshot(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, Option<Vec<u8>>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                out.insert(path.clone(), None);
                todo.push(path);
            } else {
                out.insert(path.clone(), Some(std::fs::read(&path)?));
            }
        }
    }
    Ok(out)
}

struct Root {
    dir: tempfile::TempDir,
    _mock: MockLlm,
    _sink: WebhookSink,
    config: PathBuf,
    root: PathBuf,
    /// The longest log.
    log: PathBuf,
}

impl Root {
    fn root_str(&self) -> &str {
        path_str(&self.root)
    }
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
        dir,
        _mock: mock,
        _sink: sink,
        config,
        root,
        log,
    })
}

/// `verify` on `r` exits 1 naming `file` in its text and JSON reports,
/// and changes no byte of the root.
fn verify_damaged(
    r: &Root,
    file: &Path,
    what: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let before = snapshot(&r.root)?;
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: verify did not say damaged: {out:?}"
    );
    let name = file.display().to_string();
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("DAMAGED") && l.contains(&name)),
        "{what}: the report does not name {name}: {}",
        out.stdout
    );
    assert!(
        out.stdout.contains("durable-agent repair --quarantine") || out.stdout.contains("restore store.db"),
        "{what}: no repair command: {}",
        out.stdout
    );
    let json = run(&["verify", "--config", path_str(&r.config), "--json"])?;
    assert_eq!(json.status.code(), Some(1), "{what}: {json:?}");
    let report = json.json()?;
    assert_eq!(report["status"], "damaged", "{what}: {report}");
    let damaged = report["damaged"].as_array().ok_or("no damaged list")?;
    assert!(
        damaged
            .iter()
            .any(|f| f["path"] == name.as_str() && f["repair"].is_string()),
        "{what}: the JSON does not name {name}: {report}"
    );
    assert!(snapshot(&r.root)? == before, "{what}: verify changed the root");
    Ok(report)
}

fn status_ok(r: &Root, what: &str) -> TestResult {
    let out = run(&["status", "--config", path_str(&r.config)])?;
    assert!(out.status.success(), "{what}: status after repair: {out:?}");
    Ok(())
}

/// `repair --quarantine` (with `extra` flags) succeeds; returns the batch
/// directory, which holds a NOTE.txt naming `file`.
fn repaired(
    r: &Root,
    extra: &[&str],
    file: &Path,
    what: &str,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let mut args = vec!["repair", "--quarantine", r.root_str(), "--json"];
    args.extend_from_slice(extra);
    let out = run(&args)?;
    assert!(out.status.success(), "{what}: repair failed: {out:?}");
    let batch = PathBuf::from(out.json()?["quarantine"].as_str().ok_or("nothing was moved")?);
    assert!(
        batch.starts_with(r.root.join("quarantine")),
        "{what}: {}",
        batch.display()
    );
    let note = std::fs::read_to_string(batch.join("NOTE.txt"))?;
    assert!(
        note.contains(&file.display().to_string()),
        "{what}: the note does not name the file: {note}"
    );
    assert!(
        note.contains("mv "),
        "{what}: the note does not say how to restore: {note}"
    );
    Ok(batch)
}

fn session_rel(r: &Root) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = r.log.parent().ok_or("log has no dir")?;
    Ok(dir.strip_prefix(&r.root)?.to_path_buf())
}

#[test]
fn a_healthy_root_verifies_with_exit_0_and_is_unchanged() -> TestResult {
    let r = root_with_two_jobs()?;
    let before = snapshot(&r.root)?;
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.contains("healthy"), "{}", out.stdout);
    assert!(out.stdout.contains("integrity_check ok"), "{}", out.stdout);
    assert!(!out.stdout.contains("DAMAGED"), "{}", out.stdout);
    let json = run(&["verify", "--config", path_str(&r.config), "--json"])?;
    assert_eq!(json.status.code(), Some(0), "{json:?}");
    let report = json.json()?;
    assert_eq!(report["status"], "healthy");
    assert_eq!(report["sessions"].as_array().map(Vec::len), Some(2), "{report}");
    assert!(snapshot(&r.root)? == before, "verify changed a healthy root");
    // Nothing to quarantine: repair moves nothing.
    let out = run(&["repair", "--quarantine", r.root_str()])?;
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("nothing moved"), "{}", out.stdout);
    assert!(!r.root.join("quarantine").exists());
    Ok(())
}

#[test]
fn usage_errors_exit_2() -> TestResult {
    let out = run(&["verify"])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run(&["repair", "/tmp/x"])?;
    assert_eq!(out.status.code(), Some(2), "repair needs --quarantine: {out:?}");
    Ok(())
}

#[test]
fn an_emptied_log_is_reported_then_quarantined_and_the_rest_boots() -> TestResult {
    let r = root_with_two_jobs()?;
    let backup = std::fs::read(&r.log)?;
    std::fs::write(&r.log, b"")?;
    let report = verify_damaged(&r, &r.log, "emptied log")?;
    assert_eq!(report["damaged"][0]["kind"], "lost_entries", "{report}");
    let batch = repaired(&r, &[], &r.log, "emptied log")?;
    let rel = session_rel(&r)?;
    assert!(!r.log.exists(), "the log is still in the root");
    assert!(
        batch.join(&rel).join("events.jsonl").exists(),
        "the log is not in the quarantine"
    );
    assert!(
        batch.join(&rel).join("events.pending").exists(),
        "the high-water mark went missing"
    );
    status_ok(&r, "emptied log quarantined")?;
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(out.status.code(), Some(0), "after repair: {out:?}");
    // Restore: the log from the backup, the directory moved back.
    std::fs::write(batch.join(&rel).join("events.jsonl"), &backup)?;
    std::fs::rename(batch.join(&rel), r.root.join(&rel))?;
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(out.status.code(), Some(0), "restored: {out:?}");
    status_ok(&r, "restored")?;
    Ok(())
}

#[test]
fn a_log_cut_in_the_middle_is_reported_with_expected_found_and_offset() -> TestResult {
    let r = root_with_two_jobs()?;
    let backup = std::fs::read(&r.log)?;
    let lines = backup.iter().filter(|&&b| b == b'\n').count();
    std::fs::write(&r.log, &backup[..backup.len() / 2])?;
    let report = verify_damaged(&r, &r.log, "log cut in half")?;
    let f = &report["damaged"][0];
    assert_eq!(f["kind"], "lost_entries", "{report}");
    assert!(
        f["message"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("{lines} were acknowledged")),
        "{report}"
    );
    assert!(f["line"].is_u64() && f["offset"].is_u64(), "{report}");
    let batch = repaired(&r, &[], &r.log, "log cut in half")?;
    assert!(batch.join(session_rel(&r)?).join("events.jsonl").exists());
    status_ok(&r, "cut log quarantined")?;
    Ok(())
}

#[test]
fn a_flipped_bit_in_a_log_line_is_reported_with_line_and_offset() -> TestResult {
    let r = root_with_two_jobs()?;
    let mut bytes = std::fs::read(&r.log)?;
    // Line 2 (a middle line): flip the low bit of a letter in its middle.
    let starts: Vec<usize> = std::iter::once(0)
        .chain(
            bytes
                .iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        )
        .collect();
    let (start, end) = (starts[1], starts[2] - 1);
    let at = (start + end) / 2..end;
    let i = at
        .clone()
        .find(|&i| bytes[i].is_ascii_alphabetic())
        .ok_or("no letter in line 2")?;
    bytes[i] ^= 1;
    std::fs::write(&r.log, &bytes)?;
    // The boot refuses it naming the file, line and offset, changing nothing.
    let before = snapshot(&r.root)?;
    let out = run(&["status", "--config", path_str(&r.config)])?;
    assert_eq!(out.status.code(), Some(1), "status booted a flipped bit: {out:?}");
    let name = r.log.display().to_string();
    assert!(
        out.stderr
            .contains(&format!("{name}: line 2 (byte {start}) is corrupt")),
        "{}",
        out.stderr
    );
    assert!(snapshot(&r.root)? == before, "the refused boot changed the root");
    let report = verify_damaged(&r, &r.log, "flipped bit")?;
    let f = &report["damaged"][0];
    assert_eq!(f["kind"], "corrupt_line", "{report}");
    assert_eq!(f["line"], 2, "{report}");
    assert_eq!(f["offset"], start as u64, "{report}");
    let batch = repaired(&r, &[], &r.log, "flipped bit")?;
    assert_eq!(
        std::fs::read(batch.join(session_rel(&r)?).join("events.jsonl"))?,
        bytes,
        "the quarantined log is not the file as it was found"
    );
    status_ok(&r, "flipped bit quarantined")?;
    Ok(())
}

#[test]
fn a_deleted_store_is_reported_and_repaired_only_with_accept_store_loss() -> TestResult {
    let r = root_with_two_jobs()?;
    let db = r.root.join("store.db");
    std::fs::remove_file(&db)?;
    let report = verify_damaged(&r, &db, "deleted store.db")?;
    assert_eq!(report["damaged"][0]["kind"], "store_missing", "{report}");
    // Refused by default, the root unchanged.
    let before = snapshot(&r.root)?;
    let out = run(&["repair", "--quarantine", r.root_str()])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("--accept-store-loss"), "{}", out.stderr);
    assert!(snapshot(&r.root)? == before, "a refused repair changed the root");
    let batch = repaired(&r, &["--accept-store-loss"], &db, "deleted store.db")?;
    assert!(batch.join("NOTE.txt").exists());
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(r.root.join("root.json"))?)?;
    let lost = manifest["lost_stores"]
        .as_array()
        .ok_or("no lost_stores in root.json")?;
    assert_eq!(lost.len(), 1, "{manifest}");
    assert_ne!(lost[0]["store_id"], manifest["store_id"], "{manifest}");
    status_ok(&r, "store loss accepted")?;
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(out.status.code(), Some(0), "after repair: {out:?}");
    assert!(out.stdout.contains("as lost"), "{}", out.stdout);
    Ok(())
}

#[test]
fn a_replaced_store_goes_to_quarantine_with_accept_store_loss() -> TestResult {
    let r = root_with_two_jobs()?;
    let other = root_with_two_jobs()?;
    let db = r.root.join("store.db");
    let foreign = std::fs::read(other.root.join("store.db"))?;
    std::fs::write(&db, &foreign)?;
    let report = verify_damaged(&r, &db, "replaced store.db")?;
    assert_eq!(report["damaged"][0]["kind"], "store_replaced", "{report}");
    let batch = repaired(&r, &["--accept-store-loss"], &db, "replaced store.db")?;
    assert_eq!(
        std::fs::read(batch.join("store.db"))?,
        foreign,
        "the foreign store was not kept"
    );
    status_ok(&r, "replaced store quarantined")?;
    Ok(())
}

fn start_serve(config: &Path) -> Result<(Child, String), Box<dyn std::error::Error>> {
    let mut child = spawn(&["serve", "--config", path_str(config)])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        let out = finish(child)?;
        return Err(format!("serve printed no URL: {out:?}").into());
    }
    Ok((child, line.trim().to_string()))
}

#[test]
fn verify_runs_beside_a_live_serve_which_keeps_working() -> TestResult {
    let r = root_with_two_jobs()?;
    let (daemon, _url) = start_serve(&r.config)?;
    let result = (|| -> TestResult {
        // Work in flight while verify reads: triggers firing turns.
        let status = run(&["status", "--config", path_str(&r.config)])?.json()?;
        let agent = status["agents"][0]["id"]
            .as_str()
            .ok_or_else(|| format!("no agent id in {status}"))?
            .to_string();
        for i in 0..3 {
            let out = run(&[
                "emit",
                "--config",
                path_str(&r.config),
                "--dedup-key",
                &format!("k{i}"),
                "--agent",
                &agent,
                "--prompt",
                &format!("mail carol {i}"),
            ])?;
            assert!(out.status.success(), "emit: {out:?}");
        }
        for _ in 0..5 {
            let out = run(&["verify", r.root_str()])?;
            assert_eq!(out.status.code(), Some(0), "verify beside serve: {out:?}");
        }
        let out = run(&["verify", "--config", path_str(&r.config), "--json"])?;
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        // repair needs the lock the daemon holds.
        let out = run(&["repair", "--quarantine", r.root_str()])?;
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stderr.contains("in use"), "{}", out.stderr);
        // The daemon still answers and its work completes.
        wait_for("the emitted triggers to be done", || {
            run(&["status", "--config", path_str(&r.config)])
                .ok()
                .and_then(|o| o.json().ok())
                .is_some_and(|s| {
                    s["triggers"]["DONE"]
                        .as_array()
                        .is_some_and(|done| done.len() >= 3)
                })
        })?;
        Ok(())
    })();
    signal(&daemon, "TERM")?;
    let out = finish(daemon)?;
    result?;
    assert!(out.status.success(), "serve: {out:?}");
    let out = run(&["verify", r.root_str()])?;
    assert_eq!(out.status.code(), Some(0), "after serve stopped: {out:?}");
    drop(r.dir);
    Ok(())
}
