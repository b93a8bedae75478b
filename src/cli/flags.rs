//! The flags, grouped by the room they configure, with Reloader v1's spellings and type quirks
//! plus the v2 additions. Every flag of the process is in this file: [`super::Args`] flattens
//! the groups into one parser.

use std::net::SocketAddr;
use std::time::Duration;

use crate::reload::Strategy;
use crate::shard::Placement;
use crate::watch::HashForm;

use super::values::{
    coalesce_window, csv_list, damping_window, go_bool, leader_election_duration, parse_addr, parse_rate,
    parse_strategy,
};

/// How changes are acted on: the reload room's flags.
#[derive(Debug, clap::Args)]
pub struct ReloadFlags {
    /// Reload every workload that references a changed resource, annotated or not.
    #[arg(long, env = "AUTO_RELOAD_ALL", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub auto_reload_all: bool,
    /// How a reload is recorded: env-vars or annotations.
    #[arg(long, env = "RELOAD_STRATEGY", default_value = "env-vars", value_parser = parse_strategy, global = true)]
    pub reload_strategy: Strategy,
    /// Reload when a referenced resource is created (only the exact value "true" enables it).
    #[arg(long, env = "RELOAD_ON_CREATE", default_value = "false", global = true)]
    pub reload_on_create: String,
    /// Reload when a referenced resource is deleted (only the exact value "true" enables it).
    #[arg(long, env = "RELOAD_ON_DELETE", default_value = "false", global = true)]
    pub reload_on_delete: String,
    /// With --reload-on-create, treat every resource present at start as created.
    #[arg(long, env = "SYNC_AFTER_RESTART", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub sync_after_restart: bool,
    /// With each reload write, also remove the STAKATER_* env vars of ConfigMaps and Secrets
    /// the workload no longer references (never a rollout of their own); false keeps them,
    /// as Reloader does.
    #[arg(long, env = "REMOVE_ORPHANED_ENV_VARS", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub remove_orphaned_env_vars: bool,
    /// Remove those STAKATER_* env vars at once: a workload edited to stop referencing a
    /// ConfigMap or Secret gets a write of its own (one rollout, within the rollout budget).
    /// Implies --remove-orphaned-env-vars.
    #[arg(long, env = "REMOVE_ORPHANED_ENV_VARS_AT_ONCE", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub remove_orphaned_env_vars_at_once: bool,
    /// A workload that reads only some keys of a ConfigMap or Secret (configMapKeyRef,
    /// secretKeyRef, volume items, subPath) reloads only when one of those keys changes;
    /// envFrom and whole-volume mounts keep whole-object reloads. The workload annotation
    /// reloader-fleet.stakater.com/reload-on-used-keys ("true"/"false") wins.
    #[arg(long, env = "RELOAD_ON_USED_KEYS", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub reload_on_used_keys: bool,
    /// Send a webhook instead of reloading.
    #[arg(long, env = "WEBHOOK_URL", default_value = "", global = true)]
    pub webhook_url: String,
    /// Name of the ConfigMap holding the checkpoint of acted-on hashes (one per shard).
    #[arg(long, env = "CHECKPOINT_NAME", default_value = "reloader-fleet-checkpoint", global = true)]
    pub checkpoint_name: String,
    /// Changes of several resources of one workload within this time of the first become one
    /// write (one rollout) recording every new hash; 0 writes each change at once (Reloader's
    /// behaviour). A workload's `reloader-fleet.stakater.com/coalesce-window` wins.
    #[arg(long, env = "COALESCE_WINDOW", default_value = "0", value_parser = coalesce_window, global = true)]
    pub coalesce_window: Duration,
    /// The rollout budget: at most this many workload writes a second per replica, served in
    /// turn across namespaces, none dropped; 0 means no budget.
    #[arg(long, env = "MAX_ROLLOUTS_PER_SECOND", default_value = "0", value_parser = parse_rate, global = true)]
    pub max_rollouts_per_second: f64,
    /// At most this many workloads rolling out at once per replica: a write waits until an
    /// earlier one's rollout is complete (`kubectl rollout status`), or 10 minutes; 0: no limit.
    #[arg(long, env = "MAX_CONCURRENT_ROLLOUTS", default_value = "0", global = true)]
    pub max_concurrent_rollouts: usize,
    /// Flap damping: a ConfigMap or Secret that changes more than this many times within
    /// --flap-damping-window rolls its workloads at most once per window, with its latest
    /// data (a Warning Event says so); 0 turns it off, as Reloader has it.
    #[arg(long, env = "FLAP_DAMPING_CHANGES", default_value = "0", value_parser = clap::value_parser!(u32).range(0..=10_000), global = true)]
    pub flap_damping_changes: u32,
    /// The flap damping window (a Go duration of at most an hour).
    #[arg(long, env = "FLAP_DAMPING_WINDOW", default_value = "1m", value_parser = damping_window, global = true)]
    pub flap_damping_window: Duration,
    /// Reload writes in flight at once per replica, at most: changes to different workloads
    /// are written side by side (a fan-out of 200 is not 200 round trips one after the
    /// other); one workload's writes stay in order. 1 writes one at a time. (64 fits one
    /// HTTP/2 connection, and takes a share of a busy API server beside the deployment
    /// controller's own writes: a fan-out of 200 lands in 0.5 s where 16 take 0.7 s.)
    #[arg(long, env = "MAX_CONCURRENT_WRITES", default_value = "64", value_parser = clap::value_parser!(u32).range(1..=1024), global = true)]
    pub max_concurrent_writes: u32,
    /// Check Reloader annotations when objects are stored and report each mistake (a misspelt
    /// key, `match` on a workload, a reload list naming a missing ConfigMap...) once as a
    /// Warning Event on the object; `false` turns it off.
    #[arg(long, env = "ANNOTATION_LINT", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "true", global = true)]
    pub annotation_lint: bool,
}

