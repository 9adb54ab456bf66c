//! The oracle accepts exactly the documented relaxations (R1–R4) and
//! rejects everything else. Built on model states only: no runtime.
//! (`Model::expected` is the state with its derived session records, as
//! the projection reads them from disk.)

use durable_agent_sim::model::{Action, Model, Status};
use durable_agent_sim::op::ToolStep;
use durable_agent_sim::oracle::{judge, state_invariants, Side};

fn model(actions: &[Action]) -> Model {
    let mut m = Model::default();
    for a in actions {
        m.apply(a);
    }
    m
}

fn root(name: &str) -> Action {
    Action::CreateRoot { name: name.into() }
}

fn send(from: &str, to: &str, payload: &str) -> Action {
    Action::SendMessage {
        from: from.into(),
        to: to.into(),
        payload: payload.into(),
    }
}

fn turn(agent: &str, prompt: &str, tools: Vec<ToolStep>) -> Action {
    Action::RunTurn {
        agent: agent.into(),
        prompt: prompt.into(),
        tools,
        response: "r".into(),
        reads: false,
    }
}

const IRREV: ToolStep = ToolStep {
    irreversible: true,
    ok: true,
    joins_round: false,
    lost: durable_agent_sim::op::Lost::None,
    orch: durable_agent_sim::op::Orch::None,
    provider_fails: 0,
    garbled: false,
    denied: false,
    confirm: false,
};

#[test]
fn exact_recovered_state_is_accepted_with_sessions_suspended() {
    let m = model(&[root("a"), send("a", "a", "m1")]);
    let recovered = m.restarted().expected();
    let ok = judge(&m, None, None, &recovered, false).unwrap();
    assert_eq!(ok.side, Side::After);
    assert!(ok
        .adopted
        .state
        .agents
        .values()
        .all(|a| a.status == Status::Suspended));
}

#[test]
fn interrupted_spawn_may_vanish_but_not_half_exist() {
    let before = model(&[root("a")]);
    let action = Action::SpawnChild {
        parent: "a".into(),
        name: "b".into(),
    };
    let mut after = before.clone();
    after.apply(&action);
    let vanished = before.restarted().expected();
    assert_eq!(
        judge(&before, Some(&after), Some(&action), &vanished, false)
            .unwrap()
            .side,
        Side::Before
    );
    // The child present with the wrong parent is neither candidate.
    let mut wrong = after.restarted().expected();
    wrong.agents.get_mut("b").unwrap().parent = None;
    assert!(judge(&before, Some(&after), Some(&action), &wrong, false).is_err());
}

#[test]
fn acknowledged_message_lost_is_rejected() {
    let m = model(&[root("a"), send("a", "a", "m1")]);
    let mut recovered = m.restarted().expected();
    recovered.agents.get_mut("a").unwrap().pending.clear();
    let err = judge(&m, None, None, &recovered, false).unwrap_err();
    assert!(err.reason.contains("messages lost"), "{}", err.reason);
}

#[test]
fn delivered_message_may_come_back_as_pending_in_order() {
    let deliver = Action::Deliver { agent: "a".into() };
    let m = model(&[
        root("a"),
        send("a", "a", "m1"),
        send("a", "a", "m2"),
        deliver,
        send("a", "a", "m3"),
    ]);
    let mut recovered = m.restarted().expected();
    let a = recovered.agents.get_mut("a").unwrap();
    let m2 = a.delivered.pop().unwrap();
    a.pending.insert(0, m2.clone());
    let ok = judge(&m, None, None, &recovered, false).unwrap();
    assert_eq!(ok.adopted.state.agents["a"].pending[0], m2);
    // Out of order (behind m3) is not re-delivery, it is reordering.
    let mut reordered = m.restarted().expected();
    let a = reordered.agents.get_mut("a").unwrap();
    let m2 = a.delivered.pop().unwrap();
    a.pending.push(m2);
    assert!(judge(&m, None, None, &reordered, false).is_err());
    // After a clean stop and start nothing comes back: R3 is for crashes.
    let err = judge(&m, None, None, &recovered, true).unwrap_err();
    assert!(err.reason.contains("clean restart"), "{}", err.reason);
    assert!(judge(&m, None, None, &m.restarted().expected(), true).is_ok());
}

