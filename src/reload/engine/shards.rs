//! Taking up and letting go of shards: each shard's checkpoint is loaded when the engine
//! takes the shard up (and what changed meanwhile acted on), and saved when it lets go.
//!
//! ```text
//!  gained ─▶ active (said before reading) ─▶ checkpoint read in the background ─▶ take_up:
//!            changes of the shard meanwhile       (other shards' changes go on)     store vs checkpoint
//!            are not decided: the store holds them,                                  ─▶ the pipeline
//!            and take_up compares it after the read
//!  lost ───▶ letting go: its changes no longer ─▶ its writes in flight land ─▶ checkpoint saved in the
//!            decided (the next owner finds them)   (other shards' go on)        background ─▶ dropped,
//!                                                                               leaves active
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use kube::runtime::events::EventType;
use tracing::{debug, error, info, warn};

use super::{Engine, Transition, acted, saving_done, wanted};
use crate::reload::checkpoint::{self, Checkpoint, short};
use crate::watch::{Cause, Change, ResourceKey, ResourceState};

/// Checkpoints saved at once.
const CHECKPOINT_SAVES: usize = 4;
/// The first wait after a failed checkpoint save, and the longest.
const SAVE_RETRY_MIN: Duration = Duration::from_secs(2);
const SAVE_RETRY_MAX: Duration = Duration::from_secs(120);

/// A shard's checkpoint, read in the background for its take-up.
pub(super) type Load = BoxFuture<'static, Loaded>;

/// What a take-up's read of a checkpoint found.
pub(super) struct Loaded {
    shard: u32,
    /// The take-up it was read for (see [`Engine::take_up`]).
    ticket: u64,
    /// The checkpoint and its content (`None`: none to use, a first start), or why it could
    /// not be read.
    result: Result<(Checkpoint, Option<checkpoint::Loaded>), String>,
}

/// What a background save wrote: per shard, the checkpoint copy and how its save went.
pub(super) type SaveResults = Vec<(u32, Checkpoint, Result<checkpoint::Saved, checkpoint::Error>)>;

/// A background save: the task, the shards it was given, and the word to stop after the
/// checkpoint it is writing.
pub(super) struct Saving {
    pub task: tokio::task::JoinHandle<SaveResults>,
    pub shards: BTreeSet<u32>,
    hurry: CancellationToken,
    /// Saving shards to let them go.
    let_go: bool,
}

/// How long to wait before saving again after a failed save: doubling from
/// [`SAVE_RETRY_MIN`] with jitter (replicas failing together do not retry together), up to
/// [`SAVE_RETRY_MAX`]. A save that holds starts the sequence over.
#[derive(Default)]
pub(super) struct SaveRetry(Option<backon::ExponentialBackoff>);

impl SaveRetry {
    /// After a save that held (`ok`): none; else the wait before the next.
    pub(super) fn after(&mut self, ok: bool) -> Option<Duration> {
        if ok {
            self.0 = None;
            return None;
        }
        let retry = self.0.get_or_insert_with(|| {
            ExponentialBuilder::new()
                .with_min_delay(SAVE_RETRY_MIN)
                .with_max_delay(SAVE_RETRY_MAX)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build()
        });
        Some(retry.next().unwrap_or(SAVE_RETRY_MAX))
    }
}

/// The shard book: the shards the engine acts on and their checkpoints, and those being taken
/// up (checkpoint read), saved or let go (drained, checkpoint saved, then given back).
pub(super) struct ShardBook {
    /// To open each shard's checkpoint.
    client: Client,
    /// The active shards and their checkpoints.
    pub(super) checkpoints: BTreeMap<u32, Checkpoint>,
    /// Active shards whose acted-on hashes changed since their last save.
    pub(super) dirty: BTreeSet<u32>,
    /// The shards this replica may act on, from the lease room.
    pub(super) owned: watch::Receiver<BTreeSet<u32>>,
    /// The watch room's synced shards, read again once a take-up has read the store.
    pub(super) synced: watch::Receiver<Option<BTreeSet<u32>>>,
    /// Tells the lease room which shards the engine is on: see [`super::Outputs::active`].
    pub(super) active: watch::Sender<BTreeSet<u32>>,
    /// The checkpoint save running in the background, if any.
    pub(super) saving: Option<Saving>,
    /// Shards being taken up (their checkpoints read in the background), with the ticket of
    /// the take-up: a read that comes back for another ticket is ignored.
    pub(super) loading: HashMap<u32, u64>,
    /// The checkpoint reads in flight.
    pub(super) loads: FuturesUnordered<Load>,
    /// Shards being let go (their changes no longer decided), with their failed saves.
    pub(super) letting_go: BTreeMap<u32, u8>,
    pub(super) next_ticket: u64,
    /// The delays between failed saves.
    pub(super) save_retry: SaveRetry,
}

