//! The real `durable-agent` binary as the soak runs it: found (or built),
//! copied, started as `serve`, killed, stopped, and probed for its root
//! lock.
//!
//! Invariant: the soak runs its own copy of the binary (taken once at the
//! start), so a `cargo build` during the soak cannot swap the program
//! between two restarts; every wait has a deadline, and a process that
//! overruns it is killed and reported with the tail of its log.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The binary's name in cargo's target directory.
pub const BIN_NAME: &str = "durable-agent";

/// Every wait for the binary (start, stop, a probe) gives up after this.
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(60);

/// What the second `serve` on a held root must say.
pub const LOCKED_MESSAGE: &str = "is in use by another durable-agent";

/// The `durable-agent` binary: `explicit` if given, else next to this
/// executable (`target/<profile>/durable-agent-sim` →
/// `target/<profile>/durable-agent`; a test in `target/<profile>/deps`
/// looks one level up).
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!("--bin {}: no such file", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(BIN_NAME));
        if let Some(up) = dir.parent() {
            candidates.push(up.join(BIN_NAME));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "the `{BIN_NAME}` binary is not next to {} (build it: `cargo build -p durable-agent-cli`, with the same --release as this one, or pass --bin PATH)",
            exe.display()
        )
    })
}

/// Build the binary with cargo (`features` of durable-agent-cli, e.g.
/// `canaries`) and return its path. For tests, which cannot depend on
/// another package's binary.
pub fn build(features: &[&str]) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "-p", "durable-agent-cli", "--bin", BIN_NAME])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--message-format=json-render-diagnostics");
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo build -p durable-agent-cli` failed ({})",
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == BIN_NAME)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo built durable-agent-cli but reported no executable".to_string())
}

/// [`build`] then [`snapshot`] into `dir`, as one step per process: two
/// tests building different feature sets in parallel would otherwise copy
/// each other's binary (cargo writes both to the same path).
pub fn build_snapshot(features: &[&str], dir: &Path) -> Result<PathBuf, String> {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    snapshot(&build(features)?, dir)
}

/// Copy `bin` into `dir` (see the module invariant).
pub fn snapshot(bin: &Path, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let copy = dir.join(BIN_NAME);
    std::fs::copy(bin, &copy).map_err(|e| format!("copying {} to {}: {e}", bin.display(), copy.display()))?;
    Ok(copy)
}

/// `cmd.spawn()`, retried while the kernel answers ETXTBSY. The binary was
/// copied into place by this process ([`snapshot`]), and any other thread
/// that forks while the copy's write descriptor is open (the tests run in
/// parallel threads, each starting processes) hands that descriptor to its
/// child until the child's `exec` closes it: for that instant the file is
/// still open for writing and cannot be executed (rust-lang/rust#114554).
/// The race ends by itself within milliseconds.
fn spawn(cmd: &mut Command, bin: &Path) -> Result<Child, String> {
    const ETXTBSY: i32 = 26;
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map_err(|e| format!("cannot start {}: {e}", bin.display())),
        }
    }
}

/// How to start the binary.
#[derive(Debug, Clone)]
pub struct Program {
    pub bin: PathBuf,
    pub config: PathBuf,
    /// Extra environment (e.g. the test-build canary switch).
    pub env: Vec<(String, String)>,
}

impl Program {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Start `serve` (stderr appended to `log`) and wait for the URL it
    /// prints once it has booted and listens.
    pub fn start(&self, log: &Path) -> Result<Serve, String> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = spawn(
            self.command()
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log_file)),
            &self.bin,
        )?;
        let stdout = child.stdout.take().ok_or("serve has no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let read = reader.read_line(&mut line).map(|_| line);
            // The receiver may have given up; then the line is not needed.
            let _ = tx.send((read, reader.into_inner()));
        });
        let (line, stdout) = match rx.recv_timeout(PROCESS_DEADLINE) {
            Ok((Ok(line), stdout)) if !line.trim().is_empty() => (line, stdout),
            Ok(_) | Err(_) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(format!(
                    "serve printed no URL within {PROCESS_DEADLINE:?} ({status}); its log {}:\n{}",
                    log.display(),
                    tail(log)
                ));
            }
        };
        Ok(Serve {
            child: Arc::new(Mutex::new(child)),
            url: line.trim().to_string(),
            log: log.to_path_buf(),
            _stdout: stdout,
        })
    }

    /// Start a second `serve` on the same root while one holds it: it
    /// must exit 1 saying the root is in use, before touching anything.
    pub fn probe_lock(&self) -> Result<(), String> {
        let mut child = spawn(
            self.command().stdout(Stdio::null()).stderr(Stdio::piped()),
            &self.bin,
        )?;
        let mut stderr = child.stderr.take().ok_or("probe has no stderr")?;
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let status = wait_deadline(&mut child)?;
        let text = reader.join().unwrap_or_default();
        if status.code() == Some(1) && text.contains(LOCKED_MESSAGE) {
            Ok(())
        } else {
            Err(format!(
                "a second `serve` on the held root did not refuse with {LOCKED_MESSAGE:?}: {status}, stderr:\n{text}"
            ))
        }
    }
}

/// A running `serve`.
#[derive(Debug)]
pub struct Serve {
    child: Arc<Mutex<Child>>,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    pub log: PathBuf,
    _stdout: ChildStdout,
}

/// A handle that can `SIGKILL` the process from another thread.
#[derive(Debug, Clone)]
pub struct Killer(Arc<Mutex<Child>>);

fn lock(child: &Mutex<Child>) -> MutexGuard<'_, Child> {
    child.lock().unwrap_or_else(|e| e.into_inner())
}

impl Killer {
    /// `SIGKILL` now (a no-op if it already exited).
    pub fn kill(&self) {
        // An error means it is already gone; reaping reports how it ended.
        let _ = lock(&self.0).kill();
    }
}

impl Serve {
    pub fn killer(&self) -> Killer {
        Killer(Arc::clone(&self.child))
    }

    /// `SIGKILL` and reap.
    pub fn kill(self) -> Result<(), String> {
        let mut child = lock(&self.child);
        let _ = child.kill();
        child.wait().map(drop).map_err(|e| format!("reaping serve: {e}"))
    }

    /// Whether it is still running (it stops on its own only by failing).
    pub fn exited(&self) -> Option<ExitStatus> {
        lock(&self.child).try_wait().ok().flatten()
    }

    /// `SIGTERM`, then wait: it must finish the operation in hand and exit 0.
    pub fn stop(self) -> Result<(), String> {
        let pid = lock(&self.child).id();
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .map_err(|e| format!("kill -TERM {pid}: {e}"))?;
        if !sent.success() {
            return Err(format!("kill -TERM {pid} failed: {sent}"));
        }
        let status = wait_deadline(&mut lock(&self.child))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "serve did not stop cleanly on SIGTERM ({status}); its log {}:\n{}",
                self.log.display(),
                tail(&self.log)
            ))
        }
    }
}

fn wait_deadline(child: &mut Child) -> Result<ExitStatus, String> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status);
        }
        if started.elapsed() > PROCESS_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("a durable-agent process overran {PROCESS_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The last lines of a log, for a report.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
