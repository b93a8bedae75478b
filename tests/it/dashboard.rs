//! The Grafana dashboard's queries work: a real Prometheus server (built from its Go module by
//! `hack/tools prometheus`) scrapes a two-replica fleet that has reloaded, and every query of
//! every panel returns series. The dashboard's `$__rate_interval` is Grafana's; it is given as
//! one minute here.

use crate::support;

use std::path::PathBuf;
use std::process::Stdio;

use crate::support::controller::{free_port, http_get, start_fleet_replica_with};
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_namespace, delete_namespaces, patch_configmap,
};
use crate::support::scenario::Ctx;
use crate::support::{kubeconfig_path, wait_for, with_temp_ns};
use reloader_fleet::reload::Strategy;
use reloader_fleet::shard::Ring;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::{Value, json};

const DASHBOARD: &str = include_str!("../../charts/reloader/dashboards/reloader-fleet.json");

/// Every `expr` of every panel's targets.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_string();
            out.push((title, target["expr"].as_str().unwrap_or_default().to_string()));
        }
    }
    out
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The series an instant query returns; `None` while Prometheus does not answer.
async fn query(port: u16, expr: &str) -> Option<Vec<Value>> {
    let url = format!("http://127.0.0.1:{port}/api/v1/query?query={}", percent_encode(expr));
    let (code, body) = http_get(&url).await?;
    let answer: Value = serde_json::from_str(&body).ok()?;
    assert_eq!(code, 200, "Prometheus refused {expr}: {answer}");
    answer["data"]["result"].as_array().cloned()
}

#[test]
fn the_dashboard_is_valid_and_covers_what_a_platform_team_watches() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let exprs: Vec<String> = queries(&dashboard).into_iter().map(|(_, e)| e).collect();
    for metric in [
        "reloader_reload_executed_total_by_namespace",
        "reloader_action_total",
        "reloader_shards_active",
        "reloader_shard_handoff_seconds",
        "reloader_lease_acquisitions_total",
        "reloader_lease_losses_total",
        "reloader_watch_streams",
        "reloader_invalid_annotations_total",
        "reloader_api_requests_total",
    ] {
        assert!(exprs.iter().any(|e| e.contains(metric)), "no panel shows {metric}");
    }
}

