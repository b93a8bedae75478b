//! Command-line flags, with Reloader v1's spellings and type quirks plus the v2 additions.
//!
//! Every flag can also come from the environment variable Reloader v2 reads (the flag name in
//! UPPER_SNAKE case) and from a YAML, JSON or TOML file given with `--config` (keys are flag
//! names). Precedence: command line, then environment, then file, then defaults.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use reloader_fleet::reload::duration::{COALESCE_WINDOW_MAX, GoDuration, LEADER_ELECTION_MAX};
use reloader_fleet::reload::{AlertConfig, Keys, Sink, Strategy, parse_go_duration};
use reloader_fleet::shard::{LabelSelector, NamespaceFilter, Placement, is_dns_label};
use reloader_fleet::watch::WorkloadKind;

/// A sharded, highly-available drop-in successor to Stakater Reloader.
#[derive(Debug, Parser)]
#[command(name = "reloader", version, args_override_self = true, args_conflicts_with_subcommands = false)]
pub struct Args {
    /// Read flags from this YAML, JSON or TOML file (keys are flag names without `--`).
    #[arg(long, env = "RELOADER_CONFIG", global = true)]
    pub config: Option<String>,

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
    /// Argo Rollouts support (only the exact value "true" enables it).
    #[arg(long = "is-Argo-Rollouts", env = "IS_ARGO_ROLLOUTS", default_value = "false", global = true)]
    pub is_argo_rollouts: String,
    /// OpenShift DeploymentConfig support: true, false, or empty/auto to detect.
    #[arg(long, env = "IS_OPENSHIFT", default_value = "", global = true)]
    pub is_openshift: String,
    /// Run several replicas; requires POD_NAME and POD_NAMESPACE.
    #[arg(long, env = "ENABLE_HA", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_ha: bool,
    /// Watch SecretProviderClassPodStatuses of the Secrets Store CSI driver.
    #[arg(long, env = "ENABLE_CSI_INTEGRATION", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_csi_integration: bool,
    /// Send a webhook instead of reloading.
    #[arg(long, env = "WEBHOOK_URL", default_value = "", global = true)]
    pub webhook_url: String,
    /// Resource kinds not to watch: configmaps or secrets (not both).
    #[arg(long, env = "RESOURCES_TO_IGNORE", value_parser = csv_list, global = true)]
    pub resources_to_ignore: Vec<String>,
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
    /// Log format: json, or empty for text.
    #[arg(long, env = "LOG_FORMAT", default_value = "", global = true)]
    pub log_format: String,
    /// Log level: trace, debug, info, warning, error, fatal or panic.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,

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

    /// Serve CPU profiles in the pprof format at `/debug/pprof/profile` on `--pprof-addr`.
    #[arg(long, env = "ENABLE_PPROF", value_parser = go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", global = true)]
    pub enable_pprof: bool,
    /// Where the profiles are served: loopback by default (Reloader's `:6060` serves them to
    /// anyone who reaches the pod), so `kubectl port-forward` is the way in.
    #[arg(long, env = "PPROF_ADDR", default_value = "127.0.0.1:6060", global = true)]
    pub pprof_addr: String,

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

    #[command(subcommand)]
    pub command: Option<Command>,

    /// Where each setting's value came from, for messages: `flag --namespaces`,
    /// `environment variable NAMESPACES`, `config file x.yaml` (filled in by [`parse`]).
    #[arg(skip)]
    pub sources: std::collections::BTreeMap<String, String>,
}

