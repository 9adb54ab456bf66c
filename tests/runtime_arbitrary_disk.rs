//! Recovery over damaged disks never panics: a valid disk image with one
//! file damaged (bytes flipped, cut, or extended with garbage) either
//! recovers — and then satisfies the invariants — or fails with a typed
//! error that names a file. Nothing in between.

mod runtime_support;

use std::path::{Path, PathBuf};

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::recovery::check_invariants;
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
    Flip { at: usize, byte: u8 },
    Cut { at: usize },
    Garbage { bytes: Vec<u8> },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Damage::Flip { at, byte }),
        any::<usize>().prop_map(|at| Damage::Cut { at }),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(|bytes| Damage::Garbage { bytes }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn recovery_of_a_damaged_disk_never_panics(file in any::<usize>(), d in damage()) {
        let mut image = valid_image();
        let i = file % image.len();
        let bytes = &mut image[i].1;
        match d {
            Damage::Flip { at, byte } if !bytes.is_empty() => {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            Damage::Flip { .. } => {}
            Damage::Cut { at } => bytes.truncate(at % (bytes.len() + 1)),
            Damage::Garbage { bytes: g } => bytes.extend(g),
        }
        let sim = write_image(&image);
        match open(&sim, 4, &Canaries::none()) {
            Ok((rt, _)) => {
                let mem = rt.check_invariants();
                prop_assert!(mem.is_empty(), "damaged {:?}: in-memory invariants {:?}", image[i].0, mem);
                let disk = check_invariants(&sim, Path::new(ROOT));
                prop_assert!(disk.is_ok(), "damaged {:?}: on-disk invariants {:?}", image[i].0, disk);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains(ROOT), "error does not name a file: {}", msg);
            }
        }
    }
}
