//! One tenant cannot hurt the others (issue 49): quiet namespaces at 25 changes/s, measured
//! alone and then beside one hostile namespace, on one replica with a plain install's flags and
//! `--max-concurrent-rollouts`:
//!
//!     loadtest noisy <quiet namespaces> [seconds]
//!
//! The hostile namespace: 500 Deployments each reading its own ConfigMap and carrying a
//! 200 KiB annotation, ConfigMap writes at 10,000 a minute over them, 10 Deployments with a
//! 16 KiB reload list of expensive patterns, and 50 Deployments that never become ready (a
//! readiness gate nobody sets) rolled by the same writes. Printed: the quiet namespaces'
//! change -> patch p50/p99 alone and beside it, changes lost and rolled twice, the replica's
//! peak RSS, and the probes' (`/readyz`, `/metrics`) slowest answers and failures throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::scale::{LAYOUT, create_once, peak_rss_mib, populate, stop};
use crate::{Load, Run, http_get, rss_mib, run_updates, sorted_latencies, start_one_with, summary, wait_ready};

const HOSTILE: &str = "hostile-tenant";
const FLOODED: usize = 500;
const LISTS: usize = 10;
const NEVER_READY: usize = 50;
/// 10,000 writes a minute.
const FLOOD_PER_SECOND: u64 = 167;
const ANNOTATION_BYTES: usize = 200 * 1024;
/// The places the replica gives rollouts (`--max-concurrent-rollouts`) unless
/// `NOISY_ROLLOUT_PLACES` says otherwise (0: no such flag).
const ROLLOUT_PLACES: usize = 16;