impl ShardBook {
    pub(super) fn new(
        client: Client,
        owned: watch::Receiver<BTreeSet<u32>>,
        synced: watch::Receiver<Option<BTreeSet<u32>>>,
        active: watch::Sender<BTreeSet<u32>>,
    ) -> Self {
        ShardBook {
            client,
            checkpoints: BTreeMap::new(),
            dirty: BTreeSet::new(),
            owned,
            synced,
            active,
            saving: None,
            loading: HashMap::new(),
            loads: FuturesUnordered::new(),
            letting_go: BTreeMap::new(),
            next_ticket: 0,
            save_retry: SaveRetry::default(),
        }
    }

    /// The shards to act on: complete in the store and still owned.
    pub(super) fn wanted(&mut self) -> BTreeSet<u32> {
        wanted(&mut self.synced, &mut self.owned)
    }
}

impl Engine {
    /// Compare a shard's part of the synced store with its checkpoint: what changed while
    /// nobody watched? Returns the changes to process, each with the transition to force.
    fn initial_work(&mut self, shard: u32, loaded: Option<checkpoint::Loaded>) -> Vec<(Change, Option<Transition>)> {
        // What the checkpoint cannot vouch for (none at a first start; the resources of a part
        // that could not be read) starts from the store's first list, as Reloader does.
        let current: Vec<(ResourceKey, ResourceState)> =
            self.store.resources_in(|ns| self.config.ring.shard_of(ns) == shard);
        // A checkpoint that names fewer than half of what the shard holds is not believed to
        // know the rest: a partial or forged one (a single line written by hand) would make
        // everything else look created, and --reload-on-create roll the shard. What it does
        // not name is taken as found, as at a first start.
        let named = loaded.as_ref().map_or(0, |l| current.iter().filter(|(k, _)| l.entries.contains_key(k)).count());
        let implausible = loaded.is_some() && is_implausible(named, current.len());
        if implausible {
            self.metrics.errors.with_label_values(&["checkpoint_partial"]).inc();
            warn!(
                shard,
                named,
                resources = current.len(),
                "the checkpoint names fewer than half of the shard's resources: those it does not name are taken as found, not as created"
            );
        }
        let whole = !implausible && loaded.as_ref().is_some_and(checkpoint::Loaded::is_whole);
        let knows = |key: &ResourceKey| !implausible && loaded.as_ref().is_some_and(|l| l.knows(key));
        let replay_all = self.config.reload_on_create && self.config.sync_after_restart;
        let mut work = Vec::new();
        let baselines =
            if whole { HashMap::new() } else { self.store.baselines(|ns| self.config.ring.shard_of(ns) == shard) };
        let present: HashSet<&ResourceKey> = current.iter().map(|(k, _)| k).collect();
        let entries = loaded.as_ref().map(|l| &l.entries);
        for (key, state) in &current {
            let change = Change { key: key.clone(), observed: Some(state.hash), previous: None, cause: Cause::Event };
            match entries.and_then(|e| e.get(key)) {
                _ if replay_all => work.push((change, Some(Transition::Created))),
                Some(last) if *last == short(&state.hash) => {
                    self.acted.insert(key.clone(), *last);
                    self.acted.baseline_keys(key, state.keys.clone());
                }
                Some(last) => {
                    self.acted.insert(key.clone(), *last);
                    work.push((change, None));
                }
                // Reloader's default: what the first list found is the baseline. A change since
                // (the store may be ahead of the changes on their way here) is acted on now.
                None if !knows(key) => match baselines.get(key) {
                    Some(&loaded) => {
                        self.acted.insert(key.clone(), loaded);
                        if loaded != short(&state.hash) {
                            work.push((change, None));
                        } else {
                            self.acted.baseline_keys(key, state.keys.clone());
                        }
                    }
                    // Created since the list: its creation decides.
                    None => work.push((change, None)),
                },
                None => work.push((change, None)),
            }
        }
        for (key, last) in loaded.map(|l| l.entries).into_iter().flatten() {
            if !present.contains(&key) && self.shard_of(&key) == shard {
                self.acted.insert(key.clone(), last);
                work.push((Change { key, observed: None, previous: None, cause: Cause::Event }, None));
            }
        }
        work.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        for (change, _) in &work {
            let key = &change.key;
            debug!(shard, kind = key.kind.kind(), namespace = %key.namespace, name = %key.name,
                checkpoint = ?self.acted.get(key), store = ?change.observed, "changed since the checkpoint");
        }
        work
    }

