//! What the small soak tests share: their options.

use std::time::Duration;

use durable_agent_sim::soak::SoakOptions;

/// A small soak of exactly `crashes` crashes over two roots, with
/// `bin`, in `dir`, verbose.
pub fn options(dir: &std::path::Path, bin: std::path::PathBuf, seed: u64, crashes: u64) -> SoakOptions {
    SoakOptions {
        seed,
        time: Duration::from_secs(240),
        min_crashes: crashes,
        max_crashes: Some(crashes),
        crashes_per_root: crashes.div_ceil(2),
        bin,
        work_dir: dir.to_path_buf(),
        canary: None,
        verbose: true,
    }
}
