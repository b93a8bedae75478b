//! Orphaned `STAKATER_*` variables: those of resources a workload no longer references.
//! `--remove-orphaned-env-vars` removes them with the workload's next reload write;
//! `--remove-orphaned-env-vars-at-once` also gives them a write of their own:
//!
//! ```text
//!  watches: a workload that records a variable was edited,  ──┐
//!           or its namespace joined the selection             │
//!  take-up of a shard: each of its workloads that records one ┴─▶ orphans? ─▶ deferred writes
//!        (the rollout budget, after any write of it in flight, retried on failure) ─▶ removal
//! ```
//! The removal goes through the deferred writes with nothing to record, so it is paced and
//! ordered like any reload write, and a reload write pending for the workload carries it.

use std::sync::Arc;

use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::{Engine, WriteResult};
use crate::reload::strategy::{self, OrphanedEnvVars, Orphans};
use crate::watch::{Workload, WorkloadKey};

impl Engine {
    /// The variables `workload` records for resources it no longer references. None while
    /// its annotations name resources (a reload list, `search`): those need no reference.
    pub(super) fn orphans_of(&self, workload: &Workload) -> Option<Orphans> {
        strategy::orphaned_env_vars(workload, self.rules.keys())
    }

    /// Whether orphaned variables get a write of their own (never in webhook-only mode,
    /// which writes no workload).
    fn removes_at_once(&self) -> bool {
        self.config.orphaned_env_vars == OrphanedEnvVars::AtOnce && self.config.webhook.is_none()
    }

    /// `--remove-orphaned-env-vars-at-once`: if `key` (of a shard acted on) records variables
    /// of resources it no longer references, a write of its own removes them.
    pub(super) fn check_orphans(&mut self, key: &WorkloadKey) {
        if !self.removes_at_once() || !self.acts_on(self.config.ring.shard_of(&key.namespace)) {
            return;
        }
        let Some(stored) = self.store.workload(key) else { return };
        let workload = self.freshest(stored);
        if self.orphans_of(&workload).is_some() {
            self.deferred.clean(key.clone());
            self.metrics.held.deferred_writes.set(self.deferred.len() as i64);
        }
    }

    /// A shard was taken up: check each of its workloads that records a variable (edited
    /// while no replica watched, or before the option was on).
    pub(super) fn sweep_orphans(&mut self, shard: u32) {
        if !self.removes_at_once() {
            return;
        }
        let ring = Arc::clone(&self.config.ring);
        let recording =
            self.store.find_workloads(|w| w.template.records_a_variable() && ring.shard_of(&w.key.namespace) == shard);
        for workload in recording {
            self.check_orphans(&workload.key);
        }
    }

    /// A deferred write of `workload` with nothing to record: the removal of its orphaned
    /// variables, if they go at once (`None`: no write).
    pub(super) fn removal_alone(&self, workload: &Workload) -> Option<serde_json::Value> {
        if !self.removes_at_once() {
            return None;
        }
        let orphans = self.orphans_of(workload)?;
        info!(workload = %workload.key, variables = ?orphans.names, "removing env vars of resources no longer referenced");
        Some(orphans.patch)
    }

    /// A removal alone is back: `reloader_orphaned_env_var_removals_total`, our own version
    /// of the workload, and an Event (not a reload: no reload metric or alert).
    pub(super) fn removed(&mut self, workload: &Workload, result: crate::reload::write::WriteOutcome) -> WriteResult {
        let kind = workload.key.kind.kind();
        match result {
            Ok(Some(updated)) => {
                self.metrics.held.orphan_removals.with_label_values(&["success"]).inc();
                self.overlay.insert(updated.key.clone(), Arc::new(updated));
                info!(workload = %workload.key, "env vars of resources no longer referenced removed");
                let note = format!(
                    "Removed the env vars of ConfigMaps and Secrets no longer referenced from '{}' of type '{}' in namespace '{}'",
                    workload.key.name, kind, workload.key.namespace
                );
                self.publish(workload, EventType::Normal, "OrphanedEnvVarsRemoved", note);
                WriteResult::Written
            }
            Ok(None) => WriteResult::NotNeeded,
            Err(err) => {
                self.metrics.held.orphan_removals.with_label_values(&["error"]).inc();
                self.metrics.errors.with_label_values(&["update_workload"]).inc();
                warn!(workload = %workload.key, error = %err, "removing env vars of resources no longer referenced failed; will retry");
                WriteResult::Failed
            }
        }
    }
}
