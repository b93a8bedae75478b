//! The shipped manifests are valid for the real API server, and their RBAC is enough: the
//! controller runs with the ServiceAccount's own token and reloads.

mod support;

use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret};
use serde_json::{Value, json};
use support::controller::{Controller, start_as_pod_of};
use support::fixtures::{Kind, KindExt, Workload, cm_hash, create_configmap, patch_configmap};
use support::scenario::{Ctx, wait_stored};
use support::with_temp_ns;

const MANIFEST: &str = include_str!("../deployments/kubernetes/manifests/reloader.yaml");
const NAMESPACED_MANIFEST: &str = include_str!("../deployments/kubernetes/manifests/reloader-namespaced.yaml");
const FLEET_MANIFEST: &str = include_str!("../deployments/kubernetes/manifests/reloader-fleet.yaml");

fn api_for(client: &Client, object: &DynamicObject, ns: &str) -> Api<DynamicObject> {
    let types = object.types.as_ref().expect("every document has apiVersion and kind");
    let (group, version) = types.api_version.split_once('/').unwrap_or(("", &types.api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    match types.kind.as_str() {
        "ClusterRole" | "ClusterRoleBinding" => Api::all_with(client.clone(), &resource),
        _ => Api::namespaced_with(client.clone(), ns, &resource),
    }
}

/// Apply a manifest into `ns` (cluster-scoped names get `ns` as suffix; the Deployment is a
/// server-side dry run), create ConfigMap `cm` (`k=1`) and an auto Deployment `web` using it,
/// then write a kubeconfig with the ServiceAccount's token. Returns the kubeconfig and the
/// cluster-scoped objects to delete afterwards.
async fn apply_and_login(
    client: &Client,
    ns: &str,
    manifest: &str,
) -> (std::path::PathBuf, Vec<(Api<DynamicObject>, String)>) {
    apply_documents_and_login(client, ns, documents_in(manifest, ns)).await
}

/// The manifest's documents, placed in namespace `ns`.
fn documents_in(manifest: &str, ns: &str) -> Vec<Value> {
    let text = manifest.replace("namespace: reloader", &format!("namespace: {ns}"));
    serde_saphyr::from_multiple(&text).expect("the manifest is valid YAML")
}

async fn apply_documents_and_login(
    client: &Client,
    ns: &str,
    documents: Vec<Value>,
) -> (std::path::PathBuf, Vec<(Api<DynamicObject>, String)>) {
    let mut cluster_scoped = Vec::new();
    for mut document in documents {
        if matches!(document["kind"].as_str(), Some("ClusterRole" | "ClusterRoleBinding")) {
            let name = format!("{}-{ns}", document["metadata"]["name"].as_str().unwrap_or_default());
            document["metadata"]["name"] = json!(name);
        }
        if document["kind"] == "ClusterRoleBinding" {
            document["roleRef"]["name"] = json!(format!("reloader-reloader-role-{ns}"));
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
    (support::login_as(client, ns, "reloader-reloader").await, cluster_scoped)
}

#[tokio::test]
async fn the_manifest_applies_and_its_rbac_is_enough_to_reload() {
    with_temp_ns("manifests", |client, ns| async move {
        let (path, cluster_scoped) = apply_and_login(&client, &ns, MANIFEST).await;
        // Cluster-wide, as the manifest deploys it, but selecting only this test's namespace.
        let selector = format!("--namespace-selector={}=manifests", support::TEST_LABEL);
        let controller = Controller::start_with_kubeconfig(&ns, &ns, &[selector.as_str()], &path).await;
        wait_stored(&controller, 1).await;
        reloads_without_forbidden_calls(&client, &ns, vec![controller]).await;
        for (api, name) in cluster_scoped {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_namespaced_role_is_enough_for_namespace_scoped_mode_with_leases() {
    with_temp_ns("manifests-namespaced", |client, ns| async move {
        let (path, cluster_scoped) = apply_and_login(&client, &ns, NAMESPACED_MANIFEST).await;
        assert!(cluster_scoped.is_empty(), "the namespaced manifest has nothing cluster-scoped");
        // As its Deployment runs it: one shard, the Lease held by one replica at a time.
        let args = ["--enable-ha"];
        let mut replicas = Vec::new();
        for i in 1..=2 {
            let env = [("KUBERNETES_NAMESPACE", ns.as_str())];
            replicas.push(Controller::start_with_kubeconfig_env(&format!("{ns}-{i}"), &ns, &args, &path, &env).await);
        }
        support::wait_for("the namespace's shard to be held", || async {
            let mut active = 0.0;
            for r in &replicas {
                active += r.metric("reloader_shards_active").await;
            }
            (active == 1.0).then_some(())
        })
        .await;
        reloads_without_forbidden_calls(&client, &ns, replicas).await;
    })
    .await;
}

/// Issue 39: a kind the ServiceAccount may not watch (here the manifest without its CronJob
/// rule) used to be retried for ever and keep the whole controller unready. It is dropped with
/// a warning (log, `/readyz`, a metric) and everything else reloads.
#[tokio::test]
async fn a_kind_the_rbac_leaves_out_is_dropped_and_the_rest_reloads() {
    with_temp_ns("manifests-degrade", |client, ns| async move {
        let mut docs = documents_in(MANIFEST, &ns);
        for doc in docs.iter_mut().filter(|d| d["kind"] == "ClusterRole") {
            let rules = doc["rules"].as_array_mut().expect("rules");
            rules.retain(|r| !r["resources"].as_array().is_some_and(|l| l.iter().any(|x| x == "cronjobs")));
        }
        let (path, cluster_scoped) = apply_documents_and_login(&client, &ns, docs).await;
        let selector = format!("--namespace-selector={}=manifests-degrade", support::TEST_LABEL);
        let controller = Controller::start_with_kubeconfig(&ns, &ns, &[selector.as_str()], &path).await;
        let readyz = controller.get("/readyz").await;
        assert!(readyz.starts_with("ok") && readyz.contains("may not list and watch cronjobs"), "{readyz}");
        assert_eq!(controller.metric("reloader_watch_kinds_forbidden{kind=\"CronJob\"}").await, 1.0);
        wait_stored(&controller, 1).await;
        reloads_without_forbidden_calls(&client, &ns, vec![controller]).await;
        for (api, name) in cluster_scoped {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    })
    .await;
}

/// Change ConfigMap `cm` (from `k=1` to `k=2`), wait for Deployment `web` to record it, check
/// that no replica had a watch refused, then stop the replicas.
async fn reloads_without_forbidden_calls(client: &Client, ns: &str, replicas: Vec<Controller>) {
    patch_configmap(client, ns, "cm", json!({ "data": { "k": "2" } })).await;
    let ctx = Ctx::new(client.clone(), ns.to_string(), Strategy::EnvVars);
    ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
    for c in &replicas {
        let refused = c.refused_calls();
        assert!(refused.is_empty(), "no watch may be forbidden by the RBAC: {refused:?}");
    }
    for c in replicas {
        c.stop().await;
    }
}

/// The container arguments of the manifest's Deployment.
fn deployment_args(manifest: &str) -> Vec<String> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(manifest).expect("the manifest is valid YAML");
    let deployment = documents.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    args.as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn the_fleet_manifest_runs_replicas_that_share_the_shards_with_its_rbac() {
    with_temp_ns("manifests-fleet", |client, ns| async move {
        let (path, cluster_scoped) = apply_and_login(&client, &ns, FLEET_MANIFEST).await;
        // The Deployment's own arguments, plus a selector that keeps the test to its namespace.
        let mut args = deployment_args(FLEET_MANIFEST);
        assert!(args.iter().any(|a| a == "--enable-ha"), "the fleet manifest runs with Leases: {args:?}");
        args.push(format!("--namespace-selector={}=manifests-fleet", support::TEST_LABEL));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let one = Controller::start_with_kubeconfig(&format!("{ns}-1"), &ns, &args, &path).await;
        let two = Controller::start_with_kubeconfig(&format!("{ns}-2"), &ns, &args, &path).await;
        support::wait_for("the two replicas to share the 16 shards", || async {
            let (a, b) = (one.metric("reloader_shards_active").await, two.metric("reloader_shards_active").await);
            (a == 8.0 && b == 8.0).then_some(())
        })
        .await;
        reloads_without_forbidden_calls(&client, &ns, vec![one, two]).await;
        for (api, name) in cluster_scoped {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    })
    .await;
}

/// Run the reload suite against the manifest's RBAC as given: ready within 10 s, then one
/// ConfigMap change reloads a Deployment, makes a CronJob's Job and creates a Job again, a
/// Secret change reloads another Deployment, a `Reloaded` Event is written, and the checkpoint
/// records that change and a second one. `Err` names the first thing missing.
async fn reload_suite(client: &Client, ns: &str, path: &std::path::Path, run: &SuiteRun) -> Result<(), String> {
    use std::time::Duration;
    support::fixtures::create_secret(client, ns, "sec", &[("k", "1")]).await;
    Workload::new(Kind::Deployment, "vault")
        .auto()
        .container(json!({ "name": "app", "envFrom": [{ "secretRef": { "name": "sec" } }] }))
        .create(client, ns)
        .await;
    Workload::new(Kind::CronJob, "nightly").auto().env_from_configmap("cm").create(client, ns).await;
    Workload::new(Kind::Job, "batch").auto().env_from_configmap("cm").create(client, ns).await;
    let job_uid = support::fixtures::workload_json(client, ns, Kind::Job, "batch").await["metadata"]["uid"].clone();
    let (args, env) = (run.args)(ns);
    let args: Vec<&str> = args.iter().map(String::as_str).chain(["--is-openshift=false"]).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let controller = Controller::try_start(&format!("{ns}-suite"), ns, &args, &env, path, Duration::from_secs(10))
        .await
        .ok_or("not ready within 10 s (a watch or the checkpoint read was refused)")?;
    let outcome = async {
        let ready = tokio::time::Instant::now();
        while controller.metric("reloader_store_objects{kind=\"workloads\"}").await < 4.0 {
            if ready.elapsed() > Duration::from_secs(10) {
                return Err("the workloads were not stored".to_string());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        patch_configmap(client, ns, "cm", json!({ "data": { "k": "2" } })).await;
        support::fixtures::patch_secret(client, ns, "sec", json!({ "stringData": { "k": "2" } })).await;
        let ctx = Ctx::new(client.clone(), ns.to_string(), Strategy::EnvVars);
        let hash = cm_hash(&[("k", "2")]);
        let secret_hash = support::fixtures::secret_hash(&[("k", "2")]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let web = ctx.recorded(Kind::Deployment, "web", Cm, "cm").await.as_deref() == Some(hash.as_str());
            let vault =
                ctx.recorded(Kind::Deployment, "vault", Secret, "sec").await.as_deref() == Some(secret_hash.as_str());
            let job = support::fixtures::workload_json_opt(client, ns, Kind::Job, "batch").await;
            let recreated = job.as_ref().is_some_and(|j| j["metadata"]["uid"] != job_uid);
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
        // The checkpoint records the change, and then a second one: created, then replaced.
        for value in ["2", "3"] {
            if value == "3" {
                patch_configmap(client, ns, "cm", json!({ "data": { "k": value } })).await;
            }
            let entry = format!(" cm {}", &cm_hash(&[("k", value)])[..16]);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !checkpoint_has(client, ns, &entry).await {
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("the checkpoint was not saved with change k={value}"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }
    .await;
    controller.stop().await;
    outcome
}

/// Whether a checkpoint in `ns` (one, or one per shard) has a line containing `entry`.
async fn checkpoint_has(client: &Client, ns: &str, entry: &str) -> bool {
    let checkpoints = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    checkpoints.iter().any(|cm| {
        cm.metadata.name.as_deref().is_some_and(|n| n.starts_with("reloader-fleet-checkpoint"))
            && cm.data.as_ref().is_some_and(|d| d.get("checkpoint").is_some_and(|t| t.contains(entry)))
    })
}

/// Arguments and environment variables of a controller run.
type Invocation = (Vec<String>, Vec<(String, String)>);

/// How the reload suite runs the controller for one manifest: its arguments and environment
/// for the test namespace.
struct SuiteRun {
    manifest: &'static str,
    /// The test namespaces' name prefix, also their test label: each run's own, so that a
    /// run selecting namespaces by that label never acts on another run's (they run at once).
    prefix: &'static str,
    args: fn(&str) -> Invocation,
}

/// The cluster-wide manifest, selecting the suite's namespace by its test label.
const CLUSTER_WIDE: SuiteRun = SuiteRun {
    manifest: MANIFEST,
    prefix: "manifests-rules",
    args: |_| (vec![format!("--namespace-selector={}=manifests-rules", support::TEST_LABEL)], vec![]),
};

/// The namespaced manifest as its Deployment runs it: one namespace, leader election.
const NAMESPACED: SuiteRun = SuiteRun {
    manifest: NAMESPACED_MANIFEST,
    prefix: "manifests-rules-ns",
    args: |ns| (vec!["--enable-ha".into()], vec![("KUBERNETES_NAMESPACE".into(), ns.to_string())]),
};

/// The fleet manifest as its Deployment runs it (16 shards), selecting the suite's namespace.
const FLEET: SuiteRun = SuiteRun {
    manifest: FLEET_MANIFEST,
    prefix: "manifests-rules-fleet",
    args: |_| {
        let selector = format!("--namespace-selector={}=manifests-rules-fleet", support::TEST_LABEL);
        (vec![selector, "--enable-ha".into(), "--shards=16".into()], vec![])
    },
};

/// Each RBAC rule of the cluster-wide manifest is needed: without it, the reload suite fails.
#[tokio::test]
async fn every_rule_of_the_manifest_is_needed_by_the_reload_suite() {
    every_rule_is_needed(&CLUSTER_WIDE).await;
}

/// The same for the namespaced manifest (a Role only, leader election).
#[tokio::test]
async fn every_rule_of_the_namespaced_manifest_is_needed_by_the_reload_suite() {
    every_rule_is_needed(&NAMESPACED).await;
}

/// The same for the fleet manifest (16 shards, Leases).
#[tokio::test]
async fn every_rule_of_the_fleet_manifest_is_needed_by_the_reload_suite() {
    every_rule_is_needed(&FLEET).await;
}

async fn every_rule_is_needed(run: &SuiteRun) {
    let rules_of = |docs: &[Value]| -> Vec<(usize, usize)> {
        docs.iter()
            .enumerate()
            .filter(|(_, d)| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
            .flat_map(|(i, d)| (0..d["rules"].as_array().map(Vec::len).unwrap_or(0)).map(move |r| (i, r)))
            .collect()
    };
    let rule_count = rules_of(&documents_in(run.manifest, "x")).len();
    let mut report = Vec::new();
    // First the whole manifest (the suite passes), then each rule taken away in turn.
    for removed in std::iter::once(None).chain((0..rule_count).map(Some)) {
        with_temp_ns(run.prefix, |client, ns| {
            let report = &mut report;
            async move {
                let mut docs = documents_in(run.manifest, &ns);
                let mut what = "nothing".to_string();
                if let Some(index) = removed {
                    let (doc, rule) = rules_of(&docs)[index];
                    let taken = docs[doc]["rules"].as_array_mut().expect("rules").remove(rule);
                    what = format!("{} rule {}", docs[doc]["kind"].as_str().unwrap_or_default(), taken);
                }
                let (path, cluster_scoped) = apply_documents_and_login(&client, &ns, docs).await;
                let result = reload_suite(&client, &ns, &path, run).await;
                for (api, name) in cluster_scoped {
                    let _ = api.delete(&name, &DeleteParams::default()).await;
                }
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
    assert!(report[0].2.is_ok(), "the whole manifest must pass the suite: {:?}", report[0].2);
    let unneeded: Vec<&String> = report[1..].iter().filter(|(_, _, r)| r.is_ok()).map(|(_, what, _)| what).collect();
    assert!(unneeded.is_empty(), "rules nothing needs (remove them from the manifest): {unneeded:#?}");
}

/// `kubectl apply -k` of an overlay of the kustomize base (its namespace set, names suffixed so
/// that the cluster-scoped objects are this test's own): the Deployment's pods become Ready, and
/// the controller run as its pod would, with its ServiceAccount's token, reloads.
#[tokio::test]
async fn the_kustomize_base_applies_with_kubectl_and_its_rbac_is_enough_to_reload() {
    with_temp_ns("manifests-kustomize", |client, ns| async move {
        let overlay = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{ns}-overlay"));
        std::fs::create_dir_all(&overlay).expect("overlay folder");
        // kustomize takes a base by relative path only.
        let base = relative_path(
            &overlay,
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deployments/kubernetes")),
        );
        std::fs::write(
            overlay.join("kustomization.yaml"),
            format!("namespace: {ns}\nnameSuffix: -{ns}\nresources:\n  - {}\n", base.display()),
        )
        .expect("write the overlay");
        let kubectl = support::tool("kubectl");
        let out = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(support::kubeconfig_path())
            .arg("apply")
            .arg("-k")
            .arg(&overlay)
            .output()
            .expect("kubectl apply -k");
        assert!(out.status.success(), "kubectl apply -k: {}", String::from_utf8_lossy(&out.stderr));
        let name = format!("reloader-reloader-{ns}");
        let deployment = support::fixtures::wait_deployment_ready(&client, &ns, &name).await;
        let kubeconfig = support::login_as(&client, &ns, &name).await;
        create_configmap(&client, &ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, &ns).await;
        let selector = format!("--namespace-selector={}=manifests-kustomize", support::TEST_LABEL);
        let controller = start_as_pod_of(&deployment, &ns, &kubeconfig, &[selector.as_str()]).await;
        wait_stored(&controller, 1).await;
        reloads_without_forbidden_calls(&client, &ns, vec![controller]).await;
        let out = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(support::kubeconfig_path())
            .args(["delete", "--wait=false", "-k"])
            .arg(&overlay)
            .output()
            .expect("kubectl delete -k");
        assert!(out.status.success(), "kubectl delete -k: {}", String::from_utf8_lossy(&out.stderr));
    })
    .await;
}

/// `to` as a path relative to the folder `from` (both absolute).
fn relative_path(from: &std::path::Path, to: &std::path::Path) -> std::path::PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path: std::path::PathBuf = from[common..].iter().map(|_| "..").collect();
    path.extend(&to[common..]);
    path
}
