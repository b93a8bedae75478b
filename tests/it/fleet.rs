//! Several `reloader` processes sharing 16 shards on the real API server: every namespace is
//! served by exactly one replica, and no change is lost or applied twice when a replica stops
//! gracefully or is killed.

use crate::support;

use std::time::Duration;

use crate::support::controller::{
    Controller, start_fleet_replica as start, start_fleet_replica_via as start_via,
    start_fleet_replica_with as start_with,
};
use crate::support::fixtures::{
    Kind, KindExt, Workload, cm_hash, create_configmap, create_namespace, delete_namespaces, generation,
    patch_configmap,
};
use crate::support::fleet::{balanced, served_namespaces_n, update_all};
use crate::support::proxy::{Proxy, api_server_addr, kubeconfig_via};
use crate::support::scenario::Ctx;
use crate::support::{wait_for, with_temp_ns};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::{WatchStreamExt, watcher};
use reloader_fleet::lease::{LEAVING_ANNOTATION, ROLE_LABEL, WARM_ANNOTATION};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;
use tokio::time::Instant;

const NAMESPACES: usize = 12;

#[tokio::test]
async fn a_fleet_serves_every_namespace_once_across_graceful_stops_and_crashes() {
    with_temp_ns("fleet", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;

        let a = start(&home, &format!("{home}-a"), &label).await;
        let b = start(&home, &format!("{home}-b"), &label).await;
        let c = start(&home, &format!("{home}-c"), &label).await;
        wait_for("16 shards balanced across 3 replicas", || async { balanced(&[&a, &b, &c]).await.then_some(()) })
            .await;
        // Every replica's /shards agrees on the holders: never two holders for a shard, and once
        // settled (no shard between owners) exactly one.
        let held_by = wait_for("every shard held here by exactly one replica", || async {
            let mut held_by: Vec<Vec<String>> = vec![Vec::new(); 16];
            for ctl in [&a, &b, &c] {
                let body: serde_json::Value = serde_json::from_str(&ctl.get("/shards").await).expect("/shards is JSON");
                assert_eq!(body["ring"]["shards"], 16);
                assert!(body.get("yielding_to").is_some_and(serde_json::Value::is_null), "one ring: {body}");
                for shard in body["shards"].as_array().expect("shards") {
                    if shard["held_here"] == true {
                        let id = shard["id"].as_u64().expect("id") as usize;
                        held_by[id].push(body["identity"].as_str().unwrap_or_default().to_string());
                        assert_eq!(shard["holder"], body["identity"], "a replica holds a shard on record");
                    }
                }
            }
            assert!(held_by.iter().all(|h| h.len() <= 1), "a shard held by two replicas: {held_by:?}");
            held_by.iter().all(|h| h.len() == 1).then_some(held_by)
        })
        .await;

        // The command for people shows the same holders.
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
            // No --shards: the count is read from the Leases.
            .args([&format!("--namespace-selector={label}"), "fleet", "status"])
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("POD_NAMESPACE", &home)
            .output()
            .await
            .expect("run reloader fleet status");
        let table = String::from_utf8_lossy(&output.stdout);
        println!("{table}");
        assert!(output.status.success(), "fleet status failed: {}", String::from_utf8_lossy(&output.stderr));
        assert!(table.starts_with("SHARD"), "only the table on stdout: {table}");
        assert!(output.stderr.is_empty(), "no log lines beside the table: {}", String::from_utf8_lossy(&output.stderr));
        for (shard, holders) in held_by.iter().enumerate() {
            let line = table.lines().find(|l| l.split_whitespace().next() == Some(&shard.to_string())).expect("a line per shard");
            assert!(line.contains(&holders[0]), "shard {shard}: {line}");
        }
        let column = |line: &str, n: usize| line.split_whitespace().nth(n).map(str::to_string);
        let counted: usize = table.lines().skip(1).take(16).filter_map(|l| column(l, 4)?.parse::<usize>().ok()).sum();
        assert_eq!(counted, NAMESPACES, "every test namespace counted in its shard");
        for line in table.lines().skip(1).take(16) {
            let age = column(line, 5).unwrap_or_default();
            assert!(age.strip_suffix('s').is_some_and(|n| n.parse::<u64>().is_ok()), "each shard's checkpoint age: {line}");
        }
        let members: Vec<&str> = table.lines().skip_while(|l| !l.starts_with("MEMBER")).skip(1).collect();
        assert_eq!(members.len(), 3, "a line per member: {table}");
        assert!(members.iter().all(|l| l.ends_with("shards=16,vnodes=512,hashring-xxh3-64-v1")), "{table}");

        // explain names the shard and the replica serving a namespace, as the Leases say.
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
            .args(["explain", "deployment/web", "-n", &namespaces[0], "-o", "json"])
            .args([format!("--namespace-selector={label}"), format!("--leader-election-namespace={home}")])
            .env("KUBECONFIG", support::kubeconfig_path())
            .output()
            .await
            .expect("run reloader explain");
        assert!(output.status.success(), "explain failed: {}", String::from_utf8_lossy(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("explain prints JSON");
        let shard = reloader_fleet::shard::Ring::new(16).expect("ring").shard_of(&namespaces[0]);
        assert_eq!(report["serving"]["shard"], shard);
        assert_eq!(report["serving"]["replica"], held_by[shard as usize][0].as_str(), "{report:#}");
        assert!(report["serving"]["checkpoint_saved_seconds_ago"].is_u64(), "the shard's checkpoint age: {report:#}");
        assert_eq!(report["pairs"][0]["reloads"], true, "{report:#}");
        wait_for("every test namespace owned by exactly one replica", || async {
            let mut owned = 0.0;
            for c in [&a, &b, &c] {
                owned += c.metric("reloader_namespaces_owned").await;
            }
            (owned == NAMESPACES as f64).then_some(())
        })
        .await;
        let steady = update_all(&client, &namespaces, "1").await;

        // Graceful stop: its shards move and the next change is served once. The others load
        // them from what their cluster-wide watches kept (the standby): no watch starts again.
        let watches_started = "reloader_watch_streams_started_total";
        let before_stop = (a.metric(watches_started).await, b.metric(watches_started).await);
        c.stop().await;
        wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
        assert_eq!(
            (a.metric(watches_started).await, b.metric(watches_started).await),
            before_stop,
            "gained shards are loaded without relisting a watch"
        );
        let after_stop = update_all(&client, &namespaces, "2").await;

        // Crash: the shards move once the Leases expire; a change made meanwhile is not lost.
        drop(b);
        let mut before = Vec::new();
        for ns in &namespaces {
            before.push(generation(&client, ns, Kind::Deployment, "web").await);
            patch_configmap(&client, ns, "cm", json!({ "data": { "k": "3" } })).await;
        }
        let hash = cm_hash(&[("k", "3")]);
        for ns in &namespaces {
            Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars)
                .wait_reloaded(Kind::Deployment, "web", Cm, "cm", &hash)
                .await;
        }
        for (ns, before) in namespaces.iter().zip(before) {
            assert_eq!(generation(&client, ns, Kind::Deployment, "web").await, before + 1, "{ns} after the crash");
        }
        let after_crash = update_all(&client, &namespaces, "4").await;
        println!("{NAMESPACES} namespaces served in {steady:?} (3 replicas), {after_stop:?} (after a stop), {after_crash:?} (after a crash)");
        a.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

/// `NAMESPACES` namespaces labelled for this test, each with ConfigMap `cm` used by an auto
/// Deployment `web`; returns the label selector and the names.
async fn served_namespaces(client: &kube::Client, home: &str) -> (String, Vec<String>) {
    served_namespaces_n(client, home, NAMESPACES).await
}

#[tokio::test]
async fn cronjobs_and_jobs_are_served_once_per_change_across_a_sigterm() {
    with_temp_ns("fleet-kinds", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        for ns in &namespaces {
            Workload::new(Kind::CronJob, "nightly").auto().env_from_configmap("cm").create(&client, ns).await;
            Workload::new(Kind::Job, "batch").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let a = start(&home, &format!("{home}-a"), &label).await;
        let b = start(&home, &format!("{home}-b"), &label).await;
        wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
        let mut b = Some(b);
        let ctx = |ns: &String| Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        let jobs_of = |ns: String| {
            let client = client.clone();
            async move {
                let jobs = Kind::Job.api(&client, &ns).list(&Default::default()).await.expect("list Jobs");
                let owned = jobs.items.iter().filter(|j| {
                    j.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|r| r.name == "nightly"))
                });
                owned.count()
            }
        };
        for (round, value) in ["1", "2"].into_iter().enumerate() {
            if round == 1
                && let Some(b) = b.take()
            {
                b.stop().await;
                wait_for("a to hold every shard", || async {
                    (a.metric("reloader_shards_active").await == 16.0).then_some(())
                })
                .await;
            }
            update_all(&client, &namespaces, value).await;
            for ns in &namespaces {
                ctx(ns).wait_reloaded(Kind::Job, "batch", Cm, "cm", &cm_hash(&[("k", value)])).await;
                wait_for(&format!("CronJob nightly in {ns} to have {} Jobs", round + 1), || async {
                    let count = jobs_of(ns.clone()).await;
                    assert!(count <= round + 1, "{ns}: {count} Jobs for {} changes", round + 1);
                    (count == round + 1).then_some(())
                })
                .await;
            }
        }
        a.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

#[tokio::test]
async fn a_replica_cut_off_from_the_api_server_stops_acting_before_another_takes_over() {
    with_temp_ns("fleet-cut", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        let proxy = Proxy::start(api_server_addr()).await;
        let via_proxy = kubeconfig_via(proxy.addr, &format!("{home}-cut"));
        let a = start(&home, &format!("{home}-a"), &label).await;
        let cut = start_via(&home, &format!("{home}-cut"), &label, &via_proxy).await;
        wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &cut]).await.then_some(()) }).await;
        update_all(&client, &namespaces, "1").await;

        // Partition: the cut replica must stop acting (its engine lets go of every shard) before
        // its Leases expire and the other replica takes them.
        let cut_at = Instant::now();
        proxy.cut();
        let (mut stopped_at, mut taken_at) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && (stopped_at.is_none() || taken_at.is_none()) {
            let (cut_active, a_active) =
                (cut.metric("reloader_shards_active").await, a.metric("reloader_shards_active").await);
            if stopped_at.is_none() && cut_active == 0.0 {
                stopped_at = Some(Instant::now());
            }
            if taken_at.is_none() && a_active > 8.0 {
                taken_at = Some(Instant::now());
            }
            assert!(cut_active + a_active <= 16.0, "a shard active in both replicas ({cut_active} + {a_active})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stopped_at = stopped_at.expect("the cut replica stopped acting");
        let taken_at = taken_at.expect("the other replica took over");
        println!(
            "cut replica stopped acting {:?} after the cut, {:?} before the takeover (lease 4 s, renew deadline 3 s)",
            stopped_at - cut_at,
            taken_at.saturating_duration_since(stopped_at)
        );
        assert!(stopped_at < taken_at, "the cut replica must stop acting before its shards are taken");

        // Changes made during the partition are served once, by the replica that can reach the
        // API server; after the partition heals the fleet rebalances and still serves each once.
        wait_for("a to act on every shard", || async {
            (a.metric("reloader_shards_active").await == 16.0).then_some(())
        })
        .await;
        update_all(&client, &namespaces, "2").await;
        proxy.restore();
        wait_for("the healed replica to get its share back", || async { balanced(&[&a, &cut]).await.then_some(()) })
            .await;
        update_all(&client, &namespaces, "3").await;
        a.stop().await;
        cut.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

/// With `--hot-standby` each replica of two also watches the other's namespaces and reports
/// them loaded beforehand, so when one stops the other starts no watch: the shards move by
/// their Leases alone, and every change is still served.
#[tokio::test]
async fn a_hot_standby_takes_over_without_starting_a_watch() {
    with_temp_ns("fleet-standby", |client, home| async move {
        let (_, namespaces) = served_namespaces(&client, &home).await;
        let scope = format!("--namespaces={}", namespaces.join(","));
        let kubeconfig = support::kubeconfig_path();
        let args = [scope.as_str(), "--is-openshift=false", "--hot-standby"];
        let (a_name, b_name) = (format!("{home}-a"), format!("{home}-b"));
        let a = start_with(&home, &a_name, &args, &kubeconfig).await;
        let b = start_with(&home, &b_name, &args, &kubeconfig).await;
        wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
        let all = NAMESPACES as f64 * 7.0;
        wait_for("each replica to watch every namespace", || async {
            (a.metric("reloader_watch_streams").await == all && b.metric("reloader_watch_streams").await == all)
                .then_some(())
        })
        .await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), &home);
        wait_for("a to report b's shards loaded", || async {
            let items = leases.list(&Default::default()).await.ok()?.items;
            let b_shards: Vec<String> = items
                .iter()
                .filter(|l| !is_member(l) && holder(l) == b_name)
                .filter_map(shard_of)
                .map(|s| s.to_string())
                .collect();
            let a_warm = items
                .iter()
                .find(|l| is_member(l) && holder(l) == a_name)
                .and_then(|l| annotation(l, WARM_ANNOTATION))?;
            let a_warm: Vec<&str> = a_warm.split(',').collect();
            (!b_shards.is_empty() && b_shards.iter().all(|s| a_warm.contains(&s.as_str()))).then_some(())
        })
        .await;
        // What an operator sees: a's standby shards are b's, in /shards (once a has looked at
        // the Leases since) and as a gauge.
        let standby = wait_for("a's /shards to show b's shards as its standby", || async {
            let body: serde_json::Value = serde_json::from_str(&a.get("/shards").await).ok()?;
            let shards = body["shards"].as_array()?;
            let standby = shards.iter().filter(|s| s["loading_here"] == "standby").count();
            let b_held = shards.iter().filter(|s| s["holder"] == b_name.as_str()).count();
            let all_bs = shards
                .iter()
                .filter(|s| s["loading_here"] == "standby")
                .all(|s| s["holder"] == b_name.as_str() && s["held_here"] == false);
            (standby > 0 && standby == b_held && all_bs).then_some(standby)
        })
        .await;
        assert_eq!(a.metric("reloader_shards_standby").await, standby as f64);
        update_all(&client, &namespaces, "1").await;

        let started_before = a.metric("reloader_watch_streams_started_total").await;
        b.stop().await;
        wait_for("a to hold every shard", || async {
            (a.metric("reloader_shards_active").await == 16.0).then_some(())
        })
        .await;
        update_all(&client, &namespaces, "2").await;
        assert_eq!(
            a.metric("reloader_watch_streams_started_total").await - started_before,
            0.0,
            "the standby had every namespace loaded"
        );
        a.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

/// Every Lease of a fleet's home namespace as a watch saw it, in order.
struct LeaseTimeline {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Lease>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseTimeline {
    fn start(client: &kube::Client, home: &str) -> Self {
        let seen: std::sync::Arc<std::sync::Mutex<Vec<Lease>>> = Default::default();
        let api: Api<Lease> = Api::namespaced(client.clone(), home);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut events = watcher(api, watcher::Config::default()).applied_objects().boxed();
                while let Some(Ok(lease)) = events.next().await {
                    seen.lock().expect("timeline lock").push(lease);
                }
            }
        });
        LeaseTimeline { seen, task }
    }

    /// The position of the first Lease seen that satisfies `check`.
    fn first(&self, check: impl Fn(&Lease) -> bool) -> Option<usize> {
        self.seen.lock().expect("timeline lock").iter().position(check)
    }
}

fn holder(lease: &Lease) -> &str {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or("")
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn shard_of(lease: &Lease) -> Option<u32> {
    lease.metadata.name.as_deref()?.rsplit_once("-shard-")?.1.parse().ok()
}

fn is_member(lease: &Lease) -> bool {
    lease.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL)).is_some_and(|r| r == "member")
}

/// A replica stopped while its namespaces change keeps serving each of its shards until the
/// other replica has loaded it: the Leases show it leaving first, then the heir reporting each
/// shard loaded, and only then the shard released; every change rolls its workload once.
/// Server-sharded watches (a gained shard is a list of its range).
#[tokio::test]
async fn a_leaving_replica_hands_each_shard_over_once_its_heir_has_loaded_it() {
    with_temp_ns("fleet-warm", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        let selector = format!("--namespace-selector={label}");
        hands_over_warm(&client, &home, &namespaces, &[selector.as_str(), "--shard-placement=fnv-ranges"]).await;
    })
    .await;
}

/// The same with namespace-scoped watches, where a gained shard is a list and a watch per
/// namespace and kind (seconds at thousands of namespaces, unserved without the wait).
#[tokio::test]
async fn a_leaving_namespace_scoped_replica_hands_each_shard_over_once_its_heir_has_loaded_it() {
    with_temp_ns("fleet-warm-scoped", |client, home| async move {
        let (_, namespaces) = served_namespaces(&client, &home).await;
        let scope = format!("--namespaces={}", namespaces.join(","));
        hands_over_warm(&client, &home, &namespaces, &[scope.as_str(), "--is-openshift=false"]).await;
    })
    .await;
}

/// Two replicas started with `args` on `namespaces`; B stops during updates, and the Leases
/// must show each of B's shards released only after A reported it loaded.
async fn hands_over_warm(client: &kube::Client, home: &str, namespaces: &[String], args: &[&str]) {
    let kubeconfig = support::kubeconfig_path();
    let (a_name, b_name) = (format!("{home}-a"), format!("{home}-b"));
    let a = start_with(home, &a_name, args, &kubeconfig).await;
    let b = start_with(home, &b_name, args, &kubeconfig).await;
    wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
    update_all(client, namespaces, "1").await;

    let timeline = LeaseTimeline::start(client, home);
    let leases: Api<Lease> = Api::namespaced(client.clone(), home);
    let b_shards: Vec<u32> = leases
        .list(&Default::default())
        .await
        .expect("list Leases")
        .items
        .iter()
        .filter(|l| !is_member(l) && holder(l) == b_name)
        .filter_map(shard_of)
        .collect();
    assert!(!b_shards.is_empty(), "b holds shards");
    wait_for("the timeline to have listed the Leases", || async {
        timeline.first(|l| !is_member(l) && holder(l) == b_name).map(|_| ())
    })
    .await;
    tokio::join!(b.stop(), update_all(client, namespaces, "2"));
    wait_for("a to hold every shard", || async { (a.metric("reloader_shards_active").await == 16.0).then_some(()) })
        .await;

    let leaving = timeline
        .first(|l| is_member(l) && holder(l) == b_name && annotation(l, LEAVING_ANNOTATION) == Some("true"))
        .expect("b's membership Lease says it is leaving");
    for shard in b_shards {
        let warm = timeline
            .first(|l| {
                is_member(l)
                    && holder(l) == a_name
                    && annotation(l, WARM_ANNOTATION).is_some_and(|w| w.split(',').any(|s| s == shard.to_string()))
            })
            .unwrap_or_else(|| panic!("a never reported shard {shard} loaded"));
        let released = timeline
            .first(|l| shard_of(l) == Some(shard) && holder(l) != b_name)
            .unwrap_or_else(|| panic!("b never let go of shard {shard}"));
        assert!(leaving < warm, "a warmed shard {shard} before b said it was leaving");
        assert!(warm < released, "b let go of shard {shard} before a had loaded it");
    }
    timeline.task.abort();
    update_all(client, namespaces, "3").await;
    a.stop().await;
    delete_namespaces(client, namespaces).await;
}

/// Namespace-scoped watches of 14 namespaces (98 watches) share HTTP/2 connections, each
/// filled to the stream limit the API server announces (100 here, so 90 a connection: the
/// watches need two; other requests 16 a connection), and every watch gets its events: none waits, unsent, past a connection's
/// limit. With `--http2=false` each holds a connection of its own (HTTP/1.1), as kube's client does.
#[tokio::test]
async fn namespace_scoped_watches_share_http2_connections_up_to_the_servers_stream_limit() {
    with_temp_ns("fleet-h2", |client, home| async move {
        let (_, namespaces) = served_namespaces_n(&client, &home, 14).await;
        let scope = format!("--namespaces={}", namespaces.join(","));
        let all = namespaces.len() as f64 * 7.0;
        let mut seen = Vec::new();
        for http2 in ["--http2=true", "--http2=false"] {
            let args = [scope.as_str(), "--is-openshift=false", http2];
            let a = start_with(&home, &format!("{home}-{}", &http2[8..]), &args, &support::kubeconfig_path()).await;
            wait_for("every namespace watched", || async {
                (a.metric("reloader_shards_active").await == 16.0 && a.metric("reloader_watch_streams").await == all)
                    .then_some(())
            })
            .await;
            if http2 == "--http2=true" {
                let limit = a.metric("reloader_api_streams_per_connection").await;
                assert_eq!(limit, 90.0, "the API server's 100 streams a connection, less 10");
            }
            seen.push(a.api_connections().await);
            update_all(&client, &namespaces, &http2[8..]).await;
            a.stop().await;
        }
        println!("{all} watches: {} connection(s) with HTTP/2, {} with HTTP/1.1", seen[0], seen[1]);
        // Two for the watches; other requests go 16 to a connection, so the start's burst
        // (98 lists, 32 at once, the 16 checkpoints and the Lease calls) opens a few more.
        assert!((2..=7).contains(&seen[0]), "{} connections for {all} watches over HTTP/2", seen[0]);
        assert!(seen[1] as f64 >= all, "{} connections for {all} watches over HTTP/1.1", seen[1]);
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

#[tokio::test]
async fn enable_ha_with_one_shard_is_reloaders_ha_one_active_replica_on_reloaders_lock() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("fleet-ha", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        let selector = format!("--namespace-selector={label}");
        let args = [
            selector.as_str(),
            "--enable-ha",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=500ms",
        ];
        let a = Controller::start(&format!("{home}-a"), &home, &args).await;
        let b = Controller::start(&format!("{home}-b"), &home, &args).await;
        let leader = wait_for("exactly one active replica", || async {
            let (on_a, on_b) = (a.metric("reloader_shards_active").await, b.metric("reloader_shards_active").await);
            match (on_a, on_b) {
                (1.0, 0.0) => Some(format!("{home}-a")),
                (0.0, 1.0) => Some(format!("{home}-b")),
                _ => None,
            }
        })
        .await;
        // The one Lease is Reloader's lock, in client-go's format.
        let leases: Api<Lease> = Api::namespaced(client.clone(), &home);
        let lock = leases.get("stakater-reloader-lock").await.expect("Reloader's lock Lease");
        let spec = lock.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(leader.as_str()));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
        update_all(&client, &namespaces, "1").await;

        // The leader stops: the other replica takes over and serves every namespace once.
        let (leader, follower) = if leader.ends_with("-a") { (a, b) } else { (b, a) };
        leader.stop().await;
        wait_for("the other replica to become active", || async {
            (follower.metric("reloader_shards_active").await == 1.0).then_some(())
        })
        .await;
        update_all(&client, &namespaces, "2").await;
        follower.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

#[tokio::test]
async fn per_namespace_reload_counts_sum_across_replicas_to_one_per_change() {
    with_temp_ns("fleet-counts", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        let selector = format!("--namespace-selector={label}");
        let args = [selector.as_str(), "--metrics-count-by-namespace"];
        let kubeconfig = support::kubeconfig_path();
        let a = start_with(&home, &format!("{home}-a"), &args, &kubeconfig).await;
        let b = start_with(&home, &format!("{home}-b"), &args, &kubeconfig).await;
        wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
        update_all(&client, &namespaces, "1").await;
        // What Grafana does: sum the series of every replica by namespace. Each namespace was
        // reloaded once, by the one replica that owns it; the other has no series for it.
        for ns in &namespaces {
            let series = format!("reloader_reload_executed_total_by_namespace{{namespace=\"{ns}\",success=\"true\"}}");
            let (on_a, on_b) = (a.metric(&series).await, b.metric(&series).await);
            assert_eq!(on_a + on_b, 1.0, "{ns}: {on_a} on a, {on_b} on b");
            let owner = if on_a == 1.0 { &a } else { &b };
            let body: serde_json::Value =
                serde_json::from_str(&owner.get(&format!("/namespaces/{ns}")).await).expect("/namespaces/{ns} is JSON");
            assert_eq!(body["reloads"], 1, "{ns} as its owner reports it: {body}");
        }
        a.stop().await;
        b.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

#[tokio::test]
async fn a_namespace_labelled_in_or_out_joins_or_leaves_the_fleet_at_run_time() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Patch, PatchParams};
    use reloader_fleet::shard::Ring;
    with_temp_ns("fleet-labels", |client, home| async move {
        let (label, namespaces) = served_namespaces(&client, &home).await;
        let (key, value) = label.split_once('=').expect("key=value");
        // A namespace outside the selection, and a served one in the same shard: events of both
        // reach the same replica in order, so a reload of the second shows the first was seen.
        let ring = Ring::new(16).expect("16 shards");
        let late = format!("{home}-late");
        let barrier = (0..)
            .map(|i| format!("{home}-barrier-{i}"))
            .find(|name| ring.shard_of(name) == ring.shard_of(&late))
            .expect("a name in the same shard");
        let api: Api<Namespace> = Api::all(client.clone());
        for (ns, labels) in [(&late, json!({})), (&barrier, json!({ key: value }))] {
            create_namespace(&client, ns, labels).await;
            create_configmap(&client, ns, "cm", &[("k", "0")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let served = NAMESPACES as f64 + 1.0;
        let a = start(&home, &format!("{home}-a"), &label).await;
        let b = start(&home, &format!("{home}-b"), &label).await;
        let owned =
            || async { a.metric("reloader_namespaces_owned").await + b.metric("reloader_namespaces_owned").await };
        // A fleet at rest: both replicas act on their shards (a namespace labelled in during a
        // handoff is the handoff tests' matter).
        wait_for("the served namespaces owned by a balanced fleet", || async {
            (owned().await == served && balanced(&[&a, &b]).await).then_some(())
        })
        .await;
        let body: serde_json::Value = serde_json::from_str(&a.get(&format!("/namespaces/{late}")).await).expect("JSON");
        assert_eq!(body["selected"], false, "{body}");

        // Labelled in, and its ConfigMap changed at once (as one `kubectl apply` of both does):
        // it joins, and the change is served once although it may arrive before the label.
        let labels = |v: serde_json::Value| json!({ "metadata": { "labels": { key: v } } });
        api.patch(&late, &PatchParams::default(), &Patch::Merge(labels(json!(value)))).await.expect("label");
        update_all(&client, std::slice::from_ref(&late), "1").await;
        wait_for("the labelled namespace owned", || async { (owned().await == served + 1.0).then_some(()) }).await;

        // Labelled out: it leaves, and a change is no longer served.
        api.patch(&late, &PatchParams::default(), &Patch::Merge(labels(serde_json::Value::Null)))
            .await
            .expect("unlabel");
        wait_for("the namespace to leave", || async { (owned().await == served).then_some(()) }).await;
        let before = generation(&client, &late, Kind::Deployment, "web").await;
        patch_configmap(&client, &late, "cm", json!({ "data": { "k": "2" } })).await;
        update_all(&client, std::slice::from_ref(&barrier), "2").await;
        assert_eq!(
            generation(&client, &late, Kind::Deployment, "web").await,
            before,
            "a namespace out of the selection rolled"
        );
        a.stop().await;
        b.stop().await;
        delete_namespaces(&client, &[namespaces, vec![late, barrier]].concat()).await;
    })
    .await;
}

#[tokio::test]
async fn handoff_times_with_default_lease_timings() {
    with_temp_ns("fleet-handoff", |client, home| async move {
        let label = format!("reloader-fleet.test/handoff={home}");
        let ns = format!("{home}-w");
        let labels = json!({ "reloader-fleet.test/handoff": home, support::TEST_LABEL: "fleet-handoff" });
        create_namespace(&client, &ns, labels).await;
        let api: Api<Namespace> = Api::all(client.clone());
        // Reloader's default timings: lease 15 s, renew deadline 10 s, retry period 2 s.
        let args = [format!("--namespace-selector={label}"), "--shards=16".into(), "--enable-ha".into()];
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = Controller::start(&format!("{home}-a"), &home, &refs).await;
        let b = Controller::start(&format!("{home}-b"), &home, &refs).await;
        let c = Controller::start(&format!("{home}-c"), &home, &refs).await;
        wait_for("16 shards balanced over 3", || async { balanced(&[&a, &b, &c]).await.then_some(()) }).await;

        let stopped = Instant::now();
        c.stop().await;
        wait_for("16 shards balanced over a and b", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
        let graceful = stopped.elapsed();

        let killed = Instant::now();
        drop(b);
        wait_for("a to hold all 16", || async { (a.metric("reloader_shards_active").await == 16.0).then_some(()) })
            .await;
        let crash = killed.elapsed();
        println!("default timings (15 s / 10 s / 2 s): SIGTERM handoff {graceful:?}, SIGKILL handoff {crash:?}");
        assert!(graceful < crash, "a graceful stop must hand over faster than a crash");
        a.stop().await;
        let _ = api.delete(&ns, &DeleteParams::background()).await;
    })
    .await;
}

/// Issue 43: Reloader's `reloader-meta-info` ConfigMap (its name, label and keys), published
/// in `RELOADER_NAMESPACE` by one replica of the fleet: the one acting on shard 0.
#[tokio::test]
async fn one_replica_publishes_reloaders_meta_info_configmap() {
    use k8s_openapi::api::core::v1::ConfigMap;
    with_temp_ns("fleet-meta-info", |client, home| async move {
        let fleet = [
            "--shards=16",
            "--enable-ha",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=500ms",
            "--namespace-selector=reloader-fleet.test/none=1",
            "--reload-strategy=annotations",
        ];
        let env = [("RELOADER_NAMESPACE", home.as_str()), ("RELOADER_DEPLOYMENT_NAME", "reloader-reloader")];
        let kubeconfig = support::kubeconfig_path();
        let mut replicas = Vec::new();
        for name in ["a", "b"] {
            let name = format!("{home}-{name}");
            replicas.push(Controller::start_with_kubeconfig_env(&name, &home, &fleet, &kubeconfig, &env).await);
        }
        wait_for("16 shards balanced across 2 replicas", || async {
            balanced(&[&replicas[0], &replicas[1]]).await.then_some(())
        })
        .await;
        let meta = wait_for("the meta-info ConfigMap", || async {
            Api::<ConfigMap>::namespaced(client.clone(), &home).get("reloader-meta-info").await.ok()
        })
        .await;
        let labels = meta.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("reloader.stakater.com/meta-info").map(String::as_str), Some("reloader"));
        let data = meta.data.unwrap_or_default();
        let options: serde_json::Value = serde_json::from_str(&data["reloaderOptions"]).expect("JSON options");
        assert_eq!(options["reloadStrategy"], "annotations");
        assert_eq!(options["enableHA"], true);
        assert_eq!(options["namespaceSelectors"], json!(["reloader-fleet.test/none=1"]));
        let deployment: serde_json::Value = serde_json::from_str(&data["deploymentInfo"]).expect("JSON");
        assert_eq!(
            (deployment["name"].as_str(), deployment["namespace"].as_str()),
            (Some("reloader-reloader"), Some(home.as_str()))
        );
        let build: serde_json::Value = serde_json::from_str(&data["buildInfo"]).expect("JSON");
        assert_eq!(build["releaseVersion"], env!("CARGO_PKG_VERSION"));
        let publishers = replicas.iter().filter(|r| r.logged("published the meta-info ConfigMap")).count();
        assert_eq!(publishers, 1, "one replica of the fleet publishes it");
        for replica in replicas {
            replica.stop().await;
        }
    })
    .await;
}
