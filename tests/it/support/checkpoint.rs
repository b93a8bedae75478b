//! Reading and rewinding a checkpoint as the controller keeps it (head, journal and parts),
//! through the controller's own reader and writer: a test says what it holds, not how.

use std::collections::HashMap;

use kube::Client;
use reloader_fleet::reload::checkpoint::{Checkpoint, ShardMap, ShortHash};
use reloader_fleet::watch::{ResourceKey, ResourceKind};

/// The checkpoint's entries; `None` while there is none.
pub async fn entries(client: &Client, namespace: &str, name: &str) -> Option<HashMap<ResourceKey, ShortHash>> {
    let mut checkpoint = Checkpoint::new(client.clone(), namespace, name);
    checkpoint.load().await.expect("read the checkpoint").map(|loaded| loaded.entries)
}

/// The hash the checkpoint holds for ConfigMap `cm` of namespace `of`.
pub async fn configmap_entry(client: &Client, namespace: &str, name: &str, of: &str, cm: &str) -> Option<ShortHash> {
    entries(client, namespace, name).await?.get(&configmap_key(of, cm)).copied()
}

pub fn configmap_key(namespace: &str, name: &str) -> ResourceKey {
    ResourceKey { kind: ResourceKind::ConfigMap, namespace: namespace.into(), name: name.into() }
}

/// Set the entry of `key` to `hash` (with the controller stopped), as a crash before a save
/// would have left it.
pub async fn rewind(client: &Client, namespace: &str, name: &str, key: &ResourceKey, hash: ShortHash) {
    let mut checkpoint = Checkpoint::new(client.clone(), namespace, name);
    let loaded = checkpoint.load().await.expect("read the checkpoint").expect("a checkpoint to rewind");
    assert!(loaded.entries.contains_key(key), "the checkpoint must hold an entry for {key}");
    let mut entries: ShardMap = loaded.entries.into_iter().collect();
    entries.insert(key.clone(), hash);
    checkpoint.save(&entries).await.expect("write the checkpoint");
}

/// The first 64 bits of a hash written as hex (`cm_hash`), as the checkpoint keeps it.
pub fn short_of(hex: &str) -> ShortHash {
    u64::from_str_radix(&hex[..16], 16).expect("a hex hash")
}