/// Commands for people; without one, `reloader` runs the controller.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Look at the fleet.
    Fleet {
        #[command(subcommand)]
        what: FleetCommand,
    },
    /// Say whether a change would reload a workload, and why: `explain deployment/web -n team-a`
    /// (every resource it uses or names) or `explain configmap/app -n team-a` (every workload
    /// a change concerns). Reads live objects with your kubeconfig; pass the controller's flags
    /// after it so that it decides with the same settings.
    Explain {
        /// KIND/NAME, KIND as kubectl takes it: deployment, deploy, daemonset, ds, statefulset,
        /// sts, cronjob, cj, job, rollout, deploymentconfig, dc, configmap, cm, secret,
        /// secretproviderclass, spc.
        target: String,
        /// The namespace (default: the kubeconfig's).
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
        /// text for people, json for scripts.
        #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
        output: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Print which replica holds which shard, lease ages and namespace counts.
    Status,
}

/// Parse the process arguments, with the config file's values placed before the command line
/// so that the command line wins.
pub fn parse() -> anyhow::Result<Args> {
    let mut cli: Vec<OsString> = std::env::args_os().collect();
    let first = Args::parse_from(cli.iter());
    let Some(path) = first.config.clone() else {
        return with_sources(cli, 0, "");
    };
    let file_args = file_args(&path)?;
    let program = cli.remove(0);
    let merged: Vec<OsString> =
        std::iter::once(program).chain(file_args.iter().map(OsString::from)).chain(cli).collect();
    with_sources(merged, file_args.len(), &path).with_context(|| format!("invalid value in config file {path}"))
}

/// Parse `argv`, whose first `from_file` arguments after the program name came from config
/// file `file`, and note where each setting's value came from (the last occurrence wins, as
/// in parsing).
fn with_sources(argv: Vec<OsString>, from_file: usize, file: &str) -> anyhow::Result<Args> {
    use clap::parser::ValueSource;
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().try_get_matches_from(argv)?;
    let mut args = Args::from_arg_matches(&matches)?;
    for arg in Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        let flag = format!("--{}", arg.get_long().unwrap_or(id));
        // Indices count the arguments after the program name from 1.
        let last_index = matches.indices_of(id).and_then(Iterator::max).unwrap_or(usize::MAX);
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) if last_index <= from_file => format!("config file {file}"),
            Some(ValueSource::CommandLine) => format!("flag {flag}"),
            Some(ValueSource::EnvVariable) => {
                format!("environment variable {}", arg.get_env().map(|e| e.to_string_lossy()).unwrap_or_default())
            }
            _ => format!("the default of {flag}"),
        };
        args.sources.insert(id.to_string(), source);
    }
    Ok(args)
}

fn file_args(path: &str) -> anyhow::Result<Vec<String>> {
    let settings = config::Config::builder()
        .add_source(config::File::with_name(path))
        .build()
        .with_context(|| format!("cannot read config file {path}"))?;
    let table = settings
        .try_deserialize::<std::collections::BTreeMap<String, config::Value>>()
        .with_context(|| format!("config file {path} must be a map of flag names to values"))?;
    let mut args = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        if key == "config" {
            bail!("config file {path}: `config` cannot be set from a config file");
        }
        match value.clone().into_array() {
            Ok(items) => {
                let joined: Vec<String> = items.into_iter().map(|v| v.to_string()).collect();
                args.push(format!("{flag}={}", joined.join(",")));
            }
            Err(_) => args.push(format!("{flag}={value}")),
        }
    }
    Ok(args)
}

/// A list flag's value as pflag reads a string slice: one line of CSV, so that a value in double
/// quotes keeps its commas (Reloader's chart renders `--namespace-selector="a=b,c!=d"`). Checked
/// here, split by [`csv_items`].
fn csv_list(value: &str) -> Result<String, String> {
    split_csv(value).map(|_| value.to_string())
}

/// Every item of list flag values (each occurrence one CSV line, already checked).
fn csv_items(values: &[String]) -> Vec<String> {
    values.iter().flat_map(|v| split_csv(v).unwrap_or_default()).collect()
}

