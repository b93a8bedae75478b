//! Reloader's flags, proven on the real API server.

use crate::support;

use crate::support::controller::Controller;
use crate::support::fixtures::{
    Kind, KindExt, Workload, cm_hash, create_configmap, create_namespace, create_secret, generation, patch_configmap,
    patch_secret, recorded_annotation, recorded_env, secret_hash,
};
use crate::support::scenario::{Ctx, scenario, wait_stored, wait_stored_resources};
use crate::support::{wait_for, with_temp_ns};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret};
use reloader_fleet::watch::WideHash;
use serde_json::json;

const STRATEGIES: [Strategy; 2] = [Strategy::EnvVars, Strategy::Annotations];

#[tokio::test]
async fn auto_reload_all_reloads_unannotated_workloads_unless_they_opt_out() {
    for strategy in STRATEGIES {
        scenario("auto-all", strategy, &["--auto-reload-all"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "plain").env_from_configmap("cm").create(c, ns).await;
            Workload::new(Kind::Deployment, "opted-out")
                .annotate("reloader.stakater.com/auto", "false")
                .env_from_configmap("cm")
                .create(c, ns)
                .await;
            wait_stored(&controller, 2).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            let hash = cm_hash(&[("k", "2")]);
            ctx.wait_reloaded(Kind::Deployment, "plain", Cm, "cm", &hash).await;
            ctx.assert_not_reloaded(Kind::Deployment, "opted-out", Cm, "cm", &hash).await;
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn resources_to_ignore_stops_watching_that_kind() {
    for strategy in STRATEGIES {
        scenario("ignore-cms", strategy, &["--resources-to-ignore=configMaps"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            create_secret(c, ns, "sec", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web")
                .auto()
                .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "secretRef": { "name": "sec" } }] }))
                .create(c, ns)
                .await;
            wait_stored(&controller, 1).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            patch_secret(c, ns, "sec", json!({ "stringData": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Secret, "sec", &secret_hash(&[("k", "2")])).await;
            ctx.assert_not_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
            let events = controller.metric("reloader_events_received_total{event_type=\"update\",resource_type=\"configmaps\"}").await;
            assert_eq!(events, 0.0, "ConfigMaps must not even be watched");
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn resource_label_selector_filters_configmaps_and_secrets() {
    for strategy in STRATEGIES {
        scenario("label-selector", strategy, &["--resource-label-selector=reload=yes"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "plain", &[("k", "1")]).await;
            create_configmap(c, ns, "labelled", &[("k", "1")]).await;
            patch_configmap(c, ns, "labelled", json!({ "metadata": { "labels": { "reload": "yes" } } })).await;
            Workload::new(Kind::Deployment, "uses-plain").auto().env_from_configmap("plain").create(c, ns).await;
            Workload::new(Kind::Deployment, "uses-labelled").auto().env_from_configmap("labelled").create(c, ns).await;
            wait_stored(&controller, 2).await;
            patch_configmap(c, ns, "plain", json!({ "data": { "k": "2" } })).await;
            patch_configmap(c, ns, "labelled", json!({ "data": { "k": "2" } })).await;
            let hash = cm_hash(&[("k", "2")]);
            ctx.wait_reloaded(Kind::Deployment, "uses-labelled", Cm, "labelled", &hash).await;
            ctx.assert_not_reloaded(Kind::Deployment, "uses-plain", Cm, "plain", &hash).await;
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn reload_on_create_reloads_for_a_resource_that_appears() {
    for (flag, expect_reload, strategy) in [
        ("--reload-on-create=true", true, Strategy::EnvVars),
        ("--reload-on-create=true", true, Strategy::Annotations),
        ("--reload-on-create=yes", false, Strategy::EnvVars),
    ] {
        scenario("on-create", strategy, &[flag], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "sentinel", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("late").create(c, ns).await;
            Workload::new(Kind::Deployment, "canary").auto().env_from_configmap("sentinel").create(c, ns).await;
            wait_stored(&controller, 2).await;
            create_configmap(c, ns, "late", &[("k", "1")]).await;
            let hash = cm_hash(&[("k", "1")]);
            if expect_reload {
                ctx.wait_reloaded(Kind::Deployment, "web", Cm, "late", &hash).await;
            } else {
                // Only the exact string "true" enables it, as in Reloader v1.
                patch_configmap(c, ns, "sentinel", json!({ "data": { "k": "2" } })).await;
                ctx.wait_reloaded(Kind::Deployment, "canary", Cm, "sentinel", &cm_hash(&[("k", "2")])).await;
                ctx.assert_not_reloaded(Kind::Deployment, "web", Cm, "late", &hash).await;
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn reload_on_delete_removes_the_env_var_or_records_the_delete_marker() {
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        scenario("on-delete", strategy, &["--reload-on-delete=true"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
            wait_stored(&controller, 1).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;

            Api::<ConfigMap>::namespaced(c.clone(), ns)
                .delete("cm", &DeleteParams::default())
                .await
                .expect("delete cm");
            match ctx.strategy {
                Strategy::EnvVars => {
                    wait_for("the env var to be removed", || async {
                        recorded_env(c, ns, Kind::Deployment, "web", Cm, "cm").await.is_none().then_some(())
                    })
                    .await
                }
                Strategy::Annotations => {
                    ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", "aae45badef99284e4dae01d6046154ea9d99532f")
                        .await
                }
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn namespace_selector_and_ignore_list_pick_namespaces_and_follow_label_changes() {
    with_temp_ns("ns-selector", |client, home| async move {
        let ctx = Ctx::new(client.clone(), home.clone(), Strategy::Annotations);
        let selected = format!("{home}-sel");
        let ignored = format!("{home}-ign");
        let unlabelled = format!("{home}-unl");
        let label = json!({ "reloader-fleet.test/selector": home, support::TEST_LABEL: "ns-selector" });
        create_namespace(&ctx.client, &selected, label.clone()).await;
        create_namespace(&ctx.client, &ignored, label.clone()).await;
        create_namespace(&ctx.client, &unlabelled, json!({ support::TEST_LABEL: "ns-selector" })).await;
        for ns in [&selected, &ignored, &unlabelled] {
            create_configmap(&client, ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let selector = format!("--namespace-selector=reloader-fleet.test/selector:{home}");
        let ignore = format!("--namespaces-to-ignore={ignored}");
        let strategy = format!("--reload-strategy={}", ctx.strategy);
        let controller =
            Controller::start(&home, &home, &[selector.as_str(), ignore.as_str(), strategy.as_str()]).await;
        wait_stored(&controller, 1).await;

        let hash = cm_hash(&[("k", "2")]);
        for ns in [&ignored, &unlabelled, &selected] {
            patch_configmap(&client, ns, "cm", json!({ "data": { "k": "2" } })).await;
        }
        let in_ns = |ns: &str| Ctx::new(client.clone(), ns.to_string(), ctx.strategy);
        in_ns(&selected).wait_reloaded(Kind::Deployment, "web", Cm, "cm", &hash).await;
        in_ns(&ignored).assert_not_reloaded(Kind::Deployment, "web", Cm, "cm", &hash).await;
        in_ns(&unlabelled).assert_not_reloaded(Kind::Deployment, "web", Cm, "cm", &hash).await;

        // Labelling a namespace at run time brings it into the selection.
        let patch = json!({ "metadata": { "labels": { "reloader-fleet.test/selector": home } } });
        Api::<Namespace>::all(client.clone())
            .patch(&unlabelled, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label namespace");
        wait_stored(&controller, 2).await;
        // Its ConfigMaps too (each namespace also holds kube-root-ca.crt), before the change.
        wait_stored_resources(&controller, 4).await;
        patch_configmap(&client, &unlabelled, "cm", json!({ "data": { "k": "3" } })).await;
        in_ns(&unlabelled).wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "3")])).await;

        controller.stop().await;
        for ns in [&selected, &ignored, &unlabelled] {
            let _ = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::background()).await;
        }
    })
    .await;
}

#[tokio::test]
async fn annotations_strategy_writes_reloaders_json() {
    scenario("annotation-json", Strategy::Annotations, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web")
            .auto()
            .container(json!({ "name": "side" }))
            .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }] }))
            .create(c, ns)
            .await;
        wait_stored(&controller, 1).await;
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        let source = recorded_annotation(c, ns, Kind::Deployment, "web").await.expect("annotation written");
        let keys: Vec<&str> = source.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 6);
        assert_eq!(source["type"], "CONFIGMAP");
        assert_eq!(source["namespace"], ns);
        assert_eq!(source["containerRefs"], json!(["app"]));
        assert!(source["observedAt"].is_i64());
        controller
    })
    .await;
}

#[tokio::test]
async fn health_address_serves_reloader_v2s_probes_next_to_the_metrics_address() {
    with_temp_ns("health-addr", |_client, ns| async move {
        let port = support::controller::free_port();
        let health = format!("--health-addr=127.0.0.1:{port}");
        let scope = format!("--namespaces={ns}");
        let controller = Controller::start(&ns, &ns, &[scope.as_str(), health.as_str()]).await;
        // Reloader v2's chart probes :8080 /healthz and /readyz; v1's probe :9090 /live and /metrics.
        for path in ["/healthz", "/readyz", "/live"] {
            let answer = support::controller::http_get(&format!("http://127.0.0.1:{port}{path}")).await;
            assert_eq!(answer.map(|(code, _)| code), Some(200), "{path} on the health address");
        }
        assert_eq!(controller.get("/live").await, "alive");
        assert!(controller.metrics().await.contains("reloader_reload_executed_total"));
        controller.stop().await;
    })
    .await;
}

/// Issue 39: the data views name workloads and Secrets; they are served on the admin address
/// only (loopback by default), never on the metrics address Prometheus and anyone on the pod
/// network reach.
#[tokio::test]
async fn the_data_views_answer_on_the_admin_address_only() {
    with_temp_ns("admin-addr", |_client, ns| async move {
        let port = support::controller::free_port();
        let admin = format!("--admin-addr=127.0.0.1:{port}");
        let scope = format!("--namespaces={ns}");
        let controller = Controller::start(&ns, &ns, &[scope.as_str(), admin.as_str()]).await;
        let on_admin = |path: String| async move {
            support::controller::http_get(&format!("http://127.0.0.1:{port}{path}")).await.map(|(code, _)| code)
        };
        for path in ["/shards".to_string(), "/namespaces".to_string(), format!("/explain/{ns}/deploy/web")] {
            let metrics = format!("http://127.0.0.1:{}{path}", controller.port());
            let answer = support::controller::http_get(&metrics).await.map(|(code, _)| code);
            assert_eq!(answer, Some(404), "{path} on the metrics address");
            assert_eq!(on_admin(path.clone()).await, Some(200), "{path} on the admin address");
        }
        assert_eq!(on_admin("/namespaces/Not_A_Namespace".to_string()).await, Some(400));
        controller.stop().await;
    })
    .await;
}

/// Issue 39: the per-namespace counts and their series were forgotten only when a shard was
/// let go, so a cluster creating and deleting namespaces all day grew them without end. They
/// go once the store holds nothing of the namespace (it was deleted).
#[tokio::test]
async fn per_namespace_series_go_with_their_namespace() {
    with_temp_ns("ns-series", |client, home| async move {
        let (c, ns) = (&client, format!("{home}-gone"));
        let label = format!("reloader-fleet.test/series={home}");
        create_namespace(c, &ns, json!({ "reloader-fleet.test/series": home })).await;
        create_configmap(c, &ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, &ns).await;
        let selector = format!("--namespace-selector={label}");
        let controller = Controller::start(&home, &home, &[selector.as_str(), "--metrics-count-by-namespace"]).await;
        wait_stored(&controller, 1).await;
        patch_configmap(c, &ns, "cm", json!({ "data": { "k": "2" } })).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        let series = format!("reloader_reload_executed_total_by_namespace{{namespace=\"{ns}\",success=\"true\"}}");
        wait_for("the namespace's series", || async { (controller.metric(&series).await == 1.0).then_some(()) }).await;
        Api::<Namespace>::all(c.clone()).delete(&ns, &DeleteParams::default()).await.expect("delete the namespace");
        wait_for("the deleted namespace's series to go", || async {
            (!controller.metrics().await.contains(&format!("namespace=\"{ns}\""))).then_some(())
        })
        .await;
        controller.stop().await;
    })
    .await;
}

/// ConfigMaps `kept` and `gone`, read through `envFrom` by the Deployments `auto` (with
/// `auto`) and `listed` (which names both in its reload list); each change of both recorded,
/// so every Deployment records a variable for each.
async fn record_both(ctx: &Ctx, controller: &Controller, auto: &[&str]) {
    let (c, ns) = (&ctx.client, ctx.ns.as_str());
    create_configmap(c, ns, "kept", &[("k", "1")]).await;
    create_configmap(c, ns, "gone", &[("k", "1")]).await;
    let both = json!([{ "configMapRef": { "name": "kept" } }, { "configMapRef": { "name": "gone" } }]);
    for name in auto {
        Workload::new(Kind::Deployment, name)
            .auto()
            .container(json!({ "name": "app", "envFrom": both }))
            .create(c, ns)
            .await;
    }
    Workload::new(Kind::Deployment, "listed")
        .annotate("configmap.reloader.stakater.com/reload", "kept,gone")
        .container(json!({ "name": "app", "envFrom": both }))
        .create(c, ns)
        .await;
    wait_stored(controller, auto.len() + 1).await;
    for name in ["gone", "kept"] {
        patch_configmap(c, ns, name, json!({ "data": { "k": "2" } })).await;
        for workload in auto.iter().chain(&["listed"]) {
            ctx.wait_reloaded(Kind::Deployment, workload, Cm, name, &cm_hash(&[("k", "2")])).await;
        }
    }
}

/// Make the Deployment's container take `kept` alone in `envFrom` (an edit of the user's,
/// which rolls it by itself; a strategic merge keeps the rest, variables included); returns
/// the generation the edit left.
async fn drop_reference(c: &kube::Client, ns: &str, workload: &str) -> i64 {
    let only_kept = json!({ "spec": { "template": { "spec": { "containers": [
        { "name": "app", "envFrom": [{ "configMapRef": { "name": "kept" } }] }
    ] } } } });
    let patched = Kind::Deployment
        .api(c, ns)
        .patch(workload, &PatchParams::default(), &Patch::Strategic(only_kept))
        .await
        .expect("drop the reference");
    patched.metadata.generation.expect("a Deployment has a generation")
}

/// `--remove-orphaned-env-vars`: once a Deployment stops using a ConfigMap, its next reload
/// write (for another ConfigMap) also removes the old `STAKATER_*` variable; dropping the
/// reference alone writes nothing, and a workload naming resources in a reload list keeps
/// every variable.
#[tokio::test]
async fn orphaned_env_vars_leave_with_the_next_reload_write_and_never_roll_on_their_own() {
    scenario("orphans", Strategy::EnvVars, &["--remove-orphaned-env-vars"], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        record_both(&ctx, &controller, &["web"]).await;
        // Both stop using "gone".
        drop_reference(c, ns, "listed").await;
        let dropped = drop_reference(c, ns, "web").await;
        wait_for("the controller to see that web no longer uses gone", || async {
            let report = controller.get(&format!("/explain/{ns}/deployment/web")).await;
            (report.contains("\"resource\":\"kept\"") && !report.contains("\"resource\":\"gone\"")).then_some(())
        })
        .await;
        let report = controller.get(&format!("/explain/{ns}/deployment/web")).await;
        assert!(
            report
                .contains("STAKATER_GONE_CONFIGMAP of resources it no longer uses: removed with its next reload write"),
            "explain names the orphan and its fate: {report}"
        );
        // Nothing is written for the orphan alone.
        patch_configmap(c, ns, "gone", json!({ "data": { "k": "3" } })).await;
        patch_configmap(c, ns, "kept", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "kept", &cm_hash(&[("k", "3")])).await;
        ctx.wait_reloaded(Kind::Deployment, "listed", Cm, "kept", &cm_hash(&[("k", "3")])).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, dropped + 1, "one write: the reload of kept");
        assert_eq!(recorded_env(c, ns, Kind::Deployment, "web", Cm, "gone").await, None, "the orphan left with it");
        assert!(
            recorded_env(c, ns, Kind::Deployment, "listed", Cm, "gone").await.is_some(),
            "a workload naming resources keeps every variable"
        );
        controller
    })
    .await;
}

/// `--remove-orphaned-env-vars-at-once`: a Deployment edited to stop using a ConfigMap loses
/// its `STAKATER_*` variable in one write of its own, with no ConfigMap change, and says so
/// in an Event; the variable of the resource still used stays; a workload naming resources in
/// a reload list keeps every variable; an edit made while no controller ran is cleaned up once
/// the next one takes the namespace up, and nothing else is written.
#[tokio::test]
async fn orphaned_env_vars_leave_at_once_when_asked() {
    const FLAG: &str = "--remove-orphaned-env-vars-at-once";
    scenario("orphans-now", Strategy::EnvVars, &[FLAG], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        record_both(&ctx, &controller, &["web", "later"]).await;
        let later = generation(c, ns, Kind::Deployment, "later").await;
        // The listed Deployment's edit first: the engine hears of edits in order, so once web
        // is cleaned up, listed's was looked at.
        let listed = drop_reference(c, ns, "listed").await;
        let web = drop_reference(c, ns, "web").await;
        wait_for("web's orphaned variable to go", || async {
            recorded_env(c, ns, Kind::Deployment, "web", Cm, "gone").await.is_none().then_some(())
        })
        .await;
        let removals = "reloader_orphaned_env_var_removals_total{result=\"success\"}";
        wait_for("the removal to be counted", || async { (controller.metric(removals).await == 1.0).then_some(()) })
            .await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, web + 1, "one write of its own");
        assert!(recorded_env(c, ns, Kind::Deployment, "web", Cm, "kept").await.is_some(), "the used one stays");
        assert_eq!(generation(c, ns, Kind::Deployment, "listed").await, listed, "a listing workload is not written");
        assert!(recorded_env(c, ns, Kind::Deployment, "listed", Cm, "gone").await.is_some());
        assert_eq!(generation(c, ns, Kind::Deployment, "later").await, later, "an unedited workload is not written");
        let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.clone(), ns);
        wait_for("the removal's Event", || async {
            let listed = events.list(&Default::default()).await.ok()?;
            listed
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("OrphanedEnvVarsRemoved")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                })
                .then_some(())
        })
        .await;

        // Edited while no controller runs: the next one removes the variable once it takes the
        // namespace up.
        controller.stop().await;
        let later = drop_reference(c, ns, "later").await;
        let controller = ctx.start_controller("restarted", &[FLAG]).await;
        wait_for("later's orphaned variable to go", || async {
            recorded_env(c, ns, Kind::Deployment, "later", Cm, "gone").await.is_none().then_some(())
        })
        .await;
        wait_for("the removal to be counted", || async { (controller.metric(removals).await == 1.0).then_some(()) })
            .await;
        assert_eq!(generation(c, ns, Kind::Deployment, "later").await, later + 1, "one write of its own");
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, web + 1, "web is not written again");
        assert_eq!(generation(c, ns, Kind::Deployment, "listed").await, listed, "listed is not written");
        controller
    })
    .await;
}

