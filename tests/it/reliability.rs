//! Trust under odd conditions: no Secret value in any log line or Event even at trace level,
//! corrupt state (a garbage checkpoint, a newer version's record) handled with a warning and
//! no mass rollout, and another writer changing the same workloads while changes arrive.

use crate::support;

use crate::support::controller::Controller;
use crate::support::fixtures::{
    Kind, KindExt, Workload, cm_hash, create_configmap, create_secret, patch_configmap, patch_secret, secret_hash,
};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{kubeconfig_path, with_temp_ns};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use reloader_fleet::reload::{RELOADED_HASHES, Strategy};
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::json;

const CHECKPOINT: &str = "reloader-fleet-checkpoint";

#[tokio::test]
async fn no_secret_value_reaches_a_log_line_or_an_event_even_at_trace_level() {
    with_temp_ns("no-secrets-in-logs", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        let values = ["hunter2-Wq8zLmP3-first", "hunter2-Wq8zLmP3-second", "hunter2-Wq8zLmP3-third"];
        create_secret(c, ns, "db", &[("password", values[0])]).await;
        Workload::new(Kind::Deployment, "web")
            .auto()
            .container(json!({ "name": "app", "env": [{ "name": "P", "valueFrom": { "secretKeyRef": { "name": "db", "key": "password" } } }] }))
            .create(c, ns)
            .await;
        let scope = format!("--namespaces={ns}");
        let controller = Controller::start_with_kubeconfig_env(
            &format!("{ns}-trace"),
            ns,
            &[scope.as_str(), "--log-level=trace"],
            &kubeconfig_path(),
            &[("RUST_LOG", "trace")],
        )
        .await;
        wait_stored(&controller, 1).await;
        for value in &values[1..] {
            patch_secret(c, ns, "db", json!({ "stringData": { "password": value } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Sec, "db", &secret_hash(&[("password", value)])).await;
        }
        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        let events = serde_json::to_string(&events.list(&ListParams::default()).await.expect("list Events").items).expect("JSON");
        let log = controller.log.clone();
        controller.stop().await;
        let log = std::fs::read_to_string(&log).expect("the controller log");
        assert!(log.lines().count() > 100, "trace logging is on ({} lines)", log.lines().count());
        let b64 = base64::engine::general_purpose::STANDARD;
        for value in values {
            for form in [value.to_string(), b64.encode(value), b64.encode(format!("\"{value}\""))] {
                assert!(!log.contains(&form), "a Secret value ({form}) is in the log");
                assert!(!events.contains(&form), "a Secret value ({form}) is in an Event");
            }
        }
        println!("{} log lines at trace level, no Secret value in any", log.lines().count());
    })
    .await;
}

#[tokio::test]
async fn a_garbage_checkpoint_or_a_newer_versions_record_is_a_warning_not_a_mass_rollout() {
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        with_temp_ns("corrupt-state", |client, ns| async move {
            let ctx = Ctx::new(client, ns, strategy);
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            // Never changed, so recorded by no workload: a checkpoint read as "knows nothing"
            // would take it as created, and --reload-on-create would roll everything using it.
            create_configmap(c, ns, "settled", &[("k", "1")]).await;
            for name in ["a", "b", "c"] {
                Workload::new(Kind::Deployment, name)
                    .auto()
                    .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "configMapRef": { "name": "settled" } }] }))
                    .create(c, ns)
                    .await;
            }
            let first = ctx.start_controller("first", &[]).await;
            wait_stored(&first, 3).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            for name in ["a", "b", "c"] {
                ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", "2")])).await;
            }
            first.stop().await;
            // A rollout is a change of the pod template (a Deployment's generation also counts
            // changes of its annotations, which the next step makes).
            let templates = || {
                futures::future::join_all(["a", "b", "c"].map(|n| async move {
                    support::fixtures::workload_json(c, ns, Kind::Deployment, n).await["spec"]["template"].to_string()
                }))
            };
            let rolled = templates().await;

            // The checkpoint edited to garbage, and a record a newer version might write.
            Api::<ConfigMap>::namespaced(c.clone(), ns)
                .patch(
                    CHECKPOINT,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "data": { "parts": "\u{0}garbage\u{1F4A5}" },
                        "binaryData": { "journal": "bm90IHpsaWI=", "base": "bm90IHpsaWIgZWl0aGVy" }
                    })),
                )
                .await
                .expect("corrupt the checkpoint");
            let future_record =
                json!({ "metadata": { "annotations": { RELOADED_HASHES: "{\"v\":2,\"entries\":[1,2,3]}" } } });
            Kind::Deployment
                .api(c, ns)
                .patch("b", &PatchParams::default(), &Patch::Merge(&future_record))
                .await
                .expect("write a future record");

            // With --reload-on-create, a checkpoint read as "knows nothing" would reload everything.
            let second = ctx.start_controller("second", &["--reload-on-create=true"]).await;
            assert_eq!(templates().await, rolled, "a corrupt checkpoint or record must not roll anything");
            // And it keeps working: the next change reloads every workload.
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
            for name in ["a", "b", "c"] {
                ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", "3")])).await;
            }
            let log = std::fs::read_to_string(&second.log).unwrap_or_default();
            second.stop().await;
            assert!(log.contains("WARN"), "the corrupt checkpoint is a warning:\n{log}");
        })
        .await;
    }
}

