//! Namespace churn: a cluster that creates, uses and deletes namespaces all day. Waves of
//! namespaces are created (a ConfigMap and a Deployment using it each), changed once (each
//! Deployment must record the change), then deleted; the controller's RSS and its
//! per-namespace series are read before, at the peak, and once the last wave is gone. What the
//! controller keeps per namespace must go with the namespace.
//!
//!     loadtest churn <namespaces> <per wave> [rounds]
//!
//! With more rounds, the same process churns again: memory a leak holds grows round after
//! round; capacity kept from the peak does not.

use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use reloader_fleet::watch::DataHash;
use serde_json::json;
use tokio::process::Command;

use crate::{create_home, http_get, metric, rss_mib, start_one_with, wait_ready};

const LABEL: &str = "reloader-fleet.churn";
/// The per-namespace series this test watches.
const SERIES: &str = "reloader_reload_executed_total_by_namespace{";
/// How long after the last wave is gone the controller is given to forget it.
const FORGET_DEADLINE: Duration = Duration::from_secs(180);
/// How long the namespace controller may take to remove every deleted namespace.
const NAMESPACES_GONE_DEADLINE: Duration = Duration::from_secs(3600);

pub async fn churn(total: usize, per_wave: usize, rounds: usize) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    create_home(&client).await?;
    let extra = [format!("--namespace-selector={LABEL}=1"), "--metrics-count-by-namespace".to_string()];
    let (mut child, port) = start_one_with(0, 1, 0, "churn", &extra).await?;
    wait_ready(&[port], 1, 16).await?;
    let pid = child.id().unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss_before, series_before, owned_before) =
        (rss_mib(pid).unwrap_or(0.0), series(port).await, owned(port).await);
    println!(
        "churn: {total} namespaces in waves of {per_wave}; before: RSS {rss_before:.1} MiB, {series_before} per-namespace series, {owned_before} namespaces stored"
    );
    let (mut peak_rss, mut peak_series) = (rss_before, series_before);
    for round in 1..=rounds {
        let started = Instant::now();
        let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() % 100_000;
        for wave in 0..total.div_ceil(per_wave) {
            let names: Vec<String> =
                (wave * per_wave..((wave + 1) * per_wave).min(total)).map(|i| format!("churn-{run}-{i:05}")).collect();
            futures::future::try_join_all(names.iter().map(|ns| create(&client, ns))).await?;
            futures::future::try_join_all(names.iter().map(|ns| change_and_wait(&client, ns))).await?;
            peak_rss = peak_rss.max(rss_mib(pid).unwrap_or(0.0));
            peak_series = peak_series.max(series(port).await);
            let namespaces: Api<Namespace> = Api::all(client.clone());
            for ns in &names {
                namespaces.delete(ns, &DeleteParams::background()).await?;
            }
            if wave % 10 == 9 {
                println!(
                    "  {} namespaces churned in {:.0?}: RSS {:.1} MiB, {} series, {} namespaces stored",
                    (wave + 1) * per_wave,
                    started.elapsed(),
                    rss_mib(pid).unwrap_or(0.0),
                    series(port).await,
                    owned(port).await
                );
            }
        }
        println!(
            "all {total} changed once and deleted in {:.0?}; waiting for the deletions to land",
            started.elapsed()
        );
        // The namespace controller empties and removes them (minutes at thousands, on 2 cores): a
        // namespace still terminating is still there, and still stored. Forgetting is timed from
        // when the last one is gone.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let selector = ListParams::default().labels(&format!("{LABEL}=1"));
        let gone_deadline = Instant::now() + NAMESPACES_GONE_DEADLINE;
        loop {
            let left = namespaces.list_metadata(&selector).await?.items.len();
            if left == 0 {
                break;
            }
            if Instant::now() > gone_deadline {
                bail!("after {NAMESPACES_GONE_DEADLINE:?}: {left} namespaces still terminating in the API server");
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        println!("the API server removed them all {:.0?} after the start", started.elapsed());
        let deadline = Instant::now() + FORGET_DEADLINE;
        while owned(port).await > owned_before || series(port).await > series_before {
            if Instant::now() > deadline {
                bail!(
                    "after {FORGET_DEADLINE:?}: {} namespaces stored (before: {owned_before}), {} series (before: {series_before})",
                    owned(port).await,
                    series(port).await
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (rss_after, series_after) = (rss_mib(pid).unwrap_or(0.0), series(port).await);
        println!(
            "after round {round}: RSS {rss_after:.1} MiB ({:+.1} MiB against before; peak {peak_rss:.1} MiB), {series_after} per-namespace series (before {series_before}, peak {peak_series}), {} namespaces stored, {} reloads",
            rss_after - rss_before,
            owned(port).await,
            metric(port, "reloader_reload_executed_total{success=\"true\"}").await
        );
    }
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    Ok(())
}

/// Lines of the per-namespace reload series on `/metrics`.
async fn series(port: u16) -> usize {
    http_get(port, "/metrics").await.map(|m| m.lines().filter(|l| l.starts_with(SERIES)).count()).unwrap_or(0)
}

async fn owned(port: u16) -> f64 {
    metric(port, "reloader_namespaces_owned").await
}

/// A labelled namespace with ConfigMap `cfg` (`v=0`) and a Deployment of 0 replicas using it.
async fn create(client: &Client, ns: &str) -> anyhow::Result<()> {
    let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns, "labels": { LABEL: "1" } } }))?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "cfg" }, "data": { "v": "0" } }))?;
    Api::<ConfigMap>::namespaced(client.clone(), ns).create(&PostParams::default(), &cm).await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "app", "annotations": { "reloader.stakater.com/auto": "true" } },
        "spec": {
            "replicas": 0,
            "selector": { "matchLabels": { "app": "app" } },
            "template": {
                "metadata": { "labels": { "app": "app" } },
                "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1",
                                           "envFrom": [{ "configMapRef": { "name": "cfg" } }] }] }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &deployment).await?;
    Ok(())
}

/// Change `cfg` to `v=1` once the controller could have stored the Deployment, and wait until
/// the Deployment records it (re-sending the change after a while: a change made before the
/// namespace reached the store is a baseline, not a change).
async fn change_and_wait(client: &Client, ns: &str) -> anyhow::Result<()> {
    let expected =
        DataHash::of_configmap(&[("v".to_string(), "1".to_string())].into(), &Default::default()).to_string();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempt = 0u32;
    loop {
        // v=0 then v=1 again: a second try is a change too.
        for value in if attempt == 0 { vec!["1"] } else { vec!["0", "1"] } {
            configmaps.patch("cfg", &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": value } }))).await?;
        }
        let tried = Instant::now();
        while tried.elapsed() < Duration::from_secs(5) {
            let d = deployments.get("app").await?;
            let recorded = d.spec.and_then(|s| s.template.spec).and_then(|s| {
                s.containers[0].env.as_ref()?.iter().find(|e| e.name == "STAKATER_CFG_CONFIGMAP")?.value.clone()
            });
            if recorded.as_deref() == Some(expected.as_str()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if Instant::now() > deadline {
            bail!("{ns}: the Deployment never recorded the change");
        }
        attempt += 1;
    }
}
