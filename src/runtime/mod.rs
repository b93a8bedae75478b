//! The controller process, from checked [`Settings`] to running rooms. [`Runtime::build`]
//! connects to the API server and decides what to watch; [`Runtime::run`] starts each room's
//! task and supervises them all: a task that ends before shutdown is logged, and the process
//! shuts down cleanly (Leases handed over, checkpoints saved) and exits with an error for the
//! kubelet to restart it.
//!
//! ```text
//!  lease ──held──────────────▶ reload engine ──▶ PATCH / Job / webhook
//!    └──watched──▶ watch ──changes──┘   └──▶ alerts, Events
//!  admin reads the store, the ownership and every room's metrics
//! ```

mod discovery;
mod places;
mod tasks;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use kube::Client;
use kube::runtime::events::Reporter;
use tokio::sync::{mpsc, watch as latest};
use tracing::{info, warn};

use discovery::recheck;
pub use discovery::{Watched, discover};
pub use places::fleet_namespace;

use crate::cli::Settings;
use crate::reload::{self, Options};
use crate::shard::{Placement, Ring};
use crate::{admin, client, lease, watch};
use tasks::Tasks;

/// How many changes may wait between the watches and the engine.
const CHANGE_QUEUE: usize = 1024;
/// Stored objects waiting for the annotation lint; beyond it a message is dropped (the lint
/// never holds up the watches).
const LINT_QUEUE: usize = 16 * 1024;
/// How long shutdown waits for the engine to save its checkpoint.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A client to the API server and what the rooms share: the metrics registry and the ring.
pub struct Connection {
    pub client: Client,
    pub state: admin::AdminState,
    pub ring: Arc<Ring>,
    /// Adds `shardSelector` to the watches the API server filters by shard.
    pub server_shards: watch::ServerShards,
}

/// Connect to the API server named by the kubeconfig (`$KUBECONFIG`, `~/.kube/config`) or
/// the pod's ServiceAccount, counting every call.
pub async fn connect(settings: &Settings) -> anyhow::Result<Connection> {
    // kube and the alert client both use rustls; one process-wide provider (ring) serves both.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let state = admin::AdminState::default();
    let api_calls = admin::ApiCalls::register(&state.registry).context("registering API call metrics")?;
    let server_shards = watch::ServerShards::default();
    let config = kube::Config::infer()
        .await
        .context("cannot build a Kubernetes client config from the kubeconfig or in-cluster config")?;
    // Every call counted, and `shardSelector` added to the watches the server filters.
    let outer = tower::ServiceBuilder::new().layer(api_calls.layer()).layer(server_shards.layer()).into_inner();
    let client_settings = client::Settings {
        http2: settings.client.http2,
        rate: settings.client.rate,
        response_bytes: client::ResponseBytes {
            watches: api_calls.response_bytes(true),
            others: api_calls.response_bytes(false),
        },
        streams_per_connection: api_calls.streams_per_connection(),
    };
    let client = client::build(&config, client_settings, outer).await.context("cannot build a Kubernetes client")?;
    let version = client.apiserver_version().await.context("cannot reach the Kubernetes API server")?;
    info!(version = %version.git_version, "connected to the Kubernetes API server");
    let fleet = &settings.fleet;
    let ring = Ring::with_placement(fleet.shards, fleet.placement)
        .with_context(|| format!("invalid --shards for --shard-placement={}", fleet.placement))?;
    Ok(Connection { client, state, ring: Arc::new(ring), server_shards })
}

/// The controller, built and ready to run.
pub struct Runtime {
    settings: Settings,
    connection: Connection,
    watched: Watched,
    /// Kinds left out at start (denied, or not checked), asked about again while running.
    left_out: Vec<watch::access::Forbidden>,
    watch: (watch::Config, watch::Metrics),
    engine: (reload::Config, reload::Metrics),
    http: reqwest::Client,
}

