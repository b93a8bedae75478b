//! The `reloader` binary: parse configuration, connect to Kubernetes, wire the rooms, supervise.

mod cli;
mod client;
mod explain;
mod fleet_status;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use kube::runtime::events::Reporter;
use reloader_fleet::reload::{self, Options};
use reloader_fleet::shard::{Placement, Ring};
use reloader_fleet::{admin, lease, watch};
use tokio::sync::{mpsc, watch as latest};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

/// jemalloc gives freed pages back to the system on its own (after ten seconds): under glibc's
/// allocator what the first lists freed stayed resident, 14 MiB at 10,000 namespaces (RSS 77.8
/// against 63.2 MiB). mimalloc, tried too, held 91 MiB. `.cargo/config.toml` builds it with one
/// arena instead of four per core (`narenas:1`): each arena keeps pages of its own, and this
/// controller's few threads gain nothing from more (10,000 namespaces server-sharded: 59.4-59.8
/// MiB in 4 of 5 runs against 61.7-65.5, the same latency), and gives freed pages back after one
/// second instead of ten (`dirty_decay_ms:1000`): what a burst of updates left behind is gone
/// by the next scrape (10,000 namespaces, 5 s after 300 updates: 68.5-68.8 against 71.6-72.4
/// MiB, the same CPU). `_RJEM_MALLOC_CONF` overrides it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How many changes may wait between the watches and the engine.
const CHANGE_QUEUE: usize = 1024;
/// Stored objects waiting for the annotation lint; beyond it a message is dropped (the lint
/// never holds up the watches).
const LINT_QUEUE: usize = 16 * 1024;
/// How long shutdown waits for the engine to save its checkpoint.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = cli::parse()?;
    let settings = args.settings()?;
    let meta_options = args.meta_options();
    let cli::Args {
        config: _,
        auto_reload_all,
        reload_strategy,
        reload_on_create,
        reload_on_delete,
        sync_after_restart,
        is_argo_rollouts,
        is_openshift,
        enable_ha,
        enable_csi_integration,
        webhook_url: _,
        resources_to_ignore: _,
        ignored_workload_types: _,
        namespaces: _,
        namespaces_to_ignore: _,
        namespace_selector: _,
        resource_label_selector: _,
        log_format,
        log_level,
        auto_annotation: _,
        configmap_auto_annotation: _,
        secret_auto_annotation: _,
        secretproviderclass_auto_annotation: _,
        configmap_annotation: _,
        secret_annotation: _,
        secretproviderclass_annotation: _,
        configmap_exclude_annotation: _,
        secret_exclude_annotation: _,
        secretproviderclass_exclude_annotation: _,
        auto_search_annotation: _,
        search_match_annotation: _,
        ignore_annotation: _,
        pause_deployment_annotation: _,
        pause_deployment_time_annotation: _,
        enable_pprof: _,
        pprof_addr: _,
        leader_election_id,
        leader_election_namespace,
        leader_election_lease_duration,
        leader_election_renew_deadline,
        leader_election_retry_period,
        leader_election_release_on_cancel,
        hot_standby,
        metrics_addr,
        metrics_count_by_namespace,
        health_addr,
        admin_addr: _,
        alert_on_reload: _,
        alert_webhook_url: _,
        alert_sink: _,
        alert_proxy: _,
        alert_additional_info: _,
        alert_structured: _,
        checkpoint_name,
        annotation_lint,
        coalesce_window,
        max_rollouts_per_second,
        max_concurrent_rollouts,
        max_concurrent_writes,
        shards,
        shard_placement,
        http2,
        kube_api_qps,
        kube_api_burst,
        command,
        sources: _,
    } = args;
    // A command for people prints a table on stdout; only warnings go to stderr beside it.
    let log_level = if command.is_some() && log_level == "info" { "warning".to_string() } else { log_level };
    init_tracing(&log_format, &log_level)?;

    let pod_name = std::env::var("POD_NAME").ok().filter(|v| !v.is_empty());
    let pod_namespace = std::env::var("POD_NAMESPACE").ok().filter(|v| !v.is_empty());
    if enable_ha && command.is_none() && (pod_name.is_none() || pod_namespace.is_none()) {
        bail!("--enable-ha needs the POD_NAME and POD_NAMESPACE environment variables");
    }
    // kube and the alert client both use rustls; one process-wide provider (ring) serves both.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reload::http_client(settings.alert_proxy.as_ref())
        .context("cannot build the HTTP client for alerts and webhooks")?;

    let mut state = admin::AdminState::default();
    let api_calls = admin::ApiCalls::register(&state.registry).context("registering API call metrics")?;
    // Kubeconfig from $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    let kube_config = kube::Config::infer()
        .await
        .context("cannot build a Kubernetes client config from the kubeconfig or in-cluster config")?;
    // Adds `shardSelector` to the watches the API server filters by shard (probed below).
    let server_shards = watch::ServerShards::default();
    let outer = tower::ServiceBuilder::new().layer(api_calls.layer()).layer(server_shards.layer()).into_inner();
    let burst = if kube_api_burst == 0 { kube_api_qps.ceil() as u32 } else { kube_api_burst };
    let client_settings = client::Settings {
        http2,
        rate: (kube_api_qps > 0.0).then_some((kube_api_qps, burst)),
        response_bytes: client::ResponseBytes {
            watches: api_calls.response_bytes(true),
            others: api_calls.response_bytes(false),
        },
        streams_per_connection: api_calls.streams_per_connection(),
    };
    let client =
        client::build(&kube_config, client_settings, outer).await.context("cannot build a Kubernetes client")?;
    let version = client.apiserver_version().await.context("cannot reach the Kubernetes API server")?;
    info!(version = %version.git_version, "connected to the Kubernetes API server");
    let ring = Arc::new(
        Ring::with_placement(shards, shard_placement)
            .with_context(|| format!("invalid --shards for --shard-placement={shard_placement}"))?,
    );

    if let Some(cli::Command::Fleet { what: cli::FleetCommand::Status }) = command {
        let namespace = fleet_namespace(&leader_election_namespace, pod_namespace.as_deref(), &client);
        return fleet_status::print(client, &namespace, &leader_election_id, &ring, &settings.filter).await;
    }

    let watch_metrics = watch::Metrics::register(&state.registry).context("registering watch metrics")?;
    let by_namespace =
        metrics_count_by_namespace || std::env::var("METRICS_COUNT_BY_NAMESPACE").is_ok_and(|v| v == "enabled");
    let reload_metrics =
        reload::Metrics::register(&state.registry, by_namespace).context("registering reload metrics")?;

    let workload_kinds = served_kinds(&client, &settings.workload_kinds, &is_argo_rollouts, &is_openshift).await;
    let csi = enable_csi_integration
        && {
            let served = is_served(&client, "secrets-store.csi.x-k8s.io/v1", "secretproviderclasspodstatuses").await;
            if !served {
                warn!(
                    "--enable-csi-integration is set but the API server does not serve secrets-store.csi.x-k8s.io/v1 secretproviderclasspodstatuses; CSI reloads are off"
                );
            }
            served
        };
    let (mut workload_kinds, mut csi) = (workload_kinds, csi);
    let (mut watch_configmaps, mut watch_secrets) = (settings.watch_configmaps, settings.watch_secrets);
    if command.is_none() {
        // A kind this ServiceAccount may not watch is dropped, not retried into an unready
        // controller; what is left keeps reloading.
        let wanted = watched_collections(&workload_kinds, watch_configmaps, watch_secrets, csi);
        for refused in watch::access::forbidden(&client, &wanted, settings.scoped_namespaces.as_deref()).await {
            let kind = refused.collection.kind;
            warn!(kind, warning = %refused.message(), "a kind cannot be watched; it is left out");
            watch_metrics.kinds_forbidden.with_label_values(&[kind]).set(1);
            state.warnings.write().unwrap_or_else(|p| p.into_inner()).push(refused.message());
            workload_kinds.retain(|k| k.kind() != kind);
            match kind {
                "ConfigMap" => watch_configmaps = false,
                "Secret" => watch_secrets = false,
                "SecretProviderClass" | "SecretProviderClassPodStatus" => csi = false,
                _ => {}
            }
        }
    }
    info!(kinds = ?workload_kinds, csi, "watching these workload kinds");
    // Resource kinds watched: what explain and the lint count as able to exist.
    let watched_resources: Vec<watch::ResourceKind> = [
        (watch_configmaps, watch::ResourceKind::ConfigMap),
        (watch_secrets, watch::ResourceKind::Secret),
        (csi, watch::ResourceKind::SecretProviderClass),
    ]
    .into_iter()
    .filter_map(|(on, kind)| on.then_some(kind))
    .collect();
    let explain_scope = reload::explain::Scope {
        strategy: reload_strategy,
        kinds: workload_kinds.clone(),
        resources: watched_resources.clone(),
    };

    let keys = settings.keys.clone();
    let compactor =
        watch::Compactor::new(keys.workload_keys(), keys.ignore.clone(), keys.search_match.clone(), auto_reload_all);
    let compactor = if annotation_lint { compactor.keeping_lookalikes() } else { compactor };
    if let Some(cli::Command::Explain { target, namespace, output }) = &command {
        let request = explain::Request {
            target,
            namespace: namespace.clone().unwrap_or_else(|| client.default_namespace().to_string()),
            json: output == "json",
            keys: keys.clone(),
            options: Options { auto_reload_all },
            scope: explain_scope,
            compactor,
            filter: &settings.filter,
            scoped_namespaces: settings.scoped_namespaces.as_deref(),
            resource_label_selector: settings.resource_label_selector.as_ref(),
            lease_namespace: fleet_namespace(&leader_election_namespace, pod_namespace.as_deref(), &client),
            lease_prefix: &leader_election_id,
            ring: &ring,
        };
        return explain::print(client, request).await;
    }
    let (store, writer) = watch::Store::new(keys.explicit_keys());
    // A namespace this replica may watch ConfigMaps in, to ask the API server once whether it
    // serves streaming lists.
    let probe_namespace = settings
        .scoped_namespaces
        .as_ref()
        .and_then(|l| l.first().cloned())
        .or_else(|| pod_namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let streaming_lists = watch::streaming_lists_served(&client, &probe_namespace).await;
    info!(streaming_lists, "initial lists: {}", if streaming_lists { "streamed (WatchList)" } else { "LIST" });
    let watch_config = watch::Config {
        namespaces: settings.scoped_namespaces.clone(),
        filter: settings.filter.clone(),
        resource_label_selector: settings.resource_label_selector.clone(),
        watch_configmaps,
        watch_secrets,
        compactor: compactor.clone(),
        workload_kinds,
        csi,
        streaming_lists,
        ring: ring.clone(),
        server_shards: server_shards.clone(),
    };
    if ring.placement() == Placement::FnvRanges && watch_config.namespaces.is_none() {
        let (sharded, unsharded) = server_shards.probe_watched(&client, &watch_config).await;
        watch_metrics.server_sharded.set(sharded.len() as i64);
        if unsharded.is_empty() {
            info!(collections = ?sharded, "the API server filters every watch by shard (ShardedListAndWatch)");
        } else {
            warn!(
                sharded = ?sharded,
                unsharded = ?unsharded,
                "--shard-placement=fnv-ranges: the API server does not filter these watches by shard (is the ShardedListAndWatch feature gate on?); this replica filters them itself"
            );
        }
    }
    let (checkpoint_namespace, checkpoint_source) = if let Some(ns) = pod_namespace.clone() {
        (ns, "environment variable POD_NAMESPACE".to_string())
    } else if let Some(ns) = std::env::var("RELOADER_NAMESPACE").ok().filter(|v| !v.is_empty()) {
        (ns, "environment variable RELOADER_NAMESPACE".to_string())
    } else if let Some(ns) = settings.scoped_namespaces.as_ref().and_then(|l| l.first().cloned()) {
        (ns, format!("the first watched namespace ({})", settings.scoped_namespaces_source))
    } else {
        ("default".to_string(), "the default (no POD_NAMESPACE)".to_string())
    };
    // The first shard's checkpoint stands for all: RBAC names each (resourceNames).
    let first_checkpoint = if shards == 1 { checkpoint_name.clone() } else { format!("{checkpoint_name}-shard-0") };
    let warnings =
        check_places(&client, &settings, (&checkpoint_namespace, &first_checkpoint), &checkpoint_source).await;
    for warning in &warnings {
        warn!(%warning, "a setting needs attention");
    }
    state.warnings.write().unwrap_or_else(|p| p.into_inner()).extend(warnings);
    let engine_config = reload::Config {
        strategy: reload_strategy,
        keys,
        options: Options { auto_reload_all },
        reload_on_create: reload_on_create == "true",
        reload_on_delete: reload_on_delete == "true",
        sync_after_restart,
        checkpoint_namespace,
        checkpoint_name,
        reporter: Reporter { controller: "reloader".to_string(), instance: pod_name.clone() },
        compactor,
        ring: ring.clone(),
        webhook: settings.webhook_url.clone().map(|url| reload::Webhook { url, client: http.clone() }),
        coalesce_window,
        max_rollouts_per_second: (max_rollouts_per_second > 0.0).then_some(max_rollouts_per_second),
        max_concurrent_rollouts: (max_concurrent_rollouts > 0).then_some(max_concurrent_rollouts),
        max_concurrent_writes: max_concurrent_writes as usize,
    };
    if let Some(url) = &settings.webhook_url {
        info!(url = %url.origin().ascii_serialization(), "webhook-only mode: changes are sent to the webhook and no workload is written");
    }

    let shutdown = CancellationToken::new();
    let alerts = settings.alerts.clone().map(|config| {
        let (queue, receiver) = mpsc::channel(reload::ALERT_QUEUE);
        let sink = config.sink;
        info!(sink = %sink, "alerts on reload are on");
        tokio::spawn(
            reload::run_alert_sender(http.clone(), config, receiver, reload_metrics.clone(), shutdown.clone())
                .instrument(info_span!("alerts")),
        );
        (queue, sink)
    });
    if let Some(addr) = settings.pprof_addr {
        let profiles = tokio::spawn(admin::serve_pprof(addr, shutdown.clone()).instrument(info_span!("pprof")));
        info!(addr = %addr, "serving CPU profiles at /debug/pprof/profile");
        tokio::spawn(async move {
            if let Ok(Err(err)) = profiles.await {
                warn!(error = %err, "the profiling server stopped");
            }
        });
    }
    let (changes_tx, changes_rx) = mpsc::channel(CHANGE_QUEUE);
    let (synced_tx, synced_rx) = latest::channel(None);
    let (reconciled_tx, mut ready_rx) = latest::channel(false);
    let (active_tx, active_rx) = latest::channel(BTreeSet::new());

    // Which shards this replica acts on: Leases decide with --enable-ha or several shards;
    // otherwise this replica is alone and owns every shard.
    let all_shards: BTreeSet<u32> = (0..shards).collect();
    let (owned_tx, owned_rx) = latest::channel(BTreeSet::new());
    // What the watches load: the owned shards, plus those warming for a handoff.
    let (watched_tx, watched_rx) = latest::channel(BTreeSet::new());
    // Of those, the ones that may load slowly: the hot standby.
    let (background_tx, background_rx) = latest::channel(BTreeSet::new());
    // Stops the lease task first, so that a leaving replica hands its shards over warm.
    let leave = CancellationToken::new();
    let (mut lease_task, _fixed_ownership) = if enable_ha || shards > 1 {
        let (Some(identity), Some(pod_namespace)) = (pod_name.clone(), pod_namespace.clone()) else {
            bail!("--enable-ha and --shards above 1 need the POD_NAME and POD_NAMESPACE environment variables");
        };
        let namespace =
            if leader_election_namespace.is_empty() { pod_namespace } else { leader_election_namespace.clone() };
        let config = lease::Config {
            namespace,
            identity,
            prefix: leader_election_id.clone(),
            shards,
            lease_duration: leader_election_lease_duration,
            renew_deadline: leader_election_renew_deadline,
            retry_period: leader_election_retry_period,
            ring: ring.fingerprint(),
            release_on_cancel: leader_election_release_on_cancel,
            hot_standby,
        };
        let metrics = lease::Metrics::register(&state.registry).context("registering lease metrics")?;
        // Warm handoffs where a gained shard costs new lists: server-sharded watches (a list of
        // the gained ranges) and namespace-scoped ones (a list and a watch per gained namespace
        // and kind: at 2,000 namespaces updates went unanswered for up to 5.4 s, 0.30 s warm).
        // Other cluster-wide watches hold every shard's objects already (handing over would
        // cost a round trip more, 0.1 -> 0.3 s).
        let warm_handoff = server_shards.active() || watch_config.namespaces.is_some();
        if hot_standby && !warm_handoff {
            warn!(
                "--hot-standby changes nothing here: cluster-wide watches that the API server does not shard hold every shard already"
            );
        }
        let loaded = warm_handoff.then(|| synced_rx.clone());
        let (mut ownership, task) =
            lease::spawn(client.clone(), config, Some(active_rx.clone()), loaded, metrics, leave.clone());
        state.ownership = Some(ownership.clone());
        // Forward the held shards to the engine, and those plus the warming and standby ones to
        // the watches (the standby also as what may load slowly).
        tokio::spawn(async move {
            while ownership.changed().await.is_ok() {
                let (held, watched, standby) = {
                    let o = ownership.borrow_and_update();
                    (o.held.clone(), o.to_watch(&watched_tx.borrow()), o.standby.clone())
                };
                owned_tx.send_if_modified(|current| std::mem::replace(current, held) != *current);
                // Before the watched set, so that the watches know what of it may load slowly.
                background_tx.send_if_modified(|current| std::mem::replace(current, standby) != *current);
                watched_tx.send_if_modified(|current| std::mem::replace(current, watched) != *current);
            }
        });
        (Some(task), None)
    } else {
        owned_tx.send_replace(all_shards.clone());
        watched_tx.send_replace(all_shards);
        // Kept until main returns: the ownership never changes.
        (None, Some((owned_tx, watched_tx, background_tx)))
    };

    state.fleet = Some(Arc::new(admin::FleetView {
        identity: pod_name.clone().unwrap_or_else(|| "reloader".to_string()),
        ring: ring.clone(),
        filter: settings.filter.clone(),
        store: store.clone(),
        stats: reload_metrics.namespaces.clone(),
        client: Some(client.clone()),
        explain: admin::ExplainSettings {
            keys: engine_config.keys.clone(),
            options: engine_config.options.clone(),
            scope: explain_scope,
        },
    }));
    let ready = state.ready.clone();
    let readiness = tokio::spawn(async move {
        if ready_rx.wait_for(|s| *s).await.is_ok() {
            ready.store(true, Ordering::Release);
        }
    });
    let addresses = admin::Addresses { metrics: metrics_addr, health: Some(health_addr), data: settings.admin_addr };
    let mut admin_task = tokio::spawn(admin::serve(addresses, state.clone(), shutdown.clone()));
    let lint_tx = if annotation_lint {
        let (lint_tx, stored) = mpsc::channel(LINT_QUEUE);
        let inputs = reload::lint::Inputs {
            store: store.clone(),
            stored,
            synced: synced_rx.clone(),
            watched: watched_resources,
        };
        let metrics = reload::lint::Metrics::register(&state.registry).context("registering lint metrics")?;
        let reporter = Reporter { controller: "reloader".to_string(), instance: pod_name.clone() };
        let lint =
            reload::lint::run(client.clone(), reporter, settings.keys.clone(), inputs, metrics, shutdown.clone());
        tokio::spawn(lint.instrument(info_span!("lint")));
        Some(lint_tx)
    } else {
        None
    };
    let mut watch_task = tokio::spawn(
        watch::run(
            client.clone(),
            watch_config,
            writer,
            watch_metrics,
            watch::Links {
                owned: watched_rx,
                background: background_rx,
                changes: changes_tx,
                synced: synced_tx,
                lint: lint_tx,
            },
            shutdown.clone(),
        )
        .instrument(info_span!("watch")),
    );
    // Reloader's reloader-meta-info ConfigMap, published by the replica acting on shard 0.
    match std::env::var("RELOADER_NAMESPACE").ok().filter(|v| !v.is_empty()) {
        Some(namespace) => {
            let meta = reload::meta_info::MetaInfo {
                namespace,
                deployment: std::env::var("RELOADER_DEPLOYMENT_NAME").unwrap_or_default(),
                options: meta_options,
            };
            let publish = reload::meta_info::run(client.clone(), meta, active_rx.clone(), shutdown.clone());
            tokio::spawn(publish.instrument(info_span!("meta_info")));
        }
        None => info!("RELOADER_NAMESPACE is not set; the reloader-meta-info ConfigMap is not published"),
    }
    let mut engine_task = tokio::spawn(
        reload::run(
            client,
            engine_config,
            reload::Inputs { store, changes: changes_rx, synced: synced_rx, owned: owned_rx },
            reload_metrics,
            reload::Outputs { reconciled: reconciled_tx, active: active_tx, alerts },
            shutdown.clone(),
        )
        .instrument(info_span!("reload")),
    );

    let result: anyhow::Result<()> = tokio::select! {
        res = &mut admin_task => Err(flatten(res.map(|r| r.map_err(anyhow::Error::from)), "admin server")),
        res = &mut watch_task => Err(flatten(res.map(|r| r.map_err(anyhow::Error::from)), "watch task")),
        res = &mut engine_task => Err(flatten(res.map(|r| r.map_err(anyhow::Error::from)), "reload engine")),
        Some(res) = supervise(&mut lease_task) => Err(flatten(res.map(|r| r.map_err(anyhow::Error::from)), "lease task")),
        () = wait_for_signal() => Ok(()),
    };
    info!("shutting down");
    state.ready.store(false, Ordering::Release);
    readiness.abort();
    // Hand the shards over first, the engine and watches still running: the lease task
    // leaves (each shard released once its heir loaded it), then stops the engine's shards
    // (drain and checkpoint) and gives back what is left.
    leave.cancel();
    let leaving = SHUTDOWN_GRACE + 2 * leader_election_renew_deadline;
    if let Some(task) = lease_task.as_mut()
        && !task.is_finished()
        && tokio::time::timeout(leaving, task).await.is_err()
    {
        warn!("releasing the leases did not finish in time; they will expire instead");
    }
    shutdown.cancel();
    // Let the engine finish its in-flight write and save its checkpoint.
    if !engine_task.is_finished() && tokio::time::timeout(SHUTDOWN_GRACE, &mut engine_task).await.is_err() {
        warn!("the reload engine did not stop in time; the next start replays recent changes");
    }
    watch_task.abort();
    admin_task.abort();
    result
}

