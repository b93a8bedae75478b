//! The reload engine's metrics, with Reloader's names and labels so dashboards keep working.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use tokio::time::Instant;

use crate::metrics::{gauge_vec, histogram, histogram_vec, int_counter, int_counter_vec, int_gauge, int_gauge_vec};

#[derive(Clone)]
pub struct Metrics {
    /// `reloader_reload_executed_total{success}`: one per workload write attempt.
    pub reload_executed: IntCounterVec,
    /// `reloader_reload_executed_total_by_namespace{success, namespace}`; only when enabled.
    pub reload_executed_by_namespace: Option<IntCounterVec>,
    /// `reloader_reconcile_total{result}` and `reloader_reconcile_duration_seconds{result}`:
    /// one per processed change.
    pub reconcile: Reconciles,
    /// `reloader_action_total{workload_kind, result}`.
    pub action: IntCounterVec,
    pub action_latency: HistogramVec,
    /// `reloader_skipped_total{reason}`.
    pub skipped: IntCounterVec,
    /// `reloader_errors_total{type}`.
    pub errors: IntCounterVec,
    pub retries: IntCounter,
    /// `reloader_workloads_matched_total{kind}`.
    pub workloads_matched: IntCounterVec,
    /// Bad annotation values found on workloads (each also an Event on the workload).
    pub invalid_annotations: IntCounter,
    /// A change's way through the engine: its wait in the queue, the queue per namespace, and
    /// the time to its last workload write.
    pub queue: Changes,
    /// The same reload counts per namespace, kept for the admin endpoint.
    pub namespaces: NamespaceStats,
    /// `reloader_alerts_total{sink, result}`: alerts `sent`, `failed` after retries, or
    /// `dropped` because the queue was full.
    pub alerts: IntCounterVec,
    /// What the engine holds now, and what flap damping held back.
    pub held: Held,
    /// How the checkpoint saves go.
    pub checkpoints: Checkpoints,
}

/// A change's way through the engine.
#[derive(Clone)]
pub struct Changes {
    /// `reloader_change_latency_seconds`: from a change reaching the engine to its last write.
    pub latency: Histogram,
    /// `reloader_change_queue_wait_seconds`: from a change queued to its decision.
    wait: Histogram,
    /// With per-namespace metrics, while a namespace has changes queued (no series once its
    /// queue is empty, so they never grow with the namespaces seen):
    /// `reloader_changes_queued{namespace}` and `reloader_change_queue_wait_seconds_last{namespace}`,
    /// how long its last decided change waited.
    by_namespace: Option<(IntGaugeVec, prometheus::GaugeVec)>,
}

impl Changes {
    fn register(registry: &Registry, by_namespace: bool) -> Result<Self, prometheus::Error> {
        let latency = histogram(
            registry,
            "reloader_change_latency_seconds",
            "From a change reaching the engine to its last write",
            vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )?;
        let wait = histogram(
            registry,
            "reloader_change_queue_wait_seconds",
            "From a change queued to its decision",
            vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )?;
        let by_namespace = if by_namespace {
            let depth = int_gauge_vec(
                registry,
                "reloader_changes_queued",
                "Changes queued for a decision, by namespace",
                &["namespace"],
            )?;
            let waited = gauge_vec(
                registry,
                "reloader_change_queue_wait_seconds_last",
                "How long the last change decided of a namespace with changes queued waited",
                &["namespace"],
            )?;
            Some((depth, waited))
        } else {
            None
        };
        Ok(Changes { latency, wait, by_namespace })
    }

    /// `namespace` has `depth` changes queued now.
    pub fn depth(&self, namespace: &str, depth: usize) {
        if let Some((gauge, waited)) = &self.by_namespace {
            if depth == 0 {
                let _ = gauge.remove_label_values(&[namespace]);
                let _ = waited.remove_label_values(&[namespace]);
            } else {
                gauge.with_label_values(&[namespace]).set(depth as i64);
            }
        }
    }

    /// A change of `namespace` waited `waited` for its decision; `depth` are queued behind it.
    pub fn waited(&self, namespace: &str, waited: std::time::Duration, depth: usize) {
        self.wait.observe(waited.as_secs_f64());
        if let Some((_, last)) = &self.by_namespace
            && depth > 0
        {
            last.with_label_values(&[namespace]).set(waited.as_secs_f64());
        }
        self.depth(namespace, depth);
    }
}

