//! Recovery over damaged disks never panics: a valid disk image with one
//! file damaged (bytes flipped, cut, or extended with garbage; a log
//! emptied, or missing some middle lines or its last ones while its
//! `events.pending` holds a later seq; the store gone from a root whose
//! `root.json` says it had one) goes through the boot's preflight and the
//! recovery, and either recovers — then satisfies the invariants and keeps
//! every acknowledged log entry (no log shorter than it was) — or fails
//! with a typed error that names a file. Damage outside the crash model
//! (an emptied log, lost lines, a missing store) must fail, naming the
//! damaged file. Nothing in between.

mod runtime_support;

use std::path::{Path, PathBuf};

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::recovery::{check_invariants, preflight};
use proptest::prelude::*;
use runtime_support::{apply, full_scenario, open, ROOT};

/// The disk after the full scenario (files only; dirs are their parents).
fn valid_image() -> Vec<(PathBuf, Vec<u8>)> {
    let sim = SimFs::new(SimConfig::new(4));
    let (mut rt, _) = open(&sim, 4, &Canaries::none()).unwrap();
    let mut agents = Vec::new();
    for op in full_scenario() {
        apply(&mut rt, &mut agents, &op).unwrap();
    }
    sim.disk_image().into_iter().collect()
}

fn write_image(image: &[(PathBuf, Vec<u8>)]) -> SimFs {
    let sim = SimFs::new(SimConfig::new(5));
    sim.create_dir_all(&Path::new(ROOT).join("agents"), "t").unwrap();
    for (path, bytes) in image {
        sim.create_dir_all(path.parent().unwrap(), "t").unwrap();
        sim.open(path, OpenMode::Truncate, "t").unwrap();
        sim.write_at(path, 0, bytes, "t").unwrap();
    }
    sim
}

#[derive(Debug, Clone)]
enum Damage {
    Flip {
        at: usize,
        byte: u8,
    },
    Cut {
        at: usize,
    },
    Garbage {
        bytes: Vec<u8>,
    },
    /// A log emptied (the `file`-th log).
    Emptied,
    /// Lines `from..from+n` of a log gone (a middle, or the tail).
    LostLines {
        from: usize,
        n: usize,
    },
    /// `root.json` names a store; there is no `store.db`.
    StoreGone,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Damage::Flip { at, byte }),
        any::<usize>().prop_map(|at| Damage::Cut { at }),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(|bytes| Damage::Garbage { bytes }),
        Just(Damage::Emptied),
        (any::<usize>(), 1usize..4).prop_map(|(from, n)| Damage::LostLines { from, n }),
        Just(Damage::StoreGone),
    ]
}

fn is_log(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "events.jsonl")
}

fn lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

/// The boot's order: the preflight (damage outside the crash model), then
/// the recovery. An error as its message.
fn boot(sim: &SimFs) -> Result<durable_agent::runtime::Runtime, String> {
    let root = Path::new(ROOT);
    preflight(sim, root, &root.join("store.db")).map_err(|e| e.to_string())?;
    open(sim, 4, &Canaries::none())
        .map(|(rt, _)| rt)
        .map_err(|e| e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn recovery_of_a_damaged_disk_never_panics(file in any::<usize>(), d in damage()) {
        let original = valid_image();
        let mut image = original.clone();
        let logs: Vec<usize> = (0..image.len()).filter(|&i| is_log(&image[i].0)).collect();
        let i = match d {
            Damage::Emptied | Damage::LostLines { .. } => logs[file % logs.len()],
            _ => file % image.len(),
        };
        // Damage outside the crash model: the boot must refuse it, naming
        // this file.
        let mut refused: Option<PathBuf> = None;
        let damaged = image[i].0.clone();
        let bytes = &mut image[i].1;
        match &d {
            &Damage::Flip { at, byte } if !bytes.is_empty() => {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            Damage::Flip { .. } => {}
            &Damage::Cut { at } => bytes.truncate(at % (bytes.len() + 1)),
            Damage::Garbage { bytes: g } => bytes.extend(g.iter().copied()),
            Damage::Emptied => {
                // A log of one entry emptied is the crash model: its
                // `events.pending` holds that entry whole and replays it.
                if lines(bytes) >= 2 {
                    refused = Some(damaged.clone());
                }
                bytes.clear();
            }
            &Damage::LostLines { from, n } => {
                let kept: Vec<Vec<u8>> = bytes.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
                let from = from % kept.len();
                let n = n.min(kept.len() - from);
                let mut out = Vec::new();
                for (k, line) in kept.iter().enumerate() {
                    if k < from || k >= from + n {
                        out.extend_from_slice(line);
                    }
                }
                let total = kept.len();
                *bytes = out;
                // Only the last line gone is the crash model (an append
                // whose copy `events.pending` holds: replayed).
                if !(n == 1 && from + 1 == total) {
                    refused = Some(damaged.clone());
                }
            }
            Damage::StoreGone => {
                image.push((
                    Path::new(ROOT).join("root.json"),
                    b"{\"schema_version\":1,\"store_id\":305419896}\n".to_vec(),
                ));
                refused = Some(Path::new(ROOT).join("store.db"));
            }
        }
        let sim = write_image(&image);
        match boot(&sim) {
            Ok(rt) => {
                prop_assert!(refused.is_none(), "damaged {:?} ({:?}): booted, not refused", damaged, d);
                let mem = rt.check_invariants();
                prop_assert!(mem.is_empty(), "damaged {:?}: in-memory invariants {:?}", damaged, mem);
                let disk = check_invariants(&sim, Path::new(ROOT));
                prop_assert!(disk.is_ok(), "damaged {:?}: on-disk invariants {:?}", damaged, disk);
                // Nothing acknowledged dropped: no log is shorter than it was.
                for (path, bytes) in original.iter().filter(|(p, _)| is_log(p)) {
                    let now = sim.read(path, "t").map(|b| lines(&b)).unwrap_or(0);
                    prop_assert!(
                        now >= lines(bytes),
                        "damaged {:?} ({:?}): {:?} went from {} to {} entries",
                        damaged, d, path, lines(bytes), now
                    );
                }
            }
            Err(msg) => {
                prop_assert!(msg.contains(ROOT), "error does not name a file: {}", msg);
                if let Some(file) = &refused {
                    prop_assert!(
                        msg.contains(&file.display().to_string()),
                        "damaged {:?} ({:?}): the error does not name it: {}", file, d, msg
                    );
                }
            }
        }
    }
}
