//! The reload engine's metrics, with Reloader's names and labels so dashboards keep working.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    /// `reloader_reload_executed_total{success}`: one per workload write attempt.
    pub reload_executed: IntCounterVec,
    /// `reloader_reload_executed_total_by_namespace{success, namespace}`; only when enabled.
    pub reload_executed_by_namespace: Option<IntCounterVec>,
    /// `reloader_reconcile_total{result}`: one per processed change.
    pub reconcile: IntCounterVec,
    pub reconcile_duration: HistogramVec,
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
    /// Time from a change reaching the engine to its last workload write.
    pub change_latency: Histogram,
    /// The same reload counts per namespace, kept for the admin endpoint.
    pub namespaces: NamespaceStats,
    /// `reloader_alerts_total{sink, result}`: alerts `sent`, `failed` after retries, or
    /// `dropped` because the queue was full.
    pub alerts: IntCounterVec,
    /// What the engine holds now, and what flap damping held back.
    pub held: Held,
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
    /// `reloader_orphaned_env_var_removals_total{result}`: writes of their own that removed
    /// variables of resources no longer referenced (`--remove-orphaned-env-vars-at-once`).
    pub orphan_removals: IntCounterVec,
}

impl Held {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok(gauge)
        };
        let damped_changes = IntCounter::new(
            "reloader_damped_changes_total",
            "Changes of resources changing too often, written with the flap damping window",
        )?;
        registry.register(Box::new(damped_changes.clone()))?;
        let orphan_removals = IntCounterVec::new(
            Opts::new(
                "reloader_orphaned_env_var_removals_total",
                "Writes of their own removing env vars of resources no longer referenced, by result",
            ),
            &["result"],
        )?;
        registry.register(Box::new(orphan_removals.clone()))?;
        Ok(Held {
            damped_changes,
            orphan_removals,
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
        let reload_executed = IntCounterVec::new(
            Opts::new("reloader_reload_executed_total", "Counter of reloads executed by Reloader."),
            &["success"],
        )?;
        let reload_executed_by_namespace = by_namespace
            .then(|| {
                IntCounterVec::new(
                    Opts::new(
                        "reloader_reload_executed_total_by_namespace",
                        "Counter of reloads executed by Reloader by namespace.",
                    ),
                    &["success", "namespace"],
                )
            })
            .transpose()?;
        let reconcile =
            IntCounterVec::new(Opts::new("reloader_reconcile_total", "Changes processed, by result"), &["result"])?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new("reloader_reconcile_duration_seconds", "Time to process one change")
                .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["result"],
        )?;
        let action = IntCounterVec::new(
            Opts::new("reloader_action_total", "Workload writes, by kind and result"),
            &["workload_kind", "result"],
        )?;
        let action_latency = HistogramVec::new(
            HistogramOpts::new("reloader_action_latency_seconds", "Time of one workload write")
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &["workload_kind"],
        )?;
        let skipped =
            IntCounterVec::new(Opts::new("reloader_skipped_total", "Skipped reloads, by reason"), &["reason"])?;
        let errors = IntCounterVec::new(Opts::new("reloader_errors_total", "Errors, by type"), &["type"])?;
        let retries = IntCounter::new("reloader_retries_total", "Changes retried after a failed write")?;
        let workloads_matched =
            IntCounterVec::new(Opts::new("reloader_workloads_matched_total", "Workloads matched, by kind"), &["kind"])?;
        let invalid_annotations =
            IntCounter::new("reloader_invalid_annotations_total", "Workload annotation values that could not be used")?;
        let change_latency = Histogram::with_opts(
            HistogramOpts::new(
                "reloader_change_latency_seconds",
                "From a change reaching the engine to its last write",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )?;
        let alerts = IntCounterVec::new(
            Opts::new("reloader_alerts_total", "Alerts after reloads, by sink and result"),
            &["sink", "result"],
        )?;
        registry.register(Box::new(alerts.clone()))?;
        for success in ["true", "false"] {
            reload_executed.with_label_values(&[success]);
        }
        registry.register(Box::new(reload_executed.clone()))?;
        if let Some(c) = &reload_executed_by_namespace {
            registry.register(Box::new(c.clone()))?;
        }
        registry.register(Box::new(reconcile.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(action.clone()))?;
        registry.register(Box::new(action_latency.clone()))?;
        registry.register(Box::new(skipped.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(workloads_matched.clone()))?;
        registry.register(Box::new(invalid_annotations.clone()))?;
        registry.register(Box::new(change_latency.clone()))?;
        Ok(Metrics {
            reload_executed,
            reload_executed_by_namespace,
            reconcile,
            reconcile_duration,
            action,
            action_latency,
            skipped,
            errors,
            retries,
            workloads_matched,
            invalid_annotations,
            change_latency,
            namespaces: NamespaceStats::default(),
            alerts,
            held: Held::register(registry)?,
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

    /// Drop per-namespace counts and series of namespaces that left this replica, so that a
    /// namespace is counted by exactly one replica at a time and sums across replicas hold.
    pub fn forget_namespaces(&self, gone: impl Fn(&str) -> bool) {
        for namespace in self.namespaces.remove_where(&gone) {
            if let Some(by_ns) = &self.reload_executed_by_namespace {
                for success in ["true", "false"] {
                    let _ = by_ns.remove_label_values(&[success, &namespace]);
                }
            }
        }
    }
}

/// Reloads and failures per namespace counted by this replica, for the admin endpoint.
#[derive(Clone, Default)]
pub struct NamespaceStats(Arc<RwLock<BTreeMap<String, NamespaceCounts>>>);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceCounts {
    pub reloads: u64,
    pub failures: u64,
}

impl NamespaceStats {
    fn record(&self, namespace: &str, success: bool) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        let counts = map.entry(namespace.to_string()).or_default();
        if success {
            counts.reloads += 1;
        } else {
            counts.failures += 1;
        }
    }

    fn remove_where(&self, gone: impl Fn(&str) -> bool) -> Vec<String> {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        let removed: Vec<String> = map.keys().filter(|ns| gone(ns)).cloned().collect();
        for ns in &removed {
            map.remove(ns);
        }
        removed
    }

    pub fn get(&self, namespace: &str) -> NamespaceCounts {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(namespace).copied().unwrap_or_default()
    }
}