#[test]
fn lost_turn_may_leave_its_side_effect_once_but_no_other() {
    let before = model(&[root("a")]);
    let action = turn("a", "p1:I", vec![IRREV]);
    let mut after = before.clone();
    after.apply(&action);
    let mut recovered = before.restarted().expected();
    recovered.outbox.push("a/p1:I#0".into());
    let ok = judge(&before, Some(&after), Some(&action), &recovered, false).unwrap();
    assert_eq!(ok.side, Side::Before);
    assert_eq!(ok.adopted.state.outbox, vec!["a/p1:I#0".to_string()]);
    // An effect of no in-flight turn is rejected.
    let mut stray = before.restarted().expected();
    stray.outbox.push("a/p9:I#0".into());
    assert!(judge(&before, Some(&after), Some(&action), &stray, false).is_err());
    // Between ops there is no in-flight turn: any extra effect is rejected.
    assert!(judge(&before, None, None, &recovered, false).is_err());
}

/// A turn may stop for a human only with the identity of one a crash
/// rolled back (its INTENT may be in the ledger): the immediate re-run, or
/// a turn with its prompt run after other turns of its agent (the runtime
/// keys it the same, `turn_identity`) — but not once a turn with that
/// prompt completed (the identity moved on), and never a fresh prompt.
#[test]
fn only_a_turn_with_a_rolled_back_identity_may_stop_for_a_human() {
    let lost = turn("a", "p1:I", vec![IRREV]);
    let mut m = model(&[root("a")]);
    // What the executor notes when a crash's verdict is Before.
    m.lost_turns.insert("a".into(), lost.clone());
    let identity = m.turn_identity("a", "p1:I");
    m.rolled_back.insert(identity);
    assert!(m.blocked(&lost).is_some(), "the immediate re-run");
    m.apply(&turn("a", "p2", vec![]));
    assert!(m.lost_turns.is_empty());
    let stopped = m.blocked(&lost).expect("the same prompt after another turn");
    assert_eq!(stopped.lost_turns.get("a"), Some(&lost), "it stays resumable");
    assert!(
        m.blocked(&turn("a", "p3:I", vec![IRREV])).is_none(),
        "a fresh prompt"
    );
    m.apply(&lost);
    assert!(m.blocked(&lost).is_none(), "the identity moved on");
}

/// Session records are compared exactly: after a restart every live
/// agent's record is SUSPENDED (R1), of this build's version and the
/// system's provider; one left ACTIVE, or missing, is a failure.
#[test]
fn session_records_are_suspended_after_a_restart_and_compared_exactly() {
    let m = model(&[root("a"), root("b")]);
    assert!(
        m.records().values().all(|r| r.active),
        "created sessions hold a slot"
    );
    let recovered = m.restarted().expected();
    assert!(recovered
        .records
        .values()
        .all(|r| !r.active && r.schema_version == 2));
    assert!(judge(&m, None, None, &recovered, false).is_ok());
    let mut active = recovered.clone();
    active.records.get_mut("a").unwrap().active = true;
    let err = judge(&m, None, None, &active, false).unwrap_err();
    assert!(err.reason.contains("session records differ"), "{}", err.reason);
    let mut missing = recovered.clone();
    missing.records.remove("b");
    assert!(judge(&m, None, None, &missing, false).is_err());
}

/// Two agents' identical calls (a twin turn: the same prompt) are two
/// effects: both must reach the world, and one of them reaching it for
/// both agents is a lost effect, not a deduplicated one.
#[test]
fn twin_calls_of_two_agents_are_two_effects() {
    let before = model(&[root("a"), root("b"), turn("a", "p1:I", vec![IRREV])]);
    let action = turn("b", "p1:I", vec![IRREV]);
    let mut after = before.clone();
    after.apply(&action);
    assert_eq!(after.state.outbox, ["a/p1:I#0", "b/p1:I#0"]);
    let recovered = after.restarted().expected();
    assert_eq!(
        judge(&before, None, None, &before.restarted().expected(), false)
            .unwrap()
            .side,
        Side::After
    );
    assert_eq!(
        judge(&after, None, None, &recovered, false).unwrap().side,
        Side::After
    );
    // The twin's effect merged into the first agent's: b's turn completed
    // with an effect the world never saw from b.
    let mut merged = recovered.clone();
    merged.outbox.pop();
    assert!(judge(&after, None, None, &merged, false).is_err());
    // Each agent's effect is still at most once (I4).
    let mut twice = after.state.clone();
    twice.outbox.push("b/p1:I#0".into());
    assert!(state_invariants(&twice).iter().any(|x| x.starts_with("I4")));
    assert!(state_invariants(&after.state).is_empty());
}

