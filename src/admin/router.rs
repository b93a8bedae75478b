use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The admin address could not be bound (in use, or no permission). Retrying will not help.
    #[error("cannot listen on {addr} (--metrics-addr or --health-addr)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an I/O error after it started.
    #[error("admin server failed")]
    Serve(#[source] std::io::Error),
}

/// The admin routes. Kept apart from [`serve`] so tests can drive it with `oneshot`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/live", get(|| async { "alive" }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/shards", get(fleet::shards))
        .route("/namespaces", get(fleet::namespaces))
        .route("/namespaces/{namespace}", get(fleet::namespace))
        .route("/explain/{namespace}/{kind}/{name}", get(crate::admin::explain::explain))
        .with_state(state)
}

/// Only the probes, for the health address.
fn health_router(state: AdminState) -> Router {
    Router::new()
        .route("/live", get(|| async { "alive" }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serve the admin router on `addr`, and the probes on `health` when it is another address,
/// until `shutdown` is cancelled. Both addresses are bound before anything is served.
///
/// # Errors
/// [`Error::Bind`] when an address cannot be bound, [`Error::Serve`] when serving fails.
pub async fn serve(
    addr: SocketAddr,
    health: Option<SocketAddr>,
    state: AdminState,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })
    };
    let admin = bind(addr).await?;
    let health = match health {
        Some(health) if health != addr => Some(bind(health).await?),
        _ => None,
    };
    // The bound addresses, so that a port given as 0 is found in the log.
    let bound = |l: &tokio::net::TcpListener| l.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    tracing::info!(addr = %bound(&admin), health = %health.as_ref().map_or_else(|| bound(&admin), bound),
        "admin server listening");
    let serve_admin =
        axum::serve(admin, router(state.clone())).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    match health {
        None => serve_admin.await.map_err(Error::Serve),
        Some(listener) => {
            let serve_health =
                axum::serve(listener, health_router(state)).with_graceful_shutdown(shutdown.cancelled_owned());
            tokio::try_join!(serve_admin, serve_health).map(|_| ()).map_err(Error::Serve)
        }
    }
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
        let response = router(state)
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
        use crate::watch::{Container, PodTemplate, Workload, WorkloadKey, WorkloadKind};
        let (store, writer) = crate::watch::Store::new(vec![]);
        for ns in ["team-a", "team-b"] {
            writer.apply_workload(Workload {
                key: WorkloadKey { kind: WorkloadKind::Deployment, namespace: ns.into(), name: "web".into() },
                uid: String::new(),
                resource_version: "1".into(),
                annotations: Default::default(),
                template: PodTemplate { containers: vec![Container::default()], ..Default::default() },
                paused: false,
                generation: 1,
                rolled_out: true,
                raw: None,
            });
        }
        let fleet = FleetView {
            identity: "replica-0".into(),
            ring: Arc::new(crate::shard::Ring::new(4).expect("valid")),
            filter: crate::shard::NamespaceFilter { ignored: ["kube-system".to_string()].into(), ..Default::default() },
            store,
            stats: Default::default(),
            client: None,
            explain: crate::admin::ExplainSettings {
                keys: Default::default(),
                options: Default::default(),
                scope: crate::reload::explain::Scope {
                    strategy: Default::default(),
                    kinds: WorkloadKind::ALL.to_vec(),
                    resources: vec![crate::watch::ResourceKind::ConfigMap],
                },
            },
        };
        AdminState { fleet: Some(Arc::new(fleet)), ..Default::default() }
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
