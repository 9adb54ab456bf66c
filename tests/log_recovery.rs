//! Event-log repair and parsing: a partial trailing line is cut (and its
//! offset reported), a pending entry is replayed once (tail dedup by seq),
//! a torn pending file is cleaned, a newer schema is refused naming the
//! file, line, offset and versions, older entries load, and a corrupt line
//! in the middle is a typed error, never silently dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::log::{self, Event, EventLog, LogError, EVENTS_FILE, PENDING_FILE, SCHEMA_VERSION};
use durable_agent::runtime::SessionId;

fn sid() -> SessionId {
    SessionId::from_hex("00000000000000aa").unwrap()
}

/// A log with three entries in `/s`.
fn log_with_three() -> (SimFs, PathBuf, Vec<String>) {
    let sim = SimFs::new(SimConfig::new(1));
    let dir = PathBuf::from("/s");
    sim.create_dir_all(&dir, "mkdir").unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut log = EventLog::create(fs, &dir, sid(), Canaries::none()).unwrap();
    let mut lines = Vec::new();
    for (ts, p) in [(1, "a"), (2, "b"), (3, "c")] {
        let e = log
            .append(
                ts,
                Event::TurnStart {
                    prompt: p.into(),
                    work: None,
                    reads: Vec::new(),
                },
            )
            .unwrap();
        lines.push(e.to_line().unwrap());
    }
    (sim, dir, lines)
}

/// The `schema_version` a `turn.start` line carries (the oldest that
/// reads it), as [`log_with_three`] writes them.
fn turn_start_version() -> u32 {
    Event::TurnStart {
        prompt: String::new(),
        work: None,
        reads: Vec::new(),
    }
    .min_version()
}

/// The entry after [`log_with_three`]'s (`seq` 3), written at `schema_version`.
fn fourth_entry(schema_version: u32) -> log::LogEntry {
    log::LogEntry {
        schema_version,
        session_id: sid(),
        seq: 3,
        ts: 4,
        event: Event::TurnComplete {
            response: "d".into(),
            delivered: Vec::new(),
        },
    }
}

/// After a repair, `events.pending` holds the log's last line: the
/// high-water mark that tells a shortened log from a crash.
fn assert_mark(sim: &SimFs, dir: &Path, case: &str) {
    let log = sim.read(&dir.join(EVENTS_FILE), "t").unwrap();
    let last = log[..log.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&log[..], |i| &log[i + 1..]);
    assert_eq!(sim.read(&dir.join(PENDING_FILE), "t").unwrap(), last, "{case}");
}

fn repair(sim: &SimFs, dir: &Path) -> Result<(Vec<log::LogEntry>, log::LogRepair), LogError> {
    log::repair(sim, dir, &sid(), &Canaries::none())
}

#[test]
fn appended_entries_are_contiguous_plain_json_lines() {
    let (sim, dir, lines) = log_with_three();
    let bytes = sim.read(&dir.join(EVENTS_FILE), "t").unwrap();
    assert_eq!(String::from_utf8(bytes).unwrap(), lines.concat());
    // The durable pending copy is overwritten, never unlinked: it holds the
    // last entry, which recovery dedups.
    assert_eq!(
        sim.read(&dir.join(PENDING_FILE), "t").unwrap(),
        lines[2].as_bytes()
    );
    let (entries, report) = repair(&sim, &dir).unwrap();
    assert_eq!(entries.len(), 3);
    assert!(report.pending_deduped && !report.pending_replayed, "{report:?}");
    assert_mark(&sim, &dir, "kept");
    let v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(v["seq"], 1);
    assert_eq!(v["ts"], 2);
    assert_eq!(v["event"], "turn.start");
    assert_eq!(v["data"]["prompt"], "b");
    assert_eq!(v["schema_version"], turn_start_version());
    assert!(turn_start_version() <= SCHEMA_VERSION);
}

#[test]
fn partial_trailing_line_is_truncated_at_its_offset() {
    let (sim, dir, lines) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    let valid = lines.concat().len() as u64;
    sim.append(&path, b"{\"schema_version\":1,\"sess", "torn")
        .unwrap();
    let (entries, report) = repair(&sim, &dir).unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(report.truncated_at, Some(valid));
    assert_eq!(report.truncated_bytes, 25);
    assert_eq!(sim.len(&path, "t").unwrap(), valid);
}

