//! Per-shard Lease acquisition, renewal, release and self-fencing.
//!
//! Publishes what this replica may act on and what it loads as [`Shards`] (one `watch` per
//! reader), and the task's `JoinHandle` for the runtime to supervise. One Lease per shard plus one membership
//! Lease per replica, in client-go's LeaseLock format; which shards a replica *tries* to hold
//! comes from [`assign`] over the live members, which shards it *acts on* only from Leases it
//! renewed in time.

mod assignment;
mod fence;
mod handoff;
mod holders;
mod manager;
mod metrics;
mod ownership;
mod record;
mod revision;

pub use assignment::assign;
pub use handoff::{LEAVING_ANNOTATION, WARM_ANNOTATION, parse_shards};
pub use manager::{Config, Error, spawn};
pub use metrics::Metrics;
pub use ownership::{Ownership, ShardState, ShardStatus, Shards, alone};
pub use record::{FLEET_LABEL, RING_ANNOTATION, ROLE_LABEL};
pub(crate) use revision::revision;
