//! Loop checkpoints under crashes at every I/O point of message appends,
//! checkpoint writes and resume (ProcessCrash, PowerLoss Strict/Eager): the
//! resumed loop starts at a consistent tool-round boundary — exactly the
//! messages of rounds 1..=k for its checkpoint k, never fewer than the last
//! acknowledged checkpoint — and finishing the run from there leaves no
//! duplicated or half round behind.

mod store_crash_common;

use durable_agent::canary::{Canaries, Canary};
use durable_agent::sqlite::Db;
use durable_agent::store::checkpoints::*;
use durable_agent::store::StoreError;
use store_crash_common::{sweep, Kill, Report, CRASHES, KILLS};

const ROUNDS: u64 = 3;
const RUN: &str = "run-1";
const SESSION: &str = "s1";

#[derive(Default)]
struct Model {
    /// Turn of the last `write_checkpoint` that returned Ok.
    acked_turn: u64,
}

fn expected(turn: u64) -> Vec<String> {
    let mut v = vec!["user: hi".to_string()];
    for t in 1..=turn {
        v.push(format!("assistant: call {t}"));
        v.push(format!("tool: result {t}"));
    }
    v
}

fn texts(msgs: &[StoredMessage]) -> Vec<String> {
    msgs.iter()
        .map(|m| format!("{}: {}", m.message.role, m.message.content))
        .collect()
}

fn input(turn: u64) -> CheckpointInput {
    CheckpointInput {
        run_id: RUN.into(),
        session_id: SESSION.into(),
        turn,
        total_usage: TokenUsage {
            input_tokens: 100 * turn,
            output_tokens: 10 * turn,
        },
        tool_calls_count: turn,
    }
}

fn round(db: &Db, store: &CheckpointStore, turn: u64) -> Result<(), StoreError> {
    let c = db.conn();
    store.append_message(
        c,
        SESSION,
        turn,
        &Message::new("assistant", &format!("call {turn}")),
        turn,
    )?;
    store.append_message(
        c,
        SESSION,
        turn,
        &Message::new("tool", &format!("result {turn}")),
        turn,
    )?;
    store.write_checkpoint(c, &input(turn), turn)?;
    Ok(())
}

fn setup(db: &Db, store: &CheckpointStore) {
    store
        .append_message(db.conn(), SESSION, 0, &Message::new("user", "hi"), 0)
        .unwrap();
    store.write_checkpoint(db.conn(), &input(0), 0).unwrap();
}

/// Setup for the resume sweep: round 1 checkpointed, then the process died
/// half-way through round 2 (one message of it committed).
fn setup_crashed_mid_round(db: &Db, store: &CheckpointStore) {
    setup(db, store);
    round(db, store, 1).unwrap();
    store
        .append_message(db.conn(), SESSION, 2, &Message::new("assistant", "call 2"), 2)
        .unwrap();
}

/// The swept run for the resume sweep: resume (its rollback is swept too),
/// then finish the run.
fn run_resume(db: &Db, m: &mut Model, store: &CheckpointStore) -> Result<(), String> {
    m.acked_turn = 1;
    let r = store.resume(db.conn(), RUN, SESSION).map_err(|e| e.to_string())?;
    let from = r.checkpoint.map_or(0, |cp| cp.turn);
    for turn in from + 1..=ROUNDS {
        round(db, store, turn).map_err(|e| e.to_string())?;
        m.acked_turn = turn;
    }
    Ok(())
}

fn run(db: &Db, m: &mut Model, store: &CheckpointStore) -> Result<(), String> {
    for turn in 1..=ROUNDS {
        round(db, store, turn).map_err(|e| e.to_string())?;
        m.acked_turn = turn;
    }
    Ok(())
}

