//! Runs and the tool-call ledger (seed 004): every tool invocation is a row
//! `prepared → running → succeeded | failed`, keyed by an idempotency key,
//! with its side-effect class.
//!
//! Invariant: on resume, exactly the calls left `prepared|running` are
//! returned for forced replay (in creation order); each replay is counted
//! before its tool runs, and its answer settles the *original* row (no
//! second row per key); a call asked again after `max_replays` replays
//! that never answered is not run, and its run is `waiting_for_human` —
//! in the same transaction as the refusal — until a human releases it.
//!
//! Every failed attempt of a call is a numbered row of
//! `tool_call_attempts` (numbers go on across resumes, never reused); a
//! call a hook parked for a human is `running` with a NEEDS_CONFIRMATION
//! row in the activity ledger, both written in one transaction, so
//! `System::confirm` answers it like any unknown-fate call.
//!
//! Settled calls' bodies are stripped after a TTL (`strip.rs`), and the
//! settled calls, their attempts and settled runs deleted after a longer
//! one (`gc.rs`) — never those of a run that may still resume.

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};

mod gc;
mod model;
mod strip;

pub use gc::ToolCallGcReport;
pub use strip::{STRIPPED_JSON, STRIPPED_TEXT};

pub use model::{
    FailedAttempt, NewToolCall, Parked, ReplayOf, ReplayOutcome, ReplayStart, RunStatus, SideEffect,
    ToolCall, ToolCallStatus,
};

/// A job run (seed 004): what it runs and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub run_id: String,
    /// The session of the agent that runs it.
    pub session_id: String,
    pub status: RunStatus,
    /// The run this one was forked from (`--fork`).
    pub parent_run_id: Option<String>,
    /// The job, as the caller's JSON (absent on runs not made by a job).
    pub job_json: Option<String>,
}

/// The run/tool-call ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCallStore {
    /// Replays of one call (each counted as it begins) before the next
    /// ask parks its run `waiting_for_human` instead of running it.
    pub max_replays: u32,
}

impl Default for ToolCallStore {
    fn default() -> Self {
        ToolCallStore { max_replays: 3 }
    }
}

const COLUMNS: &str = "id, run_id, tool_name, raw_tool_name, input_json, idempotency_key, \
    side_effect, status, result_json, error, replay_attempts";

impl ToolCallStore {
    /// Create the run (idempotent: an existing run is left as it is).
    pub fn create_run(
        &self,
        conn: &Connection,
        run_id: &str,
        session_id: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        conn.execute_cached(
            "INSERT INTO runs (run_id, session_id, status, created_at, updated_at) \
             VALUES (?1, ?2, 'running', ?3, ?3) ON CONFLICT(run_id) DO NOTHING",
            params![run_id, session_id, now_ms],
        )
        .map_err(sql("run create"))?;
        Ok(())
    }

    /// Create a job run (idempotent in `run_id`): the job it runs, as
    /// JSON, and the run it was forked from, if any.
    pub fn create_job_run(&self, conn: &Connection, run: &RunRecord, now_ms: u64) -> Result<(), StoreError> {
        conn.execute_cached(
            "INSERT INTO runs (run_id, session_id, status, parent_run_id, job_json, created_at, \
             updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) ON CONFLICT(run_id) DO NOTHING",
            params![
                run.run_id,
                run.session_id,
                run.status.as_str(),
                run.parent_run_id,
                run.job_json,
                now_ms
            ],
        )
        .map_err(sql("run create"))?;
        Ok(())
    }

