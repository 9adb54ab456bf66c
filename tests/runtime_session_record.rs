//! `session.json` is replaced atomically: a crash at any I/O point of a
//! record write, under every crash mode, leaves the old record or the new
//! one — never a torn or missing one — and `scan` removes the `.tmp`.

use std::path::Path;
use std::sync::Arc;

use durable_agent::canary::{Canaries, Canary};
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::runtime::{AgentId, SessionId};
use durable_agent::store::session::{
    ScannedSession, SessionRecord, SessionState, SessionStore, SESSION_SCHEMA_VERSION,
};

const MODES: [CrashMode; 3] = [
    CrashMode::ProcessCrash,
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

fn record(state: SessionState) -> SessionRecord {
    SessionRecord {
        schema_version: SESSION_SCHEMA_VERSION,
        session_id: SessionId::from_hex("00000000000000aa").unwrap(),
        agent_id: AgentId::from_hex("00000000000000ab").unwrap(),
        provider: "fake".into(),
        model: "fake-1".into(),
        state,
        provider_state: None,
        updated_ts: 1,
    }
}

/// Create the record (ACTIVE), then overwrite it (SUSPENDED) with a crash
/// at the `n`-th point of the overwrite; returns what a scan finds.
fn crash_in_overwrite(
    seed: u64,
    n: u64,
    mode: CrashMode,
    canaries: &Canaries,
) -> Option<Vec<ScannedSession>> {
    let sim = SimFs::new(SimConfig::new(seed));
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let store = SessionStore::open(fs.clone(), Path::new("/r"), canaries.clone()).unwrap();
    store.create(&record(SessionState::Active)).unwrap();
    let start = sim.points();
    sim.set_fault(Some(Fault::CrashAt(start + n)));
    if store.write(&record(SessionState::Suspended)).is_ok() {
        return None;
    }
    sim.restart(mode);
    let store = SessionStore::open(fs, Path::new("/r"), canaries.clone()).unwrap();
    let (found, _) = store.scan().unwrap();
    let (again, tmp) = store.scan().unwrap();
    assert_eq!((again, tmp), (found.clone(), 0), "scan left a .tmp behind");
    Some(found)
}

#[test]
fn a_crash_in_a_record_write_leaves_the_old_or_the_new_record() {
    for seed in 0..8 {
        for mode in MODES {
            for n in 1.. {
                let Some(found) = crash_in_overwrite(seed, n, mode, &Canaries::none()) else {
                    break;
                };
                let ok = found == vec![ScannedSession::Record(record(SessionState::Active))]
                    || found == vec![ScannedSession::Record(record(SessionState::Suspended))];
                assert!(ok, "seed {seed} {mode:?} point {n}: {found:?}");
            }
        }
    }
}

#[test]
fn without_fsync_before_rename_a_power_loss_can_tear_the_record() {
    let canaries = Canaries::only(Canary::NoFsyncBeforeRename);
    let mut torn = 0;
    for seed in 0..8 {
        for n in 1..8 {
            let sim = SimFs::new(SimConfig::new(seed));
            let fs: Arc<dyn Fs> = Arc::new(sim.clone());
            let store = SessionStore::open(fs.clone(), Path::new("/r"), canaries.clone()).unwrap();
            store.create(&record(SessionState::Active)).unwrap();
            let start = sim.points();
            sim.set_fault(Some(Fault::CrashAt(start + n)));
            let _ = store.write(&record(SessionState::Suspended));
            sim.restart(CrashMode::PowerLoss(DirModel::Strict));
            let store = SessionStore::open(fs, Path::new("/r"), canaries.clone()).unwrap();
            if store.scan().is_err() {
                torn += 1;
            }
        }
    }
    assert!(torn > 0, "the canary was never observed");
}
