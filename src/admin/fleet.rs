//! Fleet views: which replica holds which shard, and where a namespace is served.
//!
//! ```text
//!  GET /shards            this replica, the ring, and every shard's holder and state
//!  GET /namespaces        namespaces this replica serves, with its reload counts
//!  GET /namespaces/{ns}   selected or not and why, shard, holder, counts here
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PartialObjectMeta;
use kube::{Api, Client};
use serde::Serialize;

use crate::admin::AdminState;
use crate::lease::{Ownership, ShardState};
use crate::reload::duration::shown;
use crate::reload::{CheckpointStatus, NamespaceStats, ShardCheckpoint};
use crate::shard::{NamespaceFilter, Ring, VNODES, is_dns_label};
use crate::watch::Store;

/// What the fleet endpoints read.
#[derive(Clone)]
pub struct FleetView {
    pub identity: String,
    pub ring: Arc<Ring>,
    pub filter: NamespaceFilter,
    pub store: Store,
    pub stats: NamespaceStats,
    /// Each held shard's checkpoint: when it was last saved, and how saves fail since.
    pub checkpoints: CheckpointStatus,
    /// For namespace labels when a namespace selector is set (one GET per request).
    pub client: Option<Client>,
    /// What `/explain` decides with.
    pub explain: crate::admin::ExplainSettings,
}

#[derive(Serialize)]
struct ShardsBody {
    identity: String,
    ring: RingBody,
    /// The ring fingerprint of a live replica this one gives way to (another `--shards`,
    /// mid rolling update); this replica then holds nothing.
    yielding_to: Option<String>,
    shards: Vec<ShardBody>,
}

#[derive(Serialize)]
struct RingBody {
    shards: u32,
    virtual_nodes: u32,
    algorithm: &'static str,
}

#[derive(Serialize)]
struct ShardBody {
    id: u32,
    holder: String,
    held_here: bool,
    /// Loaded here to be taken over: `warming` (handed over to this replica once loaded),
    /// `standby` (`--hot-standby`: what a departure would give it), or `null`.
    loading_here: Option<&'static str>,
    state: &'static str,
    /// Seconds since this replica saw the shard's Lease change; `null` without Leases.
    lease_age_seconds: Option<u64>,
    /// Namespaces of this shard stored here (only known for shards held here).
    namespaces: Option<usize>,
    /// Its checkpoint, for shards acted on here: when last saved, failed saves since.
    checkpoint: Option<ShardCheckpoint>,
}

pub(crate) async fn shards(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let Some(fleet) = state.fleet.as_ref() else { return Json(serde_json::json!({ "error": "not wired" })) };
    let ownership: Option<Ownership> = state.ownership.as_ref().map(|o| o.borrow().clone());
    let mut checkpoints = fleet.checkpoints.shards();
    let mut per_shard: BTreeMap<u32, usize> = BTreeMap::new();
    for namespace in fleet.store.namespaces() {
        *per_shard.entry(fleet.ring.shard_of(&namespace)).or_default() += 1;
    }
    let shards = (0..fleet.ring.shards())
        .map(|id| {
            let (holder, state_name, age) = match &ownership {
                None => (fleet.identity.clone(), "active", None),
                Some(o) => match o.shards.iter().find(|s| s.shard == id) {
                    Some(s) => (s.holder.clone(), state_label(s.state), Some(s.observed_age_secs)),
                    None => (String::new(), "free", None),
                },
            };
            let held_here = ownership.as_ref().is_none_or(|o| o.held.contains(&id));
            let loading_here = ownership.as_ref().and_then(|o| {
                if o.warming.contains(&id) { Some("warming") } else { o.standby.contains(&id).then_some("standby") }
            });
            ShardBody {
                id,
                holder,
                held_here,
                loading_here,
                state: state_name,
                lease_age_seconds: age,
                namespaces: held_here.then(|| per_shard.get(&id).copied().unwrap_or(0)),
                checkpoint: checkpoints.remove(&id),
            }
        })
        .collect();
    let body = ShardsBody {
        identity: fleet.identity.clone(),
        ring: RingBody { shards: fleet.ring.shards(), virtual_nodes: VNODES, algorithm: fleet.ring.algorithm() },
        yielding_to: ownership.as_ref().and_then(|o| o.yielding_to.clone()),
        shards,
    };
    Json(serde_json::to_value(body).unwrap_or_default())
}

