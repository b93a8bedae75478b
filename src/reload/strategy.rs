//! The two reload strategies as pure functions: given a workload and the hash to record, the
//! strategic-merge patch that records it, or nothing when it is already recorded.
//!
//! Recording the same hash twice is a no-op in both strategies; that is what makes replays,
//! retries and overlapping replicas harmless (DESIGN principle 1).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::reload::pause::merge_patch;
use crate::reload::{Keys, LAST_RELOADED_FROM, RELOADED_HASHES, env_var_name};
use crate::watch::{DataHash, Hashes, ResourceKind, Workload};

/// `--reload-strategy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Set `STAKATER_<NAME>_<TYPE>` on one container (Reloader's default).
    #[default]
    EnvVars,
    /// Set the `last-reloaded-from` pod template annotation.
    Annotations,
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "env-vars" | "default" | "" => Ok(Strategy::EnvVars),
            "annotations" => Ok(Strategy::Annotations),
            other => Err(format!("reload-strategy must be one of: env-vars, annotations (got {other:?})")),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::EnvVars => "env-vars",
            Strategy::Annotations => "annotations",
        })
    }
}

/// What the workload should record for the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The resource's current hash (either form recorded counts; the chosen one is written).
    Hash(Hashes),
    /// The resource was deleted (`--reload-on-delete`).
    Deleted,
}

/// Reloader's hash for a deleted resource in the annotations strategy:
/// SHA-1 of `__RELOADER_EMPTY_DELETE_MARKER__`.
pub fn delete_marker() -> DataHash {
    DataHash::of_bytes(b"__RELOADER_EMPTY_DELETE_MARKER__")
}

/// Reloader v1's `last-reloaded-from` value; field order is part of the format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadSource {
    #[serde(rename = "type")]
    pub type_: String,
    pub name: String,
    pub namespace: String,
    pub hash: String,
    pub container_refs: Vec<String>,
    pub observed_at: i64,
}

/// The patch that records the item's target for its resource on its container of `workload`,
/// or `None` when the workload already records it.
///
/// `observed_at` is the wall-clock time in Unix seconds, written into `last-reloaded-from`.
pub fn plan(strategy: Strategy, workload: &Workload, item: &Item, observed_at: i64) -> Option<Value> {
    let container_name = &workload.template.containers.get(item.container)?.name;
    match strategy {
        Strategy::EnvVars => plan_env_var(workload, item, container_name),
        Strategy::Annotations => plan_annotation(workload, item, container_name, observed_at),
    }
}

/// One resource to record in a combined write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub kind: ResourceKind,
    pub name: String,
    pub container: usize,
    pub target: Target,
}

impl Item {
    pub fn new(kind: ResourceKind, name: &str, container: usize, target: Target) -> Self {
        Item { kind, name: name.to_string(), container, target }
    }
}

/// One patch that records every item on `workload` (a coalesced rollout), or `None` when it
/// records them all already. Items are planned one after the other on the workload as the
/// earlier ones leave it, so that the per-resource record keeps every hash.
pub fn plan_all(strategy: Strategy, workload: &Workload, items: &[Item], observed_at: i64) -> Option<Value> {
    let mut current = workload.clone();
    let mut combined: Option<Value> = None;
    for item in items {
        let Some(patch) = plan(strategy, &current, item, observed_at) else { continue };
        absorb(&mut current, &patch, item.container);
        match combined.as_mut() {
            Some(all) => merge_patch(all, patch),
            None => combined = Some(patch),
        }
    }
    combined
}

