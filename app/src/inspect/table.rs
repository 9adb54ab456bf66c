//! The CLI's text rendering of a view's JSON answer: aligned tables for
//! lists, `key: value` lines for one item, the Markdown for a transcript.
//!
//! It renders the JSON (not the Rust values), so a view printed from a
//! daemon's answer and one printed from a snapshot are printed by the same
//! code from the same shape.
//!
//! Invariant: total — any JSON renders (a missing field prints `-`), a
//! cell is one line of at most [`MAX_CELL_CHARS`] characters, and nothing
//! here fails.

use serde_json::Value;

use super::View;

/// Longest cell printed (longer text is cut with `…`; `--json` has it all).
pub const MAX_CELL_CHARS: usize = 60;

/// `v` as one table cell.
fn cell(v: &Value) -> String {
    let text = match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match one_line.chars().count() > MAX_CELL_CHARS {
        true => {
            let cut: String = one_line.chars().take(MAX_CELL_CHARS - 1).collect();
            format!("{cut}…")
        }
        false => one_line,
    }
}

/// An aligned table: a header row, then `rows`.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The rows of a list's `items`, one cell per `(header, field path)`.
fn list(value: &Value, columns: &[(&str, &[&str])]) -> String {
    let rows: Vec<Vec<String>> = value["items"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|item| columns.iter().map(|(_, path)| cell(at(item, path))).collect())
        .collect();
    let headers: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    let mut out = table(&headers, &rows);
    out.push_str(&footer(value, rows.len()));
    out
}

/// The value at `path` (object keys) in `v`, `null` if absent.
fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

/// Where a page is in its list, and how to get the next one.
fn footer(value: &Value, shown: usize) -> String {
    let total = value["total"].as_u64().unwrap_or(0);
    let offset = value["offset"].as_u64().unwrap_or(0);
    let range = match shown {
        0 => format!("none of {total}"),
        n => format!("{}-{} of {total}", offset + 1, offset + n as u64),
    };
    match value["next_offset"].as_u64() {
        Some(next) => format!("({range}, newest first; next page: --offset {next})\n"),
        None => format!("({range}, newest first)\n"),
    }
}

/// `key: value` lines for the given fields of one object.
fn fields(value: &Value, keys: &[&str]) -> String {
    let width = keys.iter().map(|k| k.len()).max().unwrap_or(0);
    keys.iter()
        .map(|k| format!("{k:<width$}  {}\n", cell(&value[*k])))
        .collect()
}

fn section(out: &mut String, title: &str, body: &str) {
    out.push_str(&format!("\n{title}:\n{body}"));
}

fn tree(node: &Value, depth: usize, rows: &mut Vec<Vec<String>>) {
    rows.push(vec![
        format!("{}{}", "  ".repeat(depth), cell(&node["name"])),
        cell(&node["id"]),
        cell(&node["turns"]),
        cell(&node["pending_messages"]),
        cell(&node["open_turn"]),
    ]);
    for child in node["children"].as_array().map_or(&[][..], Vec::as_slice) {
        tree(child, depth + 1, rows);
    }
}

