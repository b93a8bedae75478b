//! Bad input stays local, and awkward objects work: a bad annotation on one workload is a
//! Warning Event there and a metric, while every other workload keeps reloading; 1 MiB
//! Secrets, binaryData, names with dots.
//!
//! A workload with zero containers cannot exist (the API server rejects it); the rule that
//! picks no container for it is unit-tested in `reload::rules`.

use crate::support;

use std::collections::BTreeMap;

use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap, recorded_env};
use crate::support::scenario::{scenario, wait_stored};
use crate::support::wait_for;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::DataHash;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::json;

#[tokio::test]
async fn a_bad_annotation_is_an_event_on_its_workload_and_others_keep_reloading() {
    scenario("bad-annotation", Strategy::EnvVars, &[], |ctx, controller| async move {
        ctx.expect_lint_findings();
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "bad-regex")
            .annotate("configmap.reloader.stakater.com/reload", "(unclosed")
            .env_from_configmap("cm")
            .create(c, ns)
            .await;
        Workload::new(Kind::Deployment, "bad-bool")
            .annotate("reloader.stakater.com/auto", "yes please")
            .env_from_configmap("cm")
            .create(c, ns)
            .await;
        Workload::new(Kind::Deployment, "good").auto().env_from_configmap("cm").create(c, ns).await;
        wait_stored(&controller, 3).await;

        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        let hash = cm_hash(&[("k", "2")]);
        ctx.wait_reloaded(Kind::Deployment, "good", Cm, "cm", &hash).await;
        ctx.assert_not_reloaded(Kind::Deployment, "bad-regex", Cm, "cm", &hash).await;

        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        for workload in ["bad-regex", "bad-bool"] {
            let selector = format!("involvedObject.name={workload},reason=InvalidAnnotation,type=Warning");
            wait_for(&format!("a Warning Event on {workload}"), || async {
                let list = events.list(&ListParams::default().fields(&selector)).await.ok()?;
                (!list.items.is_empty()).then_some(())
            })
            .await;
        }
        assert!(controller.metric("reloader_invalid_annotations_total").await >= 2.0);

        // Still running and still reloading after the bad input.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "good", Cm, "cm", &cm_hash(&[("k", "3")])).await;
        controller
    })
    .await;
}

#[tokio::test]
async fn large_secrets_binary_data_and_dotted_names_reload() {
    scenario("awkward-objects", Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        // Just under the 1 MiB object limit once base64-encoded and wrapped.
        let big = |fill: u8| vec![fill; 700 * 1024];
        let secret = |fill: u8| -> Secret {
            serde_json::from_value(json!({
                "metadata": { "name": "big.secret" },
                "data": { "blob": k8s_openapi::ByteString(big(fill)) }
            }))
            .expect("secret JSON")
        };
        let secrets: Api<Secret> = Api::namespaced(c.clone(), ns);
        secrets.create(&PostParams::default(), &secret(b'a')).await.expect("create a large secret");
        let binary = |bytes: &[u8]| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": { "name": "my.app.config" },
                "data": { "text": "t" },
                "binaryData": { "bin": k8s_openapi::ByteString(bytes.to_vec()) }
            }))
            .expect("configmap JSON")
        };
        Api::<ConfigMap>::namespaced(c.clone(), ns)
            .create(&PostParams::default(), &binary(b"\x00\x01"))
            .await
            .expect("create a binary configmap");
        Workload::new(Kind::Deployment, "web")
            .auto()
            .container(json!({
                "name": "app",
                "envFrom": [{ "configMapRef": { "name": "my.app.config" } }],
                "volumeMounts": [{ "name": "s", "mountPath": "/s" }]
            }))
            .volume(json!({ "name": "s", "secret": { "secretName": "big.secret" } }))
            .create(c, ns)
            .await;
        wait_stored(&controller, 1).await;

        secrets
            .patch(
                "big.secret",
                &PatchParams::default(),
                &Patch::Merge(json!({ "data": { "blob": k8s_openapi::ByteString(big(b'b')) } })),
            )
            .await
            .expect("update the large secret");
        let expected = DataHash::of_secret(&BTreeMap::from([("blob".to_string(), big(b'b'))])).to_string();
        ctx.wait_reloaded(Kind::Deployment, "web", Sec, "big.secret", &expected).await;

        patch_configmap(c, ns, "my.app.config", json!({ "binaryData": { "bin": "AgM=" } })).await;
        let expected = DataHash::of_configmap(
            &BTreeMap::from([("text".to_string(), "t".to_string())]),
            &BTreeMap::from([("bin".to_string(), vec![2u8, 3u8])]),
        )
        .to_string();
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "my.app.config", &expected).await;
        let env = recorded_env(c, ns, Kind::Deployment, "web", Cm, "my.app.config").await.expect("recorded");
        assert_eq!(env.container, "app");
        let w = support::fixtures::workload_json(c, ns, Kind::Deployment, "web").await;
        let names: Vec<&str> = w["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(names.contains(&"STAKATER_MY_APP_CONFIG_CONFIGMAP"), "{names:?}");
        assert!(names.contains(&"STAKATER_BIG_SECRET_SECRET"), "{names:?}");
        controller
    })
    .await;
}

