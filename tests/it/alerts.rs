//! Alerts after reloads, webhook-only mode and profiling, against a local receiver and the
//! real API server.

use crate::support;

use std::time::Duration;

use crate::support::controller::{Controller, start_fleet_replica_with};
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_namespace, generation, patch_configmap,
};
use crate::support::receiver::Receiver;
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{kubeconfig_path, wait_for, with_temp_ns};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Start a controller for namespace `ctx.ns` with alerts configured by Reloader's environment
/// variables (`env`) and flags (`args`).
async fn start(ctx: &Ctx, name: &str, args: &[&str], env: &[(&str, &str)]) -> Controller {
    let ns = format!("--namespaces={}", ctx.ns);
    let mut all = vec![ns.as_str()];
    all.extend_from_slice(args);
    Controller::start_with_kubeconfig_env(&format!("{}-{name}", ctx.ns), &ctx.ns, &all, &kubeconfig_path(), env).await
}

/// Two Deployments using ConfigMap `cm`.
async fn two_workloads(ctx: &Ctx) {
    create_configmap(&ctx.client, &ctx.ns, "cm", &[("k", "0")]).await;
    for name in ["web", "api"] {
        Workload::new(Kind::Deployment, name).auto().env_from_configmap("cm").create(&ctx.client, &ctx.ns).await;
    }
}

async fn change(ctx: &Ctx, value: &str) {
    patch_configmap(&ctx.client, &ctx.ns, "cm", json!({ "data": { "k": value } })).await;
    for name in ["web", "api"] {
        ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", value)])).await;
    }
}

async fn wait_received(receiver: &Receiver, count: usize) -> Vec<support::receiver::Received> {
    wait_for(&format!("{count} delivered requests"), || async {
        let got = receiver.delivered();
        assert!(got.len() <= count, "more requests than expected: {got:#?}");
        (got.len() == count).then_some(got)
    })
    .await
}

fn v1_text(ns: &str, workload: &str) -> String {
    format!(
        "Reloader detected changes in *cm* of type *CONFIGMAP* in namespace *{ns}*. Hence reloaded *{workload}* of type *Deployment* in namespace *{ns}*"
    )
}

#[tokio::test]
async fn one_change_of_two_workloads_sends_two_alerts_in_reloaders_shape_per_sink() {
    with_temp_ns("alerts-v1", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        two_workloads(&ctx).await;
        for (i, sink) in ["slack", "teams", "gchat", "webhook"].into_iter().enumerate() {
            let receiver = Receiver::start().await;
            let url = receiver.url("/hook");
            // Reloader v1's way: the environment (Helm puts it in a Secret).
            let env = [
                ("ALERT_ON_RELOAD", "true"),
                ("ALERT_SINK", sink),
                ("ALERT_WEBHOOK_URL", url.as_str()),
                ("ALERT_ADDITIONAL_INFO", "cluster prod-1"),
            ];
            let controller = start(&ctx, sink, &[], &env).await;
            wait_stored(&controller, 2).await;
            change(&ctx, &format!("v1-{i}")).await;
            let got = wait_received(&receiver, 2).await;
            let mut texts = Vec::new();
            for request in &got {
                assert_eq!(request.uri, "/hook");
                let text = match sink {
                    "slack" => {
                        assert_eq!(request.content_type, "application/json");
                        let body: Value = serde_json::from_str(&request.body).expect("JSON");
                        assert!(
                            request
                                .body
                                .starts_with(r#"{"attachments":[{"color":"good","author_name":"Reloader","text":"#),
                            "{}",
                            request.body
                        );
                        body["attachments"][0]["text"].as_str().expect("text").to_string()
                    }
                    "teams" | "gchat" => {
                        assert_eq!(request.content_type, "application/json");
                        let body: Value = serde_json::from_str(&request.body).expect("JSON");
                        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{}", request.body);
                        body["text"].as_str().expect("text").to_string()
                    }
                    _ => {
                        assert_eq!(request.content_type, "text/plain");
                        request.body.clone()
                    }
                };
                texts.push(text);
            }
            texts.sort();
            let expected = |w: &str| {
                let text = format!("cluster prod-1 : {}", v1_text(&ns, w));
                if sink == "webhook" { text.replace('*', "") } else { text }
            };
            assert_eq!(texts, vec![expected("api"), expected("web")], "{sink}");
            assert_eq!(
                controller
                    .metric(&format!(
                        "reloader_alerts_total{{result=\"sent\",sink=\"{}\"}}",
                        if sink == "webhook" { "raw" } else { sink }
                    ))
                    .await,
                2.0
            );
            controller.stop().await;
        }
    })
    .await;
}

