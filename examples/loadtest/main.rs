//! Load test driver (run by `loadtest/run`): N namespaces x (3 ConfigMaps, 2 Secrets,
//! 2 Deployments), R controller processes, U ConfigMap updates; prints per-replica memory, open
//! connections to the API server, API calls during the updates, and update -> patch latency.
//!
//!     loadtest <namespaces> <replicas> <cluster|server|scoped|single> <updates> [rate|burst] [data|annotations]
//!
//! `single` is the baseline of the sharded runs: one replica, cluster-wide watches, one shard.
//! The rate is updates a second (25 unless given; `burst`: as fast as they can be sent, 64 in
//! flight). `annotations` changes only an annotation of each ConfigMap (S4, no-op): nothing may
//! be rolled, and the driver counts the Deployment writes it observes instead of timing them.

mod churn;
mod fanout;
mod noisy;
mod scale;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use reloader_fleet::watch::DataHash;
use serde_json::json;
use tokio::process::{Child, Command};

const LABEL: &str = "reloader-fleet.loadtest";
const HOME: &str = "lt-home";
/// Updates a second unless told otherwise (S3).
const DEFAULT_RATE: u64 = 25;
/// How long after the updates the settled RSS is read.
const SETTLE: Duration = Duration::from_secs(5);

/// What the updates change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    /// `data`: each update must roll `app-0` of its namespace once.
    Data,
    /// An annotation only: the data hash is unchanged, so nothing may be rolled.
    Annotation,
}

/// How the updates are sent.
#[derive(Clone, Copy)]
struct Load {
    updates: usize,
    /// Updates a second; `None`: as fast as they can be sent.
    rate: Option<u64>,
    change: Change,
}
/// The replicas' log filter: warnings, plus the lines that time each change's stages.
const STAGE_LOGS: &str = "warn,reloader_fleet::watch::watcher=debug,reloader_fleet::reload::engine=debug";

fn log_path(mode: &str, replicas: usize, r: usize) -> String {
    let log_dir = std::env::var("LOG_DIR").unwrap_or_else(|_| ".cluster/logs".into());
    format!("{log_dir}/loadtest-{mode}-{replicas}-{r}.log")
}

/// The fan-out scenario's namespace: one ConfigMap used by every Deployment in it.
const FANOUT: &str = "lt-fanout";

fn ns_name(i: usize) -> String {
    format!("lt-{i:04}")
}

/// Where the updates go: the namespaces, the ConfigMap changed in each, and the variable its
/// first Deployment records the change in.
#[derive(Clone, Copy)]
struct Layout {
    namespace: fn(usize) -> String,
    configmap: &'static str,
    /// The data key an update sets, and the hash of the ConfigMap's data with it set to a value.
    key: &'static str,
    hash_of: fn(&str) -> String,
    env_var: &'static str,
}

