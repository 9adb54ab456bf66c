//! A `session.json` written by a newer durable-agent is refused as newer,
//! never as damage, whatever its shape: `SessionStore::load` reads the
//! record's `schema_version` alone before it fits the rest to this
//! build's struct, so a newer build's record of a shape this build does
//! not know (here version 3 with a lifecycle state `"ARCHIVED"`) is
//! `SessionError::NewerSchema` ("not damage, so never quarantined; an
//! upgrade reads it"), as the log's reader does for a line of an unknown
//! shape (src/log/entry.rs).
//!
//! The boot names the record's line as `LineFault::Newer`; `verify`
//! reports it `newer_schema` with the manual remedy, and `repair
//! --quarantine` refuses to move the session aside (docs/OPERATING.md:
//! "a line from a newer durable-agent or an unreadable file is not
//! quarantine's to fix (upgrade, fix permissions): `repair` refuses").

mod boot_support;

use std::path::Path;
use std::sync::Arc;

use durable_agent::checksum;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::recovery::verify::{plan_quarantine, verify, FindingKind, Remedy};
use durable_agent::store::session::SESSION_FILE;
use durable_agent::system::{LineFault, System, SystemError};

const SEED: u64 = 31;
use boot_support::ROOT;

fn boot(fs: &SimFs) -> Result<System, SystemError> {
    boot_support::boot(fs, SEED)
}

/// A root with one agent and one turn; then its `session.json` replaced by
/// the record a newer build (schema_version 3) would write: sealed as this
/// build seals, with a lifecycle state this build does not know.
fn root_with_a_newer_record() -> (SimFs, std::path::PathBuf) {
    let fs = SimFs::new(SimConfig::new(SEED));
    let mut system = boot(&fs).expect("boot");
    let rt = system.runtime_mut();
    let agent = rt.create_root("lead", "be brief").expect("root agent");
    rt.run_turn(&agent, "hello").expect("turn");
    let dir = rt.session_dir(&agent).expect("session dir");
    drop(system);

    let record_path = dir.join(SESSION_FILE);
    let bytes = fs.read(&record_path, "test read").expect("read record");
    let line = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let mut record: serde_json::Value = serde_json::from_slice(line).expect("record is JSON");
    let obj = record.as_object_mut().expect("record is an object");
    obj.remove("crc");
    obj.insert("schema_version".into(), 3.into());
    obj.insert("state".into(), "ARCHIVED".into());
    let mut newer = checksum::seal(&serde_json::to_string(&record).expect("ser"));
    newer.push('\n');
    fs.open(&record_path, OpenMode::Truncate, "test rewrite")
        .expect("truncate");
    fs.write_at(&record_path, 0, newer.as_bytes(), "test rewrite")
        .expect("write");
    fs.sync(&record_path, "test sync").expect("sync");
    (fs, record_path)
}

#[test]
fn a_newer_session_record_of_an_unknown_shape_is_refused_as_newer_not_as_corrupt() {
    let (fs, record_path) = root_with_a_newer_record();
    let err = boot(&fs).expect_err("a newer record must be refused");
    let (at, fault) = err
        .damaged_line()
        .unwrap_or_else(|| panic!("the refusal must name the record's line: {err}"));
    assert_eq!(at.path, record_path, "{err}");
    assert_eq!(
        fault,
        LineFault::Newer,
        "a session.json with schema_version 3 (this build reads 2) was refused as DAMAGE, not as a \
         newer build's record; the error: {err}"
    );
}

#[test]
fn verify_reports_a_newer_session_record_as_newer_schema_and_repair_moves_nothing() {
    let (fs, record_path) = root_with_a_newer_record();
    let root = Path::new(ROOT);
    let v = verify(Arc::new(fs.clone()), root, &root.join("store.db"));
    let f = v
        .damaged
        .iter()
        .find(|f| f.path == record_path)
        .unwrap_or_else(|| panic!("the record must be a finding: {:#?}", v.damaged));
    assert_eq!(
        (f.kind, f.remedy),
        (FindingKind::NewerSchema, Remedy::Manual),
        "verify called a newer build's session.json damaged and quarantinable: {f:#?}"
    );
    let plan = plan_quarantine(&v, true, false);
    assert!(
        plan.is_err(),
        "repair --quarantine would move a newer build's session aside: {plan:#?}"
    );
}
