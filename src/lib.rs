//! reloader-fleet: a sharded, highly-available drop-in successor to Stakater Reloader.
//!
//! Five rooms, data flowing one way:
//!
//! ```text
//!  Leases -> lease -> shard -> watch -> reload -> PATCH / create Job
//!               \________\________\________\___> admin (reads all)
//! ```
//!
//! `main.rs` parses configuration and wires the rooms; `tests/` imports them from here.

pub mod admin;
pub mod lease;
pub mod reload;
pub mod shard;
pub mod watch;
