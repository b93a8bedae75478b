//! What the lease task publishes: the [`Ownership`] of shards as this replica sees it, and,
//! derived from it, the three sets the other rooms read ([`Shards`]): the shards the engine
//! acts on, those the watches load, and of those the ones that may load slowly.

use std::collections::BTreeSet;

use tokio::sync::watch;

/// The state of one shard as this replica sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardState {
    /// Held here and renewed in time: this replica acts on it.
    Active,
    /// Held here on record, but not renewed within the deadline: this replica does not act.
    Fenced,
    /// Held here, withdrawn to move to another replica once the engine let go of it.
    Draining,
    /// Held by another replica.
    Elsewhere,
    /// Nobody holds it (or the holder's Lease expired).
    Free,
}

/// One shard in [`Ownership`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardStatus {
    pub shard: u32,
    pub holder: String,
    pub state: ShardState,
    /// Seconds since this replica saw the Lease change (renewals included).
    pub observed_age_secs: u64,
}

/// What the lease task publishes after every round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Shards this replica may act on now.
    pub held: BTreeSet<u32>,
    pub shards: Vec<ShardStatus>,
    /// Live members, sorted, this replica included.
    pub members: Vec<String>,
    /// The ring of a live replica this one gives way to (it then holds nothing).
    pub yielding_to: Option<String>,
    /// Shards this replica is to get and does not hold yet (another live replica still holds
    /// them, or they are free and about to be acquired): to watch now, so that they are loaded
    /// when their holder hands them over (see [`crate::lease::handoff`]).
    pub warming: BTreeSet<u32>,
    /// With `--hot-standby`: the shards this replica would be given if any one other replica
    /// left, loaded beforehand so that the departure (a rolling update's SIGTERM, a crash)
    /// moves no data, only Leases.
    pub standby: BTreeSet<u32>,
    /// This replica is leaving: it hands its shards over, one by one, and gains none.
    pub leaving: bool,
}

impl Ownership {
    /// The shards for the watches to load, given those they load now: the held, the warming
    /// and the standby ones. A leaving replica's watches keep what they load until it holds nothing:
    /// narrowing them to the shards still held would relist those (server-sharded watches
    /// restart with a smaller selector) while the heirs list what they gain, on the same API
    /// server. Its engine acts on held shards only.
    pub fn to_watch(&self, watching: &BTreeSet<u32>) -> BTreeSet<u32> {
        if self.leaving && !self.held.is_empty() {
            return watching.union(&self.held).copied().collect();
        }
        self.held.iter().chain(&self.warming).chain(&self.standby).copied().collect()
    }
}

/// The receivers the lease room publishes, one per reader.
#[derive(Debug)]
pub struct Shards {
    /// For the admin views.
    pub ownership: watch::Receiver<Ownership>,
    /// The shards the engine acts on: [`Ownership::held`].
    pub held: watch::Receiver<BTreeSet<u32>>,
    /// The shards the watches load: [`Ownership::to_watch`].
    pub watched: watch::Receiver<BTreeSet<u32>>,
    /// Of those, the ones that may load slowly: [`Ownership::standby`].
    pub background: watch::Receiver<BTreeSet<u32>>,
}

/// The sending side of [`Shards`]: every change of the ownership is passed on to the three
/// sets at once.
#[derive(Debug)]
pub(super) struct Publisher {
    ownership: watch::Sender<Ownership>,
    held: watch::Sender<BTreeSet<u32>>,
    watched: watch::Sender<BTreeSet<u32>>,
    background: watch::Sender<BTreeSet<u32>>,
}

impl Publisher {
    pub(super) fn new() -> (Self, Shards) {
        let (ownership, ownership_rx) = watch::channel(Ownership::default());
        let (held, held_rx) = watch::channel(BTreeSet::new());
        let (watched, watched_rx) = watch::channel(BTreeSet::new());
        let (background, background_rx) = watch::channel(BTreeSet::new());
        let shards = Shards { ownership: ownership_rx, held: held_rx, watched: watched_rx, background: background_rx };
        (Self { ownership, held, watched, background }, shards)
    }

    pub(super) fn borrow(&self) -> watch::Ref<'_, Ownership> {
        self.ownership.borrow()
    }

    /// Change the ownership with `modify`, which says whether it changed anything; if so,
    /// pass it on.
    pub(super) fn send_if_modified(&self, modify: impl FnOnce(&mut Ownership) -> bool) -> bool {
        let changed = self.ownership.send_if_modified(modify);
        if changed {
            let (held, watched, standby) = {
                let o = self.ownership.borrow();
                (o.held.clone(), o.to_watch(&self.watched.borrow()), o.standby.clone())
            };
            replace(&self.held, held);
            // Before the watched set, so that the watches know what of it may load slowly.
            replace(&self.background, standby);
            replace(&self.watched, watched);
        }
        changed
    }
}

fn replace(sender: &watch::Sender<BTreeSet<u32>>, value: BTreeSet<u32>) {
    sender.send_if_modified(|current| std::mem::replace(current, value) != *current);
}

/// What a replica without Leases publishes: every shard, for good. Keep the returned guard for
/// as long as the receivers are read.
pub fn alone(shards: u32) -> (Shards, impl Sized) {
    let (publisher, receivers) = Publisher::new();
    let all: BTreeSet<u32> = (0..shards).collect();
    publisher.send_if_modified(|o| {
        o.held.clone_from(&all);
        true
    });
    (receivers, publisher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reader_gets_its_set_and_a_leaving_replica_keeps_loading_what_it_holds() {
        let (publisher, shards) = Publisher::new();
        publisher.send_if_modified(|o| {
            o.held = BTreeSet::from([1, 2]);
            o.warming = BTreeSet::from([3]);
            o.standby = BTreeSet::from([4]);
            true
        });
        assert_eq!(*shards.held.borrow(), BTreeSet::from([1, 2]));
        assert_eq!(*shards.watched.borrow(), BTreeSet::from([1, 2, 3, 4]));
        assert_eq!(*shards.background.borrow(), BTreeSet::from([4]));
        publisher.send_if_modified(|o| {
            o.held = BTreeSet::from([2]);
            o.leaving = true;
            true
        });
        assert_eq!(*shards.held.borrow(), BTreeSet::from([2]));
        assert_eq!(
            *shards.watched.borrow(),
            BTreeSet::from([1, 2, 3, 4]),
            "loads what it loaded until it holds nothing"
        );
        let (alone, _keep) = alone(4);
        assert_eq!(*alone.held.borrow(), BTreeSet::from([0, 1, 2, 3]));
        assert_eq!(*alone.watched.borrow(), BTreeSet::from([0, 1, 2, 3]));
    }
}
