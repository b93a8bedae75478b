//! Changes flow through a pipeline: each is decided as soon as nothing before it may touch
//! what it touches, its writes go out at once (at most `--max-concurrent-writes` in flight
//! over all changes), and it is finished (checkpoint, retry) when its own writes land. A slow
//! write delays only the changes that wait for its workload, not every change behind it.
//!
//! ```text
//!  queue ─▶ next change clear of every claim ─▶ decide ─▶ its writes in flight ─▶ land: finish
//!    │         (writes in flight, changes waiting before it)                       │
//!    └── a change that may write a claimed workload waits ◀── claims released ─────┘
//! ```
//! A change is decided only after every earlier change that may write one of its workloads
//! (or is of the same resource) has landed, so it is decided from the state the earlier write
//! left (the overlay) and one workload's writes stay in order. A replay stays harmless as
//! before: a write records its hash, and a hash already recorded plans no write. Deferred
//! writes (coalesced or held to the budget) and resumes fly the same way and claim their
//! workload too, so none of them holds up the engine's loop.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::queue::Queued;
use super::{Engine, Outcome, Transition};
use crate::reload::alert;
use crate::reload::checkpoint::{ShortHash, short};
use crate::reload::write::{WriteError, WriteOutcome, Writes};
use crate::watch::{Change, DataHash, ResourceKey, Workload, WorkloadKey};

/// Changes taken from the watches' channel ahead of the engine, at most (the channel's own
/// bound then holds the watches back).
pub(super) const MAX_QUEUED: usize = 1024;
/// Queued changes looked at for one that may go now.
const WINDOW: usize = 256;
/// Changes with writes in flight, at most.
const MAX_IN_FLIGHT: usize = 256;

/// A reload write decided for a change.
pub(super) struct PlannedWrite {
    pub workload: Arc<Workload>,
    pub patch: serde_json::Value,
    /// The resources it records, with their hashes.
    pub sources: Vec<(ResourceKey, DataHash)>,
}

/// What deciding a change left to do.
pub(super) enum Prepared {
    /// Nothing to write now: the outcome.
    Finished(Outcome),
    /// These writes, then [`Engine::finish`].
    Writes { writes: Vec<PlannedWrite>, transition: Transition, hash: DataHash, current: Option<DataHash> },
    /// Webhook-only mode: POST this body (about `workloads` workloads); once the receiver took
    /// it, the change is handled.
    Post { body: Vec<u8>, workloads: usize, transition: Transition, hash: DataHash, current: Option<DataHash> },
}

/// A change waiting to be decided, with the transition to force (a shard's take-up).
/// A change whose writes are in flight.
pub(super) struct Flight {
    key: ResourceKey,
    shard: u32,
    acted_before: Option<ShortHash>,
    started: Instant,
    span: tracing::Span,
    transition: Transition,
    hash: DataHash,
    current: Option<DataHash>,
}

/// What writes in flight are for.
pub(super) enum Purpose {
    /// A change, finished by [`Engine::finish`] when they land.
    Change(Flight),
    /// A deferred write of one workload, recording these resources.
    Deferred(BTreeSet<ResourceKey>),
    /// The end of a Deployment's pause period.
    Resume,
    /// A change POSTed to the webhook (webhook-only mode), about this many workloads.
    Post(Flight, usize),
}

/// Writes that are back: each write's result and time, in the order of `writes`.
pub(super) struct Landed {
    purpose: Purpose,
    writes: Vec<PlannedWrite>,
    results: Vec<(crate::reload::write::WriteOutcome, Duration)>,
}

/// The writes in flight and what they claim.
pub(super) struct Pipeline {
    running: FuturesUnordered<BoxFuture<'static, Landed>>,
    /// Workloads with a write in flight (how many): a change that may write one waits, and so
    /// does a deferred write or a resume of one.
    workloads: HashMap<WorkloadKey, usize>,
    /// Resources with a change in flight.
    resources: HashSet<ResourceKey>,
    /// `--max-concurrent-writes`, over all changes.
    permits: Arc<Semaphore>,
    max_writes: usize,
    /// Writes out (sent, or waiting for a permit) per namespace, for its share of the permits.
    by_namespace: HashMap<Arc<str>, usize>,
    /// Nothing in the queue's window may go before a change lands or a change arrives.
    stalled: bool,
}

