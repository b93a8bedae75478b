//! reloader-fleet: a sharded, highly-available drop-in successor to Stakater Reloader.
//!
//! Five rooms, data flowing one way, and the process around them:
//!
//! ```text
//!  Leases -> lease -> shard -> watch -> reload -> PATCH / create Job
//!               \________\________\________\___> admin (reads all)
//!  cli (flags -> Settings) -> runtime (connects, wires and supervises the rooms)
//!                          -> command (explain, fleet status: commands for people)
//! ```
//!
//! `main.rs` parses the flags and hands over to `runtime` or `command`; `tests/` import the
//! rooms from here.

pub mod admin;
pub mod cli;
pub mod client;
pub mod command;
pub mod lease;
pub mod metrics;
pub mod reload;
pub mod runtime;
pub mod shard;
pub mod watch;
