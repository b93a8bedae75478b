//! The watch room's metrics, registered into the process registry by `main`.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::metrics::{int_counter, int_counter_vec, int_gauge, int_gauge_vec};

/// Counters of what the watches received. Cheap to clone (handles to the same series).
#[derive(Clone)]
pub struct Metrics {
    /// `reloader_events_received_total{event_type, resource_type}`, as Reloader names it.
    pub events_received: IntCounterVec,
    /// Watch stream errors (each is retried with backoff).
    pub watch_errors: IntCounter,
    /// `reloader_store_objects{kind="resources"|"workloads"|"unselected"}`: what this replica
    /// holds (`unselected`: compact states of resources in owned namespaces outside the label
    /// selection, the baseline should one be labelled in).
    pub store_objects: IntGaugeVec,
    /// `reloader_namespaces_owned`: namespaces of owned shards with objects this replica watches.
    pub namespaces_owned: IntGauge,
    /// `reloader_watch_streams`: watches running now (each holds a connection to the API server).
    pub streams: IntGauge,
    /// `reloader_watch_streams_started_total`: watches started, each with a full list.
    pub streams_started: IntCounter,
    /// `reloader_annotation_lint_queued_total{result="sent"|"dropped"}`: stored objects passed
    /// to the annotation lint, or dropped because its queue was full.
    pub lint_queued: IntCounterVec,
    /// `reloader_watch_events_foreign_total`: objects received for namespaces of shards held
    /// elsewhere, decoded only to be dropped (the API server's shard filter keeps them away).
    pub events_foreign: IntCounter,
    /// `reloader_watch_server_sharded_collections`: watched collections the API server
    /// filters by shard (`--shard-placement=fnv-ranges` with ShardedListAndWatch).
    pub server_sharded: IntGauge,
    /// `reloader_watch_kinds_forbidden{kind}`: 1 for each kind this replica may not list and
    /// watch, and so does not watch (found at start; the warning is in the log and `/readyz`).
    pub kinds_forbidden: IntGaugeVec,
}

impl Metrics {
    /// Create and register the series.
    ///
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let events_received = int_counter_vec(
            registry,
            "reloader_events_received_total",
            "Watch events received, by event and resource type",
            &["event_type", "resource_type"],
        )?;
        let watch_errors =
            int_counter(registry, "reloader_watch_errors_total", "Watch stream errors, each retried with backoff")?;
        let store_objects =
            int_gauge_vec(registry, "reloader_store_objects", "Objects held in this replica's store", &["kind"])?;
        let namespaces_owned = int_gauge(
            registry,
            "reloader_namespaces_owned",
            "Namespaces of shards held here that have ConfigMaps, Secrets or workloads",
        )?;
        let streams = int_gauge(
            registry,
            "reloader_watch_streams",
            "Watches running, each holding a connection to the API server",
        )?;
        let streams_started =
            int_counter(registry, "reloader_watch_streams_started_total", "Watches started, each with a full list")?;
        let lint_queued = int_counter_vec(
            registry,
            "reloader_annotation_lint_queued_total",
            "Stored objects passed to the annotation lint",
            &["result"],
        )?;
        let events_foreign = int_counter(
            registry,
            "reloader_watch_events_foreign_total",
            "Objects received for namespaces of shards held by other replicas, dropped after decoding",
        )?;
        let server_sharded = int_gauge(
            registry,
            "reloader_watch_server_sharded_collections",
            "Watched collections the API server filters by shard (shardSelector)",
        )?;
        let kinds_forbidden = int_gauge_vec(
            registry,
            "reloader_watch_kinds_forbidden",
            "Kinds this replica may not list and watch, so does not watch",
            &["kind"],
        )?;
        Ok(Metrics {
            events_received,
            watch_errors,
            store_objects,
            namespaces_owned,
            streams,
            streams_started,
            lint_queued,
            events_foreign,
            server_sharded,
            kinds_forbidden,
        })
    }
}