#[tokio::test]
async fn another_writer_changing_the_same_workloads_loses_no_record_and_rolls_nothing_twice() {
    with_temp_ns("another-writer", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "0")]).await;
        let names: Vec<String> = (0..5).map(|i| format!("web-{i}")).collect();
        for name in &names {
            Workload::new(Kind::Deployment, name).auto().env_from_configmap("cm").create(c, ns).await;
        }
        let controller = ctx.start_controller("first", &[]).await;
        wait_stored(&controller, 5).await;
        // A GitOps tool rewrites the same templates (its own label and annotation, its own
        // field manager) while the ConfigMap changes 10 times.
        let gitops = {
            let (c, ns, names) = (c.clone(), ns.to_string(), names.clone());
            tokio::spawn(async move {
                let mut writes = 0;
                for round in 0..40 {
                    for name in &names {
                        let patch = json!({ "spec": { "template": { "metadata": {
                            "labels": { "gitops-sync": format!("r{round}") },
                            "annotations": { "gitops.example.com/revision": format!("{round}") } } } } });
                        let params = PatchParams { field_manager: Some("gitops".into()), ..PatchParams::default() };
                        if Kind::Deployment.api(&c, &ns).patch(name, &params, &Patch::Strategic(&patch)).await.is_ok() {
                            writes += 1;
                        }
                    }
                }
                writes
            })
        };
        for n in 1..=10 {
            patch_configmap(c, ns, "cm", json!({ "data": { "k": n.to_string() } })).await;
        }
        let theirs = gitops.await.expect("the other writer");
        let last = cm_hash(&[("k", "10")]);
        for name in &names {
            ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &last).await;
        }
        let ours = controller.metric("reloader_action_total{result=\"success\",workload_kind=\"Deployment\"}").await;
        println!("the other writer wrote {theirs} times; this controller {ours} times for 10 changes of 5 workloads");
        assert!(ours <= 50.0, "at most one write per change and workload, got {ours}");
        for name in &names {
            let object = support::fixtures::workload_json(c, ns, Kind::Deployment, name).await;
            let labels = &object["spec"]["template"]["metadata"]["labels"];
            assert_eq!(labels["gitops-sync"], "r39", "{name}: the other writer's last change stays");
            assert_eq!(ctx.recorded(Kind::Deployment, name, Cm, "cm").await.as_deref(), Some(last.as_str()));
        }
        controller.stop().await;
    })
    .await;
}

