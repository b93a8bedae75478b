//! What is watched: the kinds the flags ask for, less those the API server does not serve and
//! (for the controller) those this ServiceAccount may not watch, each dropped with a warning.

use kube::Client;
use tracing::{info, warn};

use crate::cli::WatchSettings;
use crate::reload::Strategy;
use crate::reload::explain::Scope;
use crate::watch::access::{self, Collection};
use crate::watch::{ResourceKind, WorkloadKind};

/// The kinds the watches open.
#[derive(Clone, Debug)]
pub struct Watched {
    pub workload_kinds: Vec<WorkloadKind>,
    pub configmaps: bool,
    pub secrets: bool,
    /// The Secrets Store CSI driver's SecretProviderClasses and their pod statuses.
    pub csi: bool,
}

impl Watched {
    /// The resource kinds watched: what explain and the lint count as able to exist.
    pub fn resources(&self) -> Vec<ResourceKind> {
        [
            (self.configmaps, ResourceKind::ConfigMap),
            (self.secrets, ResourceKind::Secret),
            (self.csi, ResourceKind::SecretProviderClass),
        ]
        .into_iter()
        .filter_map(|(on, kind)| on.then_some(kind))
        .collect()
    }

    /// What explain decides with.
    pub fn scope(&self, strategy: Strategy) -> Scope {
        Scope {
            strategy,
            kinds: self.workload_kinds.clone(),
            resources: self.resources(),
            damping: None,
            orphaned_env_vars: Default::default(),
        }
    }

    /// Every collection the watches open.
    fn collections(&self) -> Vec<Collection> {
        let mut wanted: Vec<Collection> = self.workload_kinds.iter().map(|k| collection(*k)).collect();
        if self.configmaps {
            wanted.push(Collection { kind: "ConfigMap", group: "", plural: "configmaps" });
        }
        if self.secrets {
            wanted.push(Collection { kind: "Secret", group: "", plural: "secrets" });
        }
        if self.csi {
            let group = "secrets-store.csi.x-k8s.io";
            wanted.push(Collection { kind: "SecretProviderClass", group, plural: "secretproviderclasses" });
            let plural = "secretproviderclasspodstatuses";
            wanted.push(Collection { kind: "SecretProviderClassPodStatus", group, plural });
        }
        wanted
    }

    /// Leave out each kind this ServiceAccount may not watch (not retried into an unready
    /// controller: what is left keeps reloading); a message for each.
    pub async fn drop_forbidden(
        &mut self,
        client: &Client,
        namespaces: Option<&[String]>,
    ) -> Vec<(&'static str, String)> {
        let mut dropped = Vec::new();
        for refused in access::forbidden(client, &self.collections(), namespaces).await {
            let kind = refused.collection.kind;
            warn!(kind, warning = %refused.message(), "a kind cannot be watched; it is left out");
            self.workload_kinds.retain(|k| k.kind() != kind);
            match kind {
                "ConfigMap" => self.configmaps = false,
                "Secret" => self.secrets = false,
                "SecretProviderClass" | "SecretProviderClassPodStatus" => self.csi = false,
                _ => {}
            }
            dropped.push((kind, refused.message()));
        }
        dropped
    }
}

fn collection(kind: WorkloadKind) -> Collection {
    Collection { kind: kind.kind(), group: kind.spec().group, plural: kind.spec().plural }
}

/// The kinds the flags ask for that the API server serves.
pub async fn discover(client: &Client, settings: &WatchSettings) -> Watched {
    let workload_kinds = served_kinds(client, settings).await;
    let csi = settings.csi
        && {
            let served = is_served(client, "secrets-store.csi.x-k8s.io/v1", "secretproviderclasspodstatuses").await;
            if !served {
                warn!(
                    "--enable-csi-integration is set but the API server does not serve secrets-store.csi.x-k8s.io/v1 secretproviderclasspodstatuses; CSI reloads are off"
                );
            }
            served
        };
    let watched = Watched { workload_kinds, configmaps: settings.configmaps, secrets: settings.secrets, csi };
    info!(kinds = ?watched.workload_kinds, csi, "watching these workload kinds");
    watched
}

/// The workload kinds to watch: the ones not ignored, less Argo Rollouts unless
/// `--is-Argo-Rollouts` is exactly `true`, and less DeploymentConfigs unless `--is-openshift`
/// is `true` or detection (`auto`, empty) finds them served. A kind whose API is not served is
/// not watched (a watch of it would never list, and the controller would never be ready);
/// if the flag asked for it explicitly, a warning says so.
async fn served_kinds(client: &Client, settings: &WatchSettings) -> Vec<WorkloadKind> {
    use WorkloadKind::{DeploymentConfig, Rollout};
    let mut out = Vec::new();
    for &kind in &settings.workload_kinds {
        // Whether the user asked for the kind by a flag, so its absence deserves a warning.
        let (wanted, asked) = match kind {
            Rollout => (settings.argo_rollouts, Some("--is-Argo-Rollouts=true")),
            DeploymentConfig => {
                let openshift = settings.openshift.as_str();
                (openshift != "false", (openshift == "true").then_some("--is-openshift=true"))
            }
            WorkloadKind::Custom(_) => (true, Some("--custom-kinds-file")),
            // Built-in kinds are always served: no discovery (a failed call must not drop them).
            _ => {
                out.push(kind);
                continue;
            }
        };
        if !wanted {
            continue;
        }
        let spec = kind.spec();
        if !is_served(client, &kind.api_version(), spec.plural).await {
            if let Some(flag) = asked {
                warn!(kind = spec.kind, flag, api = %kind.api_version(), "the flag asks for this kind but the API server does not serve it; not watching it");
            }
        } else if asked.is_none() && !access::forbidden(client, &[collection(kind)], None).await.is_empty() {
            // Detected, not asked for: without the RBAC to watch it the controller would never
            // be ready (OpenShift serves DeploymentConfigs to installs that grant no access).
            warn!(kind = spec.kind, api = %kind.api_version(), "detected, but this service account may not list and watch it; not watching it (set --is-openshift=true and grant the RBAC to roll it)");
        } else {
            out.push(kind);
        }
    }
    out
}

/// Whether the API server serves `plural` in `api_version` (discovery; an error counts as no).
async fn is_served(client: &Client, api_version: &str, plural: &str) -> bool {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == plural),
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(err) => {
            warn!(api = api_version, error = %err, "API discovery failed; taking the API as not served");
            false
        }
    }
}