impl Pipeline {
    pub fn new(max_writes: usize) -> Self {
        Self {
            running: FuturesUnordered::new(),
            workloads: HashMap::new(),
            resources: HashSet::new(),
            permits: Arc::new(Semaphore::new(max_writes.max(1))),
            max_writes: max_writes.max(1),
            by_namespace: HashMap::new(),
            stalled: false,
        }
    }

    pub fn is_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// The next change to land (pending while none is in flight).
    pub async fn next_landed(&mut self) -> Option<Landed> {
        self.running.next().await
    }

    /// Whether a pump may decide something now.
    pub fn may_pump(&self, queue_len: usize) -> bool {
        queue_len > 0 && !self.stalled
    }

    /// A change was queued about `position` pops from the head: it may go if the window
    /// reaches it.
    pub fn queued_at(&mut self, position: usize) {
        if position < WINDOW {
            self.stalled = false;
        }
    }

    pub fn claims(&self, workload: &WorkloadKey) -> bool {
        self.workloads.contains_key(workload)
    }

    /// Whether a change of `namespace` may send its writes while `active` namespaces have
    /// writes out or changes queued: only below its share of `--max-concurrent-writes`. So a
    /// namespace sending thousands of changes a minute never lines up more writes than its
    /// share in front of the permits, where another namespace's write would wait behind all
    /// of them; alone, a namespace has every permit, and a change with many writes (a fan-out)
    /// goes whole once its namespace is below its share.
    pub fn may_send(&self, namespace: &str, active: usize) -> bool {
        let share = (self.max_writes / active.max(1)).max(1);
        self.by_namespace.get(namespace).copied().unwrap_or(0) < share
    }

    fn sent(&mut self, workload: &WorkloadKey) {
        *self.workloads.entry(workload.clone()).or_default() += 1;
        *self.by_namespace.entry(workload.namespace.clone()).or_default() += 1;
    }

    /// A write of `workload` landed; whether it was the workload's last one out.
    fn landed(&mut self, workload: &WorkloadKey) -> bool {
        if let Some(n) = self.by_namespace.get_mut(&workload.namespace) {
            *n -= 1;
            if *n == 0 {
                self.by_namespace.remove(&workload.namespace);
            }
        }
        let Some(n) = self.workloads.get_mut(workload) else { return false };
        *n -= 1;
        let last = *n == 0;
        if last {
            self.workloads.remove(workload);
        }
        last
    }
}

impl Engine {
    /// Queue a change behind the others of its namespace (or into a queued update of the same
    /// resource).
    pub(super) fn enqueue(&mut self, change: Change, forced: Option<Transition>) {
        let namespace = change.key.namespace.clone();
        if let Queued::Merged { same } = self.queue.push(change, forced, Instant::now()) {
            // Handled as decided: a report of a change queued already, or one a newer overtook.
            let reason = if same { "no_data_change" } else { "superseded" };
            self.metrics.skipped.with_label_values(&[reason]).inc();
            self.metrics.reconcile.observe("skipped", 0.0);
            return;
        }
        let depth = self.queue.depth(&namespace);
        // Namespaces take turns: it is about depth x namespaces pops from the head.
        self.pipeline.queued_at(depth.saturating_sub(1).saturating_mul(self.queue.namespaces()));
        self.metrics.queue.depth(&namespace, depth);
    }

    /// Queue what the channel holds now (up to [`MAX_QUEUED`]).
    pub(super) fn take_queued(&mut self, changes: &mut mpsc::Receiver<Change>) {
        while self.queue.len() < MAX_QUEUED {
            match changes.try_recv() {
                Ok(change) => self.enqueue(change, None),
                Err(_) => break,
            }
        }
    }

