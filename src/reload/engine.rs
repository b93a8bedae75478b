//! The reload engine: turns resource changes into workload writes.
//!
//! ```text
//!  changes (Change) ─▶ observed hash vs acted-on hash (checkpoint)
//!        │ differs                                    ▲
//!        ▼                                            │ every workload records it
//!  candidates (store index) ─▶ rules ─▶ strategy ─▶ PATCH ─┘   else: retry with backoff
//! ```
//! The engine never LISTs or GETs workloads or resources: the store answers. The acted-on
//! hashes are the checkpoint, saved to the cluster a moment after they change and on shutdown.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::{EventType, Recorder};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::reload::alert::{Alert, Sink};
use crate::reload::checkpoint::{ShortHash, short};
use crate::reload::events::{Events, WritesOut};
use crate::reload::metrics::Presence;
use crate::reload::strategy::{self, Item, OrphanedEnvVars, Target};
use crate::reload::webhook;
use crate::reload::write::Writes;
use crate::reload::{Metrics, Mode, Rules, merge_patch, pause_patch, resume_patch};
use crate::watch::{Cause, Change, ResourceKey, ResourceKind, ResourceState, Store, Workload, WorkloadKey, used_keys};
use used_keys::KeyChange;

mod acted;
mod config;
mod damping;
mod deferred;
mod orphans;
mod pipeline;
mod queue;
mod report;
mod retry;
mod shards;
mod waiting;

use acted::Acted;
pub use config::{Config, Pacing};
pub use damping::{Damped, DampedSince, FlapDamping};
use damping::{Damping, Verdict};
use deferred::Deferred;
use pipeline::{MAX_QUEUED, Pipeline, PlannedWrite, Prepared, Purpose};
use queue::FairQueue;
pub(crate) use report::workload_reference;
use retry::Retries;
use shards::{SaveResults, Saving, ShardBook};

/// Field manager of every write, as Reloader's.
/// How long acted-on hashes may wait before the checkpoint is saved.
const CHECKPOINT_DELAY: Duration = Duration::from_secs(2);
/// How long shutdown waits for the Events made to be posted.
const EVENT_FLUSH: Duration = Duration::from_secs(5);
/// How often paused Deployments are checked for the end of their pause period.
const RESUME_SWEEP: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The watch task ended before finishing its first sync.
    #[error("the watches stopped before their initial sync")]
    WatchGone,
}

/// What happened to the resource since the engine last acted on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transition {
    Created,
    Updated,
    Deleted,
}

/// What the engine reads from the watch room.
pub struct Inputs {
    /// The store the watch task keeps current.
    pub store: Store,
    /// Changes from the watch task, which owns the sending side; closed when it stops.
    pub changes: mpsc::Receiver<Change>,
    /// The shards the store is complete for (`None` before the first list).
    pub synced: watch::Receiver<Option<BTreeSet<u32>>>,
    /// The shards this replica may act on now, straight from the lease room: a shard is taken
    /// up only while it is still owned, however late the watches catch up.
    pub owned: watch::Receiver<BTreeSet<u32>>,
    /// With `--remove-orphaned-env-vars-at-once`: workloads recording a variable that were
    /// edited, from the watch task (unbounded: one key per such edit, drained at once).
    pub edits: Option<mpsc::UnboundedReceiver<WorkloadKey>>,
}

/// What the engine tells the others. The engine is the only sender of both.
pub struct Outputs {
    /// True once the first reconcile is done: what readiness waits for.
    pub reconciled: watch::Sender<bool>,
    /// Shards the engine is acting on or taking up. A shard joins it before its checkpoint is
    /// read and leaves it only after its checkpoint is saved, so the lease room releases a
    /// shard's Lease once it is gone from here.
    pub active: watch::Sender<BTreeSet<u32>>,
    /// Alerts after successful reloads, to the alert sender (which owns the receiving side).
    /// Never waited on: a full queue drops the alert.
    pub alerts: Option<(mpsc::Sender<Alert>, Sink)>,
    /// The resources flap damping holds now, for `explain`.
    pub damped: Damped,
}

