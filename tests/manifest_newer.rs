//! A `root.json` written by a newer durable-agent (its `schema_version`
//! above `MANIFEST_VERSION`) is refused as newer, not as damage:
//! `manifest::read` reads the version alone first and answers
//! `ManifestError::NewerSchema`, which `verify` reports `newer_schema`
//! with the manual remedy, and `repair --quarantine` refuses to move it
//! aside (after which the next boot would write a version-1 manifest over
//! the newer build's). docs/OPERATING.md: "a line from a newer
//! durable-agent or an unreadable file is not quarantine's to fix
//! (upgrade, fix permissions): `repair` refuses"; only an unparsable
//! `root.json` is `manifest_invalid`.

mod boot_support;

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::recovery::verify::{plan_quarantine, verify, FindingKind, Remedy};
use durable_agent::store::manifest::{self, MANIFEST_FILE, MANIFEST_VERSION};
use durable_agent::system::{System, SystemError};

const SEED: u64 = 17;
use boot_support::ROOT;

fn boot(fs: &SimFs) -> Result<System, SystemError> {
    boot_support::boot(fs, SEED)
}

#[test]
fn a_newer_builds_manifest_is_newer_schema_and_not_quarantined() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let mut system = boot(&fs).expect("boot");
    let agent = system.runtime_mut().create_root("lead", "x").expect("agent");
    system.runtime_mut().run_turn(&agent, "hello").expect("turn");
    drop(system);
    let root = Path::new(ROOT);
    let store_id = manifest::read(&fs, root)
        .expect("read")
        .expect("the boot wrote root.json")
        .store_id;
    // What a newer build's manifest looks like: the same identity, a
    // higher version (and a member this build does not know).
    let newer = format!(
        "{{\"schema_version\":{},\"store_id\":{store_id},\"replicas\":[]}}\n",
        MANIFEST_VERSION + 1
    );
    let path = root.join(MANIFEST_FILE);
    fs.open(&path, OpenMode::Truncate, "test").expect("open");
    fs.write_at(&path, 0, newer.as_bytes(), "test").expect("write");
    fs.sync(&path, "test").expect("sync");

    let v = verify(Arc::new(fs.clone()), root, &root.join("store.db"));
    let f = v
        .damaged
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("root.json must be a finding: {:#?}", v.damaged));
    let plan = plan_quarantine(&v, false, false);
    assert_eq!(
        (f.kind, f.remedy),
        (FindingKind::NewerSchema, Remedy::Manual),
        "verify called a newer build's (parseable) root.json `{:?}` with remedy {:?} ({}); \
         repair --quarantine plan: {plan:?}",
        f.kind,
        f.remedy,
        f.message
    );
    assert!(
        plan.is_err(),
        "repair --quarantine would move a newer build's root.json aside: {plan:?}"
    );
}