/// What one of this module's patches records, applied to the compact workload.
fn absorb(workload: &mut Workload, patch: &Value, container: usize) {
    if let Some(hashes) = patch.pointer(&format!("/metadata/annotations/{}", RELOADED_HASHES.replace('/', "~1"))) {
        workload.annotations.insert(RELOADED_HASHES.to_string(), hashes.as_str().unwrap_or_default().to_string());
    }
    let template = "/spec/template/metadata/annotations";
    if let Some(source) = patch.pointer(&format!("{template}/{}", LAST_RELOADED_FROM.replace('/', "~1"))) {
        workload
            .template
            .annotations
            .insert(LAST_RELOADED_FROM.to_string(), source.as_str().unwrap_or_default().to_string());
    }
    let env = patch.pointer("/spec/template/spec/containers/0/env/0");
    if let (Some(env), Some(c)) = (env, workload.template.containers.get_mut(container)) {
        let name = env["name"].as_str().unwrap_or_default().to_string();
        c.recorded.retain(|(n, _)| *n != name);
        if let Some(value) = env["value"].as_str() {
            c.recorded.push((name, value.to_string()));
        }
    }
}

fn plan_env_var(workload: &Workload, item: &Item, container_name: &str) -> Option<Value> {
    let Item { kind, name: resource_name, container, target } = item;
    let (kind, container, target) = (*kind, *container, *target);
    let var = env_var_name(resource_name, kind);
    let recorded = recorded_env_var(workload, kind, resource_name, container);
    let env = match (target, recorded.as_deref()) {
        (Target::Hash(h), Some(value)) if h.is_recorded_as(value) => return None,
        (Target::Hash(h), _) => json!({ "name": var, "value": h.written() }),
        (Target::Deleted, None) => return None,
        // Strategic merge deletes the list item by its merge key, wherever it sits.
        (Target::Deleted, Some(_)) => json!({ "name": var, "$patch": "delete" }),
    };
    let mut patch =
        json!({ "spec": { "template": { "spec": { "containers": [ { "name": container_name, "env": [env] } ] } } } });
    if records_in_metadata(workload) {
        let mut recorded = recorded_hashes(workload);
        match target {
            Target::Hash(h) => recorded.insert(record_key(kind, resource_name), h.written()),
            Target::Deleted => recorded.remove(&record_key(kind, resource_name)),
        };
        // Serializing a map of strings cannot fail.
        patch["metadata"] =
            json!({ "annotations": { RELOADED_HASHES: serde_json::to_string(&recorded).unwrap_or_default() } });
    }
    Some(patch)
}

/// The hash the env-vars strategy recorded for the resource on `container`.
fn recorded_env_var(workload: &Workload, kind: ResourceKind, resource_name: &str, container: usize) -> Option<String> {
    if records_in_metadata(workload) {
        // The template is never written (a CronJob, a Rollout running a Deployment's
        // template): the metadata record is the only one.
        return recorded_hashes(workload).remove(&record_key(kind, resource_name));
    }
    let var = env_var_name(resource_name, kind);
    let recorded = &workload.template.containers.get(container)?.recorded;
    recorded.iter().find(|(name, _)| *name == var).map(|(_, v)| v.clone())
}

/// The hash `workload` records for the resource under `strategy` (what a reload compares
/// with), if any.
pub fn recorded(
    strategy: Strategy,
    workload: &Workload,
    kind: ResourceKind,
    resource_name: &str,
    container: usize,
) -> Option<String> {
    match strategy {
        Strategy::EnvVars => recorded_env_var(workload, kind, resource_name, container),
        Strategy::Annotations => recorded_hashes(workload).remove(&record_key(kind, resource_name)).or_else(|| {
            last_reloaded_from(workload)
                .filter(|s| s.type_ == kind.type_suffix() && s.name == resource_name)
                .map(|s| s.hash)
        }),
    }
}

