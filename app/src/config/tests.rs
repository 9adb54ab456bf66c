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

/// An empty root would resolve to the config's own directory (or, for a
/// bare `--config agent.toml`, to the empty path, where the boot writes
/// `LOCK` and `store.db` into the working directory).
#[test]
fn empty_root_is_invalid() {
    let text = GOOD.replace("root = \"data\"", "root = \"\"");
    let e = err(&text);
    let line = GOOD
        .lines()
        .position(|l| l.starts_with("root = "))
        .expect("root line")
        + 1;
    assert!(
        e.starts_with(&format!(
            "/etc/agent/agent.toml:{line}: `runtime.root`: must not be empty"
        )),
        "{e}"
    );
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

/// Port 0 would hide the daemon from its CLI clients and from the tool
/// fence's rule 1, which compare against this address (found by a review).
#[test]
fn listen_port_zero_is_invalid() {
    let e = err(&format!("{GOOD}\n[api]\nlisten = \"127.0.0.1:0\"\n"));
    assert!(e.contains("`api.listen`") && e.contains("give a port"), "{e}");
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

const HOOKS: &str = r#"
[[hooks]]
matcher = "^send_"
action = "deny"
reason = "no mail from CI"

[[hooks]]
event = "PreToolUse"
action = "modify_args"
patch = { cc = "audit@example.com" }

[[hooks]]
matcher = "email"
action = "require_confirmation"
reason = "a human reads every email"

[[hooks]]
action = "command"
command = ["sh", "-c", "cat >/dev/null"]
timeout_ms = 2000
fail_closed = true

[[hooks]]
event = "PostToolUseFailure"
action = "command"
command = ["logger", "tool failed"]

[retries]
backoff_base_ms = 100

[retries.tools.send_email]
max_retries = 2

[retries.tools.http_get]
backoff_max_ms = 300
"#;

#[test]
fn hooks_and_retries_parse_with_defaults() {
    let c = parse(&format!("{GOOD}{HOOKS}")).expect("valid");
    assert_eq!(c.hooks.len(), 5);
    assert_eq!(c.hooks[0].event, "PreToolUse", "the default event");
    assert_eq!(c.hooks[0].action, HookAction::Deny);
    assert_eq!(
        c.hooks[1].patch,
        Some(serde_json::json!({"cc": "audit@example.com"}))
    );
    assert_eq!(c.hooks[2].timeout_ms, 5_000);
    assert!(c.hooks[3].fail_closed);
    assert_eq!(c.retries.backoff_base_ms, 100);
    assert_eq!(c.retries.backoff_max_ms, 5_000);
    assert_eq!(c.retries.tools["send_email"].max_retries, Some(2));
    assert!(c.summary().contains("hooks: 5"));
    // Without the sections: none, and the retry defaults.
    let c = parse(GOOD).expect("valid");
    assert!(c.hooks.is_empty() && c.retries.tools.is_empty());
    assert_eq!(
        (c.retries.backoff_base_ms, c.retries.backoff_max_ms),
        (200, 5_000)
    );
    assert_eq!((default_max_retries(false), default_max_retries(true)), (1, 0));
}

/// A bad `[[hooks]]` or `[retries]` entry: the message names the key.
#[test]
fn a_bad_hook_or_retry_names_its_key() {
    let hook = |body: &str| err(&format!("{GOOD}\n[[hooks]]\n{body}\n"));
    let cases: [(&str, &str, &str); 13] = [
        (
            "action = \"deny\"\nevent = \"PreTool\"",
            "`hooks[0].event`",
            "PostToolUseFailure",
        ),
        (
            "action = \"deny\"\nreason = \"x\"\nmatcher = \"(\"",
            "`hooks[0].matcher`",
            "not a valid regex",
        ),
        (
            "action = \"deny\"",
            "`hooks[0].reason`",
            "required for action = \"deny\"",
        ),
        (
            "action = \"require_confirmation\"\nreason = \" \"",
            "`hooks[0].reason`",
            "required",
        ),
        ("action = \"modify_args\"", "`hooks[0].patch`", "required"),
        (
            "action = \"modify_args\"\npatch = 3",
            "`hooks[0].patch`",
            "must be a table",
        ),
        ("action = \"command\"", "`hooks[0].command`", "required"),
        (
            "action = \"command\"\ncommand = [\"x\"]\ntimeout_ms = 0",
            "`hooks[0].timeout_ms`",
            "within",
        ),
        (
            "action = \"deny\"\nreason = \"x\"\nfail_closed = true",
            "`hooks[0].fail_closed`",
            "not used",
        ),
        (
            "event = \"TurnEnd\"\naction = \"deny\"\nreason = \"x\"",
            "`hooks[0].action`",
            "only observe",
        ),
        (
            "event = \"AgentStop\"\naction = \"command\"\ncommand = [\"x\"]\nmatcher = \"a\"",
            "`hooks[0].matcher`",
            "no tool",
        ),
        ("action = \"delete\"", "hooks[0].action", "unknown variant"),
        ("action = \"allow\"\nmatchr = \"x\"", "hooks[0]", "unknown field"),
    ];
    for (body, key, what) in cases {
        let e = hook(body);
        assert!(e.contains(key) && e.contains(what), "{body:?}: {e}");
        assert!(e.starts_with("/etc/agent/agent.toml:"), "{e}");
    }
    let e = err(&format!("{GOOD}\n[retries.tools.nope]\nmax_retries = 1\n"));
    assert!(
        e.contains("`retries.tools.nope`") && e.contains("no tool named"),
        "{e}"
    );
    let e = err(&format!("{GOOD}\n[retries.tools.http_get]\nmax_retries = 99\n"));
    assert!(
        e.contains("`retries.tools.http_get.max_retries`") && e.contains("limit"),
        "{e}"
    );
    let e = err(&format!(
        "{GOOD}\n[retries]\nbackoff_base_ms = 10\nbackoff_max_ms = 5\n"
    ));
    assert!(e.contains("`retries.backoff_base_ms`"), "{e}");
    // An irreversible tool that cannot deduplicate is never retried.
    let text = GOOD.replace("dedup = true", "dedup = false");
    let e = err(&format!("{text}\n[retries.tools.send_email]\nmax_retries = 1\n"));
    assert!(e.contains("`retries.tools.send_email.max_retries`"), "{e}");
    assert!(e.contains("never retried"), "{e}");
    assert!(parse(&format!("{text}\n[retries.tools.send_email]\nmax_retries = 0\n")).is_ok());
}

#[test]
fn gc_defaults_to_on_with_the_library_ttl_and_parses_overrides() {
    let c = parse(GOOD).unwrap();
    assert!(c.gc.enabled);
    assert_eq!(c.gc.ttl_ms, durable_agent::system::DEFAULT_GC_TTL_MS);
    assert_eq!(c.gc.payload_ttl_ms, DEFAULT_PAYLOAD_TTL_MS);
    assert_eq!(c.gc.period_ms, DEFAULT_GC_PERIOD_MS);
    assert!(c.summary().contains("gc: every 600000 ms"), "{}", c.summary());
    let c = parse(&format!(
        "{GOOD}\n[gc]\nttl_ms = 5000\npayload_ttl_ms = 1000\nperiod_ms = 200\n"
    ))
    .unwrap();
    assert_eq!(
        (c.gc.ttl_ms, c.gc.payload_ttl_ms, c.gc.period_ms),
        (5_000, 1_000, 200)
    );
    let off = parse(&format!("{GOOD}\n[gc]\nenabled = false\n")).unwrap();
    assert!(!off.gc.enabled && off.summary().contains("gc: off"));
}

/// A bad `[gc]` value: the message names the key.
#[test]
fn a_bad_gc_value_names_its_key() {
    let gc = |body: &str| err(&format!("{GOOD}\n[gc]\n{body}\n"));
    for (body, key, says) in [
        ("ttl_ms = 0", "`gc.ttl_ms`", "must be > 0"),
        ("payload_ttl_ms = 0", "`gc.payload_ttl_ms`", "must be > 0"),
        (
            "ttl_ms = 1000\npayload_ttl_ms = 2000\nperiod_ms = 100",
            "`gc.payload_ttl_ms`",
            "exceeds ttl_ms",
        ),
        ("period_ms = 1", "`gc.period_ms`", "must be >="),
        (
            "ttl_ms = 1000\npayload_ttl_ms = 500\nperiod_ms = 5000",
            "`gc.period_ms`",
            "exceeds ttl_ms",
        ),
        ("ttl = \"1h\"", "gc", "unknown field"),
        ("ttl_ms = \"1h\"", "gc.ttl_ms", "invalid type"),
    ] {
        let e = gc(body);
        assert!(e.contains(key) && e.contains(says), "{body}: {e}");
    }
}

#[test]
fn context_defaults_to_no_budget_and_parses_both_limits() {
    let c = parse(GOOD).unwrap();
    assert!(c.context.budget().is_unlimited());
    assert!(c.summary().contains("context: no budget"), "{}", c.summary());
    let c = parse(&format!(
        "{GOOD}\n[context]\nmax_context_tokens = 16000\nmax_messages = 200\n"
    ))
    .unwrap();
    assert_eq!(c.context.budget().max_context_tokens, Some(16_000));
    assert_eq!(c.context.budget().max_messages, Some(200));
    assert!(
        c.summary()
            .contains("at most 16000 estimated tokens, 200 messages"),
        "{}",
        c.summary()
    );
    let tokens_only = parse(&format!("{GOOD}\n[context]\nmax_context_tokens = 8000\n")).unwrap();
    assert_eq!(tokens_only.context.budget().max_messages, None);
}

/// A bad `[context]` value: the message names the key.
#[test]
fn a_bad_context_value_names_its_key() {
    let context = |body: &str| err(&format!("{GOOD}\n[context]\n{body}\n"));
    for (body, key, says) in [
        (
            "max_context_tokens = 10",
            "`context.max_context_tokens`",
            "below the minimum of 64",
        ),
        (
            "max_messages = 1",
            "`context.max_messages`",
            "below the minimum of 3",
        ),
        ("max_tokens = 100", "context", "unknown field"),
        ("max_messages = \"many\"", "context.max_messages", "invalid type"),
        (
            "max_context_tokens = -1",
            "context.max_context_tokens",
            "invalid value",
        ),
    ] {
        let e = context(body);
        assert!(e.contains(key) && e.contains(says), "{body}: {e}");
    }
}

/// A wrong type inside a `[[tools]]` entry names the entry's key and its
/// line (found by a review: serde reports an internally tagged entry's
/// errors at its `[[tools]]` line with no key).
#[test]
fn a_wrong_type_inside_a_tool_names_its_key_and_line() {
    let cases = [
        (
            "timeout_ms = 3000",
            "timeout_ms = \"fast\"",
            "http",
            "tools[0].timeout_ms",
        ),
        (
            "irreversible = true",
            "irreversible = \"yes\"",
            "http",
            "tools[0].irreversible",
        ),
        (
            "workspace = \"ws\"",
            "workspace = \"ws\"\nmax_bytes = \"big\"",
            "read_file",
            "tools[1].max_bytes",
        ),
        (
            "kind = \"http_get\"",
            "kind = \"http_get\"\ntimeout_ms = -1",
            "http_get",
            "tools[2].timeout_ms",
        ),
    ];
    for (from, to, kind, key) in cases {
        // The first tool has no timeout_ms: add one to replace.
        let good = GOOD.replace("dedup = true", "dedup = true\ntimeout_ms = 3000");
        let text = good.replace(from, to);
        assert_ne!(text, good, "{kind}: the case changed nothing");
        let e = err(&text);
        assert!(e.contains(&format!("`{key}`")), "{kind}: {e}");
        let bad = to.lines().last().unwrap_or(to);
        let line = text.lines().position(|l| l == bad).map(|i| i + 1);
        assert!(
            line.is_some_and(|n| e.starts_with(&format!("/etc/agent/agent.toml:{n}:"))),
            "{kind}: line {line:?}: {e}"
        );
    }
    // An unknown key inside a tool: named with its entry, as before.
    let e = err(&GOOD.replace("dedup = true", "dedup = true\nretries = 3"));
    assert!(e.contains("`tools[0].retries`"), "{e}");
}

/// A URL that does not parse, or names no host, is refused at load
/// naming its key (found by a review: only the `http://` prefix was
/// checked, and every call then failed).
#[test]
fn a_url_that_cannot_be_requested_is_refused_naming_its_key() {
    for (from, to, key) in [
        (
            "http://127.0.0.1:8080/v1",
            "http://exa mple.com/v1",
            "provider.base_url",
        ),
        ("http://127.0.0.1:8080/v1", "http://:8080/v1", "provider.base_url"),
        (
            "http://127.0.0.1:9000/send",
            "http://127.0.0.1:9000/send email",
            "tools[0].url",
        ),
    ] {
        let e = err(&GOOD.replace(from, to));
        assert!(e.contains(&format!("`{key}`")), "{to}: {e}");
    }
}

/// A tool's header that no request can carry is refused at load (found by
/// a review); a `${VAR}` inside a value is read at call time, and the text
/// around it is checked.
#[test]
fn a_tool_header_that_cannot_be_sent_is_refused_and_placeholders_are_allowed() {
    for headers in [
        r#"headers = { "Bad Header" = "x" }"#,
        r#"headers = { "X-Team" = "line\nbreak" }"#,
        r#"headers = { "X-Team" = "${TOKEN}\u0001" }"#,
    ] {
        let e = err(&GOOD.replace(r#"headers = { "X-Team" = "ops" }"#, headers));
        assert!(e.contains("`tools[0].headers`"), "{headers}: {e}");
    }
    let text = GOOD.replace(
        r#"headers = { "X-Team" = "ops" }"#,
        r#"headers = { "Authorization" = "Bearer ${MAIL_TOKEN}", "X-Both" = "${A}-${B}" }"#,
    );
    assert!(parse(&text).is_ok());
}

#[test]
fn allowed_hosts_take_dns_names_only() {
    let api = "\n[api]\nlisten = \"0.0.0.0:7341\"\nallow_non_loopback = true\ntoken_env = \"DA_TOKEN\"\n";
    let c = parse(&format!(
        "{GOOD}{api}allowed_hosts = [\"agent.lan\", \"box-1\"]\n"
    ))
    .expect("valid");
    assert_eq!(c.api.allowed_hosts, ["agent.lan", "box-1"]);
    for bad in [
        "agent.lan:7341",
        "http://agent.lan",
        "10.0.0.1",
        "",
        "a..b",
        "-x.lan",
        "a b",
    ] {
        let e = err(&format!("{GOOD}{api}allowed_hosts = [\"box\", \"{bad}\"]\n"));
        assert!(e.contains("`api.allowed_hosts[1]`"), "{bad:?}: {e}");
    }
}

#[test]
fn placeholders_are_read_one_way_for_checking_and_filling() {
    let env = |name: &str| match name {
        "TOKEN" => Ok("s3cret".to_string()),
        other => Err(other.to_string()),
    };
    assert_eq!(
        expand_placeholders("Bearer ${TOKEN}!", env).as_deref(),
        Ok("Bearer s3cret!")
    );
    assert_eq!(without_placeholders("a${X}b${Y}c"), "axbxc");
    // An unclosed `${` is text to both readers.
    assert_eq!(expand_placeholders("a${TOKEN", env).as_deref(), Ok("a${TOKEN"));
    assert_eq!(without_placeholders("a${X}b${Y"), "axb${Y");
    // The first unknown name is the error, and nothing after it is read.
    assert_eq!(
        expand_placeholders("${TOKEN}${MISSING}${ALSO}", env),
        Err("MISSING".to_string())
    );
}
