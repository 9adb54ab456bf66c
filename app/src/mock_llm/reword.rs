//! The mock's rewording mode: a model that never answers the same way
//! twice, as a real one does when it is asked again.
//!
//! Every ask (the n-th completion request the mock receives, counted from
//! 0 across all agents and turns) is answered with a deterministic variant
//! of what the mock would have said (the echo reply or the scripted one),
//! chosen by [`Reword::variant`] from the seed and the ask number:
//!
//! - a tool-call reply keeps its calls, with every string argument
//!   reworded ([`reword_text`]: another opening, and a suffix naming the
//!   ask number, so no two asks ever produce the same arguments — nor, for
//!   an irreversible call, the same idempotency key);
//! - or, when the seed says so, asks for another offered tool instead of
//!   its first call, for one call fewer (text when it was the only one),
//!   for one call more (an extra call, its string arguments marked
//!   `[extra call {index}]`), or answers with text instead of calls;
//! - a text reply is reworded the same way.
//!
//! Error replies (a scripted `status` or `raw` body) are not answers and
//! are sent as scripted.
//!
//! Invariant: the variant of ask n is a pure function of (seed, n); the
//! reworded arguments of ask n contain `[ask n]`, so they differ from those
//! of every other ask; a call's original string arguments are kept as a
//! prefix-free substring (the reworded text contains the original), so a
//! marker in the prompt (the soak's `[soak:t12]`) survives rewording.

use serde::Deserialize;
use serde_json::Value;

use super::{example_args, last_user, Message};

/// The rewording option: on the `mock-llm` command line `--reword
/// --seed N`, in a script `[reword]` with `seed = N`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reword {
    #[serde(default)]
    pub seed: u64,
}

/// How one ask's tool-call reply differs from the plain one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The same calls, their string arguments reworded.
    Reworded,
    /// Another offered tool instead of the first call's (reworded, if the
    /// request offers no other tool).
    OtherTool,
    /// One call fewer: text instead when it was the only call.
    FewerCalls,
    /// One call more: an extra call to another offered tool (to the same
    /// one if there is no other).
    MoreCalls,
    /// Text instead of calls.
    TextInstead,
}

/// Openings a reworded text starts with.
const OPENINGS: [&str; 5] = ["", "Hi! ", "Quick note: ", "As requested: ", "FYI - "];

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Reword {
    pub fn new(seed: u64) -> Reword {
        Reword { seed }
    }

    fn hash(&self, ask: usize) -> u64 {
        mix(self.seed ^ mix((ask as u64).wrapping_add(0x9e37_79b9_7f4a_7c15)))
    }

    /// The variant of ask `ask` (0-based): half the asks keep their calls
    /// (reworded), the rest split evenly between the other variants.
    pub fn variant(&self, ask: usize) -> Variant {
        match self.hash(ask) % 8 {
            0..=3 => Variant::Reworded,
            4 => Variant::OtherTool,
            5 => Variant::FewerCalls,
            6 => Variant::MoreCalls,
            _ => Variant::TextInstead,
        }
    }

    /// The opening of ask `ask`'s reworded texts.
    fn opening(&self, ask: usize) -> &'static str {
        let i = (self.hash(ask) >> 16) % OPENINGS.len() as u64;
        OPENINGS[i as usize]
    }

    /// `message` (the plain answer to `request`, ask `ask`), reworded.
    pub(super) fn apply(&self, ask: usize, request: &Value, message: Message) -> Message {
        let opening = self.opening(ask);
        if message.calls.is_empty() {
            return Message {
                text: message.text.map(|t| reword_text(&t, opening, ask)),
                ..message
            };
        }
        let reworded = |args: &str, extra: Option<usize>| reword_args(args, opening, ask, extra);
        let text_instead = |m: &Message| Message {
            text: Some(reword_text(
                &format!("no tool needed for: {}", last_user(request)),
                opening,
                ask,
            )),
            calls: Vec::new(),
            finish_reason: m.finish_reason.clone().filter(|f| f != "tool_calls"),
        };
        let mut calls: Vec<(String, String)> = message
            .calls
            .iter()
            .map(|(name, args)| (name.clone(), reworded(args, None)))
            .collect();
        match self.variant(ask) {
            Variant::Reworded => {}
            Variant::OtherTool => {
                if let Some((name, args)) = other_tool(request, &calls[0].0, self.hash(ask)) {
                    calls[0] = (name, reworded(&args, None));
                }
            }
            Variant::FewerCalls if calls.len() > 1 => {
                calls.pop();
            }
            Variant::FewerCalls | Variant::TextInstead => return text_instead(&message),
            Variant::MoreCalls => {
                let index = calls.len();
                let (name, args) = other_tool(request, &calls[0].0, self.hash(ask))
                    .unwrap_or_else(|| message.calls[0].clone());
                calls.push((name, reworded(&args, Some(index))));
            }
        }
        Message { calls, ..message }
    }
}

