//! Injected faults one by one: errors change nothing, lost replies change
//! everything, a crash point splits the run, and seeds replay exactly.

use super::*;

/// A disk with durable, unsynced and renamed state, used as a baseline.
fn busy_disk(seed: u64) -> SimFs {
    let fs = SimFs::new(SimConfig::new(seed));
    durable_file(&fs, "/d/f", b"durable");
    fs.append(p("/d/f"), b" unsynced", "append unsynced").unwrap();
    fs.open(p("/d/new"), OpenMode::Create, "create new").unwrap();
    fs.write_at(p("/d/new"), 2, b"xy", "write new").unwrap();
    fs.rename(p("/d/new"), p("/d/renamed"), "rename new").unwrap();
    fs
}

type Mutation = (&'static str, fn(&SimFs) -> std::io::Result<()>);

fn mutations() -> Vec<Mutation> {
    vec![
        ("create_dir_all", |fs| fs.create_dir_all(p("/d/sub/x"), "mkdir")),
        ("open create", |fs| fs.open(p("/d/g"), OpenMode::Create, "open")),
        ("open truncate", |fs| {
            fs.open(p("/d/f"), OpenMode::Truncate, "open trunc")
        }),
        ("write_at", |fs| fs.write_at(p("/d/f"), 1, b"ZZ", "write")),
        ("append", |fs| fs.append(p("/d/f"), b"more", "append").map(drop)),
        ("truncate", |fs| fs.truncate(p("/d/f"), 2, "truncate")),
        ("sync", |fs| fs.sync(p("/d/f"), "sync f")),
        ("sync_dir", |fs| fs.sync_dir(p("/d"), "sync d")),
        ("rename", |fs| fs.rename(p("/d/f"), p("/d/f2"), "rename")),
        ("remove", |fs| fs.remove(p("/d/f"), "remove")),
    ]
}

#[test]
fn eio_and_enospc_leave_visible_and_durable_state_unchanged() {
    for (name, op) in mutations() {
        for kind in [FailKind::Eio, FailKind::Enospc] {
            let fs = busy_disk(7);
            let (visible, durable) = (fs.image_hash(), fs.durable_image());
            arm_next(&fs, |n| Fault::FailAt(n, kind));
            let err = op(&fs).unwrap_err();
            let want = match kind {
                FailKind::Eio => ErrorKind::Other,
                FailKind::Enospc => ErrorKind::StorageFull,
            };
            assert_eq!(err.kind(), want, "{name} {kind:?}");
            assert_eq!(
                fs.image_hash(),
                visible,
                "{name} {kind:?} changed the visible image"
            );
            assert_eq!(
                fs.durable_image(),
                durable,
                "{name} {kind:?} changed the durable image"
            );
            let last = fs.trace().pop().unwrap();
            assert_eq!(last.outcome, Outcome::Failed(kind), "{name}");
            // Not a crash: the next call works.
            assert!(!fs.crashed());
            fs.read(p("/d/f"), "read after failure").unwrap();
        }
    }
}

#[test]
fn lost_reply_takes_full_effect_but_reports_eio() {
    for (name, op) in mutations() {
        let expected = busy_disk(3);
        op(&expected).unwrap();
        let fs = busy_disk(3);
        arm_next(&fs, Fault::LostReplyAt);
        assert_eq!(op(&fs).unwrap_err().kind(), ErrorKind::Other, "{name}");
        assert_eq!(fs.disk_image(), expected.disk_image(), "{name}");
        assert_eq!(fs.durable_image(), expected.durable_image(), "{name}");
        assert_eq!(fs.trace().pop().unwrap().outcome, Outcome::LostReply);
    }
}

#[test]
fn crash_point_n_runs_points_before_n_and_nothing_after() {
    let fs = SimFs::new(SimConfig::new(1));
    fs.open(p("/log"), OpenMode::Create, "create log").unwrap(); // point 1
    fs.set_fault(Some(Fault::CrashAt(5)));
    for i in 0..3u8 {
        fs.append(p("/log"), &[b'a' + i], "append").unwrap(); // points 2..4
    }
    assert!(fs.append(p("/log"), b"d", "append at crash").is_err()); // point 5
    assert!(fs.crashed());
    assert!(fs.append(p("/log"), b"e", "append after crash").is_err());
    assert!(fs.read(p("/log"), "read after crash").is_err());
    assert_eq!(fs.points(), 5, "calls after the crash are not I/O points");
    let trace = fs.trace();
    assert_eq!(trace.len(), 5);
    assert_eq!(trace[4].outcome, Outcome::Crashed);
    assert_eq!(trace[4].label, "append at crash");
    assert!(trace[..4].iter().all(|e| e.outcome == Outcome::Ok));
    fs.restart(CrashMode::ProcessCrash);
    let log = fs.read(p("/log"), "read after restart").unwrap();
    assert!(log == b"abc" || log == b"abcd", "{log:?}");
    assert_eq!(fs.points(), 6, "numbering continues after restart");
}

#[test]
fn write_at_a_crash_point_is_not_done_torn_or_whole_by_seed() {
    let mut seen = BTreeSet::new();
    for seed in 0..SEEDS {
        let fs = SimFs::new(SimConfig::new(seed));
        fs.open(p("/f"), OpenMode::Create, "create").unwrap();
        arm_next(&fs, Fault::CrashAt);
        assert!(fs.append(p("/f"), b"12345678", "append at crash").is_err());
        fs.restart(CrashMode::ProcessCrash);
        let got = fs.read(p("/f"), "read").unwrap();
        seen.insert(match got.len() {
            0 => "not done",
            8 => "whole",
            _ if b"12345678".starts_with(&got) => "torn",
            _ => "corrupt",
        });
    }
    let want: BTreeSet<_> = ["not done", "torn", "whole"].into();
    assert_eq!(seen, want);
}

#[test]
fn rename_at_a_crash_point_happens_or_not_by_seed() {
    let mut seen = BTreeSet::new();
    for seed in 0..SEEDS {
        let fs = busy_disk(seed);
        arm_next(&fs, Fault::CrashAt);
        assert!(fs.rename(p("/d/f"), p("/d/g"), "rename at crash").is_err());
        fs.restart(CrashMode::ProcessCrash);
        let image = fs.disk_image();
        seen.insert((image.contains_key(p("/d/f")), image.contains_key(p("/d/g"))));
    }
    assert_eq!(seen, [(false, true), (true, false)].into());
}

#[test]
fn process_crash_keeps_exactly_the_visible_image() {
    for seed in 0..SEEDS {
        let fs = busy_disk(seed);
        let (before, durable) = (fs.image_hash(), fs.durable_image());
        fs.restart(CrashMode::ProcessCrash);
        assert_eq!(fs.image_hash(), before);
        assert_eq!(fs.durable_image(), durable, "a process crash syncs nothing");
    }
}

#[test]
fn power_loss_disk_is_the_new_visible_and_durable_image() {
    let fs = busy_disk(11);
    fs.restart(STRICT);
    assert_eq!(fs.disk_image(), fs.durable_image());
}

fn run_with_unsynced_data(seed: u64) -> (u64, u64) {
    let fs = busy_disk(seed);
    arm_next(&fs, Fault::CrashAt);
    let _ = fs.append(p("/d/f"), b"torn?", "append at crash");
    fs.restart(STRICT);
    fs.append(p("/d/f"), b"after", "append after restart").ok();
    (fs.image_hash(), fs.trace_hash())
}

#[test]
fn same_seed_gives_identical_image_and_trace() {
    for seed in 0..16 {
        assert_eq!(run_with_unsynced_data(seed), run_with_unsynced_data(seed));
    }
}

#[test]
fn different_seeds_give_different_disks_with_unsynced_data() {
    let images: BTreeSet<u64> = (0..16).map(|s| run_with_unsynced_data(s).0).collect();
    assert!(
        images.len() > 4,
        "only {} distinct images over 16 seeds",
        images.len()
    );
}

#[test]
fn trace_records_every_point_with_op_path_and_label() {
    let fs = busy_disk(0);
    let trace = fs.trace();
    assert_eq!(trace.len() as u64, fs.points());
    assert!(trace.iter().enumerate().all(|(i, e)| e.point == i as u64 + 1));
    let rename = trace.iter().find(|e| e.op == IoOp::Rename).unwrap();
    assert_eq!(rename.path, "/d/new -> /d/renamed");
    assert_eq!(rename.label, "rename new");
    assert_eq!(trace[0].op, IoOp::CreateDir);
    assert_eq!(trace[0].label, "mkdir d");
}

#[test]
fn durable_image_holds_only_synced_data_under_synced_entries() {
    let fs = busy_disk(0);
    let durable = fs.durable_image();
    assert_eq!(durable.len(), 1);
    assert_eq!(get(&durable, "/d/f"), Some(&b"durable"[..]));
}

#[test]
fn write_past_max_file_bytes_fails_and_changes_nothing() {
    let fs = SimFs::new(SimConfig {
        max_file_bytes: 8,
        ..SimConfig::new(0)
    });
    fs.open(p("/f"), OpenMode::Create, "create").unwrap();
    fs.append(p("/f"), b"12345", "append").unwrap();
    let err = fs.append(p("/f"), b"6789", "append too far").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FileTooLarge);
    let err = fs.write_at(p("/f"), u64::MAX, b"x", "overflow").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FileTooLarge);
    assert_eq!(fs.read(p("/f"), "read").unwrap(), b"12345");
}

