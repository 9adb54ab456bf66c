//! Arbitrary on-disk images through recovery. The image starts from a real
//! one (the built-in tour run on SimFs, so the fuzzer reaches deep parsing
//! paths) and the input corrupts it: overwrite, truncate or append bytes in
//! any file (event logs, pending entries, session records, the SQLite
//! store), plant a whole new file, or flip one bit inside a complete line
//! of an event log or session record (bit rot).
//!
//! Recovery is the product's one boot ([`System::boot`]: root lock,
//! stores, the whole recovery procedure, loop resume), with the harness's
//! stand-ins for the outside world. Must hold for every input: no panic;
//! an error names the file it is about (a corrupt database names the
//! database); a booted system passes its invariant checks (boot checks
//! them itself and refuses otherwise). And when the input is one bit flip
//! alone, the boot must refuse it with the typed corruption error naming
//! that file, the flipped line and the byte offset the line starts at —
//! or, the flip being in a log's last line that `events.pending` holds
//! whole, replace that line from the copy, leaving the file as it was
//! (oracle R6: never accepted, never silently dropped).
//!
//! Damage outside the crash model too: a log emptied or deleted, a log
//! missing some lines (a middle, or its tail) while its `events.pending`
//! holds a later seq, `store.db` (and its WAL) gone from a root whose
//! `root.json` names it. When the input is only such damage, the boot
//! must refuse it naming a damaged file — unless all that was lost is one
//! log's last line, whose copy `events.pending` holds whole (the crash
//! model: replayed) — and a boot that succeeds keeps every log at least
//! as long as it was (nothing acknowledged dropped).
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::store::triggers::{TriggerSource, TriggerSpec};
use durable_agent::system::{CorruptLine, Deps, LineFault, System, SystemConfig};
use durable_agent::world::World;
use durable_agent_sim::standins::{ScriptedProvider, SimTools, SteppedClock};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Edit {
    Overwrite {
        file: u8,
        offset: u32,
        bytes: Vec<u8>,
    },
    Truncate {
        file: u8,
        len: u32,
    },
    Append {
        file: u8,
        bytes: Vec<u8>,
    },
    Plant {
        file: u8,
        name: u8,
        bytes: Vec<u8>,
    },
    Rot {
        file: u8,
        offset: u32,
        bit: u8,
    },
    /// Empty (or delete) the `file`-th event log.
    EmptyLog {
        file: u8,
        delete: bool,
    },
    /// Drop `n` complete lines from line `from` of the `file`-th event log.
    LoseLines {
        file: u8,
        from: u8,
        n: u8,
    },
    /// Delete `store.db` and its WAL.
    LoseStore,
}

impl Edit {
    /// Damage outside the crash model (the refusal oracle applies).
    fn beyond_crash_model(&self) -> bool {
        matches!(
            self,
            Edit::EmptyLog { .. } | Edit::LoseLines { .. } | Edit::LoseStore
        )
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    edits: Vec<Edit>,
}

const ROOT: &str = "/data";

fn deps(fs: &SimFs) -> Deps {
    Deps {
        provider: Arc::new(ScriptedProvider::default()),
        tools: Arc::new(SimTools::new(fs.clone())),
        outbox: Arc::new(World::without_dedup()),
        clock: Arc::new(SteppedClock::default()),
    }
}

/// The files of a healthy image: a small agent tree with turns (one with
/// an irreversible effect through the ledger), messages, an eviction and a
/// pending trigger — built once per process by the system itself.
fn base_image() -> &'static Vec<(PathBuf, Vec<u8>)> {
    static BASE: OnceLock<Vec<(PathBuf, Vec<u8>)>> = OnceLock::new();
    BASE.get_or_init(|| {
        let fs = SimFs::new(SimConfig::new(1));
        let shared: Arc<dyn Fs> = Arc::new(fs.clone());
        let built = (|| -> Result<(), Box<dyn std::error::Error>> {
            let (mut system, _) = System::boot(shared.clone(), SystemConfig::new(ROOT, 1), deps(&fs))?;
            let spec = TriggerSpec {
                source: TriggerSource::System,
                dedup_key: Some("nightly".into()),
                session_id: None,
                fire_at_ms: 0,
                priority: 0,
                description: "nightly report".into(),
                payload: serde_json::json!({ "key": "nightly" }),
            };
            system.triggers().emit(system.db().conn(), &spec, 0)?;
            let rt = system.runtime_mut();
            let root = rt.create_root("alpha", "coordinate")?;
            let child = rt.spawn_child(&root, "worker", "work")?;
            rt.run_turn(&root, "p1:Ir")?;
            rt.send_message(&root, &child, "do it")?;
            rt.run_turn(&child, "p2:r")?;
            rt.send_message(&child, &root, "done")?;
            rt.deliver(&child)?;
            rt.evict(&root)?;
            Ok(())
        })();
        // The base image is a fixture: if building it fails the target is
        // broken, which must be loud, not a silently empty image.
        if let Err(e) = built {
            panic!("building the base image failed: {e}");
        }
        fs.disk_image()
            .into_iter()
            .filter(|(p, _)| p.starts_with(ROOT))
            .collect()
    })
}

