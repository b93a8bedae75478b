//! What the flags and the environment say, checked once: one part per room, so that each is
//! handed only its own. Errors name the flag and the values it takes.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};

use super::values::{csv_items, parse_addr, parse_url};
use super::{Args, Command};
use crate::reload::duration::GoDuration;
use crate::reload::{AlertConfig, FlapDamping, Keys, OrphanedEnvVars, Pacing, ROLLOUT_STRATEGY, Sink, Strategy};
use crate::shard::{LabelSelector, NamespaceFilter, Placement, is_dns_label};
use crate::watch::{HashForm, WorkloadKind};

/// Everything the process was told, checked.
pub struct Settings {
    /// A command for people (`explain`, `fleet status`); `None` runs the controller.
    pub command: Option<Command>,
    pub logging: Logging,
    pub env: Environment,
    pub client: ClientSettings,
    pub watch: WatchSettings,
    pub reload: ReloadSettings,
    pub fleet: FleetSettings,
    pub serving: ServingSettings,
    /// Alerts after reloads (`ALERT_ON_RELOAD` / `--alert-on-reload`), if on.
    pub alerts: Option<AlertConfig>,
    /// The proxy for alerts and webhooks (`ALERT_PROXY`, Reloader v1's `ALERT_WEBHOOK_PROXY`).
    pub alert_proxy: Option<reqwest::Url>,
    /// The effective options under the JSON keys of Reloader v1's `reloader-meta-info`.
    pub meta_options: serde_json::Value,
}

pub struct Logging {
    /// `json`, or empty for text.
    pub format: String,
    /// A `tracing` level: trace, debug, info, warn or error.
    pub level: &'static str,
}

/// What the pod's environment says about where it runs (the chart sets these).
#[derive(Clone, Default)]
pub struct Environment {
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// Where Reloader's `reloader-meta-info` ConfigMap goes (`RELOADER_NAMESPACE`).
    pub reloader_namespace: Option<String>,
    pub deployment_name: Option<String>,
}

pub struct ClientSettings {
    pub http2: bool,
    /// Requests a second and the burst above it; `None`: no client-side limit.
    pub rate: Option<(f64, u32)>,
}

pub struct WatchSettings {
    pub configmaps: bool,
    pub secrets: bool,
    /// Workload kinds not removed by `--ignored-workload-types` (Rollouts and
    /// DeploymentConfigs are further subject to their flags and to discovery).
    pub workload_kinds: Vec<WorkloadKind>,
    /// `--is-Argo-Rollouts` is exactly `true`.
    pub argo_rollouts: bool,
    /// `--is-openshift`: `true`, `false`, or `auto` (also for empty).
    pub openshift: String,
    pub csi: bool,
    pub filter: NamespaceFilter,
    /// `Some` in namespace-scoped mode.
    pub scoped_namespaces: Option<Vec<String>>,
    /// Where the scoped namespaces came from, for messages.
    pub scoped_namespaces_source: String,
    pub resource_label_selector: Option<LabelSelector>,
    /// `--hash`: the form a reload write records.
    pub hash: HashForm,
}

pub struct ReloadSettings {
    pub keys: Keys,
    pub strategy: Strategy,
    pub auto_reload_all: bool,
    pub reload_on_create: bool,
    pub reload_on_delete: bool,
    pub sync_after_restart: bool,
    pub orphaned_env_vars: OrphanedEnvVars,
    /// `--reload-on-used-keys`: the compactor finds the keys each workload uses.
    pub reload_on_used_keys: bool,
    /// Webhook-only mode (`--webhook-url`): POST here instead of writing any workload.
    pub webhook_url: Option<reqwest::Url>,
    pub checkpoint_name: String,
    pub pacing: Pacing,
    pub annotation_lint: bool,
}

pub struct FleetSettings {
    pub enable_ha: bool,
    /// The Leases' name prefix (`--leader-election-id`).
    pub lease_prefix: String,
    /// `--leader-election-namespace`; empty: the pod's.
    pub lease_namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub release_on_cancel: bool,
    pub shards: u32,
    pub placement: Placement,
    pub hot_standby: bool,
}