    /// Whether `shard` is still owned and complete in the store.
    fn holds(&self, shard: u32) -> bool {
        self.shards.owned.borrow().contains(&shard)
            && self.shards.synced.borrow().as_ref().is_some_and(|s| s.contains(&shard))
    }

    pub(super) fn shard_of(&self, key: &ResourceKey) -> u32 {
        self.config.ring.shard_of(&key.namespace)
    }

    /// Whether changes of `shard` are acted on here: taken up and not being let go.
    pub(super) fn acts_on(&self, shard: u32) -> bool {
        self.shards.checkpoints.contains_key(&shard) && !self.shards.letting_go.contains_key(&shard)
    }

    fn checkpoint_name(&self, shard: u32) -> String {
        Checkpoint::name_of(&self.config.checkpoint_name, shard, self.config.ring.shards())
    }

    /// Make the active shards equal `wanted`: start letting the others go (their own writes
    /// land, then their checkpoints are saved in the background; [`Engine::saved`] drops
    /// them) and start taking up the new ones (their checkpoints are read in the background;
    /// [`Engine::take_up`] finishes). A shard whose checkpoint cannot be read stays inactive
    /// and is tried again on the next tick; a shard wanted again while it is let go is taken
    /// up anew once it is gone.
    pub(super) fn follow(&mut self, wanted: &BTreeSet<u32>) {
        // A take-up no longer wanted is dropped: what its read brings back is not used.
        self.shards.loading.retain(|shard, _| wanted.contains(shard));
        let lost: Vec<u32> = self
            .shards
            .checkpoints
            .keys()
            .filter(|s| !wanted.contains(s) && !self.shards.letting_go.contains_key(s))
            .copied()
            .collect();
        let ring = self.config.ring.clone();
        for shard in lost {
            // From now its changes are not decided: the next owner finds them, as they are not
            // in the checkpoint. Deferred writes are dropped for the same reason.
            self.shards.letting_go.insert(shard, 0);
            self.deferred.forget(|ns| ring.shard_of(ns) == shard);
            debug!(shard, "letting go: its writes in flight land, then its checkpoint is saved");
        }
        // Owned now, and said so before acting: a Lease is never released under a shard being
        // taken up (the lease room withdraws it, then waits for it to leave `active`).
        let owned = self.shards.owned.borrow().clone();
        let taking: Vec<u32> = wanted
            .iter()
            .copied()
            .filter(|s| {
                !self.shards.checkpoints.contains_key(s) && !self.shards.loading.contains_key(s) && owned.contains(s)
            })
            .collect();
        // The checkpoints of a handoff's shards are read at once, none waiting for another's,
        // and no change of another shard waits for them.
        for shard in taking {
            self.shards.next_ticket += 1;
            let ticket = self.shards.next_ticket;
            self.shards.loading.insert(shard, ticket);
            let mut checkpoint = Checkpoint::new(
                self.shards.client.clone(),
                &self.config.checkpoint_namespace,
                &self.checkpoint_name(shard),
            );
            let read = tokio::spawn(async move {
                let content = checkpoint.load().await;
                content.map(|content| (checkpoint, content)).map_err(|err| err.to_string())
            });
            self.shards.loads.push(
                async move {
                    let result = read.await.unwrap_or_else(|err| Err(format!("the read ended: {err}")));
                    Loaded { shard, ticket, result }
                }
                .boxed(),
            );
        }
        self.advance_let_go();
        self.publish_active();
    }