/// `--remove-orphaned-env-vars-at-once` with a namespace selector: a namespace labelled into
/// the selection brings a Deployment recording the variable of a ConfigMap it no longer uses
/// (as Reloader left it); the variable goes once the namespace is loaded, in one write.
#[tokio::test]
async fn an_orphaned_variable_in_a_namespace_that_joins_goes_at_once() {
    with_temp_ns("orphans-join", |client, home| async move {
        let joining = format!("{home}-join");
        create_namespace(&client, &joining, json!({ support::TEST_LABEL: "orphans-join" })).await;
        create_configmap(&client, &joining, "kept", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web")
            .auto()
            .container(json!({ "name": "app",
                "envFrom": [{ "configMapRef": { "name": "kept" } }],
                "env": [{ "name": "STAKATER_GONE_CONFIGMAP", "value": "from-an-older-reload" }] }))
            .create(&client, &joining)
            .await;
        let before = generation(&client, &joining, Kind::Deployment, "web").await;
        let selector = format!("--namespace-selector=reloader-fleet.test/orphans:{home}");
        let controller =
            Controller::start(&home, &home, &[selector.as_str(), "--remove-orphaned-env-vars-at-once"]).await;
        wait_stored(&controller, 0).await;
        let label = json!({ "metadata": { "labels": { "reloader-fleet.test/orphans": home } } });
        Api::<Namespace>::all(client.clone())
            .patch(&joining, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("label the namespace");
        wait_for("the orphaned variable to go", || async {
            recorded_env(&client, &joining, Kind::Deployment, "web", Cm, "gone").await.is_none().then_some(())
        })
        .await;
        assert_eq!(generation(&client, &joining, Kind::Deployment, "web").await, before + 1, "one write");
        controller.stop().await;
        let _ = Api::<Namespace>::all(client.clone()).delete(&joining, &DeleteParams::background()).await;
    })
    .await;
}

fn wide_cm_hash(data: &[(&str, &str)]) -> String {
    let map = data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    WideHash::of_configmap(&map, &Default::default()).to_string()
}

/// `--hash=sha512-256` (Reloader's open PR #1086): switching to it rolls nothing, even with
/// every resource replayed as created at start (a record of either form for the current data
/// is up to date); the 64-digit form is written with the next real change; switching back
/// rolls nothing either, and the next change writes Reloader's SHA-1 again.
#[tokio::test]
async fn switching_the_hash_form_rolls_nothing_and_the_next_change_writes_the_new_form() {
    for strategy in STRATEGIES {
        with_temp_ns("hash-form", |client, ns| async move {
            let ctx = Ctx::new(client, ns, strategy);
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web").env_from_configmap("cm").auto().create(c, ns).await;
            let replay = ["--reload-on-create=true", "--sync-after-restart=true"];

            let sha1 = ctx.start_controller("sha1", &[]).await;
            wait_stored(&sha1, 1).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
            sha1.stop().await;
            let before = generation(c, ns, Kind::Deployment, "web").await;

            let wide = ctx.start_controller("wide", &[&["--hash=sha512-256"][..], &replay[..]].concat()).await;
            wait_stored(&wide, 1).await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before, "switching to sha512-256 rolled");
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
            let written = wide_cm_hash(&[("k", "3")]);
            assert_eq!(written.len(), 64);
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &written).await;
            wide.stop().await;
            let before = generation(c, ns, Kind::Deployment, "web").await;

            let back = ctx.start_controller("back", &["--hash=sha1"]).await;
            wait_stored(&back, 1).await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before, "switching back rolled");
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "4" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "4")])).await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "one rollout for the change");
            back.stop().await;
        })
        .await;
    }
}
