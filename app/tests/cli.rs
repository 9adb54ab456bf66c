//! The `durable-agent` binary: `check-config` reports a bad file with its
//! file, line and key, and `mock-llm` serves on loopback and prints its URL
//! (with `--reword`, never answering the same way twice).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_durable-agent");

#[test]
fn check_config_accepts_a_good_file_and_names_line_and_key_of_a_bad_one() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "[provider]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n[[tools]]\nkind = \"http_get\"\n",
    )?;
    let ok = Command::new(BIN).arg("check-config").arg(&path).output()?;
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{stdout}");
    assert!(
        stdout.contains("model m") && stdout.contains("http_get"),
        "{stdout}"
    );

    std::fs::write(
        &path,
        "[provider]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\nretries = 2\n",
    )?;
    let bad = Command::new(BIN).arg("check-config").arg(&path).output()?;
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}:4:", path.display())), "{stderr}");
    assert!(stderr.contains("`provider.retries`"), "{stderr}");
    Ok(())
}

#[test]
fn mock_llm_subcommand_prints_its_url_and_answers() -> Result<(), Box<dyn std::error::Error>> {
    let mut child = Command::new(BIN)
        .args(["mock-llm", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let base_url = line.trim();
        assert!(base_url.starts_with("http://127.0.0.1:"), "{base_url}");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(2)))
            .proxy(None)
            .build()
            .into();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
        let reply: serde_json::Value = serde_json::from_str(
            &agent
                .post(format!("{base_url}/chat/completions"))
                .header("Content-Type", "application/json")
                .send(body)?
                .body_mut()
                .read_to_string()?,
        )?;
        assert_eq!(reply["choices"][0]["message"]["content"], "echo: hello");
        Ok(())
    })();
    // Ours to stop, by its own handle.
    child.kill()?;
    child.wait()?;
    result
}

/// `mock-llm --reword --seed N`: the same request twice gets two
/// different answers, each naming its ask; the same seed again gives the
/// same answers (deterministic), and `--seed` alone is a usage error.
#[test]
fn mock_llm_reword_flag_never_answers_the_same_way_twice() -> Result<(), Box<dyn std::error::Error>> {
    let asks = |seed: &str| -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
        let mut child = Command::new(BIN)
            .args(["mock-llm", "--listen", "127.0.0.1:0", "--reword", "--seed", seed])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let result = (|| -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            let base_url = line.trim().to_string();
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(2)))
                .proxy(None)
                .build()
                .into();
            let body = serde_json::json!({"model": "m",
                "messages": [{"role": "user", "content": "mail ada"}],
                "tools": [{"type": "function", "function": {"name": "send_email",
                    "parameters": {"type": "object", "properties": {"body": {"type": "string"}}, "required": ["body"]}}}]});
            let mut answers = Vec::new();
            for _ in 0..3 {
                let text = agent
                    .post(format!("{base_url}/chat/completions"))
                    .header("Content-Type", "application/json")
                    .send(body.to_string())?
                    .body_mut()
                    .read_to_string()?;
                let reply: serde_json::Value = serde_json::from_str(&text)?;
                answers.push(reply["choices"][0]["message"].clone());
            }
            Ok(answers)
        })();
        // Ours to stop, by its own handle.
        child.kill()?;
        child.wait()?;
        result
    };
    let first = asks("5")?;
    for (ask, message) in first.iter().enumerate() {
        assert!(message.to_string().contains(&format!("[ask {ask}]")), "{message}");
    }
    assert_ne!(first[0], first[1]);
    assert_ne!(first[1], first[2]);
    assert_eq!(asks("5")?, first, "the same seed answers the same way");
    let mut usage = Command::new(BIN)
        .args(["mock-llm", "--listen", "127.0.0.1:0", "--seed", "5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = usage.try_wait()? {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            usage.kill()?;
            usage.wait()?;
            return Err("`mock-llm --seed` without --reword started serving".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2), "--seed without --reword");
    Ok(())
}

#[test]
fn shipped_examples_are_valid() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let config = durable_agent_cli::config::Config::load(&dir.join("agent.toml"))?;
    assert_eq!(config.tools.len(), 3);
    let script = durable_agent_cli::mock_llm::Script::load(&dir.join("mock-script.toml"))?;
    assert_eq!(script.replies.len(), 3);
    let job = durable_agent_cli::job::Job::load(&dir.join("job.toml"))?;
    assert_eq!(job.agent, "assistant");
    Ok(())
}

/// Logs for machines: `--log-format json` (or `DURABLE_AGENT_LOG_FORMAT`)
/// writes one JSON object per stderr line; text written to a pipe carries
/// no ANSI escapes.
#[test]
fn log_format_json_writes_one_object_per_line_and_piped_text_has_no_colour(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[provider]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n[runtime]\nroot = \"{}\"\n",
            dir.path().join("root").display()
        ),
    )?;
    let status = |extra: &[&str], env: Option<&str>| -> std::io::Result<String> {
        let mut cmd = Command::new(BIN);
        cmd.args(extra)
            .arg("status")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .env_remove("DURABLE_AGENT_LOG_FORMAT");
        if let Some(format) = env {
            cmd.env("DURABLE_AGENT_LOG_FORMAT", format);
        }
        let out = cmd.output()?;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for json in [
        status(&["--log-format", "json"], None)?,
        status(&[], Some("json"))?,
    ] {
        let lines: Vec<&str> = json.lines().collect();
        assert!(!lines.is_empty(), "the boot logs at info");
        for line in lines {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
            assert!(
                v["level"].is_string() && v["fields"]["message"].is_string(),
                "{line}"
            );
        }
        assert!(json.contains("system booted"), "{json}");
    }
    let text = status(&[], None)?;
    assert!(text.contains("system booted"), "{text}");
    assert!(!text.contains('\u{1b}'), "ANSI escapes in piped logs: {text:?}");
    Ok(())
}
