//! The hashes acted on, kept per shard: saving a shard's checkpoint copies its own map
//! instead of sifting every resource the replica holds (at 10,000 namespaces that sifting,
//! once per dirty shard, held the engine for 0.3 s every save).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::reload::checkpoint::{ShortHash, short};
use crate::shard::Ring;
use crate::watch::{ResourceKey, Store};

/// The checkpoint's content of every active shard.
pub(super) struct Acted {
    ring: Arc<Ring>,
    shards: HashMap<u32, HashMap<ResourceKey, ShortHash>>,
}

/// Per shard, what its checkpoint is to hold.
pub(super) type Entries = HashMap<u32, HashMap<ResourceKey, ShortHash>>;

impl Acted {
    pub fn new(ring: Arc<Ring>) -> Self {
        Self { ring, shards: HashMap::new() }
    }

    pub fn get(&self, key: &ResourceKey) -> Option<ShortHash> {
        self.shards.get(&self.ring.shard_of(&key.namespace))?.get(key).copied()
    }

    pub fn insert(&mut self, key: ResourceKey, hash: ShortHash) {
        let shard = self.ring.shard_of(&key.namespace);
        self.shards.entry(shard).or_default().insert(key, hash);
    }

    pub fn remove(&mut self, key: &ResourceKey) {
        if let Some(map) = self.shards.get_mut(&self.ring.shard_of(&key.namespace)) {
            map.remove(key);
        }
    }

    /// Forget a shard let go of; returns its keys.
    pub fn forget(&mut self, shard: u32) -> Vec<ResourceKey> {
        self.shards.remove(&shard).map(|map| map.into_keys().collect()).unwrap_or_default()
    }

    /// Copies of the acted-on hashes of `shards`, for [`entries`].
    pub fn copies(&self, shards: &BTreeSet<u32>) -> Entries {
        shards.iter().map(|&s| (s, self.shards.get(&s).cloned().unwrap_or_default())).collect()
    }
}

/// What the checkpoints of the shards in `acted` hold: the acted-on hashes, and the baselines
/// of stored resources never acted on (so a change still on its way to the engine is one for
/// the next owner too). One pass over the store's baselines for all of them.
pub(super) fn entries(mut acted: Entries, store: &Store, ring: &Ring) -> Entries {
    let baselines = store.baselines(|k| acted.contains_key(&ring.shard_of(&k.namespace)));
    for (key, loaded) in baselines {
        if let Some(map) = acted.get_mut(&ring.shard_of(&key.namespace)) {
            map.entry(key).or_insert_with(|| short(&loaded));
        }
    }
    acted
}
