//! Every promise at the size it is for (issue 48): N namespaces named like a platform's, each
//! with `kube-root-ca.crt`, 3 ConfigMaps, 3 Secrets and 2 Deployments, created once and kept
//! (in a control plane of their own, `CLUSTER_DIR=.cluster-scale`), then:
//!
//!     loadtest scale <namespaces> [populate] [one] [down] [fleet <mode>] ...
//!
//! - `one`: one replica with a plain install's flags: time to ready, RSS, checkpoint bytes,
//!   change -> patch p50/p99 at 25 and 100 changes/s and the checkpoint bytes sent meanwhile;
//! - `down`: 1,000 changes over random namespaces while no replica runs, then a start: every
//!   one acted on, none twice (from the Deployments' recorded hashes and generations);
//! - `fleet <whole|whole-server>`: 10 replicas over 16 shards: RSS of each, a SIGTERM under 100
//!   changes/s and a SIGKILL of 3 replicas at once under load (time until every shard is
//!   served again, changes lost and rolled twice).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use reloader_fleet::watch::DataHash;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::{
    Layout, Load, cpu_seconds, create_home, http_get, metric, rss_mib, run_updates, sorted_latencies, start_one,
    summary, wait_ready,
};

const LABEL: &str = "reloader-fleet.scale";
const CONFIGMAPS: [&str; 3] = [
    "application-settings-for-service-0000-v2",
    "application-settings-for-service-0001-v2",
    "feature-flags-for-payments-gateway-v2",
];
const SECRETS: [&str; 3] = [
    "application-credentials-for-service-0000-v2",
    "application-credentials-for-service-0001-v2",
    "tls-certificate-for-payments-gateway-v2",
];
const DEPLOYMENTS: [&str; 2] = ["payments-api-server-0", "payments-api-server-1"];
/// Changes made while no replica runs.
const WHILE_DOWN: usize = 1_000;
/// The fleet: replicas and shards.
const FLEET: usize = 10;
const FLEET_SHARDS: u32 = 16;

fn namespace(i: usize) -> String {
    format!("team-payments-production-{i:05}")
}

/// The first ConfigMap of every namespace, recorded by its first Deployment.
pub(crate) const LAYOUT: Layout = Layout {
    namespace,
    configmap: CONFIGMAPS[0],
    key: "version",
    hash_of: |version| {
        let data = configmap_data(CONFIGMAPS[0], version).into_iter().collect();
        DataHash::of_configmap(&data, &Default::default()).to_string()
    },
    env_var: "STAKATER_APPLICATION_SETTINGS_FOR_SERVICE_0000_V2_CONFIGMAP",
};

/// A ConfigMap's data: an application file and a version (what the changes set).
fn configmap_data(name: &str, version: &str) -> [(String, String); 2] {
    [
        ("application.yaml".to_string(), format!("server:\n  port: 8080\nlogging:\n  level: info\nservice: {name}\n")),
        ("version".to_string(), version.to_string()),
    ]
}

pub async fn scale(args: &[String]) -> anyhow::Result<()> {
    let usage = "usage: loadtest scale <namespaces> [populate] [one] [down] [fleet <whole|whole-server>]";
    let count: usize = args.first().context(usage)?.parse().context(usage)?;
    let client = Client::try_default().await?;
    let mut phases = args[1..].iter();
    while let Some(phase) = phases.next() {
        match phase.as_str() {
            "populate" => populate(&client, count).await?,
            "one" => one(&client, count).await?,
            "down" => down(&client, count).await?,
            "fleet" => fleet(&client, count, phases.next().context(usage)?).await?,
            _ => bail!(usage),
        }
    }
    Ok(())
}