    /// Decide, in queue order, every change of the window that nothing before it claims;
    /// send their writes. The others keep their places.
    pub(super) fn pump(&mut self) {
        let mut waiting_workloads: HashSet<WorkloadKey> = HashSet::new();
        let mut waiting_resources: HashSet<ResourceKey> = HashSet::new();
        let mut held = Vec::new();
        let mut looked = 0;
        // Namespaces with changes queued or writes out: they share the write permits.
        let active =
            self.queue.namespaces() + self.pipeline.by_namespace.keys().filter(|ns| self.queue.depth(ns) == 0).count();
        let full = loop {
            if looked == WINDOW {
                break false;
            }
            if self.pipeline.running.len() >= MAX_IN_FLIGHT {
                break true;
            }
            let Some(entry) = self.queue.pop() else { break false };
            looked += 1;
            let change = &entry.change;
            let candidates: Vec<WorkloadKey> =
                self.store.candidates(&change.key).iter().map(|w| w.key.clone()).collect();
            let blocked = self.pipeline.resources.contains(&change.key)
                || waiting_resources.contains(&change.key)
                || candidates.iter().any(|k| self.pipeline.claims(k) || waiting_workloads.contains(k))
                || !self.pipeline.may_send(&change.key.namespace, active);
            if blocked {
                waiting_resources.insert(change.key.clone());
                waiting_workloads.extend(candidates);
                held.push(entry);
                continue;
            }
            let namespace = change.key.namespace.clone();
            self.metrics.queue.waited(&namespace, entry.since.elapsed(), self.queue.depth(&namespace));
            self.dispatch(entry.change, entry.forced);
        };
        // Stalled until a change lands (or arrives) only if nothing the next pump would look
        // at may go: the writes in flight are at their bound, or every change looked at waits.
        let unlooked = !self.queue.is_empty();
        let all_wait = !held.is_empty() && (held.len() == WINDOW || !unlooked);
        self.queue.put_back(held);
        self.pipeline.stalled = !self.queue.is_empty() && (full || all_wait);
    }

    /// Decide one change (of an active shard; others are covered when their shard is taken
    /// up) and send its writes, or finish it if there are none.
    fn dispatch(&mut self, change: Change, forced: Option<Transition>) {
        let shard = self.shard_of(&change.key);
        if !self.acts_on(shard) {
            return;
        }
        let key = change.key.clone();
        let span = info_span!("change", kind = key.kind.kind(), namespace = %key.namespace, name = %key.name);
        let acted_before = self.acted.get(&key);
        let started = Instant::now();
        let (writes, transition, hash, current) = match span.in_scope(|| self.prepare(&change, forced)) {
            Prepared::Finished(outcome) => return self.count(&key, shard, acted_before, started, outcome),
            Prepared::Writes { writes, transition, hash, current } => (writes, transition, hash, current),
            Prepared::Post { body, workloads, transition, hash, current } => {
                let flight = Flight { key, shard, acted_before, started, span, transition, hash, current };
                return self.post(flight, body, workloads);
            }
        };
        span.in_scope(|| debug!(resource = %key, hash = %hash, writes = writes.len(), "change decided"));
        let flight = Flight { key, shard, acted_before, started, span, transition, hash, current };
        if writes.is_empty() {
            return self.land(Landed { purpose: Purpose::Change(flight), writes, results: Vec::new() });
        }
        self.pipeline.resources.insert(flight.key.clone());
        let span = flight.span.clone();
        self.fly(Purpose::Change(flight), writes, span);
    }

    /// Send writes: they claim their workloads until they land, and each takes a permit of
    /// `--max-concurrent-writes` while it is out.
    pub(super) fn fly(&mut self, purpose: Purpose, writes: Vec<PlannedWrite>, span: tracing::Span) {
        for write in &writes {
            self.pipeline.sent(&write.workload.key);
        }
        let (client, permits) = (self.writes.clone(), self.pipeline.permits.clone());
        self.pipeline.running.push(Box::pin(async move {
            let results = send_all(&client, &writes, &span, &permits).await;
            Landed { purpose, writes, results }
        }));
    }