/// The workload kinds to watch: the ones not ignored, less Argo Rollouts unless
/// `--is-Argo-Rollouts` is exactly `true`, and less DeploymentConfigs unless `--is-openshift`
/// is `true` or detection (`auto`, empty) finds them served. A kind whose API is not served is
/// not watched (a watch of it would never list, and the controller would never be ready);
/// if the flag asked for it explicitly, a warning says so.
async fn served_kinds(
    client: &kube::Client,
    kinds: &[watch::WorkloadKind],
    is_argo_rollouts: &str,
    is_openshift: &str,
) -> Vec<watch::WorkloadKind> {
    use watch::WorkloadKind::{DeploymentConfig, Rollout};
    let mut out = Vec::new();
    for &kind in kinds {
        // Whether the user asked for the kind by a flag, so its absence deserves a warning.
        let (wanted, asked) = match kind {
            Rollout => (is_argo_rollouts == "true", Some("--is-Argo-Rollouts=true")),
            DeploymentConfig => (is_openshift != "false", (is_openshift == "true").then_some("--is-openshift=true")),
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
        } else if asked.is_none() && !may_watch(client, kind).await {
            // Detected, not asked for: without the RBAC to watch it the controller would never
            // be ready (OpenShift serves DeploymentConfigs to installs that grant no access).
            warn!(kind = spec.kind, api = %kind.api_version(), "detected, but this service account may not list and watch it; not watching it (set --is-openshift=true and grant the RBAC to roll it)");
        } else {
            out.push(kind);
        }
    }
    out
}