/// What is watched: kinds, namespaces and selectors (the watch room).
#[derive(Debug, clap::Args)]
pub struct WatchFlags {
    /// Argo Rollouts support (only the exact value "true" enables it).
    #[arg(long = "is-Argo-Rollouts", env = "IS_ARGO_ROLLOUTS", default_value = "false", global = true)]
    pub is_argo_rollouts: String,
    /// OpenShift DeploymentConfig support: true, false, or empty/auto to detect.
    #[arg(long, env = "IS_OPENSHIFT", default_value = "", global = true)]
    pub is_openshift: String,
    /// Watch SecretProviderClassPodStatuses of the Secrets Store CSI driver.
    #[arg(long, env = "ENABLE_CSI_INTEGRATION", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_csi_integration: bool,
    /// Resource kinds not to watch: configmaps or secrets (not both).
    #[arg(long, env = "RESOURCES_TO_IGNORE", value_parser = csv_list, global = true)]
    pub resources_to_ignore: Vec<String>,
    /// A YAML file declaring custom resources to roll like Deployments: per kind its
    /// apiVersion, plural and the path of its pod template (docs/custom-kinds.md).
    #[arg(long, env = "CUSTOM_KINDS_FILE", global = true)]
    pub custom_kinds_file: Option<String>,
    /// Workload kinds never reloaded: jobs, cronjobs (v2 also accepts deployments, ...).
    #[arg(long, env = "IGNORED_WORKLOAD_TYPES", value_parser = csv_list, global = true)]
    pub ignored_workload_types: Vec<String>,
    /// Watch only these namespaces, with per-namespace watches (namespaced RBAC is enough).
    #[arg(long, env = "NAMESPACES", value_parser = csv_list, global = true)]
    pub namespaces: Vec<String>,
    /// Namespaces never served (cluster-wide mode only).
    #[arg(long, env = "NAMESPACES_TO_IGNORE", value_parser = csv_list, global = true)]
    pub namespaces_to_ignore: Vec<String>,
    /// Label selector namespaces must match (cluster-wide mode only).
    #[arg(long, env = "NAMESPACE_SELECTOR", value_parser = csv_list, global = true)]
    pub namespace_selector: Vec<String>,
    /// Label selector ConfigMaps and Secrets must match (applied by the API server).
    #[arg(long, env = "RESOURCE_LABEL_SELECTOR", value_parser = csv_list, global = true)]
    pub resource_label_selector: Vec<String>,
    /// The hash a reload records: sha1 (Reloader's) or sha512-256 (SHA-512/256 of the same
    /// input, for ConfigMaps and Secrets). Either form recorded for the current data counts as
    /// up to date, so switching rolls nothing: the new form is written with the next change.
    #[arg(long, env = "HASH", default_value = "sha1", global = true)]
    pub hash: HashForm,
}