fn state_label(state: ShardState) -> &'static str {
    match state {
        ShardState::Active => "active",
        ShardState::Draining => "draining",
        ShardState::Fenced => "fenced",
        ShardState::Elsewhere => "held-elsewhere",
        ShardState::Free => "free",
    }
}

#[derive(Serialize)]
struct NamespaceBody {
    namespace: String,
    selected: bool,
    reason: String,
    shard: u32,
    holder: String,
    held_here: bool,
    reloads: u64,
    failures: u64,
}

pub(crate) async fn namespace(State(state): State<AdminState>, Path(name): Path<String>) -> Response {
    let Some(fleet) = state.fleet.as_ref() else {
        return Json(serde_json::json!({ "error": "not wired" })).into_response();
    };
    // Checked before anything is looked up, or asked of the API server.
    if !is_dns_label(&name) {
        return bad_request(format!("{:?} is not a namespace name (a DNS-1123 label)", shown(&name)));
    }
    let labels = match (&fleet.client, fleet.filter.needs_labels()) {
        (Some(client), true) => {
            let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
            match api.get_metadata_opt(&name).await {
                Ok(Some(ns)) => ns.metadata.labels.unwrap_or_default(),
                Ok(None) => {
                    let body = serde_json::json!({ "namespace": name, "error": "no such namespace" });
                    return (StatusCode::NOT_FOUND, Json(body)).into_response();
                }
                Err(err) => {
                    let body = serde_json::json!({ "namespace": name, "error": err.to_string() });
                    return (StatusCode::BAD_GATEWAY, Json(body)).into_response();
                }
            }
        }
        _ => BTreeMap::new(),
    };
    let selection = fleet.filter.select(&name, &labels);
    let shard = fleet.ring.shard_of(&name);
    let ownership = state.ownership.as_ref().map(|o| o.borrow().clone());
    let (holder, held_here) = match &ownership {
        None => (fleet.identity.clone(), true),
        Some(o) => (
            o.shards.iter().find(|s| s.shard == shard).map(|s| s.holder.clone()).unwrap_or_default(),
            o.held.contains(&shard),
        ),
    };
    let counts = fleet.stats.get(&name);
    let body = NamespaceBody {
        namespace: name,
        selected: selection.is_selected(),
        reason: selection.reason().to_string(),
        shard,
        holder,
        held_here,
        reloads: counts.reloads,
        failures: counts.failures,
    };
    Json(serde_json::to_value(body).unwrap_or_default()).into_response()
}

/// A 400 answer naming what is wrong with the request.
pub(crate) fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": message }))).into_response()
}

#[derive(Serialize)]
struct NamespaceCountsBody {
    namespace: String,
    shard: u32,
    reloads: u64,
    failures: u64,
}

pub(crate) async fn namespaces(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let Some(fleet) = state.fleet.as_ref() else { return Json(serde_json::json!({ "error": "not wired" })) };
    let list: Vec<NamespaceCountsBody> = fleet
        .store
        .namespaces()
        .into_iter()
        .map(|ns| {
            let counts = fleet.stats.get(&ns);
            NamespaceCountsBody {
                shard: fleet.ring.shard_of(&ns),
                namespace: ns.to_string(),
                reloads: counts.reloads,
                failures: counts.failures,
            }
        })
        .collect();
    Json(serde_json::json!({ "identity": fleet.identity, "namespaces": list }))
}