/// The text the CLI prints for `view`'s answer `value`.
pub fn render(view: &View, value: &Value) -> String {
    let mut out: String;
    match view {
        View::Runs(_) => {
            out = list(
                value,
                &[
                    ("RUN", &["run_id"]),
                    ("STATUS", &["status"]),
                    ("AGENT", &["agent", "name"]),
                    ("PARENT", &["parent_run_id"]),
                ],
            )
        }
        View::Run(_) => {
            out = fields(
                value,
                &[
                    "run_id",
                    "status",
                    "work",
                    "parent_run_id",
                    "session_id",
                    "rounds",
                ],
            );
            let a = &value["agent"];
            out.push_str(&format!(
                "agent          {} ({})\n",
                cell(&a["name"]),
                cell(&a["id"])
            ));
            out.push_str(&format!(
                "outcome        {}{}\n",
                cell(&value["outcome"]["state"]),
                value["outcome"]["response"]
                    .as_str()
                    .map_or(String::new(), |r| format!(": {}", cell(&Value::String(r.into()))))
            ));
            let u = &value["usage"];
            out.push_str(&format!(
                "usage          {} calls, {} in / {} out tokens\n",
                cell(&u["calls"]),
                cell(&u["input_tokens"]),
                cell(&u["output_tokens"])
            ));
            let calls = as_rows(
                &value["calls"],
                &["call_id", "tool", "status", "replays", "round", "idem_key"],
            );
            section(
                &mut out,
                "calls",
                &table(&["CALL", "TOOL", "STATUS", "REPLAYS", "ROUND", "KEY"], &calls),
            );
            let effects = as_rows(
                &value["effects"],
                &["idem_key", "action", "status", "provider_ref"],
            );
            section(
                &mut out,
                "effects",
                &table(&["KEY", "ACTION", "STATUS", "REF"], &effects),
            );
            let errors = as_rows(
                &value["errors"]["items"],
                &["turn", "attempt", "context", "message"],
            );
            section(
                &mut out,
                "errors",
                &table(&["TURN", "ATTEMPT", "CONTEXT", "MESSAGE"], &errors),
            );
        }
        View::Agents(_) => {
            let mut rows = Vec::new();
            for root in value["items"].as_array().map_or(&[][..], Vec::as_slice) {
                tree(root, 0, &mut rows);
            }
            out = table(&["NAME", "ID", "TURNS", "PENDING", "OPEN_TURN"], &rows);
            out.push_str(&footer(value, value["items"].as_array().map_or(0, Vec::len)));
        }
        View::Agent(_) => {
            out = fields(
                value,
                &[
                    "id",
                    "name",
                    "parent",
                    "session_id",
                    "session_state",
                    "turns",
                    "instructions",
                ],
            );
            let items: Vec<Vec<String>> = value["conversation"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .map(|i| {
                    let text = ["text", "output"]
                        .iter()
                        .map(|k| &i[*k])
                        .find(|v| !v.is_null())
                        .map_or_else(|| cell(&i["args"]), cell);
                    vec![cell(&i["kind"]), cell(&i["tool"]), text]
                })
                .collect();
            section(
                &mut out,
                "conversation (`transcript` prints it all)",
                &table(&["KIND", "TOOL", "TEXT"], &items),
            );
            if !value["open_turn"].is_null() {
                out.push_str(&format!(
                    "\ninterrupted turn at round {}: {}\n",
                    cell(&value["open_turn"]["round"]),
                    cell(&value["open_turn"]["prompt"])
                ));
            }
        }
        View::Transcript(_) => out = format!("{}\n", value["markdown"].as_str().unwrap_or("")),
        View::Work(_) => {
            out = fields(value, &["work", "response"]);
            out.push_str(&format!(
                "agent     {} ({})\n",
                cell(&value["agent"]["name"]),
                cell(&value["agent"]["id"])
            ));
            let calls = as_rows(&value["tool_calls"], &["call_id", "tool", "ok", "output"]);
            section(
                &mut out,
                "calls",
                &table(&["CALL", "TOOL", "OK", "OUTPUT"], &calls),
            );
        }
        View::Usage(_) => {
            let t = &value["total"];
            out = format!(
                "total: {} calls, {} input tokens, {} output tokens\n",
                cell(&t["calls"]),
                cell(&t["input_tokens"]),
                cell(&t["output_tokens"])
            );
            let tokens: &[(&str, &[&str])] = &[
                ("CALLS", &["calls"]),
                ("INPUT", &["input_tokens"]),
                ("OUTPUT", &["output_tokens"]),
            ];
            let by_model = as_rows(
                &value["by_model"],
                &["model", "calls", "input_tokens", "output_tokens"],
            );
            section(
                &mut out,
                "by model",
                &table(&["MODEL", "CALLS", "INPUT", "OUTPUT"], &by_model),
            );
            let mut agent_cols: Vec<(&str, &[&str])> =
                vec![("AGENT", &["agent", "name"]), ("SESSION", &["session_id"])];
            agent_cols.extend_from_slice(tokens);
            section(&mut out, "by agent", &list(&value["by_agent"], &agent_cols));
            let mut run_cols: Vec<(&str, &[&str])> = vec![("RUN", &["run_id"]), ("STATUS", &["status"])];
            run_cols.extend_from_slice(tokens);
            section(&mut out, "by run", &list(&value["by_run"], &run_cols));
        }
        View::Errors { .. } => {
            out = list(
                value,
                &[
                    ("AGENT", &["agent", "name"]),
                    ("TURN", &["turn"]),
                    ("ATTEMPT", &["attempt"]),
                    ("CONTEXT", &["context"]),
                    ("MESSAGE", &["message"]),
                ],
            )
        }
        View::Triggers { .. } => {
            out = list(
                value,
                &[
                    ("ID", &["id"]),
                    ("STATUS", &["status"]),
                    ("KEY", &["dedup_key"]),
                    ("AGENT", &["agent"]),
                    ("ATTEMPTS", &["attempts"]),
                    ("LAST_ERROR", &["last_error"]),
                ],
            )
        }
        View::Trigger(_) => {
            out = fields(
                value,
                &[
                    "id",
                    "status",
                    "source",
                    "dedup_key",
                    "agent",
                    "prompt",
                    "work",
                    "attempts",
                    "last_error",
                    "fire_at_ms",
                ],
            );
            out.push_str(&format!(
                "{:<10}  {}{}\n",
                "outcome",
                cell(&value["work_outcome"]["state"]),
                value["work_outcome"]["response"]
                    .as_str()
                    .map_or(String::new(), |r| format!(": {}", cell(&Value::String(r.into()))))
            ));
        }
        View::Confirmations(_) => {
            out = list(
                value,
                &[
                    ("KEY", &["idem_key"]),
                    ("ACTION", &["action"]),
                    ("AGENT", &["agent", "name"]),
                    ("CALL_STATUS", &["call", "status"]),
                ],
            );
            if value["total"].as_u64().unwrap_or(0) > 0 {
                out.push_str("answer each: durable-agent confirm --config FILE KEY --delivered|--not-delivered|--abandon\n");
            }
        }
        View::Schedules(_) => {
            out = list(
                value,
                &[
                    ("ID", &["id"]),
                    ("AGENT", &["agent"]),
                    ("PERIOD_MS", &["period_ms"]),
                    ("PROMPT", &["prompt"]),
                ],
            )
        }
    }
    out
}

fn as_rows(list: &Value, keys: &[&str]) -> Vec<Vec<String>> {
    list.as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|item| keys.iter().map(|k| cell(&item[*k])).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_json_renders_and_cells_stay_one_short_line() {
        assert_eq!(cell(&json!(null)), "-");
        assert_eq!(cell(&json!("a\nb")), "a b");
        let long = "x".repeat(200);
        assert_eq!(cell(&json!(long)).chars().count(), MAX_CELL_CHARS);
        let page = durable_agent::store::inspect::Page::default();
        // Not the shape the view answers: still renders.
        for view in [
            View::Runs(page),
            View::Run("r".into()),
            View::Usage(page),
            View::Agents(page),
        ] {
            let _ = render(&view, &json!({"unexpected": true}));
        }
    }
}
