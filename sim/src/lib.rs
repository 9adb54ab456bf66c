//! The harness: a reference model of the runtime's acknowledged state (the
//! oracle), operation generators, the crash driver, and the madsim
//! simulation of the concurrent daemon. It drives `durable-agent` on
//! [`durable_agent::fs::SimFs`] and never touches a real disk.

pub mod madsim_sim;
