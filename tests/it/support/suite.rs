//! The reload suite, run by a controller with a ServiceAccount's own credentials and RBAC (the
//! plain manifests', the chart's), and the least-privilege check: taking any one rule away
//! makes the suite fail.

use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret};
use serde_json::{Value, json};

use super::controller::Controller;
use super::fixtures::{Kind, KindExt, Workload, cm_hash, create_configmap, patch_configmap};
use super::scenario::Ctx;
use super::with_temp_ns;

/// A ServiceAccount's credentials: a kubeconfig holding its token, and the token itself.
#[derive(Clone, Debug)]
pub struct Login {
    pub kubeconfig: PathBuf,
    pub token: String,
}

/// How the suite runs a controller: the RBAC documents to apply, the ServiceAccount they
/// create, and how to start the controller with its credentials.
pub struct SuiteRun {
    /// The test namespaces' name prefix, also their test label: each run's own, so that a run
    /// selecting namespaces by that label never acts on another run's (they run at once).
    pub prefix: &'static str,
    /// The documents (ServiceAccount, roles, bindings, the Deployment) for namespace `ns`.
    pub documents: fn(&str) -> Vec<Value>,
    /// The ServiceAccount the documents create, for namespace `ns`.
    pub service_account: fn(&str) -> String,
    /// Start the controller for namespace `ns` (its name, its namespace, its credentials);
    /// `None` when it is not ready within 10 s.
    pub start: fn(String, Login) -> BoxFuture<'static, Option<Controller>>,
}

fn api_for(client: &Client, object: &DynamicObject, ns: &str) -> Api<DynamicObject> {
    let types = object.types.as_ref().expect("every document has apiVersion and kind");
    let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    match types.kind.as_str() {
        "ClusterRole" | "ClusterRoleBinding" => Api::all_with(client.clone(), &resource),
        _ => Api::namespaced_with(client.clone(), ns, &resource),
    }
}

/// Apply `documents` into `ns` (cluster-scoped names and the roles they refer to get `-<ns>`, so
/// that they are this test's own; a Deployment is a server-side dry run), create ConfigMap
/// `cm` (`k=1`) and an auto Deployment `web` using it, and log in as `service_account`.
/// Returns the credentials and the cluster-scoped objects to delete afterwards.
pub async fn apply_and_login(
    client: &Client,
    ns: &str,
    documents: Vec<Value>,
    service_account: &str,
) -> (Login, Vec<(Api<DynamicObject>, String)>) {
    let mut cluster_scoped = Vec::new();
    for mut document in documents {
        if matches!(document["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding")) {
            let name = format!("{}-{ns}", document["metadata"]["name"].as_str().unwrap_or_default());
            document["metadata"]["name"] = json!(name);
        }
        if document["kind"] == "ClusterRoleBinding" {
            let role = format!("{}-{ns}", document["roleRef"]["name"].as_str().unwrap_or_default());
            document["roleRef"]["name"] = json!(role);
        }
        let object: DynamicObject = serde_json::from_value(document.clone()).expect("a Kubernetes object");
        let api = api_for(client, &object, ns);
        // The Deployment's image cannot run here: validate it with a server-side dry run.
        let params = PostParams { dry_run: document["kind"] == "Deployment", ..PostParams::default() };
        api.create(&params, &object).await.unwrap_or_else(|e| panic!("apply {}: {e}", document["kind"]));
        if matches!(document["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding")) {
            cluster_scoped.push((api, object.metadata.name.clone().unwrap_or_default()));
        }
    }
    create_configmap(client, ns, "cm", &[("k", "1")]).await;
    Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(client, ns).await;
    let token = super::token_for(client, ns, service_account).await;
    let kubeconfig = super::kubeconfig_with_token(ns, service_account, &token);
    (Login { kubeconfig, token }, cluster_scoped)
}

