//! How the engine is set up: what it reloads with, and how fast changes become writes.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;

use super::FlapDamping;
use crate::reload::strategy::{OrphanedEnvVars, Strategy};
use crate::reload::webhook::Webhook;
use crate::reload::{Keys, Options};
use crate::shard::Ring;
use crate::watch::Compactor;

/// How the engine reloads.
#[derive(Clone, Debug)]
pub struct Config {
    pub strategy: Strategy,
    pub keys: Keys,
    pub options: Options,
    /// `--reload-on-create`: a resource that appears reloads the workloads that use it.
    pub reload_on_create: bool,
    /// `--reload-on-delete`: a resource that disappears reloads (env var removed).
    pub reload_on_delete: bool,
    /// `--sync-after-restart`: with reload-on-create, every resource counts as created at start.
    pub sync_after_restart: bool,
    /// What becomes of the `STAKATER_*` variables of resources a workload no longer
    /// references (`--remove-orphaned-env-vars`, `--remove-orphaned-env-vars-at-once`).
    pub orphaned_env_vars: OrphanedEnvVars,
    /// Where the checkpoint ConfigMaps live; one per shard, named `<checkpoint_name>-shard-<n>`
    /// (just `<checkpoint_name>` with a single shard).
    pub checkpoint_namespace: String,
    pub checkpoint_name: String,
    /// Namespace -> shard, as the watches use it.
    pub ring: Arc<Ring>,
    /// Who writes Events (`reportingController` / `reportingInstance`).
    pub reporter: Reporter,
    pub compactor: Compactor,
    /// Webhook-only mode: POST each change that would reload, write no workload.
    pub webhook: Option<Webhook>,
    /// How fast changes become writes.
    pub pacing: Pacing,
    /// The controller's own pod (`POD_NAME` in `POD_NAMESPACE`), for Events about the
    /// controller itself (a shard let go with its checkpoint unsaved); `None` outside a pod.
    pub pod: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

/// How fast changes become writes: coalescing, the rollout budget and writes in flight.
#[derive(Clone, Debug)]
pub struct Pacing {
    /// `--coalesce-window`: changes of several resources of one workload within this time of
    /// the first become one write (zero: each change is written at once, as Reloader does).
    /// A workload's own `reloader-fleet.stakater.com/coalesce-window` wins.
    pub coalesce_window: Duration,
    /// `--max-rollouts-per-second`: the rollout budget (`None`: none).
    pub max_rollouts_per_second: Option<f64>,
    /// `--max-concurrent-rollouts`: workloads rolling out at once, at most (`None`: no limit).
    pub max_concurrent_rollouts: Option<usize>,
    /// `--max-concurrent-writes`: reload writes in flight at once, at most (changes to
    /// different workloads; one workload's writes stay in order).
    pub max_concurrent_writes: usize,
    /// `--flap-damping-changes` and `--flap-damping-window` (`None`: off, as Reloader).
    pub flap_damping: Option<FlapDamping>,
}

impl Default for Pacing {
    /// Reloader's behaviour: every change written at once, no budget; 64 writes in flight.
    fn default() -> Self {
        Pacing {
            coalesce_window: Duration::ZERO,
            max_rollouts_per_second: None,
            max_concurrent_rollouts: None,
            max_concurrent_writes: 64,
            flap_damping: None,
        }
    }
}
