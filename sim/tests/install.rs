//! Runs past the install start from a copy of the installed disk, built
//! once per canary set (`installed_disk`, `Exec::new`); that is only sound
//! if the install is the same whatever the seed, and if booting the copy is
//! the same as installing then booting. Both are checked here.

use durable_agent::canary::{Canaries, Canary};
use durable_agent::fs::SimFs;
use durable_agent_sim::driver::{installed_disk, sim_config, Driver};
use durable_agent_sim::op::CrashKind;

fn install(seed: u64, canaries: &Canaries) -> (u64, u64) {
    let mut driver = Driver::new(seed, canaries.clone());
    driver.open().expect("install boots");
    assert!(!driver.shutdown(CrashKind::Process));
    (driver.fs.image_hash(), driver.fs.trace_hash())
}

#[test]
fn install_does_not_depend_on_the_seed() {
    // Not `NonLoopingReader`: its VFS takes a short read as end of file,
    // so SQLite reads zero-filled pages, and what it writes then differs
    // by seed (observed: the image hash does, the trace does not). That
    // install is broken — the canary is caught by the first boot of every
    // case — and seed-independence is a property of a working VFS.
    let sets = std::iter::once(Canaries::none()).chain(
        Canary::ALL
            .iter()
            .filter(|c| **c != Canary::NonLoopingReader)
            .map(|c| Canaries::only(*c)),
    );
    for canaries in sets {
        let first = install(0, &canaries);
        for seed in [1, 7, 0xdead_beef_u64] {
            assert_eq!(install(seed, &canaries), first, "seed {seed}, {canaries:?}");
        }
        let disk = installed_disk(&canaries).expect("installed disk");
        let copy = SimFs::from_snapshot(&disk, sim_config(42));
        assert_eq!((copy.image_hash(), copy.trace_hash()), first, "{canaries:?}");
    }
}

/// A run past the install, started from the copy, does the same I/O with
/// the same numbering as one that performs the install (the sweep relies
/// on it to start its points past the install from the copy).
#[test]
fn booting_the_installed_copy_matches_installing_then_booting() {
    for canaries in [Canaries::none(), Canaries::only(Canary::NoDirFsync)] {
        let seed = 99;
        let mut fresh = Driver::new(seed, canaries.clone());
        fresh.open().expect("install boots");
        assert!(!fresh.shutdown(CrashKind::Process));
        fresh.open().expect("installed system boots");
        let disk = installed_disk(&canaries).expect("installed disk");
        let mut copy = Driver::from_install(seed, canaries.clone(), &disk);
        copy.open().expect("copy boots");
        let seen = |d: &Driver| (d.fs.points(), d.fs.trace_hash(), d.fs.image_hash());
        assert_eq!(seen(&copy), seen(&fresh), "{canaries:?}");
        assert!(disk.points() < fresh.fs.points());
    }
}