/// Processed changes, by result, and the time each took.
#[derive(Clone)]
pub struct Reconciles {
    total: IntCounterVec,
    duration: HistogramVec,
}

impl Reconciles {
    pub fn observe(&self, result: &str, seconds: f64) {
        self.total.with_label_values(&[result]).inc();
        self.duration.with_label_values(&[result]).observe(seconds);
    }

    /// Changes processed with `result` so far.
    pub fn count(&self, result: &str) -> u64 {
        self.total.with_label_values(&[result]).get()
    }
}

/// How the checkpoint saves go: counters and gauges for Prometheus, and per shard the state
/// `/readyz` and `/shards` show.
#[derive(Clone)]
pub struct Checkpoints {
    /// `reloader_checkpoint_saves_total{result}`: `written`, `unchanged` (nothing to write)
    /// or `failed`.
    pub saves: IntCounterVec,
    /// `reloader_checkpoint_bytes_sent_total`: request bytes of checkpoint writes.
    pub bytes_sent: IntCounter,
    /// `reloader_checkpoint_unsaved_shards`: shards acted on whose last save failed.
    pub unsaved: IntGauge,
    /// `reloader_checkpoint_last_saved_timestamp_seconds{shard}`: the last save that held.
    pub last_saved: IntGaugeVec,
    /// `reloader_checkpoint_stored_bytes{shard}`: compressed bytes the checkpoint takes.
    pub stored_bytes: IntGaugeVec,
    pub status: CheckpointStatus,
}

impl Checkpoints {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let saves = int_counter_vec(
            registry,
            "reloader_checkpoint_saves_total",
            "Checkpoint saves, by result (written, unchanged, failed)",
            &["result"],
        )?;
        let bytes_sent =
            int_counter(registry, "reloader_checkpoint_bytes_sent_total", "Request bytes of checkpoint writes")?;
        let unsaved = int_gauge(
            registry,
            "reloader_checkpoint_unsaved_shards",
            "Shards acted on whose last checkpoint save failed (a change made while no replica runs may be lost)",
        )?;
        let last_saved = int_gauge_vec(
            registry,
            "reloader_checkpoint_last_saved_timestamp_seconds",
            "When each shard's checkpoint was last saved",
            &["shard"],
        )?;
        let stored_bytes = int_gauge_vec(
            registry,
            "reloader_checkpoint_stored_bytes",
            "Compressed bytes each shard's checkpoint takes in the cluster",
            &["shard"],
        )?;
        Ok(Checkpoints { saves, bytes_sent, unsaved, last_saved, stored_bytes, status: CheckpointStatus::default() })
    }

    /// A save of `shard` wrote `sent` bytes (0: nothing to write) and the checkpoint takes
    /// `stored` bytes.
    pub fn saved(&self, shard: u32, sent: usize, stored: usize) {
        self.saves.with_label_values(&[if sent == 0 { "unchanged" } else { "written" }]).inc();
        self.bytes_sent.inc_by(sent as u64);
        let label = shard.to_string();
        self.last_saved.with_label_values(&[&label]).set(jiff::Timestamp::now().as_second());
        self.stored_bytes.with_label_values(&[&label]).set(stored as i64);
        self.unsaved.set(self.status.saved(shard) as i64);
    }

    /// A save of `shard` failed with `error` (its text, causes included).
    pub fn failed(&self, shard: u32, error: String) {
        self.saves.with_label_values(&["failed"]).inc();
        self.unsaved.set(self.status.failed(shard, error) as i64);
    }

    /// `shard` is no longer acted on here: its series and state go.
    pub fn forget(&self, shard: u32) {
        let label = shard.to_string();
        let _ = self.last_saved.remove_label_values(&[&label]);
        let _ = self.stored_bytes.remove_label_values(&[&label]);
        self.unsaved.set(self.status.forget(shard) as i64);
    }
}

/// Per shard acted on here: when its checkpoint was last saved, and how saves fail since.
/// Cheap to clone; the engine writes, the admin server reads.
#[derive(Clone, Default)]
pub struct CheckpointStatus(Arc<RwLock<BTreeMap<u32, ShardCheckpoint>>>);

/// One shard's checkpoint, as `/shards` shows it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShardCheckpoint {
    /// The last save that held (wall clock, RFC 3339), `None` before the first.
    pub last_saved: Option<String>,
    /// Saves failed in a row since.
    pub failures: u32,
    /// Why the last save failed, its causes included.
    pub error: Option<String>,
    /// Since when saves fail (monotonic, for the age shown).
    #[serde(skip)]
    pub failing_since: Option<Instant>,
}