/// Whether this client may list and watch `kind` in every namespace.
async fn may_watch(client: &kube::Client, kind: watch::WorkloadKind) -> bool {
    let spec = kind.spec();
    let collection = watch::access::Collection { kind: spec.kind, group: spec.group, plural: spec.plural };
    watch::access::forbidden(client, &[collection], None).await.is_empty()
}

/// Every collection the watches will open: the workload kinds, ConfigMaps and Secrets unless
/// ignored, and the CSI driver's two kinds.
fn watched_collections(
    kinds: &[watch::WorkloadKind],
    configmaps: bool,
    secrets: bool,
    csi: bool,
) -> Vec<watch::access::Collection> {
    use watch::access::Collection;
    let mut wanted: Vec<Collection> =
        kinds.iter().map(|k| Collection { kind: k.kind(), group: k.spec().group, plural: k.spec().plural }).collect();
    if configmaps {
        wanted.push(Collection { kind: "ConfigMap", group: "", plural: "configmaps" });
    }
    if secrets {
        wanted.push(Collection { kind: "Secret", group: "", plural: "secrets" });
    }
    if csi {
        let group = "secrets-store.csi.x-k8s.io";
        wanted.push(Collection { kind: "SecretProviderClass", group, plural: "secretproviderclasses" });
        wanted.push(Collection {
            kind: "SecretProviderClassPodStatus",
            group,
            plural: "secretproviderclasspodstatuses",
        });
    }
    wanted
}

