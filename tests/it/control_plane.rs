//! The local control plane is real: objects round-trip through kube-apiserver and etcd, and with
//! fake nodes a Deployment really rolls (new ReplicaSet, pods Ready).

use crate::support;

use crate::support::{wait_for, with_temp_ns};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn deployment(name: &str, replicas: i32, configmap: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "envFrom": [{ "configMapRef": { "name": configmap } }]
                }] }
            }
        }
    }))
    .expect("static deployment JSON")
}

#[tokio::test]
async fn configmap_and_deployment_round_trip_through_the_api_server() {
    with_temp_ns("round-trip", |client, ns| async move {
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "settings" }, "data": { "greeting": "hello" }
        }))
        .expect("static configmap JSON");
        let created = configmaps.create(&PostParams::default(), &cm).await.expect("create configmap");
        deployments.create(&PostParams::default(), &deployment("web", 1, "settings")).await.expect("create deployment");

        let patch = json!({ "data": { "greeting": "bonjour" } });
        let updated = configmaps
            .patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("update configmap");
        assert_ne!(
            created.metadata.resource_version, updated.metadata.resource_version,
            "an update must produce a new resourceVersion"
        );

        let read = configmaps.get("settings").await.expect("read configmap back");
        assert_eq!(read.data.unwrap_or_default().get("greeting").map(String::as_str), Some("bonjour"));
        let read = deployments.get("web").await.expect("read deployment back");
        assert_eq!(read.spec.and_then(|s| s.replicas), Some(1));
    })
    .await;
}

#[tokio::test]
async fn deployment_pods_become_ready_and_a_template_change_makes_a_new_replicaset() {
    let client = support::client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node_count = nodes.list(&ListParams::default()).await.expect("list nodes").items.len();
    assert!(
        node_count > 0,
        "no nodes: this test needs fake nodes; start the control plane with `hack/cluster up --nodes 2`"
    );

    with_temp_ns("rollout", |client, ns| async move {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
        deployments
            .create(&PostParams::default(), &deployment("web", 2, "absent-is-fine-for-kwok"))
            .await
            .expect("create deployment");

        let ready = |want_updated: i64| {
            let deployments = deployments.clone();
            move || {
                let deployments = deployments.clone();
                async move {
                    let d = deployments.get("web").await.ok()?;
                    let generation = d.metadata.generation?;
                    let status = d.status?;
                    let done = status.observed_generation == Some(generation)
                        && status.ready_replicas == Some(2)
                        && status.updated_replicas == Some(2)
                        && i64::from(status.replicas.unwrap_or(0)) == want_updated;
                    done.then_some(())
                }
            }
        };
        wait_for("2 Ready pods of the first ReplicaSet", ready(2)).await;

        let patch = json!({ "spec": { "template": { "metadata": { "annotations": { "changed": "1" } } } } });
        deployments.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await.expect("patch pod template");
        wait_for("a second ReplicaSet", || {
            let replicasets = replicasets.clone();
            async move {
                let count = replicasets.list(&ListParams::default()).await.ok()?.items.len();
                (count >= 2).then_some(())
            }
        })
        .await;
        wait_for("2 Ready pods of the new ReplicaSet", ready(2)).await;
    })
    .await;
}
