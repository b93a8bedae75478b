//! The hashes acted on, kept per shard: saving a shard's checkpoint copies its own map
//! instead of sifting every resource the replica holds (at 10,000 namespaces that sifting,
//! once per dirty shard, held the engine for 0.3 s every save).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::reload::checkpoint::ShortHash;
use crate::shard::Ring;
use crate::watch::used_keys::KeyHashes;
use crate::watch::{ResourceKey, ResourceMap, Store};

/// The checkpoint's content of every active shard. A shard's map is shared with a save in
/// flight and copied only if the engine changes it meanwhile (a save of every shard used to
/// copy every map and every baseline at once).
pub(super) struct Acted {
    ring: Arc<Ring>,
    shards: HashMap<u32, Arc<ShardMap>>,
    /// The per-key hashes acted on, of resources some workload reads only some keys of: known
    /// only while they go with the hash acted on (any other change of it forgets them, so a
    /// key-level decision is never made against data older than what was acted on).
    keys: HashMap<ResourceKey, KeyHashes>,
    /// The per-key hashes of changes decided and not yet finished.
    deciding: HashMap<ResourceKey, KeyHashes>,
}

/// One shard's acted-on hashes.
pub(super) type ShardMap = ResourceMap<ShortHash>;

/// Per shard, the acted-on hashes as they were when a save began.
pub(super) type Copies = HashMap<u32, Arc<ShardMap>>;

impl Acted {
    pub fn new(ring: Arc<Ring>) -> Self {
        Self { ring, shards: HashMap::new(), keys: HashMap::new(), deciding: HashMap::new() }
    }

    pub fn get(&self, key: &ResourceKey) -> Option<ShortHash> {
        self.shards.get(&self.ring.shard_of(&key.namespace))?.get(key).copied()
    }

    pub fn insert(&mut self, key: ResourceKey, hash: ShortHash) {
        self.forget_keys(&key);
        let shard = self.ring.shard_of(&key.namespace);
        Arc::make_mut(self.shards.entry(shard).or_default()).insert(key, hash);
    }

    pub fn remove(&mut self, key: &ResourceKey) {
        self.forget_keys(key);
        if let Some(map) = self.shards.get_mut(&self.ring.shard_of(&key.namespace)) {
            Arc::make_mut(map).remove(key);
        }
    }

    /// Forget a shard let go of; returns its keys.
    pub fn forget(&mut self, shard: u32) -> Vec<ResourceKey> {
        let ring = &self.ring;
        self.keys.retain(|k, _| ring.shard_of(&k.namespace) != shard);
        self.deciding.retain(|k, _| ring.shard_of(&k.namespace) != shard);
        self.shards.remove(&shard).map(|map| map.keys().collect()).unwrap_or_default()
    }

    /// The per-key hashes acted on for `key`, if known.
    pub fn keys(&self, key: &ResourceKey) -> Option<&KeyHashes> {
        self.keys.get(key)
    }

    /// A change of `key` is decided on data with these per-key hashes: they are the ones acted
    /// on once it finishes ([`settle_keys`](Self::settle_keys)).
    pub fn deciding(&mut self, key: &ResourceKey, keys: Option<Box<KeyHashes>>) {
        match keys {
            Some(keys) => self.deciding.insert(key.clone(), *keys),
            None => self.deciding.remove(key),
        };
    }

    /// The change of `key` decided last is handled, at the hash just inserted: its per-key
    /// hashes (or none: a failed or held change) are the ones acted on.
    pub fn settle_keys(&mut self, key: &ResourceKey, handled: bool) {
        match self.deciding.remove(key) {
            Some(keys) if handled => {
                self.keys.insert(key.clone(), keys);
            }
            _ => {}
        }
    }

    /// Taken as the baseline with these per-key hashes (those of the hash just inserted).
    pub fn baseline_keys(&mut self, key: &ResourceKey, keys: Option<Box<KeyHashes>>) {
        if let Some(keys) = keys {
            self.keys.insert(key.clone(), *keys);
        }
    }

    /// Keep of the per-key hashes acted on only the keys workloads use selectively now
    /// (`used`: their ids, sorted; `None` while not known yet): a new resource's come with
    /// every key.
    pub fn narrow_keys(&mut self, used: impl Fn(&ResourceKey) -> Option<Vec<u64>>) {
        self.keys.retain(|key, hashes| {
            if let Some(ids) = used(key) {
                *hashes = hashes.narrowed(&ids);
            }
            !hashes.is_empty()
        });
    }

    fn forget_keys(&mut self, key: &ResourceKey) {
        if !self.keys.is_empty() {
            self.keys.remove(key);
        }
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