/// Settings that point at nothing: a watched namespace that does not exist, a checkpoint
/// namespace that does not exist or cannot be written. Each warning names the setting and
/// where its value came from; an answer of 403 (no right to look) is no finding.
async fn check_places(
    client: &kube::Client,
    settings: &cli::Settings,
    (checkpoint_namespace, checkpoint): (&str, &str),
    checkpoint_source: &str,
) -> Vec<String> {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
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
    for ns in settings.scoped_namespaces.iter().flatten() {
        if missing(ns.clone()).await {
            warnings.push(format!(
                "watched namespace {ns:?} (from {}) does not exist; nothing is reloaded there until it is created",
                settings.scoped_namespaces_source
            ));
        }
    }
    if missing(checkpoint_namespace.to_string()).await {
        warnings.push(format!(
            "the checkpoint namespace {checkpoint_namespace:?} (from {checkpoint_source}) does not exist; changes made while no replica runs will be missed"
        ));
    } else if !watch::access::may(client, ("", "configmaps"), "update", Some(checkpoint_namespace), Some(checkpoint))
        .await
        || !watch::access::may(client, ("", "configmaps"), "create", Some(checkpoint_namespace), None).await
    {
        warnings.push(format!(
            "this service account may not write ConfigMaps in the checkpoint namespace {checkpoint_namespace:?} (from {checkpoint_source}); changes made while no replica runs will be missed"
        ));
    }
    warnings
}

