use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio_util::sync::CancellationToken;

use crate::admin::fleet::{self, FleetView};

/// What the admin server reads. Cheap to clone; every room keeps its own handle.
#[derive(Clone, Default)]
pub struct AdminState {
    /// The registry every room registers its metrics into; scraped on `/metrics`.
    pub registry: Registry,
    /// Set once every watch has finished its first list; cleared when shutdown starts.
    pub ready: Arc<AtomicBool>,
    /// Shard ownership from the lease room; `None` for a replica without Leases.
    pub ownership: Option<tokio::sync::watch::Receiver<crate::lease::Ownership>>,
    /// What `/shards` and `/namespaces` read; `None` until wired.
    pub fleet: Option<Arc<FleetView>>,
    /// Settings found at start to point at nothing (a namespace that does not exist, a
    /// checkpoint that cannot be written), each naming the setting and where it came from.
    /// Shown in `/readyz`'s body; they do not make the replica unready.
    pub warnings: Arc<std::sync::RwLock<Vec<String>>>,
}

impl AdminState {
    /// Add a warning to `/readyz`'s body.
    pub fn warn(&self, warning: String) {
        self.warnings.write().unwrap_or_else(std::sync::PoisonError::into_inner).push(warning);
    }

    /// Withdraw a warning that no longer holds.
    pub fn unwarn(&self, warning: &str) {
        self.warnings.write().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|w| w != warning);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An admin address could not be bound (in use, or no permission). Retrying will not help.
    #[error("cannot listen on {addr} (--metrics-addr, --health-addr, --admin-addr or --pprof-addr)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How long one request of the admin listeners may take (`/namespaces/{ns}` may make an API
/// call, itself bounded by the client's timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Where each part of the admin server listens.
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    /// `--metrics-addr` (`:9090`): `/metrics` and the probes, for Prometheus and the kubelet.
    pub metrics: SocketAddr,
    /// `--health-addr` (`:8080`, Reloader v2's probe port): the probes.
    pub health: Option<SocketAddr>,
    /// `--admin-addr` (`127.0.0.1:9091`): the data views (`/shards`, `/namespaces`,
    /// `/explain`), which name workloads and Secrets. Loopback by default: `kubectl
    /// port-forward` is the way in; `None` serves them nowhere.
    pub data: Option<SocketAddr>,
}

/// `/metrics` and the probes: what Prometheus and the kubelet reach on the pod's address.
pub fn router(state: AdminState) -> Router {
    probes().route("/metrics", get(metrics)).with_state(state)
}

/// The data views: which replica holds which shard, where a namespace is served, and the
/// `explain` answer from the store. They name namespaces, workloads and Secrets, so they are
/// served on `--admin-addr` only (loopback unless the operator chooses otherwise).
pub fn data_router(state: AdminState) -> Router {
    Router::new()
        .route("/shards", get(fleet::shards))
        .route("/namespaces", get(fleet::namespaces))
        .route("/namespaces/{namespace}", get(fleet::namespace))
        .route("/explain/{namespace}/{kind}/{name}", get(crate::admin::explain::explain))
        .with_state(state)
}

