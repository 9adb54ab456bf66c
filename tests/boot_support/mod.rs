//! The boot the system tests share: [`System::boot`] of a [`SimFs`] root
//! with the stand-ins (a seeded fake provider, pure tools, the simulated
//! world) and a clock fixed at one instant, so a test's disk is a function
//! of its seed and its ops alone.
#![allow(dead_code)]

use std::sync::Arc;

use durable_agent::fs::SimFs;
use durable_agent::runtime::{FakeProvider, PureTools};
use durable_agent::system::{BootReport, Deps, LogicalClock, System, SystemConfig, SystemError};
use durable_agent::world::World;

/// The root every test boots.
pub const ROOT: &str = "/root";

/// The instant the clock is fixed at unless a test says otherwise (ms).
pub const NOW_MS: u64 = 1_000;

/// A clock that always says the same instant (ms).
#[derive(Debug)]
pub struct Fixed(pub u64);

impl LogicalClock for Fixed {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

/// Boot [`ROOT`] on `fs` at `now_ms` with `world` as the outbox.
pub fn boot_with(
    fs: &SimFs,
    seed: u64,
    now_ms: u64,
    world: World,
) -> Result<(System, BootReport), SystemError> {
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(seed)),
        tools: Arc::new(PureTools),
        outbox: Arc::new(world),
        clock: Arc::new(Fixed(now_ms)),
    };
    System::boot(Arc::new(fs.clone()), SystemConfig::new(ROOT, seed), deps)
}

/// Boot [`ROOT`] on `fs` at [`NOW_MS`], the world without deduplication.
pub fn boot(fs: &SimFs, seed: u64) -> Result<System, SystemError> {
    boot_with(fs, seed, NOW_MS, World::without_dedup()).map(|(system, _)| system)
}