/// Delete what [`apply_and_login`] made outside the namespace.
pub async fn delete_cluster_scoped(objects: Vec<(Api<DynamicObject>, String)>) {
    for (api, name) in objects {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

/// Run the reload suite: ready within 10 s, then one ConfigMap change reloads a Deployment,
/// makes a CronJob's Job and creates a Job again, a Secret change reloads another Deployment,
/// a `Reloaded` Event is written, the `reloader-meta-info` ConfigMap is published, and the
/// checkpoint records that change and a second one. `Err` names the first thing missing.
pub async fn reload_suite(client: &Client, ns: &str, login: Login, run: &SuiteRun) -> Result<(), String> {
    super::fixtures::create_secret(client, ns, "sec", &[("k", "1")]).await;
    Workload::new(Kind::Deployment, "vault")
        .auto()
        .container(json!({ "name": "app", "envFrom": [{ "secretRef": { "name": "sec" } }] }))
        .create(client, ns)
        .await;
    Workload::new(Kind::CronJob, "nightly").auto().env_from_configmap("cm").create(client, ns).await;
    Workload::new(Kind::Job, "batch").auto().env_from_configmap("cm").create(client, ns).await;
    let job_uid = super::fixtures::workload_json(client, ns, Kind::Job, "batch").await["metadata"]["uid"].clone();
    let controller = (run.start)(ns.to_string(), login)
        .await
        .ok_or("not ready within 10 s (a watch or the checkpoint read was refused)")?;
    let outcome = changes_are_served(client, ns, &controller, &job_uid).await;
    controller.stop().await;
    outcome
}

async fn changes_are_served(client: &Client, ns: &str, controller: &Controller, job_uid: &Value) -> Result<(), String> {
    let ready = tokio::time::Instant::now();
    while controller.metric("reloader_store_objects{kind=\"workloads\"}").await < 4.0 {
        if ready.elapsed() > Duration::from_secs(10) {
            return Err("the workloads were not stored".to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    patch_configmap(client, ns, "cm", json!({ "data": { "k": "2" } })).await;
    super::fixtures::patch_secret(client, ns, "sec", json!({ "stringData": { "k": "2" } })).await;
    let ctx = Ctx::new(client.clone(), ns.to_string(), Strategy::EnvVars);
    let hash = cm_hash(&[("k", "2")]);
    let secret_hash = super::fixtures::secret_hash(&[("k", "2")]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let web = ctx.recorded(Kind::Deployment, "web", Cm, "cm").await.as_deref() == Some(hash.as_str());
        let vault =
            ctx.recorded(Kind::Deployment, "vault", Secret, "sec").await.as_deref() == Some(secret_hash.as_str());
        let job = super::fixtures::workload_json_opt(client, ns, Kind::Job, "batch").await;
        let recreated = job.as_ref().is_some_and(|j| j["metadata"]["uid"] != *job_uid);
        let jobs = Kind::Job.api(client, ns).list(&Default::default()).await.map(|l| l.items.len()).unwrap_or(0);
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
            .list(&Default::default())
            .await
            .map(|l| l.items.iter().any(|e| e.reason.as_deref() == Some("Reloaded")))
            .unwrap_or(false);
        if web && vault && recreated && jobs >= 2 && events {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "after a change: Deployment reloaded {web}, for a Secret {vault}, Job created again {recreated}, \
                 CronJob's Job {}, Reloaded Event {events}",
                jobs >= 2
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Reloader's meta-info ConfigMap, published by the replica acting on shard 0.
    let meta =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns).get("reloader-meta-info").await;
    let labelled =
        meta.as_ref().ok().and_then(|cm| cm.metadata.labels.as_ref()?.get("reloader.stakater.com/meta-info").cloned());
    if labelled.as_deref() != Some("reloader") {
        return Err(format!(
            "the reloader-meta-info ConfigMap was not published: {:?}",
            meta.map(|cm| cm.metadata.labels)
        ));
    }
    // Nothing the controller checks at start is short (the right to write the checkpoint's
    // parts, needed once a shard's checkpoint outgrows one ConfigMap, is only seen there).
    let readyz = controller.get("/readyz").await;
    if readyz.contains("warning:") {
        return Err(format!("the controller warns at start: {readyz}"));
    }
    // The checkpoint records the change, and then a second one: created, then replaced.
    for value in ["2", "3"] {
        if value == "3" {
            patch_configmap(client, ns, "cm", json!({ "data": { "k": value } })).await;
        }
        let hash = super::checkpoint::short_of(&cm_hash(&[("k", value)]));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !checkpoint_has(client, ns, "cm", hash).await {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("the checkpoint was not saved with change k={value}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Whether a checkpoint in `ns` (one, or one per shard) holds `hash` for ConfigMap `cm`.
async fn checkpoint_has(client: &Client, ns: &str, cm: &str, hash: u64) -> bool {
    let heads: Vec<String> = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("reloader-fleet-checkpoint") && !n.contains("-part-"))
        .collect();
    for head in heads {
        if super::checkpoint::configmap_entry(client, ns, &head, ns, cm).await == Some(hash) {
            return true;
        }
    }
    false
}

/// The suite passes with every rule of the run's roles, and fails with any one taken away.
pub async fn every_rule_is_needed(run: &SuiteRun) {
    let rules_of = |docs: &[Value]| -> Vec<(usize, usize)> {
        docs.iter()
            .enumerate()
            .filter(|(_, d)| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
            .flat_map(|(i, d)| (0..d["rules"].as_array().map(Vec::len).unwrap_or(0)).map(move |r| (i, r)))
            .collect()
    };
    let rule_count = rules_of(&(run.documents)("x")).len();
    let mut report = Vec::new();
    // First the whole set (the suite passes), then each rule taken away in turn.
    for removed in std::iter::once(None).chain((0..rule_count).map(Some)) {
        with_temp_ns(run.prefix, |client, ns| {
            let report = &mut report;
            async move {
                let mut docs = (run.documents)(&ns);
                let mut what = "nothing".to_string();
                if let Some(index) = removed {
                    let (doc, rule) = rules_of(&docs)[index];
                    let taken = docs[doc]["rules"].as_array_mut().expect("rules").remove(rule);
                    what = format!("{} rule {}", docs[doc]["kind"].as_str().unwrap_or_default(), taken);
                }
                let (login, cluster_scoped) = apply_and_login(&client, &ns, docs, &(run.service_account)(&ns)).await;
                let result = reload_suite(&client, &ns, login, run).await;
                delete_cluster_scoped(cluster_scoped).await;
                println!(
                    "without {what}: {}",
                    match &result {
                        Ok(()) => "the suite passes".to_string(),
                        Err(e) => format!("fails: {e}"),
                    }
                );
                report.push((removed, what, result));
            }
        })
        .await;
    }
    assert!(report[0].2.is_ok(), "the whole set of rules must pass the suite: {:?}", report[0].2);
    let unneeded: Vec<&String> = report[1..].iter().filter(|(_, _, r)| r.is_ok()).map(|(_, what, _)| what).collect();
    assert!(unneeded.is_empty(), "rules nothing needs (remove them): {unneeded:#?}");
}