    /// Send a change to the webhook beside the writes (within `--max-concurrent-writes`): a
    /// receiver that hangs holds up only later changes of the same resource, never the loop.
    fn post(&mut self, flight: Flight, body: Vec<u8>, workloads: usize) {
        let Some(webhook) = self.config.webhook.clone() else { return };
        self.pipeline.resources.insert(flight.key.clone());
        let permits = self.pipeline.permits.clone();
        let span = flight.span.clone();
        self.pipeline.running.push(Box::pin(
            async move {
                let _permit = permits.acquire().await.ok();
                let started = Instant::now();
                let sent =
                    alert::post(&webhook.client, &webhook.url, "application/json", body, |s| s.is_success()).await;
                let result = sent.map(|()| None).map_err(WriteError::from);
                Landed {
                    purpose: Purpose::Post(flight, workloads),
                    writes: Vec::new(),
                    results: vec![(result, started.elapsed())],
                }
            }
            .instrument(span),
        ));
    }

    /// Finish writes that are back: release their claims and account for each (a change's
    /// outcome, a deferred write's resources, a resume).
    pub(super) fn land(&mut self, landed: Landed) {
        let Landed { purpose, writes, results } = landed;
        self.pipeline.stalled = false;
        for write in &writes {
            if self.pipeline.landed(&write.workload.key) {
                self.deferred.unpark(&write.workload.key);
            }
        }
        let mut results =
            results.into_iter().chain(std::iter::repeat_with(|| (Err(WriteError::NotSent), Duration::ZERO)));
        let flight = match purpose {
            Purpose::Change(flight) => flight,
            // One write: the workload's.
            Purpose::Deferred(items) => {
                if let (Some(write), Some((result, took))) = (writes.first(), results.next()) {
                    let done = self.written(&write.workload, &write.sources, result, took);
                    self.deferred_landed(&write.workload.key, items, done);
                }
                return;
            }
            Purpose::Resume => {
                for (write, (result, _)) in writes.iter().zip(&mut results) {
                    self.resumed(&write.workload.key, result);
                }
                return;
            }
            Purpose::Post(flight, workloads) => {
                self.pipeline.resources.remove(&flight.key);
                let outcome = flight.span.in_scope(|| self.posted(&flight, workloads, results.next()));
                return self.count(&flight.key, flight.shard, flight.acted_before, flight.started, outcome);
            }
        };
        self.pipeline.resources.remove(&flight.key);
        let outcome = {
            let _entered = flight.span.enter();
            let mut done = Vec::with_capacity(writes.len());
            for (write, (result, took)) in writes.iter().zip(&mut results) {
                done.push(self.written(&write.workload, &write.sources, result, took));
            }
            self.finish(&flight.key, flight.transition, flight.hash, flight.current, &done)
        };
        self.count(&flight.key, flight.shard, flight.acted_before, flight.started, outcome);
    }

    /// A change's POST to the webhook is back.
    fn posted(&mut self, flight: &Flight, workloads: usize, sent: Option<(WriteOutcome, Duration)>) -> Outcome {
        match sent {
            Some((Ok(_), _)) => {
                self.metrics.action.with_label_values(&["webhook", "success"]).inc();
                info!(workloads, "change sent to the webhook");
                self.record_acted(&flight.key, flight.current.as_ref().map(short));
                Outcome::Done
            }
            failed => {
                self.metrics.action.with_label_values(&["webhook", "error"]).inc();
                self.metrics.errors.with_label_values(&["webhook_send"]).inc();
                let error = failed.and_then(|(r, _)| r.err()).unwrap_or(WriteError::NotSent);
                warn!(error = %error, "sending the change to the webhook failed; will retry");
                Outcome::Failed
            }
        }
    }

    /// Whether writes are in flight in a shard that `of` picks.
    pub(super) fn in_flight_in(&self, of: impl Fn(u32) -> bool) -> bool {
        self.pipeline.resources.iter().any(|key| of(self.shard_of(key)))
            || self.pipeline.workloads.keys().any(|w| of(self.config.ring.shard_of(&w.namespace)))
    }