/// One line of CSV as Go's encoding/csv reads it: fields split on commas, a field that starts
/// with `"` runs to its closing quote (`""` inside is a quote), a quote anywhere else is an error.
fn split_csv(line: &str) -> Result<Vec<String>, String> {
    if line.is_empty() {
        return Ok(Vec::new());
    }
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err(format!("{line:?}: a quoted value is not closed")),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err(format!("{line:?}: {c:?} after a closing quote (a comma was expected)")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err(format!("{line:?}: a quote inside a value that does not start with one")),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

/// Go's `strconv.ParseBool`, which pflag uses for boolean flags.
fn go_bool(value: &str) -> Result<bool, String> {
    reloader_fleet::reload::parse_go_bool(value)
        .ok_or_else(|| format!("{value:?} is not a boolean (expected true or false)"))
}

/// The slowest rate that is not "none": one a minute. (A rate closer to zero made a wait too
/// long for any clock: `--kube-api-qps=1e-300` panicked.)
const RATE_MIN: f64 = 1.0 / 60.0;
/// The fastest rate: more than any API server takes.
const RATE_MAX: f64 = 1_000_000.0;

/// A rate a second: 0 for none, else between one a minute and a million a second.
fn parse_rate(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(rate) if rate == 0.0 || (RATE_MIN..=RATE_MAX).contains(&rate) => Ok(rate),
        _ => Err(format!(
            "{value:?} is not a rate: a number a second between {RATE_MIN:.4} (one a minute) and {RATE_MAX}, or 0 for none"
        )),
    }
}

/// A leader-election timing: a Go duration of at most an hour.
fn leader_election_duration(value: &str) -> Result<Duration, String> {
    parse_go_duration(value, LEADER_ELECTION_MAX).map_err(|e| e.to_string())
}

/// A coalesce window: a Go duration of at most an hour.
fn coalesce_window(value: &str) -> Result<Duration, String> {
    parse_go_duration(value, COALESCE_WINDOW_MAX).map_err(|e| e.to_string())
}

fn parse_strategy(value: &str) -> Result<Strategy, String> {
    value.parse()
}

/// `:9090` (Go style, all interfaces) or `host:port`.
fn parse_addr(value: &str) -> Result<SocketAddr, String> {
    let full = if value.starts_with(':') { format!("0.0.0.0{value}") } else { value.to_string() };
    full.parse().map_err(|e| format!("{value:?} is not an address like :9090 or 127.0.0.1:9090 ({e})"))
}

/// The validated, typed configuration derived from the flags.
pub struct Settings {
    pub keys: Keys,
    pub watch_configmaps: bool,
    pub watch_secrets: bool,
    pub filter: NamespaceFilter,
    /// `Some` in namespace-scoped mode.
    pub scoped_namespaces: Option<Vec<String>>,
    /// Where the scoped namespaces came from, for messages.
    pub scoped_namespaces_source: String,
    pub resource_label_selector: Option<LabelSelector>,
    /// Workload kinds not removed by `--ignored-workload-types` (Rollouts and
    /// DeploymentConfigs are further subject to their flags and to discovery).
    pub workload_kinds: Vec<WorkloadKind>,
    /// Alerts after reloads (`ALERT_ON_RELOAD` / `--alert-on-reload`), if on.
    pub alerts: Option<AlertConfig>,
    /// The proxy for alerts (`ALERT_PROXY`, Reloader v1's `ALERT_WEBHOOK_PROXY`, `--alert-proxy`).
    pub alert_proxy: Option<reqwest::Url>,
    /// Webhook-only mode (`--webhook-url`): POST here instead of writing any workload.
    pub webhook_url: Option<reqwest::Url>,
    /// `--pprof-addr` when `--enable-pprof` is set.
    pub pprof_addr: Option<SocketAddr>,
    /// `--admin-addr`, unless empty.
    pub admin_addr: Option<SocketAddr>,
}

impl Args {
    /// Check every value and derive typed settings. Errors name the flag and the accepted values.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let mut ignore_configmaps = false;
        let mut ignore_secrets = false;
        for r in
            csv_items(&self.resources_to_ignore).iter().map(|r| r.trim().to_ascii_lowercase()).filter(|r| !r.is_empty())
        {
            match r.as_str() {
                "configmaps" => ignore_configmaps = true,
                "secrets" => ignore_secrets = true,
                other => bail!("invalid --resources-to-ignore value {other:?}: expected configmaps or secrets"),
            }
        }
        if ignore_configmaps && ignore_secrets {
            bail!("--resources-to-ignore cannot ignore both configmaps and secrets: nothing would be watched");
        }
        let mut workload_kinds = WorkloadKind::ALL.to_vec();
        for name in csv_items(&self.ignored_workload_types).iter().map(|k| k.trim()).filter(|k| !k.is_empty()) {
            let Some(kind) = WorkloadKind::from_type_name(name) else {
                bail!(
                    "invalid --ignored-workload-types value {name:?}: expected jobs, cronjobs, deployments, daemonsets, statefulsets, rollouts or deploymentconfigs"
                );
            };
            workload_kinds.retain(|k| *k != kind);
        }
        if !matches!(self.is_openshift.as_str(), "" | "auto" | "true" | "false") {
            bail!("invalid --is-openshift {:?}: expected true, false, or auto (empty = auto)", self.is_openshift);
        }
        let webhook_url = (!self.webhook_url.trim().is_empty())
            .then(|| parse_url(self.webhook_url.trim(), "--webhook-url (WEBHOOK_URL, Helm reloader.webhookUrl)"))
            .transpose()?;
        let alerts = if self.alert_on_reload {
            let url = self.alert_webhook_url.trim();
            if url.is_empty() {
                bail!(
                    "alerts are on (ALERT_ON_RELOAD / --alert-on-reload) but ALERT_WEBHOOK_URL / --alert-webhook-url is empty"
                );
            }
            let sink = match self.alert_sink.trim().to_ascii_lowercase().as_str() {
                "" | "webhook" | "raw" => Sink::Raw,
                other => other.parse().ok().filter(|s| *s != Sink::Raw).ok_or_else(|| {
                    anyhow::anyhow!(
                        "invalid ALERT_SINK / --alert-sink {other:?}: expected slack, teams, gchat, webhook or raw"
                    )
                })?,
            };
            Some(AlertConfig {
                sink,
                url: parse_url(url, "ALERT_WEBHOOK_URL / --alert-webhook-url")?,
                additional_info: self.alert_additional_info.clone(),
                structured: self.alert_structured,
            })
        } else {
            None
        };
        let legacy_proxy = std::env::var("ALERT_WEBHOOK_PROXY").ok().filter(|p| !p.trim().is_empty());
        let alert_proxy = match (self.alert_proxy.trim(), legacy_proxy) {
            ("", None) => None,
            ("", Some(legacy)) => Some(parse_url(legacy.trim(), "ALERT_WEBHOOK_PROXY")?),
            (proxy, _) => Some(parse_url(proxy, "ALERT_PROXY / --alert-proxy")?),
        };
        let pprof_addr = self
            .enable_pprof
            .then(|| parse_addr(&self.pprof_addr).map_err(|e| anyhow::anyhow!("invalid --pprof-addr: {e}")))
            .transpose()?;
        let admin_addr = match self.admin_addr.trim() {
            "" => None,
            addr => Some(parse_addr(addr).map_err(|e| anyhow::anyhow!("invalid --admin-addr: {e}"))?),
        };
        if !matches!(self.log_format.as_str(), "" | "json") {
            bail!("invalid --log-format {:?}: expected json or empty", self.log_format);
        }
        if self.leader_election_lease_duration < Duration::from_secs(1)
            || self.leader_election_renew_deadline >= self.leader_election_lease_duration
            || self.leader_election_retry_period >= self.leader_election_renew_deadline
            || self.leader_election_retry_period.is_zero()
        {
            bail!(
                "invalid leader election timings: need --leader-election-lease-duration >= 1s > --leader-election-renew-deadline > --leader-election-retry-period > 0"
            );
        }

        let kubernetes_namespace = std::env::var("KUBERNETES_NAMESPACE").ok().filter(|n| !n.is_empty());
        let listed: Vec<String> =
            csv_items(&self.namespaces).iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        let scoped_namespaces_source = if listed.is_empty() {
            "environment variable KUBERNETES_NAMESPACE".to_string()
        } else {
            self.sources.get("namespaces").cloned().unwrap_or_else(|| "flag --namespaces".to_string())
        };
        let scoped: Option<Vec<String>> =
            if !listed.is_empty() { Some(listed) } else { kubernetes_namespace.map(|n| vec![n]) };
        if let Some(list) = &scoped {
            for ns in list {
                if !is_dns_label(ns) {
                    bail!("invalid namespace {ns:?} in --namespaces / KUBERNETES_NAMESPACE: must be a DNS-1123 label");
                }
            }
        }
        let selector =
            LabelSelector::parse_all(&csv_items(&self.namespace_selector)).context("invalid --namespace-selector")?;
        let resource_label_selector = LabelSelector::parse_all(&csv_items(&self.resource_label_selector))
            .context("invalid --resource-label-selector")?;
        let filter = NamespaceFilter {
            only: scoped.as_ref().map(|l| l.iter().cloned().collect::<BTreeSet<_>>()),
            ignored: csv_items(&self.namespaces_to_ignore)
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            // Reloader honours the selector only in cluster-wide mode.
            selector: if scoped.is_some() { None } else { selector },
        };

        let keys = Keys {
            auto: self.auto_annotation.clone(),
            configmap_auto: self.configmap_auto_annotation.clone(),
            secret_auto: self.secret_auto_annotation.clone(),
            secret_provider_class_auto: self.secretproviderclass_auto_annotation.clone(),
            configmap_reload: self.configmap_annotation.clone(),
            secret_reload: self.secret_annotation.clone(),
            secret_provider_class_reload: self.secretproviderclass_annotation.clone(),
            configmap_exclude: self.configmap_exclude_annotation.clone(),
            secret_exclude: self.secret_exclude_annotation.clone(),
            secret_provider_class_exclude: self.secretproviderclass_exclude_annotation.clone(),
            search: self.auto_search_annotation.clone(),
            search_match: self.search_match_annotation.clone(),
            ignore: self.ignore_annotation.clone(),
            pause_period: self.pause_deployment_annotation.clone(),
            paused_at: self.pause_deployment_time_annotation.clone(),
        };
        Ok(Settings {
            keys,
            watch_configmaps: !ignore_configmaps,
            watch_secrets: !ignore_secrets,
            filter,
            scoped_namespaces: scoped,
            scoped_namespaces_source,
            resource_label_selector,
            workload_kinds,
            alerts,
            alert_proxy,
            webhook_url,
            pprof_addr,
            admin_addr,
        })
    }
}

