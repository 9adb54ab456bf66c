//! The production path on a real disk: what durability costs per operation
//! with [`RealFs`], each workload beside the same one without our seam.
//!
//! - `log_append`: one durable [`EventLog::append`] (the runtime's protocol:
//!   `events.pending` overwrite + fsync, `events.jsonl` append + fsync)
//!   beside a plain `std::fs` append + `fsync` on an open file.
//! - `trigger_cycle`: one trigger emitted, claimed and acked DONE through
//!   [`TriggerStore`] (three SQLite transactions) on our VFS over the `Fs`
//!   seam ([`open_store`]) beside the same store code on rusqlite's default
//!   VFS with the same pragmas (`synchronous=FULL`, `temp_store=MEMORY`,
//!   `journal_mode=WAL` — what `src/sqlite/connection.rs` sets).
//! - `store_get`: [`TriggerStore::get`] by id over 1,000 rows, both VFSes.
//!
//! Invariant: every file lives in a temp dir under `CARGO_TARGET_TMPDIR`
//! (the target directory, so on the real disk even where `/tmp` is tmpfs),
//! and every measured operation is acknowledged-durable as in production.
//! Bounded: 10 samples, short windows — about a minute on 2 cores.
//!
//! Run: `cargo bench --bench production`

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput};
use durable_agent::canary::Canaries;
use durable_agent::fs::RealFs;
use durable_agent::log::{Event, EventLog};
use durable_agent::runtime::ids::IdGen;
use durable_agent::sqlite::{Db, SqliteOptions};
use durable_agent::store::schema::{migrate, open_store};
use durable_agent::store::triggers::{TriggerSource, TriggerSpec, TriggerStore};
use rusqlite::Connection;
use tempfile::TempDir;

/// A typical log line's payload (a short tool output). `tool.result`, not
/// `turn.complete`, to keep the bench independent of the turn's fields.
const RESPONSE: &str = "The release is out; I told ada@example.com and filed the note in the tracker.";
/// Rows behind the point-read benchmark.
const READ_ROWS: u64 = 1_000;

fn scratch() -> TempDir {
    tempfile::Builder::new()
        .prefix("bench-production-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir under CARGO_TARGET_TMPDIR")
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    // fsync-bound iterations take milliseconds: flat sampling keeps the
    // iteration count (and the run time) bounded.
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));
    g
}

fn log_append(c: &mut Criterion) {
    let dir = scratch();
    let mut g = group(c, "log_append");

    let session_dir = dir.path().join("session");
    std::fs::create_dir(&session_dir).expect("session dir");
    let session = IdGen::new(1).session();
    let mut log = EventLog::create(Arc::new(RealFs::new()), &session_dir, session, Canaries::none())
        .expect("create events.jsonl");
    let mut ts = 0u64;
    g.bench_function("event_log_realfs", |b| {
        b.iter(|| {
            ts += 1;
            let entry = log
                .append(
                    ts,
                    Event::ToolResult {
                        call_id: "0000000000000001-7".to_string(),
                        ok: true,
                        output: RESPONSE.to_string(),
                    },
                )
                .expect("durable append");
            black_box(entry.seq)
        })
    });

    // The floor: the same line, one write and one fsync, file kept open.
    let line = format!(
        "{{\"schema_version\":1,\"session_id\":\"0000000000000001\",\"seq\":0,\"ts\":0,\
         \"event\":\"tool.result\",\"data\":{{\"call_id\":\"0000000000000001-7\",\"ok\":true,\"output\":\"{RESPONSE}\"}}}}\n"
    );
    let mut plain: File = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("plain.jsonl"))
        .expect("plain log");
    g.bench_function("std_fs_append_fsync", |b| {
        b.iter(|| {
            plain.write_all(line.as_bytes()).expect("append");
            plain.sync_all().expect("fsync");
        })
    });
    g.finish();
}

/// Our VFS over the `Fs` seam: the runtime's one way to open the stores.
fn ours(path: &Path) -> Db {
    open_store(Arc::new(RealFs::new()), path, &SqliteOptions::default()).expect("open_store on RealFs")
}

/// rusqlite's default (unix) VFS, configured as `Db::configure` does, and
/// migrated to the same schema.
fn default_vfs(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open on the default VFS");
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA temp_store=MEMORY;")
        .expect("pragmas");
    let mode: String = conn
        .query_row("PRAGMA journal_mode=wal", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal", "the default VFS must run in WAL mode like ours");
    migrate(&conn, &path.display().to_string()).expect("migrate");
    conn
}

fn spec(key: String) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(key),
        session_id: None,
        fire_at_ms: 0,
        priority: 0,
        description: "bench".into(),
        payload: serde_json::json!({"agent": "assistant", "prompt": RESPONSE}),
    }
}

/// One emit → claim → ack_done, as the daemon's scheduler does it.
fn cycle(store: &TriggerStore, conn: &Connection, n: &mut u64) {
    *n += 1;
    store.emit(conn, &spec(format!("bench:{n}")), *n).expect("emit");
    let claim = store
        .claim(conn, *n, 60_000)
        .expect("claim")
        .expect("the trigger just emitted is due");
    store.ack_done(conn, &claim, *n).expect("ack");
}

fn trigger_cycle(c: &mut Criterion) {
    let dir = scratch();
    let store = TriggerStore::default();
    let mut g = group(c, "trigger_cycle");

    let db = ours(&dir.path().join("ours.db"));
    let mut n = 0;
    g.bench_function("our_vfs_realfs", |b| b.iter(|| cycle(&store, db.conn(), &mut n)));

    let conn = default_vfs(&dir.path().join("default.db"));
    let mut n = 0;
    g.bench_function("default_vfs", |b| b.iter(|| cycle(&store, &conn, &mut n)));
    g.finish();
}

fn fill(store: &TriggerStore, conn: &Connection) -> Vec<String> {
    (0..READ_ROWS)
        .map(|i| {
            store
                .emit(conn, &spec(format!("read:{i}")), i)
                .expect("emit")
                .id()
                .to_string()
        })
        .collect()
}

fn get_round_robin(store: &TriggerStore, conn: &Connection, ids: &[String], i: &mut usize) {
    // A stride coprime with the row count visits every row, not only hot pages.
    *i = (*i + 7) % ids.len();
    let t = store.get(conn, &ids[*i], 0).expect("get").expect("row exists");
    black_box(t.status);
}

fn store_get(c: &mut Criterion) {
    let dir = scratch();
    let store = TriggerStore::default();
    let db = ours(&dir.path().join("ours.db"));
    let conn = default_vfs(&dir.path().join("default.db"));
    let ours_ids = fill(&store, db.conn());
    let default_ids = fill(&store, &conn);

    let mut g = group(c, "store_get");
    g.sampling_mode(SamplingMode::Auto)
        .measurement_time(Duration::from_secs(2));
    let mut i = 0;
    g.bench_function("our_vfs_realfs", |b| {
        b.iter(|| get_round_robin(&store, db.conn(), &ours_ids, &mut i))
    });
    let mut i = 0;
    g.bench_function("default_vfs", |b| {
        b.iter(|| get_round_robin(&store, &conn, &default_ids, &mut i))
    });
    g.finish();
}

criterion_group!(benches, log_append, trigger_cycle, store_get);
criterion_main!(benches);
