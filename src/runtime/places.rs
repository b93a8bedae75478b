//! Where the controller keeps its own objects (checkpoints, Leases, meta-info), and settings
//! that point at nothing: each warning names the setting and where its value came from.

use crate::reload::checkpoint::{Checkpoint, MAX_PARTS};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

use crate::cli::{Environment, WatchSettings};
use crate::watch::access;

/// The namespace of the checkpoints and where that came from, for messages: the pod's
/// namespace, Reloader's `RELOADER_NAMESPACE`, the first watched namespace, or `default`.
pub fn checkpoint_namespace(env: &Environment, watch: &WatchSettings) -> (String, String) {
    if let Some(ns) = &env.pod_namespace {
        (ns.clone(), "environment variable POD_NAMESPACE".to_string())
    } else if let Some(ns) = &env.reloader_namespace {
        (ns.clone(), "environment variable RELOADER_NAMESPACE".to_string())
    } else if let Some(ns) = watch.scoped_namespaces.as_ref().and_then(|l| l.first()) {
        (ns.clone(), format!("the first watched namespace ({})", watch.scoped_namespaces_source))
    } else {
        ("default".to_string(), "the default (no POD_NAMESPACE)".to_string())
    }
}

/// Where a command for people looks for the fleet's Leases: `--leader-election-namespace`,
/// else `POD_NAMESPACE`, else the kubeconfig's namespace.
pub fn fleet_namespace(flag: &str, env: &Environment, client: &Client) -> String {
    [flag, env.pod_namespace.as_deref().unwrap_or_default()]
        .into_iter()
        .find(|n| !n.is_empty())
        .map_or_else(|| client.default_namespace().to_string(), str::to_string)
}

/// Settings that point at nothing: a watched namespace that does not exist, a checkpoint
/// namespace that does not exist or cannot be written. An answer of 403 (no right to look) is
/// no finding.
pub async fn check(
    client: &Client,
    watch: &WatchSettings,
    (checkpoint_namespace, checkpoint): (&str, &str),
    checkpoint_source: &str,
    fleet_pods: Option<&str>,
) -> Vec<String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let missing = |ns: String| {
        let namespaces = namespaces.clone();
        async move { matches!(namespaces.get(&ns).await, Err(kube::Error::Api(s)) if s.code == 404) }
    };
    let mut warnings = Vec::new();
    if checkpoint_namespace == "default" {
        // Every user of a cluster may write there in many clusters, and what is written there
        // steers this controller (its checkpoint, its Leases).
        warnings.push(format!(
            "the controller's own namespace is \"default\" (from {checkpoint_source}): whoever may write ConfigMaps \
             or Leases there can make it skip changes or stop it; install it in a namespace of its own"
        ));
    }
    for ns in watch.scoped_namespaces.iter().flatten() {
        if missing(ns.clone()).await {
            warnings.push(format!(
                "watched namespace {ns:?} (from {}) does not exist; nothing is reloaded there until it is created",
                watch.scoped_namespaces_source
            ));
        }
    }
    let configmaps = ("", "configmaps");
    if missing(checkpoint_namespace.to_string()).await {
        warnings.push(format!(
            "the checkpoint namespace {checkpoint_namespace:?} (from {checkpoint_source}) does not exist; changes made while no replica runs will be missed"
        ));
    } else if denied(client, configmaps, "update", checkpoint_namespace, Some(checkpoint)).await
        || denied(client, configmaps, "create", checkpoint_namespace, None).await
    {
        warnings.push(format!(
            "this service account may not write ConfigMaps in the checkpoint namespace {checkpoint_namespace:?} (from {checkpoint_source}); changes made while no replica runs will be missed"
        ));
    } else {
        // A shard whose checkpoint outgrows one ConfigMap is split into parts; without the right
        // to write them its checkpoint is never saved (`/readyz` would say so, late).
        let part = Checkpoint::part_name(checkpoint, 0);
        let part_denied = denied(client, configmaps, "update", checkpoint_namespace, Some(&part)).await
            || denied(client, configmaps, "delete", checkpoint_namespace, Some(&part)).await;
        if part_denied {
            warnings.push(format!(
                "this service account may not update and delete the checkpoint's parts ({part} to -part-{}) in {checkpoint_namespace:?}; a shard of more than about 7,000 resources cannot be checkpointed",
                MAX_PARTS - 1
            ));
        }
    }
    // A fleet believes a Lease holder only when it is one of the fleet's pods (it lists them).
    if let Some(pods) = fleet_pods
        && denied(client, ("", "pods"), "list", pods, None).await
    {
        warnings.push(format!(
            "this service account may not list pods in {pods:?}: Lease holders are not checked, so whoever may \
             write Leases there can hold shards"
        ));
    }
    warnings
}

/// Whether an access review denies `verb` (a review that fails is no finding: nothing is known).
async fn denied(client: &Client, resource: (&str, &str), verb: &str, namespace: &str, name: Option<&str>) -> bool {
    access::review(client, resource, verb, Some(namespace), name).await == access::Review::Denied
}
