//! `reloader-meta-info`: the ConfigMap Reloader publishes in its own namespace with its build
//! information, its effective options and its Deployment, for tooling that reads it (Reloader's
//! console, inventory scripts). Same name, label and keys as Reloader v1 writes.
//!
//! Published by one replica of a fleet: the one acting on shard 0, each time it takes the
//! shard up (so a new holder rewrites what an older version of the fleet wrote). Reloader
//! writes it at every start; `RELOADER_NAMESPACE` unset means it is not written, with a
//! warning, as in Reloader.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::reload::api::timed;

/// The ConfigMap's name and label, as Reloader v1 writes them.
pub const NAME: &str = "reloader-meta-info";
pub const LABEL: (&str, &str) = ("reloader.stakater.com/meta-info", "reloader");
/// The shard whose holder publishes.
const PUBLISHER_SHARD: u32 = 0;

/// What the ConfigMap says: where this controller runs and how it is set up.
#[derive(Clone, Debug)]
pub struct MetaInfo {
    /// `RELOADER_NAMESPACE` (the chart sets it from the pod's namespace).
    pub namespace: String,
    /// `RELOADER_DEPLOYMENT_NAME`.
    pub deployment: String,
    /// `reloaderOptions`: the effective options under Reloader's JSON keys.
    pub options: Value,
}

impl MetaInfo {
    /// The ConfigMap's data: `buildInfo`, `reloaderOptions` and `deploymentInfo`, each JSON.
    pub fn data(&self) -> BTreeMap<String, String> {
        let build = json!({
            // Reloader reports its Go toolchain here; this binary is built with Rust.
            "goVersion": "rust",
            "releaseVersion": env!("CARGO_PKG_VERSION"),
            "commitHash": option_env!("RELOADER_REVISION").unwrap_or("unknown"),
            "commitTime": option_env!("RELOADER_BUILD_TIME").unwrap_or("0001-01-01T00:00:00Z"),
            "edition": "oss",
        });
        // An ObjectMeta as Go's encoding/json writes one with only a name and a namespace.
        let deployment = json!({ "name": self.deployment, "namespace": self.namespace, "creationTimestamp": null });
        BTreeMap::from([
            ("buildInfo".to_string(), build.to_string()),
            ("reloaderOptions".to_string(), self.options.to_string()),
            ("deploymentInfo".to_string(), deployment.to_string()),
        ])
    }
}

/// Publish `meta` each time this replica takes up the publishing shard (`active` says which
/// shards the engine acts on), until `shutdown`. Failures are logged, never fatal: the
/// ConfigMap is for people and their tools.
pub async fn run(
    client: Client,
    meta: MetaInfo,
    mut active: watch::Receiver<BTreeSet<u32>>,
    shutdown: CancellationToken,
) {
    let mut held = false;
    loop {
        let now = active.borrow_and_update().contains(&PUBLISHER_SHARD);
        if now && !held {
            match publish(&client, &meta).await {
                Ok(()) => info!(namespace = %meta.namespace, name = NAME, "published the meta-info ConfigMap"),
                Err(err) => {
                    warn!(namespace = %meta.namespace, name = NAME, error = %err, "publishing the meta-info ConfigMap failed")
                }
            }
        }
        held = now;
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = active.changed() => if changed.is_err() { return },
        }
    }
}

/// Create the ConfigMap, or replace an existing one (Reloader updates it in place).
///
/// # Errors
/// The API call's error, or a timeout.
pub async fn publish(client: &Client, meta: &MetaInfo) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &meta.namespace);
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.to_string()),
            namespace: Some(meta.namespace.clone()),
            labels: Some(BTreeMap::from([(LABEL.0.to_string(), LABEL.1.to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(meta.data()),
        ..ConfigMap::default()
    };
    match timed(api.get_opt(NAME)).await? {
        Some(existing) => {
            cm.metadata.resource_version = existing.metadata.resource_version;
            timed(api.replace(NAME, &PostParams::default(), &cm)).await.map(drop)
        }
        None => timed(api.create(&PostParams::default(), &cm)).await.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_has_reloaders_keys() {
        let meta = MetaInfo {
            namespace: "reloader".into(),
            deployment: "reloader-reloader".into(),
            options: json!({ "autoReloadAll": false }),
        };
        let data = meta.data();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["buildInfo", "deploymentInfo", "reloaderOptions"]);
        let build: Value = serde_json::from_str(&data["buildInfo"]).expect("JSON");
        for key in ["goVersion", "releaseVersion", "commitHash", "commitTime", "edition"] {
            assert!(build.get(key).is_some(), "buildInfo.{key}");
        }
        assert_eq!(build["releaseVersion"], env!("CARGO_PKG_VERSION"));
        assert_eq!(
            data["deploymentInfo"],
            r#"{"creationTimestamp":null,"name":"reloader-reloader","namespace":"reloader"}"#
        );
    }
}
