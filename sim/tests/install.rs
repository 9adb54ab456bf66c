//! Search cases start from an installed disk built once per canary set
//! (`Driver::installed`); that is only sound if the install is the same
//! whatever the seed, which this checks for every canary.

use durable_agent::canary::{Canaries, Canary};
use durable_agent::fs::{CrashMode, SimFs};
use durable_agent_sim::driver::{installed_disk, sim_config, Driver};

fn install(seed: u64, canaries: &Canaries) -> (u64, u64) {
    let mut driver = Driver::new(seed, canaries.clone());
    driver.open().expect("install boots");
    assert!(!driver.shutdown(CrashMode::ProcessCrash));
    (driver.fs.image_hash(), driver.fs.trace_hash())
}

#[test]
fn install_does_not_depend_on_the_seed() {
    let sets = std::iter::once(Canaries::none()).chain(Canary::ALL.iter().map(|c| Canaries::only(*c)));
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
