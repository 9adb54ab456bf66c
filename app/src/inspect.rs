//! The operator's views of a root: runs, agents (a tree; one agent's
//! conversation as JSON or a Markdown transcript), a work turn's stored
//! answer, token usage, errors, triggers, confirmations and schedules —
//! `GET` routes of the control API and `durable-agent inspect …` /
//! `durable-agent transcript …`.
//!
//! One implementation, [`answer`], over a [`Source`]: the in-memory
//! runtime and the stores' connection. The `serve` worker answers from its
//! booted system ([`crate::ops::Request::View`]); a CLI command asks the
//! daemon's API when a daemon holds the root, and otherwise reads a
//! [`snapshot`] of the stopped root (see there for why it neither boots nor
//! opens the files in place).
//!
//! Invariant: a view is read-only. It reads the runtime's in-memory state
//! (`&Runtime`: no method that writes can be called) and only SELECTs from
//! the stores ([`durable_agent::store::inspect`], and the read functions of
//! the other stores); it appends to no log, commits nothing, and never
//! takes the root lock for longer than the snapshot's copy. A read error is
//! a 500 that leaves the system usable ([`read_error`]): a failed SELECT
//! cannot have changed anything, so it is not an unknown outcome.
//!
//! Lists are pages, newest first: `?limit=` (1..=500, default 50) and
//! `?offset=`; every list answer is `{items, total, limit, offset,
//! next_offset}` (`next_offset` null on the last page).

mod agents;
pub mod cli;
mod runs;
pub mod snapshot;
mod store_views;
pub mod table;
pub mod transcript;

use durable_agent::runtime::{AgentId, Runtime};
use durable_agent::sqlite::Db;
use durable_agent::store::inspect::{Page, DEFAULT_LIMIT, MAX_LIMIT};
use durable_agent::store::triggers::TriggerStatus;
use durable_agent::store::StoreError;
use durable_agent::worker::ops::resolve_in as resolve;
use serde_json::{json, Value};

use crate::ops::OpError;
use crate::schedule::Schedule;

/// One view (a `GET` route; an `inspect` subcommand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// `GET /runs`: user runs (not the `session:…` bookkeeping runs).
    Runs(Page),
    /// `GET /runs/{id}`: status, rounds, calls, effects, outcome, usage, errors.
    Run(String),
    /// `GET /agents`: the live agents as a tree, a page of roots.
    Agents(Page),
    /// `GET /agents/{name|id}`: one agent with its conversation.
    Agent(String),
    /// `GET /transcripts/{agent|run}`: the conversation as Markdown.
    Transcript(String),
    /// `GET /work/{work_id}`: a completed work turn's stored answer.
    Work(String),
    /// `GET /usage`: tokens in total, per model, per agent and per run.
    Usage(Page),
    /// `GET /errors[?run=]`: provider-call failures with their attempt.
    Errors { run: Option<String>, page: Page },
    /// `GET /triggers[?status=]`.
    Triggers {
        status: Option<TriggerStatus>,
        page: Page,
    },
    /// `GET /triggers/{id}`: one trigger, its attempts and its work.
    Trigger(String),
    /// `GET /confirmations`: irreversible calls waiting for a human.
    Confirmations(Page),
    /// `GET /schedules`.
    Schedules(Page),
}

/// A view request the API refuses (400): what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadQuery(pub String);

impl View {
    /// The view a `GET` of `segments` (decoded path segments) with the
    /// query string `query` asks for; `None`: not a view's path.
    pub fn route(segments: &[&str], query: &str) -> Option<Result<View, BadQuery>> {
        // The query is parsed only for a view's path: another route's
        // query is not this module's to judge.
        let q = || Query::parse(query);
        let page = || q()?.page();
        let view = match segments {
            ["runs"] => page().map(View::Runs),
            ["runs", id] => Ok(View::Run(id.to_string())),
            ["agents"] => page().map(View::Agents),
            ["agents", name] => Ok(View::Agent(name.to_string())),
            ["transcripts", name] => Ok(View::Transcript(name.to_string())),
            ["work", id] => Ok(View::Work(id.to_string())),
            ["usage"] => page().map(View::Usage),
            ["errors"] => q().and_then(|q| {
                Ok(View::Errors {
                    run: q.get("run").map(str::to_string),
                    page: q.page()?,
                })
            }),
            ["triggers"] => q().and_then(|q| {
                Ok(View::Triggers {
                    status: q.status()?,
                    page: q.page()?,
                })
            }),
            ["triggers", id] => Ok(View::Trigger(id.to_string())),
            ["confirmations"] => page().map(View::Confirmations),
            ["schedules"] => page().map(View::Schedules),
            _ => return None,
        };
        Some(view)
    }