#[tokio::test]
async fn alert_structured_sends_reloader_v2s_payloads() {
    with_temp_ns("alerts-v2", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        two_workloads(&ctx).await;
        for (i, sink) in ["slack", "teams", "gchat", "raw"].into_iter().enumerate() {
            let receiver = Receiver::start().await;
            let url = format!("--alert-webhook-url={}", receiver.url("/v2"));
            let sink_flag = format!("--alert-sink={sink}");
            let args = [
                "--alert-on-reload",
                url.as_str(),
                sink_flag.as_str(),
                "--alert-structured",
                "--alert-additional-info=prod",
            ];
            let controller = start(&ctx, sink, &args, &[]).await;
            wait_stored(&controller, 2).await;
            change(&ctx, &format!("v2-{i}")).await;
            let got = wait_received(&receiver, 2).await;
            for request in got {
                assert_eq!(request.content_type, "application/json");
                let body: Value = serde_json::from_str(&request.body).expect("JSON");
                let workload = |w: &str| format!("{ns}/{w} (Deployment)");
                let resource = format!("{ns}/cm (ConfigMap)");
                match sink {
                    "slack" => {
                        let text = body["attachments"][0]["text"].as_str().expect("text");
                        assert!(text.starts_with("prod\nReloader triggered reload\n*Workload:* "), "{text}");
                        assert!(
                            text.contains(&format!("*Resource:* {resource}\n*Time:* ")) && text.ends_with(" UTC"),
                            "{text}"
                        );
                    }
                    "teams" => {
                        assert_eq!(body["@type"], "MessageCard");
                        assert_eq!(body["themeColor"], "0076D7");
                        let section = &body["sections"][0];
                        assert_eq!(section["activityTitle"], "Reloader triggered reload");
                        assert_eq!(section["activitySubtitle"], "prod");
                        assert_eq!(section["facts"][1], json!({ "name": "Resource", "value": resource }));
                    }
                    "gchat" => {
                        let card = &body["cards"][0];
                        assert_eq!(card["header"], json!({ "title": "Reloader triggered reload", "subtitle": "prod" }));
                        assert_eq!(
                            card["sections"][0]["widgets"][1]["keyValue"],
                            json!({ "topLabel": "Resource", "content": resource })
                        );
                    }
                    _ => {
                        assert_eq!(body["event"], "reload");
                        assert_eq!(body["resourceKind"], "ConfigMap");
                        assert_eq!(body["additional"], "prod");
                        let name = body["workloadName"].as_str().expect("a name");
                        assert!(workload(name).ends_with("(Deployment)") && body["workloadKind"] == "Deployment");
                        assert!(
                            body["timestamp"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
                            "{body}"
                        );
                    }
                }
            }
            controller.stop().await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_failing_receiver_is_retried_a_dead_one_slows_nothing_and_a_proxy_is_used() {
    with_temp_ns("alerts-faults", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "0")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;

        // 500, then 200: the alert arrives once, after a retry.
        let receiver = Receiver::start().await;
        receiver.script(&[500]);
        let url = receiver.url("/hook");
        let env = [("ALERT_ON_RELOAD", "true"), ("ALERT_SINK", "slack"), ("ALERT_WEBHOOK_URL", url.as_str())];
        let controller = start(&ctx, "retry", &[], &env).await;
        wait_stored(&controller, 1).await;
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "1" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "1")])).await;
        wait_received(&receiver, 1).await;
        assert_eq!(receiver.received().len(), 2, "one 500, then the retry");
        controller.stop().await;

        // A proxy: the request for an unreachable sink goes to the proxy (absolute-form target).
        let proxy = Receiver::start().await;
        // A Slack-style URL: its path is the credential, and must never reach a log line.
        let token = "xoxb-s3cr3t-t0ken";
        let dead = format!("http://127.0.0.1:{}/services/T000/B000/{token}", support::controller::free_port());
        let proxy_url = proxy.url("");
        let env = [
            ("ALERT_ON_RELOAD", "true"),
            ("ALERT_WEBHOOK_URL", dead.as_str()),
            ("ALERT_WEBHOOK_PROXY", proxy_url.as_str()),
        ];
        let controller = start(&ctx, "proxy", &[], &env).await;
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        let via = wait_received(&proxy, 1).await;
        assert_eq!(via[0].uri, dead, "the proxy gets the sink's URL");
        controller.stop().await;

        // A burst of 50 changes with a live and with a dead receiver, in one run.
        let mut took = Vec::new();
        for (label, url) in [("live", receiver.url("/hook")), ("dead", dead.clone())] {
            let env = [("ALERT_ON_RELOAD", "true"), ("ALERT_WEBHOOK_URL", url.as_str())];
            let controller = start(&ctx, label, &[], &env).await;
            wait_stored(&controller, 1).await;
            let started = Instant::now();
            for n in 0..50 {
                patch_configmap(c, ns, "cm", json!({ "data": { "k": format!("{label}-{n}") } })).await;
            }
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", &format!("{label}-49"))])).await;
            took.push((label, started.elapsed()));
            if label == "dead" {
                wait_for("failed alerts to be counted", || async {
                    (controller.metric("reloader_alerts_total{result=\"failed\",sink=\"raw\"}").await >= 1.0)
                        .then_some(())
                })
                .await;
                assert!(controller.logged("sending an alert failed"), "see {}", controller.log.display());
                assert!(!controller.logged(token), "the webhook token is in the log: {}", controller.log.display());
            }
            controller.stop().await;
        }
        println!("50 changes with a live receiver: {:?}; with a dead one: {:?}", took[0].1, took[1].1);
    })
    .await;
}

