//! The checkpoint at the size it is for, against the real API server: one shard of a million
//! resources with names as long as real ones is saved in parts and reads back; a save after a
//! few changes sends the head alone; a lost part, an old format and a newer one are handled.

use std::collections::{BTreeMap, HashMap};

use crate::support::with_temp_ns;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use reloader_fleet::reload::checkpoint::{Checkpoint, MAX_PARTS, ShardMap};
use reloader_fleet::watch::{ResourceKey, ResourceKind};
use serde_json::json;

/// `namespaces` namespaces of `per_namespace` resources, named like a platform's.
fn realistic(namespaces: usize, per_namespace: usize) -> ShardMap {
    let mut entries = ShardMap::default();
    for n in 0..namespaces {
        let namespace: std::sync::Arc<str> = format!("team-payments-production-{n:05}").into();
        for r in 0..per_namespace {
            let (kind, name) = match r % 2 {
                _ if r == 0 => (ResourceKind::ConfigMap, "kube-root-ca.crt".to_string()),
                0 => (ResourceKind::ConfigMap, format!("application-settings-for-service-{r:04}-v2")),
                _ => (ResourceKind::Secret, format!("application-credentials-for-service-{r:04}-v2")),
            };
            let key = ResourceKey { kind, namespace: namespace.clone(), name: name.into() };
            // A hash as random as a SHA-1's first 64 bits.
            let hash = xorshift((n * 7919 + r) as u64 + 1);
            entries.insert(key, hash);
        }
    }
    entries
}

