//! Who may drive `serve`: the API answers only requests that carry the
//! token, name the listen address as their `Host` (and no foreign
//! `Origin`), send JSON bodies as `application/json`, and stay under the
//! body limit — checked with raw HTTP on a real daemon (loopback only),
//! and the token file it generates is private (0600).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::Child;
use std::time::Duration;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;

/// A config whose token comes from the root's file (no `token_env`).
fn file_token_config(dir: &std::path::Path) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let mock = MockLlm::echo(loopback())?;
    let path = write_config(
        dir,
        &mock.base_url(),
        "http://127.0.0.1:9/send",
        false,
        free_addr()?,
    )?;
    let text = std::fs::read_to_string(&path)?.replace(&format!("token_env = \"{TOKEN_ENV}\"\n"), "");
    std::fs::write(&path, text)?;
    Ok(path)
}

fn start_serve(config: &std::path::Path) -> Result<(Child, SocketAddr), Box<dyn std::error::Error>> {
    let mut child = spawn(&["serve", "--config", path_str(config)])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        let out = finish(child)?;
        return Err(format!("serve printed no URL: {out:?}").into());
    }
    Ok((child, line.trim().trim_start_matches("http://").parse()?))
}

/// Send `head` (request line and headers, without the blank line) and
/// `body`, and return the status code and the answer's body. The
/// connection is closed by the request's `Connection: close`.
fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())?;
    stream.write_all(body)?;
    let mut answer = Vec::new();
    // A server that answers before reading the body may reset the
    // connection afterwards: keep what arrived.
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    Ok((status, body))
}

#[test]
fn api_needs_the_token_its_own_host_json_and_a_bounded_body() -> TestResult {
    let dir = tempfile::tempdir()?;
    let config = file_token_config(dir.path())?;
    let (mut serve, addr) = start_serve(&config)?;
    let token_file = dir.path().join("root").join("api-token");
    let mode = std::fs::metadata(&token_file)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} is {mode:o}", token_file.display());
    let token = std::fs::read_to_string(&token_file)?.trim().to_string();
    assert_eq!(token.len(), 64, "32 random bytes as hex");
    let auth = format!("Authorization: Bearer {token}");
    let host = format!("Host: {addr}");
    let json = "Content-Type: application/json";
    let agent = br#"{"name":"a"}"#;
    let len = format!("Content-Length: {}", agent.len());

    let (status, body) = raw(addr, &format!("GET /status HTTP/1.1\r\n{host}"), b"")?;
    assert_eq!(status, 401, "no token: {body}");
    let (status, _) = raw(
        addr,
        &format!("GET /status HTTP/1.1\r\n{host}\r\nAuthorization: Bearer 00ff"),
        b"",
    )?;
    assert_eq!(status, 401, "wrong token");
    let (status, body) = raw(
        addr,
        &format!("POST /agents HTTP/1.1\r\n{host}\r\n{auth}\r\nContent-Type: text/plain\r\n{len}"),
        agent,
    )?;
    assert_eq!(status, 403, "text/plain: {body}");
    let port = addr.port();
    let (status, _) = raw(
        addr,
        &format!("GET /status HTTP/1.1\r\nHost: evil.example:{port}\r\n{auth}"),
        b"",
    )?;
    assert_eq!(status, 403, "foreign Host (DNS rebinding)");
    let (status, _) = raw(
        addr,
        &format!("GET /status HTTP/1.1\r\n{host}\r\n{auth}\r\nOrigin: http://evil.example"),
        b"",
    )?;
    assert_eq!(status, 403, "foreign Origin");
    // 2 MiB declared, not one byte sent: the answer comes before the body.
    let (status, body) = raw(
        addr,
        &format!(
            "POST /agents HTTP/1.1\r\n{host}\r\n{auth}\r\n{json}\r\nContent-Length: {}",
            2 << 20
        ),
        b"",
    )?;
    assert_eq!(status, 413, "oversized body: {body}");
    // Nothing refused reached the system.
    let (status, body) = raw(addr, &format!("GET /status HTTP/1.1\r\n{host}\r\n{auth}"), b"")?;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("\"a\""),
        "a refused request created an agent: {body}"
    );
    let (status, body) = raw(
        addr,
        &format!("POST /agents HTTP/1.1\r\n{host}\r\n{auth}\r\n{json}\r\n{len}"),
        agent,
    )?;
    assert_eq!(status, 200, "{body}");

    // The CLI client reads the token from the root's file.
    let out = run(&["status", "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("\"a\""), "{out:?}");

    // A restart keeps the token.
    signal(&serve, "TERM")?;
    let stopped = finish(serve)?;
    assert!(stopped.status.success(), "{stopped:?}");
    let (again, addr) = start_serve(&config)?;
    serve = again;
    assert_eq!(std::fs::read_to_string(&token_file)?.trim(), token);
    let (status, _) = raw(
        addr,
        &format!("GET /status HTTP/1.1\r\nHost: {addr}\r\n{auth}"),
        b"",
    )?;
    assert_eq!(status, 200);
    signal(&serve, "KILL")?;
    let _ = finish(serve)?;
    Ok(())
}

#[test]
fn token_named_by_the_config_must_be_in_the_environment() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        "http://127.0.0.1:9/send",
        false,
        free_addr()?,
    )?;
    let out = finish(
        std::process::Command::new(BIN)
            .args(["serve", "--config", path_str(&config)])
            .env_remove(TOKEN_ENV)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?,
    )?;
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stderr.contains(TOKEN_ENV), "{out:?}");
    assert!(!dir.path().join("root").join("api-token").exists());
    Ok(())
}

/// Every entry under `dir` (recursively) with its permission bits.
fn modes(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, bool, u32)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        out.push((entry.path(), meta.is_dir(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            modes(&entry.path(), out)?;
        }
    }
    Ok(())
}

#[test]
fn every_file_the_runtime_creates_is_private() -> TestResult {
    use durable_agent_cli::webhook_sink::WebhookSink;
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
    let text = std::fs::read_to_string(&config)?.replace(
        "[api]",
        "[telemetry]\nevents_jsonl = \"root/telemetry/events.jsonl\"\n\n[api]",
    );
    std::fs::write(&config, text)?;
    let job = write_job(dir.path(), "job.toml", Some("job-1"), "mail ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(sink.deliveries().len(), 1, "the job's email went out");
    let (mut serve, _) = start_serve(&config)?;
    signal(&serve, "KILL")?;
    serve.wait()?;
    let root = dir.path().join("root");
    let root_mode = std::fs::metadata(&root)?.permissions().mode() & 0o777;
    assert_eq!(root_mode, 0o700, "the root");
    let mut seen = Vec::new();
    modes(&root, &mut seen)?;
    let names: Vec<String> = seen
        .iter()
        .filter_map(|(p, _, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for expected in ["store.db", "events.jsonl", "session.json", "LOCK"] {
        assert!(names.iter().any(|n| n == expected), "no {expected} in {names:?}");
    }
    for (path, is_dir, mode) in &seen {
        let want = if *is_dir { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} is {mode:o}, want {want:o}", path.display());
    }
    Ok(())
}