pub struct ServingSettings {
    pub metrics_addr: SocketAddr,
    pub health_addr: SocketAddr,
    /// `--admin-addr`, unless empty.
    pub admin_addr: Option<SocketAddr>,
    /// `--pprof-addr` when `--enable-pprof` is set.
    pub pprof_addr: Option<SocketAddr>,
    /// `--metrics-count-by-namespace` or `METRICS_COUNT_BY_NAMESPACE=enabled`.
    pub count_by_namespace: bool,
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Args {
    /// Check every value and derive typed settings.
    pub fn settings(self) -> anyhow::Result<Settings> {
        let watch = self.watch_settings()?;
        let reload = self.reload_settings()?;
        let fleet = self.fleet_settings()?;
        let (alerts, alert_proxy) = self.alert_settings()?;
        let serving = self.serving_settings()?;
        let meta_options = self.meta_options();
        let process = &self.process;
        if !matches!(process.log_format.as_str(), "" | "json") {
            bail!("invalid --log-format {:?}: expected json or empty", process.log_format);
        }
        // A command for people prints a table on stdout; only warnings go to stderr beside it.
        let level = match process.log_level.as_str() {
            "info" if self.command.is_some() => "warn",
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warning" | "warn" => "warn",
            "error" | "fatal" | "panic" => "error",
            other => {
                bail!("invalid --log-level {other:?}: expected one of trace, debug, info, warning, error, fatal, panic")
            }
        };
        let env = Environment {
            pod_name: env("POD_NAME"),
            pod_namespace: env("POD_NAMESPACE"),
            reloader_namespace: env("RELOADER_NAMESPACE"),
            deployment_name: env("RELOADER_DEPLOYMENT_NAME"),
        };
        if fleet.enable_ha && self.command.is_none() && (env.pod_name.is_none() || env.pod_namespace.is_none()) {
            bail!("--enable-ha needs the POD_NAME and POD_NAMESPACE environment variables");
        }
        let burst =
            if process.kube_api_burst == 0 { process.kube_api_qps.ceil() as u32 } else { process.kube_api_burst };
        Ok(Settings {
            logging: Logging { format: process.log_format.clone(), level },
            client: ClientSettings {
                http2: process.http2,
                rate: (process.kube_api_qps > 0.0).then_some((process.kube_api_qps, burst)),
            },
            command: self.command,
            env,
            watch,
            reload,
            fleet,
            serving,
            alerts,
            alert_proxy,
            meta_options,
        })
    }

    fn watch_settings(&self) -> anyhow::Result<WatchSettings> {
        let flags = &self.watch;
        let (mut ignore_configmaps, mut ignore_secrets) = (false, false);
        for r in csv_items(&flags.resources_to_ignore).iter().map(|r| r.trim().to_ascii_lowercase()) {
            match r.as_str() {
                "" => {}
                "configmaps" => ignore_configmaps = true,
                "secrets" => ignore_secrets = true,
                other => bail!("invalid --resources-to-ignore value {other:?}: expected configmaps or secrets"),
            }
        }
        if ignore_configmaps && ignore_secrets {
            bail!("--resources-to-ignore cannot ignore both configmaps and secrets: nothing would be watched");
        }
        let mut workload_kinds = WorkloadKind::ALL.to_vec();
        if let Some(path) = &flags.custom_kinds_file {
            let declared = crate::watch::custom_kinds::declare_file(path).context("invalid --custom-kinds-file")?;
            workload_kinds.extend(declared);
        }
        for name in csv_items(&flags.ignored_workload_types).iter().map(|k| k.trim()).filter(|k| !k.is_empty()) {
            let Some(kind) = WorkloadKind::from_type_name(name) else {
                bail!(
                    "invalid --ignored-workload-types value {name:?}: expected jobs, cronjobs, deployments, daemonsets, statefulsets, rollouts, deploymentconfigs or a kind of --custom-kinds-file"
                );
            };
            workload_kinds.retain(|k| *k != kind);
        }
        let openshift = match flags.is_openshift.as_str() {
            "" | "auto" => "auto",
            "true" => "true",
            "false" => "false",
            other => bail!("invalid --is-openshift {other:?}: expected true, false, or auto (empty = auto)"),
        };
        let listed: Vec<String> =
            csv_items(&flags.namespaces).iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        let scoped_namespaces_source = if listed.is_empty() {
            "environment variable KUBERNETES_NAMESPACE".to_string()
        } else {
            self.sources.get("namespaces").cloned().unwrap_or_else(|| "flag --namespaces".to_string())
        };
        let scoped = if listed.is_empty() { env("KUBERNETES_NAMESPACE").map(|n| vec![n]) } else { Some(listed) };
        for ns in scoped.iter().flatten() {
            if !is_dns_label(ns) {
                bail!("invalid namespace {ns:?} in --namespaces / KUBERNETES_NAMESPACE: must be a DNS-1123 label");
            }
        }
        let selector =
            LabelSelector::parse_all(&csv_items(&flags.namespace_selector)).context("invalid --namespace-selector")?;
        let resource_label_selector = LabelSelector::parse_all(&csv_items(&flags.resource_label_selector))
            .context("invalid --resource-label-selector")?;
        let filter = NamespaceFilter {
            only: scoped.as_ref().map(|l| l.iter().cloned().collect::<BTreeSet<_>>()),
            ignored: csv_items(&flags.namespaces_to_ignore)
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            // Reloader honours the selector only in cluster-wide mode.
            selector: if scoped.is_some() { None } else { selector },
        };
        Ok(WatchSettings {
            configmaps: !ignore_configmaps,
            secrets: !ignore_secrets,
            workload_kinds,
            argo_rollouts: flags.is_argo_rollouts == "true",
            openshift: openshift.to_string(),
            csi: flags.enable_csi_integration,
            filter,
            scoped_namespaces: scoped,
            scoped_namespaces_source,
            resource_label_selector,
            hash: flags.hash,
        })
    }

    fn reload_settings(&self) -> anyhow::Result<ReloadSettings> {
        let flags = &self.reload;
        let webhook_url = (!flags.webhook_url.trim().is_empty())
            .then(|| parse_url(flags.webhook_url.trim(), "--webhook-url (WEBHOOK_URL, Helm reloader.webhookUrl)"))
            .transpose()?;
        Ok(ReloadSettings {
            keys: self.keys(),
            strategy: flags.reload_strategy,
            auto_reload_all: flags.auto_reload_all,
            reload_on_create: flags.reload_on_create == "true",
            reload_on_delete: flags.reload_on_delete == "true",
            sync_after_restart: flags.sync_after_restart,
            orphaned_env_vars: match (flags.remove_orphaned_env_vars_at_once, flags.remove_orphaned_env_vars) {
                (true, _) => OrphanedEnvVars::AtOnce,
                (false, true) => OrphanedEnvVars::WithNextWrite,
                (false, false) => OrphanedEnvVars::Keep,
            },
            reload_on_used_keys: flags.reload_on_used_keys,
            webhook_url,
            checkpoint_name: flags.checkpoint_name.clone(),
            pacing: Pacing {
                coalesce_window: flags.coalesce_window,
                max_rollouts_per_second: (flags.max_rollouts_per_second > 0.0).then_some(flags.max_rollouts_per_second),
                max_concurrent_rollouts: (flags.max_concurrent_rollouts > 0).then_some(flags.max_concurrent_rollouts),
                max_concurrent_writes: flags.max_concurrent_writes as usize,
                flap_damping: (flags.flap_damping_changes > 0)
                    .then_some(FlapDamping { changes: flags.flap_damping_changes, window: flags.flap_damping_window }),
            },
            annotation_lint: flags.annotation_lint,
        })
    }

    fn keys(&self) -> Keys {
        let a = &self.annotations;
        Keys {
            auto: a.auto_annotation.clone(),
            configmap_auto: a.configmap_auto_annotation.clone(),
            secret_auto: a.secret_auto_annotation.clone(),
            secret_provider_class_auto: a.secretproviderclass_auto_annotation.clone(),
            configmap_reload: a.configmap_annotation.clone(),
            secret_reload: a.secret_annotation.clone(),
            secret_provider_class_reload: a.secretproviderclass_annotation.clone(),
            configmap_exclude: a.configmap_exclude_annotation.clone(),
            secret_exclude: a.secret_exclude_annotation.clone(),
            secret_provider_class_exclude: a.secretproviderclass_exclude_annotation.clone(),
            search: a.auto_search_annotation.clone(),
            search_match: a.search_match_annotation.clone(),
            ignore: a.ignore_annotation.clone(),
            pause_period: a.pause_deployment_annotation.clone(),
            paused_at: a.pause_deployment_time_annotation.clone(),
        }
    }

    fn fleet_settings(&self) -> anyhow::Result<FleetSettings> {
        let f = &self.fleet;
        let (lease, renew, retry) =
            (f.leader_election_lease_duration, f.leader_election_renew_deadline, f.leader_election_retry_period);
        if lease < Duration::from_secs(1) || renew >= lease || retry >= renew || retry.is_zero() {
            bail!(
                "invalid leader election timings: need --leader-election-lease-duration >= 1s > --leader-election-renew-deadline > --leader-election-retry-period > 0"
            );
        }
        Ok(FleetSettings {
            enable_ha: f.enable_ha,
            lease_prefix: f.leader_election_id.clone(),
            lease_namespace: f.leader_election_namespace.clone(),
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            release_on_cancel: f.leader_election_release_on_cancel,
            shards: f.shards,
            placement: f.shard_placement,
            hot_standby: f.hot_standby,
        })
    }

    fn alert_settings(&self) -> anyhow::Result<(Option<AlertConfig>, Option<reqwest::Url>)> {
        let flags = &self.alerts;
        let alerts = if flags.alert_on_reload {
            let url = flags.alert_webhook_url.trim();
            if url.is_empty() {
                bail!(
                    "alerts are on (ALERT_ON_RELOAD / --alert-on-reload) but ALERT_WEBHOOK_URL / --alert-webhook-url is empty"
                );
            }
            let sink = match flags.alert_sink.trim().to_ascii_lowercase().as_str() {
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
                additional_info: flags.alert_additional_info.clone(),
                structured: flags.alert_structured,
            })
        } else {
            None
        };
        let proxy = match (flags.alert_proxy.trim(), env("ALERT_WEBHOOK_PROXY")) {
            ("", None) => None,
            ("", Some(legacy)) => Some(parse_url(legacy.trim(), "ALERT_WEBHOOK_PROXY")?),
            (proxy, _) => Some(parse_url(proxy, "ALERT_PROXY / --alert-proxy")?),
        };
        Ok((alerts, proxy))
    }

