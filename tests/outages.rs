//! The control plane itself goes away: kube-apiserver, then etcd, stopped for 10 s while
//! changes are made right before and right after. Every workload ends up recording the last
//! hash of its ConfigMap, none rolls more often than its ConfigMap changed, and the watches
//! resume (after an API server restart its watch cache starts anew, so they resume through
//! `410 Gone` and a relist).
//!
//! One test in its own binary: stopping the API server would break any test running beside it.

// The helpers of tests/it, of which this binary uses a part.
#[allow(dead_code)]
#[path = "it/support/mod.rs"]
mod support;

use std::time::Duration;

use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;
use support::fixtures::{Kind, Workload, cm_hash, create_configmap, generation, patch_configmap};
use support::scenario::{Ctx, wait_stored};
use support::{wait_for, with_temp_ns};

/// The deliberate outage (not a wait for a condition).
const OUTAGE: Duration = Duration::from_secs(10);
const WORKLOADS: [&str; 3] = ["a", "b", "c"];

fn cluster(verb: &str, component: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/cluster");
    let status = std::process::Command::new(script).args([verb, component]).status().expect("run hack/cluster");
    assert!(status.success(), "hack/cluster {verb} {component} failed");
}

/// Patch the ConfigMap, retrying while the control plane is still coming back.
async fn change(ctx: &Ctx, value: &str) {
    wait_for(&format!("the API server to take the change to {value}"), || async {
        let api = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns);
        let patch = kube::api::Patch::Merge(json!({ "data": { "k": value } }));
        api.patch("cm", &kube::api::PatchParams::default(), &patch).await.ok().map(|_| ())
    })
    .await;
}

/// Compact etcd to its current revision through its JSON gateway; returns the revision.
async fn compact_etcd() -> i64 {
    let state_file = support::kubeconfig_path().with_file_name("state.json");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).expect("hack/cluster's state")).expect("JSON");
    let base = format!("http://127.0.0.1:{}", state["ports"]["etcd"]);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let text = http
        .post(format!("{base}/v3/maintenance/status"))
        .body("{}")
        .send()
        .await
        .expect("etcd status")
        .text()
        .await
        .expect("etcd status body");
    let status: serde_json::Value = serde_json::from_str(&text).expect("etcd status JSON");
    let revision: i64 = status["header"]["revision"].as_str().and_then(|r| r.parse().ok()).expect("a revision");
    let answer = http
        .post(format!("{base}/v3/kv/compaction"))
        .body(json!({ "revision": revision.to_string(), "physical": true }).to_string())
        .send()
        .await
        .expect("etcd compaction");
    assert!(answer.status().is_success(), "compaction failed: {}", answer.text().await.unwrap_or_default());
    revision
}

#[tokio::test]
async fn api_server_and_etcd_outages_lose_no_change_and_roll_nothing_twice() {
    with_temp_ns("outages", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "0")]).await;
        for name in WORKLOADS {
            Workload::new(Kind::Deployment, name).auto().env_from_configmap("cm").create(c, ns).await;
        }
        let controller = ctx.start_controller("outages", &[]).await;
        wait_stored(&controller, WORKLOADS.len()).await;
        let mut changes = 0;
        for component in ["kube-apiserver", "etcd"] {
            let before = futures::future::join_all(WORKLOADS.map(|w| generation(c, ns, Kind::Deployment, w))).await;
            let tag = component.split('-').next_back().unwrap_or(component);
            // Right before: the controller may or may not see it before the outage.
            patch_configmap(c, ns, "cm", json!({ "data": { "k": format!("{tag}-before") } })).await;
            cluster("stop", component);
            if component == "kube-apiserver" {
                // Compact etcd up to now: the controller's watches resume from a compacted
                // resourceVersion, get 410 Gone, and relist.
                let revision = compact_etcd().await;
                println!("etcd compacted at revision {revision} while the API server was down");
            }
            tokio::time::sleep(OUTAGE).await;
            cluster("start", component);
            change(&ctx, &format!("{tag}-after")).await;
            change(&ctx, &format!("{tag}-later")).await;
            changes += 3;
            let last = cm_hash(&[("k", &format!("{tag}-later"))]);
            for name in WORKLOADS {
                ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &last).await;
            }
            let after = futures::future::join_all(WORKLOADS.map(|w| generation(c, ns, Kind::Deployment, w))).await;
            for ((name, b), a) in WORKLOADS.iter().zip(&before).zip(&after) {
                println!("{component} outage: {name} rolled {} times for 3 changes", a - b);
                assert!(a - b <= 3 && a > b, "{name} rolled {} times for 3 changes", a - b);
            }
        }
        println!(
            "{changes} changes across the outages; watch errors {}, write retries {}",
            controller.metric("reloader_watch_errors_total").await,
            controller.metric("reloader_retries_total").await
        );
        let log = controller.log.clone();
        controller.stop().await;
        let log = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            log.contains("too old resource version"),
            "the watches must have resumed from a compacted version (410 Gone) and relisted"
        );
    })
    .await;
}
