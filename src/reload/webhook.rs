//! Webhook-only mode (`--webhook-url`): a change that would reload workloads is POSTed to a
//! URL instead, and no workload is written. A pipeline then decides what to restart.
//!
//! The body keeps Reloader v1's `{"webhook":"update successful"}` key, so v1 consumers keep
//! working, and carries Reloader v2's fields (the resource, its hash and the workloads that
//! would reload). Like v2 it is sent only when at least one workload matched.

use serde::Serialize;

use crate::watch::{DataHash, ResourceKey, WorkloadKey};

/// Where webhook-only mode sends, and the client it uses.
#[derive(Clone, Debug)]
pub struct Webhook {
    pub url: reqwest::Url,
    pub client: reqwest::Client,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    webhook: &'static str,
    kind: String,
    namespace: &'a str,
    resource_name: &'a str,
    resource_type: String,
    /// The resource's new hash; empty for a deletion (`--reload-on-delete`), as in v2.
    hash: String,
    timestamp: String,
    workloads: Vec<BodyWorkload<'a>>,
}

#[derive(Serialize)]
struct BodyWorkload<'a> {
    kind: &'static str,
    name: &'a str,
    namespace: &'a str,
}

/// The JSON body for a change of `resource` (now `hash`, `None` if deleted) that would reload
/// `workloads`.
pub fn body(
    resource: &ResourceKey,
    hash: Option<DataHash>,
    workloads: &[WorkloadKey],
    now: jiff::Timestamp,
) -> Vec<u8> {
    let kind = resource.kind.kind().to_ascii_lowercase();
    let body = Body {
        webhook: "update successful",
        kind: kind.clone(),
        namespace: &resource.namespace,
        resource_name: &resource.name,
        resource_type: kind,
        hash: hash.map(|h| h.to_string()).unwrap_or_default(),
        timestamp: now.round(jiff::Unit::Second).unwrap_or(now).to_string(),
        workloads: workloads
            .iter()
            .map(|w| BodyWorkload { kind: w.kind.kind(), name: &w.name, namespace: &w.namespace })
            .collect(),
    };
    // Plain strings: serializing cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{ResourceKind, WorkloadKind};

    #[test]
    fn the_body_keeps_v1s_key_and_carries_v2s_fields() {
        let resource = ResourceKey { kind: ResourceKind::ConfigMap, namespace: "team-a".into(), name: "app".into() };
        let workloads =
            [WorkloadKey { kind: WorkloadKind::Deployment, namespace: "team-a".into(), name: "web".into() }];
        let hash = DataHash::of_bytes(b"test=test");
        let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().expect("a timestamp");
        let text = String::from_utf8(body(&resource, Some(hash), &workloads, now)).expect("UTF-8");
        assert_eq!(
            text,
            format!(
                r#"{{"webhook":"update successful","kind":"configmap","namespace":"team-a","resourceName":"app","resourceType":"configmap","hash":"{hash}","timestamp":"2026-12-01T10:00:00Z","workloads":[{{"kind":"Deployment","name":"web","namespace":"team-a"}}]}}"#
            )
        );
    }
}
