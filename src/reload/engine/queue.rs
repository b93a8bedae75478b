//! The engine's queue of changes, fair across namespaces.
//!
//! ```text
//!  push ─▶ its namespace's queue (FIFO)       an update of a resource already queued merges
//!                                              into that entry: the newest data, one decision
//!  pop  ─▶ the next namespace in turn (round robin), the head of its queue
//! ```
//! A namespace sending ten thousand changes a minute gets one turn in N, not the queue: the
//! changes of every other namespace are decided as they come (the API server's priority and
//! fairness does the same with its queues). Order within a namespace is kept, so one
//! resource's changes and one workload's writes stay in order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

use super::Transition;
use crate::watch::{Change, ResourceKey};

/// A queued change: the change, the transition a take-up forces, and when it was queued.
pub(super) struct Entry {
    pub change: Change,
    pub forced: Option<Transition>,
    pub since: Instant,
}

/// What became of a change pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queued {
    New,
    /// Merged into the queued update of the same resource; `same`: with the same data (a
    /// report of a change already queued).
    Merged {
        same: bool,
    },
}

#[derive(Default)]
pub(super) struct FairQueue {
    namespaces: HashMap<Arc<str>, VecDeque<Entry>>,
    /// Namespaces with queued changes, in turn order.
    turns: VecDeque<Arc<str>>,
    /// Resources with a plain update queued (which a later update of them merges into).
    updates: HashSet<ResourceKey>,
    len: usize,
}

impl FairQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Namespaces with changes queued.
    pub fn namespaces(&self) -> usize {
        self.turns.len()
    }

    /// Changes queued for `namespace`.
    pub fn depth(&self, namespace: &str) -> usize {
        self.namespaces.get(namespace).map_or(0, VecDeque::len)
    }

    /// Queue `change` behind its namespace's others. An update of a resource whose update is
    /// queued merges into that entry instead: the decision is made once, on the newest data,
    /// as each would have been made on the newest.
    pub fn push(&mut self, change: Change, forced: Option<Transition>, now: Instant) -> Queued {
        let plain = is_plain(&change, forced);
        if plain && self.updates.contains(&change.key) {
            // Into the resource's last entry, if that is a plain update too.
            let last = self
                .namespaces
                .get_mut(&change.key.namespace)
                .and_then(|q| q.iter_mut().rev().find(|e| e.change.key == change.key))
                .filter(|e| is_plain(&e.change, e.forced));
            if let Some(entry) = last {
                let same = entry.change.observed == change.observed;
                // The baseline stays the first change's; the data is the last one's.
                entry.change.observed = change.observed;
                return Queued::Merged { same };
            }
        }
        if plain {
            self.updates.insert(change.key.clone());
        }
        self.push_back(Entry { change, forced, since: now });
        Queued::New
    }

    fn push_back(&mut self, entry: Entry) {
        let namespace = entry.change.key.namespace.clone();
        let queue = self.namespaces.entry(namespace.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(namespace);
        }
        queue.push_back(entry);
        self.len += 1;
    }

    /// The head of the next namespace's queue, in turn.
    pub fn pop(&mut self) -> Option<Entry> {
        let namespace = self.turns.pop_front()?;
        let queue = self.namespaces.get_mut(&namespace)?;
        let entry = queue.pop_front()?;
        if queue.is_empty() {
            self.namespaces.remove(&namespace);
        } else {
            self.turns.push_back(namespace);
        }
        self.len -= 1;
        self.updates.remove(&entry.change.key);
        Some(entry)
    }

    /// Put back entries popped and not taken, `held` in the order they were popped: each goes
    /// back to the front of its namespace's queue, where it was, and a namespace given back its
    /// head takes its turn first.
    pub fn put_back(&mut self, held: Vec<Entry>) {
        if held.is_empty() {
            return;
        }
        // The namespaces given back their heads, in the order their first entry was popped:
        // they take their turns first, in that order (one pass over the turns).
        let mut given_back: HashSet<Arc<str>> = HashSet::new();
        let mut first_popped: Vec<Arc<str>> = Vec::new();
        for entry in &held {
            if given_back.insert(entry.change.key.namespace.clone()) {
                first_popped.push(entry.change.key.namespace.clone());
            }
        }
        self.turns.retain(|n| !given_back.contains(n));
        for namespace in first_popped.iter().rev() {
            self.turns.push_front(namespace.clone());
        }
        for entry in held.into_iter().rev() {
            if is_plain(&entry.change, entry.forced) {
                self.updates.insert(entry.change.key.clone());
            }
            let queue = self.namespaces.entry(entry.change.key.namespace.clone()).or_default();
            queue.push_front(entry);
            self.len += 1;
        }
    }
}

