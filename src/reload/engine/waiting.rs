//! The engine's side of the writes that wait (see [`super::deferred`]): a workload's coalesce
//! window, flap damping, the rollout budget, and what a deferred write does when it lands.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::Engine;
use super::deferred::{GivenBack, ROLLOUT_STALL, ROLLOUT_TIMEOUT};
use super::pipeline::{PlannedWrite, Purpose};
use super::{WriteResult, target_of_state, unix_now};
use crate::reload::checkpoint::short;
use crate::reload::duration::{COALESCE_WINDOW_MAX, parse_go_duration};
use crate::reload::strategy::{self, Item};
use crate::reload::{COALESCE_WINDOW, Problem};
use crate::watch::{ResourceKey, ResourceKind, Workload, WorkloadKey};

impl Engine {
    /// Say once per damping episode, on each workload it holds back, that a resource is damped.
    pub(super) fn report_damping(&self, key: &ResourceKey, workload: &Workload, window: Duration) {
        warn!(resource = %key, workload = %workload.key, ?window, "resource changing too often: its reloads are damped");
        let note = format!(
            "{} {} changes too often (more than --flap-damping-changes within {window:?}): this {} is rolled at most \
             once per {window:?}, with its latest data",
            key.kind.kind(),
            key.name,
            workload.key.kind.kind()
        );
        self.publish(workload, EventType::Warning, "ReloadDamped", note);
    }

    /// The coalesce window of a workload: its own annotation, else `--coalesce-window`.
    pub(super) fn window_for(&mut self, workload: &Workload) -> Duration {
        let Some(value) = workload.annotations.get(COALESCE_WINDOW) else { return self.config.pacing.coalesce_window };
        match parse_go_duration(value, COALESCE_WINDOW_MAX) {
            Ok(window) => window,
            Err(err) => {
                self.report_problems(workload, &[Problem::new(COALESCE_WINDOW, value, err.to_string())]);
                self.config.pacing.coalesce_window
            }
        }
    }

    /// Send the deferred writes that are due (one, with a budget; all, without). One whose
    /// workload has a write in flight is parked until that lands.
    pub(super) fn write_deferred(&mut self) {
        let now = Instant::now();
        for given_back in self.deferred.settle(&self.store, now) {
            self.gave_back(&given_back);
        }
        while let Some((key, items)) = self.deferred.next(now) {
            if self.pipeline.claims(&key) {
                self.deferred.park(key, items);
            } else {
                self.send_pending(key, items, now);
            }
        }
        self.metrics.held.deferred_writes.set(self.deferred.len() as i64);
        self.metrics.held.rollouts_in_flight.set(self.deferred.in_flight() as i64);
    }

    /// A rollout that did not complete gave its `--max-concurrent-rollouts` place back: say
    /// so on the workload, whose owners see why others roll while theirs does not.
    fn gave_back(&self, given_back: &GivenBack) {
        let reason = if given_back.stalled { "stalled" } else { "timeout" };
        self.metrics.held.places_given_back.with_label_values(&[reason]).inc();
        let Some(workload) = self.store.workload(&given_back.workload) else { return };
        let note = if given_back.stalled {
            format!(
                "The rollout has not progressed for {} s: its place among --max-concurrent-rollouts goes to the next workload (the rollout itself goes on)",
                ROLLOUT_STALL.as_secs()
            )
        } else {
            format!(
                "The rollout has not completed in {} s: its place among --max-concurrent-rollouts goes to the next workload (the rollout itself goes on)",
                ROLLOUT_TIMEOUT.as_secs()
            )
        };
        warn!(workload = %given_back.workload, reason, "a rollout gave its place back");
        self.publish(&workload, EventType::Warning, "RolloutPlaceGivenBack", note);
    }

    /// Send one write that records every resource of `items` on the workload, from their
    /// state now (or finish at once if there is nothing to record).
    pub(super) fn send_pending(&mut self, key: WorkloadKey, items: BTreeSet<ResourceKey>, now: Instant) {
        let Some(stored) = self.store.workload(&key) else {
            let released = self.deferred.done(&key, &items);
            self.release(released);
            return;
        };
        let workload = self.freshest(stored);
        let mut plan = Vec::new();
        let mut sources = Vec::new();
        for resource in &items {
            let current = self.store.resource(resource);
            let deletion_reloads = self.config.reload_on_delete && resource.kind != ResourceKind::SecretProviderClass;
            if current.is_none() && !deletion_reloads {
                continue;
            }
            let (target, state) = target_of_state(current);
            let Some(container) = self.target_of(resource, &state, &workload) else { continue };
            plan.push(Item { kind: resource.kind, name: resource.name.to_string(), container, target });
            sources.push((resource.clone(), state.hash));
        }
        let patch = match strategy::plan_all(self.config.strategy, &workload, &plan, unix_now()) {
            Some(patch) => self.with_pause(&workload, patch),
            None => match self.removal_alone(&workload) {
                Some(patch) => {
                    sources.clear();
                    patch
                }
                None => return self.deferred_done(&key, items, WriteResult::NotNeeded),
            },
        };
        self.deferred.sending(&key, now);
        let span = tracing::info_span!("deferred", workload = %key);
        self.fly(Purpose::Deferred(items), vec![PlannedWrite { workload, patch, sources }], span);
    }

    /// A deferred write of `key` landed (`result`): the rollout it started counts against the
    /// budget.
    pub(super) fn deferred_landed(&mut self, key: &WorkloadKey, items: BTreeSet<ResourceKey>, result: WriteResult) {
        if !self.acts_on(self.config.ring.shard_of(&key.namespace)) {
            // Let go meanwhile: the next owner acts on its changes again.
            self.deferred.sent(key, None, Instant::now());
            return;
        }
        let rolling = (result == WriteResult::Written).then(|| self.overlay.get(key).map(|w| w.generation)).flatten();
        self.deferred.sent(key, rolling, Instant::now());
        self.deferred_done(key, items, result);
    }

    /// The resources of a deferred write are recorded (or need not be), or wait for a retry.
    pub(super) fn deferred_done(&mut self, key: &WorkloadKey, items: BTreeSet<ResourceKey>, result: WriteResult) {
        match result {
            WriteResult::Written | WriteResult::NotNeeded => {
                self.retries.write_done(key);
                let released = self.deferred.done(key, &items);
                self.release(released);
            }
            WriteResult::Failed => {
                let delay = self.retries.write_failed(key);
                self.deferred.retry(key.clone(), items, delay);
            }
        }
        self.metrics.held.deferred_writes.set(self.deferred.len() as i64);
        self.metrics.held.rollouts_in_flight.set(self.deferred.in_flight() as i64);
    }

    /// Resources whose every deferred write is done: their change is handled.
    pub(super) fn release(&mut self, released: Vec<(ResourceKey, Option<crate::watch::DataHash>)>) {
        for (key, hash) in released {
            debug!(resource = %key, "every deferred write of the change is done");
            self.record_acted(&key, hash.as_ref().map(short));
            self.shards.dirty.insert(self.shard_of(&key));
        }
    }
}
