//! Helpers for the end-to-end tests: a config pointing at loopback servers
//! the test started, the binary run with a deadline, and its JSON output.
#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;

pub const BIN: &str = env!("CARGO_BIN_EXE_durable-agent");

/// Every wait in these tests gives up after this long.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// The API token of the configs [`write_config`] writes (from the
/// environment variable [`TOKEN_ENV`], which [`spawn`] sets).
pub const TEST_TOKEN: &str = "test-token-0123456789abcdef";
pub const TOKEN_ENV: &str = "DURABLE_AGENT_TEST_TOKEN";

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A free loopback port (bound then released; good enough on a test box).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(loopback())?.local_addr()
}

/// `agent.toml` in `dir`: the provider at `base_url` (no retries, short
/// backoff), root `dir/root`, the API on `api` (its token [`TEST_TOKEN`]
/// from [`TOKEN_ENV`]), and one irreversible
/// `send_email` tool posting to `sink_url`.
pub fn write_config(
    dir: &Path,
    base_url: &str,
    sink_url: &str,
    dedup: bool,
    api: SocketAddr,
) -> std::io::Result<PathBuf> {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"[provider]
base_url = "{base_url}"
model = "mock-1"
timeout_ms = 15000
max_retries = 0
backoff_base_ms = 10
backoff_max_ms = 50

[runtime]
root = "root"

[api]
listen = "{api}"
token_env = "{TOKEN_ENV}"

[[tools]]
kind = "http"
name = "send_email"
description = "Send an email."
url = "{sink_url}"
irreversible = true
dedup = {dedup}
timeout_ms = 5000
parameters = {{ type = "object", properties = {{ to = {{ type = "string" }}, body = {{ type = "string" }} }}, required = ["to", "body"] }}
"#
        ),
    )?;
    Ok(path)
}

pub fn write_job(dir: &Path, name: &str, run_id: Option<&str>, prompt: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    let run_id = run_id.map_or(String::new(), |id| format!("run_id = \"{id}\"\n"));
    std::fs::write(
        &path,
        format!("{run_id}agent = \"mailer\"\ninstructions = \"Send what you are asked to.\"\nprompt = \"{prompt}\"\n"),
    )?;
    Ok(path)
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn json(&self) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        serde_json::from_str(&self.stdout).map_err(|e| format!("stdout is not JSON ({e}): {self:?}").into())
    }
}

/// Start the binary with `args` (stdout/stderr piped).
pub fn spawn(args: &[&str]) -> std::io::Result<Child> {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .env(TOKEN_ENV, TEST_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Wait for `child` at most [`DEADLINE`] (killing it if it overruns) and
/// collect its output. The pipes are drained on threads while it runs: a
/// child printing more than a pipe buffer (64 KiB) would otherwise block
/// on its write and never exit.
pub fn finish(mut child: Child) -> Result<Output, Box<dyn std::error::Error>> {
    fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > DEADLINE {
            child.kill()?;
            child.wait()?;
            let stderr = stderr.join().unwrap_or_default();
            return Err(format!("command overran the deadline; its stderr:\n{stderr}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: stdout.join().map_err(|_| "stdout reader panicked")?,
        stderr: stderr.join().map_err(|_| "stderr reader panicked")?,
    })
}

/// Run the binary to completion.
pub fn run(args: &[&str]) -> Result<Output, Box<dyn std::error::Error>> {
    finish(spawn(args)?)
}

/// Poll `cond` until it holds or [`DEADLINE`] passes.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> TestResult {
    let started = Instant::now();
    while !cond() {
        if started.elapsed() > DEADLINE {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Send `signal` (`INT`, `TERM`, `KILL`) to our own child.
pub fn signal(child: &Child, signal: &str) -> TestResult {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()?;
    if !status.success() {
        return Err(format!("kill -{signal} {} failed", child.id()).into());
    }
    Ok(())
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Start `serve` and wait for the URL it prints once listening.
pub fn start_serve(config: &Path) -> Result<(Child, String), Box<dyn std::error::Error>> {
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

/// A client of the API at `url` (as [`start_serve`] gives it), with the
/// test token.
pub fn client(url: &str) -> Result<Client, Box<dyn std::error::Error>> {
    let addr = url.trim_start_matches("http://").parse()?;
    Ok(Client::new(addr, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN)))
}