#[tokio::test]
async fn every_dashboard_query_returns_series_from_a_scraped_fleet() {
    with_temp_ns("dashboard", |client, home| async move {
        let label = format!("reloader-fleet.test/dashboard={home}");
        let mut namespaces = Vec::new();
        for i in 0..4 {
            let ns = format!("{home}-{i}");
            create_namespace(&client, &ns, json!({ "reloader-fleet.test/dashboard": home })).await;
            create_configmap(&client, &ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, &ns).await;
            namespaces.push(ns);
        }
        let args = [format!("--namespace-selector={label}"), "--metrics-count-by-namespace=true".to_string()];
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let kubeconfig = kubeconfig_path();
        let a = start_fleet_replica_with(&home, &format!("{home}-a"), &refs, &kubeconfig).await;
        let b = start_fleet_replica_with(&home, &format!("{home}-b"), &refs, &kubeconfig).await;
        // The fleet settled: each replica acts on its half (a replica alone at first holds all 16).
        wait_for("each replica acting on 8 of the 16 shards", || async {
            (a.metric("reloader_shards_active").await == 8.0 && b.metric("reloader_shards_active").await == 8.0)
                .then_some(())
        })
        .await;
        for ns in &namespaces {
            patch_configmap(&client, ns, "cm", json!({ "data": { "k": "2" } })).await;
        }
        for ns in &namespaces {
            let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        }

        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{home}-prometheus"));
        std::fs::create_dir_all(&dir).expect("Prometheus folder");
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n  - job_name: reloader\n    static_configs:\n      - targets: ['127.0.0.1:{}', '127.0.0.1:{}']\n",
            a.port(),
            b.port()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("Prometheus log");
        let mut prometheus = tokio::process::Command::new(support::tool("prometheus"))
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start Prometheus");
        wait_for("Prometheus scraping both replicas", || async {
            let up = query(port, "sum(up)").await?;
            (up.first()?["value"][1] == "2").then_some(())
        })
        .await;
        let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
        let (title, per_namespace) = queries(&dashboard).into_iter().next().expect("the first panel");
        let per_namespace = per_namespace.replace("$__rate_interval", "1m");
        wait_for(&format!("panel {title:?} to show a reload in each of the 4 namespaces"), || async {
            let series = query(port, &per_namespace).await?;
            let shown: Vec<&str> = series.iter().filter_map(|s| s["metric"]["namespace"].as_str()).collect();
            namespaces.iter().all(|ns| shown.contains(&ns.as_str())).then_some(())
        })
        .await;
        for (title, expr) in queries(&dashboard) {
            let expr = expr.replace("$__rate_interval", "1m");
            let what = format!("panel {title:?}: {expr} to return series");
            wait_for(&what, || async { query(port, &expr).await.filter(|r| !r.is_empty()).map(|_| ()) }).await;
        }
        let _ = prometheus.kill().await;
        a.stop().await;
        b.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}

/// Regression (issue 48): a namespace's reload counter vanished from the replica that counted
/// it as soon as its shard moved to another replica (and the new owner starts from nothing),
/// so Grafana's per-namespace panels went blank after every handoff. One namespace per shard,
/// reloaded on a replica alone; a second replica joins and takes half the shards: every
/// namespace is still counted once, where it was counted, and the next reload of each is
/// counted by its new owner, so the fleet's sum is 2 for each.
#[tokio::test]
async fn per_namespace_counts_stay_where_they_were_counted_when_shards_move() {
    with_temp_ns("counts-stay", |client, home| async move {
        let ring = Ring::new(16).expect("a ring");
        let mut by_shard: std::collections::BTreeMap<u32, String> = Default::default();
        for i in 0.. {
            let ns = format!("{home}-{i}");
            by_shard.entry(ring.shard_of(&ns)).or_insert(ns);
            if by_shard.len() == 16 {
                break;
            }
        }
        let namespaces: Vec<String> = by_shard.into_values().collect();
        for ns in &namespaces {
            create_namespace(&client, ns, json!({ "reloader-fleet.test/dashboard": home })).await;
            create_configmap(&client, ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let args = [
            format!("--namespace-selector=reloader-fleet.test/dashboard={home}"),
            "--metrics-count-by-namespace=true".to_string(),
        ];
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let kubeconfig = kubeconfig_path();
        let a = start_fleet_replica_with(&home, &format!("{home}-a"), &refs, &kubeconfig).await;
        wait_for("replica a acting on all 16 shards", || async {
            (a.metric("reloader_shards_active").await == 16.0).then_some(())
        })
        .await;
        let reload_all = |value: &'static str| {
            let (client, namespaces) = (client.clone(), namespaces.clone());
            async move {
                for ns in &namespaces {
                    patch_configmap(&client, ns, "cm", json!({ "data": { "k": value } })).await;
                }
                for ns in &namespaces {
                    let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
                    ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", value)])).await;
                }
            }
        };
        reload_all("2").await;
        let b = start_fleet_replica_with(&home, &format!("{home}-b"), &refs, &kubeconfig).await;
        wait_for("each replica acting on 8 of the 16 shards", || async {
            (a.metric("reloader_shards_active").await == 8.0 && b.metric("reloader_shards_active").await == 8.0)
                .then_some(())
        })
        .await;
        let series =
            |ns: &str| format!("reloader_reload_executed_total_by_namespace{{namespace=\"{ns}\",success=\"true\"}}");
        for ns in &namespaces {
            assert_eq!(a.metric(&series(ns)).await, 1.0, "{ns}: the reload counted on a is gone from a after the move");
        }
        reload_all("3").await;
        for ns in &namespaces {
            let (on_a, on_b) = (a.metric(&series(ns)).await, b.metric(&series(ns)).await);
            assert_eq!(on_a + on_b, 2.0, "{ns}: the fleet counts {on_a} on a and {on_b} on b for two reloads");
        }
        a.stop().await;
        b.stop().await;
        delete_namespaces(&client, &namespaces).await;
    })
    .await;
}