    /// The API path (with its query) that asks for this view.
    pub fn path(&self) -> String {
        let seg = crate::api::encode;
        let paged = |base: &str, page: &Page, extra: &[(&str, Option<&str>)]| {
            let mut path = format!("{base}?limit={}&offset={}", page.limit, page.offset);
            for (k, v) in extra {
                if let Some(v) = v {
                    path.push_str(&format!("&{k}={}", seg(v)));
                }
            }
            path
        };
        match self {
            View::Runs(p) => paged("/runs", p, &[]),
            View::Run(id) => format!("/runs/{}", seg(id)),
            View::Agents(p) => paged("/agents", p, &[]),
            View::Agent(name) => format!("/agents/{}", seg(name)),
            View::Transcript(name) => format!("/transcripts/{}", seg(name)),
            View::Work(id) => format!("/work/{}", seg(id)),
            View::Usage(p) => paged("/usage", p, &[]),
            View::Errors { run, page } => paged("/errors", page, &[("run", run.as_deref())]),
            View::Triggers { status, page } => {
                paged("/triggers", page, &[("status", status.map(|s| s.as_str()))])
            }
            View::Trigger(id) => format!("/triggers/{}", seg(id)),
            View::Confirmations(p) => paged("/confirmations", p, &[]),
            View::Schedules(p) => paged("/schedules", p, &[]),
        }
    }
}

/// A parsed query string (`a=1&b=x`), percent-decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Result<Query, BadQuery> {
        let mut pairs = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| crate::api::decode_component(s).map_err(BadQuery);
            pairs.push((decode(k)?, decode(v)?));
        }
        Ok(Query(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn number(&self, key: &str) -> Result<Option<u64>, BadQuery> {
        self.get(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| BadQuery(format!("`{key}` must be a non-negative integer, not {v:?}")))
            })
            .transpose()
    }

    fn page(&self) -> Result<Page, BadQuery> {
        let limit = match self.number("limit")? {
            None => DEFAULT_LIMIT,
            Some(n) if (1..=u64::from(MAX_LIMIT)).contains(&n) => n as u32,
            Some(n) => return Err(BadQuery(format!("`limit` must be 1..={MAX_LIMIT}, not {n}"))),
        };
        Ok(Page::new(limit, self.number("offset")?.unwrap_or(0)))
    }

    fn status(&self) -> Result<Option<TriggerStatus>, BadQuery> {
        self.get("status")
            .map(|s| {
                TriggerStatus::parse(&s.to_ascii_uppercase()).map_err(|_| {
                    BadQuery(format!(
                        "`status` must be PENDING, CLAIMED, DONE, FAILED or DEAD, not {s:?}"
                    ))
                })
            })
            .transpose()
    }
}

/// What a view reads: the runtime's in-memory state and the stores.
#[derive(Debug)]
pub struct Source<'a> {
    pub runtime: &'a Runtime,
    pub db: &'a Db,
    pub schedules: Vec<Schedule>,
    /// The stores' clock now (a trigger's `overdue_by_ms`).
    pub now_ms: u64,
}

/// A failed read: a 500 with the store's message; never an unknown
/// outcome (a SELECT changes nothing), so the system stays usable.
pub fn read_error(e: StoreError) -> OpError {
    OpError::Store(e)
}

/// The answer to `view`.
pub fn answer(source: &Source<'_>, view: &View) -> Result<Value, OpError> {
    match view {
        View::Runs(page) => runs::list(source, *page),
        View::Run(id) => runs::one(source, id),
        View::Work(id) => runs::work(source, id),
        View::Agents(page) => agents::tree(source, *page),
        View::Agent(name) => agents::one(source, name),
        View::Transcript(name) => transcript::view(source, name),
        View::Usage(page) => store_views::usage(source, *page),
        View::Errors { run, page } => store_views::errors(source, run.as_deref(), *page),
        View::Triggers { status, page } => store_views::triggers(source, *status, *page),
        View::Trigger(id) => store_views::trigger(source, id),
        View::Confirmations(page) => store_views::confirmations(source, *page),
        View::Schedules(page) => {
            let all: Vec<Value> = source.schedules.iter().map(|s| json!(s)).collect();
            let total = all.len() as u64;
            Ok(paged(window(all, *page), total, *page))
        }
    }
}