/// Create what is missing, 64 namespaces at once (each create tolerates what exists).
pub(crate) async fn populate(client: &Client, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    create_home(client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let listed = namespaces.list_metadata(&ListParams::default().labels(&format!("{LABEL}=1"))).await?.items;
    let existing: std::collections::HashSet<String> = listed.into_iter().filter_map(|n| n.metadata.name).collect();
    let missing: Vec<usize> = (0..count).filter(|i| !existing.contains(&namespace(*i))).collect();
    println!("populate: {} of {count} namespaces to create", missing.len());
    // kube-controller-manager publishes `kube-root-ca.crt` into every namespace, but at this
    // size it falls hours behind: the same ConfigMap (its CA) is created here where missing.
    let root_ca = Api::<ConfigMap>::namespaced(client.clone(), "default").get("kube-root-ca.crt").await?;
    let root_ca = std::sync::Arc::new(json!({ "metadata": { "name": "kube-root-ca.crt" }, "data": root_ca.data }));
    let done = std::sync::atomic::AtomicUsize::new(0);
    let all: Vec<usize> =
        missing.iter().copied().chain((0..count).filter(|i| existing.contains(&namespace(*i)))).collect();
    futures::stream::iter(all)
        .map(|i| {
            let (client, done, root_ca, existing) = (client.clone(), &done, root_ca.clone(), &existing);
            async move {
                if !existing.contains(&namespace(i)) {
                    populate_one(&client, &namespace(i)).await?;
                }
                let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace(i));
                create_once(&configmaps, (*root_ca).clone()).await?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n % 5_000 == 0 {
                    println!("  {n} namespaces created ({:.0?}; {})", started.elapsed(), control_plane_memory());
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    println!("populate: {count} namespaces ready, {} created in {:.0?}", missing.len(), started.elapsed());
    println!("control plane: {}", control_plane_memory());
    Ok(())
}

/// Create an object, or leave the one that exists.
pub(crate) async fn create_once<K>(api: &Api<K>, object: serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    match api.create(&PostParams::default(), &serde_json::from_value(object)?).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

async fn populate_one(client: &Client, ns: &str) -> anyhow::Result<()> {
    create_once(
        &Api::<Namespace>::all(client.clone()),
        json!({ "metadata": { "name": ns, "labels": { LABEL: "1" } } }),
    )
    .await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for name in CONFIGMAPS {
        let data: serde_json::Map<String, serde_json::Value> =
            configmap_data(name, "0").into_iter().map(|(k, v)| (k, v.into())).collect();
        create_once(&configmaps, json!({ "metadata": { "name": name }, "data": data })).await?;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for name in SECRETS {
        let data = json!({ "username": "payments", "password": format!("{:016x}", DataHash::of_bytes(format!("{ns}/{name}").as_bytes()).short()) });
        create_once(&secrets, json!({ "metadata": { "name": name }, "stringData": data })).await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for (d, name) in DEPLOYMENTS.iter().enumerate() {
        let deployment = json!({
            "metadata": { "name": name, "annotations": { "reloader.stakater.com/auto": "true" } },
            "spec": { "replicas": 0, "selector": { "matchLabels": { "app": name } },
                "template": { "metadata": { "labels": { "app": name } },
                    "spec": { "containers": [{ "name": "api", "image": "registry.invalid/payments-api:1.42.0",
                        "envFrom": [{ "configMapRef": { "name": CONFIGMAPS[d] } }, { "secretRef": { "name": SECRETS[d] } }],
                        "volumeMounts": [{ "name": "tls", "mountPath": "/etc/tls" }] }],
                        "volumes": [{ "name": "tls", "secret": { "secretName": SECRETS[2] } }] } } }
        });
        create_once(&deployments, deployment).await?;
    }
    Ok(())
}

/// RSS of the control plane's kube-apiserver and etcd, from `$CLUSTER_DIR/state.json`.
fn control_plane_memory() -> String {
    let dir = std::env::var("CLUSTER_DIR").unwrap_or_else(|_| ".cluster".into());
    let state: serde_json::Value = std::fs::read_to_string(format!("{dir}/state.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let rss = |name: &str| {
        state["pids"][name].as_u64().and_then(|p| rss_mib(p as u32)).map_or("?".into(), |m| format!("{m:.0} MiB"))
    };
    format!("kube-apiserver RSS {}, etcd RSS {}", rss("kube-apiserver"), rss("etcd"))
}

/// The most resident memory the process has had (`VmHWM`).
pub(crate) fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The sum of every series of `name` (any labels).
pub(crate) async fn metric_sum(port: u16, name: &str) -> f64 {
    let body = http_get(port, "/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Start a replica with a plain install's flags and wait for it: the time to ready.
async fn start_default(r: usize, count: usize) -> anyhow::Result<(Child, u16, Duration)> {
    let started = Instant::now();
    let (child, port) = start_one(r, 1, count, "default").await?;
    wait_ready(&[port], 1, 1).await?;
    // wait_ready holds the fleet settled for 5 s: not part of the time to ready.
    Ok((child, port, started.elapsed().saturating_sub(Duration::from_secs(5))))
}

pub(crate) async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
}

/// One replica, a plain install's flags.
async fn one(client: &Client, count: usize) -> anyhow::Result<()> {
    println!("--- one replica, default flags, {count} namespaces");
    let (mut child, port, ready) = start_default(0, count).await?;
    let pid = child.id().unwrap_or(0);
    println!(
        "ready in {ready:.1?}: RSS {:.1} MiB (peak {:.1}), {} resources and {} workloads stored, checkpoint {:.0} KiB stored; {}",
        rss_mib(pid).unwrap_or(0.0),
        peak_rss_mib(pid).unwrap_or(0.0),
        metric(port, "reloader_store_objects{kind=\"resources\"}").await,
        metric(port, "reloader_store_objects{kind=\"workloads\"}").await,
        metric_sum(port, "reloader_checkpoint_stored_bytes").await / 1024.0,
        control_plane_memory()
    );
    for (rate, updates) in [(25, 750), (100, 3_000)] {
        let sent_before = metric(port, "reloader_checkpoint_bytes_sent_total").await;
        let saves_before = metric_sum(port, "reloader_checkpoint_saves_total").await;
        let cpu_before = cpu_seconds(pid).unwrap_or(0.0);
        let started = Instant::now();
        let load = Load { updates, rate: Some(rate), change: crate::Change::Data };
        let crate::Run { updates: all, twice, lost } = run_updates(client, count, load, &[port], LAYOUT).await?;
        let seconds = started.elapsed().as_secs_f64();
        let latencies = sorted_latencies(&all);
        let sent = metric(port, "reloader_checkpoint_bytes_sent_total").await - sent_before;
        let saves = metric_sum(port, "reloader_checkpoint_saves_total").await - saves_before;
        println!(
            "{rate} changes/s: {} of {updates} observed, {}; lost {lost}, rolled twice {twice}; CPU {:.2} s/s; checkpoint: {saves} saves, {:.0} KiB sent ({:.1} KiB/s)",
            latencies.len(),
            summary(&latencies),
            (cpu_seconds(pid).unwrap_or(0.0) - cpu_before) / seconds,
            sent / 1024.0,
            sent / 1024.0 / seconds
        );
    }
    println!(
        "RSS after the changes: {:.1} MiB (peak {:.1})",
        rss_mib(pid).unwrap_or(0.0),
        peak_rss_mib(pid).unwrap_or(0.0)
    );
    stop(&mut child).await;
    Ok(())
}

/// What the first Deployment of `ns` records for its ConfigMap, and its generation.
async fn recorded(client: &Client, ns: &str) -> anyhow::Result<(Option<String>, i64)> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns).get(DEPLOYMENTS[0]).await?;
    let value = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].env.as_ref()?.iter().find(|e| e.name == LAYOUT.env_var)?.value.clone());
    Ok((value, d.metadata.generation.unwrap_or(0)))
}

/// Generations of the first Deployment of `namespaces`, 32 read at once.
async fn generations(client: &Client, namespaces: &[String]) -> anyhow::Result<HashMap<String, (Option<String>, i64)>> {
    futures::stream::iter(namespaces.iter().cloned())
        .map(|ns| async move { anyhow::Ok((ns.clone(), recorded(client, &ns).await?)) })
        .buffer_unordered(32)
        .try_collect()
        .await
}

/// 1,000 changes while no replica runs, then a start.
async fn down(client: &Client, count: usize) -> anyhow::Result<()> {
    println!("--- {WHILE_DOWN} changes while no replica runs, {count} namespaces");
    let (mut child, _, _) = start_default(0, count).await?;
    stop(&mut child).await;
    let mut state: u64 =
        0x2545_F491_4F6C_DD1D ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut last: HashMap<String, String> = HashMap::new();
    let mut untouched = Vec::new();
    for i in 0..WHILE_DOWN * 2 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let ns = namespace((state % count as u64) as usize);
        if i % 2 == 1 {
            untouched.push(ns);
        } else {
            last.insert(ns, format!("down-{state:x}"));
        }
    }
    untouched.retain(|ns| !last.contains_key(ns));
    let changed: Vec<String> = last.keys().cloned().collect();
    let before = generations(client, &changed).await?;
    let before_untouched = generations(client, &untouched).await?;
    for (ns, value) in &last {
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .patch(LAYOUT.configmap, &PatchParams::default(), &Patch::Merge(json!({ "data": { "version": value } })))
            .await?;
    }
    let hash_of = |ns: &str| -> anyhow::Result<String> { Ok((LAYOUT.hash_of)(&last[ns])) };
    println!("{} changes made ({} namespaces) while down; starting", WHILE_DOWN, changed.len());
    let started = Instant::now();
    let (mut child, _, ready) = start_default(0, count).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let (lost, twice) = loop {
        let now = generations(client, &changed).await?;
        let mut lost = 0;
        let mut twice = 0;
        for ns in &changed {
            let (value, generation) = &now[ns];
            lost += usize::from(value.as_deref() != Some(hash_of(ns)?.as_str()));
            twice += usize::from(*generation > before[ns].1 + 1);
        }
        if lost == 0 || Instant::now() > deadline {
            break (lost, twice);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let acted = started.elapsed();
    let after_untouched = generations(client, &untouched).await?;
    let rolled_untouched = untouched.iter().filter(|ns| after_untouched[*ns].1 != before_untouched[*ns].1).count();
    println!(
        "after the start (ready in {ready:.1?}): every change acted on {acted:.1?} after the start; lost {lost}, rolled twice {twice}; \
         {rolled_untouched} of {} unchanged namespaces rolled (0 expected)",
        untouched.len()
    );
    stop(&mut child).await;
    if lost + twice + rolled_untouched > 0 {
        bail!("{lost} lost, {twice} rolled twice, {rolled_untouched} rolled for nothing");
    }
    Ok(())
}

/// 10 replicas over 16 shards (`whole`: cluster-wide watches; `whole-server`: filtered by the
/// API server's ShardedListAndWatch).
async fn fleet(client: &Client, count: usize, mode: &str) -> anyhow::Result<()> {
    println!("--- {FLEET} replicas, {FLEET_SHARDS} shards, {mode} watches, {count} namespaces");
    let started = Instant::now();
    let mut replicas: Vec<(Child, u16)> = Vec::new();
    // One after the other, each once the fleet before it has settled: ten initial lists of
    // 50,000 namespaces at once took this machine's kube-apiserver past 18 GiB.
    for r in 0..FLEET {
        replicas.push(crate::start_one_with(r, FLEET, count, mode, &[]).await?);
        let ports: Vec<u16> = replicas.iter().map(|(_, p)| *p).collect();
        wait_ready(&ports, r + 1, FLEET_SHARDS).await?;
    }
    let rss: Vec<String> = replicas
        .iter()
        .map(|(c, _)| {
            let pid = c.id().unwrap_or(0);
            format!("{:.0} (peak {:.0})", rss_mib(pid).unwrap_or(0.0), peak_rss_mib(pid).unwrap_or(0.0))
        })
        .collect();
    println!(
        "ready in {:.1?}; RSS per replica (MiB): {}; {}",
        started.elapsed(),
        rss.join(" "),
        control_plane_memory()
    );

    // A SIGTERM under 100 changes/s.
    let (served, run) = under_load(client, count, &mut replicas, 1, "TERM").await?;
    report("SIGTERM of 1 replica", served, &run);
    // Ten again (a rolling update's new pod), settled, before the crash.
    replicas.push(crate::start_one_with(FLEET - 1, FLEET, count, mode, &[]).await?);
    wait_ready(&replicas.iter().map(|(_, p)| *p).collect::<Vec<_>>(), FLEET, FLEET_SHARDS).await?;
    // A SIGKILL of 3 at once under load.
    let (served, run) = under_load(client, count, &mut replicas, 3, "KILL").await?;
    report("SIGKILL of 3 replicas at once", served, &run);
    for (child, _) in replicas.iter_mut() {
        stop(child).await;
    }
    Ok(())
}

fn report(what: &str, served: Duration, run: &crate::Run) {
    let latencies = sorted_latencies(&run.updates);
    let (sent, observed) =
        run.updates.lock().map(|u| (u.len(), u.values().filter(|u| u.latency.is_some()).count())).unwrap_or_default();
    println!(
        "{what}: every shard served again {served:.1?} after the signal; {observed} of {sent} changes observed ({}); lost {}, rolled twice {}; {}",
        summary(&latencies),
        run.lost,
        run.twice,
        control_plane_memory()
    );
}

/// Send 100 changes/s for 30 s; 5 s in, signal `victims` replicas; the time until the others
/// act on every shard, and the run.
async fn under_load(
    client: &Client,
    count: usize,
    replicas: &mut Vec<(Child, u16)>,
    victims: usize,
    signal: &str,
) -> anyhow::Result<(Duration, crate::Run)> {
    let gone: Vec<(Child, u16)> = replicas.drain(replicas.len() - victims..).collect();
    let ports: Vec<u16> = replicas.iter().map(|(_, p)| *p).chain(gone.iter().map(|(_, p)| *p)).collect();
    let load = Load { updates: 3_000, rate: Some(100), change: crate::Change::Data };
    let run = tokio::spawn({
        let client = client.clone();
        async move { run_updates(&client, count, load, &ports, LAYOUT).await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let signalled = Instant::now();
    for (child, _) in &gone {
        if let Some(pid) = child.id() {
            Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().await?;
        }
    }
    let survivors: Vec<u16> = replicas.iter().map(|(_, p)| *p).collect();
    let served = loop {
        let mut active = 0.0;
        for p in &survivors {
            active += metric(*p, "reloader_shards_active").await;
        }
        if active == f64::from(FLEET_SHARDS) {
            break signalled.elapsed();
        }
        if signalled.elapsed() > Duration::from_secs(180) {
            bail!("the survivors did not serve every shard within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let result = run.await??;
    for (mut child, _) in gone {
        let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    }
    Ok((served, result))
}