impl Engine {
    /// An engine with nothing acted on yet: its writers, rules and pacing made from `config`.
    fn new(
        client: Client,
        config: Config,
        store: Store,
        metrics: Metrics,
        shards: ShardBook,
        alerts: Option<(mpsc::Sender<Alert>, Sink)>,
        damped: Damped,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), config.reporter.clone());
        let writes_out = WritesOut::new();
        let writes = Writes { client, compactor: config.compactor.clone(), out: writes_out.clone() };
        let rules = Rules::new(config.keys.clone(), config.options.clone());
        let pacing = config.pacing.clone();
        let acted = Acted::new(config.ring.clone());
        let events = Events::new(
            recorder,
            writes_out,
            metrics.errors.with_label_values(&["event_dropped"]),
            metrics.held.events_pending.clone(),
        );
        Engine {
            rules,
            writes,
            config,
            store,
            metrics,
            events,
            acted,
            overlay: HashMap::new(),
            reported: HashSet::new(),
            retries: Retries::default(),
            shards,
            alerts,
            deferred: Deferred::new(pacing.max_rollouts_per_second, pacing.max_concurrent_rollouts)
                .with_damping(Damping::new(pacing.flap_damping, damped)),
            queue: FairQueue::default(),
            pipeline: Pipeline::new(pacing.max_concurrent_writes),
        }
    }
}

impl Engine {
    /// Once a second: resume Deployments whose pause period is over, forget what is gone,
    /// let flap damping forget quiet resources, and follow shards whose checkpoint could not be
    /// read yet.
    fn sweep(&mut self, wanted: &BTreeSet<u32>) {
        self.resume_paused();
        self.prune();
        let damped = self.deferred.damping.prune(Instant::now());
        self.metrics.held.damped_resources.set(damped as i64);
        if !self.follows(wanted) {
            self.follow(wanted);
        }
    }
}

/// Run the engine until `shutdown`: take up every shard the store is complete for (load its
/// checkpoint, act on what changed while nobody watched), act on every change in active
/// shards, and drop shards the watches let go of after saving their checkpoints.
///
/// # Errors
/// [`Error::WatchGone`] if the watches end before their first sync. Failed writes and
/// checkpoint reads are retried, never returned.
pub async fn run(
    client: Client,
    config: Config,
    inputs: Inputs,
    metrics: Metrics,
    outputs: Outputs,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let Inputs { store, mut changes, mut synced, mut owned, mut edits } = inputs;
    let Outputs { reconciled, active, alerts, damped } = outputs;
    tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        res = synced.wait_for(Option::is_some) => { res.map_err(|_| Error::WatchGone)?; }
    }
    let shards = ShardBook::new(client.clone(), owned.clone(), synced.clone(), active);
    let mut engine = Engine::new(client, config, store, metrics, shards, alerts, damped);
    engine.follow(&wanted(&mut synced, &mut owned));
    engine.finish_loading().await;
    // Ready once what changed while nobody watched is written.
    engine.settle().await;
    reconciled.send_replace(true);
    serve(&mut engine, &mut changes, (&mut synced, &mut owned), &mut edits, &shutdown).await;
    // Shutdown: the writes in flight land first (letting go of every shard waits for them);
    // keep what was acted on. Queued changes are covered by the checkpoint: they were not
    // acted on.
    engine.follow(&BTreeSet::new());
    engine.finish_letting_go().await;
    engine.events.flush(EVENT_FLUSH).await;
    Ok(())
}