/// The annotation keys, each overridable as in Reloader.
#[derive(Debug, clap::Args)]
pub struct AnnotationFlags {
    #[arg(long, env = "AUTO_ANNOTATION", default_value = "reloader.stakater.com/auto", global = true)]
    pub auto_annotation: String,
    #[arg(
        long,
        env = "CONFIGMAP_AUTO_ANNOTATION",
        default_value = "configmap.reloader.stakater.com/auto",
        global = true
    )]
    pub configmap_auto_annotation: String,
    #[arg(long, env = "SECRET_AUTO_ANNOTATION", default_value = "secret.reloader.stakater.com/auto", global = true)]
    pub secret_auto_annotation: String,
    #[arg(
        long,
        env = "SECRETPROVIDERCLASS_AUTO_ANNOTATION",
        default_value = "secretproviderclass.reloader.stakater.com/auto",
        global = true
    )]
    pub secretproviderclass_auto_annotation: String,
    #[arg(long, env = "CONFIGMAP_ANNOTATION", default_value = "configmap.reloader.stakater.com/reload", global = true)]
    pub configmap_annotation: String,
    #[arg(long, env = "SECRET_ANNOTATION", default_value = "secret.reloader.stakater.com/reload", global = true)]
    pub secret_annotation: String,
    #[arg(
        long,
        env = "SECRETPROVIDERCLASS_ANNOTATION",
        default_value = "secretproviderclass.reloader.stakater.com/reload",
        global = true
    )]
    pub secretproviderclass_annotation: String,
    #[arg(
        long,
        env = "CONFIGMAP_EXCLUDE_ANNOTATION",
        default_value = "configmaps.exclude.reloader.stakater.com/reload",
        global = true
    )]
    pub configmap_exclude_annotation: String,
    #[arg(
        long,
        env = "SECRET_EXCLUDE_ANNOTATION",
        default_value = "secrets.exclude.reloader.stakater.com/reload",
        global = true
    )]
    pub secret_exclude_annotation: String,
    #[arg(
        long,
        env = "SECRETPROVIDERCLASS_EXCLUDE_ANNOTATION",
        default_value = "secretproviderclasses.exclude.reloader.stakater.com/reload",
        global = true
    )]
    pub secretproviderclass_exclude_annotation: String,
    #[arg(long, env = "AUTO_SEARCH_ANNOTATION", default_value = "reloader.stakater.com/search", global = true)]
    pub auto_search_annotation: String,
    #[arg(long, env = "SEARCH_MATCH_ANNOTATION", default_value = "reloader.stakater.com/match", global = true)]
    pub search_match_annotation: String,
    #[arg(long, env = "IGNORE_ANNOTATION", default_value = "reloader.stakater.com/ignore", global = true)]
    pub ignore_annotation: String,
    #[arg(
        long,
        env = "PAUSE_DEPLOYMENT_ANNOTATION",
        default_value = "deployment.reloader.stakater.com/pause-period",
        global = true
    )]
    pub pause_deployment_annotation: String,
    #[arg(
        long,
        env = "PAUSE_DEPLOYMENT_TIME_ANNOTATION",
        default_value = "deployment.reloader.stakater.com/paused-at",
        global = true
    )]
    pub pause_deployment_time_annotation: String,
}

/// Leader election, shards and their Leases (the lease and shard rooms).
#[derive(Debug, clap::Args)]
pub struct FleetFlags {
    /// Run several replicas; requires POD_NAME and POD_NAMESPACE.
    #[arg(long, env = "ENABLE_HA", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_ha: bool,
    #[arg(long, env = "LEADER_ELECTION_ID", default_value = "stakater-reloader-lock", global = true)]
    pub leader_election_id: String,
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE", default_value = "", global = true)]
    pub leader_election_namespace: String,
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = leader_election_duration, global = true)]
    pub leader_election_lease_duration: Duration,
    #[arg(long, env = "LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = leader_election_duration, global = true)]
    pub leader_election_renew_deadline: Duration,
    #[arg(long, env = "LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = leader_election_duration, global = true)]
    pub leader_election_retry_period: Duration,
    #[arg(long, env = "LEADER_ELECTION_RELEASE_ON_CANCEL", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "true", global = true)]
    pub leader_election_release_on_cancel: bool,
    /// Number of shards namespaces are spread over; each is held through its own Lease.
    /// Every replica of a fleet must use the same value. (`fleet status` reads it from the
    /// Leases and needs it only when they record none.)
    #[arg(long, env = "SHARDS", default_value = "1", global = true)]
    pub shards: u32,
    /// How namespaces are placed on shards: `hashring` (the best balance) or `fnv-ranges`
    /// (ranges of the FNV-1a hash of the namespace, which an API server with the alpha
    /// ShardedListAndWatch feature filters by, so each replica receives only its shards'
    /// events). Every replica of a fleet must use the same value.
    #[arg(long, env = "SHARD_PLACEMENT", default_value = "hashring", global = true)]
    pub shard_placement: Placement,
    /// With several replicas and watches that load shards one by one (server-sharded or
    /// `--namespaces`), each replica also loads the shards it would be given if any one other
    /// replica left, so a SIGTERM or a crash moves Leases, not data. About twice the watches,
    /// memory and decoding per replica, for a handoff without lists.
    #[arg(long, env = "HOT_STANDBY", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub hot_standby: bool,
}

