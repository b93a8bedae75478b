//! What is watched: the kinds the flags ask for, less those the API server does not serve and
//! (for the controller) those this ServiceAccount may not watch, each dropped with a warning.

use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cli::{ReloadSettings, WatchSettings};
use crate::reload::explain::Scope;
use crate::watch::access::{self, Collection};
use crate::watch::{ResourceKind, WorkloadKind};

/// The kinds the watches open.
#[derive(Clone, Debug)]
pub struct Watched {
    pub workload_kinds: Vec<WorkloadKind>,
    /// The workload kinds found served at start: those a later grant may bring back.
    wanted: Vec<WorkloadKind>,
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

    /// What explain decides with: these kinds and the reload settings that change a
    /// decision. The one place a scope is made, for `/explain` and `reloader explain` alike.
    pub fn scope(&self, reload: &ReloadSettings) -> Scope {
        Scope {
            strategy: reload.strategy,
            kinds: self.workload_kinds.clone(),
            resources: self.resources(),
            damping: reload.pacing.flap_damping,
            orphaned_env_vars: reload.orphaned_env_vars,
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

    /// Leave out each kind this ServiceAccount may not watch, or whose access could not be
    /// checked (not watched into an unready controller: what is left keeps reloading); each
    /// with its warning. [`recheck`] asks again and takes them up once allowed.
    pub async fn drop_forbidden(&mut self, client: &Client, namespaces: Option<&[String]>) -> Vec<access::Forbidden> {
        let refused = access::forbidden(client, &self.collections(), namespaces).await;
        for refusal in &refused {
            warn!(kind = refusal.collection.kind, warning = %refusal.message(), "a kind cannot be watched; it is left out");
            self.set(refusal.collection.kind, false);
        }
        refused
    }

    /// Watch (`on`) or leave out the collection of `kind` (the two CSI ones go together).
    fn set(&mut self, kind: &str, on: bool) {
        match kind {
            "ConfigMap" => self.configmaps = on,
            "Secret" => self.secrets = on,
            "SecretProviderClass" | "SecretProviderClassPodStatus" => self.csi = on,
            _ if on => {
                // Only a kind it was started with comes back (its place in the order kept).
                if let Some(kind) = self.wanted.iter().find(|k| k.kind() == kind)
                    && !self.workload_kinds.contains(kind)
                {
                    self.workload_kinds.push(*kind);
                }
            }
            _ => self.workload_kinds.retain(|k| k.kind() != kind),
        }
    }

    /// What the watch task watches.
    pub fn kinds(&self) -> crate::watch::Kinds {
        crate::watch::Kinds {
            workload_kinds: self.workload_kinds.clone(),
            configmaps: self.configmaps,
            secrets: self.secrets,
            csi: self.csi,
        }
    }
}

/// The first wait before asking again about a kind left out, and the longest (a grant is
/// noticed within it).
const RECHECK_MIN: std::time::Duration = std::time::Duration::from_secs(10);
const RECHECK_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// Ask again, with backoff and jitter, about the kinds left out at start (denied, or whose
/// review failed); each one allowed now is watched (`kinds` tells the watch task, which
/// relists), its warning withdrawn and its metric cleared. Runs until `shutdown`.
pub async fn recheck(
    client: Client,
    mut watched: Watched,
    mut pending: Vec<access::Forbidden>,
    namespaces: Option<Vec<String>>,
    (kinds, state, forbidden_kinds): (
        watch::Sender<crate::watch::Kinds>,
        crate::admin::AdminState,
        prometheus::IntGaugeVec,
    ),
    shutdown: tokio_util::sync::CancellationToken,
) {
    use backon::BackoffBuilder;
    let mut delays = backon::ExponentialBuilder::new()
        .with_min_delay(RECHECK_MIN)
        .with_max_delay(RECHECK_MAX)
        .with_jitter()
        .without_max_times()
        .build();
    while !pending.is_empty() {
        let delay = delays.next().unwrap_or(RECHECK_MAX);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let collections: Vec<access::Collection> = pending.iter().map(|f| f.collection.clone()).collect();
        let still = access::forbidden(&client, &collections, namespaces.as_deref()).await;
        let mut granted = false;
        for before in std::mem::take(&mut pending) {
            let now = still.iter().find(|f| f.collection == before.collection);
            match now {
                Some(now) => {
                    if now.message() != before.message() {
                        state.unwarn(&before.message());
                        state.warn(now.message());
                    }
                    pending.push(now.clone());
                }
                None => {
                    info!(kind = before.collection.kind, "a kind left out may be watched now; watching it");
                    state.unwarn(&before.message());
                    forbidden_kinds.with_label_values(&[before.collection.kind]).set(0);
                    watched.set(before.collection.kind, true);
                    granted = true;
                }
            }
        }
        if granted {
            kinds.send_replace(watched.kinds());
        }
    }
    shutdown.cancelled().await;
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
    let watched = Watched {
        wanted: workload_kinds.clone(),
        workload_kinds,
        configmaps: settings.configmaps,
        secrets: settings.secrets,
        csi,
    };
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