    /// Move the shards being let go along: once none of their writes is in flight and no
    /// other save runs (a regular one is hurried), save their checkpoints in the background,
    /// a few at once. Called after everything that may have freed them.
    pub(super) fn advance_let_go(&mut self) {
        if self.shards.letting_go.is_empty() {
            return;
        }
        if let Some(saving) = &self.shards.saving {
            if !saving.let_go {
                saving.hurry.cancel();
            }
            return;
        }
        let writing = self.in_flight_in(|shard| self.shards.letting_go.contains_key(&shard));
        if !writing {
            // Every shard let go is saved (a save that would write what the checkpoint holds
            // writes nothing): resources loaded since the last save (a namespace labelled in)
            // go into it with their baselines, so the next owner finds them known.
            let shards = self.shards.letting_go.keys().copied().collect();
            self.spawn_save(shards, true);
        }
    }

    /// Drop a shard whose let-go is saved (or given up on).
    fn drop_shard(&mut self, shard: u32) {
        self.shards.letting_go.remove(&shard);
        self.shards.checkpoints.remove(&shard);
        self.shards.dirty.remove(&shard);
        for key in self.acted.forget(shard) {
            self.retries.clear(&key);
        }
        self.metrics.checkpoints.forget(shard);
        info!(shard, "shard let go");
    }

    /// Shards acted on, being let go or being taken up, for the lease room (which releases a
    /// shard's Lease once it has left); the metric counts those acted on.
    fn publish_active(&mut self) {
        self.metrics
            .held
            .shards_active
            .set(self.shards.checkpoints.len().saturating_sub(self.shards.letting_go.len()) as i64);
        self.shards
            .active
            .send_replace(self.shards.checkpoints.keys().chain(self.shards.loading.keys()).copied().collect());
    }

    /// Whether every shard of `wanted` is acted on or being taken up.
    pub(super) fn follows(&self, wanted: &BTreeSet<u32>) -> bool {
        wanted.iter().all(|s| self.acts_on(*s) || self.shards.loading.contains_key(s))
    }

    /// Finish taking up a shard whose checkpoint was read: compare the store with it and queue
    /// what changed meanwhile. A read for a take-up since dropped (the shard lost, or lost and
    /// gained again) is ignored: only the latest take-up of a shard is finished.
    pub(super) async fn take_up(&mut self, loaded: Loaded) {
        let Loaded { shard, ticket, result } = loaded;
        if self.shards.loading.get(&shard) != Some(&ticket) {
            return;
        }
        self.shards.loading.remove(&shard);
        let (checkpoint, loaded) = match result {
            Ok(read) => read,
            Err(err) => {
                self.metrics.errors.with_label_values(&["checkpoint"]).inc();
                warn!(shard, error = %err, "cannot read the shard's checkpoint yet; retrying");
                self.publish_active();
                return;
            }
        };
        if let Some(why) = checkpoint.rejected() {
            self.metrics.errors.with_label_values(&["checkpoint_rejected"]).inc();
            debug!(shard, why, "the checkpoint was used in part or not at all");
        }
        let first_start = !loaded.as_ref().is_some_and(checkpoint::Loaded::is_whole);
        let work = self.initial_work(shard, loaded);
        // The store read above is whole only if the shard is still held after it: while the
        // checkpoint loaded, the shard may have gone (this replica leaving), and the watch room
        // drops its objects right after saying so. Compared with a half-emptied store the
        // checkpoint would see deletions that never happened, and a first start would save
        // them as its baseline.
        if !self.holds(shard) {
            self.acted.forget(shard);
            self.publish_active();
            info!(shard, "shard lost while being taken up; left to its next owner");
            return;
        }
        self.shards.checkpoints.insert(shard, checkpoint);
        self.publish_active();
        info!(shard, changes = work.len(), "shard taken up; reconciling it against its checkpoint");
        self.shards.dirty.insert(shard);
        if first_start {
            // Saved before acting: should this replica die before its next save, the next
            // owner finds the baselines, not a first start that would take the store's state
            // (changes included) as baseline. A failed save is retried with the others. (Once
            // in a shard's life, so the engine waits for it here.)
            self.save_now(shard).await;
        }
        // Decided in the pipeline with the other changes: a take-up holds none of them up.
        for (change, forced) in work {
            self.enqueue(change, forced);
        }
        self.sweep_orphans(shard);
    }

    /// Wait for every checkpoint read in flight and finish those take-ups (at start, where
    /// readiness waits for the first reconcile).
    pub(super) async fn finish_loading(&mut self) {
        while let Some(loaded) = futures::StreamExt::next(&mut self.shards.loads).await {
            self.take_up(loaded).await;
        }
    }