/// Where a reload for the resource is written, for people: the env var or the annotation.
pub fn record_place(
    strategy: Strategy,
    workload: &Workload,
    kind: ResourceKind,
    resource_name: &str,
    container: usize,
) -> String {
    let container = workload.template.containers.get(container).map(|c| c.name.as_str()).unwrap_or("?");
    let place = match strategy {
        Strategy::EnvVars => format!("env var {} on container {container}", env_var_name(resource_name, kind)),
        Strategy::Annotations => format!("pod template annotation {LAST_RELOADED_FROM} (container {container})"),
    };
    if let Some(deployment) = &workload.workload_ref {
        return format!(
            "spec.restartAt of the Rollout, recorded on its metadata (it runs Deployment {deployment}'s pod template)"
        );
    }
    match workload.key.kind {
        crate::watch::WorkloadKind::CronJob if patches_its_template(workload) => {
            format!("{place}, in the CronJob's job template (cronjob-reload-strategy: patch; no Job now)")
        }
        crate::watch::WorkloadKind::CronJob => format!("{place}, in a Job created now from the job template"),
        kind if kind.is_declared() => {
            let spec = kind.spec();
            let restart =
                spec.restart_field.map(|f| format!(" and spec.{} set to now", f.join("."))).unwrap_or_default();
            format!("{place}, at {} (--custom-kinds-file){restart}", spec.pod.describe())
        }
        _ => place,
    }
}

/// Whether a CronJob asks for its job template to be patched (`cronjob-reload-strategy:
/// patch`) instead of a Job created at once.
pub fn patches_its_template(workload: &Workload) -> bool {
    workload.key.kind == crate::watch::WorkloadKind::CronJob
        && workload.annotations.get(crate::reload::CRONJOB_RELOAD_STRATEGY).is_some_and(|s| s == "patch")
}

/// Whether a reload of `workload` is recorded on its metadata alone: its kind's template is
/// never written (a CronJob), or it has none of its own (a Rollout with a `workloadRef`).
fn records_in_metadata(workload: &Workload) -> bool {
    workload.key.kind.spec().records_in_metadata || workload.workload_ref.is_some()
}

/// What becomes of the `STAKATER_*` variable of a resource a workload stopped referencing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OrphanedEnvVars {
    /// Kept, as Reloader keeps it.
    #[default]
    Keep,
    /// Removed with the workload's next reload write: never a rollout of its own.
    WithNextWrite,
    /// Removed at once (one write, so one rollout, of its own), and with any reload write.
    AtOnce,
}

impl OrphanedEnvVars {
    /// What becomes of them, as `explain` says it.
    pub fn fate(self) -> &'static str {
        match self {
            OrphanedEnvVars::Keep => "kept, as Reloader keeps them (--remove-orphaned-env-vars removes them)",
            OrphanedEnvVars::WithNextWrite => "removed with its next reload write (--remove-orphaned-env-vars)",
            OrphanedEnvVars::AtOnce => "removed at once, in a write of its own (--remove-orphaned-env-vars-at-once)",
        }
    }
}

/// The `STAKATER_*` env vars a workload records for resources it no longer references.
#[derive(Debug, PartialEq)]
pub struct Orphans {
    /// Their removal, as a strategic-merge patch of the pod template.
    pub patch: Value,
    /// Their names, for the log.
    pub names: Vec<String>,
}

/// `--remove-orphaned-env-vars`: the `STAKATER_*` env vars this controller recorded for
/// resources the pod template no longer references, and their removal (`None`: none). A
/// workload whose annotations (per `keys`) name resources (a `.../reload` list, `search`)
/// keeps every variable: a name in a list (or a pattern) needs no reference in the template,
/// so no variable is known to be an orphan.
pub fn orphaned_env_vars(workload: &Workload, keys: &Keys) -> Option<Orphans> {
    if keys.names_any_resource(workload) || records_in_metadata(workload) {
        return None;
    }
    let referenced: BTreeSet<String> =
        workload.template.references().map(|(kind, name)| env_var_name(name, *kind)).collect();
    let suffixes = [ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass]
        .map(|k| format!("_{}", k.type_suffix()));
    let mut names = Vec::new();
    let containers: Vec<Value> = workload
        .template
        .containers
        .iter()
        .filter_map(|c| {
            let orphans: Vec<Value> = c
                .recorded
                .iter()
                .map(|(var, _)| var)
                .filter(|var| suffixes.iter().any(|s| var.ends_with(s.as_str())) && !referenced.contains(*var))
                .map(|var| {
                    names.push(var.clone());
                    json!({ "name": var, "$patch": "delete" })
                })
                .collect();
            (!orphans.is_empty()).then(|| json!({ "name": c.name, "env": orphans }))
        })
        .collect();
    (!containers.is_empty())
        .then(|| Orphans { patch: json!({ "spec": { "template": { "spec": { "containers": containers } } } }), names })
}