#[test]
fn undecided_lists_unsynced_data_and_undurable_dir_ops() {
    let fs = busy_disk(0);
    let lines = fs.undecided();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(has("/d/f: 1 unsynced and 0 unknown"), "{lines:#?}");
    assert!(has("create /d/new: undecided under Strict"), "{lines:#?}");
    assert!(
        has("rename /d/new -> /d/renamed: undecided under Strict"),
        "{lines:#?}"
    );
    fs.sync(p("/d/f"), "sync f").unwrap();
    fs.sync(p("/d/renamed"), "sync renamed").unwrap();
    fs.sync_dir(p("/d"), "sync d").unwrap();
    assert_eq!(fs.undecided(), Vec::<String>::new());
}

#[test]
fn sim_config_reads_old_json_with_defaults_and_clamps_probabilities() {
    let config: SimConfig = serde_json::from_str(r#"{"seed": 5}"#).unwrap();
    assert_eq!(config, SimConfig::new(5));
    let wild = SimConfig {
        dir_op_survival: 7.0,
        unsynced_write_survival: f64::NAN,
        ..SimConfig::new(1)
    };
    let fs = SimFs::new(wild);
    assert_eq!(fs.config().dir_op_survival, 1.0);
    assert_eq!(fs.config().unsynced_write_survival, 0.0);
    // And the clamped config runs a power loss without panicking.
    fs.open(p("/f"), OpenMode::Create, "create").unwrap();
    fs.append(p("/f"), b"x", "append").unwrap();
    fs.restart(STRICT);
    assert_eq!(fs.disk_image().get(p("/f")).map(Vec::len), Some(0));
}

/// A config where a crash point always interrupts its op midway (a sync
/// then lands a seeded subset) and nothing unsynced survives otherwise, so
/// what a power loss keeps is exactly what the interrupted sync wrote.
fn mid_sync_config(seed: u64) -> SimConfig {
    SimConfig {
        crash_point_done_probability: 1.0,
        torn_write_probability: 1.0,
        unsynced_write_survival: 0.0,
        dir_op_survival: 0.0,
        ..SimConfig::new(seed)
    }
}

#[test]
fn a_power_cut_mid_fsync_lands_any_subset_of_the_dirty_pages_each_whole() {
    const PAGE: usize = 4096;
    let mut seen = BTreeSet::new();
    for seed in 0..SEEDS {
        let fs = SimFs::new(mid_sync_config(seed));
        durable_file(&fs, "/d/f", b"");
        // Three pages in one write, each page its own byte value.
        let data: Vec<u8> = (0..3 * PAGE).map(|i| 1 + (i / PAGE) as u8).collect();
        fs.write_at(p("/d/f"), 0, &data, "write 3 pages").unwrap();
        arm_next(&fs, Fault::CrashAt);
        fs.sync(p("/d/f"), "fsync cut by power").unwrap_err();
        fs.restart(STRICT);
        let disk = fs.disk_image();
        let f = get(&disk, "/d/f").unwrap();
        let mut pattern = Vec::new();
        for page in 0..3 {
            let bytes = f.get(page * PAGE..(page + 1) * PAGE).unwrap_or(&[]);
            let kept = bytes.len() == PAGE && bytes.iter().all(|&b| b == 1 + page as u8);
            let lost = bytes.iter().all(|&b| b == 0);
            assert!(kept || lost, "seed {seed}: page {page} torn inside the page");
            pattern.push(kept);
        }
        seen.insert(pattern);
    }
    // Every subset, non-prefix ones included (writeback is not in order).
    assert_eq!(seen.len(), 8, "patterns seen: {seen:?}");
}

#[test]
fn a_power_cut_mid_sync_dir_commits_any_subset_of_the_directory_changes() {
    let names = ["/d/a", "/d/b", "/d/c"];
    let mut seen = BTreeSet::new();
    for seed in 0..SEEDS {
        let fs = SimFs::new(mid_sync_config(seed));
        fs.create_dir_all(p("/d"), "mkdir d").unwrap();
        fs.sync_dir(p("/"), "sync root").unwrap();
        for name in names {
            fs.open(p(name), OpenMode::Create, "create").unwrap();
            fs.append(p(name), b"x", "append").unwrap();
            fs.sync(p(name), "sync").unwrap();
        }
        arm_next(&fs, Fault::CrashAt);
        fs.sync_dir(p("/d"), "dir fsync cut by power").unwrap_err();
        fs.restart(STRICT);
        let disk = fs.disk_image();
        let pattern: Vec<bool> = names.iter().map(|n| get(&disk, n) == Some(b"x")).collect();
        seen.insert(pattern);
    }
    assert_eq!(seen.len(), 8, "patterns seen: {seen:?}");
}

#[test]
fn short_reads_return_at_least_one_byte_and_read_full_at_loops_over_them() {
    let content: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let fs = SimFs::new(SimConfig {
        short_read_probability: 1.0,
        ..SimConfig::new(1)
    });
    durable_file(&fs, "/d/f", &content);
    let mut buf = vec![0; 5000];
    let n = fs.read_at(p("/d/f"), 100, &mut buf, "one pread").unwrap();
    assert!(
        (1..5000).contains(&n),
        "a short read returns 1..len bytes, got {n}"
    );
    assert_eq!(buf[..n], content[100..100 + n]);
    let before = fs.points();
    let mut buf = vec![0; 5000];
    let n = durable_agent::fs::read_full_at(&fs, p("/d/f"), 100, &mut buf, "looping pread").unwrap();
    assert_eq!(n, 5000);
    assert_eq!(buf, content[100..5100]);
    assert!(fs.points() - before > 1, "the loop asked again");
    // At the end of the file the count is what is left, never more.
    let n = durable_agent::fs::read_full_at(&fs, p("/d/f"), 9990, &mut buf, "tail").unwrap();
    assert_eq!((n, &buf[..n]), (10, &content[9990..]));
    // A single-byte read is never short (POSIX: at least one byte).
    let mut one = [0u8; 1];
    assert_eq!(fs.read_at(p("/d/f"), 0, &mut one, "one byte").unwrap(), 1);
}

#[test]
fn bit_rot_flips_one_durable_byte_and_is_not_an_io_point() {
    let fs = SimFs::new(SimConfig::new(2));
    durable_file(&fs, "/d/f", b"hello");
    fs.append(p("/d/f"), b"!", "unsynced").unwrap();
    let points = fs.points();
    fs.rot(p("/d/f"), 1, 0x01).unwrap();
    assert_eq!(fs.points(), points, "rot is not an I/O point");
    assert_eq!(get(&fs.disk_image(), "/d/f"), Some(&b"hdllo!"[..]));
    assert_eq!(get(&fs.durable_image(), "/d/f"), Some(&b"hdllo"[..]));
    assert_eq!(
        fs.rot(p("/d/f"), 5, 0x01).unwrap_err().kind(),
        ErrorKind::InvalidInput,
        "only durable bytes rot"
    );
}