impl Args {
    /// The effective options under the JSON keys of Reloader v1's `reloader-meta-info`
    /// (`reloaderOptions`), for tooling that reads them.
    pub fn meta_options(&self) -> serde_json::Value {
        let list = |items: &[String]| -> Vec<String> {
            csv_items(items).iter().map(|i| i.trim().to_string()).filter(|i| !i.is_empty()).collect()
        };
        let is = |value: &str| value == "true";
        serde_json::json!({
            "autoReloadAll": self.auto_reload_all,
            "configmapUpdateOnChangeAnnotation": self.configmap_annotation,
            "secretUpdateOnChangeAnnotation": self.secret_annotation,
            "secretProviderClassUpdateOnChangeAnnotation": self.secretproviderclass_annotation,
            "reloaderAutoAnnotation": self.auto_annotation,
            "ignoreResourceAnnotation": self.ignore_annotation,
            "configmapReloaderAutoAnnotation": self.configmap_auto_annotation,
            "secretReloaderAutoAnnotation": self.secret_auto_annotation,
            "secretProviderClassReloaderAutoAnnotation": self.secretproviderclass_auto_annotation,
            "configmapExcludeReloaderAnnotation": self.configmap_exclude_annotation,
            "secretExcludeReloaderAnnotation": self.secret_exclude_annotation,
            "secretProviderClassExcludeReloaderAnnotation": self.secretproviderclass_exclude_annotation,
            "autoSearchAnnotation": self.auto_search_annotation,
            "searchMatchAnnotation": self.search_match_annotation,
            "rolloutStrategyAnnotation": reloader_fleet::reload::ROLLOUT_STRATEGY,
            "pauseDeploymentAnnotation": self.pause_deployment_annotation,
            "pauseDeploymentTimeAnnotation": self.pause_deployment_time_annotation,
            "logFormat": self.log_format,
            "logLevel": self.log_level,
            "isArgoRollouts": is(&self.is_argo_rollouts),
            "reloadStrategy": self.reload_strategy.to_string(),
            "reloadOnCreate": is(&self.reload_on_create),
            "reloadOnDelete": is(&self.reload_on_delete),
            "syncAfterRestart": self.sync_after_restart,
            "enableHA": self.enable_ha,
            "leaderElectionLeaseDuration": GoDuration(self.leader_election_lease_duration).to_string(),
            "leaderElectionRenewDeadline": GoDuration(self.leader_election_renew_deadline).to_string(),
            "leaderElectionRetryPeriod": GoDuration(self.leader_election_retry_period).to_string(),
            "enableCSIIntegration": self.enable_csi_integration,
            // The origin only: a webhook URL may carry a token in its path, and the ConfigMap
            // is readable by anyone who may read ConfigMaps in the namespace.
            "webhookUrl": reqwest::Url::parse(self.webhook_url.trim()).map(|u| u.origin().ascii_serialization()).unwrap_or_default(),
            "resourcesToIgnore": list(&self.resources_to_ignore),
            "workloadTypesToIgnore": list(&self.ignored_workload_types),
            "namespaceSelectors": list(&self.namespace_selector),
            "resourceSelectors": list(&self.resource_label_selector),
            "namespacesToIgnore": list(&self.namespaces_to_ignore),
            "enablePProf": self.enable_pprof,
            "pprofAddr": self.pprof_addr,
        })
    }
}

