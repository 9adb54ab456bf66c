//! G1, what a GC must delete. The model states what a GC must *keep*
//! (`usage.rs`: an open turn's rows; the projection: what recovery, a
//! resume or a blocked trigger needs); this is the other half, so that a
//! GC that keeps everything (a ledger that grows forever) fails too:
//!
//! **G1.** After a GC with TTL 0 that answered, no settled row older than
//! the GC's `now` is left of an agent that is no longer live (terminated,
//! or never acknowledged): not its `DONE`/`FAILED` activity rows, not its
//! usage or error rows, not the `succeeded`/`failed` tool calls of its
//! session's runs. `System::gc` keeps rows only for live agents with
//! work to resume and for sessions with a run still unsettled (parked for a
//! human, or a job running); an agent that is not live has no turn to
//! resume, so only an unsettled run of its session keeps its usage and
//! error rows (and a parked run its calls), and those are not checked.
//!
//! Read from a detached copy of the disk with the harness's own
//! connection and SQL: no I/O point of the run, and nothing the product's
//! queries say is taken on trust.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::SimConfig;
use durable_agent::sqlite::SqliteOptions;

use super::{Driver, STORE_DB};

/// Settled rows, by owning agent, that a GC at `?1` must have deleted
/// unless the agent is live: the table's name for the message, the query.
const LEFT_BEHIND: [(&str, &str); 4] = [
    (
        "DONE/FAILED activity",
        "SELECT task_id, COUNT(*) FROM activity_log \
         WHERE status IN ('DONE', 'FAILED') AND updated_at < ?1 GROUP BY task_id ORDER BY task_id",
    ),
    (
        "token usage",
        "SELECT agent_id, COUNT(*) FROM token_usage WHERE created_at < ?1 AND session_id NOT IN \
         (SELECT session_id FROM runs WHERE status NOT IN ('succeeded', 'failed')) \
         GROUP BY agent_id ORDER BY agent_id",
    ),
    (
        "error",
        "SELECT agent_id, COUNT(*) FROM errors WHERE created_at < ?1 AND session_id NOT IN \
         (SELECT session_id FROM runs WHERE status NOT IN ('succeeded', 'failed')) \
         GROUP BY agent_id ORDER BY agent_id",
    ),
    (
        "settled tool call",
        "SELECT r.session_id, COUNT(*) FROM tool_calls c JOIN runs r ON c.run_id = r.run_id \
         WHERE c.status IN ('succeeded', 'failed') AND c.updated_at < ?1 \
         AND r.status != 'waiting_for_human' GROUP BY r.session_id ORDER BY r.session_id",
    ),
];

impl Driver {
    /// G1 after a GC at `now` (ms) that answered, `live` holding the live
    /// agents and their sessions: a violation per agent (or session) that
    /// is not live and still has rows of a kind the GC must have deleted.
    pub(super) fn collected_violations(&self, live: &BTreeSet<String>, now: u64) -> Vec<String> {
        let copy = self.fs.detached(SimConfig::new(self.seed));
        let db =
            match durable_agent::sqlite::open(Arc::new(copy), Path::new(STORE_DB), &SqliteOptions::default())
            {
                Ok(db) => db,
                Err(e) => return vec![format!("G1: the store after the GC cannot be opened: {e}")],
            };
        let mut out = Vec::new();
        for (what, sql) in LEFT_BEHIND {
            let rows = db.conn().prepare(sql).and_then(|mut stmt| {
                stmt.query_map([now], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            });
            match rows {
                Ok(rows) => out.extend(rows.into_iter().filter(|(agent, _)| !live.contains(agent)).map(
                    |(agent, n)| {
                        format!("G1: a GC at {now} ms left {n} {what} row(s) older than it of {agent}, which is not live")
                    },
                )),
                Err(e) => out.push(format!("G1: reading the {what} rows after the GC: {e}")),
            }
        }
        out
    }
}