/// The key of one resource in the metadata record: `CONFIGMAP/name`.
fn record_key(kind: ResourceKind, resource_name: &str) -> String {
    format!("{}/{}", kind.type_suffix(), resource_name)
}

/// Apply one of this controller's strategic-merge patches to an object's JSON, as the API
/// server would: objects merge key by key, `null` removes a key, lists of named items
/// (containers, env) merge by `name`, and an item carrying `$patch: delete` is removed. Used
/// where a kind takes no strategic merge (custom resources) or where the object is created
/// anew from a template (a Job from a CronJob, a Job created again).
pub fn apply_strategic(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    base.remove(key);
                } else {
                    apply_strategic(base.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (slot @ Value::Array(_), Value::Array(items)) if items.iter().all(|i| i.get("name").is_some()) => {
            let Value::Array(list) = slot else { return };
            for item in items {
                let position = list.iter().position(|e| e.get("name") == item.get("name"));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => apply_strategic(&mut list[i], item),
                    (None, false) => list.push(item.clone()),
                }
            }
        }
        (slot @ Value::Null, Value::Array(items)) => {
            *slot = Value::Array(items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect());
        }
        // Nothing to apply (an absent part of a template).
        (_, Value::Null) => {}
        (slot, value) => *slot = value.clone(),
    }
}

fn plan_annotation(workload: &Workload, item: &Item, container_name: &str, observed_at: i64) -> Option<Value> {
    let (kind, resource_name) = (item.kind, item.name.as_str());
    let hashes = match item.target {
        Target::Hash(h) => h,
        Target::Deleted => delete_marker().into(),
    };
    let mut recorded = recorded_hashes(workload);
    let record_key = record_key(kind, resource_name);
    let hash_text = hashes.written();
    if recorded.get(&record_key).is_some_and(|r| hashes.is_recorded_as(r)) {
        return None;
    }
    if last_reloaded_from(workload)
        .is_some_and(|s| s.type_ == kind.type_suffix() && s.name == resource_name && hashes.is_recorded_as(&s.hash))
    {
        return None;
    }
    let source = ReloadSource {
        type_: kind.type_suffix().to_string(),
        name: resource_name.to_string(),
        namespace: workload.key.namespace.to_string(),
        hash: hash_text.clone(),
        container_refs: vec![container_name.to_string()],
        observed_at,
    };
    recorded.insert(record_key, hash_text);
    // Serializing plain strings and integers cannot fail.
    let source_json = serde_json::to_string(&source).unwrap_or_default();
    let recorded_json = serde_json::to_string(&recorded).unwrap_or_default();
    Some(json!({
        "metadata": { "annotations": { RELOADED_HASHES: recorded_json } },
        "spec": { "template": { "metadata": { "annotations": { LAST_RELOADED_FROM: source_json } } } }
    }))
}

/// The per-resource hashes this controller recorded on the workload (annotations strategy).
pub fn recorded_hashes(workload: &Workload) -> BTreeMap<String, String> {
    workload.annotations.get(RELOADED_HASHES).and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default()
}