#[test]
fn duplicate_side_effect_and_orphans_break_invariants() {
    let m = model(&[
        root("a"),
        Action::SpawnChild {
            parent: "a".into(),
            name: "b".into(),
        },
    ]);
    let mut s = m.state.clone();
    s.outbox = vec!["k".into(), "k".into()];
    s.agents.remove("a");
    let v = state_invariants(&s);
    assert!(v.iter().any(|x| x.starts_with("I1")), "{v:?}");
    assert!(v.iter().any(|x| x.starts_with("I4")), "{v:?}");
    assert!(state_invariants(&m.state).is_empty());
}

#[test]
fn partial_loop_round_and_lost_trigger_are_rejected() {
    let before = model(&[Action::Emit {
        key: "k0".into(),
        fire_at: 0,
    }]);
    let action = Action::LoopRound { round: 1, tools: 2 };
    let mut after = before.clone();
    after.apply(&action);
    let mut partial = before.restarted().expected();
    partial.loop_messages = vec!["a1".into(), "t1.0".into()];
    assert!(judge(&before, Some(&after), Some(&action), &partial, false).is_err());
    let mut lost = after.restarted().expected();
    lost.triggers.clear();
    assert!(judge(&before, Some(&after), Some(&action), &lost, false).is_err());
    assert!(judge(
        &before,
        Some(&after),
        Some(&action),
        &after.restarted().expected(),
        false
    )
    .is_ok());
}

#[test]
fn claimed_trigger_returns_to_pending_at_restart() {
    let m = model(&[
        Action::Emit {
            key: "k0".into(),
            fire_at: 0,
        },
        Action::Claim { key: "k0".into() },
    ]);
    let restarted = m.restarted();
    assert_eq!(
        restarted.state.triggers[0].status,
        durable_agent_sim::model::TriggerStatus::Pending
    );
    assert_eq!(restarted.state.triggers[0].attempts, 1);
}

#[test]
fn i3_flags_partial_lines_bad_json_and_bad_utf8_in_logs_only() {
    use durable_agent_sim::oracle::log_invariants;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    let log = |bytes: &[u8]| {
        BTreeMap::from([
            (PathBuf::from("/da/agents/s1/events.jsonl"), bytes.to_vec()),
            // Not a log: never judged.
            (PathBuf::from("/da/store.db"), b"\xff{garbage".to_vec()),
        ])
    };
    let good = b"{\"seq\":0,\"e\":\"a\"}\n{\"seq\":1,\"e\":\"\\u00e9\"}\n";
    assert_eq!(log_invariants(&log(good)), Vec::<String>::new());

    let partial = log(b"{\"seq\":0}\n{\"seq\":1");
    assert!(log_invariants(&partial)[0].contains("partial trailing line"));

    let bad_json = log(b"{\"seq\":0}\n{\"seq\":1,}\n");
    assert_eq!(
        log_invariants(&bad_json),
        ["I3 /da/agents/s1/events.jsonl offset 10: line is not valid JSON"]
    );

    // A byte that is not UTF-8 inside a string is not JSON either.
    let bad_utf8 = log(b"{\"e\":\"\xc3\x28\"}\n");
    assert_eq!(
        log_invariants(&bad_utf8),
        ["I3 /da/agents/s1/events.jsonl offset 0: line is not valid JSON"]
    );

    let trailing = log(b"{\"seq\":0} x\n");
    assert_eq!(log_invariants(&trailing).len(), 1);
}