/// The engine's loop, until `shutdown` or its inputs close: what is due first (shards to
/// follow and take up, deferred writes, the one-second sweep, checkpoint saves, retries),
/// then writes that landed, then changes.
async fn serve(
    engine: &mut Engine,
    changes: &mut mpsc::Receiver<Change>,
    (synced, owned): (&mut watch::Receiver<Option<BTreeSet<u32>>>, &mut watch::Receiver<BTreeSet<u32>>),
    edits: &mut Option<mpsc::UnboundedReceiver<WorkloadKey>>,
    shutdown: &CancellationToken,
) {
    let mut save_at: Option<Instant> = Some(Instant::now());
    let mut tick = tokio::time::interval(RESUME_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let save_deadline = save_at.unwrap_or_else(far_future);
        let write_at = engine.deferred.wake_at(Instant::now());
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Ok(()) = synced.changed() => engine.follow(&wanted(synced, owned)),
            Ok(()) = owned.changed() => engine.follow(&wanted(synced, owned)),
            Some(loaded) = futures::StreamExt::next(&mut engine.shards.loads), if !engine.shards.loads.is_empty() => {
                engine.take_up(loaded).await;
            }
            // Due deferred writes before new changes: a steady stream of changes must not
            // starve them.
            Some(expired) = futures::StreamExt::next(&mut engine.deferred.windows), if !engine.deferred.windows.is_empty() => {
                engine.deferred.window_over(expired.into_inner());
            }
            () = tokio::time::sleep_until(write_at.unwrap_or_else(far_future)), if write_at.is_some() => {
                engine.write_deferred();
            }
            // Timers before changes: under a fan-out that keeps the queue full, the pause-period
            // sweep, retries and checkpoint saves still run when due, each once.
            _ = tick.tick() => engine.sweep(&wanted(synced, owned)),
            () = tokio::time::sleep_until(save_deadline), if save_at.is_some() && engine.shards.saving.is_none() => {
                save_at = None;
                engine.start_save();
            }
            Some((saving, done)) = saving_done(&mut engine.shards.saving) => {
                let ok = engine.saved(saving, done);
                if let Some(delay) = engine.shards.save_retry.after(ok) {
                    save_at = Some(Instant::now() + delay);
                }
            }
            Some(key) = engine.retries.next_due(), if engine.retries.is_waiting() => {
                engine.metrics.retries.inc();
                // A retry acts on whatever the resource holds now.
                let observed = engine.store.resource(&key).map(|s| s.hash);
                engine.enqueue(Change { key, observed, previous: None, cause: Cause::Event }, None);
            }
            Some(key) = next_edit(edits) => engine.check_orphans(&key),
            // Writes that landed free what waits for them.
            Some(landed) = engine.pipeline.next_landed(), if engine.pipeline.is_running() => engine.land(landed),
            // Changes already queued first (they are older than the channel's).
            () = std::future::ready(()), if engine.pipeline.may_pump(engine.queue.len()) => engine.pump(),
            Some(change) = changes.recv(), if engine.queue.len() < MAX_QUEUED => {
                engine.enqueue(change, None);
                engine.take_queued(changes);
            }
            else => break,
        }
        // A landed write may have been the last of a shard let go.
        engine.advance_let_go();
        if !engine.shards.dirty.is_empty() && save_at.is_none() {
            save_at = Some(Instant::now() + CHECKPOINT_DELAY);
        }
    }
}

/// The end of the background checkpoint save, if one is in flight (else never).
async fn saving_done(saving: &mut Option<Saving>) -> Option<(Saving, Result<SaveResults, tokio::task::JoinError>)> {
    let done = match saving.as_mut() {
        Some(running) => (&mut running.task).await,
        None => std::future::pending().await,
    };
    Some((saving.take()?, done))
}