/// Whether the API server serves `plural` in `api_version` (discovery; an error counts as no).
/// Where a command for people looks for the fleet's Leases: `--leader-election-namespace`,
/// else `POD_NAMESPACE`, else the kubeconfig's namespace.
fn fleet_namespace(flag: &str, pod_namespace: Option<&str>, client: &kube::Client) -> String {
    [flag, pod_namespace.unwrap_or_default()]
        .into_iter()
        .find(|n| !n.is_empty())
        .map_or_else(|| client.default_namespace().to_string(), str::to_string)
}

async fn is_served(client: &kube::Client, api_version: &str, plural: &str) -> bool {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == plural),
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(err) => {
            warn!(api = api_version, error = %err, "API discovery failed; taking the API as not served");
            false
        }
    }
}

/// Wait for an optional task; never resolves without one.
async fn supervise<T>(task: &mut Option<tokio::task::JoinHandle<T>>) -> Option<Result<T, tokio::task::JoinError>> {
    match task {
        Some(handle) => Some(handle.await),
        None => std::future::pending().await,
    }
}

/// Any end of a supervised task before shutdown is an error.
fn flatten(res: Result<anyhow::Result<()>, tokio::task::JoinError>, task: &str) -> anyhow::Error {
    match res {
        Ok(Ok(())) => anyhow::anyhow!("{task} ended unexpectedly"),
        Ok(Err(err)) => err.context(format!("{task} failed")),
        Err(join) => anyhow::anyhow!("{task} panicked: {join}"),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn init_tracing(format: &str, level: &str) -> anyhow::Result<()> {
    let level = match level {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "fatal" | "panic" => "error",
        other => {
            bail!("invalid --log-level {other:?}: expected one of trace, debug, info, warning, error, fatal, panic")
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},kube=warn")));
    // Logs go to stderr, as Reloader's do; stdout is kept for command output.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        "json" => builder.json().init(),
        _ => builder.init(),
    }
    Ok(())
}
