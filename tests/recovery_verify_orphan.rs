//! `verify` lists every crash orphan from session creation `at boot`, as
//! docs/OPERATING.md's categories say ("`at boot` (the crash model — a
//! torn last line, ..., a crash orphan — which the next boot repairs by
//! itself)"): a session directory without `session.json`, and one whose
//! record is written but whose log never got `agent.created` (a crash
//! between the two, which the next boot removes, GUARANTEES #4) — never
//! `ok`. The check is the boot's own: neither created nor terminated (in
//! the log or the record).

mod boot_support;

use std::path::Path;
use std::sync::Arc;

use durable_agent::canary::Canaries;
use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::log::EventLog;
use durable_agent::recovery::verify::verify;
use durable_agent::runtime::{AgentId, SessionId};
use durable_agent::store::session::{SessionRecord, SessionState, SessionStore, SESSION_SCHEMA_VERSION};
use durable_agent::system::{System, SystemError};
use durable_agent::world::World;

const SEED: u64 = 23;
use boot_support::ROOT;

fn boot(fs: &SimFs) -> Result<(System, durable_agent::system::BootReport), SystemError> {
    boot_support::boot_with(fs, SEED, boot_support::NOW_MS, World::without_dedup())
}

#[test]
fn verify_lists_a_crash_orphan_with_a_record_as_at_boot_not_ok() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let (mut system, _) = boot(&fs).expect("boot");
    let agent = system.runtime_mut().create_root("lead", "x").expect("agent");
    system.runtime_mut().run_turn(&agent, "hello").expect("turn");
    drop(system);

    // What a crash right after the record (and the empty log), before
    // `agent.created`, leaves: SessionStore::create + EventLog::create.
    let shared: Arc<dyn durable_agent::fs::Fs> = Arc::new(fs.clone());
    let store = SessionStore::open(shared.clone(), Path::new(ROOT), Canaries::none()).expect("store");
    let id = SessionId::from_hex("00000000000000f1").expect("id");
    let record = SessionRecord {
        schema_version: SESSION_SCHEMA_VERSION,
        session_id: id.clone(),
        agent_id: AgentId::from_hex("00000000000000f0").expect("id"),
        provider: "fake".into(),
        model: "fake".into(),
        state: SessionState::Active,
        provider_state: None,
        updated_ts: 1,
    };
    let dir = store.create(&record).expect("record");
    EventLog::create(shared, &dir, id.clone(), Canaries::none()).expect("log");

    let root = Path::new(ROOT);
    let v = verify(Arc::new(fs.clone()), root, &root.join("store.db"));
    assert!(v.is_healthy(), "{:#?}", v.damaged);
    let in_dir = |p: &Path| p.starts_with(&dir);
    let said_ok: Vec<_> = v.healthy.iter().filter(|c| in_dir(&c.path)).collect();
    let said_at_boot: Vec<_> = v.repaired_at_boot.iter().filter(|c| in_dir(&c.path)).collect();

    // The boot indeed removes it (what `at boot` is for).
    let (_system, report) = boot(&fs).expect("boot again");
    assert!(
        report.runtime.orphans_cleaned.contains(&id),
        "the boot cleans the orphan: {:?}",
        report.runtime
    );
    assert!(
        !said_at_boot.is_empty() && said_ok.iter().all(|c| !c.what.contains("crash orphan")),
        "verify listed the crash orphan the next boot deletes as `ok`, not `at boot`: ok {said_ok:#?}, \
         at boot {said_at_boot:#?}"
    );
}
