//! `GET /explain/{namespace}/{kind}/{name}`: the `explain` answer from the live store, with no
//! API call. A namespace of a shard held elsewhere is answered with the replica to ask.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::admin::AdminState;
use crate::admin::fleet::bad_request;
use crate::reload::duration::shown;
use crate::reload::explain::{self, Explainer, Serving, Subject};
use crate::reload::{Damped, Keys, Options, Rules};
use crate::shard::{is_dns_label, is_dns_subdomain};
use crate::watch::ResourceKey;

/// The settings `explain` decides with, as the engine has them.
#[derive(Clone, Debug)]
pub struct ExplainSettings {
    pub keys: Keys,
    pub options: Options,
    pub scope: explain::Scope,
    /// The resources flap damping holds now (the engine's).
    pub damped: Damped,
}

#[derive(serde::Deserialize)]
pub(crate) struct Params {
    /// `text` for people (as the command prints it); JSON by default.
    output: Option<String>,
}

pub(crate) async fn explain(
    State(state): State<AdminState>,
    Path((namespace, kind, name)): Path<(String, String, String)>,
    Query(params): Query<Params>,
) -> Response {
    let Some(fleet) = state.fleet.as_ref() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "not wired").into_response();
    };
    // Checked before anything is looked up.
    if !is_dns_label(&namespace) {
        return bad_request(format!("{:?} is not a namespace name (a DNS-1123 label)", shown(&namespace)));
    }
    if !is_dns_subdomain(&name) {
        return bad_request(format!("{:?} is not an object name (a DNS-1123 subdomain)", shown(&name)));
    }
    let subject = match Subject::parse(&shown(&kind)) {
        Ok(subject) => subject,
        Err(message) => return bad_request(message),
    };
    let settings = &fleet.explain;
    let shard = fleet.ring.shard_of(&namespace);
    let ownership = state.ownership.as_ref().map(|o| o.borrow().clone());
    let (replica, held_here) = match &ownership {
        None => (Some(fleet.identity.clone()), true),
        Some(o) => (
            o.shards.iter().find(|s| s.shard == shard).map(|s| s.holder.clone()).filter(|h| !h.is_empty()),
            o.held.contains(&shard),
        ),
    };
    // Without labels (no API call here) a namespace selector cannot be evaluated; the store
    // holds a namespace only once it is selected.
    let stored = fleet.store.namespaces().contains(namespace.as_str());
    let not_selected = if stored {
        None
    } else if !held_here {
        Some(format!(
            "shard {shard} is held by {}, not by {}: ask that replica",
            replica.as_deref().unwrap_or("no replica"),
            fleet.identity
        ))
    } else {
        let selection = fleet.filter.select(&namespace, &Default::default());
        match (selection.is_selected(), fleet.filter.needs_labels()) {
            (true, _) => None,
            (false, false) => Some(selection.reason().to_string()),
            (false, true) => Some(format!(
                "{} (judged without the namespace's labels, as nothing of it is stored)",
                selection.reason()
            )),
        }
    };
    let checkpoint_saved_seconds_ago = fleet.checkpoints.saved_seconds_ago(shard);
    let serving = Serving { not_selected, shard: Some(shard), replica, checkpoint_saved_seconds_ago };
    let absent = |key: &ResourceKey| {
        format!(
            "{} {} is not in the store: it does not exist, or --resource-label-selector leaves it out",
            key.kind.kind(),
            key.name
        )
    };
    let rules = Rules::new(settings.keys.clone(), settings.options.clone());
    let mut explainer = Explainer {
        rules,
        store: &fleet.store,
        scope: &settings.scope,
        absent_reason: &absent,
        damped: Some(&settings.damped),
    };
    let report = explainer.explain(subject, namespace.as_str(), name.as_str(), serving);
    let report = report.with_short_hashes(SHOWN_HASH_DIGITS);
    match params.output.as_deref() {
        Some("text") => explain::text(&report).into_response(),
        _ => Json(report).into_response(),
    }
}

/// Hex digits of a hash shown here: enough for a person to compare two hashes (2^48 values),
/// never the whole SHA-1 of a Secret's data, which could be checked against guessed values.
const SHOWN_HASH_DIGITS: usize = 12;
