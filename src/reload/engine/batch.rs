//! Changes handled as a batch: each change is decided on its own, in arrival order, then the
//! writes of all of them go out together, at most `--max-concurrent-writes` at once, and each
//! change is finished (checkpoint, retry) once its own writes are back.
//!
//! ```text
//!  queue ─▶ longest prefix touching disjoint workloads ─▶ decide each (in order)
//!        ─▶ writes of all, N in flight, one workload's writes in order ─▶ finish each
//! ```
//! A batch never holds two changes that may write one workload (or two changes of one
//! resource): the later one waits for the next batch, so it is decided from the state the
//! earlier write left (the overlay), and one workload's writes stay in order. A replay stays
//! harmless as before: a write records its hash, and a hash already recorded plans no write.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span};

use super::{Engine, Outcome, Transition};
use crate::reload::write::Writes;
use crate::watch::{Change, DataHash, ResourceKey, Workload, WorkloadKey};

/// Changes decided together at most: enough to fill the writes in flight many times over.
pub(super) const MAX_BATCH: usize = 256;

/// A reload write decided for a change, sent with the others of its batch.
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
}

/// A change of the batch while its writes are out.
struct InBatch {
    key: ResourceKey,
    shard: u32,
    acted_before: Option<crate::reload::checkpoint::ShortHash>,
    started: Instant,
    span: tracing::Span,
    prepared: Prepared,
}

impl Engine {
    /// Take from `queue` the longest prefix of changes that touch disjoint workloads and
    /// resources (at least one change, at most [`MAX_BATCH`]).
    pub(super) fn next_batch(&self, queue: &mut VecDeque<Change>) -> Vec<Change> {
        let mut batch = Vec::new();
        let mut workloads: HashSet<WorkloadKey> = HashSet::new();
        let mut resources: HashSet<ResourceKey> = HashSet::new();
        while batch.len() < MAX_BATCH {
            let Some(change) = queue.front() else { break };
            let candidates: Vec<WorkloadKey> =
                self.store.candidates(&change.key).iter().map(|w| w.key.clone()).collect();
            let overlaps = resources.contains(&change.key) || candidates.iter().any(|k| workloads.contains(k));
            if overlaps && !batch.is_empty() {
                break;
            }
            resources.insert(change.key.clone());
            workloads.extend(candidates);
            if let Some(change) = queue.pop_front() {
                batch.push(change);
            }
        }
        batch
    }

    /// Queue what the channel holds now (up to a batch), then handle the next batch.
    pub(super) async fn handle_queued(&mut self, changes: &mut mpsc::Receiver<Change>) {
        while self.queue.len() < MAX_BATCH {
            match changes.try_recv() {
                Ok(change) => self.queue.push_back(change),
                Err(_) => break,
            }
        }
        let mut queue = std::mem::take(&mut self.queue);
        let batch = self.next_batch(&mut queue);
        self.queue = queue;
        self.handle_batch(batch.into_iter().map(|change| (change, None)).collect()).await;
    }

    /// Decide every change of `batch` (in order), send all their writes, finish each.
    pub(super) async fn handle_batch(&mut self, batch: Vec<(Change, Option<Transition>)>) {
        let mut changes = Vec::with_capacity(batch.len());
        for (change, forced) in batch {
            let shard = self.shard_of(&change.key);
            if !self.checkpoints.contains_key(&shard) {
                continue;
            }
            let key = change.key.clone();
            let span = info_span!("change", kind = key.kind.kind(), namespace = %key.namespace, name = %key.name);
            let acted_before = self.acted.get(&key).copied();
            let started = Instant::now();
            let prepared = self.prepare(&change, forced).instrument(span.clone()).await;
            if let Prepared::Writes { writes, hash, .. } = &prepared {
                span.in_scope(|| debug!(resource = %change.key, hash = %hash, writes = writes.len(), "change decided"));
            }
            changes.push(InBatch { key, shard, acted_before, started, span, prepared });
        }
        let planned: Vec<(&PlannedWrite, &tracing::Span)> = changes
            .iter()
            .flat_map(|c| match &c.prepared {
                Prepared::Writes { writes, .. } => writes.iter().map(|w| (w, &c.span)).collect(),
                Prepared::Finished(_) => Vec::new(),
            })
            .collect();
        let mut results = send_all(&self.writes, &planned, self.config.max_concurrent_writes).await.into_iter();
        for change in changes {
            let outcome = match change.prepared {
                Prepared::Finished(outcome) => outcome,
                Prepared::Writes { writes, transition, hash, current } => {
                    let _entered = change.span.enter();
                    let mut done = Vec::with_capacity(writes.len());
                    for write in &writes {
                        let (result, took) = results.next().unwrap_or((Err("not sent".to_string()), Duration::ZERO));
                        done.push(self.written(&write.workload, &write.sources, result, took));
                    }
                    self.finish(&change.key, transition, hash, current, &done)
                }
            };
            self.count(&change.key, change.shard, change.acted_before, change.started, outcome);
        }
    }

    /// Metrics, retry and checkpoint bookkeeping of a change's outcome.
    fn count(
        &mut self,
        key: &ResourceKey,
        shard: u32,
        acted_before: Option<crate::reload::checkpoint::ShortHash>,
        started: Instant,
        outcome: Outcome,
    ) {
        let result = match outcome {
            Outcome::Skipped => "skipped",
            Outcome::Done => "success",
            Outcome::Failed => "error",
        };
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.reconcile.with_label_values(&[result]).inc();
        self.metrics.reconcile_duration.with_label_values(&[result]).observe(elapsed);
        match outcome {
            Outcome::Failed => self.schedule_retry(key.clone()),
            Outcome::Done => {
                self.metrics.change_latency.observe(elapsed);
                self.clear_retry(key);
            }
            Outcome::Skipped => self.clear_retry(key),
        }
        if self.acted.get(key).copied() != acted_before {
            self.dirty.insert(shard);
        }
    }
}

/// Send `planned` writes, at most `limit` at once; the writes of one workload one after the
/// other, in their order. Results come back in the order of `planned`, each with its time.
async fn send_all(
    writes: &Writes,
    planned: &[(&PlannedWrite, &tracing::Span)],
    limit: usize,
) -> Vec<(crate::reload::write::WriteResult, Duration)> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: HashMap<&WorkloadKey, usize> = HashMap::new();
    for (i, (write, _)) in planned.iter().enumerate() {
        let chain = *chain_of.entry(&write.workload.key).or_insert_with(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[chain].push(i);
    }
    let sent = futures::stream::iter(chains)
        .map(|chain| async move {
            let mut out = Vec::with_capacity(chain.len());
            for i in chain {
                let (write, span) = planned[i];
                let started = Instant::now();
                let result =
                    writes.write(&write.workload, &write.patch, jiff::Timestamp::now()).instrument(span.clone()).await;
                out.push((i, result, started.elapsed()));
            }
            out
        })
        .buffer_unordered(limit.max(1))
        .collect::<Vec<_>>()
        .await;
    let mut flat: Vec<(usize, crate::reload::write::WriteResult, Duration)> = sent.into_iter().flatten().collect();
    flat.sort_by_key(|(i, _, _)| *i);
    flat.into_iter().map(|(_, result, took)| (result, took)).collect()
}