/// An http(s) URL, or an error naming the setting it came from.
fn parse_url(text: &str, setting: &str) -> anyhow::Result<reqwest::Url> {
    let url: reqwest::Url = text.parse().with_context(|| format!("invalid {setting} {text:?}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        bail!("invalid {setting} {text:?}: expected an http:// or https:// URL");
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("reloader").chain(extra.iter().copied())).expect("valid flags")
    }

    #[test]
    fn sources_name_the_flag_or_the_file() {
        let argv = ["reloader", "--namespaces=a"].map(OsString::from).to_vec();
        let args = with_sources(argv, 0, "").expect("valid flags");
        assert_eq!(args.sources["namespaces"], "flag --namespaces");
        assert_eq!(args.sources["shards"], "the default of --shards");
        // The file's arguments come first; the command line repeats one and wins.
        let argv = ["reloader", "--shards=4", "--namespaces=a", "--namespaces=b"].map(OsString::from).to_vec();
        let args = with_sources(argv, 2, "fleet.yaml").expect("valid flags");
        assert_eq!(args.sources["shards"], "config file fleet.yaml");
        assert_eq!(args.sources["namespaces"], "flag --namespaces");
    }

    #[test]
    fn v1_spellings_and_string_typed_flags_parse() {
        let a = args(&["--is-Argo-Rollouts=true", "--reload-on-create=true", "--reload-on-delete", "yes"]);
        assert_eq!(a.is_argo_rollouts, "true");
        assert_eq!(a.reload_on_create, "true");
        assert_eq!(a.reload_on_delete, "yes", "string flags keep any value; only \"true\" enables");
    }

    #[test]
    fn bool_flags_take_go_spellings_and_bare_form() {
        assert!(args(&["--auto-reload-all"]).auto_reload_all);
        assert!(args(&["--auto-reload-all=True"]).auto_reload_all);
        assert!(!args(&["--auto-reload-all=0"]).auto_reload_all);
        assert!(Args::try_parse_from(["reloader", "--auto-reload-all=yes"]).is_err());
    }

    #[test]
    fn fleet_status_takes_its_settings_after_the_command_as_people_type_them() {
        let a = args(&["fleet", "status", "--shards", "16", "--leader-election-namespace", "reloader"]);
        assert_eq!((a.shards, a.leader_election_namespace.as_str()), (16, "reloader"));
        assert!(matches!(a.command, Some(Command::Fleet { what: FleetCommand::Status })));
    }

    #[test]
    fn explain_takes_kubectl_style_arguments_and_the_controllers_flags_after_it() {
        let a = args(&["explain", "deploy/web", "-n", "team-a", "-o", "json", "--auto-reload-all"]);
        assert!(a.auto_reload_all);
        let Some(Command::Explain { target, namespace, output }) = a.command else { panic!("explain expected") };
        assert_eq!((target.as_str(), namespace.as_deref(), output.as_str()), ("deploy/web", Some("team-a"), "json"));
        assert!(Args::try_parse_from(["reloader", "explain", "deploy/web", "-o", "yaml"]).is_err());
    }

    #[test]
    fn slices_split_on_commas_and_repeat() {
        let a = args(&["--namespaces-to-ignore=a,b", "--namespaces-to-ignore=c"]);
        assert_eq!(csv_items(&a.namespaces_to_ignore), vec!["a", "b", "c"]);
    }

    #[test]
    fn set_selectors_survive_comma_splitting() {
        let a = args(&["--namespace-selector=env in (prod,qa),team=x"]);
        let s = a.settings().expect("valid").filter.selector.expect("set");
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(s.matches(&labels(&[("env", "qa"), ("team", "x")])));
        assert!(!s.matches(&labels(&[("env", "dev"), ("team", "x")])));
    }

    #[test]
    fn invalid_values_name_the_flag() {
        let bad = |flags: &[&str], needle: &str| {
            let err = args(flags).settings().err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(err.contains(needle), "{flags:?}: {err}");
        };
        bad(&["--resources-to-ignore=configmaps,secrets"], "--resources-to-ignore");
        bad(&["--resources-to-ignore=pods"], "--resources-to-ignore");
        bad(&["--ignored-workload-types=pods"], "--ignored-workload-types");
        bad(&["--is-openshift=maybe"], "--is-openshift");
        bad(&["--namespace-selector=team in x"], "--namespace-selector");
        bad(&["--log-format=xml"], "--log-format");
        bad(&["--webhook-url=not a url"], "--webhook-url");
        bad(&["--alert-on-reload"], "ALERT_WEBHOOK_URL");
        bad(&["--alert-on-reload", "--alert-webhook-url=ftp://x/y"], "ALERT_WEBHOOK_URL");
        bad(&["--alert-on-reload", "--alert-webhook-url=http://x/y", "--alert-sink=pager"], "ALERT_SINK");
        bad(&["--alert-proxy=::"], "ALERT_PROXY");
        bad(&["--enable-pprof", "--pprof-addr=nowhere"], "--pprof-addr");
        bad(&["--namespaces=Bad_NS"], "DNS-1123");
        bad(&["--leader-election-renew-deadline=20s"], "leader election");
        bad(&["--leader-election-retry-period=0s"], "leader election");
        let strategy = Args::try_parse_from(["reloader", "--reload-strategy=rolling"]).expect_err("rejected");
        assert!(strategy.to_string().contains("env-vars, annotations"));
    }

    #[test]
    fn values_that_panicked_are_start_up_errors() {
        // Regression: each of these reached a timer or a float-to-Duration conversion and
        // panicked at start or at the first change.
        for flags in [
            ["--coalesce-window=20000h"],
            ["--coalesce-window=99999999999999999999999h"],
            ["--kube-api-qps=1e-300"],
            ["--max-rollouts-per-second=0.000001"],
            ["--max-rollouts-per-second=NaN"],
            ["--kube-api-qps=inf"],
            ["--leader-election-lease-duration=100000h"],
        ] {
            let err = Args::try_parse_from(std::iter::once("reloader").chain(flags)).expect_err("refused");
            assert!(err.to_string().contains(flags[0].split('=').next().unwrap_or_default()), "{err}");
        }
        assert_eq!(args(&["--coalesce-window=1h"]).coalesce_window, Duration::from_secs(3600));
        assert_eq!(args(&["--max-rollouts-per-second=0.5"]).max_rollouts_per_second, 0.5);
    }

    #[test]
    fn list_flags_read_csv_as_pflag_does() {
        assert_eq!(split_csv("a,b"), Ok(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(split_csv("\"team=a,env!=dev\""), Ok(vec!["team=a,env!=dev".to_string()]));
        assert_eq!(split_csv("\"x\"\"y\",z"), Ok(vec!["x\"y".to_string(), "z".to_string()]));
        assert_eq!(split_csv("a,"), Ok(vec!["a".to_string(), String::new()]));
        assert_eq!(split_csv(""), Ok(vec![]));
        assert!(split_csv("\"open").is_err() && split_csv("a\"b").is_err() && split_csv("\"a\"b").is_err());
        // What Reloader's chart renders for reloader.namespaceSelector, taken whole.
        let s = args(&["--namespace-selector=\"env in (prod,qa),team=x\""]).settings().expect("valid").filter;
        let selector = s.selector.expect("set");
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(selector.matches(&labels(&[("env", "qa"), ("team", "x")])));
        assert!(Args::try_parse_from(["reloader", "--namespaces=\"a"]).is_err());
    }

    #[test]
    fn resources_to_ignore_is_case_insensitive() {
        let s = args(&["--resources-to-ignore=ConfigMaps"]).settings().expect("valid");
        assert!(!s.watch_configmaps && s.watch_secrets);
    }

    #[test]
    fn the_data_views_listen_on_loopback_unless_told_otherwise() {
        let admin = |flags: &[&str]| args(flags).settings().expect("valid").admin_addr;
        let default = admin(&[]).expect("on by default");
        assert!(default.ip().is_loopback(), "{default}");
        assert_eq!(admin(&["--admin-addr="]), None);
        assert_eq!(admin(&["--admin-addr=:9091"]).map(|a| a.ip().is_unspecified()), Some(true));
        assert!(args(&["--admin-addr=nowhere"]).settings().is_err());
    }

    #[test]
    fn addresses_use_go_forms() {
        assert_eq!(parse_addr(":9090").map(|a| a.port()), Ok(9090));
        assert!(parse_addr("nowhere").is_err());
    }

    #[test]
    fn ignored_workload_types_remove_watched_kinds() {
        let s =
            args(&["--ignored-workload-types=Deployments,daemonset,jobs,CronJob,rollouts"]).settings().expect("valid");
        assert_eq!(s.workload_kinds, vec![WorkloadKind::StatefulSet, WorkloadKind::DeploymentConfig]);
    }

    #[test]
    fn annotation_overrides_reach_the_keys() {
        let s = args(&["--auto-annotation=example.com/auto"]).settings().expect("valid");
        assert_eq!(s.keys.auto, "example.com/auto");
    }
}
