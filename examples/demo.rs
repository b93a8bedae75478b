//! The demo's story, told against a running control plane and controller: a Deployment
//! whose ConfigMap is edited, and the rollout that follows. Run by `hack/demo`.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NS: &str = "reloader-demo";
const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NS).await?.is_some() {
        namespaces.delete(NS, &DeleteParams::default()).await?;
        wait("the previous demo namespace to go", || async {
            namespaces.get_opt(NS).await.ok()?.is_none().then_some(())
        })
        .await?;
    }
    namespaces.create(&PostParams::default(), &serde_json::from_value(json!({ "metadata": { "name": NS } }))?).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);

    step(
        "Create ConfigMap app-config (greeting=hello) and Deployment web (2 replicas, reloader.stakater.com/auto: \"true\")",
    );
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "app-config" }, "data": { "greeting": "hello" } }))?,
        )
        .await?;
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "web", "annotations": { "reloader.stakater.com/auto": "true" } },
                "spec": {
                    "replicas": 2,
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": {
                        "metadata": { "labels": { "app": "web" } },
                        "spec": { "containers": [{ "name": "app", "image": "registry.invalid/web:1",
                                                   "envFrom": [{ "configMapRef": { "name": "app-config" } }] }] }
                    }
                }
            }))?,
        )
        .await?;
    wait_rolled_out(&deployments).await?;
    show(&client).await?;

    step("Edit the ConfigMap: greeting=bonjour");
    let edited = Instant::now();
    configmaps
        .patch("app-config", &PatchParams::default(), &Patch::Merge(json!({ "data": { "greeting": "bonjour" } })))
        .await?;
    wait("the controller to record the new hash", || async {
        let d = deployments.get("web").await.ok()?;
        stakater_value(&d).map(|_| ())
    })
    .await?;
    println!("  reloader patched the Deployment {} ms after the edit", edited.elapsed().as_millis());
    wait_rolled_out(&deployments).await?;
    println!("  rollout complete {} ms after the edit", edited.elapsed().as_millis());
    show(&client).await?;
    step(
        "Done: a new ReplicaSet replaced the old one, its pods are Ready, and STAKATER_APP_CONFIG_CONFIGMAP holds the ConfigMap's SHA-1.",
    );
    Ok(())
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn stakater_value(d: &Deployment) -> Option<String> {
    let containers = &d.spec.as_ref()?.template.spec.as_ref()?.containers;
    containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name.starts_with("STAKATER_"))
        .and_then(|e| e.value.clone())
}

async fn wait_rolled_out(deployments: &Api<Deployment>) -> anyhow::Result<()> {
    wait("2 updated, Ready pods", || async {
        let d = deployments.get("web").await.ok()?;
        let generation = d.metadata.generation?;
        let s = d.status?;
        (s.observed_generation == Some(generation)
            && s.updated_replicas == Some(2)
            && s.ready_replicas == Some(2)
            && s.replicas == Some(2))
        .then_some(())
    })
    .await
}

async fn show(client: &Client) -> anyhow::Result<()> {
    let d = Api::<Deployment>::namespaced(client.clone(), NS).get("web").await?;
    println!(
        "  Deployment web: generation {}, STAKATER_APP_CONFIG_CONFIGMAP = {}",
        d.metadata.generation.unwrap_or(0),
        stakater_value(&d).unwrap_or_else(|| "(not set)".into())
    );
    for rs in Api::<ReplicaSet>::namespaced(client.clone(), NS).list(&ListParams::default()).await? {
        let status = rs.status.unwrap_or_default();
        println!(
            "  ReplicaSet {:<24} replicas {} ready {}",
            rs.metadata.name.unwrap_or_default(),
            status.replicas,
            status.ready_replicas.unwrap_or(0)
        );
    }
    for pod in Api::<Pod>::namespaced(client.clone(), NS).list(&ListParams::default()).await? {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        println!(
            "  Pod {:<32} on {:<12} ready {ready}",
            pod.metadata.name.unwrap_or_default(),
            pod.spec.and_then(|s| s.node_name).unwrap_or_default()
        );
    }
    Ok(())
}

async fn wait<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + DEADLINE;
    while Instant::now() < deadline {
        if check().await.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("timed out after {DEADLINE:?} waiting for {what}")
}
