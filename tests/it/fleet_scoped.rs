//! Namespace-scoped replicas sharing 16 shards: a replica that gains many namespaces loads
//! them from one cluster-wide list per kind where its RBAC allows that list, and from a list
//! per namespace where it has Roles in each namespace only; either way every change is rolled
//! once.

use crate::support;

use crate::support::controller::start_fleet_replica_with as start_with;
use crate::support::fixtures::delete_namespaces;
use crate::support::fleet::{balanced, object_lists, served_namespaces_n, update_all};
use crate::support::{wait_for, with_temp_ns};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// One watch per kind (ConfigMap, Secret, Deployment, DaemonSet, StatefulSet, CronJob, Job) and
/// namespace, DeploymentConfigs off (whether their CRD is installed depends on other tests).
const KINDS: f64 = 7.0;

/// 64 namespaces: B's 8 of 16 shards hold about 32, enough to be seeded (16 at least).
const NAMESPACES: usize = 64;

/// Namespace-scoped, 64 namespaces: when B stops, A starts watches for B's namespaces only
/// (its own keep running), and loads them from one cluster-wide list per kind instead of a
/// list per namespace and kind; ConfigMaps changed while it does are each rolled once.
#[tokio::test]
async fn namespace_scoped_replicas_start_watches_only_for_the_namespaces_they_gain() {
    with_temp_ns("fleet-scoped", |client, home| async move {
        let (_, namespaces) = served_namespaces_n(&client, &home, NAMESPACES).await;
        let handoff = hand_over(&client, &home, &namespaces, &support::kubeconfig_path()).await;
        assert_eq!(handoff.started, handoff.gained, "only the gained namespaces' watches start");
        let (lists, gained) = (handoff.lists, handoff.gained);
        assert!(lists <= KINDS, "{lists} LISTs for {gained} gained watches: not one per kind");
        assert!(handoff.bridged, "the gained namespaces were not fed by a bridge watch while theirs opened");
    })
    .await;
}

/// The same with the namespaced manifest's Role bound in each namespace (the ServiceAccount's
/// only rights): the cluster-wide list is refused, B's namespaces are listed one by one, and
/// every change across the handoff is still rolled once.
#[tokio::test]
async fn with_roles_in_each_namespace_only_gained_namespaces_are_listed_one_by_one() {
    with_temp_ns("fleet-scoped-roles", |client, home| async move {
        let (_, namespaces) = served_namespaces_n(&client, &home, NAMESPACES).await;
        let kubeconfig = bind_namespaced_role(&client, &home, &namespaces).await;
        let handoff = hand_over(&client, &home, &namespaces, &kubeconfig).await;
        assert!(handoff.refused, "a tried the cluster-wide list and was refused");
        let (lists, gained) = (handoff.lists, handoff.gained);
        assert!(lists >= gained, "{lists} LISTs for {gained} gained watches: each namespace lists its own");
    })
    .await;
}

/// What A did when B stopped.
struct Handoff {
    /// Watches A started, and those it had to start (B's).
    started: f64,
    gained: f64,
    /// LISTs of objects A sent meanwhile.
    lists: f64,
    /// Whether A logged its cluster-wide list refused.
    refused: bool,
    /// Whether A fed the gained namespaces from cluster-wide watches until theirs opened.
    bridged: bool,
}

/// Replicas A and B on `namespaces` as `kubeconfig`'s user; every ConfigMap changes while B
/// stops, and once more after A watches everything: each change rolls its Deployment once.
async fn hand_over(client: &kube::Client, home: &str, namespaces: &[String], kubeconfig: &std::path::Path) -> Handoff {
    let scope = format!("--namespaces={}", namespaces.join(","));
    let args = [scope.as_str(), "--is-openshift=false"];
    let a = start_with(home, &format!("{home}-a"), &args, kubeconfig).await;
    let b = start_with(home, &format!("{home}-b"), &args, kubeconfig).await;
    wait_for("16 shards balanced across 2 replicas", || async { balanced(&[&a, &b]).await.then_some(()) }).await;
    // Together the two replicas watch each namespace once.
    let all = namespaces.len() as f64 * KINDS;
    wait_for("each namespace watched by one replica", || async {
        let total = a.metric("reloader_watch_streams").await + b.metric("reloader_watch_streams").await;
        (total == all).then_some(())
    })
    .await;
    update_all(client, namespaces, "1").await;

    let kept = a.metric("reloader_watch_streams").await;
    let (started_before, lists_before) =
        (a.metric("reloader_watch_streams_started_total").await, object_lists(&a).await);
    tokio::join!(b.stop(), update_all(client, namespaces, "2"));
    wait_for("a to watch every namespace", || async {
        let streams = a.metric("reloader_watch_streams").await;
        (a.metric("reloader_shards_active").await == 16.0 && streams == all).then_some(())
    })
    .await;
    let handoff = Handoff {
        started: a.metric("reloader_watch_streams_started_total").await - started_before,
        gained: all - kept,
        lists: object_lists(&a).await - lists_before,
        refused: a.logged("cluster-wide list refused"),
        bridged: a.logged("bridged=true"),
    };
    println!("after the handoff: {} watches started, {kept} kept, {} LISTs", handoff.started, handoff.lists);
    assert!(handoff.gained >= 16.0 * KINDS, "b held {} namespaces, fewer than a seed needs", handoff.gained / KINDS);
    update_all(client, namespaces, "3").await;
    a.stop().await;
    delete_namespaces(client, namespaces).await;
    handoff
}

/// A ServiceAccount in `home` with the namespaced manifest's Role bound in `home` and in each of
/// `namespaces`, and nothing cluster-wide; returns a kubeconfig with its token.
async fn bind_namespaced_role(client: &kube::Client, home: &str, namespaces: &[String]) -> std::path::PathBuf {
    let manifest: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../deployments/kubernetes/manifests/reloader-namespaced.yaml"))
            .expect("the manifest is valid YAML");
    let role = manifest.iter().find(|d| d["kind"] == "Role").expect("the manifest has a Role");
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": "reloader" } })).expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(client.clone(), home)
        .create(&PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
    for ns in std::iter::once(home).chain(namespaces.iter().map(String::as_str)) {
        let role: Role = serde_json::from_value(json!({
            "metadata": { "name": "reloader" }, "rules": role["rules"]
        }))
        .expect("the manifest's Role");
        Api::<Role>::namespaced(client.clone(), ns).create(&PostParams::default(), &role).await.expect("create a Role");
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": { "name": "reloader" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reloader" },
            "subjects": [{ "kind": "ServiceAccount", "name": "reloader", "namespace": home }]
        }))
        .expect("a RoleBinding");
        Api::<RoleBinding>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &binding)
            .await
            .expect("create a RoleBinding");
    }
    support::login_as(client, home, "reloader").await
}
