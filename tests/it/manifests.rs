//! The shipped manifests are valid for the real API server, and their RBAC is enough: the
//! controller runs with the ServiceAccount's own token and reloads.

use crate::support;

use crate::support::controller::{Controller, start_as_pod_of};
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::suite::{self, Login, SuiteRun};
use crate::support::with_temp_ns;
use futures::future::BoxFuture;
use kube::api::{DeleteParams, DynamicObject};
use kube::{Api, Client};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::{Value, json};

const MANIFEST: &str = include_str!("../../deployments/kubernetes/manifests/reloader.yaml");
const NAMESPACED_MANIFEST: &str = include_str!("../../deployments/kubernetes/manifests/reloader-namespaced.yaml");
const FLEET_MANIFEST: &str = include_str!("../../deployments/kubernetes/manifests/reloader-fleet.yaml");

/// Apply a manifest into `ns` (see [`suite::apply_and_login`]) and log in as its
/// ServiceAccount. Returns the kubeconfig and the cluster-scoped objects to delete afterwards.
async fn apply_and_login(
    client: &Client,
    ns: &str,
    manifest: &str,
) -> (std::path::PathBuf, Vec<(Api<DynamicObject>, String)>) {
    let (login, cluster_scoped) = suite::apply_and_login(client, ns, documents_in(manifest, ns), SERVICE_ACCOUNT).await;
    (login.kubeconfig, cluster_scoped)
}

/// The manifest's documents, placed in namespace `ns`.
fn documents_in(manifest: &str, ns: &str) -> Vec<Value> {
    let text = manifest.replace("namespace: reloader", &format!("namespace: {ns}"));
    serde_saphyr::from_multiple(&text).expect("the manifest is valid YAML")
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
        let (login, cluster_scoped) = suite::apply_and_login(&client, &ns, docs, SERVICE_ACCOUNT).await;
        let path = login.kubeconfig;
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

/// The ServiceAccount every manifest creates.
const SERVICE_ACCOUNT: &str = "reloader-reloader";

/// Start the controller with `args` and `env` (plus `--is-openshift=false`) and the login's
/// kubeconfig; `None` when it is not ready within 10 s.
fn start_with(
    ns: String,
    login: Login,
    args: Vec<String>,
    env: Vec<(String, String)>,
) -> BoxFuture<'static, Option<Controller>> {
    Box::pin(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).chain(["--is-openshift=false"]).collect();
        // As every manifest's Deployment sets them (the meta-info ConfigMap's place and name).
        let meta = [("RELOADER_NAMESPACE", ns.as_str()), ("RELOADER_DEPLOYMENT_NAME", "reloader-reloader")];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(meta).collect();
        let within = std::time::Duration::from_secs(10);
        Controller::try_start(&format!("{ns}-suite"), &ns, &args, &env, &login.kubeconfig, within).await
    })
}

/// The cluster-wide manifest, selecting the suite's namespace by its test label.
const CLUSTER_WIDE: SuiteRun = SuiteRun {
    prefix: "manifests-rules",
    documents: |ns| documents_in(MANIFEST, ns),
    service_account: |_| SERVICE_ACCOUNT.to_string(),
    start: |ns, login| {
        start_with(ns, login, vec![format!("--namespace-selector={}=manifests-rules", support::TEST_LABEL)], vec![])
    },
};

/// The namespaced manifest as its Deployment runs it: one namespace, leader election.
const NAMESPACED: SuiteRun = SuiteRun {
    prefix: "manifests-rules-ns",
    documents: |ns| documents_in(NAMESPACED_MANIFEST, ns),
    service_account: |_| SERVICE_ACCOUNT.to_string(),
    start: |ns, login| {
        let env = vec![("KUBERNETES_NAMESPACE".to_string(), ns.clone())];
        start_with(ns, login, vec!["--enable-ha".into()], env)
    },
};

/// The fleet manifest as its Deployment runs it (16 shards), selecting the suite's namespace.
const FLEET: SuiteRun = SuiteRun {
    prefix: "manifests-rules-fleet",
    documents: |ns| documents_in(FLEET_MANIFEST, ns),
    service_account: |_| SERVICE_ACCOUNT.to_string(),
    start: |ns, login| {
        let selector = format!("--namespace-selector={}=manifests-rules-fleet", support::TEST_LABEL);
        start_with(ns, login, vec![selector, "--enable-ha".into(), "--shards=16".into()], vec![])
    },
};

/// Each RBAC rule of the cluster-wide manifest is needed: without it, the reload suite fails.
#[tokio::test]
async fn every_rule_of_the_manifest_is_needed_by_the_reload_suite() {
    suite::every_rule_is_needed(&CLUSTER_WIDE).await;
}

/// The same for the namespaced manifest (a Role only, leader election).
#[tokio::test]
async fn every_rule_of_the_namespaced_manifest_is_needed_by_the_reload_suite() {
    suite::every_rule_is_needed(&NAMESPACED).await;
}

/// The same for the fleet manifest (16 shards, Leases).
#[tokio::test]
async fn every_rule_of_the_fleet_manifest_is_needed_by_the_reload_suite() {
    suite::every_rule_is_needed(&FLEET).await;
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

/// Issue 49: a kind the RBAC granted after the start was never watched. It is asked about again
/// with backoff: the kind is watched, its warning withdrawn, once the answer is yes (a review
/// that fails is asked about again the same way: `cargo test --test it reliability::a_kind_whose`).
#[tokio::test]
async fn a_kind_granted_later_is_watched_without_a_restart() {
    with_temp_ns("manifests-regrant", |client, ns| async move {
        let mut docs = documents_in(MANIFEST, &ns);
        let mut cronjob_rule = None;
        for doc in docs.iter_mut().filter(|d| d["kind"] == "ClusterRole") {
            let rules = doc["rules"].as_array_mut().expect("rules");
            let at =
                rules.iter().position(|r| r["resources"].as_array().is_some_and(|l| l.iter().any(|x| x == "cronjobs")));
            cronjob_rule = at.map(|i| rules.remove(i));
        }
        let cronjob_rule = cronjob_rule.expect("the manifest grants cronjobs");
        let (login, cluster_scoped) = suite::apply_and_login(&client, &ns, docs, SERVICE_ACCOUNT).await;
        let selector = format!("--namespace-selector={}=manifests-regrant", support::TEST_LABEL);
        let forbidden = "reloader_watch_kinds_forbidden{kind=\"CronJob\"}";

        // Denied at start, granted while it runs.
        let controller = Controller::start_with_kubeconfig(&ns, &ns, &[selector.as_str()], &login.kubeconfig).await;
        assert_eq!(controller.metric(forbidden).await, 1.0);
        let (roles, role_name) = cluster_scoped
            .iter()
            .find(|(api, _)| api.resource_url().contains("clusterroles"))
            .expect("the ClusterRole");
        let mut role = roles.get(role_name).await.expect("the ClusterRole");
        role.data["rules"].as_array_mut().expect("rules").push(cronjob_rule);
        roles.replace(role_name, &Default::default(), &role).await.expect("grant cronjobs");
        support::scenario::cronjobs_watched_and_reloaded(&controller, &client, &ns, "2").await;
        controller.stop().await;
        for (api, name) in cluster_scoped {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    })
    .await;
}
