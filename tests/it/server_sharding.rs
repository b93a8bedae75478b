//! Server-side sharded watches (`--shard-placement=fnv-ranges` on an API server with the
//! ShardedListAndWatch feature, which `hack/cluster` turns on): the API server sends each
//! replica only the namespaces of the shards it holds, a gained shard gets watches of its own
//! range while the others run on, a change is still served once across a handoff, and a
//! replica whose server ignores the selector filters by itself, in one fleet.

use crate::support;

use crate::support::controller::{Controller, start_fleet_replica_with as start_with};
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_namespace, delete_namespaces, generation, patch_configmap,
};
use crate::support::proxy::{api_server_addr, kubeconfig_via};
use crate::support::scenario::Ctx;
use crate::support::throttle::Throttle;
use crate::support::{wait_for, with_temp_ns};
use reloader_fleet::reload::Strategy;
use reloader_fleet::shard::{Placement, Ring};
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;

const NAMESPACES: usize = 16;
const FOREIGN: &str = "reloader_watch_events_foreign_total";
const SHARDED: &str = "reloader_watch_server_sharded_collections";
const STREAMS: &str = "reloader_watch_streams";
const STARTED: &str = "reloader_watch_streams_started_total";

/// Update every namespace's ConfigMap to `value`; each Deployment must record it and roll once.
async fn update_all(client: &kube::Client, namespaces: &[String], value: &str) {
    let mut before = Vec::new();
    for ns in namespaces {
        before.push(generation(client, ns, Kind::Deployment, "web").await);
        patch_configmap(client, ns, "cm", json!({ "data": { "k": value } })).await;
    }
    let hash = cm_hash(&[("k", value)]);
    for (ns, before) in namespaces.iter().zip(before) {
        Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars)
            .wait_reloaded(Kind::Deployment, "web", Cm, "cm", &hash)
            .await;
        assert_eq!(generation(client, ns, Kind::Deployment, "web").await, before + 1, "{ns} rolled once");
    }
}

async fn owned_total(replicas: &[&Controller]) -> f64 {
    let mut owned = 0.0;
    for c in replicas {
        owned += c.metric("reloader_namespaces_owned").await;
    }
    owned
}

#[tokio::test]
async fn the_api_server_sends_each_replica_only_its_shards_and_a_replica_without_it_filters_itself() {
    with_temp_ns("server-shards", |client, home| async move {
        let label = format!("reloader-fleet.test/fleet={home}");
        // One namespace per shard. (Names that differ only at their end, like `{home}-1`,
        // `{home}-2`, share the high bits of their FNV-1a hash and would share a shard.)
        let ring = Ring::with_placement(16, Placement::FnvRanges).expect("16 shards");
        let mut by_shard = std::collections::BTreeMap::new();
        for i in 0.. {
            let name = format!("s{i}-{home}");
            by_shard.entry(ring.shard_of(&name)).or_insert(name);
            if by_shard.len() == NAMESPACES {
                break;
            }
        }
        let namespaces: Vec<String> = by_shard.into_values().collect();
        for ns in &namespaces {
            create_namespace(&client, ns, json!({ "reloader-fleet.test/fleet": home, support::TEST_LABEL: "fleet" }))
                .await;
            create_configmap(&client, ns, "cm", &[("k", "0")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let selector = format!("--namespace-selector={label}");
        let args = [selector.as_str(), "--shard-placement=fnv-ranges"];
        let a = start_with(&home, &format!("{home}-a"), &args, &support::kubeconfig_path()).await;
        // b's API server (a proxy) drops shardSelector, as a server without the feature would.
        let proxy = Throttle::dropping(api_server_addr(), "shardSelector").await;
        let b = start_with(&home, &format!("{home}-b"), &args, &kubeconfig_via(proxy.addr, &format!("{home}-b"))).await;
        wait_for("every test namespace owned by one of 2 replicas, 8 shards each", || async {
            let (held_a, held_b) =
                (a.metric("reloader_shards_active").await, b.metric("reloader_shards_active").await);
            (held_a == 8.0 && held_b == 8.0 && owned_total(&[&a, &b]).await == NAMESPACES as f64).then_some(())
        })
        .await;
        assert!(a.metric(SHARDED).await >= 3.0, "a's watches are filtered by the API server");
        assert_eq!(b.metric(SHARDED).await, 0.0, "b's server ignores the selector: b filters by itself");

        let (foreign_a, foreign_b) = (a.metric(FOREIGN).await, b.metric(FOREIGN).await);
        update_all(&client, &namespaces, "1").await;
        let (delta_a, delta_b) = (a.metric(FOREIGN).await - foreign_a, b.metric(FOREIGN).await - foreign_b);
        println!("foreign objects received during {NAMESPACES} updates: a (server-sharded) {delta_a}, b (client-side) {delta_b}");
        assert_eq!(delta_a, 0.0, "the API server sent a nothing of b's shards");
        assert!(delta_b >= 8.0, "b receives the changes of a's 8 namespaces and drops them");

        // A handoff: a takes b's shards with watches of their ranges alone; its own watches run
        // on (no relist of a's shards); nothing is lost or doubled.
        let (streams, started) = (a.metric(STREAMS).await, a.metric(STARTED).await);
        b.stop().await;
        wait_for("a holds all 16 shards and every namespace", || async {
            (a.metric("reloader_shards_active").await == 16.0 && owned_total(&[&a]).await == NAMESPACES as f64)
                .then_some(())
        })
        .await;
        assert_eq!(a.metric(STARTED).await - started, streams, "one new watch per watched kind, for b's shards");
        assert_eq!(a.metric(STREAMS).await, 2.0 * streams, "a's own watches kept running");
        update_all(&client, &namespaces, "2").await;
        a.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}
