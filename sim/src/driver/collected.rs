//! G1, what a GC must delete. The model states what a GC must *keep*
//! (`usage.rs`: an open turn's rows; the projection: what recovery, a
//! resume or a blocked trigger needs); this is the other half, so that a
//! GC that keeps everything (a ledger that grows forever) fails too:
//!
//! **G1.** After a collecting GC pass that answered (TTLs of 1 ms:
//! `model::Action::Gc`), no settled row older than its cutoff is left of an agent that is no longer live (terminated,
//! or never acknowledged): not its `DONE`/`FAILED` activity rows, not its
//! usage or error rows, not the `succeeded`/`failed` tool calls of its
//! session's runs. `System::gc` keeps rows only for live agents with
//! work to resume and for sessions with a run still unsettled (parked for a
//! human, or a job running); an agent that is not live has no turn to
//! resume, so only an unsettled run of its session keeps its usage and
//! error rows (and a parked run its calls), and those are not checked.
//!
//! **S1.** After a stripping pass that answered (no row past the TTL,
//! every one past the payload TTL: `model::Action::Gc`), no settled row
//! older than its cutoff of an agent that is no longer live keeps its
//! body: not a `DONE`/`FAILED` activity's payload, not a
//! `succeeded`/`failed` tool call's arguments or result (the seed's
//! privacy note: the ledger holds message content). A parked run's calls
//! are not checked (`System::strip_payloads` keeps them, as GC does).
//!
//! The pass's cutoff is the op's time less its TTL (1 ms). Read from a
//! detached copy of the disk ([`Driver::store_copy`]) with the harness's own connection and SQL:
//! no I/O point of the run, and nothing the product's queries say is
//! taken on trust.

use std::collections::BTreeSet;

use durable_agent::store::activities::STRIPPED_JSON;

use super::Driver;

/// Settled rows, by owning agent (or session), that a GC with cutoff `?1` must have deleted
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

/// Settled rows, by owning agent or session, that a stripping pass at `?1`
/// must have stripped unless the owner is live (`?2`: the stripped body).
const UNSTRIPPED: [(&str, &str); 2] = [
    (
        "DONE/FAILED activity payload",
        "SELECT task_id, COUNT(*) FROM activity_log \
         WHERE status IN ('DONE', 'FAILED') AND updated_at < ?1 AND payload_json <> ?2 \
         GROUP BY task_id ORDER BY task_id",
    ),
    (
        "settled tool call body",
        "SELECT r.session_id, COUNT(*) FROM tool_calls c JOIN runs r ON c.run_id = r.run_id \
         WHERE c.status IN ('succeeded', 'failed') AND c.updated_at < ?1 \
         AND r.status != 'waiting_for_human' \
         AND (c.input_json <> ?2 OR COALESCE(c.result_json, ?2) <> ?2) \
         GROUP BY r.session_id ORDER BY r.session_id",
    ),
];

impl Driver {
    /// G1 (S1 when `strip`) after a GC pass at `now` (ms) that answered:
    /// a violation per agent (or session) that is not live and still has
    /// rows the pass must have deleted (stripped).
    pub(super) fn collected_violations(&self, now: u64, strip: bool) -> Vec<String> {
        // The live agents and their sessions (an agent's rows are keyed by
        // the one, its calls' runs by the other), as `System::gc` sees them.
        let live: BTreeSet<String> = match self.system() {
            Ok(system) => system
                .runtime()
                .state()
                .agents
                .iter()
                .flat_map(|(a, view)| [a.as_str().to_string(), view.session_id.as_str().to_string()])
                .collect(),
            Err(e) => return vec![e],
        };
        let db = match self.store_copy() {
            Ok(db) => db,
            Err(e) => {
                return vec![format!(
                    "G1/S1: the store after the GC pass cannot be opened: {e}"
                )]
            }
        };
        let cutoff = now.saturating_sub(1);
        let (check, queries) = match strip {
            false => ("G1", &LEFT_BEHIND[..]),
            true => ("S1", &UNSTRIPPED[..]),
        };
        let mut out = Vec::new();
        for (what, sql) in queries {
            let params = rusqlite::params![cutoff, STRIPPED_JSON];
            // The stripping queries bind the stripped body as well.
            let params = &params[..if strip { 2 } else { 1 }];
            let rows = db.conn().prepare(sql).and_then(|mut stmt| {
                stmt.query_map(params, |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            });
            match rows {
                Ok(rows) => out.extend(rows.into_iter().filter(|(agent, _)| !live.contains(agent)).map(
                    |(agent, n)| {
                        format!("{check}: a GC pass at {now} ms left {n} {what} row(s) older than its cutoff of {agent}, which is not live")
                    },
                )),
                Err(e) => out.push(format!("{check}: reading the {what} rows after the GC pass: {e}")),
            }
        }
        out
    }
}