/// The load test's own namespaces (`lt-0000`...), each with `cfg-0` (one key, `v`) used by `app-0`.
const LAYOUT: Layout = Layout {
    namespace: ns_name,
    configmap: "cfg-0",
    key: "v",
    hash_of: |value| {
        DataHash::of_configmap(&[("v".to_string(), value.to_string())].into(), &Default::default()).to_string()
    },
    env_var: "STAKATER_CFG_0_CONFIGMAP",
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("soak") {
        let namespaces: usize = args.get(2).context("usage: loadtest soak <namespaces> <minutes>")?.parse()?;
        let minutes: u64 = args.get(3).context("usage: loadtest soak <namespaces> <minutes>")?.parse()?;
        return soak(namespaces, minutes).await;
    }
    if args.get(1).map(String::as_str) == Some("churn") {
        let usage = "usage: loadtest churn <namespaces> <per wave> [rounds]";
        let total: usize = args.get(2).context(usage)?.parse()?;
        let per_wave: usize = args.get(3).context(usage)?.parse()?;
        let rounds: usize = args.get(4).map_or(Ok(1), |r| r.parse())?;
        return churn::churn(total, per_wave, rounds).await;
    }
    if args.get(1).map(String::as_str) == Some("noisy") {
        return noisy::noisy(&args[2..]).await;
    }
    if args.get(1).map(String::as_str) == Some("scale") {
        return scale::scale(&args[2..]).await;
    }
    if args.get(1).map(String::as_str) == Some("fanout") {
        let usage = "usage: loadtest fanout <deployments> <updates> <replicas> [reloader args...]";
        let deployments: usize = args.get(2).context(usage)?.parse()?;
        let updates: usize = args.get(3).context(usage)?.parse()?;
        let replicas: usize = args.get(4).context(usage)?.parse()?;
        return fanout::fanout(deployments, updates, replicas, &args[5..]).await;
    }
    let usage = "usage: loadtest <namespaces> <replicas> <cluster|server|scoped|single> <updates> [rate|burst] [data|annotations]";
    if !(5..=7).contains(&args.len()) {
        bail!(usage);
    }
    let namespaces: usize = args[1].parse().context("namespaces")?;
    let replicas: usize = args[2].parse().context("replicas")?;
    let mode = args[3].clone();
    let updates: usize = args[4].parse().context("updates")?;
    let rate = match args.get(5).map(String::as_str) {
        None => Some(DEFAULT_RATE),
        Some("burst") => None,
        Some(n) => Some(n.parse::<u64>().ok().filter(|r| *r > 0).context(usage)?),
    };
    let change = match args.get(6).map(String::as_str) {
        None | Some("data") => Change::Data,
        Some("annotations") => Change::Annotation,
        Some(_) => bail!(usage),
    };
    let load = Load { updates, rate, change };
    if mode == "single" && replicas > 1 {
        println!("single (one shard, the baseline of the sharded runs) runs with one replica: skipped");
        return Ok(());
    }
    let client = Client::try_default().await?;

    populate(&client, namespaces).await?;
    for r in 0..replicas {
        // This run's stages only.
        let _ = std::fs::remove_file(log_path(&mode, replicas, r));
    }
    let mut controllers = start(replicas, namespaces, &mode).await?;
    let ports: Vec<u16> = controllers.iter().map(|(_, p)| *p).collect();
    wait_ready(&ports, replicas, shards_of(&mode)).await?;
    println!("fleet ready: {replicas} replica(s), {mode} watches, {namespaces} namespaces");

    let pids: Vec<u32> = controllers.iter().map(|(c, _)| c.id().unwrap_or(0)).collect();
    let cpu_before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p).unwrap_or(0.0)).collect();
    let before: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let all_updates = run_updates(&client, namespaces, load, &ports, LAYOUT).await?.updates;
    let latencies = sorted_latencies(&all_updates);
    let after: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;

    let server_port = server_port()?;
    let rss_after: Vec<f64> = pids.iter().map(|p| rss_mib(*p).unwrap_or(0.0)).collect();
    // What the allocator still holds of the updates' garbage is gone a few seconds later: what
    // a replica keeps is the settled figure.
    tokio::time::sleep(SETTLE).await;
    for (i, (child, port)) in controllers.iter().enumerate() {
        let pid = child.id().unwrap_or(0);
        let (rss, settled) = (rss_after[i], rss_mib(pid).unwrap_or(0.0));
        let conns = connections(pid, server_port).await;
        let diff =
            |verb: &str| after[i].get(verb).copied().unwrap_or(0.0) - before[i].get(verb).copied().unwrap_or(0.0);
        let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu_before[i];
        println!(
            "replica {i} (:{port}): RSS {rss:.1} MiB ({settled:.1} MiB {}s later), {conns} connections to the API server, {} namespaces; during updates: {cpu:.2} CPU s, {:.0} KiB of watch responses, {} PATCH, {} LIST, {} GET (+ {} lease LIST, {} lease PUT), {} objects received, {} of them foreign",
            SETTLE.as_secs(),
            metric(*port, "reloader_namespaces_owned").await,
            diff("watch-bytes") / 1024.0,
            diff("patch"),
            diff("list"),
            diff("get"),
            diff("lease-list"),
            diff("lease-update"),
            diff("received"),
            diff("foreign")
        );
    }
    if change == Change::Data {
        println!("update -> patch latency over {} updates: {}", latencies.len(), summary(&latencies));
        let logs: Vec<String> = (0..replicas).map(|r| log_path(&mode, replicas, r)).collect();
        print_stages(&all_updates, &logs);
    }
    if replicas > 1 {
        handoff(&client, namespaces, &mut controllers).await?;
    }
    for (child, _) in controllers.iter_mut() {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }
    Ok(())
}

/// Updates sent across a handoff, at 25/s: about 2 s of them before the signal.
const HANDOFF_UPDATES: usize = 200;

