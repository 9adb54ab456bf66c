//! An agent's conversation as a Markdown transcript (seed 004's
//! `transcript.md`): `GET /transcripts/{agent|run}` answers
//! `{agent, run, markdown}`; `durable-agent transcript AGENT|RUN` prints
//! the Markdown.
//!
//! Shape: a header (agent, session, parent, run), then one `## Turn N`
//! section per completed turn — the prompt, each tool call with its
//! arguments (JSON) and result, the response — and, last, the interrupted
//! turn the agent would resume, marked as such (it is not part of the
//! conversation until it completes).
//!
//! Invariant: [`render`] is a pure function of the conversation: the same
//! conversation gives the same bytes; text from the model or a tool is
//! quoted in a code fence longer than any backtick run inside it, so it
//! can never close the fence or become Markdown structure.

use durable_agent::runtime::{AgentId, ConversationItem, OpenTurn};
use durable_agent::store::inspect as q;
use serde_json::{json, Value};

use super::{agent_of_session, resolve, Source};
use crate::ops::OpError;

/// Who the transcript is of.
#[derive(Debug, Clone)]
pub struct Header<'a> {
    pub name: &'a str,
    pub agent_id: &'a str,
    pub session_id: Option<&'a str>,
    pub parent: Option<&'a str>,
    /// The run asked for, and its status.
    pub run: Option<(&'a str, &'a str)>,
}

/// `GET /transcripts/{agent|run}`: an agent by name or id, else a run by
/// id (its agent's conversation).
pub fn view(source: &Source<'_>, name: &str) -> Result<Value, OpError> {
    let runtime = source.runtime;
    let (agent, run) = match resolve(runtime, name) {
        Ok(agent) => (agent, None),
        Err(OpError::NotFound(_)) => {
            let Some(run) = q::run(source.db.conn(), name).map_err(super::read_error)? else {
                return Err(OpError::NotFound(format!(
                    "no live agent and no run named {name:?} (list them: GET /agents, GET /runs)"
                )));
            };
            let agent = agent_of_session(runtime, &run.session_id).ok_or_else(|| {
                OpError::NotFound(format!(
                    "run {name:?}: its agent (session {}) is gone (terminated); its conversation is not kept",
                    run.session_id
                ))
            })?;
            (agent, Some(run))
        }
        Err(e) => return Err(e),
    };
    let state = runtime.state();
    let view = state
        .agents
        .get(&agent)
        .ok_or_else(|| OpError::NotFound(format!("agent {agent} left the tree")))?;
    let conversation = state.conversations.get(&agent).map_or(&[][..], Vec::as_slice);
    let open = runtime.open_turn(&agent).ok().flatten();
    let parent = view.parent.as_ref().map(AgentId::as_str);
    let header = Header {
        name: &view.name,
        agent_id: agent.as_str(),
        session_id: Some(view.session_id.as_str()),
        parent,
        run: run.as_ref().map(|r| (r.run_id.as_str(), r.status.as_str())),
    };
    Ok(json!({
        "agent": {"id": agent, "name": view.name},
        "run_id": run.as_ref().map(|r| r.run_id.clone()),
        "markdown": render(&header, conversation, open),
    }))
}

/// A fence longer than every backtick run in `text` (at least three).
fn fence(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    "`".repeat((longest + 1).max(3))
}

fn quoted(out: &mut String, lang: &str, text: &str) {
    let f = fence(text);
    out.push_str(&format!("{f}{lang}\n{text}\n{f}\n\n"));
}

fn items(out: &mut String, items: &[ConversationItem]) {
    for item in items {
        match item {
            ConversationItem::Prompt { text } => {
                out.push_str("**User**\n\n");
                quoted(out, "text", text);
            }
            ConversationItem::ToolCall {
                call_id,
                tool,
                args,
                irreversible,
            } => {
                let kind = if *irreversible { ", irreversible" } else { "" };
                out.push_str(&format!("**Tool call** `{tool}` (call `{call_id}`{kind})\n\n"));
                let args = serde_json::to_string_pretty(args).unwrap_or_else(|_| args.to_string());
                quoted(out, "json", &args);
            }
            ConversationItem::ToolResult { call_id, ok, output } => {
                let how = if *ok { "ok" } else { "failed" };
                out.push_str(&format!("**Tool result** (call `{call_id}`, {how})\n\n"));
                quoted(out, "text", output);
            }
            ConversationItem::Response { text } => {
                out.push_str("**Assistant**\n\n");
                quoted(out, "text", text);
            }
        }
    }
}

/// The Markdown transcript of `conversation` (completed turns) and the
/// agent's interrupted turn `open`, if any.
pub fn render(header: &Header<'_>, conversation: &[ConversationItem], open: Option<&OpenTurn>) -> String {
    let mut out = format!("# Transcript: {}\n\n", header.name);
    out.push_str(&format!("- agent: `{}`\n", header.agent_id));
    if let Some(s) = header.session_id {
        out.push_str(&format!("- session: `{s}`\n"));
    }
    out.push_str(&match header.parent {
        Some(p) => format!("- parent: `{p}`\n"),
        None => "- parent: none (a root agent)\n".to_string(),
    });
    if let Some((run, status)) = header.run {
        out.push_str(&format!("- run: `{run}` ({status})\n"));
    }
    // Split the conversation at its prompts: one section per turn.
    let starts: Vec<usize> = conversation
        .iter()
        .enumerate()
        .filter(|(_, i)| matches!(i, ConversationItem::Prompt { .. }))
        .map(|(n, _)| n)
        .collect();
    out.push_str(&format!("- turns: {}\n\n", starts.len()));
    for (turn, start) in starts.iter().enumerate() {
        let end = starts.get(turn + 1).copied().unwrap_or(conversation.len());
        out.push_str(&format!("## Turn {}\n\n", turn + 1));
        items(&mut out, &conversation[*start..end]);
    }
    if let Some(open) = open {
        out.push_str(&format!(
            "## Turn {} (interrupted at round {}: not complete, resumes when run again{})\n\n",
            starts.len() + 1,
            open.round,
            open.work
                .as_deref()
                .map_or(String::new(), |w| format!("; work `{w}`"))
        ));
        out.push_str("**User**\n\n");
        quoted(&mut out, "text", &open.prompt);
        items(&mut out, &open.items);
        for (_, call) in open.pending_calls() {
            out.push_str(&format!(
                "**Tool call, decided, no result yet** `{}` (call `{}`)\n\n",
                call.tool, call.call_id
            ));
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_text_cannot_close_its_fence() {
        assert_eq!(fence("plain"), "```");
        assert_eq!(fence("a ``` b"), "````");
        let header = Header {
            name: "a",
            agent_id: "00",
            session_id: None,
            parent: None,
            run: None,
        };
        let md = render(
            &header,
            &[
                ConversationItem::Prompt { text: "hi".into() },
                ConversationItem::Response {
                    text: "```\n# not a heading".into(),
                },
            ],
            None,
        );
        assert!(md.contains("````text\n```\n# not a heading\n````"), "{md}");
        assert!(md.contains("## Turn 1"), "{md}");
    }
}