#[test]
fn complete_pending_entry_is_replayed_after_the_torn_tail_is_cut() {
    let (sim, dir, _) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    let entry = fourth_entry(1);
    let line = entry.to_line().unwrap();
    let pending = dir.join(PENDING_FILE);
    sim.open(&pending, OpenMode::Truncate, "t").unwrap();
    sim.write_at(&pending, 0, line.as_bytes(), "t").unwrap();
    sim.append(&path, &line.as_bytes()[..10], "torn").unwrap();
    let (entries, report) = repair(&sim, &dir).unwrap();
    assert!(report.pending_replayed);
    assert_eq!(report.truncated_bytes, 10);
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[3], entry);
    assert_mark(&sim, &dir, "replayed");
    // Idempotent: a second repair changes nothing (the mark is deduped).
    let (again, report) = repair(&sim, &dir).unwrap();
    assert_eq!(again, entries);
    let deduped = log::LogRepair {
        pending_deduped: true,
        ..Default::default()
    };
    assert_eq!(report, deduped);
}

#[test]
fn pending_entry_already_in_the_log_is_deduplicated_by_seq() {
    let (sim, dir, lines) = log_with_three();
    let pending = dir.join(PENDING_FILE);
    sim.open(&pending, OpenMode::Truncate, "t").unwrap();
    sim.write_at(&pending, 0, lines[2].as_bytes(), "t").unwrap();
    let (entries, report) = repair(&sim, &dir).unwrap();
    assert_eq!(entries.len(), 3);
    assert!(report.pending_deduped && !report.pending_replayed);
    assert_mark(&sim, &dir, "deduped");
}

#[test]
fn torn_pending_file_is_rewritten_from_the_log_without_touching_it() {
    let (sim, dir, lines) = log_with_three();
    let pending = dir.join(PENDING_FILE);
    sim.open(&pending, OpenMode::Truncate, "t").unwrap();
    sim.write_at(&pending, 0, &lines[0].as_bytes()[..7], "t").unwrap();
    let (entries, report) = repair(&sim, &dir).unwrap();
    assert_eq!(entries.len(), 3);
    assert!(report.pending_torn);
    assert_eq!(
        sim.read(&dir.join(EVENTS_FILE), "t").unwrap(),
        lines.concat().into_bytes()
    );
    assert_mark(&sim, &dir, "torn");
}

#[test]
fn newer_schema_version_is_refused_naming_file_line_offset_and_versions() {
    let (sim, dir, lines) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    // A newer build's line: sealed the same way (the seal format is
    // stable from version 3 on), so it fails on its version, not its CRC.
    let line = lines[0].trim_end();
    let unsealed = format!(
        "{}}}",
        &line[..line.len() - durable_agent::checksum::SEAL_BYTES - 1]
    );
    let object = unsealed
        .replace(
            &format!("\"schema_version\":{}", turn_start_version()),
            "\"schema_version\":9",
        )
        .replace("\"seq\":0", "\"seq\":3");
    let newer = format!("{}\n", durable_agent::checksum::seal(&object));
    sim.append(&path, newer.as_bytes(), "t").unwrap();
    let err = repair(&sim, &dir).unwrap_err();
    let offset = lines.concat().len() as u64;
    match &err {
        LogError::NewerSchema {
            path: p,
            line,
            offset: o,
            found,
            supported,
        } => {
            assert_eq!(
                (p, *line, *o, *found, *supported),
                (&path, 4, offset, 9, SCHEMA_VERSION)
            );
        }
        other => panic!("expected NewerSchema, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("/s/events.jsonl") && msg.contains("line 4") && msg.contains("schema_version 9"),
        "{msg}"
    );
}

#[test]
fn entries_without_schema_version_from_before_versioning_still_load() {
    let sim = SimFs::new(SimConfig::new(1));
    let dir = PathBuf::from("/s");
    sim.create_dir_all(&dir, "t").unwrap();
    let path = dir.join(EVENTS_FILE);
    sim.open(&path, OpenMode::Create, "t").unwrap();
    let old = "{\"session_id\":\"00000000000000aa\",\"seq\":0,\"event\":\"turn.start\",\"data\":{\"prompt\":\"hi\"}}\n";
    sim.append(&path, old.as_bytes(), "t").unwrap();
    let (entries, _) = repair(&sim, &dir).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].schema_version, 0);
    assert_eq!(
        entries[0].event,
        Event::TurnStart {
            prompt: "hi".into(),
            work: None,
            reads: Vec::new(),
        }
    );
}

