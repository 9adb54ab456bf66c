//! `schedules.json` is held on load to the rules an added schedule is held
//! to (`Schedule::validate`: id syntax, a non-empty agent and prompt,
//! `MIN_PERIOD_MS..=MAX_PERIOD_MS`; ids unique; at most `MAX_SCHEDULES`):
//! a file holding what `POST /schedules` refuses (damage, or a hand edit)
//! is refused by `Schedules::load` with `ScheduleError::InvalidFile`
//! naming the file and the schedule, so the scheduler never runs a
//! schedule it could not have added — a zero period would divide by zero
//! in its first pass.
//!
//! The project standard: "Bad input (a corrupt log, a truncated file, ...,
//! garbage JSON, a bad config, ...) gets a clear error naming the file and
//! offset or key".

mod boot_support;

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::system::{System, SystemError};
use durable_agent::worker::schedule::{Schedules, SCHEDULES_FILE};
use durable_agent::world::World;

const SEED: u64 = 7;
use boot_support::ROOT;

fn boot(fs: &SimFs) -> Result<System, SystemError> {
    boot_support::boot_with(fs, SEED, 5_000, World::without_dedup()).map(|(system, _)| system)
}

/// A schedules file as the product writes it (version 1), except that the
/// one schedule's period is 0 ms — what `Schedule::validate` refuses.
const ZERO_PERIOD: &str = r#"{
  "version": 1,
  "schedules": [
    {"id": "daily", "agent": "lead", "prompt": "report", "period_ms": 0}
  ]
}"#;

fn put_schedules(fs: &SimFs, text: &str) {
    let path = Path::new(ROOT).join(SCHEDULES_FILE);
    fs.open(&path, OpenMode::Truncate, "test create").expect("create");
    fs.write_at(&path, 0, text.as_bytes(), "test write")
        .expect("write");
    fs.sync(&path, "test sync").expect("sync");
    fs.sync_dir(Path::new(ROOT), "test dir sync").expect("dir sync");
}

#[test]
fn a_schedules_file_with_a_zero_period_is_refused_naming_the_file() {
    let fs = SimFs::new(SimConfig::new(SEED));
    drop(boot(&fs).expect("boot"));
    put_schedules(&fs, ZERO_PERIOD);
    match Schedules::load(Arc::new(fs.clone()), Path::new(ROOT)) {
        Err(e) => assert!(
            e.to_string().contains(SCHEDULES_FILE),
            "the refusal must name the file: {e}"
        ),
        Ok(s) => panic!(
            "schedules.json holding a schedule with period_ms = 0 (below MIN_PERIOD_MS; `add` refuses \
             it) was accepted silently: {:?}",
            s.list()
        ),
    }
}

#[test]
fn the_scheduler_never_panics_on_a_loaded_schedules_file() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let mut system = boot(&fs).expect("boot");
    system
        .runtime_mut()
        .create_root("lead", "be brief")
        .expect("agent");
    put_schedules(&fs, ZERO_PERIOD);
    // What `serve` does after its boot: load the file (refusing it is
    // fine: that is the clear error), then run the scheduler's pass.
    let Ok(mut schedules) = Schedules::load(Arc::new(fs.clone()), Path::new(ROOT)) else {
        return;
    };
    let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| schedules.tick(&system)));
    let msg = pass.as_ref().err().map(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    });
    assert!(
        pass.is_ok(),
        "the scheduler pass over an accepted schedules.json panicked ({msg:?}) instead of an error naming \
         the file"
    );
}
