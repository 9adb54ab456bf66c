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

/// A record is one sealed line: every single-bit flip in it (its newline
/// excepted) is refused as `Corrupt` naming the file, never loaded; with
/// the `no_checksum_verify` canary some flip is loaded as a different
/// record (what the canary exists to show). A version-1 record (pretty,
/// no checksum) still loads.
#[test]
fn every_bit_flip_in_a_record_is_refused_and_old_records_still_load() {
    use durable_agent::store::session::SessionError;
    let sim = SimFs::new(SimConfig::new(1));
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let clean = SessionStore::open(fs.clone(), Path::new("/r"), Canaries::none()).unwrap();
    let blind = SessionStore::open(fs, Path::new("/r"), Canaries::only(Canary::NoChecksumVerify)).unwrap();
    let rec = record(SessionState::Suspended);
    clean.create(&rec).unwrap();
    let id = rec.session_id.clone();
    let path = Path::new("/r/agents/00000000000000aa/session.json");
    let len = sim.read(path, "t").unwrap().len();
    let mut accepted_blind = 0;
    for at in 0..len - 1 {
        for bit in 0..8 {
            sim.rot(path, at as u64, 1 << bit).unwrap();
            match clean.load(&id) {
                Err(SessionError::Corrupt { path: p, .. }) => assert_eq!(p, path, "byte {at} bit {bit}"),
                other => panic!("byte {at} bit {bit}: expected Corrupt, got {other:?}"),
            }
            if matches!(blind.load(&id), Ok(Some(r)) if r != rec) {
                accepted_blind += 1;
            }
            sim.rot(path, at as u64, 1 << bit).unwrap();
        }
    }
    assert!(
        accepted_blind > 0,
        "without verification some flip must be read as data"
    );
    assert_eq!(clean.load(&id).unwrap(), Some(rec.clone()));
    // Version 1: pretty-printed, no checksum.
    let v1 = SessionRecord {
        schema_version: 1,
        ..rec
    };
    let mut bytes = serde_json::to_vec_pretty(&v1).unwrap();
    bytes.push(b'\n');
    sim.write_at(path, 0, &bytes, "t").unwrap();
    sim.truncate(path, bytes.len() as u64, "t").unwrap();
    assert_eq!(clean.load(&id).unwrap(), Some(v1));
}
