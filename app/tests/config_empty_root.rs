//! `[runtime] root = ""` is a config error naming the key `runtime.root`
//! (app/src/config.rs: "Every error names the file, the line and the key
//! path"), refused before anything is written: resolved against the
//! config's directory, an empty root would be the empty path for a bare
//! `--config agent.toml` (the boot would write `LOCK` and `store.db` into
//! the working directory and fail with a misleading "damaged root" error naming no
//! file), or the config file's own directory for an absolute one.

mod common;

use std::process::{Command, Stdio};

use common::*;

#[test]
fn an_empty_runtime_root_is_refused_naming_the_key_and_nothing_is_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("agent.toml"),
        "[provider]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n\n[runtime]\nroot = \"\"\n",
    )?;
    let child = Command::new(BIN)
        .args(["status", "--config", "agent.toml"])
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = finish(child)?;
    let written: Vec<String> = std::fs::read_dir(dir.path())?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n != "agent.toml")
        .collect();
    assert!(
        out.stderr.contains("runtime.root"),
        "`root = \"\"` was not refused as a config error naming `runtime.root` (exit {:?}); stderr: {:?}; \
         files the command wrote beside the config: {written:?}",
        out.status.code(),
        out.stderr
    );
    assert!(written.is_empty(), "a refused config wrote {written:?}");
    Ok(())
}