/// `text` as ask `ask` words it: `{opening}{text} [ask {ask}]`.
pub fn reword_text(text: &str, opening: &str, ask: usize) -> String {
    format!("{opening}{text} [ask {ask}]")
}

/// JSON-string arguments with every string inside reworded; arguments
/// that are not a JSON object (a script's deliberately malformed ones) are
/// sent as they are.
fn reword_args(args: &str, opening: &str, ask: usize, extra: Option<usize>) -> String {
    let Ok(mut value) = serde_json::from_str::<Value>(args) else {
        return args.to_string();
    };
    if !value.is_object() {
        return args.to_string();
    }
    reword_value(&mut value, &|s: &str| {
        let s = reword_text(s, opening, ask);
        match extra {
            Some(i) => format!("{s} [extra call {i}]"),
            None => s,
        }
    });
    value.to_string()
}

fn reword_value(value: &mut Value, f: &dyn Fn(&str) -> String) {
    match value {
        Value::String(s) => *s = f(s),
        Value::Array(items) => items.iter_mut().for_each(|v| reword_value(v, f)),
        Value::Object(map) => map.values_mut().for_each(|v| reword_value(v, f)),
        _ => {}
    }
}

/// A call to an offered tool other than `current` (picked by `hash` among
/// them), its arguments filled from the last user message; `None` if the
/// request offers no other tool.
fn other_tool(request: &Value, current: &str, hash: u64) -> Option<(String, String)> {
    let tools = request.get("tools").and_then(Value::as_array)?;
    let others: Vec<&Value> = tools
        .iter()
        .filter(|t| t["function"]["name"].as_str().is_some_and(|n| n != current))
        .collect();
    if others.is_empty() {
        return None;
    }
    let function = &others[(hash >> 32) as usize % others.len()]["function"];
    let name = function["name"].as_str().unwrap_or("unnamed").to_string();
    let args = example_args(&function["parameters"], &last_user(request));
    Some((name, args.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::echo;
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "send_email",
              "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                             "required": ["to", "body"]}}},
            {"type": "function", "function": {"name": "note",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
        ])
    }

    fn ask_for_email() -> Value {
        json!({"messages": [{"role": "user", "content": "[soak:t1] please use send_email"}], "tools": tools()})
    }

    /// The first seed whose ask 0 has `variant`.
    fn seed_with(variant: Variant) -> u64 {
        (0..10_000)
            .find(|s| Reword::new(*s).variant(0) == variant)
            .unwrap_or_else(|| panic!("no seed below 10000 gives {variant:?}"))
    }

    #[test]
    fn variants_are_a_pure_function_of_seed_and_ask_and_all_occur() {
        let r = Reword::new(7);
        let a: Vec<Variant> = (0..64).map(|n| r.variant(n)).collect();
        let b: Vec<Variant> = (0..64).map(|n| Reword::new(7).variant(n)).collect();
        assert_eq!(a, b);
        let other: Vec<Variant> = (0..64).map(|n| Reword::new(8).variant(n)).collect();
        assert_ne!(a, other, "another seed, other variants");
        for v in [
            Variant::Reworded,
            Variant::OtherTool,
            Variant::FewerCalls,
            Variant::MoreCalls,
            Variant::TextInstead,
        ] {
            assert!(a.contains(&v), "{v:?} never chosen in 64 asks: {a:?}");
        }
        let reworded = a.iter().filter(|v| **v == Variant::Reworded).count();
        assert!((20..=44).contains(&reworded), "{reworded} of 64 reworded");
    }

    #[test]
    fn no_two_asks_are_answered_alike_and_the_prompt_survives() {
        let r = Reword::new(3);
        let request = ask_for_email();
        let mut seen = std::collections::BTreeSet::new();
        for ask in 0..200 {
            let m = r.apply(ask, &request, echo(&request));
            let rendered = format!("{:?} {:?}", m.text, m.calls);
            assert!(rendered.contains("[soak:t1]"), "{rendered}");
            assert!(rendered.contains(&format!("[ask {ask}]")), "{rendered}");
            assert!(seen.insert(rendered.clone()), "ask {ask} repeated: {rendered}");
            // Every argument string is reworded and names its ask.
            for (_, args) in &m.calls {
                let args: Value = serde_json::from_str(args).expect("object args");
                for v in args.as_object().expect("object").values() {
                    let s = v.as_str().expect("string");
                    assert!(
                        s.ends_with(&format!("[ask {ask}]")) || s.contains("[extra call"),
                        "{s}"
                    );
                }
            }
        }
    }

    #[test]
    fn each_variant_changes_the_reply_as_named() {
        let request = ask_for_email();
        let plain = echo(&request);
        assert_eq!(plain.calls.len(), 1);
        assert_eq!(plain.calls[0].0, "send_email");

        let m = Reword::new(seed_with(Variant::Reworded)).apply(0, &request, echo(&request));
        assert_eq!(m.calls.len(), 1);
        assert_eq!(m.calls[0].0, "send_email");
        assert_ne!(m.calls[0].1, plain.calls[0].1);
        let args: Value = serde_json::from_str(&m.calls[0].1).expect("json");
        let body = args["body"].as_str().expect("body");
        assert!(
            body.contains("[soak:t1] please use send_email") && body.ends_with("[ask 0]"),
            "{body}"
        );

        let m = Reword::new(seed_with(Variant::OtherTool)).apply(0, &request, echo(&request));
        assert_eq!(m.calls.len(), 1);
        assert_eq!(m.calls[0].0, "note", "{m:?}");

        let m = Reword::new(seed_with(Variant::MoreCalls)).apply(0, &request, echo(&request));
        let names: Vec<&str> = m.calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["send_email", "note"]);
        assert!(m.calls[1].1.contains("[extra call 1]"), "{m:?}");

        for v in [Variant::FewerCalls, Variant::TextInstead] {
            let m = Reword::new(seed_with(v)).apply(0, &request, echo(&request));
            assert!(m.calls.is_empty(), "{v:?}: {m:?}");
            let text = m.text.expect("text instead");
            assert!(text.contains("[soak:t1]") && text.ends_with("[ask 0]"), "{text}");
        }

        // Fewer of two calls is one; more with a single offered tool is
        // the same tool again, marked as the extra call.
        let two = Message {
            text: None,
            calls: vec![
                ("send_email".into(), r#"{"to":"a"}"#.into()),
                ("note".into(), r#"{"text":"b"}"#.into()),
            ],
            finish_reason: None,
        };
        let m = Reword::new(seed_with(Variant::FewerCalls)).apply(0, &request, two);
        assert_eq!(m.calls.len(), 1);
        assert_eq!(m.calls[0].0, "send_email");
        let lone = json!({"messages": [{"role": "user", "content": "mail"}], "tools": [tools()[0]]});
        let m = Reword::new(seed_with(Variant::MoreCalls)).apply(0, &lone, echo(&lone));
        assert_eq!(m.calls.len(), 2);
        assert!(m.calls.iter().all(|c| c.0 == "send_email"));
        assert!(m.calls[1].1.contains("[extra call 1]"), "{m:?}");
        let m = Reword::new(seed_with(Variant::OtherTool)).apply(0, &lone, echo(&lone));
        assert_eq!(m.calls[0].0, "send_email", "no other tool: reworded");
    }

    #[test]
    fn text_replies_and_malformed_arguments() {
        let r = Reword::new(1);
        let text = Message {
            text: Some("done".into()),
            calls: Vec::new(),
            finish_reason: None,
        };
        let m = r.apply(5, &json!({}), text);
        assert!(
            m.text.as_deref().is_some_and(|t| t.ends_with("done [ask 5]")),
            "{m:?}"
        );
        assert_eq!(reword_args("{not json", "", 1, None), "{not json");
        assert_eq!(reword_args("[1]", "", 1, None), "[1]");
        assert_eq!(
            reword_args(r#"{"n":1,"s":["a"]}"#, "Hi! ", 2, None),
            r#"{"n":1,"s":["Hi! a [ask 2]"]}"#
        );
    }
}