/// SIGTERM the last replica while updates go on and time until the others act on every
/// shard (Leases moved, stores loaded, checkpoints read); then the latency of the updates
/// sent across it, which is what a user sees of a handoff (a leaving replica keeps serving
/// its shards until their heirs have loaded them).
async fn handoff(client: &Client, namespaces: usize, controllers: &mut Vec<(Child, u16)>) -> anyhow::Result<()> {
    let Some((mut child, _)) = controllers.pop() else { return Ok(()) };
    let ports: Vec<u16> = controllers.iter().map(|(_, p)| *p).collect();
    let load = Load { updates: HANDOFF_UPDATES, rate: Some(25), change: Change::Data };
    let updates = tokio::spawn({
        let (client, ports) = (client.clone(), ports.clone());
        async move { run_updates(&client, namespaces, load, &ports, LAYOUT).await }
    });
    // The driver's watch lists the Deployments first (about a second at 2,000 namespaces).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let signalled = jiff::Timestamp::now();
    if let Some(pid) = child.id() {
        Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await?;
    }
    let deadline = started + Duration::from_secs(120);
    loop {
        let mut active = 0.0;
        for p in &ports {
            active += metric(*p, "reloader_shards_active").await;
        }
        if active == 16.0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the remaining replicas did not take over within 120 s");
        }
        // Every 10 ms: the poll's own granularity is part of the figure.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "SIGTERM handoff: the other replicas act on all 16 shards {:.1?} after the signal (sent at {signalled})",
        started.elapsed()
    );
    let latencies = sorted_latencies(&updates.await??.updates);
    println!("updates across the handoff ({} of {HANDOFF_UPDATES} observed): {}", latencies.len(), summary(&latencies));
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    Ok(())
}

/// The latencies of the updates observed, sorted.
fn sorted_latencies(updates: &Updates) -> Vec<f64> {
    let mut latencies: Vec<f64> =
        updates.lock().map(|u| u.values().filter_map(|u| u.latency).collect()).unwrap_or_default();
    latencies.sort_by(|a, b| a.total_cmp(b));
    latencies
}

/// "p50 .. ms, p99 .. ms, max .. ms" of sorted latencies in seconds (nearest rank).
fn summary(sorted: &[f64]) -> String {
    let pct =
        |p: f64| sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    format!("p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms", pct(0.5) * 1000.0, pct(0.99) * 1000.0, pct(1.0) * 1000.0)
}

/// Create what is missing: namespaces with 3 ConfigMaps, 2 Secrets, 2 Deployments (no pods).
async fn populate(client: &Client, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let listed = namespaces.list_metadata(&ListParams::default().labels(&format!("{LABEL}=1"))).await?.items;
    let existing = listed.iter().filter(|n| n.metadata.name.as_deref() != Some(FANOUT)).count();
    create_home(client).await?;
    futures::stream::iter(existing..count)
        .map(|i| {
            let client = client.clone();
            async move { populate_one(&client, &ns_name(i)).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    println!("{count} namespaces ready ({} created in {:.0?})", count.saturating_sub(existing), started.elapsed());
    Ok(())
}

/// The replicas' own namespace (checkpoints, Leases), if missing.
async fn create_home(client: &Client) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(HOME).await?.is_none() {
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(json!({ "metadata": { "name": HOME } }))?)
            .await?;
    }
    Ok(())
}

async fn populate_one(client: &Client, ns: &str) -> anyhow::Result<()> {
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &serde_json::from_value(json!({ "metadata": { "name": ns, "labels": { LABEL: "1" } } }))?)
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for c in 0..3 {
        cms.create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": format!("cfg-{c}") }, "data": { "v": "0" } }))?,
        )
        .await?;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for s in 0..2 {
        secrets
            .create(
                &pp,
                &serde_json::from_value(
                    json!({ "metadata": { "name": format!("sec-{s}") }, "stringData": { "v": "0" } }),
                )?,
            )
            .await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for d in 0..2 {
        let deployment = json!({
            "metadata": { "name": format!("app-{d}"), "annotations": { "reloader.stakater.com/auto": "true" } },
            "spec": { "replicas": 0, "selector": { "matchLabels": { "app": format!("app-{d}") } },
                "template": { "metadata": { "labels": { "app": format!("app-{d}") } },
                    "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1",
                        "envFrom": [{ "configMapRef": { "name": format!("cfg-{d}") } }, { "secretRef": { "name": format!("sec-{d}") } }] }] } } }
        });
        deployments.create(&pp, &serde_json::from_value(deployment)?).await?;
    }
    Ok(())
}

