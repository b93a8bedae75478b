//! The lease room's metrics.

use crate::metrics::{histogram, int_counter, int_gauge};

#[derive(Clone)]
pub struct Metrics {
    /// `reloader_shards_held`: shards this replica acts on.
    pub shards_held: prometheus::IntGauge,
    /// `reloader_shards_standby`: shards loaded here for a departure (`--hot-standby`).
    pub shards_standby: prometheus::IntGauge,
    /// `reloader_lease_acquisitions_total`.
    pub acquisitions: prometheus::IntCounter,
    /// `reloader_lease_losses_total`: shards this replica stopped acting on (moved, fenced).
    pub losses: prometheus::IntCounter,
    /// `reloader_shard_handoff_seconds`: from seeing a Lease last change to acquiring it.
    pub handoff: prometheus::Histogram,
    /// `reloader_lease_holders_refused`: holders named in the fleet's Leases that are no pod
    /// of this controller's ServiceAccount (someone else writes the fleet's Leases).
    pub refused_holders: prometheus::IntGauge,
}

impl Metrics {
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let shards_held = int_gauge(registry, "reloader_shards_held", "Shards this replica acts on")?;
        let shards_standby = int_gauge(
            registry,
            "reloader_shards_standby",
            "Shards this replica keeps loaded for when another replica leaves (--hot-standby)",
        )?;
        let acquisitions = int_counter(registry, "reloader_lease_acquisitions_total", "Shard leases acquired")?;
        let losses = int_counter(registry, "reloader_lease_losses_total", "Shards this replica stopped acting on")?;
        let handoff = histogram(
            registry,
            "reloader_shard_handoff_seconds",
            "From a Lease's last observed change to acquiring it",
            vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0],
        )?;
        let refused_holders = int_gauge(
            registry,
            "reloader_lease_holders_refused",
            "Holders named in the fleet's Leases that are no pod of this controller's ServiceAccount",
        )?;
        Ok(Metrics { shards_held, shards_standby, acquisitions, losses, handoff, refused_holders })
    }
}
