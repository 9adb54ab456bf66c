//! Each error shape of the config: the message names the file, the line and
//! the key.

use super::*;
use locate::line_col;

const GOOD: &str = r#"
[provider]
base_url = "http://127.0.0.1:8080/v1"
model = "gpt-test"
api_key_env = "OPENAI_API_KEY"
timeout_ms = 2000

[runtime]
root = "data"
slots = 2

[telemetry]
events_jsonl = "events.jsonl"

[[tools]]
kind = "http"
name = "send_email"
description = "Send an email"
url = "http://127.0.0.1:9000/send"
irreversible = true
dedup = true
headers = { "X-Team" = "ops" }
parameters = { type = "object", properties = { to = { type = "string" } }, required = ["to"] }

[[tools]]
kind = "read_file"
workspace = "ws"

[[tools]]
kind = "http_get"
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("/etc/agent/agent.toml"), text)
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("config unexpectedly valid:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn good_config_parses_with_defaults_and_resolved_paths() {
    let c = parse(GOOD).expect("valid");
    assert_eq!(c.provider.model, "gpt-test");
    assert_eq!(c.provider.max_retries, 3);
    assert_eq!(c.runtime.root, PathBuf::from("/etc/agent/data"));
    assert_eq!(c.runtime.max_tool_rounds, 4);
    assert_eq!(c.api.listen.to_string(), "127.0.0.1:7341");
    assert_eq!(
        c.telemetry.events_jsonl,
        Some(PathBuf::from("/etc/agent/events.jsonl"))
    );
    assert_eq!(c.tools.len(), 3);
    assert!(c.tools[0].irreversible());
    assert_eq!(c.tools[0].parameters()["required"][0], "to");
    assert_eq!(c.tools[1].name(), "read_file");
    match &c.tools[1] {
        ToolConfig::ReadFile(t) => assert_eq!(t.workspace, PathBuf::from("/etc/agent/ws")),
        other => panic!("expected read_file, got {other:?}"),
    }
    assert!(c.summary().contains("send_email: http POST"));
}

#[test]
fn toml_syntax_error_names_file_and_line() {
    let text = "[provider]\nbase_url = \"http://x\"\nmodel = \n";
    let e = err(text);
    assert!(e.starts_with("/etc/agent/agent.toml:3:"), "{e}");
}

#[test]
fn unknown_key_names_line_and_key_path() {
    let text = GOOD.replace("timeout_ms = 2000", "timeout_ms = 2000\ntimeout_msec = 1");
    let e = err(&text);
    assert!(e.starts_with("/etc/agent/agent.toml:7:"), "{e}");
    assert!(e.contains("`provider.timeout_msec`"), "{e}");
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn wrong_type_names_line_and_key_path() {
    let text = GOOD.replace("slots = 2", "slots = \"two\"");
    let e = err(&text);
    assert!(e.starts_with("/etc/agent/agent.toml:10:"), "{e}");
    assert!(e.contains("`runtime.slots`"), "{e}");
}

#[test]
fn missing_key_names_its_table() {
    let text = GOOD.replace("model = \"gpt-test\"\n", "");
    let e = err(&text);
    assert!(e.contains("missing field `model`"), "{e}");
    assert!(e.contains("`provider"), "{e}");
}

#[test]
fn unknown_key_in_a_tool_names_the_tool_entry() {
    let text = GOOD.replace("dedup = true", "dedup = true\nretries = 3");
    let e = err(&text);
    assert!(e.contains("tools[0]"), "{e}");
    assert!(e.contains("retries"), "{e}");
}

#[test]
fn unknown_tool_kind_is_an_error_naming_the_entry() {
    let text = GOOD.replace("kind = \"http_get\"", "kind = \"shell\"");
    let e = err(&text);
    assert!(e.contains("tools[2]"), "{e}");
    assert!(e.contains("shell"), "{e}");
}

#[test]
fn empty_model_is_invalid() {
    let text = GOOD.replace("model = \"gpt-test\"", "model = \" \"");
    let e = err(&text);
    assert_eq!(e, "/etc/agent/agent.toml:4: `provider.model`: must not be empty");
}

#[test]
fn irreversible_get_is_invalid() {
    let text = GOOD.replace(
        "url = \"http://127.0.0.1:9000/send\"",
        "url = \"http://127.0.0.1:9000/send\"\nmethod = \"GET\"",
    );
    let e = err(&text);
    assert!(e.starts_with("/etc/agent/agent.toml:"), "{e}");
    assert!(e.contains("`tools[0].method`"), "{e}");
    assert!(e.contains("irreversible tool cannot use GET"), "{e}");
    // The line is the `method` key's line.
    let line = GOOD
        .lines()
        .position(|l| l.starts_with("url = \"http://127.0.0.1:9000/send\""))
        .expect("url line")
        + 2;
    assert!(e.starts_with(&format!("/etc/agent/agent.toml:{line}:")), "{e}");
}

#[test]
fn duplicate_tool_names_are_invalid() {
    let text = format!("{GOOD}\n[[tools]]\nkind = \"read_file\"\nworkspace = \"other\"\n");
    let e = err(&text);
    assert!(e.contains("`tools[3].name`"), "{e}");
    assert!(e.contains("duplicate tool name \"read_file\""), "{e}");
}

#[test]
fn non_loopback_listen_needs_opt_in() {
    let text = format!("{GOOD}\n[api]\nlisten = \"0.0.0.0:7341\"\n");
    let e = err(&text);
    assert!(e.contains("`api.listen`"), "{e}");
    assert!(e.contains("allow_non_loopback"), "{e}");
    let text = format!("{GOOD}\n[api]\nlisten = \"0.0.0.0:7341\"\nallow_non_loopback = true\n");
    let e = err(&text);
    assert!(e.contains("`api.token_env`"), "{e}");
    let text = format!(
        "{GOOD}\n[api]\nlisten = \"0.0.0.0:7341\"\nallow_non_loopback = true\ntoken_env = \"DA_TOKEN\"\n"
    );
    assert!(parse(&text).is_ok());
}

#[test]
fn a_token_in_place_of_its_variable_name_is_invalid() {
    let text = format!("{GOOD}\n[api]\ntoken_env = \"3f9a0c-secret\"\n");
    let e = err(&text);
    assert!(e.contains("`api.token_env`"), "{e}");
    assert!(e.contains("NAME of an environment variable"), "{e}");
}

#[test]
fn api_key_in_place_of_its_variable_name_is_invalid() {
    let text = GOOD.replace("\"OPENAI_API_KEY\"", "\"sk-abc123\"");
    let e = err(&text);
    assert!(e.contains("`provider.api_key_env`"), "{e}");
    assert!(e.contains("NAME of an environment variable"), "{e}");
}

#[test]
fn retries_above_the_limit_are_invalid() {
    let text = GOOD.replace("timeout_ms = 2000", "timeout_ms = 2000\nmax_retries = 1000");
    let e = err(&text);
    assert!(e.contains("`provider.max_retries`"), "{e}");
    assert!(e.contains("limit"), "{e}");
}

#[test]
fn missing_file_names_the_path() {
    let e = Config::load(Path::new("/nonexistent/agent.toml"))
        .expect_err("no such file")
        .to_string();
    assert!(
        e.starts_with("/nonexistent/agent.toml: cannot read config"),
        "{e}"
    );
}

#[test]
fn line_col_counts_from_one() {
    assert_eq!(line_col("ab\ncd", 0), (1, 1));
    assert_eq!(line_col("ab\ncd", 4), (2, 2));
    assert_eq!(line_col("ab\ncd", 99), (2, 3));
}
