//! Bad input stays local, and awkward objects work: a bad annotation on one workload is a
//! Warning Event there and a metric, while every other workload keeps reloading; 1 MiB
//! Secrets, binaryData, names with dots.
//!
//! A workload with zero containers cannot exist (the API server rejects it); the rule that
//! picks no container for it is unit-tested in `reload::rules`.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::DataHash;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::json;
use support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap, recorded_env};
use support::scenario::{scenario, wait_stored};
use support::wait_for;

#[tokio::test]
async fn a_bad_annotation_is_an_event_on_its_workload_and_others_keep_reloading() {
    scenario("bad-annotation", Strategy::EnvVars, &[], |ctx, controller| async move {
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