/// A live update of a resource the store held (not a creation, deletion or take-up): what may
/// merge with another.
fn is_plain(change: &Change, forced: Option<Transition>) -> bool {
    forced.is_none() && change.observed.is_some() && change.previous.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Cause, DataHash, ResourceKind};

    fn update(namespace: &str, name: &str, data: &str) -> Change {
        Change {
            key: ResourceKey { kind: ResourceKind::ConfigMap, namespace: namespace.into(), name: name.into() },
            observed: Some(DataHash::of_bytes(data.as_bytes())),
            previous: Some(DataHash::of_bytes(b"before")),
            cause: Cause::Event,
        }
    }

    fn names(queue: &mut FairQueue) -> Vec<String> {
        std::iter::from_fn(|| queue.pop())
            .map(|e| format!("{}/{}", e.change.key.namespace, e.change.key.name))
            .collect()
    }

    #[test]
    fn a_namespace_flooding_the_queue_gets_one_turn_in_n() {
        let mut queue = FairQueue::default();
        let now = Instant::now();
        for i in 0..1000 {
            queue.push(update("noisy", &format!("cm-{i}"), "x"), None, now);
        }
        queue.push(update("quiet-a", "cm", "x"), None, now);
        queue.push(update("quiet-b", "cm", "x"), None, now);
        let first: Vec<String> = names(&mut queue).into_iter().take(4).collect();
        assert_eq!(first, vec!["noisy/cm-0", "quiet-a/cm", "quiet-b/cm", "noisy/cm-1"]);
    }

    #[test]
    fn updates_of_one_resource_merge_into_one_decision_on_the_newest_data() {
        let mut queue = FairQueue::default();
        let now = Instant::now();
        assert_eq!(queue.push(update("ns", "cm", "1"), None, now), Queued::New);
        for i in 2..100 {
            assert_eq!(queue.push(update("ns", "cm", &i.to_string()), None, now), Queued::Merged { same: false });
        }
        assert_eq!(queue.push(update("ns", "cm", "99"), None, now), Queued::Merged { same: true });
        assert_eq!(queue.len(), 1);
        let entry = queue.pop().expect("one");
        assert_eq!(entry.change.observed, Some(DataHash::of_bytes(b"99")));
        assert_eq!(entry.change.previous, Some(DataHash::of_bytes(b"before")), "the first baseline");
        // A creation or a deletion is never merged: each decides on its own.
        let mut created = update("ns", "cm", "1");
        created.previous = None;
        queue.push(created, None, now);
        queue.push(update("ns", "cm", "2"), None, now);
        let mut deleted = update("ns", "cm", "3");
        deleted.observed = None;
        queue.push(deleted, None, now);
        assert_eq!(queue.len(), 3);
    }

    #[test]
    fn entries_put_back_keep_their_places() {
        let mut queue = FairQueue::default();
        let now = Instant::now();
        for (ns, name) in [("a", "1"), ("a", "2"), ("b", "1"), ("a", "3")] {
            queue.push(update(ns, name, "x"), None, now);
        }
        let held: Vec<Entry> = (0..3).filter_map(|_| queue.pop()).collect();
        queue.put_back(held);
        assert_eq!(names(&mut queue), vec!["a/1", "b/1", "a/2", "a/3"]);
    }
}