/// The next edited workload from the watches (never, without that channel).
async fn next_edit(edits: &mut Option<mpsc::UnboundedReceiver<WorkloadKey>>) -> Option<WorkloadKey> {
    match edits {
        Some(edits) => edits.recv().await,
        None => std::future::pending().await,
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// The shards to act on: complete in the store and still owned.
fn wanted(
    synced: &mut watch::Receiver<Option<BTreeSet<u32>>>,
    owned: &mut watch::Receiver<BTreeSet<u32>>,
) -> BTreeSet<u32> {
    let owned = owned.borrow_and_update();
    synced.borrow_and_update().iter().flatten().filter(|s| owned.contains(s)).copied().collect()
}

struct Engine {
    rules: Rules,
    writes: Writes,
    config: Config,
    store: Store,
    metrics: Metrics,
    events: Events,
    /// The hash last acted on (or taken as baseline) per resource: the checkpoint's content.
    acted: Acted,
    /// Workloads as our own writes left them, until the watch catches up.
    overlay: HashMap<WorkloadKey, Arc<Workload>>,
    /// Bad annotations already reported, per workload version (one Event each).
    reported: HashSet<(WorkloadKey, String, String)>,
    /// Resources whose change failed, and failed deferred writes: see [`Retries`].
    retries: Retries,
    /// The shards acted on, their checkpoints, and those loading, saving or let go.
    shards: ShardBook,
    alerts: Option<(mpsc::Sender<Alert>, Sink)>,
    /// Coalesced writes, writes held to the rollout budget, and flap damping.
    deferred: Deferred,
    /// Changes to decide, fair across namespaces.
    queue: FairQueue,
    /// Changes whose writes are in flight.
    pipeline: Pipeline,
}

impl Engine {
    /// Decide a change: what it needs written now, or its outcome if nothing.
    fn prepare(&mut self, change: &Change, forced: Option<Transition>) -> Prepared {
        let key = &change.key;
        let current = self.store.resource(key);
        // Never acted on here: what the store held before this event is the baseline.
        let last = self.acted.get(key).or(change.previous.as_ref().map(short));
        let transition = match (forced, last, change.observed) {
            (Some(t), _, _) => t,
            (None, Some(last), Some(seen)) if last == short(&seen) => {
                self.metrics.skipped.with_label_values(&["no_data_change"]).inc();
                return Prepared::Finished(Outcome::Skipped);
            }
            (None, Some(_), Some(_)) => Transition::Updated,
            (None, None, Some(seen)) if change.cause == Cause::Listed => {
                // New to this replica, not new to the cluster: the baseline.
                self.acted.insert(key.clone(), short(&seen));
                let keys = current.filter(|c| c.hash == seen).and_then(|c| c.keys);
                self.acted.baseline_keys(key, keys);
                return Prepared::Finished(Outcome::Skipped);
            }
            (None, None, Some(_)) => Transition::Created,
            (None, Some(_), None) => Transition::Deleted,
            (None, None, None) => return Prepared::Finished(Outcome::Skipped),
        };
        // Act on the newest state; a later event for the same resource is then a no-op.
        let current = match (transition, current) {
            (Transition::Deleted, Some(_)) => {
                // Deleted and already re-created: the creation event that follows decides.
                self.acted.remove(key);
                return Prepared::Finished(Outcome::Skipped);
            }
            (Transition::Created | Transition::Updated, None) => {
                // Gone since the event: the deletion event that follows decides.
                return Prepared::Finished(Outcome::Skipped);
            }
            (_, current) => current,
        };
        let wanted = match transition {
            Transition::Created => self.config.reload_on_create,
            // A class's pod statuses all going (a workload scaled to zero) is no deletion of
            // the class: Reloader never reloads for SecretProviderClassPodStatus deletions.
            Transition::Deleted if key.kind == ResourceKind::SecretProviderClass => false,
            Transition::Deleted => self.config.reload_on_delete,
            Transition::Updated => true,
        };
        if !wanted {
            debug!(?transition, "not reloading for this kind of change");
            // A create is baselined at the hash its event carried, so an update that is already
            // queued behind it still counts as a change.
            self.record_acted(key, change.observed.as_ref().map(short));
            let keys = current.filter(|c| Some(c.hash) == change.observed).and_then(|c| c.keys);
            self.acted.baseline_keys(key, keys);
            return Prepared::Finished(Outcome::Skipped);
        }
        let (target, state) = target_of_state(current.clone());

        if self.config.webhook.is_some() {
            // Webhook-only mode: POST the change if it would reload anything. It counts as
            // handled (checkpoint) only once the receiver took it; until then it is retried.
            let mut matched = Vec::new();
            for candidate in self.store.candidates(key) {
                let workload = self.freshest(candidate);
                if self.target_of(key, &state, &workload).is_some() {
                    matched.push(workload.key.clone());
                }
            }
            let current = current.map(|s| s.hash);
            if matched.is_empty() {
                self.record_acted(key, current.as_ref().map(short));
                return Prepared::Finished(Outcome::Skipped);
            }
            let body = webhook::body(key, current, &matched, jiff::Timestamp::now());
            return Prepared::Post { body, workloads: matched.len(), transition, hash: state.hash, current };
        }

        let writes = self.plan_writes(change, transition, &state, target, current.as_ref());
        self.metrics.held.deferred_writes.set(self.deferred.len() as i64);
        Prepared::Writes { writes, transition, hash: state.hash, current: current.map(|s| s.hash) }
    }

    /// The writes a change needs now, each workload's (those that wait for a window, the
    /// budget or damping are deferred).
    fn plan_writes(
        &mut self,
        change: &Change,
        transition: Transition,
        state: &ResourceState,
        target: Target,
        current: Option<&ResourceState>,
    ) -> Vec<PlannedWrite> {
        let key = &change.key;
        // Only live updates count towards damping (not a retry or a take-up's reconcile).
        let damping = match (transition, &change.previous) {
            (Transition::Updated, Some(_)) => self.deferred.damping.change(key, Instant::now()),
            _ => self.deferred.damping.verdict(key),
        };
        if let Verdict::Damped { .. } = damping {
            self.metrics.held.damped_changes.inc();
        }
        self.acted.deciding(key, state.keys.clone());
        let mut writes = Vec::new();
        for candidate in self.store.candidates(key) {
            let workload = self.freshest(candidate);
            if transition == Transition::Updated && self.uses_no_changed_key(key, state, &workload) {
                continue;
            }
            let mut window = self.window_for(&workload);
            if let Verdict::Damped { window: damped, began } = damping {
                window = window.max(damped);
                if began {
                    self.report_damping(key, &workload, damped);
                }
            }
            if window.is_zero() && !self.deferred.has_budget() {
                match self.plan_one(key, state, target, &workload) {
                    Some(patch) => {
                        let patch = self.with_pause(&workload, patch);
                        writes.push(PlannedWrite { workload, patch, sources: vec![(key.clone(), state.hash)] });
                    }
                    None => debug!(workload = %workload.key, "nothing to record"),
                }
            } else if self.plan_one(key, state, target, &workload).is_some() {
                self.deferred.add(&workload.key, key, current.map(|s| s.hash), window);
            }
        }
        writes
    }

    /// The outcome of a change whose writes are done (`results`: how each went).
    fn finish(
        &mut self,
        key: &ResourceKey,
        transition: Transition,
        hash: crate::watch::DataHash,
        current: Option<crate::watch::DataHash>,
        results: &[WriteResult],
    ) -> Outcome {
        let wrote = results.iter().filter(|r| **r == WriteResult::Written).count();
        if results.contains(&WriteResult::Failed) {
            self.acted.settle_keys(key, false);
            return Outcome::Failed;
        }
        if self.deferred.is_held(key) {
            self.acted.settle_keys(key, false);
            // Handled (checkpoint) once every deferred write of it is done.
            info!(?transition, workloads = wrote, hash = %hash, "change handled in part; writes deferred");
            return if wrote > 0 { Outcome::Done } else { Outcome::Skipped };
        }
        info!(?transition, workloads = wrote, hash = %hash, "change handled");
        self.record_acted(key, current.as_ref().map(short));
        self.acted.settle_keys(key, current.is_some());
        if wrote > 0 { Outcome::Done } else { Outcome::Skipped }
    }

    pub(super) fn record_acted(&mut self, key: &ResourceKey, hash: Option<ShortHash>) {
        match hash {
            Some(h) => self.acted.insert(key.clone(), h),
            None => self.acted.remove(key),
        };
    }

    /// Forget what the engine keeps of objects that are gone: its own versions of workloads
    /// the store has caught up with or no longer holds, and the reload counts (and their
    /// series) of namespaces the store holds nothing of any more (those of shards that moved
    /// away stay a while: [`crate::reload::metrics::KEPT_AFTER_MOVE`]). A cluster that creates
    /// and deletes namespaces all day keeps neither growing.
    fn prune(&mut self) {
        let store = &self.store;
        self.overlay.retain(|key, ours| {
            store.workload(key).is_some_and(|stored| newer(&ours.resource_version, &stored.resource_version))
        });
        self.metrics.sweep_namespaces(Instant::now(), |ns| {
            match (self.acts_on(self.config.ring.shard_of(ns)), store.has_namespace(ns)) {
                (true, true) => Presence::Here,
                (true, false) => Presence::Gone,
                (false, _) => Presence::Elsewhere,
            }
        });
        self.acted.narrow_keys(|key| store.used_key_ids(key));
    }

    /// The store's workload, unless our own later write is not yet reflected there.
    fn freshest(&mut self, stored: Arc<Workload>) -> Arc<Workload> {
        match self.overlay.get(&stored.key) {
            // A Rollout running a Deployment's template: our write answered with none; the
            // store's is the Deployment's.
            Some(ours) if newer(&ours.resource_version, &stored.resource_version) && ours.workload_ref.is_some() => {
                Arc::new(Workload { template: stored.template.clone(), ..(**ours).clone() })
            }
            Some(ours) if newer(&ours.resource_version, &stored.resource_version) => ours.clone(),
            Some(_) => {
                self.overlay.remove(&stored.key);
                stored
            }
            None => stored,
        }
    }

    /// The container that records the reload if the rules reload `workload` for this change
    /// (bad annotations are reported on the way), else `None`.
    fn target_of(&mut self, key: &ResourceKey, state: &ResourceState, workload: &Workload) -> Option<usize> {
        let decision = self.rules.evaluate(key.kind, &key.name, state, workload);
        if !decision.verdict.problems.is_empty() {
            self.report_problems(workload, &decision.verdict.problems);
        }
        match (decision.verdict.mode, decision.container) {
            (None, _) => self.metrics.skipped.with_label_values(&["ignored_or_not_selected"]).inc(),
            (Some(Mode::Auto), None) => self.metrics.skipped.with_label_values(&["strategy_not_updated"]).inc(),
            _ => {}
        }
        decision.container
    }

    /// The patch that reloads `workload` for this change, if the rules say so and it does not
    /// record the target already.
    fn plan_one(
        &mut self,
        key: &ResourceKey,
        state: &ResourceState,
        target: Target,
        workload: &Workload,
    ) -> Option<serde_json::Value> {
        let container = self.target_of(key, state, workload)?;
        let item = Item { kind: key.kind, name: key.name.to_string(), container, target };
        strategy::plan_all(self.config.strategy, workload, &[item], unix_now())
    }

    /// Whether `workload` reads only keys of the resource that this change left alone
    /// (`--reload-on-used-keys`): then it is not rolled. A workload that names resources by
    /// annotation (a reload list, `search`) keeps whole-object reloads.
    fn uses_no_changed_key(&mut self, key: &ResourceKey, state: &ResourceState, workload: &Workload) -> bool {
        let Some(used) = workload.template.key_uses.as_deref().and_then(|u| u.keys(key.kind, &key.name)) else {
            return false;
        };
        if self.rules.keys().names_resources(key.kind, workload) {
            return false;
        }
        match used_keys::compare(used, state.keys.as_deref(), self.acted.keys(key)) {
            KeyChange::Untouched => {
                self.metrics.skipped.with_label_values(&["used_keys_unchanged"]).inc();
                info!(workload = %workload.key, keys = %used, "not reloading: the change touched none of the keys it uses");
                true
            }
            KeyChange::Changed(changed) => {
                info!(workload = %workload.key, keys = ?changed, "reloading: keys it uses changed");
                false
            }
            KeyChange::Unknown => {
                debug!(workload = %workload.key, "keys it uses: no per-key hashes of the data acted on; reloading");
                false
            }
        }
    }

    /// `patch` plus the pause the workload asks for, if any (counted as a matched workload),
    /// and with `--remove-orphaned-env-vars` the removal of variables no reference needs.
    fn with_pause(&mut self, workload: &Workload, mut patch: serde_json::Value) -> serde_json::Value {
        match pause_patch(self.rules.keys(), workload, jiff::Timestamp::now()) {
            Ok(Some(pause)) => merge_patch(&mut patch, pause),
            Ok(None) => {}
            Err(problem) => self.report_problems(workload, &[problem]),
        }
        if self.config.orphaned_env_vars != OrphanedEnvVars::Keep
            && let Some(orphans) = self.orphans_of(workload)
        {
            debug!(workload = %workload.key, variables = ?orphans.names, "removing env vars of resources no longer referenced");
            merge_patch(&mut patch, orphans.patch);
        }
        self.metrics.workloads_matched.with_label_values(&[workload.key.kind.kind()]).inc();
        patch
    }

    /// Account for a write that took `took`: metrics, our own version of the workload, and
    /// an Event and alert per source (or a failure Event).
    fn written(
        &mut self,
        workload: &Workload,
        sources: &[(ResourceKey, crate::watch::DataHash)],
        result: crate::reload::write::WriteOutcome,
        took: Duration,
    ) -> WriteResult {
        // Recording nothing: orphaned variables removed at once.
        if sources.is_empty() {
            return self.removed(workload, result);
        }
        let kind = workload.key.kind.kind();
        self.metrics.action_latency.with_label_values(&[kind]).observe(took.as_secs_f64());
        match result {
            Ok(Some(updated)) => {
                self.metrics.action.with_label_values(&[kind, "success"]).inc();
                self.metrics.count_reload(&workload.key.namespace, true);
                self.overlay.insert(updated.key.clone(), Arc::new(updated));
                for (key, hash) in sources {
                    info!(workload = %workload.key, resource = %key, hash = %hash, strategy = %self.config.strategy, "workload reloaded");
                    let note = format!(
                        "Changes detected in '{}' of type '{}' in namespace '{}', Updated '{}' of type '{}' in namespace '{}'",
                        key.name,
                        key.kind.type_suffix(),
                        key.namespace,
                        workload.key.name,
                        kind,
                        workload.key.namespace
                    );
                    self.publish(workload, EventType::Normal, "Reloaded", note);
                    self.alert(key, &workload.key);
                }
                WriteResult::Written
            }
            Ok(None) => {
                debug!(workload = %workload.key, "workload is gone");
                WriteResult::NotNeeded
            }
            Err(err) => {
                self.metrics.action.with_label_values(&[kind, "error"]).inc();
                self.metrics.count_reload(&workload.key.namespace, false);
                self.metrics.errors.with_label_values(&["update_workload"]).inc();
                warn!(workload = %workload.key, error = %err, "reload failed; will retry");
                let note = format!(
                    "Update for '{}' of type '{}' in namespace '{}' failed with error {}",
                    workload.key.name, kind, workload.key.namespace, err
                );
                self.publish(workload, EventType::Warning, "ReloadFail", note);
                WriteResult::Failed
            }
        }
    }

    /// Resume every Deployment of an active shard whose Reloader pause period is over (one
    /// with a write in flight at the next sweep).
    fn resume_paused(&mut self) {
        let paused_at = self.rules.keys().paused_at.clone();
        let now = jiff::Timestamp::now();
        for stored in self.store.find_workloads(|w| w.annotations.contains_key(&paused_at)) {
            let shard = self.config.ring.shard_of(&stored.key.namespace);
            if !self.acts_on(shard) || self.pipeline.claims(&stored.key) {
                continue;
            }
            let workload = self.freshest(stored);
            let Some(patch) = resume_patch(self.rules.keys(), &workload, now) else { continue };
            let span = tracing::info_span!("resume", workload = %workload.key);
            self.fly(Purpose::Resume, vec![PlannedWrite { workload, patch, sources: Vec::new() }], span);
        }
    }

    /// A resume is back.
    fn resumed(&mut self, key: &WorkloadKey, result: crate::reload::write::WriteOutcome) {
        match result {
            Ok(Some(updated)) => {
                info!(workload = %key, "pause period over; rollout resumed");
                self.overlay.insert(updated.key.clone(), Arc::new(updated));
            }
            Ok(None) => {}
            Err(err) => {
                self.metrics.errors.with_label_values(&["resume_workload"]).inc();
                warn!(workload = %key, error = %err, "resuming a paused Deployment failed; will retry");
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Skipped,
    Done,
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteResult {
    Written,
    NotNeeded,
    Failed,
}

/// What a workload is to record for a resource in `current` state, and the state the rules
/// match: a deleted resource is matched as if it had no annotations of its own.
fn target_of_state(current: Option<ResourceState>) -> (Target, ResourceState) {
    match current {
        Some(state) => (Target::Hash(state.hashes()), state),
        None => (
            Target::Deleted,
            ResourceState {
                hash: crate::watch::DataHash::of_bytes(b""),
                ignored: false,
                search_match: false,
                wide: None,
                keys: None,
            },
        ),
    }
}

/// Wall-clock Unix seconds, as `last-reloaded-from` records them.
fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Whether resourceVersion `a` is later than `b`. They are etcd revisions in practice; an
/// unparseable one is never "newer", so the store wins.
fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_versions_compare_numerically() {
        assert!(newer("10", "9"));
        assert!(!newer("9", "10"));
        assert!(!newer("x", "1"));
    }
}