#[tokio::test]
async fn big_and_odd_objects_reload_and_cost_little_memory_each() {
    scenario("big-objects", Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        let configmaps: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
        let rss_before = controller.rss_kib();
        // The API server's limit is 1 MiB per object: a ConfigMap and a Secret just under it.
        let mib = |fill: char| fill.to_string().repeat(1_000_000);
        let cm = |name: &str, data: serde_json::Value| -> ConfigMap {
            serde_json::from_value(json!({ "metadata": { "name": name }, "data": data })).expect("configmap JSON")
        };
        configmaps.create(&PostParams::default(), &cm("one-mib", json!({ "blob": mib('a') }))).await.expect("a 1 MiB ConfigMap");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "one-mib-secret" }, "data": { "blob": k8s_openapi::ByteString(vec![b's'; 760_000]) }
        }))
        .expect("secret JSON");
        Api::<Secret>::namespaced(c.clone(), ns).create(&PostParams::default(), &secret).await.expect("a big Secret");
        let many: serde_json::Map<String, serde_json::Value> = (0..5_000).map(|i| (format!("key-{i}"), json!(format!("v{i}")))).collect();
        configmaps.create(&PostParams::default(), &cm("five-thousand-keys", json!(many))).await.expect("5,000 keys");
        let long_name = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
        assert_eq!(long_name.len(), 253);
        configmaps.create(&PostParams::default(), &cm(&long_name, json!({ "k": "1" }))).await.expect("a 253-character name");
        let odd: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "not-utf8" }, "binaryData": { "bin": k8s_openapi::ByteString(vec![0xff, 0xfe, 0x00, 0xc3]) }
        }))
        .expect("configmap JSON");
        configmaps.create(&PostParams::default(), &odd).await.expect("non-UTF-8 binaryData");

        // 50 containers and 200 volumes: every resource above, and 196 small ConfigMaps.
        let mut wide = Workload::new(Kind::Deployment, "wide").auto();
        let mut sources = vec!["one-mib".to_string(), "five-thousand-keys".to_string(), long_name.clone(), "not-utf8".to_string()];
        for i in 0..196 {
            let name = format!("small-{i}");
            configmaps.create(&PostParams::default(), &cm(&name, json!({ "k": "1" }))).await.expect("a small ConfigMap");
            sources.push(name);
        }
        wide = wide.volume(json!({ "name": "v-secret", "secret": { "secretName": "one-mib-secret" } }));
        for (i, name) in sources.iter().enumerate() {
            wide = wide.volume(json!({ "name": format!("v-{i}"), "configMap": { "name": name } }));
        }
        for i in 0..50 {
            // Container i mounts volumes 4i..4i+3; container 0 also the Secret.
            let mut mounts: Vec<serde_json::Value> =
                (4 * i..4 * i + 4).map(|v| json!({ "name": format!("v-{v}"), "mountPath": format!("/v/{v}") })).collect();
            if i == 0 {
                mounts.push(json!({ "name": "v-secret", "mountPath": "/secret" }));
            }
            wide = wide.container(json!({ "name": format!("c-{i}"), "volumeMounts": mounts }));
        }
        wide.create(c, ns).await;
        wait_stored(&controller, 1).await;
        support::scenario::wait_stored_resources(&controller, 200).await;
        let rss_loaded = controller.rss_kib();

        // Each changes; the container mounting it records the new hash.
        patch_configmap(c, ns, "one-mib", json!({ "data": { "blob": mib('b') } })).await;
        let hash = DataHash::of_configmap(&BTreeMap::from([("blob".to_string(), mib('b'))]), &BTreeMap::new()).to_string();
        ctx.wait_reloaded(Kind::Deployment, "wide", Cm, "one-mib", &hash).await;
        patch_configmap(c, ns, "five-thousand-keys", json!({ "data": { "key-4999": "changed" } })).await;
        let mut many: BTreeMap<String, String> = (0..5_000).map(|i| (format!("key-{i}"), format!("v{i}"))).collect();
        many.insert("key-4999".into(), "changed".into());
        ctx.wait_reloaded(Kind::Deployment, "wide", Cm, "five-thousand-keys", &DataHash::of_configmap(&many, &BTreeMap::new()).to_string()).await;
        patch_configmap(c, ns, &long_name, json!({ "data": { "k": "2" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "wide", Cm, &long_name, &cm_hash(&[("k", "2")])).await;
        patch_configmap(c, ns, "not-utf8", json!({ "binaryData": { "bin": "/w==" } })).await;
        let odd = DataHash::of_configmap(&BTreeMap::new(), &BTreeMap::from([("bin".to_string(), vec![0xffu8])])).to_string();
        ctx.wait_reloaded(Kind::Deployment, "wide", Cm, "not-utf8", &odd).await;
        patch_configmap(c, ns, "small-195", json!({ "data": { "k": "2" } })).await;
        let last = support::wait_for("the 50th container to record small-195", || async {
            recorded_env(c, ns, Kind::Deployment, "wide", Cm, "small-195").await.filter(|r| r.hash == cm_hash(&[("k", "2")]))
        })
        .await;
        assert_eq!(last.container, "c-49", "the container mounting it");
        let objects = 202.0;
        println!(
            "controller RSS {rss_before} KiB before, {rss_loaded} KiB with a 1 MiB ConfigMap, a 760 KB Secret, 5,000 keys, \
             a 253-character name, non-UTF-8 binaryData, 196 small ConfigMaps and a 50-container, 201-volume Deployment: \
             {:.1} KiB per object",
            (rss_loaded as f64 - rss_before as f64) / objects
        );
        controller
    })
    .await;
}