    /// Start saving the dirty checkpoints in the background: no change waits for a save.
    /// Copies are written; [`Engine::saved`] keeps their new versions. Only one save is in
    /// flight at once, and letting go of a shard waits for it (hurried: it then stops after
    /// the checkpoint it is writing). One checkpoint at a time: 16 written at once (120 KB
    /// each at 10,000 namespaces) held the API server's events 0.2 s.
    pub(super) fn start_save(&mut self) {
        let shards = std::mem::take(&mut self.shards.dirty)
            .into_iter()
            .filter(|s| self.shards.checkpoints.contains_key(s))
            .collect();
        self.spawn_save(shards, false);
    }

    /// Save the checkpoints of `shards` in the background: one at a time, or, to let them go,
    /// [`CHECKPOINT_SAVES`] at once (the next owners wait for them) and never hurried.
    fn spawn_save(&mut self, shards: BTreeSet<u32>, let_go: bool) {
        self.shards.dirty.retain(|s| !shards.contains(s));
        let checkpoints: Vec<(u32, Checkpoint)> =
            shards.iter().filter_map(|&s| Some((s, self.shards.checkpoints.get(&s)?.clone()))).collect();
        // The engine only copies its maps; the store is read in the background.
        let acted = Arc::new(self.acted.copies(&shards));
        let (store, ring) = (self.store.clone(), self.config.ring.clone());
        let hurry = CancellationToken::new();
        let stop = hurry.clone();
        let at_once = if let_go { CHECKPOINT_SAVES } else { 1 };
        let task = tokio::spawn(async move {
            let mut results = Vec::with_capacity(checkpoints.len());
            let mut pending = checkpoints.into_iter();
            loop {
                let batch: Vec<(u32, Checkpoint)> = pending.by_ref().take(at_once).collect();
                if batch.is_empty() || stop.is_cancelled() {
                    break;
                }
                let saves = batch.into_iter().map(|(shard, mut checkpoint)| {
                    let (acted, store, ring) = (acted.clone(), store.clone(), ring.clone());
                    async move {
                        let entries = acted.get(&shard).map(|map| acted::entries(map, shard, &store, &ring));
                        let result = checkpoint.save(&entries.unwrap_or_default()).await;
                        (shard, checkpoint, result)
                    }
                });
                results.extend(futures::future::join_all(saves).await);
            }
            results
        });
        self.shards.saving = Some(Saving { task, shards, hurry, let_go });
    }

    /// Take in a finished background save; false if any checkpoint was not saved (it is dirty
    /// again, for the next save). Shards let go are dropped once saved, or after a second
    /// failed save (the next owner then replays their recent changes: harmless), and a shard
    /// wanted again meanwhile is taken up anew.
    pub(super) fn saved(&mut self, saving: Saving, done: Result<SaveResults, tokio::task::JoinError>) -> bool {
        let Saving { shards, let_go, .. } = saving;
        let results = done.unwrap_or_else(|err| {
            warn!(error = %err, "the checkpoint save ended early; nothing of it is known saved");
            Vec::new()
        });
        let mut ok = results.len() == shards.len();
        let mut saved = BTreeSet::new();
        let attempted: BTreeSet<u32> = results.iter().map(|(shard, _, _)| *shard).collect();
        self.shards.dirty.extend(shards.difference(&attempted).filter(|s| self.shards.checkpoints.contains_key(s)));
        for (shard, checkpoint, result) in results {
            // Kept either way: a failed save leaves what it learnt (the versions of the parts
            // it wrote), and nothing it did not finish counts as written.
            if let Some(kept) = self.shards.checkpoints.get_mut(&shard) {
                *kept = checkpoint;
            }
            match result {
                Ok(report) => {
                    self.metrics.checkpoints.saved(shard, report.bytes, report.stored);
                    saved.insert(shard);
                }
                Err(err) => {
                    ok = false;
                    self.shards.dirty.insert(shard);
                    self.note_failed_save(shard, &err);
                }
            }
        }
        if let_go {
            for shard in shards {
                let Some(failures) = self.shards.letting_go.get_mut(&shard) else { continue };
                if !saved.contains(&shard) && *failures == 0 {
                    *failures = 1;
                    continue;
                }
                if !saved.contains(&shard) {
                    self.report_unsaved_let_go(shard);
                }
                self.drop_shard(shard);
            }
            let wanted = self.shards.wanted();
            if !self.follows(&wanted) {
                self.follow(&wanted);
            }
        }
        self.advance_let_go();
        self.publish_active();
        ok
    }