async fn start(replicas: usize, namespaces: usize, mode: &str) -> anyhow::Result<Vec<(Child, u16)>> {
    let mut out = Vec::new();
    for r in 0..replicas {
        out.push(start_one(r, replicas, namespaces, mode).await?);
    }
    Ok(out)
}

/// Start replica `r` of `replicas` (its log is appended to, so a restarted replica keeps one).
async fn start_one(r: usize, replicas: usize, namespaces: usize, mode: &str) -> anyhow::Result<(Child, u16)> {
    start_one_with(r, replicas, namespaces, mode, &[]).await
}

/// [`start_one`] with `extra` arguments after the scenario's own.
async fn start_one_with(
    r: usize,
    replicas: usize,
    namespaces: usize,
    mode: &str,
    extra: &[String],
) -> anyhow::Result<(Child, u16)> {
    let binary = std::env::var("RELOADER_BIN").unwrap_or_else(|_| "target/release/reloader".into());
    {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut args = vec![format!("--metrics-addr=127.0.0.1:{port}")];
        // `default`: the flags a plain install runs with (one shard, the whole cluster).
        if mode != "default" {
            args.push(format!("--shards={}", shards_of(mode)));
        }
        if replicas > 1 {
            args.extend(["--enable-ha".to_string(), "--leader-election-retry-period=1s".to_string()]);
        }
        match mode {
            "scoped" => {
                args.push(format!("--namespaces={}", (0..namespaces).map(ns_name).collect::<Vec<_>>().join(",")))
            }
            // The scenario selects its own namespaces (`extra`), or watches the whole cluster.
            "churn" | "default" | "whole" => {}
            // The whole cluster, filtered by the API server by shard.
            "whole-server" => args.push("--shard-placement=fnv-ranges".into()),
            // Cluster-wide watches the API server filters by shard (ShardedListAndWatch).
            "server" => args.extend([format!("--namespace-selector={LABEL}=1"), "--shard-placement=fnv-ranges".into()]),
            _ => args.push(format!("--namespace-selector={LABEL}=1")),
        }
        // JSON logs with the stages of each change (read by `print_stages`).
        args.push("--log-format=json".into());
        args.extend(extra.iter().cloned());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log_path(mode, replicas, r))?;
        let child = Command::new(&binary)
            .args(&args)
            .env("POD_NAME", format!("lt-replica-{r}"))
            .env("POD_NAMESPACE", HOME)
            .env("HEALTH_ADDR", "127.0.0.1:0")
            // Several replicas on one machine: no fixed data-view port either.
            .env("ADMIN_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", std::env::var("LOADTEST_LOG").unwrap_or_else(|_| STAGE_LOGS.into()))
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {binary}"))?;
        Ok((child, port))
    }
}