/// Flip bit `bit` of a byte inside a complete line (never its newline) of
/// the `file`-th event log or session record; returns the damaged line.
fn rot(files: &mut [(PathBuf, Vec<u8>)], file: u8, offset: u32, bit: u8) -> Option<CorruptLine> {
    let targets: Vec<usize> = (0..files.len())
        .filter(|&i| {
            let name = files[i].0.file_name().and_then(|n| n.to_str());
            matches!(name, Some("events.jsonl" | "session.json"))
        })
        .collect();
    let (path, data) = &mut files[*targets.get(usize::from(file) % targets.len().max(1))?];
    // Complete lines: (number, start, end without the newline).
    let mut lines = Vec::new();
    let mut start = 0;
    while let Some(nl) = data[start..].iter().position(|&b| b == b'\n') {
        if nl > 0 {
            lines.push((lines.len() as u64 + 1, start, start + nl));
        }
        start += nl + 1;
    }
    let content: usize = lines.iter().map(|(_, s, e)| e - s).sum();
    if content == 0 {
        return None;
    }
    let mut at = offset as usize % content;
    for (line, s, e) in lines {
        if at < e - s {
            data[s + at] ^= 1 << (bit % 8);
            return Some(CorruptLine {
                path: path.clone(),
                line,
                offset: s as u64,
            });
        }
        at -= e - s;
    }
    None
}

fn is_log(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "events.jsonl")
}

/// The `file`-th event log.
fn pick_log(files: &[(PathBuf, Vec<u8>)], file: u8) -> Option<usize> {
    let logs: Vec<usize> = (0..files.len()).filter(|&i| is_log(&files[i].0)).collect();
    logs.get(usize::from(file) % logs.len().max(1)).copied()
}

fn count_lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

/// The files whose damage the boot must refuse: every log that is no
/// longer its base (except one that lost exactly its last line, which its
/// `events.pending` replays), and `store.db` if it is gone.
fn must_refuse(files: &[(PathBuf, Vec<u8>)]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (path, base) in base_image() {
        let now = files.iter().find(|(p, _)| p == path).map(|(_, d)| d);
        if is_log(path) {
            let lost_last_only = now.is_some_and(|now| {
                base.starts_with(now) && now.len() < base.len() && count_lines(&base[now.len()..]) == 1
            });
            if now != Some(base) && !lost_last_only {
                out.push(path.clone());
            }
        } else if path.file_name().is_some_and(|n| n == "store.db") && now.is_none() {
            out.push(path.clone());
        }
    }
    out
}

fn pick(files: &[(PathBuf, Vec<u8>)], i: u8) -> Option<usize> {
    if files.is_empty() {
        None
    } else {
        Some(usize::from(i) % files.len())
    }
}