/// The page envelope of a list answer.
fn paged(items: Vec<Value>, total: u64, page: Page) -> Value {
    let end = page.offset.saturating_add(items.len() as u64);
    json!({
        "items": items,
        "total": total,
        "limit": page.limit,
        "offset": page.offset,
        "next_offset": (end < total).then_some(end),
    })
}

/// The rows of `all` (newest first already) that `page` covers.
fn window<T>(all: Vec<T>, page: Page) -> Vec<T> {
    let offset = usize::try_from(page.offset).unwrap_or(usize::MAX);
    all.into_iter().skip(offset).take(page.limit as usize).collect()
}

/// The live agent whose session is `session_id`, if any.
fn agent_of_session(runtime: &Runtime, session_id: &str) -> Option<AgentId> {
    runtime
        .tree()
        .nodes()
        .keys()
        .find(|id| runtime.session_id(id).is_some_and(|s| s.as_str() == session_id))
        .cloned()
}

/// `{id, name}` of a live agent (`name` null if it is gone).
fn agent_ref(runtime: &Runtime, id: &str) -> Value {
    let name = AgentId::from_hex(id)
        .ok()
        .and_then(|a| runtime.tree().get(&a).map(|n| n.name.clone()));
    json!({"id": id, "name": name})
}

/// The worker answers a view request between its steps: the runtime's
/// memory and SELECTs under the connection's lock, no runtime call while
/// it is held.
impl durable_agent::worker::ops::View for View {
    fn answer(
        &self,
        system: &durable_agent::system::System,
        schedules: Vec<Schedule>,
    ) -> Result<Value, OpError> {
        let db = system.db();
        let source = Source {
            runtime: system.runtime(),
            db: &db,
            schedules,
            now_ms: system.now_ms(),
        };
        answer(&source, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_route_and_print_back_to_the_same_path() {
        let cases = [
            "/runs?limit=2&offset=4",
            "/runs/session%3Aab",
            "/agents?limit=50&offset=0",
            "/agents/my%20bot",
            "/transcripts/job-1",
            "/work/api%3Aw1",
            "/usage?limit=50&offset=0",
            "/errors?limit=50&offset=0&run=job-1",
            "/triggers?limit=5&offset=0&status=DEAD",
            "/triggers/trg-1",
            "/confirmations?limit=50&offset=0",
            "/schedules?limit=50&offset=0",
        ];
        for path in cases {
            let (p, q) = path.split_once('?').unwrap_or((path, ""));
            let segs: Vec<String> = p
                .trim_matches('/')
                .split('/')
                .map(|s| crate::api::decode_component(s).expect("decodes"))
                .collect();
            let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
            let view = View::route(&segs, q).expect("a view").expect("valid");
            assert_eq!(view.path(), path, "{view:?}");
        }
    }

    #[test]
    fn bad_pages_and_statuses_are_refused_with_what_is_wrong() {
        for (query, needle) in [
            ("limit=0", "`limit` must be 1..=500"),
            ("limit=501", "`limit` must be 1..=500"),
            ("offset=-1", "`offset` must be a non-negative integer"),
            ("status=ASLEEP", "`status` must be"),
        ] {
            let e = View::route(&["triggers"], query)
                .expect("a view")
                .expect_err(query);
            assert!(e.0.contains(needle), "{query}: {e}");
        }
        assert!(View::route(&["nope"], "").is_none());
        // Another route's query is not judged here.
        assert!(View::route(&["status"], "limit=%zz").is_none());
    }

    #[test]
    fn a_page_envelope_says_where_the_next_page_starts() {
        let page = Page::new(2, 0);
        let v = paged(window(vec![json!(1), json!(2), json!(3)], page), 3, page);
        assert_eq!(v["items"], json!([1, 2]));
        assert_eq!(v["next_offset"], 2);
        let last = Page::new(2, 2);
        let v = paged(window(vec![json!(1), json!(2), json!(3)], last), 3, last);
        assert_eq!(v["items"], json!([3]));
        assert_eq!(v["next_offset"], Value::Null);
    }
}