/// The parsed `last-reloaded-from` pod template annotation, if present and well-formed.
pub fn last_reloaded_from(workload: &Workload) -> Option<ReloadSource> {
    serde_json::from_str(workload.template.annotations.get(LAST_RELOADED_FROM)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Container, PodTemplate, WorkloadKind};

    fn workload() -> Workload {
        Workload {
            uid: "u".into(),
            template: PodTemplate {
                containers: vec![
                    Container { name: "sidecar".into(), ..Default::default() },
                    Container { name: "app".into(), ..Default::default() },
                ],
                ..Default::default()
            },
            ..Workload::test(WorkloadKind::Deployment, "ns", "web")
        }
    }

    fn hash() -> DataHash {
        DataHash::of_bytes(b"test=test")
    }

    #[test]
    fn a_coalesced_write_keeps_a_deletion_beside_a_new_hash() {
        let mut w = workload();
        w.template.containers[1].recorded = vec![("STAKATER_S_SECRET".into(), "old".into())];
        let items = [
            Item::new(ResourceKind::ConfigMap, "a", 1, Target::Hash(hash().into())),
            Item::new(ResourceKind::Secret, "s", 1, Target::Deleted),
        ];
        let patch = plan_all(Strategy::EnvVars, &w, &items, 0).expect("writes");
        assert_eq!(
            patch["spec"]["template"]["spec"]["containers"],
            json!([{ "name": "app", "env": [
                { "name": "STAKATER_A_CONFIGMAP", "value": hash().to_string() },
                { "name": "STAKATER_S_SECRET", "$patch": "delete" }
            ] }])
        );
    }

    #[test]
    fn only_variables_of_resources_no_longer_referenced_are_orphans() {
        let mut w = workload();
        w.template.containers[1].env_refs = vec![(ResourceKind::ConfigMap, "kept".into())];
        w.template.containers[1].recorded = vec![
            ("STAKATER_KEPT_CONFIGMAP".into(), "a".into()),
            ("STAKATER_GONE_CONFIGMAP".into(), "b".into()),
            ("STAKATER_OWN_SETTING".into(), "user's own".into()),
        ];
        w.template.containers[0].recorded = vec![("STAKATER_DB_SECRET".into(), "c".into())];
        let keys = Keys::default();
        assert_eq!(
            orphaned_env_vars(&w, &keys),
            Some(Orphans {
                patch: json!({ "spec": { "template": { "spec": { "containers": [
                    { "name": "sidecar", "env": [ { "name": "STAKATER_DB_SECRET", "$patch": "delete" } ] },
                    { "name": "app", "env": [ { "name": "STAKATER_GONE_CONFIGMAP", "$patch": "delete" } ] }
                ] } } } }),
                names: vec!["STAKATER_DB_SECRET".into(), "STAKATER_GONE_CONFIGMAP".into()],
            })
        );
        let mut listing = w.clone();
        listing.annotations = [(keys.configmap_reload.clone(), "kept".to_string())].into();
        assert_eq!(orphaned_env_vars(&listing, &keys), None, "a workload naming resources keeps every variable");
        w.template.containers[0].recorded.clear();
        w.template.containers[1].recorded.remove(1);
        assert_eq!(orphaned_env_vars(&w, &keys), None, "nothing orphaned");
    }

    #[test]
    fn env_vars_patch_has_reloaders_shape() {
        let patch = plan(
            Strategy::EnvVars,
            &workload(),
            &Item::new(ResourceKind::ConfigMap, "my-config", 1, Target::Hash(hash().into())),
            0,
        );
        assert_eq!(
            patch,
            Some(json!({ "spec": { "template": { "spec": { "containers": [
                { "name": "app", "env": [ { "name": "STAKATER_MY_CONFIG_CONFIGMAP", "value": hash().to_string() } ] }
            ] } } } }))
        );
    }

    #[test]
    fn env_vars_is_a_no_op_when_the_hash_is_already_recorded() {
        let mut w = workload();
        w.template.containers[1].recorded.push(("STAKATER_MY_CONFIG_CONFIGMAP".into(), hash().to_string()));
        assert_eq!(
            plan(
                Strategy::EnvVars,
                &w,
                &Item::new(ResourceKind::ConfigMap, "my-config", 1, Target::Hash(hash().into())),
                0
            ),
            None
        );
        let other = DataHash::of_bytes(b"other");
        assert!(
            plan(
                Strategy::EnvVars,
                &w,
                &Item::new(ResourceKind::ConfigMap, "my-config", 1, Target::Hash(other.into())),
                0
            )
            .is_some()
        );
    }

    #[test]
    fn env_vars_delete_removes_the_var_only_when_present() {
        let mut w = workload();
        assert_eq!(plan(Strategy::EnvVars, &w, &Item::new(ResourceKind::Secret, "s", 0, Target::Deleted), 0), None);
        w.template.containers[0].recorded.push(("STAKATER_S_SECRET".into(), hash().to_string()));
        assert_eq!(
            plan(Strategy::EnvVars, &w, &Item::new(ResourceKind::Secret, "s", 0, Target::Deleted), 0),
            Some(json!({ "spec": { "template": { "spec": { "containers": [
                { "name": "sidecar", "env": [ { "name": "STAKATER_S_SECRET", "$patch": "delete" } ] }
            ] } } } }))
        );
    }

    #[test]
    fn annotation_json_has_reloader_v1_field_order() {
        let item = Item::new(ResourceKind::ConfigMap, "cm", 1, Target::Hash(hash().into()));
        let patch = plan(Strategy::Annotations, &workload(), &item, 1700000000).expect("a first reload writes");
        let value = patch["spec"]["template"]["metadata"]["annotations"][LAST_RELOADED_FROM]
            .as_str()
            .expect("annotation is a string");
        assert_eq!(
            value,
            format!(
                r#"{{"type":"CONFIGMAP","name":"cm","namespace":"ns","hash":"{}","containerRefs":["app"],"observedAt":1700000000}}"#,
                hash()
            )
        );
    }

    #[test]
    fn annotations_strategy_is_idempotent_per_resource() {
        let mut w = workload();
        let patch = plan(
            Strategy::Annotations,
            &w,
            &Item::new(ResourceKind::ConfigMap, "a", 0, Target::Hash(hash().into())),
            1,
        )
        .expect("writes");
        let recorded = patch["metadata"]["annotations"][RELOADED_HASHES].as_str().expect("string").to_string();
        w.annotations.insert(RELOADED_HASHES.into(), recorded);
        // A later reload for another resource overwrote last-reloaded-from...
        w.template.annotations.insert(
            LAST_RELOADED_FROM.into(),
            r#"{"type":"CONFIGMAP","name":"b","namespace":"ns","hash":"x","containerRefs":["sidecar"],"observedAt":2}"#
                .into(),
        );
        // ...yet replaying the change of `a` writes nothing.
        assert_eq!(
            plan(
                Strategy::Annotations,
                &w,
                &Item::new(ResourceKind::ConfigMap, "a", 0, Target::Hash(hash().into())),
                3
            ),
            None
        );
    }

    #[test]
    fn annotations_strategy_respects_a_hash_recorded_by_reloader_itself() {
        let mut w = workload();
        w.template.annotations.insert(
            LAST_RELOADED_FROM.into(),
            format!(
                r#"{{"type":"SECRET","name":"s","namespace":"ns","hash":"{}","containerRefs":["app"],"observedAt":5}}"#,
                hash()
            ),
        );
        assert_eq!(
            plan(Strategy::Annotations, &w, &Item::new(ResourceKind::Secret, "s", 1, Target::Hash(hash().into())), 9),
            None
        );
    }

    #[test]
    fn annotations_delete_records_reloaders_marker() {
        let patch =
            plan(Strategy::Annotations, &workload(), &Item::new(ResourceKind::ConfigMap, "cm", 0, Target::Deleted), 1)
                .expect("writes");
        let value = patch["spec"]["template"]["metadata"]["annotations"][LAST_RELOADED_FROM].as_str().expect("string");
        assert!(value.contains("aae45badef99284e4dae01d6046154ea9d99532f"), "{value}");
    }

    #[test]
    fn a_cronjob_records_env_var_reloads_on_its_metadata() {
        let mut w = workload();
        w.key.kind = crate::watch::WorkloadKind::CronJob;
        let patch =
            plan(Strategy::EnvVars, &w, &Item::new(ResourceKind::ConfigMap, "cm", 0, Target::Hash(hash().into())), 0)
                .expect("a first reload writes");
        let record = patch["metadata"]["annotations"][RELOADED_HASHES].as_str().expect("recorded").to_string();
        assert_eq!(record, format!(r#"{{"CONFIGMAP/cm":"{}"}}"#, hash()));
        w.annotations.insert(RELOADED_HASHES.into(), record);
        assert_eq!(
            plan(Strategy::EnvVars, &w, &Item::new(ResourceKind::ConfigMap, "cm", 0, Target::Hash(hash().into())), 0),
            None
        );
    }

    #[test]
    fn strategic_patches_apply_to_json_as_the_api_server_would() {
        let mut template = json!({
            "metadata": { "labels": { "app": "a" } },
            "spec": { "containers": [
                { "name": "a", "image": "i", "env": [ { "name": "X", "value": "1" }, { "name": "STAKATER_C_CONFIGMAP", "value": "old" } ] },
                { "name": "b", "image": "j" }
            ] }
        });
        apply_strategic(
            &mut template,
            &json!({ "metadata": { "annotations": { "k": "v" } }, "spec": { "containers": [
            { "name": "a", "env": [ { "name": "STAKATER_C_CONFIGMAP", "value": "new" } ] },
            { "name": "b", "env": [ { "name": "STAKATER_D_SECRET", "value": "h" } ] }
        ] } }),
        );
        assert_eq!(template["metadata"], json!({ "labels": { "app": "a" }, "annotations": { "k": "v" } }));
        assert_eq!(
            template["spec"]["containers"][0]["env"][1],
            json!({ "name": "STAKATER_C_CONFIGMAP", "value": "new" })
        );
        assert_eq!(template["spec"]["containers"][0]["image"], "i", "untouched fields stay");
        assert_eq!(template["spec"]["containers"][1]["env"], json!([{ "name": "STAKATER_D_SECRET", "value": "h" }]));
        apply_strategic(
            &mut template,
            &json!({ "spec": { "containers": [
            { "name": "a", "env": [ { "name": "STAKATER_C_CONFIGMAP", "$patch": "delete" } ] }
        ] } }),
        );
        assert_eq!(template["spec"]["containers"][0]["env"], json!([{ "name": "X", "value": "1" }]));
    }

    #[test]
    fn a_combined_write_records_every_resource_in_both_strategies() {
        let items = [
            Item {
                kind: ResourceKind::ConfigMap,
                name: "config".into(),
                container: 0,
                target: Target::Hash(hash().into()),
            },
            Item { kind: ResourceKind::Secret, name: "db".into(), container: 0, target: Target::Hash(hash().into()) },
        ];
        let env = plan_all(Strategy::EnvVars, &workload(), &items, 1).expect("both to record");
        let vars = env.pointer("/spec/template/spec/containers/0/env").and_then(Value::as_array).expect("env list");
        let names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        assert_eq!(names, ["STAKATER_CONFIG_CONFIGMAP", "STAKATER_DB_SECRET"]);
        let ann = plan_all(Strategy::Annotations, &workload(), &items, 1).expect("both to record");
        let hashes = ann.pointer("/metadata/annotations").and_then(|a| a[RELOADED_HASHES].as_str()).expect("record");
        let hashes: BTreeMap<String, String> = serde_json::from_str(hashes).expect("JSON");
        assert_eq!(hashes.keys().collect::<Vec<_>>(), ["CONFIGMAP/config", "SECRET/db"], "neither hash is lost");
        let mut done = workload();
        done.template.containers[0].recorded = vec![
            ("STAKATER_CONFIG_CONFIGMAP".into(), hash().to_string()),
            ("STAKATER_DB_SECRET".into(), hash().to_string()),
        ];
        assert_eq!(plan_all(Strategy::EnvVars, &done, &items, 1), None, "nothing to write when every hash is recorded");
    }

    #[test]
    fn strategy_flag_values() {
        assert_eq!("env-vars".parse(), Ok(Strategy::EnvVars));
        assert_eq!("annotations".parse(), Ok(Strategy::Annotations));
        assert!("rolling".parse::<Strategy>().unwrap_err().contains("env-vars, annotations"));
    }
}
