//! The harness: a reference model of the runtime's acknowledged state (the
//! oracle), operation generators, the crash driver, and the `repro` binary.
//! It drives `durable-agent` on [`durable_agent::fs::SimFs`] and never
//! touches a real disk (except to save failing cases under `target/`) —
//! but for [`soak`], which runs the real binary on a real directory.
//!
//! One path for every entry point: an [`op::Op`] sequence is resolved
//! against the [`model::Model`], run on the runtime by [`driver::Driver`],
//! crashed and recovered by [`exec::Exec`], judged by [`oracle`], and
//! reported by [`report`]. [`search`] (proptest, profiles in [`profile`]),
//! [`sweep`] (every I/O point) and `repro` all go through [`exec::run_case`]
//! or [`exec::Exec::step`].

pub mod campaign;
pub mod canaries;
pub mod driver;
pub mod exec;
pub mod fuzz;
pub mod jobs;
pub mod loss;
pub mod machine;
pub mod madsim_sim;
pub mod model;
pub mod op;
pub mod oracle;
pub mod oracle_context;
pub mod profile;
pub mod repair;
pub mod replay;
pub mod report;
pub mod rot;
pub mod search;
#[cfg(not(madsim))]
pub mod soak;
pub mod standins;
pub mod sweep;
pub mod sweep_report;
pub mod tour;
pub mod verdicts;
pub mod wal;

pub use exec::{run_case, Case, Exec, GlobalCrash, RunStats};
pub use profile::Profile;
pub use report::Failure;
pub use search::{search, search_with_progress, SearchOutcome};
pub use sweep::{
    generated, generated_by, sweep, sweep_points, PointVerdict, SweepMethod, SweepOptions, SweepSummary,
};