    /// Let go of every shard being let go: land their writes, save their checkpoints (at
    /// shutdown, where nothing else is left to do).
    pub(super) async fn finish_letting_go(&mut self) {
        loop {
            self.advance_let_go();
            if self.shards.letting_go.is_empty() {
                return;
            }
            tokio::select! {
                Some(landed) = self.pipeline.next_landed(), if self.pipeline.is_running() => self.land(landed),
                Some((saving, done)) = saving_done(&mut self.shards.saving) => {
                    self.saved(saving, done);
                }
            }
        }
    }

    /// Save the checkpoint of `shard` now (a failed save stays dirty, for the next save).
    async fn save_now(&mut self, shard: u32) {
        let acted = self.acted.copies(&BTreeSet::from([shard]));
        let (Some(map), Some(checkpoint)) = (acted.get(&shard), self.shards.checkpoints.get_mut(&shard)) else {
            return;
        };
        match checkpoint.save(&acted::entries(map, shard, &self.store, &self.config.ring)).await {
            Ok(report) => {
                self.shards.dirty.remove(&shard);
                self.metrics.checkpoints.saved(shard, report.bytes, report.stored);
            }
            Err(err) => self.note_failed_save(shard, &err),
        }
    }

    /// Count and log a failed save, with every cause (the API server's status and message).
    fn note_failed_save(&mut self, shard: u32, err: &checkpoint::Error) {
        let text = crate::reload::api::causes(err);
        self.metrics.errors.with_label_values(&["checkpoint"]).inc();
        self.metrics.checkpoints.failed(shard, text.clone());
        warn!(shard, error = %text, "saving the checkpoint failed; retrying with backoff");
    }

    /// A shard let go although its checkpoint could not be saved: the next owner replays
    /// from the last save that held (harmless) or, with none, starts from a baseline and
    /// misses changes made since. The replica's own pod gets a Warning Event: it is for the
    /// people who run the controller.
    fn report_unsaved_let_go(&mut self, shard: u32) {
        let status = self.metrics.checkpoints.status.shards().remove(&shard).unwrap_or_default();
        let error = status.error.unwrap_or_default();
        error!(shard, %error, last_saved = status.last_saved.as_deref().unwrap_or("never"),
            "letting go of a shard whose checkpoint could not be saved; changes made while it moves may be missed");
        if let Some(pod) = &self.config.pod {
            let note = format!(
                "Shard {shard} was let go with its checkpoint unsaved (last saved {}): {error}",
                status.last_saved.as_deref().unwrap_or("never")
            );
            self.events.post(pod.clone(), EventType::Warning, "CheckpointNotSaved", "LetGo", note);
        }
    }
}

/// Whether a checkpoint naming `named` of the `resources` a shard holds cannot be the record
/// of that shard: one saved at the last stop names all but those created since, and a few
/// resources made while stopped never outnumber a shard's others by this much.
fn is_implausible(named: usize, resources: usize) -> bool {
    resources >= 4 && named * 2 < resources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_saves_back_off_with_jitter_up_to_a_cap_and_a_save_that_holds_starts_over() {
        let mut retry = SaveRetry::default();
        assert_eq!(retry.after(true), None);
        let delays: Vec<Duration> = (0..12).filter_map(|_| retry.after(false)).collect();
        assert!(delays[0] >= SAVE_RETRY_MIN && delays[0] <= SAVE_RETRY_MIN * 2, "{delays:?}");
        assert!(delays[3] >= SAVE_RETRY_MIN * 8, "doubling: {delays:?}");
        // The cap, plus the jitter backon adds on top of it (at most as much again).
        assert!(delays.iter().all(|d| *d <= SAVE_RETRY_MAX * 2), "{delays:?}");
        assert!(delays[11] >= SAVE_RETRY_MAX, "{delays:?}");
        let mut other = SaveRetry::default();
        let others: Vec<Duration> = (0..6).filter_map(|_| other.after(false)).collect();
        assert_ne!(delays[..6], others[..], "jittered: two replicas do not retry in step");
        assert_eq!(retry.after(true), None);
        let again = retry.after(false).expect("a delay");
        assert!(again <= SAVE_RETRY_MIN * 2, "a save that held starts over: {again:?}");
    }
}