impl Runtime {
    /// Connect, find what can be watched, and check where the controller keeps its objects.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connection = connect(&settings).await?;
        let (client, state) = (&connection.client, &connection.state);
        let http = reload::http_client(settings.alert_proxy.as_ref())
            .context("cannot build the HTTP client for alerts and webhooks")?;
        let watch_metrics = watch::Metrics::register(&state.registry).context("registering watch metrics")?;
        let reload_metrics = reload::Metrics::register(&state.registry, settings.serving.count_by_namespace)
            .context("registering reload metrics")?;
        let mut watched = discover(client, &settings.watch).await;
        let scoped = settings.watch.scoped_namespaces.as_deref();
        let left_out = watched.drop_forbidden(client, scoped).await;
        for refusal in &left_out {
            watch_metrics.kinds_forbidden.with_label_values(&[refusal.collection.kind]).set(1);
            state.warn(refusal.message());
        }
        let compactor = compactor(&settings);
        let watch_config = watch_config(&settings, &connection, &watched, compactor.clone()).await;
        if connection.ring.placement() == Placement::FnvRanges && watch_config.namespaces.is_none() {
            let (sharded, unsharded) = connection.server_shards.probe_watched(&connection.client, &watch_config).await;
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
        let engine_config = engine_config(&settings, &connection, compactor, &http).await;
        Ok(Self {
            settings,
            connection,
            watched,
            left_out,
            watch: (watch_config, watch_metrics),
            engine: (engine_config, reload_metrics),
            http,
        })
    }

