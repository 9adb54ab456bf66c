//! The runtime on the real filesystem (RealFs in a temp dir): the same
//! operations work, and a reopen recovers every acknowledged one.

use std::sync::Arc;

use durable_agent::fs::{Fs, RealFs};
use durable_agent::recovery::check_invariants;
use durable_agent::runtime::{Runtime, RuntimeConfig};

#[test]
fn acknowledged_state_survives_reopen_on_the_real_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("nested/runtime");
    let fs: Arc<dyn Fs> = Arc::new(RealFs::new());
    let (mut rt, report) = Runtime::open(fs.clone(), &root, RuntimeConfig::new(3)).unwrap();
    assert_eq!(report.agents_recovered, 0);
    let a = rt.create_root("a", "x").unwrap();
    let b = rt.spawn_child(&a, "b", "y").unwrap();
    rt.run_turn(&b, "lookup something").unwrap();
    rt.send_message(&b, &a, "hi").unwrap();
    let before = rt.state();
    drop(rt);
    let (rt, report) = Runtime::open(fs.clone(), &root, RuntimeConfig::new(3)).unwrap();
    assert_eq!(rt.state(), before.normalized());
    assert_eq!(report.roots_resumable, vec![a.clone()]);
    assert_eq!(report.reinjected_count(), 1);
    check_invariants(fs.as_ref(), &root).unwrap();
    assert!(root
        .join("agents")
        .join(before.agents[&b].session_id.as_str())
        .join("events.jsonl")
        .exists());
}