    fn serving_settings(&self) -> anyhow::Result<ServingSettings> {
        let s = &self.serving;
        let pprof_addr = s
            .enable_pprof
            .then(|| parse_addr(&s.pprof_addr).map_err(|e| anyhow::anyhow!("invalid --pprof-addr: {e}")))
            .transpose()?;
        let admin_addr = match s.admin_addr.trim() {
            "" => None,
            addr => Some(parse_addr(addr).map_err(|e| anyhow::anyhow!("invalid --admin-addr: {e}"))?),
        };
        Ok(ServingSettings {
            metrics_addr: s.metrics_addr,
            health_addr: s.health_addr,
            admin_addr,
            pprof_addr,
            count_by_namespace: s.metrics_count_by_namespace
                || std::env::var("METRICS_COUNT_BY_NAMESPACE").is_ok_and(|v| v == "enabled"),
        })
    }

    /// The effective options under the JSON keys of Reloader v1's `reloader-meta-info`
    /// (`reloaderOptions`), for tooling that reads them.
    pub fn meta_options(&self) -> serde_json::Value {
        let list = |items: &[String]| -> Vec<String> {
            csv_items(items).iter().map(|i| i.trim().to_string()).filter(|i| !i.is_empty()).collect()
        };
        let (r, w, a, f, s) = (&self.reload, &self.watch, &self.annotations, &self.fleet, &self.serving);
        serde_json::json!({
            "autoReloadAll": r.auto_reload_all,
            "configmapUpdateOnChangeAnnotation": a.configmap_annotation,
            "secretUpdateOnChangeAnnotation": a.secret_annotation,
            "secretProviderClassUpdateOnChangeAnnotation": a.secretproviderclass_annotation,
            "reloaderAutoAnnotation": a.auto_annotation,
            "ignoreResourceAnnotation": a.ignore_annotation,
            "configmapReloaderAutoAnnotation": a.configmap_auto_annotation,
            "secretReloaderAutoAnnotation": a.secret_auto_annotation,
            "secretProviderClassReloaderAutoAnnotation": a.secretproviderclass_auto_annotation,
            "configmapExcludeReloaderAnnotation": a.configmap_exclude_annotation,
            "secretExcludeReloaderAnnotation": a.secret_exclude_annotation,
            "secretProviderClassExcludeReloaderAnnotation": a.secretproviderclass_exclude_annotation,
            "autoSearchAnnotation": a.auto_search_annotation,
            "searchMatchAnnotation": a.search_match_annotation,
            "rolloutStrategyAnnotation": ROLLOUT_STRATEGY,
            "pauseDeploymentAnnotation": a.pause_deployment_annotation,
            "pauseDeploymentTimeAnnotation": a.pause_deployment_time_annotation,
            "logFormat": self.process.log_format,
            "logLevel": self.process.log_level,
            "isArgoRollouts": w.is_argo_rollouts == "true",
            "reloadStrategy": r.reload_strategy.to_string(),
            "reloadOnCreate": r.reload_on_create == "true",
            "reloadOnDelete": r.reload_on_delete == "true",
            "syncAfterRestart": r.sync_after_restart,
            "enableHA": f.enable_ha,
            "leaderElectionLeaseDuration": GoDuration(f.leader_election_lease_duration).to_string(),
            "leaderElectionRenewDeadline": GoDuration(f.leader_election_renew_deadline).to_string(),
            "leaderElectionRetryPeriod": GoDuration(f.leader_election_retry_period).to_string(),
            "enableCSIIntegration": w.enable_csi_integration,
            // The origin only: a webhook URL may carry a token in its path, and the ConfigMap
            // is readable by anyone who may read ConfigMaps in the namespace.
            "webhookUrl": reqwest::Url::parse(r.webhook_url.trim()).map(|u| u.origin().ascii_serialization()).unwrap_or_default(),
            "resourcesToIgnore": list(&w.resources_to_ignore),
            "workloadTypesToIgnore": list(&w.ignored_workload_types),
            "namespaceSelectors": list(&w.namespace_selector),
            "resourceSelectors": list(&w.resource_label_selector),
            "namespacesToIgnore": list(&w.namespaces_to_ignore),
            "enablePProf": s.enable_pprof,
            "pprofAddr": s.pprof_addr,
        })
    }
}
