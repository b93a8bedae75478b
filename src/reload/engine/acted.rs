//! The hashes acted on, kept per shard: saving a shard's checkpoint copies its own map
//! instead of sifting every resource the replica holds (at 10,000 namespaces that sifting,
//! once per dirty shard, held the engine for 0.3 s every save).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::reload::checkpoint::ShortHash;
use crate::shard::Ring;
use crate::watch::{ResourceKey, ResourceMap, Store};

/// The checkpoint's content of every active shard. A shard's map is shared with a save in
/// flight and copied only if the engine changes it meanwhile (a save of every shard used to
/// copy every map and every baseline at once: 10 MiB at 10,000 namespaces).
pub(super) struct Acted {
    ring: Arc<Ring>,
    shards: HashMap<u32, Arc<ShardMap>>,
}

/// One shard's acted-on hashes.
pub(super) type ShardMap = ResourceMap<ShortHash>;

/// Per shard, the acted-on hashes as they were when a save began.
pub(super) type Copies = HashMap<u32, Arc<ShardMap>>;

impl Acted {
    pub fn new(ring: Arc<Ring>) -> Self {
        Self { ring, shards: HashMap::new() }
    }

    pub fn get(&self, key: &ResourceKey) -> Option<ShortHash> {
        self.shards.get(&self.ring.shard_of(&key.namespace))?.get(key).copied()
    }

    pub fn insert(&mut self, key: ResourceKey, hash: ShortHash) {
        let shard = self.ring.shard_of(&key.namespace);
        Arc::make_mut(self.shards.entry(shard).or_default()).insert(key, hash);
    }

    pub fn remove(&mut self, key: &ResourceKey) {
        if let Some(map) = self.shards.get_mut(&self.ring.shard_of(&key.namespace)) {
            Arc::make_mut(map).remove(key);
        }
    }

    /// Forget a shard let go of; returns its keys.
    pub fn forget(&mut self, shard: u32) -> Vec<ResourceKey> {
        self.shards.remove(&shard).map(|map| map.keys().collect()).unwrap_or_default()
    }

    /// The acted-on hashes of `shards` as they are now, for [`entries`] (no copy is made).
    pub fn copies(&self, shards: &BTreeSet<u32>) -> Copies {
        shards.iter().map(|&s| (s, self.shards.get(&s).cloned().unwrap_or_default())).collect()
    }
}

/// What the checkpoint of `shard` is to hold: its acted-on hashes, and the baselines of stored
/// resources never acted on (so a change still on its way to the engine is one for the next
/// owner too). Built for one shard at a time, just before its save.
pub(super) fn entries(acted: &ShardMap, shard: u32, store: &Store, ring: &Ring) -> ShardMap {
    let mut entries = acted.clone();
    for (key, loaded) in store.baselines(|ns| ring.shard_of(ns) == shard) {
        entries.get_or_insert_with(key, || loaded);
    }
    entries
}