/// R6: a flipped line is refused with its name; but the log's last line,
/// which `events.pending` holds byte for byte, must be replaced from that
/// copy — refusing it takes a root down with nothing lost. A newer
/// version's line is refused as newer (never as damage), a gap as
/// corrupt, and an older version's line is read.
#[test]
fn rot_verdicts_refuse_a_damaged_line_but_replace_one_the_pending_copy_holds() {
    use durable_agent::system::CorruptLine;
    use durable_agent_sim::oracle::{judge_rot, RotVerdict};
    use durable_agent_sim::rot::{Damage, Rot};
    let damaged = |damage, replaceable| Rot {
        damage,
        path: "sessions/s1/events.jsonl".into(),
        line: 3,
        line_offset: 210,
        bytes: vec![(222, 0x10, b'a')],
        at_point: 40,
        replaceable,
        backup: None,
        cut_off: Vec::new(),
    };
    let rot = |replaceable| damaged(Damage::Flip, replaceable);
    let named = |line, offset| CorruptLine {
        path: "sessions/s1/events.jsonl".into(),
        line,
        offset,
    };
    let refused: Result<(), String> = Err("checksum mismatch".into());
    assert_eq!(
        judge_rot(&rot(false), &refused, Some(&named(3, 210)), false, true, false),
        Ok(RotVerdict::Refused)
    );
    let wrong_line = judge_rot(&rot(false), &refused, Some(&named(2, 100)), false, true, false);
    assert!(wrong_line.is_err(), "{wrong_line:?}");
    let needless = judge_rot(&rot(true), &refused, Some(&named(3, 210)), false, true, false);
    assert!(
        needless.as_ref().is_err_and(|e| e.contains("must replace")),
        "{needless:?}"
    );
    assert_eq!(
        judge_rot(&rot(true), &Ok(()), None, false, true, true),
        Ok(RotVerdict::Replaced)
    );
    let read_as_data = judge_rot(&rot(false), &Ok(()), None, false, true, false);
    assert!(read_as_data.is_err(), "{read_as_data:?}");
    assert_eq!(
        judge_rot(&rot(false), &Ok(()), None, false, false, false),
        Ok(RotVerdict::Unread)
    );

    // A newer version's line: refused as newer, not as damage.
    let newer = damaged(Damage::Newer, false);
    assert_eq!(
        judge_rot(&newer, &refused, Some(&named(3, 210)), true, true, false),
        Ok(RotVerdict::Refused)
    );
    let as_damage = judge_rot(&newer, &refused, Some(&named(3, 210)), false, true, false);
    assert!(as_damage.is_err(), "{as_damage:?}");
    assert!(judge_rot(&newer, &Ok(()), None, false, true, false).is_err());
    // A gap: refused as corrupt, not as newer.
    let gap = damaged(Damage::Gap, false);
    assert_eq!(
        judge_rot(&gap, &refused, Some(&named(3, 210)), false, true, false),
        Ok(RotVerdict::Refused)
    );
    assert!(judge_rot(&gap, &refused, Some(&named(3, 210)), true, true, false).is_err());
    // An older version's line: read, never refused.
    let older = damaged(Damage::Older, false);
    assert_eq!(
        judge_rot(&older, &Ok(()), None, false, true, false),
        Ok(RotVerdict::ReadOlder)
    );
    assert!(judge_rot(&older, &refused, Some(&named(3, 210)), false, true, false).is_err());
}