/// The soak: two replicas, 10 changes/s to `cfg-0` of the namespaces in turn for `minutes`,
/// a SIGTERM (and restart) of one replica every 5 minutes, RSS, open file descriptors and
/// connections sampled every minute. At the end every namespace's `app-0` must record its
/// last value: none lost.
async fn soak(namespaces: usize, minutes: u64) -> anyhow::Result<()> {
    const RATE: u64 = 10;
    let client = Client::try_default().await?;
    populate(&client, namespaces).await?;
    let mut controllers = start(2, namespaces, "cluster").await?;
    wait_ready(&controllers.iter().map(|(_, p)| *p).collect::<Vec<_>>(), 2, 16).await?;
    let server_port = server_port()?;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let started = Instant::now();
    let mut last_value: HashMap<String, String> = HashMap::new();
    let mut next = Instant::now();
    let (mut sent, mut minute, mut restarts) = (0u64, 0u64, 0usize);
    println!("soak: {namespaces} namespaces, 2 replicas, {RATE} changes/s for {minutes} min, a SIGTERM every 5 min");
    println!("{:>4} {:>8} {:>22} {:>14} {:>14}", "MIN", "CHANGES", "RSS MiB (r0 / r1)", "FDS", "CONNECTIONS");
    while started.elapsed() < Duration::from_secs(minutes * 60) {
        let ns = ns_name((sent % namespaces as u64) as usize);
        let value = format!("r{run}-s{sent}");
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .patch("cfg-0", &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": value } })))
            .await?;
        last_value.insert(ns, value);
        sent += 1;
        next += Duration::from_millis(1000 / RATE);
        tokio::time::sleep_until(next.into()).await;
        let now_minute = started.elapsed().as_secs() / 60;
        if now_minute > minute {
            minute = now_minute;
            let mut cols = (Vec::new(), Vec::new(), Vec::new());
            for (child, _) in &controllers {
                let pid = child.id().unwrap_or(0);
                cols.0.push(format!("{:.1}", rss_mib(pid).unwrap_or(0.0)));
                cols.1.push(std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0).to_string());
                cols.2.push(connections(pid, server_port).await.to_string());
            }
            println!(
                "{minute:>4} {sent:>8} {:>22} {:>14} {:>14}",
                cols.0.join(" / "),
                cols.1.join(" / "),
                cols.2.join(" / ")
            );
            if minute % 5 == 0 {
                let r = restarts % 2;
                let (mut child, _) = controllers.remove(r);
                if let Some(pid) = child.id() {
                    Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await?;
                }
                let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
                controllers.insert(r, start_one(r, 2, namespaces, "cluster").await?);
                restarts += 1;
            }
        }
    }
    // None lost: every namespace's app-0 ends up recording the last value of its cfg-0.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut missing = last_value.len();
    while Instant::now() < deadline {
        missing = 0;
        for (ns, value) in &last_value {
            let hash =
                DataHash::of_configmap(&[("v".to_string(), value.clone())].into(), &Default::default()).to_string();
            let d = Api::<Deployment>::namespaced(client.clone(), ns).get("app-0").await?;
            let recorded = d.spec.and_then(|s| s.template.spec).and_then(|s| {
                s.containers[0].env.as_ref()?.iter().find(|e| e.name == "STAKATER_CFG_0_CONFIGMAP")?.value.clone()
            });
            missing += usize::from(recorded.as_deref() != Some(hash.as_str()));
        }
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("soak done: {sent} changes, {restarts} SIGTERMs; namespaces not recording their last value: {missing}");
    for (child, _) in controllers.iter_mut() {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }
    if missing > 0 {
        bail!("{missing} namespaces lost their last change");
    }
    Ok(())
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await.ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    body.contains(" 200 ").then(|| body.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Shards of a run: 16, or 1 for `single` (cluster-wide watches, no shards: the baseline) and
/// `default` (no flag: one).
fn shards_of(mode: &str) -> u32 {
    if mode == "single" || mode == "default" { 1 } else { 16 }
}

async fn wait_ready(ports: &[u16], replicas: usize, shards: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let (floor, ceil) = (shards / replicas as u32, shards.div_ceil(replicas as u32));
    let mut settled_since: Option<Instant> = None;
    loop {
        let mut ready = 0;
        let mut balanced = true;
        let mut total = 0;
        for p in ports {
            if http_get(*p, "/readyz").await.is_some() {
                ready += 1;
            }
            let active = metric(*p, "reloader_shards_active").await as u32;
            balanced &= active == floor || active == ceil;
            total += active;
        }
        // Settled: every replica has taken up its fair share, and has stayed so for 5 s (a
        // fleet moving shards during the updates would measure the handoff, not the steady state).
        if ready == ports.len() && balanced && total == shards {
            let since = *settled_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(5) {
                return Ok(());
            }
        } else {
            settled_since = None;
        }
        if Instant::now() > deadline {
            bail!("the fleet did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn metric(port: u16, name: &str) -> f64 {
    let body = http_get(port, "/metrics").await.unwrap_or_default();
    body.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok())).unwrap_or(0.0)
}

async fn api_calls(port: u16) -> HashMap<String, f64> {
    let body = http_get(port, "/metrics").await.unwrap_or_default();
    let mut by_verb = HashMap::new();
    for line in body.lines() {
        let value: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        // Objects the watches decoded, and those of other replicas' shards among them.
        for (series, key) in
            [("reloader_events_received_total{", "received"), ("reloader_watch_events_foreign_total", "foreign")]
        {
            if line.starts_with(series) {
                *by_verb.entry(key.to_string()).or_insert(0.0) += value;
            }
        }
        if line.starts_with("reloader_api_response_bytes_total{request=\"watch\"}") {
            *by_verb.entry("watch-bytes".to_string()).or_insert(0.0) += value;
        }
        if !line.starts_with("reloader_api_requests_total{") {
            continue;
        }
        let verb = line.split("verb=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?").to_string();
        // Lease polling is the fleet's heartbeat, not work caused by the changes.
        let verb = if line.contains("resource=\"leases\"") { format!("lease-{verb}") } else { verb };
        *by_verb.entry(verb).or_insert(0.0) += value;
    }
    by_verb
}

/// One update's times on the wall clock: sent, PATCH returned, patch observed by the driver.
#[derive(Clone, Debug, Default)]
struct Update {
    sent: Option<jiff::Timestamp>,
    returned: Option<jiff::Timestamp>,
    observed: Option<jiff::Timestamp>,
    /// From sending the PATCH to observing the Deployment patch.
    latency: Option<f64>,
}

type Updates = Arc<Mutex<HashMap<(String, String), Update>>>;

/// Update `cfg-0` of random namespaces at a steady rate; return each update's times, keyed
/// by namespace and the hash `app-0` records for it, as seen by a watch on Deployments (which
/// has finished its initial list before the first update leaves: an update observed only in
/// that list would count the list's time as latency).
async fn run_updates(
    client: &Client,
    namespaces: usize,
    load: Load,
    ports: &[u16],
    layout: Layout,
) -> anyhow::Result<Run> {
    let Load { updates, rate, change } = load;
    let all: Updates = Arc::default();
    let pending: Arc<Mutex<HashMap<(String, String), Instant>>> = Arc::default();
    // Deployments whose generation grew after the initial list: rollouts (S4 expects none).
    let rolled: Arc<Mutex<HashMap<(String, String), i64>>> = Arc::default();
    // Updates a later update of the same ConfigMap overtook before their own patch was seen:
    // the controller acts on the latest data (level-triggered), so theirs is never recorded.
    let coalesced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Rollouts of a Deployment that recorded the same value before and after.
    let repeated = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (listed_tx, listed) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn({
        let (pending, all, client, rolled) = (pending.clone(), all.clone(), client.clone(), rolled.clone());
        let (coalesced, repeated) = (coalesced.clone(), repeated.clone());
        async move {
            let api: Api<Deployment> = Api::all(client);
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            let mut listed_tx = Some(listed_tx);
            // Per Deployment: its generation and the value it records, as last seen.
            let mut generations: HashMap<(String, String), (i64, Option<String>)> = HashMap::new();
            while let Some(Ok(event)) = stream.next().await {
                let (d, initial) = match event {
                    watcher::Event::Apply(d) => (d, false),
                    watcher::Event::InitApply(d) => (d, true),
                    watcher::Event::InitDone => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let ns = d.metadata.namespace.clone().unwrap_or_default();
                let id = (ns.clone(), d.metadata.name.clone().unwrap_or_default());
                let generation = d.metadata.generation.unwrap_or(0);
                let value = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|s| {
                    s.containers[0].env.as_ref()?.iter().find(|e| e.name == layout.env_var)?.value.clone()
                });
                let before = generations.insert(id.clone(), (generation, value.clone()));
                let grew = before.as_ref().is_some_and(|(g, _)| generation > *g);
                if grew && !initial {
                    if let Ok(mut rolled) = rolled.lock() {
                        *rolled.entry(id).or_insert(0) += 1;
                    }
                    // Rolled again with the value it recorded already: twice for one change.
                    if before.is_some_and(|(_, v)| v.is_some() && v == value) {
                        repeated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                let Some(value) = value else { continue };
                let key = (ns, value);
                let started = pending.lock().ok().and_then(|mut p| {
                    let started = p.remove(&key)?;
                    let before = p.len();
                    p.retain(|(ns, _), sent| *ns != key.0 || *sent > started);
                    coalesced.fetch_add(before - p.len(), std::sync::atomic::Ordering::Relaxed);
                    Some(started)
                });
                if let Some(started) = started
                    && let Ok(mut all) = all.lock()
                    && let Some(update) = all.get_mut(&key)
                {
                    update.latency = Some(started.elapsed().as_secs_f64());
                    update.observed = Some(jiff::Timestamp::now());
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(120), listed).await.context("the Deployment watch did not list")??;
    let received_before = received(ports).await;
    // Open loop: updates leave on schedule whatever the latency of earlier ones.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
    let mut sends = Vec::with_capacity(updates);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    // Values unique to this run: a rerun on the same namespaces must change every ConfigMap
    // (the same value again is a no-op at the API server: no event, nothing to reload).
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let interval = rate.map(|r| Duration::from_micros(1_000_000 / r));
    let sending = Instant::now();
    let mut next = Instant::now();
    for u in 0..updates {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let ns = (layout.namespace)((state % namespaces as u64) as usize);
        let value = format!("r{run}-u{u}");
        let hash = (layout.hash_of)(&value);
        let key = (ns.clone(), hash);
        let permit = in_flight.clone().acquire_owned().await?;
        if let (Ok(mut p), Ok(mut all)) = (pending.lock(), all.lock()) {
            if change == Change::Data {
                p.insert(key.clone(), Instant::now());
            }
            all.insert(key.clone(), Update { sent: Some(jiff::Timestamp::now()), ..Update::default() });
        }
        let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
        let all = all.clone();
        let body = match change {
            Change::Data => json!({ "data": { layout.key: value } }),
            Change::Annotation => json!({ "metadata": { "annotations": { "loadtest/touched": value } } }),
        };
        sends.push(tokio::spawn(async move {
            let _permit = permit;
            let result = api.patch(layout.configmap, &PatchParams::default(), &Patch::Merge(body)).await;
            if let Ok(mut all) = all.lock()
                && let Some(update) = all.get_mut(&key)
            {
                update.returned = Some(jiff::Timestamp::now());
            }
            result
        }));
        if let Some(interval) = interval {
            next += interval;
            tokio::time::sleep_until(next.into()).await;
        }
    }
    for send in sends {
        send.await??;
    }
    let target = rate.map_or("as fast as they go".to_string(), |r| format!("target {r}/s"));
    println!("sent {updates} updates in {:.1?} ({target})", sending.elapsed());
    let deadline = Instant::now() + Duration::from_secs(120);
    while pending.lock().map(|p| !p.is_empty()).unwrap_or(false) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if change == Change::Annotation {
        // Every update reached a watch; a wrong rollout would follow within milliseconds, so
        // a second more is ample for the driver's watch to see it.
        while received(ports).await - received_before < updates as f64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seen = received(ports).await - received_before;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rollouts: i64 = rolled.lock().map(|r| r.values().sum()).unwrap_or(0);
        println!(
            "no-op: {updates} annotation-only updates, {seen} received by their owners' watches, {rollouts} Deployment rollouts observed (0 expected)"
        );
    }
    watch.abort();
    let coalesced = coalesced.load(std::sync::atomic::Ordering::Relaxed);
    if coalesced > 0 {
        println!(
            "{coalesced} updates were overtaken by a later update of the same ConfigMap before their patch (one rollout for both, with the later data)"
        );
    }
    let missing = pending.lock().map(|p| p.len()).unwrap_or(0);
    if missing > 0 {
        println!("WARNING: {missing} updates were not observed as patches within 120 s");
    }
    let twice = repeated.load(std::sync::atomic::Ordering::Relaxed);
    if twice > 0 {
        println!("WARNING: {twice} rollouts of a Deployment recorded a value it recorded already (rolled twice)");
    }
    Ok(Run { updates: all, twice, lost: missing })
}

/// What a run of updates found: each update's times, rollouts of a value recorded already,
/// and updates never recorded (nor overtaken by a later one).
struct Run {
    updates: Updates,
    twice: usize,
    lost: usize,
}

/// Objects of their own shards the replicas' watches have received so far, summed (each
/// update is one, whatever the watch mode).
async fn received(ports: &[u16]) -> f64 {
    let calls = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let count = |c: &HashMap<String, f64>, key: &str| c.get(key).copied().unwrap_or(0.0);
    calls.iter().map(|c| count(c, "received") - count(c, "foreign")).sum()
}

/// When each replica's log (JSON) says a change of `cfg-0` was received by the watches,
/// decided by the engine and written, by namespace and hash.
fn controller_times(logs: &[String]) -> HashMap<(String, String), [Option<jiff::Timestamp>; 3]> {
    let mut times: HashMap<(String, String), [Option<jiff::Timestamp>; 3]> = HashMap::new();
    for path in logs {
        let Ok(text) = std::fs::read_to_string(path) else { continue };
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let field = |name: &str| {
                entry["fields"][name].as_str().or_else(|| entry["span"][name].as_str()).unwrap_or_default().to_string()
            };
            // `resource` is "ConfigMap <namespace>/<name>" (a span's own `name` would shadow a
            // `name` field in the JSON).
            let resource = field("resource");
            let namespace_of = |resource: &str| {
                resource.trim_start_matches("ConfigMap ").split('/').next().unwrap_or_default().to_string()
            };
            let (stage, namespace) = match entry["fields"]["message"].as_str() {
                Some("resource changed") if entry["fields"]["name"] == "cfg-0" => {
                    (0, entry["fields"]["namespace"].as_str().unwrap_or_default().to_string())
                }
                Some("change decided") if resource.ends_with("/cfg-0") => (1, namespace_of(&resource)),
                Some("workload reloaded") if resource.ends_with("/cfg-0") => (2, namespace_of(&resource)),
                _ => continue,
            };
            let Some(at) = entry["timestamp"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else {
                continue;
            };
            // The first of each stage (a Deployment `app-0` write comes first, `app-1` uses cfg-1).
            let slot = &mut times.entry((namespace, field("hash"))).or_default()[stage];
            if slot.is_none_or(|t| at < t) {
                *slot = Some(at);
            }
        }
    }
    times
}

/// Print where the time of the updates goes: per stage p50 and p99 over all updates, and the
/// stages of the slowest 1%.
fn print_stages(updates: &Updates, logs: &[String]) {
    const STAGES: [&str; 5] = [
        "PATCH returned",
        "event received by a watch",
        "change decided",
        "Deployment written",
        "write observed by the driver",
    ];
    let controller = controller_times(logs);
    let Ok(updates) = updates.lock() else { return };
    let mut per_stage: Vec<Vec<f64>> = vec![Vec::new(); STAGES.len()];
    let mut rows: Vec<(f64, String)> = Vec::new();
    for (key, update) in updates.iter() {
        let [received, decided, written] = controller.get(key).copied().unwrap_or_default();
        let marks = [update.sent, update.returned, received, decided, written, update.observed];
        let ms = |a: Option<jiff::Timestamp>, b: Option<jiff::Timestamp>| -> Option<f64> {
            Some((b?.as_nanosecond() - a?.as_nanosecond()) as f64 / 1e6)
        };
        let steps: Vec<Option<f64>> = marks.windows(2).map(|w| ms(w[0], w[1])).collect();
        for (i, step) in steps.iter().enumerate() {
            if let Some(step) = step {
                per_stage[i].push(*step);
            }
        }
        if let Some(total) = update.latency {
            let shown: Vec<String> =
                steps.iter().map(|s| s.map(|v| format!("{v:.0}")).unwrap_or_else(|| "?".into())).collect();
            rows.push((total, format!("{:.0} ms = {} ({}/cfg-0)", total * 1000.0, shown.join(" + "), key.0)));
        }
    }
    println!("stage (from the previous one)       p50       p99      max   [wall clock: driver and replica logs]");
    for (name, values) in STAGES.iter().zip(per_stage.iter_mut()) {
        values.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| values.get(((values.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied();
        let show = |v: Option<f64>| v.map(|v| format!("{v:.1} ms")).unwrap_or_else(|| "-".into());
        println!("  {name:<32} {:>9} {:>9} {:>9}", show(pct(0.5)), show(pct(0.99)), show(values.last().copied()));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("slowest updates, ms per stage ({}):", STAGES.join(" + "));
    for (_, row) in rows.iter().take((rows.len() / 100).max(3)) {
        println!("  {row}");
    }
}

/// User and system CPU time of a process so far (from /proc; the kernel counts in 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn server_port() -> anyhow::Result<u16> {
    let path = std::env::var("KUBECONFIG").context("KUBECONFIG")?;
    let text = std::fs::read_to_string(path)?;
    let line = text.lines().find(|l| l.trim_start().starts_with("server:")).context("server line")?;
    line.rsplit(':').next().and_then(|p| p.trim().parse().ok()).context("server port")
}

/// Established TCP connections from `pid` to the API server port, counted with `ss`.
async fn connections(pid: u32, port: u16) -> usize {
    let Ok(out) = Command::new("ss").args(["-tnpH", "state", "established"]).output().await else { return 0 };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")) && l.contains(&format!("127.0.0.1:{port} ")))
        .count()
}
