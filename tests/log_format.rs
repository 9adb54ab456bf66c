//! The on-disk formats are a contract: these snapshots of an `events.jsonl`
//! and a `session.json` from a fixed scenario make any format change a
//! reviewed diff (update with `INSTA_UPDATE=always`, review, commit).

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::log::EVENTS_FILE;
use durable_agent::runtime::{Runtime, RuntimeConfig};
use durable_agent::store::session::SESSION_FILE;

/// Root + child, a turn with a tool, messages both ways, a delivery, an
/// eviction and a restore, and a termination.
fn scenario() -> (SimFs, std::path::PathBuf, std::path::PathBuf) {
    let sim = SimFs::new(SimConfig::new(42));
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let config = RuntimeConfig::new(42).with_slots(1);
    let (mut rt, _) = Runtime::open(fs, Path::new("/data"), config).unwrap();
    let root = rt.create_root("alpha", "coordinate the work").unwrap();
    let child = rt.spawn_child(&root, "worker", "do the work").unwrap();
    rt.run_turn(&root, "send_email to the client").unwrap();
    rt.send_message(&child, &root, "status: done").unwrap();
    rt.deliver(&root).unwrap();
    rt.run_turn(&root, "lookup the answer").unwrap();
    let child_dir = rt.session_dir(&child).unwrap();
    rt.terminate(&child).unwrap();
    let root_dir = rt.session_dir(&root).unwrap();
    (sim, root_dir, child_dir)
}

fn text(sim: &SimFs, path: &Path) -> String {
    String::from_utf8(sim.read(path, "snapshot read").unwrap()).unwrap()
}

#[test]
fn root_events_jsonl_format_is_stable() {
    let (sim, root_dir, _) = scenario();
    insta::assert_snapshot!("root_events_jsonl", text(&sim, &root_dir.join(EVENTS_FILE)));
}

#[test]
fn child_events_jsonl_format_is_stable() {
    let (sim, _, child_dir) = scenario();
    insta::assert_snapshot!("child_events_jsonl", text(&sim, &child_dir.join(EVENTS_FILE)));
}

#[test]
fn session_json_format_is_stable() {
    let (sim, root_dir, child_dir) = scenario();
    insta::assert_snapshot!("root_session_json", text(&sim, &root_dir.join(SESSION_FILE)));
    insta::assert_snapshot!("child_session_json", text(&sim, &child_dir.join(SESSION_FILE)));
}