fn check(db: &Db, m: &Model, store: &CheckpointStore) -> Vec<String> {
    let mut bad = Vec::new();
    let resumed = match store.resume(db.conn(), RUN, SESSION) {
        Ok(r) => r,
        Err(e) => return vec![format!("resume failed: {e}")],
    };
    let Some(cp) = resumed.checkpoint else {
        return vec!["no checkpoint after restart (setup wrote turn 0)".into()];
    };
    if cp.turn < m.acked_turn || cp.turn > m.acked_turn + 1 {
        bad.push(format!(
            "resumed at turn {} but turn {} was acknowledged",
            cp.turn, m.acked_turn
        ));
    }
    if texts(&resumed.messages) != expected(cp.turn) {
        bad.push(format!(
            "resumed history at turn {} is {:?}, expected {:?}",
            cp.turn,
            texts(&resumed.messages),
            expected(cp.turn)
        ));
    }
    if cp.messages != resumed.messages || resumed.messages.last().map_or(0, |m| m.id) != cp.last_msg_id {
        bad.push(format!(
            "checkpoint {} disagrees with the messages table",
            cp.turn
        ));
    }
    if cp.total_usage != input(cp.turn).total_usage {
        bad.push(format!("checkpoint {} has usage {:?}", cp.turn, cp.total_usage));
    }
    // Finish the run from the resumed boundary.
    for turn in cp.turn + 1..=ROUNDS {
        if let Err(e) = round(db, store, turn) {
            bad.push(format!("round {turn} after resume failed: {e}"));
            return bad;
        }
    }
    match store.messages_up_to(db.conn(), SESSION, i64::MAX) {
        Ok(all) if texts(&all) == expected(ROUNDS) => {}
        Ok(all) => bad.push(format!(
            "finished history {:?} has duplicated or partial rounds",
            texts(&all)
        )),
        Err(e) => bad.push(format!("reading history failed: {e}")),
    }
    bad
}

fn sweep_with(canaries: Canaries, kills: &[Kill]) -> Report {
    let store = CheckpointStore::new(canaries);
    sweep(
        kills,
        &Model::default,
        &|db| setup(db, &store),
        &|db, m| run(db, m, &store),
        &|db, m| check(db, m, &store),
    )
}

fn sweep_resume_with(canaries: Canaries, kills: &[Kill]) -> Report {
    let store = CheckpointStore::new(canaries);
    sweep(
        kills,
        &Model::default,
        &|db| setup_crashed_mid_round(db, &store),
        &|db, m| run_resume(db, m, &store),
        &|db, m| check(db, m, &store),
    )
}

#[test]
fn crash_during_resume_and_rollback_still_resumes_consistently_at_every_point() {
    let report = sweep_resume_with(Canaries::none(), &KILLS);
    report.assert_clean("checkpoint resume");
    eprintln!(
        "checkpoint resume: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
    let canary = sweep_resume_with(Canaries::only(Canary::CheckpointRollbackSkipped), &CRASHES);
    assert!(
        canary.violating_crash_cases() > 0,
        "canary not caught in the resume sweep"
    );
}

#[test]
fn resume_lands_on_a_consistent_round_boundary_at_every_crash_point() {
    let report = sweep_with(Canaries::none(), &KILLS);
    report.assert_clean("checkpoints");
    assert!(
        report.points > 10,
        "suspiciously short run: {} points",
        report.points
    );
    eprintln!(
        "checkpoints: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

#[test]
fn canary_checkpoint_rollback_skipped_is_caught_at_a_crash_point() {
    let report = sweep_with(Canaries::only(Canary::CheckpointRollbackSkipped), &CRASHES);
    let hit = report.violations.iter().find(|v| v.point > 0);
    assert!(hit.is_some(), "canary not caught");
    eprintln!(
        "CheckpointRollbackSkipped caught in {} of {} crash cases (first: {:?} point {} [{}]: {})",
        report.violating_crash_cases(),
        report.cases,
        hit.map(|v| v.kill),
        hit.map_or(0, |v| v.point),
        hit.map_or("", |v| v.label.as_str()),
        hit.map_or("", |v| v.what.as_str()),
    );
}
