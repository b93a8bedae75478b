//! `reloader fleet status`: which replica holds which shard, read from the Leases.

use std::collections::BTreeMap;

use crate::lease::{FLEET_LABEL, RING_ANNOTATION, ROLE_LABEL};
use crate::reload::checkpoint::{Checkpoint, SAVED_AT_ANNOTATION};
use crate::shard::{NamespaceFilter, Ring};
use crate::watch::INTERNAL_LABEL;
use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client};

/// Print the fleet's shards as a table on stdout. The ring (shard count and placement) is the
/// one the shard Leases record (their ring annotation); `fallback` only when they record none.
pub async fn print(
    client: Client,
    namespace: &str,
    (prefix, checkpoint): (&str, &str),
    fallback: &Ring,
    filter: &NamespaceFilter,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let list = leases
        .list(&ListParams::default().labels(&format!("{FLEET_LABEL}={prefix}")))
        .await
        .with_context(|| format!("cannot list the fleet's Leases in namespace {namespace}"))?;
    let recorded = recorded_ring(&list.items);
    let ring = recorded.as_ref().unwrap_or(fallback);
    let namespaces: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let mut per_shard: BTreeMap<u32, usize> = BTreeMap::new();
    for ns in namespaces.list_metadata(&ListParams::default()).await.context("cannot list namespaces")?.items {
        let name = ns.metadata.name.unwrap_or_default();
        if filter.select(&name, &ns.metadata.labels.unwrap_or_default()).is_selected() {
            *per_shard.entry(ring.shard_of(&name)).or_default() += 1;
        }
    }
    let saved = checkpoints_saved(&client, namespace).await;
    let now = jiff::Timestamp::now();
    let age = |lease: &Lease| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| format!("{}s", now.duration_since(t.0).as_secs().max(0)))
            .unwrap_or_else(|| "-".into())
    };
    let role =
        |lease: &Lease| lease.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL)).cloned().unwrap_or_default();
    let holder = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();

    println!(
        "{:<6} {:<32} {:>10} {:>12} {:>11} {:>11}",
        "SHARD", "HOLDER", "RENEWED", "TRANSITIONS", "NAMESPACES", "CHECKPOINT"
    );
    let by_name: BTreeMap<String, &Lease> = list
        .items
        .iter()
        .filter(|l| role(l) == "shard")
        .map(|l| (l.metadata.name.clone().unwrap_or_default(), l))
        .collect();
    for shard in 0..ring.shards() {
        let name = if ring.shards() == 1 { prefix.to_string() } else { format!("{prefix}-shard-{shard}") };
        let (holder, renewed, transitions) = match by_name.get(&name) {
            Some(l) => (holder(l), age(l), l.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0).to_string()),
            None => ("(no lease)".to_string(), "-".to_string(), "-".to_string()),
        };
        let holder = if holder.is_empty() { "(free)".to_string() } else { holder };
        let checkpoint_name = Checkpoint::name_of(checkpoint, shard, ring.shards());
        // How long ago the shard's checkpoint was saved: a holder that does not save it (the
        // API server refuses the write) shows here as an age that keeps growing.
        let checkpoint_age = saved
            .get(&checkpoint_name)
            .map(|at| format!("{}s", now.duration_since(*at).as_secs().max(0)))
            .unwrap_or_else(|| "-".into());
        println!(
            "{shard:<6} {holder:<32} {renewed:>10} {transitions:>12} {:>11} {checkpoint_age:>11}",
            per_shard.get(&shard).copied().unwrap_or(0)
        );
    }
    // A member of another ring (another --shards, mid rolling update) holds nothing while
    // the ring sorting first is live: show it.
    let ring_of = |lease: &Lease| {
        lease.metadata.annotations.as_ref().and_then(|a| a.get(RING_ANNOTATION)).cloned().unwrap_or_else(|| "-".into())
    };
    println!();
    println!("{:<39} {:>10}  RING", "MEMBER", "RENEWED");
    for lease in list.items.iter().filter(|l| role(l) == "member") {
        let ring_text = ring_of(lease);
        let mark = if ring_text == ring.fingerprint() { "" } else { "  (differs from this command's)" };
        println!("{:<39} {:>10}  {ring_text}{mark}", holder(lease), age(lease));
    }
    Ok(())
}

/// When each checkpoint in `namespace` was last saved (its `saved-at` annotation), by name;
/// empty when they cannot be listed (the table then shows `-`).
async fn checkpoints_saved(client: &Client, namespace: &str) -> BTreeMap<String, jiff::Timestamp> {
    let api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), namespace);
    let listed = api.list_metadata(&ListParams::default().labels(&format!("{INTERNAL_LABEL}=checkpoint"))).await;
    listed
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|cm| {
            let at = cm.metadata.annotations?.get(SAVED_AT_ANNOTATION)?.parse().ok()?;
            Some((cm.metadata.name?, at))
        })
        .collect()
}

/// The shard of `namespace`, the replica holding its Lease and the fleet's shard count, from
/// the fleet's Leases; `None` when there are none (a single replica without `--enable-ha`).
pub async fn serving(
    client: Client,
    lease_namespace: &str,
    prefix: &str,
    fallback: &Ring,
    namespace: &str,
) -> anyhow::Result<Option<(u32, Option<String>, u32)>> {
    let leases: Api<Lease> = Api::namespaced(client, lease_namespace);
    let list = leases
        .list(&ListParams::default().labels(&format!("{FLEET_LABEL}={prefix}")))
        .await
        .with_context(|| format!("cannot list the fleet's Leases in namespace {lease_namespace}"))?;
    if list.items.is_empty() {
        return Ok(None);
    }
    let recorded = recorded_ring(&list.items);
    let ring = recorded.as_ref().unwrap_or(fallback);
    let shard = ring.shard_of(namespace);
    let name = if ring.shards() == 1 { prefix.to_string() } else { format!("{prefix}-shard-{shard}") };
    let holder = list
        .items
        .iter()
        .find(|l| l.metadata.name.as_deref() == Some(name.as_str()))
        .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty());
    Ok(Some((shard, holder, ring.shards())))
}

/// The ring most shard Leases record in their ring annotation (`shards=16,...`).
fn recorded_ring(leases: &[Lease]) -> Option<Ring> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for lease in leases {
        let is_shard = lease.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL)).is_some_and(|r| r == "shard");
        let recorded = lease.metadata.annotations.as_ref().and_then(|a| a.get(RING_ANNOTATION));
        if let Some(text) = recorded.filter(|_| is_shard) {
            *counts.entry(text.as_str()).or_default() += 1;
        }
    }
    let (text, _) = counts.into_iter().max_by_key(|(_, seen)| *seen)?;
    Ring::from_fingerprint(text)
}