impl CheckpointStatus {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u32, ShardCheckpoint>> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns how many shards fail now.
    fn saved(&self, shard: u32) -> usize {
        let mut map = self.write();
        map.insert(
            shard,
            ShardCheckpoint { last_saved: Some(jiff::Timestamp::now().to_string()), ..Default::default() },
        );
        map.values().filter(|s| s.failures > 0).count()
    }

    fn failed(&self, shard: u32, error: String) -> usize {
        let mut map = self.write();
        let entry = map.entry(shard).or_default();
        entry.failures = entry.failures.saturating_add(1);
        entry.error = Some(error);
        entry.failing_since.get_or_insert_with(Instant::now);
        map.values().filter(|s| s.failures > 0).count()
    }

    fn forget(&self, shard: u32) -> usize {
        let mut map = self.write();
        map.remove(&shard);
        map.values().filter(|s| s.failures > 0).count()
    }

    /// Every shard acted on here, and its checkpoint.
    pub fn shards(&self) -> BTreeMap<u32, ShardCheckpoint> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Seconds since the checkpoint of `shard` was last saved here, if it was.
    pub fn saved_seconds_ago(&self, shard: u32) -> Option<u64> {
        let map = self.0.read().unwrap_or_else(|p| p.into_inner());
        let saved: jiff::Timestamp = map.get(&shard)?.last_saved.as_deref()?.parse().ok()?;
        Some(jiff::Timestamp::now().duration_since(saved).as_secs().max(0) as u64)
    }

    /// One line per shard whose checkpoint is not being saved, for `/readyz`.
    pub fn problems(&self, now: Instant) -> Vec<String> {
        self.shards()
            .into_iter()
            .filter(|(_, s)| s.failures > 0)
            .map(|(shard, s)| {
                let since = s.failing_since.map_or(0, |t| now.saturating_duration_since(t).as_secs());
                format!(
                    "shard {shard}: the checkpoint is not being saved ({} failed saves over {since}s; last saved {}): {}",
                    s.failures,
                    s.last_saved.as_deref().unwrap_or("never"),
                    s.error.as_deref().unwrap_or("")
                )
            })
            .collect()
    }
}

/// What the engine holds now (one gauge each), and the changes flap damping held back.
#[derive(Clone)]
pub struct Held {
    /// `reloader_shards_active`: shards the engine has taken up (checkpoint loaded).
    pub shards_active: IntGauge,
    /// `reloader_deferred_writes`: workloads with a coalesced or budget-held write pending.
    pub deferred_writes: IntGauge,
    /// `reloader_rollouts_in_flight`: written workloads whose rollout counts against
    /// `--max-concurrent-rollouts` (not complete yet).
    pub rollouts_in_flight: IntGauge,
    /// `reloader_events_pending`: reload Events made and not yet posted (they wait for a
    /// moment with no write out, at most 5 s).
    pub events_pending: IntGauge,
    /// `reloader_damped_resources`: resources flap damping holds now.
    pub damped_resources: IntGauge,
    /// `reloader_damped_changes_total`: changes whose writes flap damping held back.
    pub damped_changes: IntCounter,
    /// `reloader_rollout_places_given_back_total{reason}`: `--max-concurrent-rollouts` places
    /// given back by rollouts that stalled or ran too long.
    pub places_given_back: IntCounterVec,
    /// `reloader_orphaned_env_var_removals_total{result}`: writes of their own that removed
    /// variables of resources no longer referenced (`--remove-orphaned-env-vars-at-once`).
    pub orphan_removals: IntCounterVec,
}

impl Held {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| int_gauge(registry, name, help);
        let damped_changes = int_counter(
            registry,
            "reloader_damped_changes_total",
            "Changes of resources changing too often, written with the flap damping window",
        )?;
        let orphan_removals = int_counter_vec(
            registry,
            "reloader_orphaned_env_var_removals_total",
            "Writes of their own removing env vars of resources no longer referenced, by result",
            &["result"],
        )?;
        let places_given_back = int_counter_vec(
            registry,
            "reloader_rollout_places_given_back_total",
            "Places among --max-concurrent-rollouts given back by rollouts that stalled or ran too long, by reason",
            &["reason"],
        )?;
        Ok(Held {
            damped_changes,
            orphan_removals,
            places_given_back,
            shards_active: gauge("reloader_shards_active", "Shards the engine has taken up and acts on")?,
            deferred_writes: gauge(
                "reloader_deferred_writes",
                "Workloads with a coalesced or rollout-budget write pending",
            )?,
            rollouts_in_flight: gauge(
                "reloader_rollouts_in_flight",
                "Written workloads whose rollout is not complete yet (with --max-concurrent-rollouts)",
            )?,
            events_pending: gauge("reloader_events_pending", "Reload Events made and not yet posted")?,
            damped_resources: gauge("reloader_damped_resources", "Resources whose reloads flap damping holds now")?,
        })
    }
}