/// R6 and I7 for a loss at rest: the boot must refuse with the typed
/// damage naming the file (lost entries: with the expected and found
/// counts), never boot over it; `verify` must report that kind on that
/// file (lost entries: at the first missing line).
#[test]
fn a_loss_at_rest_is_refused_with_its_typed_damage_and_verify_says_so() {
    use durable_agent::recovery::verify::{Finding, FindingKind, Remedy, Verification};
    use durable_agent_sim::loss::{judge, verify_agrees, Loss, Refusal};
    use durable_agent_sim::rot::{Damage, Rot};
    let log: std::path::PathBuf = "/da/agents/00000001/events.jsonl".into();
    let loss = Loss::Entries {
        expected: 5,
        found: 2,
    };
    let rot = Rot {
        damage: Damage::Lost(loss),
        path: log.clone(),
        line: 3,
        line_offset: 180,
        bytes: Vec::new(),
        at_point: 40,
        replaceable: false,
        backup: None,
        cut_off: Vec::new(),
    };
    let refused = |expected| Refusal::LostEntries {
        path: log.clone(),
        expected,
        found: 2,
    };
    let failed = Err("boot: damaged".to_string());
    let fs = durable_agent::fs::SimFs::new(durable_agent::fs::SimConfig::new(1));
    assert!(judge(&rot, loss, &failed, Some(&refused(5)), &fs).is_ok());
    assert!(
        judge(&rot, loss, &failed, Some(&refused(4)), &fs).is_err(),
        "a wrong expected count"
    );
    assert!(
        judge(&rot, loss, &Ok(()), None, &fs).is_err(),
        "booted over lost entries"
    );
    assert!(
        judge(&rot, loss, &failed, None, &fs).is_err(),
        "refused, but not as damage"
    );
    let finding = |kind, line| Finding {
        kind,
        path: log.clone(),
        line,
        offset: Some(180),
        session: None,
        message: String::new(),
        remedy: Remedy::QuarantineSession,
    };
    let verified = |damaged| Verification {
        damaged,
        ..Verification::default()
    };
    assert!(verify_agrees(&verified(vec![finding(FindingKind::LostEntries, Some(3))]), &rot).is_empty());
    assert_eq!(
        verify_agrees(&verified(vec![finding(FindingKind::LostEntries, Some(2))]), &rot).len(),
        1
    );
    assert_eq!(
        verify_agrees(
            &verified(vec![finding(FindingKind::MissingCreated, Some(3))]),
            &rot
        )
        .len(),
        1
    );
    assert_eq!(verify_agrees(&verified(Vec::new()), &rot).len(), 1);
    // The right line, but not where the log's readable part ends.
    let elsewhere = Finding {
        offset: Some(179),
        ..finding(FindingKind::LostEntries, Some(3))
    };
    assert_eq!(verify_agrees(&verified(vec![elsewhere]), &rot).len(), 1);
}

/// R6 and I7 for a store replaced by another root's: the boot must refuse
/// with `StoreReplaced` naming `store.db` (not as a missing store, never
/// booted over), and `verify` must report `StoreReplaced` on that file.
#[test]
fn a_store_replaced_by_another_roots_is_refused_as_replaced_and_verify_says_so() {
    use durable_agent::recovery::verify::{Finding, FindingKind, Remedy, Verification};
    use durable_agent_sim::loss::{judge, verify_agrees, Loss, Refusal};
    use durable_agent_sim::rot::{Damage, Rot};
    let store: std::path::PathBuf = durable_agent_sim::driver::STORE_DB.into();
    let rot = Rot {
        damage: Damage::Lost(Loss::StoreReplaced),
        path: store.clone(),
        line: 0,
        line_offset: 0,
        bytes: Vec::new(),
        at_point: 40,
        replaceable: false,
        backup: None,
        cut_off: Vec::new(),
    };
    let failed = Err("boot: damaged".to_string());
    let fs = durable_agent::fs::SimFs::new(durable_agent::fs::SimConfig::new(1));
    let loss = Loss::StoreReplaced;
    assert!(judge(
        &rot,
        loss,
        &failed,
        Some(&Refusal::StoreReplaced(store.clone())),
        &fs
    )
    .is_ok());
    assert!(
        judge(
            &rot,
            loss,
            &failed,
            Some(&Refusal::StoreMissing(store.clone())),
            &fs
        )
        .is_err(),
        "refused as missing"
    );
    assert!(
        judge(&rot, loss, &Ok(()), None, &fs).is_err(),
        "booted over another root's store"
    );
    let verified = |kind| Verification {
        damaged: vec![Finding {
            kind,
            path: store.clone(),
            line: None,
            offset: None,
            session: None,
            message: String::new(),
            remedy: Remedy::AcceptStoreLoss,
        }],
        ..Verification::default()
    };
    assert!(verify_agrees(&verified(FindingKind::StoreReplaced), &rot).is_empty());
    assert_eq!(verify_agrees(&verified(FindingKind::StoreMissing), &rot).len(), 1);
}