#[test]
fn corrupt_line_in_the_middle_is_a_typed_error_not_dropped() {
    // A damaged key (byte 3 turns "schema_version" into "sc#ema_version").
    corrupt_at(3);
    // Invalid JSON.
    corrupt_at(1);
    // A damaged byte further into the line.
    corrupt_at(60);
}

fn corrupt_at(byte: usize) {
    let (sim, dir, lines) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    let mut bytes = lines.concat().into_bytes();
    let at = lines[0].len();
    bytes[at + byte] = b'#';
    sim.open(&path, OpenMode::Truncate, "t").unwrap();
    sim.write_at(&path, 0, &bytes, "t").unwrap();
    let before = sim.read(&path, "t").unwrap();
    match repair(&sim, &dir).unwrap_err() {
        LogError::Corrupt {
            path: p,
            line,
            offset,
            ..
        } => {
            assert_eq!((p, line, offset), (path.clone(), 2, at as u64));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert_eq!(sim.read(&path, "t").unwrap(), before, "nothing was cut");
}

#[test]
fn seq_gap_is_reported_as_corruption() {
    let (sim, dir, lines) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    let body = format!("{}{}", lines[0], lines[2]);
    sim.open(&path, OpenMode::Truncate, "t").unwrap();
    sim.write_at(&path, 0, body.as_bytes(), "t").unwrap();
    let err = repair(&sim, &dir).unwrap_err();
    assert!(matches!(err, LogError::Corrupt { line: 2, .. }), "{err}");
}

/// Silent corruption is detected: every single-bit flip anywhere in a
/// complete, durable line (its newline excepted: a flipped last newline
/// looks like a torn tail) is refused as `Corrupt` naming that line and
/// its start offset — never loaded, never cut.
#[test]
fn every_bit_flip_in_a_complete_line_is_a_corrupt_error_naming_line_and_offset() {
    let (sim, dir, lines) = log_with_three();
    let path = dir.join(EVENTS_FILE);
    let start = lines[0].len();
    let content = lines[1].len() - 1;
    let mut checked = 0;
    for at in start..start + content {
        for bit in 0..8 {
            let mask = 1u8 << bit;
            sim.rot(&path, at as u64, mask).unwrap();
            match repair(&sim, &dir) {
                Err(LogError::Corrupt {
                    path: p,
                    line,
                    offset,
                    ..
                }) => {
                    assert_eq!(
                        (p.as_path(), line, offset),
                        (path.as_path(), 2, start as u64),
                        "byte {at} bit {bit}"
                    );
                }
                other => panic!("byte {at} bit {bit}: expected Corrupt at line 2, got {other:?}"),
            }
            sim.rot(&path, at as u64, mask).unwrap();
            checked += 1;
        }
    }
    assert_eq!(checked, content * 8);
    assert_eq!(repair(&sim, &dir).unwrap().0.len(), 3, "restored, it loads");
}

/// Lines written before checksums (versions 0-2, no `crc`) still load; a
/// current line whose seal is stripped is refused.
#[test]
fn unsealed_lines_load_when_older_and_are_refused_when_current() {
    let old = r#"{"schema_version":2,"session_id":"00000000000000aa","seq":0,"ts":1,"event":"turn.start","data":{"prompt":"p"}}"#;
    let entry = log::LogEntry::parse(old.as_bytes()).expect("a version-2 line loads");
    assert_eq!(entry.schema_version, 2);
    let current = old.replace(
        "\"schema_version\":2",
        &format!("\"schema_version\":{SCHEMA_VERSION}"),
    );
    assert!(
        log::LogEntry::parse(current.as_bytes()).is_err(),
        "a current line must carry its checksum"
    );
}

/// A power cut may persist an unacknowledged append's pages out of order:
/// a complete last line with a hole of zeros. When `events.pending` holds
/// that entry whole (same length, next `seq`), the line is cut and the
/// entry replayed from it; without the pending copy, or anywhere but the
/// last line, the same damage is corruption, reported with its offset.
#[test]
fn a_damaged_last_line_that_events_pending_holds_is_replayed_from_it() {
    let entry = fourth_entry(SCHEMA_VERSION);
    let line = entry.to_line().unwrap();
    assert!(line.ends_with('\n'));
    let mut holed = line.clone().into_bytes();
    holed[..12].fill(0);
    for (with_pending, then_another) in [(true, false), (false, false), (true, true)] {
        let case = format!("pending={with_pending} another line after={then_another}");
        let (sim, dir, lines) = log_with_three();
        let path = dir.join(EVENTS_FILE);
        let offset: usize = lines.iter().map(String::len).sum();
        if with_pending {
            let pending = dir.join(PENDING_FILE);
            sim.open(&pending, OpenMode::Truncate, "t").unwrap();
            sim.write_at(&pending, 0, line.as_bytes(), "t").unwrap();
        }
        sim.append(&path, &holed, "holed append").unwrap();
        if then_another {
            sim.append(&path, lines[0].as_bytes(), "t").unwrap();
        }
        match (repair(&sim, &dir), with_pending && !then_another) {
            (Ok((entries, report)), true) => {
                assert_eq!(entries.len(), 4, "{case}");
                assert_eq!(entries[3], entry, "{case}");
                assert!(report.pending_replayed, "{case}");
                assert_eq!(report.truncated_at, Some(offset as u64), "{case}");
                assert_eq!(report.truncated_bytes, line.len() as u64, "{case}");
                assert_mark(&sim, &dir, &case);
            }
            (
                Err(LogError::Corrupt {
                    line: 4, offset: at, ..
                }),
                false,
            ) => {
                assert_eq!(at, offset as u64, "{case}");
            }
            (other, _) => panic!("{case}: {other:?}"),
        }
    }
}

/// Damage outside the crash model: a log emptied or cut short before the
/// acknowledged `seq` that `events.pending` holds is refused, naming the
/// file and what is missing, and nothing is changed (a torn tail alone
/// would have been cut, and a cut in the very line the copy holds is the
/// crash model's torn append: replayed).
#[test]
fn a_log_shortened_below_its_pending_mark_is_refused_and_left_unchanged() {
    for keep in [0usize, 1, 2] {
        let (sim, dir, lines) = log_with_three();
        let path = dir.join(EVENTS_FILE);
        // The writer's copy holds line 3 (seq 2); cut the log to `keep`
        // lines plus half of the next one.
        let kept: String = lines[..keep].concat();
        let half = &lines[keep].as_bytes()[..lines[keep].len() / 2];
        sim.truncate(&path, 0, "t").unwrap();
        sim.append(&path, kept.as_bytes(), "t").unwrap();
        sim.append(&path, half, "t").unwrap();
        let before = sim.read(&path, "t").unwrap();
        let inspected = log::repair::inspect(&sim, &dir, &sid()).unwrap();
        if keep == 2 {
            assert_eq!(inspected.lost_entries(), None);
            let (entries, report) = repair(&sim, &dir).unwrap();
            assert_eq!(entries.len(), 3);
            assert!(report.pending_replayed, "{report:?}");
            continue;
        }
        assert_eq!(inspected.lost_entries(), Some((3, keep as u64)), "keep {keep}");
        match repair(&sim, &dir) {
            Err(LogError::Corrupt {
                path: p,
                line,
                offset,
                reason,
            }) => {
                assert_eq!(p, path);
                assert_eq!(line, keep as u64 + 1);
                assert_eq!(offset, kept.len() as u64);
                assert!(reason.contains("3 were acknowledged"), "{reason}");
            }
            other => panic!("keep {keep}: expected the lost entries refused, got {other:?}"),
        }
        assert_eq!(
            sim.read(&path, "t").unwrap(),
            before,
            "keep {keep}: the log changed"
        );
        assert_eq!(
            sim.read(&dir.join(PENDING_FILE), "t").unwrap(),
            lines[2].as_bytes()
        );
    }
}