impl Metrics {
    /// Create and register the series. Both `success` values are pre-set to 0, as Reloader does.
    ///
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &Registry, by_namespace: bool) -> Result<Self, prometheus::Error> {
        let reload_executed = int_counter_vec(
            registry,
            "reloader_reload_executed_total",
            "Counter of reloads executed by Reloader.",
            &["success"],
        )?;
        let reload_executed_by_namespace = by_namespace
            .then(|| {
                int_counter_vec(
                    registry,
                    "reloader_reload_executed_total_by_namespace",
                    "Counter of reloads executed by Reloader by namespace.",
                    &["success", "namespace"],
                )
            })
            .transpose()?;
        let reconcile_total =
            int_counter_vec(registry, "reloader_reconcile_total", "Changes processed, by result", &["result"])?;
        let reconcile_duration = histogram_vec(
            registry,
            "reloader_reconcile_duration_seconds",
            "Time to process one change",
            &["result"],
            vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
        )?;
        let action = int_counter_vec(
            registry,
            "reloader_action_total",
            "Workload writes, by kind and result",
            &["workload_kind", "result"],
        )?;
        let action_latency = histogram_vec(
            registry,
            "reloader_action_latency_seconds",
            "Time of one workload write",
            &["workload_kind"],
            vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        )?;
        let skipped = int_counter_vec(registry, "reloader_skipped_total", "Skipped reloads, by reason", &["reason"])?;
        let errors = int_counter_vec(registry, "reloader_errors_total", "Errors, by type", &["type"])?;
        let retries = int_counter(registry, "reloader_retries_total", "Changes retried after a failed write")?;
        let workloads_matched =
            int_counter_vec(registry, "reloader_workloads_matched_total", "Workloads matched, by kind", &["kind"])?;
        let invalid_annotations = int_counter(
            registry,
            "reloader_invalid_annotations_total",
            "Workload annotation values that could not be used",
        )?;

        let alerts = int_counter_vec(
            registry,
            "reloader_alerts_total",
            "Alerts after reloads, by sink and result",
            &["sink", "result"],
        )?;
        for success in ["true", "false"] {
            reload_executed.with_label_values(&[success]);
        }
        Ok(Metrics {
            reload_executed,
            reload_executed_by_namespace,
            reconcile: Reconciles { total: reconcile_total, duration: reconcile_duration },
            action,
            action_latency,
            skipped,
            errors,
            retries,
            workloads_matched,
            invalid_annotations,
            queue: Changes::register(registry, by_namespace)?,
            namespaces: NamespaceStats::default(),
            alerts,
            held: Held::register(registry)?,
            checkpoints: Checkpoints::register(registry)?,
        })
    }

    /// Count one workload write attempt in both reload counters.
    pub fn count_reload(&self, namespace: &str, success: bool) {
        self.namespaces.record(namespace, success);
        let success = if success { "true" } else { "false" };
        self.reload_executed.with_label_values(&[success]).inc();
        if let Some(by_ns) = &self.reload_executed_by_namespace {
            by_ns.with_label_values(&[success, namespace]).inc();
        }
    }

    /// Forget per-namespace counts and series of namespaces that are gone; keep those of
    /// namespaces whose shard moved to another replica for [`KEPT_AFTER_MOVE`], as a
    /// Prometheus counter stays where it was counted: the new owner counts on in a series of
    /// its own, and `sum by (namespace) (increase(...))` over the fleet sees every reload.
    /// (Dropping them at the move made a fleet's per-namespace panels go blank after each
    /// handoff.) Run every second by the engine.
    pub fn sweep_namespaces(&self, now: Instant, presence: impl Fn(&str) -> Presence) {
        for namespace in self.namespaces.sweep(now, presence) {
            if let Some(by_ns) = &self.reload_executed_by_namespace {
                for success in ["true", "false"] {
                    let _ = by_ns.remove_label_values(&[success, &namespace]);
                }
            }
        }
    }
}