fn xorshift(mut x: u64) -> u64 {
    for _ in 0..3 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

fn as_map(entries: &ShardMap) -> HashMap<ResourceKey, u64> {
    entries.iter().map(|(k, h)| (k, *h)).collect()
}

async fn configmaps(client: &kube::Client, ns: &str) -> BTreeMap<String, ConfigMap> {
    let list = Api::<ConfigMap>::namespaced(client.clone(), ns).list(&Default::default()).await.expect("list");
    list.items.into_iter().filter_map(|cm| Some((cm.metadata.name.clone()?, cm))).collect()
}

#[tokio::test]
async fn a_shard_of_a_million_resources_is_saved_in_parts_and_a_few_changes_send_the_head_alone() {
    with_temp_ns("checkpoint-million", |client, ns| async move {
        // 50,000 namespaces of 20: a million resources in one shard.
        let mut entries = realistic(50_000, 20);
        assert_eq!(entries.len(), 1_000_000);
        let mut checkpoint = Checkpoint::new(client.clone(), &ns, "cp");
        assert!(checkpoint.load().await.expect("read").is_none(), "none yet");
        let first = checkpoint.save(&entries).await.expect("a million resources fit");
        let objects = configmaps(&client, &ns).await;
        let parts = objects.keys().filter(|n| n.starts_with("cp-part-")).count();
        println!(
            "1,000,000 resources: {} objects, {parts} parts, {} bytes stored, {} bytes sent",
            first.objects, first.stored, first.bytes
        );
        assert!(parts > 1 && parts <= MAX_PARTS as usize, "{parts} parts");
        assert_eq!(first.objects, parts + 1, "every part and the head");

        let mut reader = Checkpoint::new(client.clone(), &ns, "cp");
        let loaded = reader.load().await.expect("read").expect("a checkpoint");
        assert!(loaded.is_whole());
        assert_eq!(loaded.entries, as_map(&entries), "reads back as saved");

        // 100 changes and a removal: the head alone, with its journal.
        let keys: Vec<ResourceKey> = entries.iter().map(|(k, _)| k).step_by(10_000).collect();
        for key in &keys {
            entries.insert(key.clone(), 42);
        }
        entries.remove(&keys[0]);
        let second = checkpoint.save(&entries).await.expect("save");
        println!("100 changes: {} objects, {} bytes sent", second.objects, second.bytes);
        assert_eq!(second.objects, 1, "the head alone");
        assert!(second.bytes < 16 << 10, "{} bytes for 100 changes", second.bytes);
        assert_eq!(checkpoint.save(&entries).await.expect("save").objects, 0, "nothing changed, nothing written");
    })
    .await;
}

#[tokio::test]
async fn a_lost_part_makes_its_resources_unknown_and_a_shrinking_checkpoint_deletes_its_parts() {
    with_temp_ns("checkpoint-parts", |client, ns| async move {
        let mut entries = realistic(2_000, 20);
        let mut checkpoint = Checkpoint::new(client.clone(), &ns, "cp");
        checkpoint.save(&entries).await.expect("save");
        // A few changes go into the journal; a new owner reads base and journal together, and
        // goes on from there with the head alone.
        let keys: Vec<ResourceKey> = entries.iter().map(|(k, _)| k).step_by(1_000).collect();
        for key in &keys {
            entries.insert(key.clone(), 42);
        }
        assert_eq!(checkpoint.save(&entries).await.expect("save").objects, 1, "the head alone");
        let mut heir = Checkpoint::new(client.clone(), &ns, "cp");
        let loaded = heir.load().await.expect("read").expect("a checkpoint");
        assert_eq!(loaded.entries, as_map(&entries), "base and journal read together");
        entries.insert(keys[1].clone(), 43);
        assert_eq!(heir.save(&entries).await.expect("save").objects, 1, "the heir's save: the head alone");
        let parts: Vec<String> = configmaps(&client, &ns).await.into_keys().filter(|n| n.contains("-part-")).collect();
        assert!(parts.len() >= 2, "{parts:?}");
        // Someone deletes a part: its resources are not vouched for, the others are.
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .delete(&parts[0], &DeleteParams::default())
            .await
            .expect("delete a part");
        let mut reader = Checkpoint::new(client.clone(), &ns, "cp");
        let loaded = reader.load().await.expect("read").expect("a checkpoint");
        assert!(!loaded.is_whole());
        assert_eq!(reader.rejected(), Some("partial"));
        let unknown = entries.iter().filter(|(k, _)| !loaded.knows(k)).count();
        let known = entries.iter().filter(|(k, _)| loaded.knows(k) && loaded.entries.get(k) == entries.get(k)).count();
        assert!(unknown > 0 && known > 0 && unknown + known == entries.len(), "{unknown} unknown, {known} known");
        // The next save writes the part again.
        reader.save(&entries).await.expect("save");
        let loaded = Checkpoint::new(client.clone(), &ns, "cp").load().await.expect("read").expect("a checkpoint");
        assert!(loaded.is_whole());
        assert_eq!(loaded.entries, as_map(&entries));

        // Shrunk to a handful: back in the head, the parts deleted.
        let small = realistic(2, 3);
        reader.save(&small).await.expect("save");
        let left: Vec<String> = configmaps(&client, &ns).await.into_keys().filter(|n| n.starts_with("cp")).collect();
        assert_eq!(left, vec!["cp".to_string()], "the parts are gone");
        let loaded = Checkpoint::new(client.clone(), &ns, "cp").load().await.expect("read").expect("a checkpoint");
        assert_eq!(loaded.entries, as_map(&small));
    })
    .await;
}

#[tokio::test]
async fn a_version_1_checkpoint_still_reads_and_a_newer_format_is_refused() {
    with_temp_ns("checkpoint-formats", |client, ns| async move {
        let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
        let labels = json!({ "app.kubernetes.io/managed-by": "reloader-fleet" });
        let v1: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "old", "labels": labels },
            "data": { "checkpoint": format!("C {ns} app-config 0123456789abcdef\nS {ns} db 00000000000000ff") }
        }))
        .expect("a ConfigMap");
        api.create(&PostParams::default(), &v1).await.expect("create");
        let mut old = Checkpoint::new(client.clone(), &ns, "old");
        let loaded = old.load().await.expect("read").expect("a version 1 checkpoint is used");
        assert_eq!(loaded.entries.len(), 2);
        assert!(loaded.is_whole());
        // Saved again in version 2, and still the same entries.
        let entries: ShardMap = loaded.entries.into_iter().collect();
        old.save(&entries).await.expect("save");
        let saved = api.get("old").await.expect("get");
        assert_eq!(saved.data.as_ref().and_then(|d| d.get("format")).map(String::as_str), Some("2"));
        let again = Checkpoint::new(client.clone(), &ns, "old").load().await.expect("read").expect("a checkpoint");
        assert_eq!(again.entries, as_map(&entries));

        let newer: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "newer", "labels": labels },
            "data": { "format": "3", "parts": "0" }
        }))
        .expect("a ConfigMap");
        api.create(&PostParams::default(), &newer).await.expect("create");
        let mut reader = Checkpoint::new(client.clone(), &ns, "newer");
        assert!(reader.load().await.expect("read").is_none(), "not used: the shard starts from a baseline");
        assert_eq!(reader.rejected(), Some("newer_format"));
    })
    .await;
}