/// Regression (issue 39): a pause period of years panicked the engine at every start (float
/// seconds to Duration), and a coalesce window of years panicked the timer queue at the next
/// change, so one annotated Deployment stopped reloading for the whole cluster.
#[tokio::test]
async fn durations_of_years_in_annotations_never_stop_the_controller() {
    scenario("years", Strategy::EnvVars, &[], |ctx, controller| async move {
        ctx.expect_lint_findings();
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        let period = "deployment.reloader.stakater.com/pause-period";
        Workload::new(Kind::Deployment, "paused-for-ever")
            .auto()
            .annotate(period, "99999999999999999999999h")
            .annotate("deployment.reloader.stakater.com/paused-at", "2026-01-01T00:00:00Z")
            .env_from_configmap("cm")
            .create(c, ns)
            .await;
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(c.clone(), ns);
        deployments
            .patch("paused-for-ever", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "paused": true } })))
            .await
            .expect("pause the Deployment");
        Workload::new(Kind::Deployment, "window-of-years")
            .auto()
            .annotate(reloader_fleet::reload::COALESCE_WINDOW, "20000h")
            .env_from_configmap("cm")
            .create(c, ns)
            .await;
        Workload::new(Kind::Deployment, "good").auto().env_from_configmap("cm").create(c, ns).await;
        wait_stored(&controller, 3).await;

        // An unusable period must not leave the Deployment paused for ever: it is resumed.
        wait_for("the pause with an unusable period to end", || async {
            let d = deployments.get("paused-for-ever").await.ok()?;
            (d.spec?.paused != Some(true)).then_some(())
        })
        .await;
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        let hash = cm_hash(&[("k", "2")]);
        // The window of years is refused: the workload is written at once, as without one.
        ctx.wait_reloaded(Kind::Deployment, "window-of-years", Cm, "cm", &hash).await;
        ctx.wait_reloaded(Kind::Deployment, "good", Cm, "cm", &hash).await;
        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        wait_for("a Warning Event on the window of years", || async {
            let selector = "involvedObject.name=window-of-years,reason=InvalidAnnotation,type=Warning";
            let list = events.list(&ListParams::default().fields(selector)).await.ok()?;
            list.items.iter().any(|e| e.message.as_deref().unwrap_or_default().contains("longer than")).then_some(())
        })
        .await;
        wait_for("the lint to report both durations", || async {
            let found =
                controller.metric("reloader_annotation_lint_findings_total{finding=\"invalid-duration\"}").await;
            (found >= 2.0).then_some(())
        })
        .await;

        // Still running and still reloading.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "good", Cm, "cm", &cm_hash(&[("k", "3")])).await;
        assert!(!controller.logged("panicked"), "see {}", controller.log.display());
        controller
    })
    .await;
}

/// Issue 39: a ConfigMap of the checkpoint's name that this controller did not write (no
/// managed-by label) was trusted: its lines made the controller replay or skip changes. It is
/// now ignored (the current state is the baseline), logged and counted, and replaced.
#[tokio::test]
async fn a_checkpoint_this_controller_did_not_write_is_not_trusted() {
    support::with_temp_ns("foreign-checkpoint", |client, ns| async move {
        let (c, ns) = (&client, ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        // Trusted, this line would say cm changed since it was last acted on: web would roll.
        let planted: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "reloader-fleet-checkpoint" },
            "data": { "checkpoint": format!("C {ns} cm 0000000000000000") }
        }))
        .expect("configmap JSON");
        Api::<ConfigMap>::namespaced(c.clone(), ns).create(&PostParams::default(), &planted).await.expect("plant");
        let scope = format!("--namespaces={ns}");
        // Ready once what the checkpoint says changed has been written.
        let controller = support::controller::Controller::start(ns, ns, &[scope.as_str()]).await;
        assert_eq!(support::fixtures::generation(c, ns, Kind::Deployment, "web").await, 1, "web was rolled");
        assert_eq!(controller.metric("reloader_errors_total{type=\"checkpoint_rejected\"}").await, 1.0);
        assert!(controller.logged("was not written by reloader-fleet"), "see {}", controller.log.display());
        // Replaced by a checkpoint of its own, which the next start trusts.
        wait_for("the checkpoint to be replaced", || async {
            let cm = Api::<ConfigMap>::namespaced(c.clone(), ns).get("reloader-fleet-checkpoint").await.ok()?;
            let labels = cm.metadata.labels.unwrap_or_default();
            (labels.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("reloader-fleet")).then_some(())
        })
        .await;
        controller.stop().await;
    })
    .await;
}