    /// Decide and write everything queued, and wait for it to land.
    pub(super) async fn settle(&mut self) {
        loop {
            self.pump();
            match self.pipeline.next_landed().await {
                Some(landed) => self.land(landed),
                None if self.queue.is_empty() => break,
                // Nothing in flight claims the head of the queue: the next pump decides it.
                None => {}
            }
        }
    }

    /// Metrics, retry and checkpoint bookkeeping of a change's outcome.
    fn count(
        &mut self,
        key: &ResourceKey,
        shard: u32,
        acted_before: Option<ShortHash>,
        started: Instant,
        outcome: Outcome,
    ) {
        let result = match outcome {
            Outcome::Skipped => "skipped",
            Outcome::Done => "success",
            Outcome::Failed => "error",
        };
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.reconcile.observe(result, elapsed);
        match outcome {
            Outcome::Failed => {
                self.retries.failed(key.clone());
            }
            Outcome::Done => {
                self.metrics.queue.latency.observe(elapsed);
                self.retries.clear(key);
            }
            Outcome::Skipped => self.retries.clear(key),
        }
        if self.acted.get(key) != acted_before {
            self.shards.dirty.insert(shard);
        }
    }
}

/// Send one change's writes: different workloads at once, one workload's writes one after
/// the other; each takes a permit of `permits` while it is out. Results come back in the
/// order of `planned`, each with its time.
async fn send_all(
    writes: &Writes,
    planned: &[PlannedWrite],
    span: &tracing::Span,
    permits: &Semaphore,
) -> Vec<(crate::reload::write::WriteOutcome, Duration)> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: HashMap<&WorkloadKey, usize> = HashMap::new();
    for (i, write) in planned.iter().enumerate() {
        let chain = *chain_of.entry(&write.workload.key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(i);
    }
    let sent = futures::future::join_all(chains.into_iter().map(|chain| async move {
        let mut out = Vec::with_capacity(chain.len());
        for i in chain {
            let write = &planned[i];
            // Never closed: the engine owns the semaphore.
            let _permit = permits.acquire().await.ok();
            let started = Instant::now();
            let result =
                writes.write(&write.workload, &write.patch, jiff::Timestamp::now()).instrument(span.clone()).await;
            out.push((i, result, started.elapsed()));
        }
        out
    }))
    .await;
    let mut flat: Vec<(usize, crate::reload::write::WriteOutcome, Duration)> = sent.into_iter().flatten().collect();
    flat.sort_by_key(|(i, _, _)| *i);
    flat.into_iter().map(|(_, result, took)| (result, took)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::WorkloadKind;

    fn web(namespace: &str, i: usize) -> WorkloadKey {
        WorkloadKey { kind: WorkloadKind::Deployment, namespace: namespace.into(), name: format!("web-{i}").into() }
    }

    #[test]
    fn a_namespace_sends_only_below_its_share_of_the_write_permits_and_alone_it_has_them_all() {
        let mut pipeline = Pipeline::new(8);
        for i in 0..8 {
            assert!(pipeline.may_send("noisy", 1), "alone: every permit ({i} out)");
            pipeline.sent(&web("noisy", i));
        }
        assert!(!pipeline.may_send("noisy", 1), "alone, not more than the permits");
        assert!(!pipeline.may_send("noisy", 2), "beside another namespace, its half");
        assert!(pipeline.may_send("quiet", 2), "the other namespace goes at once");
        for i in 0..4 {
            assert!(pipeline.landed(&web("noisy", i)), "its only write out");
        }
        assert!(!pipeline.may_send("noisy", 2), "4 out: at its share");
        pipeline.landed(&web("noisy", 4));
        assert!(pipeline.may_send("noisy", 2), "below its share again");
        assert!(pipeline.may_send("another", 100), "however many namespaces, one write each");
        pipeline.sent(&web("quiet", 0));
        pipeline.sent(&web("quiet", 0));
        assert!(!pipeline.landed(&web("quiet", 0)), "a second write of the workload is still out");
        assert!(pipeline.landed(&web("quiet", 0)));
        assert!(!pipeline.by_namespace.contains_key("quiet"), "a namespace with nothing out is forgotten");
    }
}