/// A controller scoped to `ns` that reaches the API server through the proxy at `addr`.
async fn start_scoped_via(addr: std::net::SocketAddr, ns: &str, name: &str) -> Controller {
    let kubeconfig = support::proxy::kubeconfig_via(addr, &format!("{ns}-{name}"));
    let scope = format!("--namespaces={ns}");
    Controller::start_with_kubeconfig(&format!("{ns}-{name}"), ns, &[scope.as_str()], &kubeconfig).await
}

/// ConfigMap `cm` and 4 auto Deployments using it; their names.
async fn four_deployments_on_cm(ctx: &Ctx) -> Vec<String> {
    let (c, ns) = (&ctx.client, ctx.ns.as_str());
    create_configmap(c, ns, "cm", &[("k", "0")]).await;
    let names: Vec<String> = (0..4).map(|i| format!("web-{i}")).collect();
    for name in &names {
        Workload::new(Kind::Deployment, name).auto().env_from_configmap("cm").create(c, ns).await;
    }
    names
}

#[tokio::test]
async fn with_300_ms_added_to_every_exchange_every_change_is_handled_once() {
    use support::proxy::{Proxy, api_server_addr};
    with_temp_ns("slow-api", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        let names = four_deployments_on_cm(&ctx).await;
        let proxy = Proxy::start_with_latency(api_server_addr(), std::time::Duration::from_millis(300)).await;
        let controller = start_scoped_via(proxy.addr, ns, "slow").await;
        wait_stored(&controller, names.len()).await;
        let started = tokio::time::Instant::now();
        for n in 1..=3 {
            let value = n.to_string();
            patch_configmap(c, ns, "cm", json!({ "data": { "k": value } })).await;
            for name in &names {
                ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", &value)])).await;
            }
        }
        let writes = controller.metric("reloader_action_total{result=\"success\",workload_kind=\"Deployment\"}").await;
        println!(
            "300 ms per exchange: 3 changes x 4 workloads handled in {:?}; {writes} writes, {} retries, {} errors",
            started.elapsed(),
            controller.metric("reloader_retries_total").await,
            controller.metric("reloader_action_total{result=\"error\",workload_kind=\"Deployment\"}").await
        );
        // The metric may lag (the write's answer crosses the slow proxy after the write is
        // visible); the generations tell: one rollout per change.
        for name in &names {
            assert_eq!(
                support::fixtures::generation(c, ns, Kind::Deployment, name).await,
                4,
                "{name}: 3 changes, 3 rollouts"
            );
        }
        controller.stop().await;
    })
    .await;
}

#[tokio::test]
async fn with_a_third_of_all_requests_answered_429_every_change_is_handled_once() {
    use support::proxy::api_server_addr;
    use support::throttle::Throttle;
    with_temp_ns("throttled-api", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        let names = four_deployments_on_cm(&ctx).await;
        // From the start: the first lists, the checkpoint and every write are throttled too.
        let throttle = Throttle::start(api_server_addr(), 3).await;
        let controller = start_scoped_via(throttle.addr, ns, "throttled").await;
        wait_stored(&controller, names.len()).await;
        let started = tokio::time::Instant::now();
        const CHANGES: i64 = 5;
        for n in 1..=CHANGES {
            let value = n.to_string();
            patch_configmap(c, ns, "cm", json!({ "data": { "k": value } })).await;
            for name in &names {
                ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", &value)])).await;
            }
        }
        let (requests, throttled) = throttle.counts();
        let failed = controller.metric("reloader_action_total{result=\"error\",workload_kind=\"Deployment\"}").await;
        let retried = controller.metric("reloader_retries_total").await;
        println!(
            "429 for 1 request in 3: {requests} requests reached the proxy, answered 429: {throttled:?}; {CHANGES} \
             changes x {} workloads handled in {:?}, {failed} writes failed, {retried} changes retried by the engine \
             (kube's client retries each 429 after its Retry-After, as client-go does)",
            names.len(),
            started.elapsed()
        );
        assert!(throttled.get("PATCH").is_some_and(|n| *n > 0), "writes were throttled: {throttled:?}");
        assert!(throttled.get("GET").is_some_and(|n| *n > 0), "lists and watches were throttled: {throttled:?}");
        for name in &names {
            let rolled = support::fixtures::generation(c, ns, Kind::Deployment, name).await;
            assert_eq!(rolled, 1 + CHANGES, "{name}: {CHANGES} changes, {CHANGES} rollouts");
        }
        controller.stop().await;
    })
    .await;
}