pub async fn noisy(args: &[String]) -> anyhow::Result<()> {
    let usage = "usage: loadtest noisy <quiet namespaces> [seconds]";
    let count: usize = args.first().context(usage)?.parse().context(usage)?;
    let seconds: u64 = args.get(1).map_or(Ok(60), |s| s.parse()).context(usage)?;
    let client = Client::try_default().await?;
    populate(&client, count).await?;
    let started = Instant::now();
    hostile(&client).await?;
    println!("hostile namespace created in {:.0?}", started.elapsed());

    let places = std::env::var("NOISY_ROLLOUT_PLACES").map_or(Ok(ROLLOUT_PLACES), |p| p.parse())?;
    let extra: Vec<String> = (places > 0).then(|| format!("--max-concurrent-rollouts={places}")).into_iter().collect();
    println!("one replica, default flags{}", extra.first().map_or(String::new(), |f| format!(" and {f}")));
    let (mut child, port) = start_one_with(0, 1, count, "default", &extra).await?;
    wait_ready(&[port], 1, 1).await?;
    let pid = child.id().unwrap_or(0);
    println!("ready: RSS {:.1} MiB (peak {:.1})", rss_mib(pid).unwrap_or(0.0), peak_rss_mib(pid).unwrap_or(0.0));

    let probing = Arc::new(AtomicBool::new(true));
    let probes = tokio::spawn(probe(port, probing.clone()));
    let updates = (25 * seconds) as usize;
    let load = Load { updates, rate: Some(25), change: crate::Change::Data };
    let alone = run_updates(&client, count, load, &[port], LAYOUT).await?;
    report("quiet namespaces alone", &alone);

    let flooding = Arc::new(AtomicBool::new(true));
    let flood = tokio::spawn(flood(client.clone(), flooding.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let beside = run_updates(&client, count, load, &[port], LAYOUT).await?;
    flooding.store(false, Ordering::Relaxed);
    let writes = flood.await??;
    report("quiet namespaces beside the hostile one", &beside);
    probing.store(false, Ordering::Relaxed);
    let (answered, slowest, over_100ms, failed) = probes.await?;
    let p99 = |run: &Run| {
        let sorted = sorted_latencies(&run.updates);
        sorted.get(sorted.len().saturating_sub(1) * 99 / 100).copied().unwrap_or(0.0)
    };
    println!(
        "hostile writes sent: {writes}; quiet p99 beside / alone: {:.2}; replica RSS peak {:.1} MiB (chart limit 512); \
         probes: {answered} answered, slowest {slowest} ms, {over_100ms} over 100 ms, {failed} failed; \
         rollout places given back: {}; updates merged into queued ones: {}",
        p99(&beside) / p99(&alone).max(0.001),
        peak_rss_mib(pid).unwrap_or(0.0),
        // An empty f64 sum is -0.0.
        crate::scale::metric_sum(port, "reloader_rollout_places_given_back_total").await + 0.0,
        crate::metric(port, "reloader_skipped_total{reason=\"superseded\"}").await,
    );
    stop(&mut child).await;
    Ok(())
}

fn report(what: &str, run: &Run) {
    let latencies = sorted_latencies(&run.updates);
    println!(
        "{what}: {} observed, {}; lost {}, rolled twice {}",
        latencies.len(),
        summary(&latencies),
        run.lost,
        run.twice
    );
}

/// The hostile namespace's objects (each create tolerates what exists).
async fn hostile(client: &Client) -> anyhow::Result<()> {
    create_once(&Api::<Namespace>::all(client.clone()), json!({ "metadata": { "name": HOSTILE } })).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), HOSTILE);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), HOSTILE);
    let noise = "x".repeat(ANNOTATION_BYTES);
    // Patterns that cost the most to compile: a class of letters repeated, distinct each.
    let list = joined_within((0..).map(|i| format!("\\pL{{10}}a{i}")), 16 * 1024);
    let deployment = |name: String, configmap: String, annotations: serde_json::Value, replicas: u32, gate: bool| {
        let gates = if gate { json!([{ "conditionType": "example.com/never" }]) } else { json!([]) };
        json!({
            "metadata": { "name": name, "annotations": annotations },
            "spec": { "replicas": replicas, "selector": { "matchLabels": { "app": name } },
                "template": { "metadata": { "labels": { "app": name } },
                    "spec": { "readinessGates": gates, "containers": [{ "name": "app", "image": "registry.invalid/app:1",
                        "envFrom": [{ "configMapRef": { "name": configmap } }] }] } } }
        })
    };
    let mut objects = Vec::new();
    for i in 0..FLOODED {
        let configmap = format!("flood-{i}");
        objects.push((Some(json!({ "metadata": { "name": configmap }, "data": { "v": "0" } })), None));
        let annotations = json!({ "reloader.stakater.com/auto": "true", "reloader.stakater.com/notes": noise });
        objects.push((None, Some(deployment(format!("flooded-{i}"), configmap, annotations, 0, false))));
    }
    for i in 0..LISTS {
        let annotations = json!({ "configmap.reloader.stakater.com/reload": list.clone() });
        objects.push((None, Some(deployment(format!("patterns-{i}"), format!("flood-{i}"), annotations, 0, false))));
    }
    for i in 0..NEVER_READY {
        let annotations = json!({ "reloader.stakater.com/auto": "true" });
        objects.push((None, Some(deployment(format!("never-ready-{i}"), format!("flood-{i}"), annotations, 1, true))));
    }
    futures::stream::iter(objects)
        .map(|(configmap, deployment)| {
            let (configmaps, deployments) = (&configmaps, &deployments);
            async move {
                if let Some(object) = configmap {
                    create_once(configmaps, object).await?;
                }
                if let Some(object) = deployment {
                    create_once(deployments, object).await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// ConfigMap writes at [`FLOOD_PER_SECOND`] over the hostile ConfigMaps until told to stop;
/// returns how many were sent.
async fn flood(client: Client, flooding: Arc<AtomicBool>) -> anyhow::Result<u64> {
    let configmaps: Api<ConfigMap> = Api::namespaced(client, HOSTILE);
    let sent = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / FLOOD_PER_SECOND as f64));
    let mut n: u64 = 0;
    let in_flight = Arc::new(AtomicUsize::new(0));
    while flooding.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        // At most 64 writes out: an overloaded API server slows the flood, not the driver.
        if in_flight.load(Ordering::Relaxed) >= 64 {
            continue;
        }
        let (configmaps, sent, in_flight) = (configmaps.clone(), sent.clone(), in_flight.clone());
        in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let name = format!("flood-{}", n as usize % FLOODED);
            let patch = json!({ "data": { "v": n.to_string() } });
            if configmaps.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await.is_ok() {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    Ok(sent.load(Ordering::Relaxed))
}

/// `/readyz` and `/metrics` every 200 ms, each with a 1 s timeout (the kubelet's), until told
/// to stop: answered, the slowest in ms, those over 100 ms, failed.
async fn probe(port: u16, probing: Arc<AtomicBool>) -> (usize, u128, usize, usize) {
    let (mut answered, mut slowest, mut slow, mut failed) = (0, 0, 0, 0);
    while probing.load(Ordering::Relaxed) {
        for path in ["/readyz", "/metrics"] {
            let started = Instant::now();
            match tokio::time::timeout(Duration::from_secs(1), http_get(port, path)).await {
                Ok(Some(_)) => {
                    let took = started.elapsed().as_millis();
                    answered += 1;
                    slowest = slowest.max(took);
                    slow += usize::from(took > 100);
                }
                _ => failed += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (answered, slowest, slow, failed)
}

/// Items joined with commas while the text stays within `limit` bytes.
fn joined_within(items: impl Iterator<Item = String>, limit: usize) -> String {
    let mut text = String::new();
    for item in items {
        if text.len() + item.len() + 1 > limit {
            break;
        }
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(&item);
    }
    text
}