/// What the process serves: metrics, probes, the data views, profiles (the admin room).
#[derive(Debug, clap::Args)]
pub struct ServingFlags {
    /// Address of the metrics and admin server (Reloader serves it on :9090).
    #[arg(long, env = "METRICS_ADDR", default_value = ":9090", value_parser = parse_addr, global = true)]
    pub metrics_addr: SocketAddr,
    /// Also count reloads per namespace (`reloader_reload_executed_total_by_namespace`), as
    /// `METRICS_COUNT_BY_NAMESPACE=enabled` does.
    #[arg(long, value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub metrics_count_by_namespace: bool,
    /// Where `/healthz` and `/readyz` are also served, as Reloader v2 serves them (its chart's
    /// probes use :8080); the metrics address answers them too.
    #[arg(long, env = "HEALTH_ADDR", default_value = ":8080", value_parser = parse_addr, global = true)]
    pub health_addr: SocketAddr,
    /// Where the data views are served (`/shards`, `/namespaces`, `/explain`: they name
    /// namespaces, workloads and Secrets). Loopback by default: reach them with `kubectl
    /// port-forward`. `:9091` serves them to the pod network (protect it with a NetworkPolicy);
    /// empty turns them off.
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:9091", global = true)]
    pub admin_addr: String,
    /// Serve CPU profiles in the pprof format at `/debug/pprof/profile` on `--pprof-addr`.
    #[arg(long, env = "ENABLE_PPROF", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_pprof: bool,
    /// Where the profiles are served: loopback by default (Reloader's `:6060` serves them to
    /// anyone who reaches the pod), so `kubectl port-forward` is the way in.
    #[arg(long, env = "PPROF_ADDR", default_value = "127.0.0.1:6060", global = true)]
    pub pprof_addr: String,
}

/// Alerts sent after each reload.
#[derive(Debug, clap::Args)]
pub struct AlertFlags {
    #[arg(long, env = "ALERT_ON_RELOAD", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub alert_on_reload: bool,
    #[arg(long, env = "ALERT_WEBHOOK_URL", default_value = "", global = true)]
    pub alert_webhook_url: String,
    #[arg(long, env = "ALERT_SINK", default_value = "", global = true)]
    pub alert_sink: String,
    #[arg(long, env = "ALERT_PROXY", default_value = "", global = true)]
    pub alert_proxy: String,
    #[arg(long, env = "ALERT_ADDITIONAL_INFO", default_value = "", global = true)]
    pub alert_additional_info: String,
    #[arg(long, env = "ALERT_STRUCTURED", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub alert_structured: bool,
}

/// Logging and the connection to the API server.
#[derive(Debug, clap::Args)]
pub struct ProcessFlags {
    /// Log format: json, or empty for text.
    #[arg(long, env = "LOG_FORMAT", default_value = "", global = true)]
    pub log_format: String,
    /// Log level: trace, debug, info, warning, error, fatal or panic.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,
    /// Offer HTTP/2 to the API server: many watches share a few connections (at most 90
    /// requests open on each; watches and other requests on separate connections). A server
    /// that answers with HTTP/1.1 gets HTTP/1.1 (a connection per open request, as before);
    /// `false` offers only HTTP/1.1.
    #[arg(long, env = "HTTP2", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "true", global = true)]
    pub http2: bool,
    /// Requests a second to the API server, at most, as client-go's `--kube-api-qps`; 0 (the
    /// default) sets no limit: the API server's priority and fairness answers 429 when it must,
    /// and the client retries after `Retry-After`. (Reloader's client-go default is 5/s, which
    /// makes a 2,000-workload fan-out take minutes.)
    #[arg(long, env = "KUBE_API_QPS", default_value = "0", value_parser = parse_rate, global = true)]
    pub kube_api_qps: f64,
    /// Requests allowed at once above `--kube-api-qps` (client-go's `--kube-api-burst`); 0: the
    /// same as the rate.
    #[arg(long, env = "KUBE_API_BURST", default_value = "0", global = true)]
    pub kube_api_burst: u32,
}