#[tokio::test]
async fn an_api_server_without_streaming_lists_is_listed_as_before() {
    use support::proxy::api_server_addr;
    use support::throttle::Throttle;
    with_temp_ns("no-watch-list", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let names = four_deployments_on_cm(&ctx).await;
        // As a server without the WatchList feature: `sendInitialEvents` never arrives.
        let proxy = Throttle::dropping(api_server_addr(), "sendInitialEvents").await;
        let controller = start_scoped_via(proxy.addr, &ns, "old").await;
        wait_stored(&controller, names.len()).await;
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        assert!(log.contains("initial lists: LIST"), "the watches LIST: see {}", controller.log.display());
        patch_configmap(&ctx.client, &ns, "cm", json!({ "data": { "k": "1" } })).await;
        for name in &names {
            ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", "1")])).await;
        }
        controller.stop().await;

        // Against the real server the watches stream their initial lists.
        let direct = ctx.start_controller("direct", &[]).await;
        let log = std::fs::read_to_string(&direct.log).unwrap_or_default();
        assert!(log.contains("initial lists: streamed (WatchList)"), "see {}", direct.log.display());
        direct.stop().await;
    })
    .await;
}

#[tokio::test]
async fn settings_that_point_at_nothing_are_named_with_their_source_at_start_and_in_readyz() {
    with_temp_ns("nowhere", |_client, ns| async move {
        // Reloader v2's unprefixed variables are read: an environment that happens to hold
        // NAMESPACES=200 scopes the controller to a namespace that does not exist.
        let nowhere = format!("{ns}-nowhere");
        let gone = format!("{ns}-gone");
        let env = [("NAMESPACES", nowhere.as_str()), ("POD_NAMESPACE", gone.as_str())];
        let controller =
            Controller::start_with_kubeconfig_env(&format!("{ns}-nowhere"), &ns, &[], &kubeconfig_path(), &env).await;
        let readyz = controller.get("/readyz").await;
        controller.stop().await;
        assert!(
            readyz.contains(&format!(
                "watched namespace \"{nowhere}\" (from environment variable NAMESPACES) does not exist"
            )),
            "{readyz}"
        );
        assert!(
            readyz.contains(&format!(
                "the checkpoint namespace \"{gone}\" (from environment variable POD_NAMESPACE) does not exist"
            )),
            "{readyz}"
        );
    })
    .await;
}

/// Issue 49: an access review that failed (a 500, a timeout) was taken for "forbidden" and
/// its kind dropped for the life of the process. Now the kinds whose review failed are left
/// out and said so, asked about again with backoff, and watched once the server answers.
#[tokio::test]
async fn a_kind_whose_access_review_failed_is_watched_once_the_server_answers() {
    use support::throttle::Throttle;
    with_temp_ns("review-failed", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        support::fixtures::Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        // Every access and rules review answered 500 until released.
        let failing = Throttle::failing(support::proxy::api_server_addr(), "selfsubject").await;
        let controller = start_scoped_via(failing.addr, ns, "reviews-failing").await;
        let readyz = controller.get("/readyz").await;
        assert!(
            readyz.contains("cronjobs (batch) could not be checked") && readyz.contains("leader changed"),
            "{readyz}"
        );
        assert_eq!(controller.metric("reloader_watch_kinds_forbidden{kind=\"CronJob\"}").await, 1.0);
        failing.release();
        support::scenario::cronjobs_watched_and_reloaded(&controller, c, ns, "2").await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        controller.stop().await;
    })
    .await;
}
