//! Per-shard Lease acquisition, renewal, release and self-fencing.
//!
//! Publishes the set of shards this replica may act on. Filled in by the sharded-fleet work;
//! until then a single replica acts on every namespace it selects.