/// How long the reload counts of a namespace stay on a replica after its shard moved away:
/// long enough for any dashboard's rate window to see the last increase, short enough that a
/// replica that never learns of the namespace's deletion (it no longer watches it) lets go.
pub const KEPT_AFTER_MOVE: Duration = Duration::from_secs(3600);

/// Where a namespace with reload counts is, as the engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// In a shard this replica acts on, with objects in the store: counted on here.
    Here,
    /// In a shard this replica acts on, with nothing stored: deleted or left the selection.
    Gone,
    /// In a shard held by another replica (or being taken up or let go).
    Elsewhere,
}

/// Reloads and failures per namespace counted by this replica, for the admin endpoint.
#[derive(Clone, Default)]
pub struct NamespaceStats(Arc<RwLock<BTreeMap<String, Counted>>>);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceCounts {
    pub reloads: u64,
    pub failures: u64,
}

/// A namespace's counts, and since when its shard is elsewhere.
#[derive(Clone, Copy, Debug, Default)]
struct Counted {
    counts: NamespaceCounts,
    elsewhere_since: Option<Instant>,
}

impl NamespaceStats {
    fn record(&self, namespace: &str, success: bool) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        let counted = map.entry(namespace.to_string()).or_default();
        counted.elsewhere_since = None;
        if success {
            counted.counts.reloads += 1;
        } else {
            counted.counts.failures += 1;
        }
    }

    /// Remove the namespaces that are gone, or elsewhere for longer than [`KEPT_AFTER_MOVE`];
    /// returns their names.
    fn sweep(&self, now: Instant, presence: impl Fn(&str) -> Presence) -> Vec<String> {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        let mut removed = Vec::new();
        map.retain(|namespace, counted| {
            let keep = match presence(namespace) {
                Presence::Here => {
                    counted.elsewhere_since = None;
                    true
                }
                Presence::Gone => false,
                Presence::Elsewhere => {
                    let since = *counted.elsewhere_since.get_or_insert(now);
                    now.saturating_duration_since(since) < KEPT_AFTER_MOVE
                }
            };
            if !keep {
                removed.push(namespace.clone());
            }
            keep
        });
        removed
    }

    pub fn get(&self, namespace: &str) -> NamespaceCounts {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(namespace).map(|c| c.counts).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_a_while_where_they_were_counted_after_their_shard_moves() {
        let metrics = Metrics::register(&Registry::new(), true).expect("register");
        metrics.count_reload("moved", true);
        metrics.count_reload("deleted", true);
        metrics.count_reload("here", false);
        let start = Instant::now();
        let presence = |ns: &str| match ns {
            "moved" => Presence::Elsewhere,
            "deleted" => Presence::Gone,
            _ => Presence::Here,
        };
        metrics.sweep_namespaces(start, presence);
        let series = |ns: &str| {
            metrics
                .reload_executed_by_namespace
                .as_ref()
                .expect("by namespace")
                .get_metric_with_label_values(&["true", ns])
                .map(|c| c.get())
        };
        assert_eq!(metrics.namespaces.get("moved").reloads, 1, "a moved namespace's count is kept");
        assert_eq!(metrics.namespaces.get("deleted"), NamespaceCounts::default(), "a deleted namespace is forgotten");
        assert_eq!(metrics.namespaces.get("here").failures, 1);
        metrics.sweep_namespaces(start + KEPT_AFTER_MOVE - Duration::from_secs(1), presence);
        assert_eq!(series("moved").ok(), Some(1), "the moved namespace's series is still scraped");
        metrics.sweep_namespaces(start + KEPT_AFTER_MOVE, presence);
        assert_eq!(metrics.namespaces.get("moved"), NamespaceCounts::default(), "forgotten once kept long enough");
        assert_eq!(metrics.namespaces.get("here").failures, 1);
    }

    #[test]
    fn a_namespace_whose_shard_comes_back_counts_on_and_stays() {
        let metrics = Metrics::register(&Registry::new(), false).expect("register");
        metrics.count_reload("ns", true);
        let start = Instant::now();
        metrics.sweep_namespaces(start, |_| Presence::Elsewhere);
        metrics.count_reload("ns", true);
        metrics.sweep_namespaces(start + KEPT_AFTER_MOVE, |_| Presence::Here);
        assert_eq!(metrics.namespaces.get("ns").reloads, 2);
    }
}
