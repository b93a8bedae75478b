//! Per-shard Lease acquisition, renewal, release and self-fencing.
//!
//! Publishes the set of shards this replica may act on as a `watch` of [`Ownership`], and
//! the task's `JoinHandle` for `main` to supervise. One Lease per shard plus one membership
//! Lease per replica, in client-go's LeaseLock format; which shards a replica *tries* to hold
//! comes from [`assign`] over the live members, which shards it *acts on* only from Leases it
//! renewed in time.

mod assignment;
mod fence;
mod handoff;
mod manager;
mod metrics;
mod revision;

pub use assignment::assign;
pub use handoff::{LEAVING_ANNOTATION, WARM_ANNOTATION, parse_shards};
pub use manager::{Config, Error, FLEET_LABEL, Ownership, RING_ANNOTATION, ROLE_LABEL, ShardState, ShardStatus, spawn};
pub use metrics::Metrics;
pub(crate) use revision::revision;
