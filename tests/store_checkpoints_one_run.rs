//! A session's loop checkpoints are all one run's (`store::checkpoints`):
//! its messages are one sequence with no run column, and a resume rolls
//! the session back to its run's checkpoint. A second run checkpointing
//! the same session would have its acknowledged messages deleted by the
//! first run's resume at the next boot, a clean one included (found by
//! review: "Acknowledged means durable", docs/GUARANTEES.md #1). So the
//! second run's checkpoint is refused, typed and naming both runs, and
//! writes nothing; what was acknowledged survives the boot.

mod boot_support;

use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::store::checkpoints::{CheckpointInput, Message, TokenUsage};
use durable_agent::store::StoreError;
use durable_agent::system::{BootReport, System};
use durable_agent::world::World;

const SEED: u64 = 7;
const SESSION: &str = "s1";

fn boot(fs: &SimFs) -> (System, BootReport) {
    boot_support::boot_with(fs, SEED, boot_support::NOW_MS, World::with_dedup()).expect("boot")
}

fn input(run: &str, turn: u64) -> CheckpointInput {
    CheckpointInput {
        run_id: run.into(),
        session_id: SESSION.into(),
        turn,
        total_usage: TokenUsage::default(),
        tool_calls_count: turn,
    }
}

#[test]
fn a_second_run_cannot_checkpoint_a_session_and_a_reboot_keeps_every_acknowledged_message() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let (system, _) = boot(&fs);
    let checkpointed = {
        let store = system.checkpoints();
        let db = system.db();
        let c = db.conn();
        // Run "a": its prompt, then one completed tool round, checkpointed.
        store
            .append_message(c, SESSION, 0, &Message::new("user", "first run"), 1)
            .expect("append");
        store
            .write_checkpoint(c, &input("a", 0), 1)
            .expect("checkpoint a");
        store
            .append_message(c, SESSION, 1, &Message::new("assistant", "call 1"), 2)
            .expect("append");
        store
            .append_message(c, SESSION, 1, &Message::new("tool", "result 1"), 2)
            .expect("append");
        let a = store
            .write_checkpoint(c, &input("a", 1), 2)
            .expect("checkpoint a again");
        assert_eq!(a.messages.len(), 3, "a's checkpoint covers the three messages");
        // Run "b" in the same session: refused, naming both runs.
        match store.write_checkpoint(c, &input("b", 1), 3) {
            Err(StoreError::SessionOfAnotherRun {
                run_id,
                session_id,
                other_run,
            }) => {
                assert_eq!(
                    (run_id.as_str(), session_id.as_str(), other_run.as_str()),
                    ("b", SESSION, "a")
                );
            }
            other => panic!("run b's checkpoint in a's session was not refused: {other:?}"),
        }
        assert_eq!(
            store.latest_checkpoint(c, "b").expect("read b"),
            None,
            "the refused checkpoint was written"
        );
        a
    };
    // A clean stop and a boot: the one run is resumed, nothing is lost.
    drop(system);
    let (system, report) = boot(&fs);
    assert_eq!(report.loops_resumed, [("a".to_string(), 0)]);
    let db = system.db();
    let left = system
        .checkpoints()
        .messages_up_to(db.conn(), SESSION, i64::MAX)
        .expect("messages");
    assert_eq!(
        left.iter().map(|m| &m.message).collect::<Vec<_>>(),
        checkpointed
            .messages
            .iter()
            .map(|m| &m.message)
            .collect::<Vec<_>>(),
        "the boot lost acknowledged, checkpointed messages"
    );
}