#[tokio::test]
async fn webhook_only_mode_writes_no_workload_and_delivers_a_change_made_during_an_outage_once() {
    with_temp_ns("webhook-mode", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        two_workloads(&ctx).await;
        Workload::new(Kind::Deployment, "other").auto().env_from_configmap("unrelated").create(c, ns).await;
        let receiver = Receiver::start().await;
        let flag = format!("--webhook-url={}", receiver.url("/pipeline"));
        let controller = start(&ctx, "first", &[flag.as_str()], &[]).await;
        wait_stored(&controller, 3).await;

        patch_configmap(c, ns, "cm", json!({ "data": { "k": "1" } })).await;
        let got = wait_received(&receiver, 1).await;
        let body: Value = serde_json::from_str(&got[0].body).expect("JSON");
        assert_eq!(got[0].content_type, "application/json");
        assert_eq!(body["webhook"], "update successful", "v1's key");
        assert_eq!((body["kind"].as_str(), body["resourceName"].as_str()), (Some("configmap"), Some("cm")));
        assert_eq!(body["hash"], cm_hash(&[("k", "1")]));
        let mut names: Vec<&str> =
            body["workloads"].as_array().expect("workloads").iter().filter_map(|w| w["name"].as_str()).collect();
        names.sort();
        assert_eq!(names, ["api", "web"]);
        for name in ["web", "api"] {
            assert_eq!(generation(c, ns, Kind::Deployment, name).await, 1, "webhook mode writes no workload");
        }

        // An outage: the change is retried, not marked handled; a restart meanwhile loses nothing.
        receiver.answer_always(Some(503));
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        wait_for("the receiver to refuse a try", || async { (receiver.received().len() >= 2).then_some(()) }).await;
        controller.stop().await;
        receiver.answer_always(None);
        let controller = start(&ctx, "second", &[flag.as_str()], &[]).await;
        let got = wait_received(&receiver, 2).await;
        let body: Value = serde_json::from_str(&got[1].body).expect("JSON");
        assert_eq!(body["hash"], cm_hash(&[("k", "2")]));
        // A later change shows nothing else was pending.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
        let got = wait_received(&receiver, 3).await;
        let hashes: Vec<String> = got
            .iter()
            .map(|r| {
                serde_json::from_str::<Value>(&r.body).expect("JSON")["hash"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        assert_eq!(hashes, [cm_hash(&[("k", "1")]), cm_hash(&[("k", "2")]), cm_hash(&[("k", "3")])]);
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, 1);
        controller.stop().await;
    })
    .await;
}

/// Issue 39: in webhook-only mode the POST was awaited on the engine's loop, so a receiver that
/// hangs held every other change for up to 31 s (three tries of 10 s). A POST is now in flight
/// beside the others: a change of another resource is delivered while the first is held.
#[tokio::test]
async fn a_webhook_receiver_that_hangs_holds_up_only_its_own_change() {
    with_temp_ns("webhook-hang", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        for cm in ["slow", "fast"] {
            create_configmap(c, ns, cm, &[("k", "0")]).await;
            Workload::new(Kind::Deployment, &format!("uses-{cm}")).auto().env_from_configmap(cm).create(c, ns).await;
        }
        let receiver = Receiver::start().await;
        receiver.hold("\"resourceName\":\"slow\"");
        let flag = format!("--webhook-url={}", receiver.url("/pipeline"));
        let controller = start(&ctx, "hang", &[flag.as_str()], &[]).await;
        wait_stored(&controller, 2).await;
        patch_configmap(c, ns, "slow", json!({ "data": { "k": "1" } })).await;
        wait_for("the receiver to hold the first change", || async { (receiver.held() == 1).then_some(()) }).await;
        patch_configmap(c, ns, "fast", json!({ "data": { "k": "1" } })).await;
        let got = wait_received(&receiver, 1).await;
        assert!(got[0].body.contains("\"resourceName\":\"fast\""), "{}", got[0].body);
        assert_eq!(
            receiver.held(),
            1,
            "the other change was delivered while the first is still held, on its first try"
        );
        receiver.release();
        let got = wait_received(&receiver, 2).await;
        assert!(got[1].body.contains("\"resourceName\":\"slow\""), "{}", got[1].body);
        controller.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_fleet_alerts_each_reload_once_across_a_sigterm() {
    with_temp_ns("alerts-fleet", |client, home| async move {
        let label = format!("reloader-fleet.test/alerts={home}");
        let namespaces: Vec<String> = (0..10).map(|i| format!("{home}-{i}")).collect();
        for ns in &namespaces {
            create_namespace(
                &client,
                ns,
                json!({ "reloader-fleet.test/alerts": home, support::TEST_LABEL: "alerts-fleet" }),
            )
            .await;
            create_configmap(&client, ns, "cm", &[("k", "0")]).await;
            Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, ns).await;
        }
        let receiver = Receiver::start().await;
        let url = format!("--alert-webhook-url={}", receiver.url("/hook"));
        let selector = format!("--namespace-selector={label}");
        let args = [selector.as_str(), "--alert-on-reload", url.as_str(), "--alert-structured"];
        let a = start_fleet_replica_with(&home, &format!("{home}-a"), &args, &kubeconfig_path()).await;
        let b = start_fleet_replica_with(&home, &format!("{home}-b"), &args, &kubeconfig_path()).await;
        wait_for("both replicas active", || async {
            (a.metric("reloader_shards_active").await + b.metric("reloader_shards_active").await == 16.0).then_some(())
        })
        .await;
        let mut b = Some(b);
        for round in ["1", "2"] {
            if round == "2"
                && let Some(b) = b.take()
            {
                b.stop().await;
            }
            for ns in &namespaces {
                patch_configmap(&client, ns, "cm", json!({ "data": { "k": round } })).await;
            }
            for ns in &namespaces {
                let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
                ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", round)])).await;
            }
        }
        let got = wait_received(&receiver, 20).await;
        for ns in &namespaces {
            let here = got.iter().filter(|r| r.body.contains(&format!("\"workloadNamespace\":\"{ns}\""))).count();
            assert_eq!(here, 2, "{ns}: two reloads, two alerts");
        }
        // Nothing late: a moment more brings no 21st alert.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(receiver.delivered().len(), 20);
        a.stop().await;
        let namespaces_api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
        for ns in &namespaces {
            let _ = namespaces_api.delete(ns, &Default::default()).await;
        }
    })
    .await;
}

#[tokio::test]
async fn go_tool_pprof_reads_a_profile_fetched_from_a_running_controller() {
    with_temp_ns("pprof", |client, ns| async move {
        let ctx = Ctx::new(client, ns.clone(), Strategy::EnvVars);
        let port = support::controller::free_port();
        let addr = format!("--pprof-addr=127.0.0.1:{port}");
        let controller = start(&ctx, "pprof", &["--enable-pprof", addr.as_str()], &[]).await;
        // Work to sample while the profile runs: 20 Deployments rolled 10 times.
        create_configmap(&ctx.client, &ctx.ns, "cm", &[("k", "0")]).await;
        for i in 0..20 {
            Workload::new(Kind::Deployment, &format!("web-{i}"))
                .auto()
                .env_from_configmap("cm")
                .create(&ctx.client, &ctx.ns)
                .await;
        }
        wait_stored(&controller, 20).await;
        let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=3");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let fetch = tokio::spawn(async move { reqwest::get(url).await?.bytes().await });
        for n in 1..=10 {
            let value = n.to_string();
            patch_configmap(&ctx.client, &ctx.ns, "cm", json!({ "data": { "k": value } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web-19", Cm, "cm", &cm_hash(&[("k", &value)])).await;
        }
        let profile = fetch.await.expect("the fetch task").expect("a profile");
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{ns}.pprof"));
        std::fs::write(&path, &profile).expect("save the profile");
        let output = tokio::process::Command::new("go")
            .args(["tool", "pprof", "-top"])
            .arg(&path)
            .output()
            .await
            .expect("run go tool pprof");
        let top = String::from_utf8_lossy(&output.stdout);
        println!("{}", top.lines().take(12).collect::<Vec<_>>().join("\n"));
        assert!(output.status.success(), "go tool pprof failed: {}", String::from_utf8_lossy(&output.stderr));
        assert!(top.contains("flat%") && !top.contains("Total samples = 0 "), "no samples taken:\n{top}");
        controller.stop().await;
    })
    .await;
}