fuzz_target!(|input: Input| {
    let mut files = base_image().clone();
    let edits = input.edits.len().min(8);
    let only_beyond = edits > 0 && input.edits.iter().take(8).all(Edit::beyond_crash_model);
    let mut rotted = None;
    for edit in input.edits.into_iter().take(8) {
        match edit {
            Edit::Overwrite { file, offset, bytes } => {
                if let Some(i) = pick(&files, file) {
                    let data = &mut files[i].1;
                    let at = (offset as usize) % (data.len() + 1);
                    let end = (at + bytes.len()).min(data.len());
                    data[at..end].copy_from_slice(&bytes[..end - at]);
                }
            }
            Edit::Truncate { file, len } => {
                if let Some(i) = pick(&files, file) {
                    let data = &mut files[i].1;
                    let keep = (len as usize) % (data.len() + 1);
                    data.truncate(keep);
                }
            }
            Edit::Append { file, bytes } => {
                if let Some(i) = pick(&files, file) {
                    files[i].1.extend_from_slice(&bytes);
                }
            }
            Edit::Plant { file, name, bytes } => {
                if let Some(i) = pick(&files, file) {
                    let dir = files[i].0.parent().map(Path::to_path_buf).unwrap_or_default();
                    let names = [
                        "events.jsonl",
                        "events.pending",
                        "session.json",
                        "session.json.tmp",
                    ];
                    let path = dir.join(names[usize::from(name) % names.len()]);
                    files.push((path, bytes));
                }
            }
            Edit::Rot { file, offset, bit } => rotted = rot(&mut files, file, offset, bit),
            Edit::EmptyLog { file, delete } => {
                if let Some(i) = pick_log(&files, file) {
                    if delete {
                        files.remove(i);
                    } else {
                        files[i].1.clear();
                    }
                }
            }
            Edit::LoseLines { file, from, n } => {
                if let Some(i) = pick_log(&files, file) {
                    let data = &mut files[i].1;
                    let lines: Vec<Vec<u8>> = data
                        .split_inclusive(|&b| b == b'\n')
                        .map(<[u8]>::to_vec)
                        .collect();
                    if !lines.is_empty() {
                        let from = usize::from(from) % lines.len();
                        let n = usize::from(n.max(1)).min(lines.len() - from);
                        *data = lines
                            .iter()
                            .enumerate()
                            .filter(|(k, _)| *k < from || *k >= from + n)
                            .flat_map(|(_, l)| l.iter().copied())
                            .collect();
                    }
                }
            }
            Edit::LoseStore => files.retain(|(p, _)| {
                !p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("store.db"))
            }),
        }
    }
    // Only damage beyond the crash model: which files the boot must name.
    let refuse = if only_beyond {
        Some(must_refuse(&files))
    } else {
        None
    };
    // One flip alone: the boot must name exactly that line.
    let only_rot = if edits == 1 { rotted } else { None };

    let fs = SimFs::new(SimConfig::new(3));
    for (path, data) in &files {
        if let Some(dir) = path.parent() {
            let _ = fs.create_dir_all(dir, "fuzz image mkdir");
        }
        let _ = fs.open(path, OpenMode::Truncate, "fuzz image create");
        let _ = fs.write_at(path, 0, data, "fuzz image write");
    }
    let shared: Arc<dyn Fs> = Arc::new(fs.clone());
    // The one boot that may succeed over a flip (R6 `Replaced`): the flip
    // was in the log's last line, which `events.pending` holds whole, and
    // recovery replaced the line from that copy — the file is whole again.
    let restored = |rot: &CorruptLine| {
        let original = base_image().iter().find(|(p, _)| *p == rot.path).map(|(_, d)| d);
        original.is_some() && fs.read(&rot.path, "fuzz rot check").ok().as_ref() == original
    };
    let booted = System::boot(shared, SystemConfig::new(ROOT, 3), deps(&fs));
    if let Some(refuse) = &refuse {
        match &booted {
            Ok(_) if !refuse.is_empty() => {
                panic!("damage beyond the crash model was booted, not refused: {refuse:?}")
            }
            Ok(_) => {
                // Nothing acknowledged dropped: no log shorter than it was.
                for (path, base) in base_image().iter().filter(|(p, _)| is_log(p)) {
                    let now = fs
                        .read(path, "fuzz log check")
                        .map(|b| count_lines(&b))
                        .unwrap_or(0);
                    assert!(
                        now >= count_lines(base),
                        "{} went from {} to {now} entries after a successful boot",
                        path.display(),
                        count_lines(base)
                    );
                }
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    refuse.iter().any(|p| msg.contains(&p.display().to_string())),
                    "the refusal names none of the damaged files {refuse:?}: {msg}"
                );
            }
        }
    }
    match booted {
        Ok(_) if only_rot.as_ref().is_some_and(|r| !restored(r)) => {
            panic!("a flipped bit was accepted as data: {only_rot:?}")
        }
        Err(e) if only_rot.is_some() => {
            assert_eq!(
                e.damaged_line()
                    .filter(|(_, fault)| *fault == LineFault::Corrupt)
                    .map(|(line, _)| line),
                only_rot,
                "the boot must name the flipped line: {e}"
            );
        }
        Ok((system, _report)) => {
            let violations = system.runtime().check_invariants();
            assert!(
                violations.is_empty(),
                "booted system breaks invariants: {violations:?}"
            );
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains('/'), "boot error names no file: {msg}");
        }
    }
});