/// The probes, which every address answers.
fn probes() -> Router<AdminState> {
    Router::new()
        .route("/live", get(|| async { "alive" }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
}

/// Serve `/metrics` and the probes, the probes alone on the health address, and the data views
/// on the admin address, until `shutdown`. Every address is bound before anything is served;
/// parts given the same address share one listener.
///
/// # Errors
/// [`Error::Bind`] when an address cannot be bound.
pub async fn serve(addresses: Addresses, state: AdminState, shutdown: CancellationToken) -> Result<(), Error> {
    // Each address once, with what it serves: (address, metrics, data views).
    let mut wanted: Vec<(SocketAddr, bool, bool)> = Vec::new();
    let parts =
        [(Some(addresses.metrics), true, false), (addresses.health, false, false), (addresses.data, false, true)];
    for (addr, metrics, data) in parts {
        let Some(addr) = addr else { continue };
        match wanted.iter_mut().find(|(a, _, _)| *a == addr) {
            Some(entry) => (entry.1, entry.2) = (entry.1 || metrics, entry.2 || data),
            None => wanted.push((addr, metrics, data)),
        }
    }
    let mut listeners = Vec::new();
    for (addr, metrics, data) in &wanted {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr: *addr, source })?;
        let mut routes = probes();
        if *metrics {
            routes = routes.route("/metrics", get(self::metrics));
        }
        let mut routes = routes.with_state(state.clone());
        if *data {
            routes = routes.merge(data_router(state.clone()));
        }
        listeners.push((listener, routes));
    }
    // The bound addresses, so that a port given as 0 is found in the log.
    let bound = |want: Option<SocketAddr>| -> String {
        let index = want.and_then(|want| wanted.iter().position(|(a, _, _)| *a == want));
        let local = index.and_then(|i| listeners[i].0.local_addr().ok());
        local.map_or_else(|| "off".to_string(), |a| a.to_string())
    };
    tracing::info!(
        addr = %bound(Some(addresses.metrics)),
        health = %bound(addresses.health.or(Some(addresses.metrics))),
        admin = %bound(addresses.data),
        "admin server listening"
    );
    let served = listeners
        .into_iter()
        .map(|(listener, routes)| crate::admin::listener::serve(listener, routes, REQUEST_TIMEOUT, shutdown.clone()));
    futures::future::join_all(served).await;
    Ok(())
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let (status, mut body) = if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_string())
    };
    for warning in state.warnings.read().unwrap_or_else(|p| p.into_inner()).iter() {
        body.push_str("\nwarning: ");
        body.push_str(warning);
    }
    // A checkpoint that is not being saved does not make the replica unready (it acts on every
    // change), but a change made while no replica runs would be missed: said here, as at
    // `/shards`, in `reloader_checkpoint_unsaved_shards` and in the log.
    let problems = state.fleet.as_ref().map(|f| f.checkpoints.problems(tokio::time::Instant::now()));
    for problem in problems.into_iter().flatten() {
        body.push_str("\nwarning: ");
        body.push_str(&problem);
    }
    (status, body)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = Vec::new();
    match TextEncoder::new().encode(&state.registry.gather(), &mut body) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body),
        Err(err) => {
            (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], err.to_string().into_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(state: AdminState, path: &str) -> (StatusCode, String) {
        let response = router(state.clone())
            .merge(data_router(state))
            .oneshot(Request::get(path).body(Body::empty()).expect("static request is valid"))
            .await
            .expect("router is infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body is in memory");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn live_answers_alive_like_reloader() {
        assert_eq!(get(AdminState::default(), "/live").await, (StatusCode::OK, "alive".into()));
    }

    #[tokio::test]
    async fn readyz_is_unavailable_until_marked_ready() {
        let state = AdminState::default();
        assert_eq!(get(state.clone(), "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        state.ready.store(true, Ordering::Release);
        assert_eq!(get(state, "/readyz").await.0, StatusCode::OK);
    }

    fn fleet_state() -> AdminState {
        fleet_state_with(Default::default())
    }

    fn fleet_state_with(checkpoints: crate::reload::CheckpointStatus) -> AdminState {
        use crate::watch::{Container, PodTemplate, Workload, WorkloadKind};
        let (store, writer) = crate::watch::Store::new(vec![]);
        for ns in ["team-a", "team-b"] {
            writer.apply_workload(Workload {
                template: PodTemplate { containers: vec![Container::default()], ..Default::default() },
                ..Workload::test(WorkloadKind::Deployment, ns, "web")
            });
        }
        let fleet = FleetView {
            identity: "replica-0".into(),
            ring: Arc::new(crate::shard::Ring::new(4).expect("valid")),
            filter: crate::shard::NamespaceFilter { ignored: ["kube-system".to_string()].into(), ..Default::default() },
            store,
            stats: Default::default(),
            checkpoints,
            client: None,
            explain: crate::admin::ExplainSettings {
                keys: Default::default(),
                options: Default::default(),
                scope: crate::reload::explain::Scope {
                    strategy: Default::default(),
                    kinds: WorkloadKind::ALL.to_vec(),
                    resources: vec![crate::watch::ResourceKind::ConfigMap],
                    damping: None,
                    orphaned_env_vars: Default::default(),
                },
                damped: Default::default(),
            },
        };
        AdminState { fleet: Some(Arc::new(fleet)), ..Default::default() }
    }

    #[tokio::test]
    async fn a_checkpoint_that_is_not_saved_is_said_in_readyz_and_shards_with_its_cause() {
        let metrics = crate::reload::Metrics::register(&Registry::new(), false).expect("metrics");
        metrics.checkpoints.saved(1, 100, 100);
        let cause = "checkpoint ns/cp: the API server answered 413: request entity too large";
        metrics.checkpoints.failed(2, cause.to_string());
        let state = fleet_state_with(metrics.checkpoints.status.clone());
        state.ready.store(true, Ordering::Release);
        let (status, body) = get(state.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::OK, "a failing save does not make the replica unready");
        assert!(body.contains("shard 2: the checkpoint is not being saved (1 failed saves"), "{body}");
        assert!(body.contains(cause), "{body}");
        assert!(!body.contains("shard 1"), "{body}");
        let shards: serde_json::Value = serde_json::from_str(&get(state, "/shards").await.1).expect("JSON");
        assert_eq!(shards["shards"][2]["checkpoint"]["failures"], 1);
        assert!(shards["shards"][1]["checkpoint"]["last_saved"].is_string());
        assert!(shards["shards"][0]["checkpoint"].is_null(), "not acted on here");
        assert_eq!(metrics.checkpoints.unsaved.get(), 1);
        metrics.checkpoints.forget(2);
        assert_eq!(metrics.checkpoints.unsaved.get(), 0);
    }

    #[tokio::test]
    async fn shards_lists_every_shard_with_its_holder_and_the_ring() {
        let (status, body) = get(fleet_state(), "/shards").await;
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["identity"], "replica-0");
        assert_eq!(json["ring"]["shards"], 4);
        assert_eq!(json["ring"]["algorithm"], crate::shard::ALGORITHM);
        let shards = json["shards"].as_array().expect("array");
        assert_eq!(shards.len(), 4);
        assert!(shards.iter().all(|s| s["held_here"] == true && s["holder"] == "replica-0"));
        let stored: u64 = shards.iter().filter_map(|s| s["namespaces"].as_u64()).sum();
        assert_eq!(stored, 2, "both stored namespaces are counted in their shards");
    }

    #[tokio::test]
    async fn a_namespace_lookup_says_whether_and_where_it_is_served() {
        let (_, body) = get(fleet_state(), "/namespaces/team-a").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["selected"], true);
        assert_eq!(json["shard"], crate::shard::Ring::new(4).expect("valid").shard_of("team-a"));
        let (_, body) = get(fleet_state(), "/namespaces/kube-system").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["selected"], false);
        assert_eq!(json["reason"], "in --namespaces-to-ignore");
        let (_, body) = get(fleet_state(), "/namespaces").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["namespaces"].as_array().map(Vec::len), Some(2));
    }

    #[tokio::test]
    async fn explain_answers_from_the_store_and_names_bad_input() {
        let (status, body) = get(fleet_state(), "/explain/team-a/deploy/web").await;
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["found"], true, "{json}");
        assert_eq!(json["kind"], "Deployment");
        assert_eq!(json["serving"]["replica"], "replica-0");
        let (_, body) = get(fleet_state(), "/explain/kube-system/configmap/x").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(json["serving"]["not_selected"], "in --namespaces-to-ignore");
        let (_, body) = get(fleet_state(), "/explain/team-a/deployment/web?output=text").await;
        assert!(body.starts_with("Deployment team-a/web\n"), "{body}");
        let (status, body) = get(fleet_state(), "/explain/team-a/pod/x").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("unknown kind"), "{body}");
    }

    #[tokio::test]
    async fn names_that_are_no_kubernetes_names_are_refused_before_any_lookup() {
        let long = "a".repeat(300);
        for path in [
            "/namespaces/Bad_NS".to_string(),
            "/namespaces/..".to_string(),
            format!("/namespaces/{long}"),
            "/explain/team-a/deploy/Web".to_string(),
            "/explain/UPPER/deploy/web".to_string(),
            format!("/explain/team-a/{long}/web"),
        ] {
            let (status, body) = get(fleet_state(), &path).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            assert!(body.len() < 400, "{path}: the answer repeats the whole input: {body}");
        }
    }

    #[tokio::test]
    async fn the_metrics_address_serves_no_data_view() {
        for path in ["/shards", "/namespaces", "/namespaces/team-a", "/explain/team-a/deploy/web"] {
            let response = router(fleet_state())
                .oneshot(Request::get(path).body(Body::empty()).expect("static request is valid"))
                .await
                .expect("router is infallible");
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path} on the metrics address");
        }
    }

    #[tokio::test]
    async fn metrics_exposes_registered_series() {
        let state = AdminState::default();
        let counter = prometheus::IntCounter::new("reloader_test_total", "test").expect("valid name");
        state.registry.register(Box::new(counter.clone())).expect("first registration");
        counter.inc();
        let (status, body) = get(state, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("reloader_test_total 1"), "{body}");
    }
}