    /// One run, with its job and parent.
    pub fn get_run(&self, conn: &Connection, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let raw: Option<(String, String, Option<String>, Option<String>)> = conn
            .query_row_cached(
                "SELECT session_id, status, parent_run_id, job_json FROM runs WHERE run_id = ?1",
                [run_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("run get"))?;
        raw.map(|(session_id, status, parent_run_id, job_json)| {
            Ok(RunRecord {
                run_id: run_id.to_string(),
                session_id,
                status: RunStatus::parse(&status)?,
                parent_run_id,
                job_json,
            })
        })
        .transpose()
    }

    /// Every run id, oldest first.
    pub fn run_ids(&self, conn: &Connection) -> Result<Vec<String>, StoreError> {
        conn.query_all_cached("SELECT run_id FROM runs ORDER BY created_at, run_id", [], |r| {
            r.get(0)
        })
        .map_err(sql("run list"))
    }

    /// The runs not settled (`running`, `waiting_for_human`), oldest
    /// first: bookkeeping `session:…` runs included (they stay `running`).
    pub fn unsettled_runs(&self, conn: &Connection) -> Result<Vec<RunRecord>, StoreError> {
        type Raw = (String, String, String, Option<String>, Option<String>);
        let raws: Vec<Raw> = conn
            .query_all_cached(
                "SELECT run_id, session_id, status, parent_run_id, job_json FROM runs \
                 WHERE status NOT IN ('succeeded', 'failed') ORDER BY created_at, run_id",
                [],
                |r| Raw::try_from(r),
            )
            .map_err(sql("run list unsettled"))?;
        raws.into_iter()
            .map(|(run_id, session_id, status, parent_run_id, job_json)| {
                Ok(RunRecord {
                    status: RunStatus::parse(&status)?,
                    run_id,
                    session_id,
                    parent_run_id,
                    job_json,
                })
            })
            .collect()
    }

    /// The ids of every call of run `run_id`, whatever their status
    /// (cheaper than [`Self::calls_of`]: no body is read).
    pub fn call_ids(&self, conn: &Connection, run_id: &str) -> Result<Vec<String>, StoreError> {
        conn.query_all_cached(
            "SELECT id FROM tool_calls WHERE run_id = ?1 ORDER BY rowid",
            [run_id],
            |r| r.get(0),
        )
        .map_err(sql("tool call ids"))
    }

    pub fn run_status(&self, conn: &Connection, run_id: &str) -> Result<RunStatus, StoreError> {
        let s: Option<String> = conn
            .query_row_cached("SELECT status FROM runs WHERE run_id = ?1", [run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("run status"))?;
        let s = s.ok_or_else(|| StoreError::NotFound {
            table: "runs",
            id: run_id.to_string(),
        })?;
        RunStatus::parse(&s)
    }

    pub fn set_run_status(
        &self,
        conn: &Connection,
        run_id: &str,
        status: RunStatus,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        set_run_status(conn, run_id, status, now_ms)
    }

    /// Record a call as `prepared` before it runs. Idempotent in the key:
    /// returns the existing row if the key is already in the ledger.
    pub fn prepare(
        &self,
        conn: &Connection,
        call: &NewToolCall,
        now_ms: u64,
    ) -> Result<ToolCall, StoreError> {
        let input = serde_json::to_string(&call.input).map_err(|source| StoreError::Json {
            what: format!("tool call input of {}", call.id),
            source,
        })?;
        conn.execute_cached(
            "INSERT INTO tool_calls (id, run_id, tool_name, raw_tool_name, input_json, \
             idempotency_key, side_effect, status, replay_attempts, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'prepared', 0, ?8, ?8) \
             ON CONFLICT(idempotency_key) DO NOTHING",
            params![
                call.id,
                call.run_id,
                call.tool_name,
                call.raw_tool_name,
                input,
                call.idempotency_key,
                call.side_effect.as_str(),
                now_ms
            ],
        )
        .map_err(sql("tool call prepare"))?;
        self.by_key(conn, &call.idempotency_key)?
            .ok_or_else(|| StoreError::NotFound {
                table: "tool_calls",
                id: call.idempotency_key.clone(),
            })
    }

    /// `prepared → running`.
    pub fn mark_running(&self, conn: &Connection, id: &str, now_ms: u64) -> Result<(), StoreError> {
        self.update(
            conn,
            id,
            "mark_running",
            "prepared",
            ToolCallStatus::Running,
            None,
            None,
            now_ms,
        )
    }

    /// `prepared|running → succeeded` with the tool's result.
    pub fn mark_succeeded(
        &self,
        conn: &Connection,
        id: &str,
        result: &serde_json::Value,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(result).map_err(|source| StoreError::Json {
            what: format!("tool call result of {id}"),
            source,
        })?;
        self.update(
            conn,
            id,
            "mark_succeeded",
            "in-flight",
            ToolCallStatus::Succeeded,
            Some(&json),
            None,
            now_ms,
        )
    }

    /// `prepared|running → failed`.
    pub fn mark_failed(
        &self,
        conn: &Connection,
        id: &str,
        error: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.update(
            conn,
            id,
            "mark_failed",
            "in-flight",
            ToolCallStatus::Failed,
            None,
            Some(error),
            now_ms,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        conn: &Connection,
        id: &str,
        op: &'static str,
        from: &'static str,
        to: ToolCallStatus,
        result: Option<&str>,
        error: Option<&str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let guard = if from == "prepared" {
            "status = 'prepared'"
        } else {
            "status IN ('prepared', 'running')"
        };
        let n = conn
            .execute_cached(
                &format!(
                    "UPDATE tool_calls SET status = ?2, result_json = COALESCE(?3, result_json), \
                     error = COALESCE(?4, error), updated_at = ?5 WHERE id = ?1 AND {guard}"
                ),
                params![id, to.as_str(), result, error, now_ms],
            )
            .map_err(sql("tool call update"))?;
        if n == 0 {
            return Err(self.wrong_state(conn, id, op, from)?);
        }
        Ok(())
    }

    /// Resume: the run's calls left `prepared|running`, oldest first, for
    /// forced replay.
    pub fn in_flight(&self, conn: &Connection, run_id: &str) -> Result<Vec<ToolCall>, StoreError> {
        self.select(
            conn,
            "WHERE run_id = ?1 AND status IN ('prepared', 'running') ORDER BY created_at, rowid",
            run_id,
        )
    }

    /// The calls of a parked run a human should look at, oldest first:
    /// those still in flight, and those whose replays reached the limit
    /// (the one that parked the run is settled with its refusal).
    pub fn stuck(&self, conn: &Connection, run_id: &str) -> Result<Vec<ToolCall>, StoreError> {
        self.select(
            conn,
            &format!(
                "WHERE run_id = ?1 AND (status IN ('prepared', 'running') OR replay_attempts >= {}) \
                 ORDER BY created_at, rowid",
                self.max_replays
            ),
            run_id,
        )
    }

    /// Every call of a run, oldest first.
    pub fn calls_of(&self, conn: &Connection, run_id: &str) -> Result<Vec<ToolCall>, StoreError> {
        self.select(conn, "WHERE run_id = ?1 ORDER BY created_at, rowid", run_id)
    }

    /// A human releases run `run_id` parked `waiting_for_human` (they fixed
    /// what made its replays die): `running` again, and the replay counts
    /// of its calls still in flight restart at 0, so a resume may replay
    /// each `max_replays` more times. A call refused while the run was
    /// parked is settled (the model read the refusal) and stays so. One
    /// transaction; a run in any other state is [`StoreError::WrongState`],
    /// unchanged.
    pub fn release(&self, conn: &Connection, run_id: &str, now_ms: u64) -> Result<RunRecord, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("run release begin"))?;
        let missing = || StoreError::NotFound {
            table: "runs",
            id: run_id.to_string(),
        };
        let run = self.get_run(&tx, run_id)?.ok_or_else(missing)?;
        if run.status != RunStatus::WaitingForHuman {
            return Err(StoreError::WrongState {
                table: "runs",
                id: run_id.to_string(),
                op: "release",
                expected: "waiting_for_human",
                actual: run.status.as_str().to_string(),
            });
        }
        set_run_status(&tx, run_id, RunStatus::Running, now_ms)?;
        tx.execute_cached(
            "UPDATE tool_calls SET replay_attempts = 0, updated_at = ?2 \
             WHERE run_id = ?1 AND status IN ('prepared', 'running')",
            params![run_id, now_ms],
        )
        .map_err(sql("run release calls"))?;
        let released = self.get_run(&tx, run_id)?.ok_or_else(missing)?;
        tx.commit().map_err(sql("run release commit"))?;
        tracing::info!(run_id, "run released by a human");
        Ok(released)
    }

    /// Begin one forced replay of in-flight call `id`, counted before the
    /// tool runs: a replay the process dies in (the tool itself brings it
    /// down) counts as much as one that answers, so a call that kills
    /// every process replaying it is run at most `1 + max_replays` times.
    /// Counted after the tool returned instead, such a call was replayed
    /// at every boot with its count stuck at 0 (found by a review,
    /// 2026-11-28). When the call already had `max_replays` replays, or
    /// its run waits for a human, it is not to run: the run is (or stays)
    /// `waiting_for_human`, in the same transaction. An approved call
    /// (`ReplayOf::Approval`: a human released it) is held to its own
    /// count only: a human's approval is not undone by another call
    /// having parked the run (found by a review).
    pub fn begin_replay(
        &self,
        conn: &Connection,
        id: &str,
        of: ReplayOf,
        now_ms: u64,
    ) -> Result<ReplayStart, StoreError> {
        let tx = WriteTx::begin(conn).map_err(sql("replay begin"))?;
        let call = self.get(&tx, id)?.ok_or_else(|| StoreError::NotFound {
            table: "tool_calls",
            id: id.to_string(),
        })?;
        if !matches!(call.status, ToolCallStatus::Prepared | ToolCallStatus::Running) {
            // A settled call is no replay: its answer is the ledger's.
            return Err(self.wrong_state(&tx, id, "begin_replay", "in-flight")?);
        }
        let parked = self.run_status(&tx, &call.run_id)? == RunStatus::WaitingForHuman;
        let held = parked && of == ReplayOf::Crash;
        let start = if held || call.replay_attempts >= self.max_replays {
            if !parked {
                set_run_status(&tx, &call.run_id, RunStatus::WaitingForHuman, now_ms)?;
                tracing::warn!(
                    run_id = call.run_id,
                    id,
                    replays = call.replay_attempts,
                    "replays exhausted: the run waits for a human"
                );
            }
            ReplayStart::Parked {
                replay_attempts: call.replay_attempts,
            }
        } else {
            let replay_attempts = call.replay_attempts + 1;
            tx.execute_cached(
                "UPDATE tool_calls SET status = 'running', replay_attempts = ?2, updated_at = ?3 WHERE id = ?1",
                params![id, replay_attempts, now_ms],
            )
            .map_err(sql("replay count"))?;
            ReplayStart::Started { replay_attempts }
        };
        tx.commit().map_err(sql("replay commit"))?;
        Ok(start)
    }

    /// Settle call `id` with the answer its replay gave the model (see
    /// [`Self::begin_replay`]): a success updates the original row and
    /// clears its replay count (seed 004: "removes the replay item"); a
    /// failure is settled `failed` with its count kept, since the model
    /// read it and no turn asks for the call again (left `running`, it
    /// was listed in flight, never stripped nor collected: found by a
    /// review). A settled call is refused (`WrongState`). One write.
    pub fn record_replay(
        &self,
        conn: &Connection,
        id: &str,
        outcome: Result<&serde_json::Value, &str>,
        now_ms: u64,
    ) -> Result<ReplayOutcome, StoreError> {
        match outcome {
            Ok(value) => {
                let json = serde_json::to_string(value).map_err(|source| StoreError::Json {
                    what: format!("tool call result of {id}"),
                    source,
                })?;
                let n = conn
                    .execute_cached(
                        "UPDATE tool_calls SET status = 'succeeded', result_json = ?2, replay_attempts = 0, \
                         updated_at = ?3 WHERE id = ?1 AND status IN ('prepared', 'running')",
                        params![id, json, now_ms],
                    )
                    .map_err(sql("replay record success"))?;
                if n == 0 {
                    return Err(self.wrong_state(conn, id, "record_replay", "in-flight")?);
                }
                Ok(ReplayOutcome::Succeeded)
            }
            Err(error) => {
                self.update(
                    conn,
                    id,
                    "record_replay",
                    "in-flight",
                    ToolCallStatus::Failed,
                    None,
                    Some(error),
                    now_ms,
                )?;
                let replay_attempts = self.get(conn, id)?.map_or(0, |c| c.replay_attempts);
                Ok(ReplayOutcome::Failed { replay_attempts })
            }
        }
    }

    /// The refusal of change `op` to call `id`, which is not `expected`.
    fn wrong_state(
        &self,
        conn: &Connection,
        id: &str,
        op: &'static str,
        expected: &'static str,
    ) -> Result<StoreError, StoreError> {
        let actual = self
            .get(conn, id)?
            .map_or("missing".to_string(), |c| c.status.as_str().to_string());
        Ok(StoreError::WrongState {
            table: "tool_calls",
            id: id.to_string(),
            op,
            expected,
            actual,
        })
    }

    /// Record a failed attempt of call `id` (`error` says why): numbered
    /// one past the last recorded one, so a call run again after a crash
    /// goes on counting. Returns its number. One statement (autocommit).
    pub fn record_attempt(
        &self,
        conn: &Connection,
        id: &str,
        error: &str,
        now_ms: u64,
    ) -> Result<u32, StoreError> {
        // Run to completion, then read back: `INSERT … RETURNING` through
        // `query_row` would drop a failed autocommit commit with the
        // statement's reset (see `UsageStore::persist_failed_attempt`).
        conn.execute_cached(
            "INSERT INTO tool_call_attempts (call_id, attempt, error, created_at) \
             SELECT ?1, COALESCE(MAX(attempt), 0) + 1, ?2, ?3 FROM tool_call_attempts WHERE call_id = ?1",
            params![id, error, now_ms],
        )
        .map_err(sql("tool call record attempt"))?;
        conn.query_row_cached(
            "SELECT attempt FROM tool_call_attempts WHERE rowid = ?1",
            [conn.last_insert_rowid()],
            |r| r.get(0),
        )
        .map_err(sql("tool call record attempt read back"))
    }

    /// Every failed attempt of call `id`, in order.
    pub fn attempts(&self, conn: &Connection, id: &str) -> Result<Vec<FailedAttempt>, StoreError> {
        conn.query_all_cached(
            "SELECT call_id, attempt, error, created_at FROM tool_call_attempts \
             WHERE call_id = ?1 ORDER BY attempt",
            [id],
            |r| {
                Ok(FailedAttempt {
                    call_id: r.get(0)?,
                    attempt: r.get(1)?,
                    error: r.get(2)?,
                    at_ms: r.get(3)?,
                })
            },
        )
        .map_err(sql("tool call attempts"))
    }

    /// Park prepared call `id` for a human (a `require_confirmation`
    /// hook): `prepared → running` and a NEEDS_CONFIRMATION row for its
    /// key in the activity ledger, in one transaction — a crash leaves
    /// both or neither, so a `running` call with no activity row can only
    /// be one a human released (`confirm --not-delivered`: run it). The
    /// activity row is the one unknown-fate calls get, so `status` lists it
    /// and `confirm` answers it the same way.
    pub fn park_for_confirmation(
        &self,
        conn: &Connection,
        id: &str,
        parked: &Parked<'_>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let payload = serde_json::to_string(parked.payload).map_err(|source| StoreError::Json {
            what: format!("parked tool call payload of {id}"),
            source,
        })?;
        let tx = WriteTx::begin(conn).map_err(sql("tool call park begin"))?;
        tx.execute_cached(
            "INSERT INTO activity_log (idem_key, task_id, action, payload_json, status, error, \
             created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 'NEEDS_CONFIRMATION', ?5, ?6, ?6) \
             ON CONFLICT(idem_key) DO NOTHING",
            params![
                parked.idem_key,
                parked.task_id,
                parked.action,
                payload,
                parked.reason,
                now_ms
            ],
        )
        .map_err(sql("tool call park"))?;
        self.mark_running(&tx, id, now_ms)?;
        tx.commit().map_err(sql("tool call park commit"))?;
        Ok(())
    }

    /// One call by id.
    pub fn get(&self, conn: &Connection, id: &str) -> Result<Option<ToolCall>, StoreError> {
        Ok(self.select(conn, "WHERE id = ?1", id)?.pop())
    }

    /// One call by idempotency key.
    pub fn by_key(&self, conn: &Connection, key: &str) -> Result<Option<ToolCall>, StoreError> {
        Ok(self.select(conn, "WHERE idempotency_key = ?1", key)?.pop())
    }

    fn select(&self, conn: &Connection, tail: &str, arg: &str) -> Result<Vec<ToolCall>, StoreError> {
        type Raw = (
            String,
            String,
            String,
            String,
            String,
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            u32,
        );
        let raws: Vec<Raw> = conn
            .query_all_cached(&format!("SELECT {COLUMNS} FROM tool_calls {tail}"), [arg], |r| {
                Raw::try_from(r)
            })
            .map_err(sql("tool call select"))?;
        raws.into_iter()
            .map(
                |(id, run_id, tool_name, raw_tool_name, input, key, side, status, result, error, replays)| {
                    let json = |what: &str, s: &str| {
                        serde_json::from_str(s).map_err(|source| StoreError::Json {
                            what: format!("tool_calls.{what} of {id}"),
                            source,
                        })
                    };
                    Ok(ToolCall {
                        input: json("input_json", &input)?,
                        result: result.as_deref().map(|r| json("result_json", r)).transpose()?,
                        side_effect: SideEffect::parse(&side)?,
                        status: ToolCallStatus::parse(&status)?,
                        id: id.clone(),
                        run_id,
                        tool_name,
                        raw_tool_name,
                        idempotency_key: key,
                        error,
                        replay_attempts: replays,
                    })
                },
            )
            .collect()
    }
}

fn set_run_status(conn: &Connection, run_id: &str, status: RunStatus, now_ms: u64) -> Result<(), StoreError> {
    let n = conn
        .execute_cached(
            "UPDATE runs SET status = ?2, updated_at = ?3 WHERE run_id = ?1",
            params![run_id, status.as_str(), now_ms],
        )
        .map_err(sql("run set status"))?;
    if n == 0 {
        return Err(StoreError::NotFound {
            table: "runs",
            id: run_id.to_string(),
        });
    }
    Ok(())
}