    /// Run every room until SIGTERM or Ctrl-C, or until one of them ends.
    pub async fn run(self) -> anyhow::Result<()> {
        let Self { settings, connection, watched, left_out, watch: (watch_config, watch_metrics), engine, http } = self;
        let Connection { client, mut state, ring, server_shards } = connection;
        let (engine_config, reload_metrics) = engine;
        let mut tasks = Tasks::default();
        let shutdown = tasks.shutdown.clone();

        let (changes_tx, changes_rx) = mpsc::channel(CHANGE_QUEUE);
        let (synced_tx, synced_rx) = latest::channel(None);
        let (reconciled_tx, ready_rx) = latest::channel(false);
        let (active_tx, active_rx) = latest::channel(BTreeSet::new());
        // Warm handoffs where a gained shard costs new lists: server-sharded watches (a list of
        // the gained ranges) and namespace-scoped ones (a list and a watch per gained namespace
        // and kind). Cluster-wide watches hold every shard's objects already.
        let warm_handoff = server_shards.active() || watch_config.namespaces.is_some();
        let loaded = warm_handoff.then(|| synced_rx.clone());
        let lease = Lease { config: lease_config(&settings, &ring)?, working: active_rx.clone(), loaded };
        let (shards, _alone) = start_lease(&mut tasks, &client, &mut state, lease, settings.fleet.shards)?;
        let alerts = start_alerts(&mut tasks, &settings, http, &reload_metrics);
        let (store, writer) = watch::Store::new(engine_config.keys.explicit_keys());
        let damped = reload::Damped::default();
        let explain = admin::ExplainSettings {
            keys: engine_config.keys.clone(),
            options: engine_config.options.clone(),
            scope: watched.scope(&settings.reload),
            damped: damped.clone(),
        };
        state.fleet = Some(fleet_view(&settings, ring, &store, &reload_metrics, &client, explain));
        start_serving(&mut tasks, &settings, &state, ready_rx);
        let lint = if settings.reload.annotation_lint {
            let (lint_tx, stored) = mpsc::channel(LINT_QUEUE);
            let inputs = reload::lint::Inputs {
                store: store.clone(),
                stored,
                synced: synced_rx.clone(),
                watched: watched.resources(),
            };
            start_lint(&mut tasks, &settings, &client, &state, inputs)?;
            Some(lint_tx)
        } else {
            None
        };
        let (owned, background) = (shards.watched, shards.background);
        // Edited workloads for the engine to check for orphaned variables.
        let (edits_tx, edits_rx) = if engine_config.orphaned_env_vars == reload::OrphanedEnvVars::AtOnce {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let (kinds_tx, kinds) = latest::channel(watched.kinds());
        if !left_out.is_empty() {
            let namespaces = settings.watch.scoped_namespaces.clone();
            let outputs = (kinds_tx, state.clone(), watch_metrics.kinds_forbidden.clone());
            let recheck = recheck(client.clone(), watched.clone(), left_out, namespaces, outputs, shutdown.clone());
            tasks.spawn("access", ended(recheck));
        }
        let links =
            watch::Links { owned, background, changes: changes_tx, synced: synced_tx, lint, edits: edits_tx, kinds };
        let watching = watch::run(client.clone(), watch_config, writer, watch_metrics, links, shutdown.clone());
        tasks.spawn("watch", async move { Ok(watching.await?) });
        start_meta_info(&mut tasks, &settings, &client, active_rx);
        let inputs =
            reload::Inputs { store, changes: changes_rx, synced: synced_rx, owned: shards.held, edits: edits_rx };
        let outputs = reload::Outputs { reconciled: reconciled_tx, active: active_tx, alerts, damped };
        let engine = reload::run(client, engine_config, inputs, reload_metrics, outputs, shutdown);
        tasks.spawn("reload", async move { Ok(engine.await?) });

        let result = tokio::select! {
            err = tasks.first_end() => Err(err),
            () = wait_for_signal() => Ok(()),
        };
        if let Err(err) = &result {
            warn!(error = format!("{err:#}"), "shutting down: a task ended");
        }
        info!("shutting down");
        state.ready.store(false, Ordering::Release);
        tasks.stop(SHUTDOWN_GRACE + 2 * settings.fleet.renew_deadline, SHUTDOWN_GRACE).await;
        result
    }
}

/// What the lease task needs, when there is one.
struct Lease {
    config: Option<lease::Config>,
    /// The shards the engine still acts on.
    working: latest::Receiver<BTreeSet<u32>>,
    /// The shards the watches have loaded, for warm handoffs.
    loaded: Option<latest::Receiver<Option<BTreeSet<u32>>>>,
}

/// The lease task, or for a replica alone every shard for good (keep the second value).
fn start_lease(
    tasks: &mut Tasks,
    client: &Client,
    state: &mut admin::AdminState,
    lease: Lease,
    shards: u32,
) -> anyhow::Result<(lease::Shards, Option<impl Sized + use<>>)> {
    let Some(config) = lease.config else {
        let (shards, alone) = lease::alone(shards);
        return Ok((shards, Some(alone)));
    };
    if config.hot_standby && lease.loaded.is_none() {
        warn!(
            "--hot-standby changes nothing here: cluster-wide watches that the API server does not shard hold every shard already"
        );
    }
    let metrics = lease::Metrics::register(&state.registry).context("registering lease metrics")?;
    let leave = tasks.leave.clone();
    let (shards, task) = lease::spawn(client.clone(), config, Some(lease.working), lease.loaded, metrics, leave);
    state.ownership = Some(shards.ownership.clone());
    tasks.spawn("lease", async move { Ok(task.await??) });
    Ok((shards, None))
}

/// The admin server, readiness, and CPU profiles when asked for.
/// What the admin endpoint shows of the fleet and this replica, and how it explains.
fn fleet_view(
    settings: &Settings,
    ring: Arc<Ring>,
    store: &watch::Store,
    metrics: &reload::Metrics,
    client: &Client,
    explain: admin::ExplainSettings,
) -> Arc<admin::FleetView> {
    Arc::new(admin::FleetView {
        identity: settings.env.pod_name.clone().unwrap_or_else(|| "reloader".to_string()),
        ring,
        filter: settings.watch.filter.clone(),
        store: store.clone(),
        stats: metrics.namespaces.clone(),
        checkpoints: metrics.checkpoints.status.clone(),
        client: Some(client.clone()),
        explain,
    })
}

/// The alert sender, when alerts are on: the engine's end of its queue and the sink.
fn start_alerts(
    tasks: &mut Tasks,
    settings: &Settings,
    http: reqwest::Client,
    metrics: &reload::Metrics,
) -> Option<(mpsc::Sender<reload::Alert>, reload::Sink)> {
    let config = settings.alerts.clone()?;
    let (queue, receiver) = mpsc::channel(reload::ALERT_QUEUE);
    let sink = config.sink;
    info!(sink = %sink, "alerts on reload are on");
    let sender = reload::run_alert_sender(http, config, receiver, metrics.clone(), tasks.shutdown.clone());
    tasks.spawn("alerts", ended(sender));
    Some((queue, sink))
}

/// The annotation lint (`--annotation-lint`), reading what the watches store.
fn start_lint(
    tasks: &mut Tasks,
    settings: &Settings,
    client: &Client,
    state: &admin::AdminState,
    inputs: reload::lint::Inputs,
) -> anyhow::Result<()> {
    let metrics = reload::lint::Metrics::register(&state.registry).context("registering lint metrics")?;
    let keys = settings.reload.keys.clone();
    let lint = reload::lint::run(client.clone(), reporter(settings), keys, inputs, metrics, tasks.shutdown.clone());
    tasks.spawn("lint", ended(lint));
    Ok(())
}

fn start_serving(
    tasks: &mut Tasks,
    settings: &Settings,
    state: &admin::AdminState,
    mut reconciled: latest::Receiver<bool>,
) {
    let serving = &settings.serving;
    if let Some(addr) = serving.pprof_addr {
        info!(addr = %addr, "serving CPU profiles at /debug/pprof/profile");
        let pprof = admin::serve_pprof(addr, tasks.shutdown.clone());
        tasks.spawn("pprof", async move { Ok(pprof.await?) });
    }
    let (ready, shutdown) = (state.ready.clone(), tasks.shutdown.clone());
    tasks.spawn("readiness", async move {
        if reconciled.wait_for(|s| *s).await.is_ok() {
            ready.store(true, Ordering::Release);
        }
        shutdown.cancelled().await;
        Ok(())
    });
    let addresses =
        admin::Addresses { metrics: serving.metrics_addr, health: Some(serving.health_addr), data: serving.admin_addr };
    let server = admin::serve(addresses, state.clone(), tasks.shutdown.clone());
    tasks.spawn("admin", async move { Ok(server.await?) });
}

/// Reloader's reloader-meta-info ConfigMap, published by the replica acting on shard 0.
fn start_meta_info(tasks: &mut Tasks, settings: &Settings, client: &Client, active: latest::Receiver<BTreeSet<u32>>) {
    let Some(namespace) = settings.env.reloader_namespace.clone() else {
        info!("RELOADER_NAMESPACE is not set; the reloader-meta-info ConfigMap is not published");
        return;
    };
    let meta = reload::meta_info::MetaInfo {
        namespace,
        deployment: settings.env.deployment_name.clone().unwrap_or_default(),
        options: settings.meta_options.clone(),
    };
    let publish = reload::meta_info::run(client.clone(), meta, active, tasks.shutdown.clone());
    tasks.spawn("meta-info", ended(publish));
}

/// A task without a result: its end is reported by the supervisor.
async fn ended(task: impl Future<Output = ()>) -> anyhow::Result<()> {
    task.await;
    Ok(())
}

fn reporter(settings: &Settings) -> Reporter {
    Reporter { controller: "reloader".to_string(), instance: settings.env.pod_name.clone() }
}

/// How the watches compact objects: only what the rules read, plus look-alike keys for the lint.
pub fn compactor(settings: &Settings) -> watch::Compactor {
    let keys = &settings.reload.keys;
    let compactor = watch::Compactor::new(keys.annotation_keys(), settings.reload.auto_reload_all);
    let compactor =
        if settings.watch.hash == watch::HashForm::Sha512_256 { compactor.hashing_wide() } else { compactor };
    let compactor = if settings.reload.reload_on_used_keys { compactor.reloading_on_used_keys() } else { compactor };
    if settings.reload.annotation_lint { compactor.keeping_lookalikes() } else { compactor }
}

async fn watch_config(
    settings: &Settings,
    connection: &Connection,
    watched: &Watched,
    compactor: watch::Compactor,
) -> watch::Config {
    let scope = &settings.watch;
    // A namespace this replica may watch ConfigMaps in, to ask the API server once whether it
    // serves streaming lists.
    let probe_namespace = scope
        .scoped_namespaces
        .as_ref()
        .and_then(|l| l.first().cloned())
        .or_else(|| settings.env.pod_namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let streaming_lists = watch::streaming_lists_served(&connection.client, &probe_namespace).await;
    info!(streaming_lists, "initial lists: {}", if streaming_lists { "streamed (WatchList)" } else { "LIST" });
    watch::Config {
        namespaces: scope.scoped_namespaces.clone(),
        filter: scope.filter.clone(),
        resource_label_selector: scope.resource_label_selector.clone(),
        watch_configmaps: watched.configmaps,
        watch_secrets: watched.secrets,
        compactor,
        workload_kinds: watched.workload_kinds.clone(),
        csi: watched.csi,
        streaming_lists,
        ring: connection.ring.clone(),
        server_shards: connection.server_shards.clone(),
    }
}

/// The engine's settings, after checking that its checkpoint can be kept.
async fn engine_config(
    settings: &Settings,
    connection: &Connection,
    compactor: watch::Compactor,
    http: &reqwest::Client,
) -> reload::Config {
    let r = &settings.reload;
    let (checkpoint_namespace, source) = places::checkpoint_namespace(&settings.env, &settings.watch);
    // The first shard's checkpoint stands for all: RBAC names each (resourceNames).
    let first = reload::checkpoint::Checkpoint::name_of(&r.checkpoint_name, 0, settings.fleet.shards);
    let fleet = settings.fleet.enable_ha || settings.fleet.shards > 1;
    let fleet_pods = settings.env.pod_namespace.as_deref().filter(|_| fleet);
    let warnings =
        places::check(&connection.client, &settings.watch, (&checkpoint_namespace, &first), &source, fleet_pods).await;
    for warning in warnings {
        warn!(%warning, "a setting needs attention");
        connection.state.warn(warning);
    }
    if let Some(url) = &r.webhook_url {
        info!(url = %url.origin().ascii_serialization(), "webhook-only mode: changes are sent to the webhook and no workload is written");
    }
    reload::Config {
        strategy: r.strategy,
        keys: r.keys.clone(),
        options: Options { auto_reload_all: r.auto_reload_all },
        reload_on_create: r.reload_on_create,
        reload_on_delete: r.reload_on_delete,
        sync_after_restart: r.sync_after_restart,
        orphaned_env_vars: r.orphaned_env_vars,
        checkpoint_namespace,
        checkpoint_name: r.checkpoint_name.clone(),
        reporter: reporter(settings),
        compactor,
        ring: connection.ring.clone(),
        webhook: r.webhook_url.clone().map(|url| reload::Webhook { url, client: http.clone() }),
        pacing: r.pacing.clone(),
        pod: own_pod(settings),
    }
}

/// The controller's own pod, from the downward API's `POD_NAME` and `POD_NAMESPACE`.
fn own_pod(settings: &Settings) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
    let (name, namespace) = (settings.env.pod_name.clone()?, settings.env.pod_namespace.clone()?);
    Some(k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: Some(name),
        namespace: Some(namespace),
        ..Default::default()
    })
}

/// The lease task's settings: with `--enable-ha` or several shards, Leases decide which
/// shards this replica acts on; otherwise it is alone and owns every shard.
fn lease_config(settings: &Settings, ring: &Ring) -> anyhow::Result<Option<lease::Config>> {
    let fleet = &settings.fleet;
    if !fleet.enable_ha && fleet.shards <= 1 {
        return Ok(None);
    }
    let (Some(identity), Some(pod_namespace)) = (settings.env.pod_name.clone(), settings.env.pod_namespace.clone())
    else {
        bail!("--enable-ha and --shards above 1 need the POD_NAME and POD_NAMESPACE environment variables");
    };
    Ok(Some(lease::Config {
        namespace: if fleet.lease_namespace.is_empty() { pod_namespace.clone() } else { fleet.lease_namespace.clone() },
        identity,
        pod_namespace,
        prefix: fleet.lease_prefix.clone(),
        shards: fleet.shards,
        lease_duration: fleet.lease_duration,
        renew_deadline: fleet.renew_deadline,
        retry_period: fleet.retry_period,
        ring: ring.fingerprint(),
        release_on_cancel: fleet.release_on_cancel,
        hot_standby: fleet.hot_standby,
    }))
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
