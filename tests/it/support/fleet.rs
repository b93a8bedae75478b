//! What the fleet tests share: namespaces served by a test's replicas, updates that check
//! each Deployment rolled once, and views of the replicas' metrics.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::controller::Controller;
use super::fixtures::{Kind, Workload, cm_hash, create_configmap, create_namespace, generation, patch_configmap};
use super::scenario::Ctx;
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;

/// Update every namespace's ConfigMap to `value` and wait until each Deployment records it,
/// checking that each rolled exactly once.
pub async fn update_all(client: &kube::Client, namespaces: &[String], value: &str) -> Duration {
    let mut before = Vec::new();
    for ns in namespaces {
        before.push(generation(client, ns, Kind::Deployment, "web").await);
    }
    let started = Instant::now();
    for ns in namespaces {
        patch_configmap(client, ns, "cm", json!({ "data": { "k": value } })).await;
    }
    let hash = cm_hash(&[("k", value)]);
    for ns in namespaces {
        Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars)
            .wait_reloaded(Kind::Deployment, "web", Cm, "cm", &hash)
            .await;
    }
    let took = started.elapsed();
    for (ns, before) in namespaces.iter().zip(before) {
        let after = generation(client, ns, Kind::Deployment, "web").await;
        assert_eq!(after, before + 1, "namespace {ns} rolled {} times for one change", after - before);
    }
    took
}

/// `count` namespaces labelled for the test of `home`, each with ConfigMap `cm` used by an
/// auto Deployment `web`; returns the label selector and the names.
pub async fn served_namespaces_n(client: &kube::Client, home: &str, count: usize) -> (String, Vec<String>) {
    let label = format!("reloader-fleet.test/fleet={home}");
    let namespaces: Vec<String> = (0..count).map(|i| format!("{home}-{i}")).collect();
    for ns in &namespaces {
        create_namespace(client, ns, json!({ "reloader-fleet.test/fleet": home, super::TEST_LABEL: "fleet" })).await;
        create_configmap(client, ns, "cm", &[("k", "0")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(client, ns).await;
    }
    (label, namespaces)
}

/// Every shard held, each replica holding floor or ceil of 16 / replicas.
pub async fn balanced(controllers: &[&Controller]) -> bool {
    let (floor, ceil) = (16 / controllers.len(), 16_usize.div_ceil(controllers.len()));
    let mut sum = 0;
    for c in controllers {
        let held = c.metric("reloader_shards_active").await as usize;
        if held != floor && held != ceil {
            return false;
        }
        sum += held;
    }
    sum == 16
}

/// LISTs of ConfigMaps, Secrets and workloads `c` has sent (not of Leases or Namespaces).
pub async fn object_lists(c: &Controller) -> f64 {
    c.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("reloader_api_requests_total{") && l.contains("verb=\"list\""))
        .filter(|l| !l.contains("resource=\"leases\"") && !l.contains("resource=\"namespaces\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
