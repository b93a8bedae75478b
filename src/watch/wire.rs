//! Slim wire types: what the watches deserialize from the API server.
//!
//! Each type names only the fields the engine reads; serde skips everything else while parsing
//! (images, resources, probes, status...), so nothing large is ever allocated for them. Each is
//! turned into its compact stored form at once and dropped.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ByteString, NamespaceResourceScope};
use kube::discovery::ApiResource;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::warn;

use crate::watch::pod_wire::{OptionalNamed, WireContainer, WirePodTemplate, WireVolume};
use crate::watch::used_keys::{ANNOTATION as USED_KEYS_ANNOTATION, KeyHashes, key_uses};
use crate::watch::{
    Annotations, Container, DataHash, PodTemplate, Reference, ResourceKind, ResourceState, Volume, WideHash, Workload,
    WorkloadKey, WorkloadKind, WriteMethod,
};

/// Implement `kube::Resource` for a slim type so that `Api<T>` and the watcher can use it.
macro_rules! slim_resource {
    ($ty:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Clone, Debug, Deserialize)]
pub struct SlimConfigMap {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    #[serde(default, rename = "binaryData")]
    pub binary_data: BTreeMap<String, ByteString>,
}
slim_resource!(SlimConfigMap, "", "v1", "ConfigMap", "configmaps");

#[derive(Clone, Debug, Deserialize)]
pub struct SlimSecret {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub data: BTreeMap<String, ByteString>,
}
slim_resource!(SlimSecret, "", "v1", "Secret", "secrets");

/// What the Secrets Store CSI driver reports per pod and SecretProviderClass: the versions of
/// the objects it mounted. Rotation changes a version.
#[derive(Clone, Debug, Deserialize)]
pub struct SlimSpcPodStatus {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: SpcPodStatusBody,
}
slim_resource!(
    SlimSpcPodStatus,
    "secrets-store.csi.x-k8s.io",
    "v1",
    "SecretProviderClassPodStatus",
    "secretproviderclasspodstatuses"
);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpcPodStatusBody {
    #[serde(default)]
    pub secret_provider_class_name: String,
    #[serde(default)]
    pub objects: Vec<SpcObject>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SpcObject {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub version: String,
}

/// A SecretProviderClass: only its annotations matter (`ignore`, `match`).
#[derive(Clone, Debug, Deserialize)]
pub struct SlimSecretProviderClass {
    pub metadata: ObjectMeta,
}
slim_resource!(
    SlimSecretProviderClass,
    "secrets-store.csi.x-k8s.io",
    "v1",
    "SecretProviderClass",
    "secretproviderclasses"
);

/// Deployment, DaemonSet and StatefulSet share the `spec.template` shape.
#[derive(Clone, Debug, Deserialize)]
pub struct SlimDeployment {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TemplateSpec,
    #[serde(default)]
    pub status: WireStatus,
}
slim_resource!(SlimDeployment, "apps", "v1", "Deployment", "deployments");

#[derive(Clone, Debug, Deserialize)]
pub struct SlimDaemonSet {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TemplateSpec,
    #[serde(default)]
    pub status: WireStatus,
}
slim_resource!(SlimDaemonSet, "apps", "v1", "DaemonSet", "daemonsets");

#[derive(Clone, Debug, Deserialize)]
pub struct SlimStatefulSet {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TemplateSpec,
    #[serde(default)]
    pub status: WireStatus,
}
slim_resource!(SlimStatefulSet, "apps", "v1", "StatefulSet", "statefulsets");

/// Any other workload kind (CronJob, Job, Rollout, DeploymentConfig): metadata and the spec
/// as JSON. The table ([`WorkloadKind::spec`]) says where the pod template sits in it, and the
/// writer needs parts of it verbatim (a Job is created from a job template). The status is
/// skipped while parsing.
#[derive(Clone, Debug, Deserialize)]
pub struct SlimRaw {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
}

impl kube::Resource for SlimRaw {
    type DynamicType = ApiResource;
    // Dynamic, as for `DynamicObject`: every kind in the table is namespaced.
    type Scope = kube::core::DynamicResourceScope;
    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A slim workload type: which kind it is and where its pod template sits.
pub trait SlimWorkload:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + serde::de::DeserializeOwned
    + Clone
    + std::fmt::Debug
    + Send
    + 'static
{
    const KIND: WorkloadKind;
    fn template(&self) -> &WirePodTemplate;
    fn paused(&self) -> bool;
    /// Whether the last change of the pod template is rolled out (`kubectl rollout status`).
    fn rolled_out(&self) -> bool;
}

macro_rules! slim_workload {
    ($ty:ident, $kind:expr) => {
        impl SlimWorkload for $ty {
            const KIND: WorkloadKind = $kind;
            fn template(&self) -> &WirePodTemplate {
                &self.spec.template
            }
            fn paused(&self) -> bool {
                self.spec.paused
            }
            fn rolled_out(&self) -> bool {
                rollout_complete(Self::KIND, self.metadata.generation, &self.spec, &self.status)
            }
        }
    };
}

/// A part of a raw object's pod (its metadata or spec); one that does not parse is logged and
/// read as empty: such an object can never reload, and the watch goes on.
fn read_part<T: serde::de::DeserializeOwned + Default>(kind: WorkloadKind, object: &SlimRaw, part: &Value) -> T {
    if part.is_null() {
        return T::default();
    }
    T::deserialize(part).unwrap_or_else(|err| {
        warn!(kind = kind.kind(), name = ?object.metadata.name, error = %err, "ignoring an unreadable pod template");
        T::default()
    })
}

/// `kubectl rollout status`'s rule: the controller saw the latest spec, and every replica is
/// updated and available (old ones gone).
fn rollout_complete(kind: WorkloadKind, generation: Option<i64>, spec: &TemplateSpec, status: &WireStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0) >= generation.unwrap_or(0);
    let wanted = spec.replicas.unwrap_or(1);
    let updated = n(status.updated_replicas);
    observed
        && match kind {
            WorkloadKind::Deployment => {
                updated >= wanted && n(status.replicas) <= updated && n(status.available_replicas) >= updated
            }
            WorkloadKind::StatefulSet => updated >= wanted && n(status.ready_replicas) >= wanted,
            WorkloadKind::DaemonSet => {
                let desired = n(status.desired_number_scheduled);
                n(status.updated_number_scheduled) >= desired && n(status.number_available) >= desired
            }
            _ => true,
        }
}
slim_workload!(SlimDeployment, WorkloadKind::Deployment);
slim_workload!(SlimDaemonSet, WorkloadKind::DaemonSet);
slim_workload!(SlimStatefulSet, WorkloadKind::StatefulSet);

/// The status fields that tell whether a rollout is complete (the union of the three kinds').
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireStatus {
    pub observed_generation: Option<i64>,
    pub replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub desired_number_scheduled: Option<i32>,
    pub updated_number_scheduled: Option<i32>,
    pub number_available: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct TemplateSpec {
    #[serde(default)]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub template: WirePodTemplate,
    /// Deployments only; other kinds have no such field.
    #[serde(default)]
    pub paused: bool,
}

/// Label on the controller's own ConfigMaps (checkpoints): the watches never store them, so
/// the engine does not react to its own writes.
pub const INTERNAL_LABEL: &str = "reloader-fleet.stakater.com/internal";

/// Prefix of the env vars Reloader writes; only these are kept from `env`.
const RECORD_PREFIX: &str = "STAKATER_";

/// The volume attribute naming the SecretProviderClass of a Secrets Store CSI volume.
const SPC_ATTRIBUTE: &str = "secretProviderClass";

/// The annotation keys the rules read, as the watches keep them.
#[derive(Clone, Debug, Default)]
pub struct AnnotationKeys {
    /// Workload annotations worth keeping.
    pub workload: Vec<String>,
    /// Those of them that can make a workload reload (auto, typed auto, the `.../reload` lists,
    /// `search`): only a workload with one keeps what its write needs ([`Workload::raw`]).
    pub reloading: Vec<String>,
    /// The resource annotations Reloader reads.
    pub ignore: String,
    pub search_match: String,
}

/// The longest value kept of an annotation the rules read: the `.../reload` lists are read up to
/// 16 KiB (one byte more tells a longer list), the others are a word or a small JSON record.
const VALUE_LIMIT: usize = 16 * 1024 + 1;
/// Of keys that only look like Reloader's (kept for the lint), at most this many an object,
/// each value cut to [`LOOKALIKE_VALUE_LIMIT`] (the lint shows 64 characters).
const LOOKALIKES_KEPT: usize = 8;
const LOOKALIKE_VALUE_LIMIT: usize = 128;
/// The longest raw JSON kept for a write ([`Workload::raw`]); a larger one is read with a GET
/// when the write comes, so no object's size decides the controller's memory.
pub const RAW_LIMIT: usize = 64 * 1024;

/// Turns wire objects into stored forms, keeping only the annotation keys the engine reads.
#[derive(Clone, Debug, Default)]
pub struct Compactor {
    /// Shared: the compactor is cloned into every watch stream and event handler.
    workload_keys: Arc<[String]>,
    reloading_keys: Arc<[String]>,
    ignore_key: Arc<str>,
    search_match_key: Arc<str>,
    /// `--auto-reload-all`: any workload may reload, so every one keeps what its write needs.
    raw_for_all: bool,
    /// Keep annotation keys that look like Reloader's too, for the annotation lint.
    keep_lookalikes: bool,
    /// `--hash=sha512-256`: ConfigMaps and Secrets also get their SHA-512/256, which writes record.
    wide: bool,
    /// `--reload-on-used-keys`: workloads reload only for the keys they use, unless their
    /// annotation says `"false"` (without the flag: only those whose annotation says `"true"`).
    used_keys: bool,
    /// Whether ConfigMaps and Secrets get per-key hashes: until the first sync every one does
    /// (a workload reading by key may be listed after its ConfigMap, and the store keeps only
    /// what stored workloads use once in sync); after it, only while some workload reloads for
    /// the keys it uses (shared by every clone).
    keys_wanted: Arc<AtomicBool>,
}

/// Whether an annotation key may concern Reloader at all (a misspelling included): cheap, so
/// that every other annotation is dropped on arrival.
pub fn looks_like_reloader(key: &str) -> bool {
    let key = key.as_bytes();
    ["reloader", "stakater", "stakter", "staketer"]
        .iter()
        .any(|word| key.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word.as_bytes())))
}

/// Labels the job controller puts on a Job and its template for one Job UID; a Job created
/// again must not carry them (Reloader removes them from the template too).
pub const JOB_UID_LABELS: [&str; 4] =
    ["controller-uid", "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "job-name"];

impl Compactor {
    /// `keys`: the annotations the rules read. `raw_for_all`: whether workloads without any of
    /// those annotations may reload too (`--auto-reload-all`).
    pub fn new(keys: AnnotationKeys, raw_for_all: bool) -> Self {
        Compactor {
            workload_keys: keys.workload.into(),
            reloading_keys: keys.reloading.into(),
            ignore_key: keys.ignore.into(),
            search_match_key: keys.search_match.into(),
            raw_for_all,
            keep_lookalikes: false,
            wide: false,
            used_keys: false,
            keys_wanted: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Also hash ConfigMaps and Secrets with SHA-512/256 (`--hash=sha512-256`).
    pub fn hashing_wide(mut self) -> Self {
        self.wide = true;
        self
    }

    /// Also keep workload annotations that look like Reloader's (for the lint).
    pub fn keeping_lookalikes(mut self) -> Self {
        self.keep_lookalikes = true;
        self
    }

    /// Whether this ConfigMap is one of the controller's own.
    pub fn is_internal(cm: &SlimConfigMap) -> bool {
        cm.metadata.labels.as_ref().is_some_and(|l| l.contains_key(INTERNAL_LABEL))
    }

    pub fn configmap(&self, cm: &SlimConfigMap) -> ResourceState {
        let binary: BTreeMap<String, Vec<u8>> = cm.binary_data.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
        let mut state = self.resource_state(&cm.metadata, DataHash::of_configmap(&cm.data, &binary));
        state.wide = self.wide.then(|| Box::new(WideHash::of_configmap(&cm.data, &binary)));
        state.keys = self.key_hashes(|| KeyHashes::of_configmap(&cm.data, &binary));
        state
    }

    pub fn secret(&self, secret: &SlimSecret) -> ResourceState {
        let data: BTreeMap<String, Vec<u8>> = secret.data.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
        let mut state = self.resource_state(&secret.metadata, DataHash::of_secret(&data));
        state.wide = self.wide.then(|| Box::new(WideHash::of_secret(&data)));
        state.keys = self.key_hashes(|| KeyHashes::of_secret(&data));
        state
    }

    /// Reloader's hash of a pod status: the same for every pod mounting the same versions.
    pub fn spc_pod_status_hash(status: &SlimSpcPodStatus) -> DataHash {
        let body = &status.status;
        DataHash::of_secret_provider_class(
            &body.secret_provider_class_name,
            body.objects.iter().map(|o| (o.id.as_str(), o.version.as_str())),
        )
    }

    /// `--reload-on-used-keys`: workloads reload only for the keys they use by default.
    pub fn reloading_on_used_keys(mut self) -> Self {
        self.used_keys = true;
        self.keys_wanted.store(true, Ordering::Relaxed);
        self
    }

    /// The store is in sync: per-key hashes are made from now on only if `used` (some stored
    /// workload reloads for the keys it uses), or with `--reload-on-used-keys`; a workload
    /// stored later that reads by key turns them on again.
    pub fn settle_key_hashes(&self, used: bool) {
        self.keys_wanted.store(self.used_keys || used, Ordering::Relaxed);
    }

    /// Per-key hashes of a ConfigMap's or Secret's data, while they may be wanted.
    fn key_hashes(&self, of: impl FnOnce() -> KeyHashes) -> Option<Box<KeyHashes>> {
        self.keys_wanted.load(Ordering::Relaxed).then(|| Box::new(of()))
    }

    /// Whether a workload with these annotations reloads only for the keys it uses.
    fn on_used_keys(&self, annotations: Option<&BTreeMap<String, String>>) -> bool {
        match annotations.and_then(|a| a.get(USED_KEYS_ANNOTATION)).map(|v| v.trim()) {
            Some("true") => true,
            Some("false") => false,
            _ => self.used_keys,
        }
    }

    /// The `ignore` and `match` annotations of a SecretProviderClass, on a state of `hash`.
    pub fn secret_provider_class(&self, class: &SlimSecretProviderClass, hash: DataHash) -> ResourceState {
        self.resource_state(&class.metadata, hash)
    }

    fn resource_state(&self, meta: &ObjectMeta, hash: DataHash) -> ResourceState {
        let is_true = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).is_some_and(|v| v == "true");
        ResourceState {
            hash,
            ignored: is_true(&self.ignore_key),
            search_match: is_true(&self.search_match_key),
            wide: None,
            keys: None,
        }
    }

    /// The stored form of a slim workload; `None` without namespace or name (never sent).
    pub fn compact<K: SlimWorkload>(&self, object: &K) -> Option<Workload> {
        let mut workload = self.workload(K::KIND, object.meta(), object.template())?;
        workload.paused = object.paused();
        workload.rolled_out = object.rolled_out();
        Some(workload)
    }

    /// The stored form of a workload of a kind read as [`SlimRaw`]; `None` without namespace
    /// or name. A pod template that does not parse is logged and stored empty (such an object
    /// can never reload, and the watch goes on).
    pub fn compact_raw(&self, kind: WorkloadKind, object: &SlimRaw) -> Option<Workload> {
        let place = kind.spec().pod;
        let pod_spec = place.spec(&object.spec);
        let template = WirePodTemplate {
            metadata: read_part(kind, object, place.metadata(&object.spec)),
            spec: read_part(kind, object, pod_spec),
        };
        let mut workload = self.workload(kind, &object.metadata, &template)?;
        // An Argo Rollout that runs a Deployment's pod template (`spec.workloadRef`).
        let reference = &object.spec["workloadRef"];
        if kind == WorkloadKind::Rollout && reference["kind"] == "Deployment" {
            workload.workload_ref = reference["name"].as_str().filter(|n| !n.is_empty()).map(Arc::from);
        }
        // Only a key that can make it reload (not a look-alike, not an exclude list) keeps
        // what its write needs, and only up to RAW_LIMIT: a larger one is read when written.
        let reloading = |a: &Annotations| self.reloading_keys.iter().any(|k| a.contains_key(k));
        let may_reload =
            self.raw_for_all || reloading(&workload.annotations) || reloading(&workload.template.annotations);
        if workload.workload_ref.is_some() {
            // No template of its own: what a restart needs is the last `restartAt`, so that the
            // next one is later (Argo restarts only pods created before it).
            workload.raw = object.spec["restartAt"].as_str().filter(|r| r.len() <= 64).map(Arc::from);
        } else if may_reload {
            workload.raw = Self::raw_of(kind, object).filter(|raw| raw.len() <= RAW_LIMIT).map(Arc::from);
        }
        Some(workload)
    }

    /// What a write of `kind` needs beyond the slim view, as compact JSON: the job template of
    /// a CronJob, the spec of a Job, the containers of a custom resource; `None` for the kinds
    /// written by a strategic-merge patch.
    pub fn raw_of(kind: WorkloadKind, object: &SlimRaw) -> Option<String> {
        let raw = match kind.spec().write {
            WriteMethod::CreateJob => object.spec["jobTemplate"].clone(),
            WriteMethod::Recreate => {
                let meta = &object.metadata;
                json!({
                    "metadata": {
                        "labels": meta.labels, "annotations": meta.annotations,
                        "ownerReferences": meta.owner_references
                    },
                    "spec": object.spec
                })
            }
            WriteMethod::MergePatch => kind.spec().pod.spec(&object.spec)["containers"].clone(),
            WriteMethod::StrategicPatch => Value::Null,
        };
        (!raw.is_null()).then(|| raw.to_string())
    }

    /// `None` for an object without namespace or name, which the API server never sends.
    pub fn workload(&self, kind: WorkloadKind, meta: &ObjectMeta, template: &WirePodTemplate) -> Option<Workload> {
        let key = WorkloadKey {
            kind,
            namespace: Arc::from(meta.namespace.as_deref()?),
            name: Arc::from(meta.name.as_deref()?),
        };
        // Only volumes that project a resource matter; a mount of any other names nothing.
        let volumes: Vec<Volume> = template.spec.volumes.iter().map(volume).filter(|v| !v.sources.is_empty()).collect();
        let key_uses = if self.on_used_keys(meta.annotations.as_ref()) { key_uses(&template.spec) } else { None };
        if key_uses.is_some() && !self.keys_wanted.load(Ordering::Relaxed) {
            self.keys_wanted.store(true, Ordering::Relaxed);
        }
        Some(Workload {
            key,
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            annotations: self.keep(meta.annotations.as_ref()),
            template: PodTemplate {
                annotations: self.keep(Some(&template.metadata.annotations)),
                containers: template.spec.containers.iter().map(|c| container(c, &volumes)).collect(),
                init_containers: template.spec.init_containers.iter().map(|c| container(c, &volumes)).collect(),
                volumes,
                key_uses,
            },
            paused: false,
            generation: meta.generation.unwrap_or(0),
            rolled_out: true,
            raw: None,
            workload_ref: None,
        })
    }

    /// The annotations the rules read, each value cut to [`VALUE_LIMIT`], and (for the lint) a
    /// few that only look like Reloader's, cut shorter: what an object's annotations may make
    /// the controller keep is bounded, however many or large they are.
    fn keep(&self, annotations: Option<&BTreeMap<String, String>>) -> Annotations {
        let mut lookalikes = 0;
        annotations
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| {
                let limit = if self.workload_keys.iter().any(|w| w == k) {
                    VALUE_LIMIT
                } else if self.keep_lookalikes && lookalikes < LOOKALIKES_KEPT && looks_like_reloader(k) {
                    lookalikes += 1;
                    LOOKALIKE_VALUE_LIMIT
                } else {
                    return None;
                };
                Some((k.clone(), cut(v, limit)))
            })
            .collect()
    }
}

/// `value` cut to at most `limit` bytes, at a character boundary.
fn cut(value: &str, limit: usize) -> String {
    if value.len() <= limit {
        return value.to_string();
    }
    let mut end = limit;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_string()
}

fn container(c: &WireContainer, volumes: &[Volume]) -> Container {
    let mut env_refs = Vec::new();
    let mut recorded = Vec::new();
    for var in &c.env {
        if let Some(from) = &var.value_from {
            push_named(&mut env_refs, ResourceKind::ConfigMap, from.config_map_key_ref.as_ref());
            push_named(&mut env_refs, ResourceKind::Secret, from.secret_key_ref.as_ref());
        } else if var.name.starts_with(RECORD_PREFIX) {
            recorded.push((var.name.clone(), var.value.clone().unwrap_or_default()));
        }
    }
    for from in &c.env_from {
        push_named(&mut env_refs, ResourceKind::ConfigMap, from.config_map_ref.as_ref());
        push_named(&mut env_refs, ResourceKind::Secret, from.secret_ref.as_ref());
    }
    Container {
        name: c.name.clone(),
        volume_mounts: c
            .volume_mounts
            .iter()
            .filter(|m| volumes.iter().any(|v| v.name == m.name))
            .map(|m| m.name.clone())
            .collect(),
        env_refs,
        recorded,
    }
}

fn volume(v: &WireVolume) -> Volume {
    let mut sources = Vec::new();
    push_named(&mut sources, ResourceKind::ConfigMap, v.config_map.as_ref());
    if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.as_ref()) {
        sources.push((ResourceKind::Secret, Arc::from(name.as_str())));
    }
    for p in v.projected.iter().flat_map(|p| &p.sources) {
        push_named(&mut sources, ResourceKind::ConfigMap, p.config_map.as_ref());
        push_named(&mut sources, ResourceKind::Secret, p.secret.as_ref());
    }
    if let Some(class) = v.csi.as_ref().and_then(|c| c.volume_attributes.get(SPC_ATTRIBUTE)) {
        sources.push((ResourceKind::SecretProviderClass, Arc::from(class.as_str())));
    }
    Volume { name: v.name.clone(), sources }
}

fn push_named(out: &mut Vec<Reference>, kind: ResourceKind, named: Option<&OptionalNamed>) {
    if let Some(name) = named.and_then(|n| n.name.as_ref()) {
        out.push((kind, Arc::from(name.as_str())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compactor() -> Compactor {
        Compactor::new(
            AnnotationKeys {
                workload: vec!["reloader.stakater.com/auto".into()],
                reloading: vec!["reloader.stakater.com/auto".into()],
                ignore: "reloader.stakater.com/ignore".into(),
                search_match: "reloader.stakater.com/match".into(),
            },
            false,
        )
    }

    #[test]
    fn every_reference_method_is_recognised() {
        let d: SlimDeployment = serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "ns", "resourceVersion": "7",
                          "annotations": { "reloader.stakater.com/auto": "true", "noise": "x" } },
            "spec": { "replicas": 3, "template": {
                "metadata": { "annotations": { "noise": "y" } },
                "spec": {
                    "initContainers": [{ "name": "init", "envFrom": [{ "secretRef": { "name": "init-secret" } }] }],
                    "containers": [{
                        "name": "app", "image": "ignored",
                        "env": [
                            { "name": "A", "valueFrom": { "configMapKeyRef": { "name": "cm-a", "key": "k" } } },
                            { "name": "B", "valueFrom": { "secretKeyRef": { "name": "s-b", "key": "k" } } },
                            { "name": "STAKATER_CM_A_CONFIGMAP", "value": "abc" },
                            { "name": "PLAIN", "value": "v" }
                        ],
                        "envFrom": [{ "configMapRef": { "name": "cm-c" } }],
                        "volumeMounts": [{ "name": "vol", "mountPath": "/etc" }]
                    }],
                    "volumes": [
                        { "name": "vol", "configMap": { "name": "cm-d" } },
                        { "name": "sec", "secret": { "secretName": "s-e" } },
                        { "name": "proj", "projected": { "sources": [
                            { "configMap": { "name": "cm-f" } }, { "secret": { "name": "s-g" } },
                            { "downwardAPI": { "items": [] } } ] } },
                        { "name": "csi", "csi": { "driver": "secrets-store.csi.k8s.io",
                            "volumeAttributes": { "secretProviderClass": "spc-h" } } }
                    ]
                }
            } }
        }))
        .expect("valid deployment JSON");
        let w = compactor()
            .workload(WorkloadKind::Deployment, &d.metadata, &d.spec.template)
            .expect("has namespace and name");
        assert_eq!(w.resource_version, "7");
        assert_eq!(w.annotations.len(), 1, "only annotation keys the engine reads are kept");
        assert!(w.template.annotations.is_empty());
        let refs: Vec<_> = w.template.references().map(|(k, n)| (*k, &**n)).collect();
        for expected in [
            (ResourceKind::ConfigMap, "cm-a"),
            (ResourceKind::Secret, "s-b"),
            (ResourceKind::ConfigMap, "cm-c"),
            (ResourceKind::ConfigMap, "cm-d"),
            (ResourceKind::Secret, "s-e"),
            (ResourceKind::ConfigMap, "cm-f"),
            (ResourceKind::Secret, "s-g"),
            (ResourceKind::SecretProviderClass, "spc-h"),
            (ResourceKind::Secret, "init-secret"),
        ] {
            assert!(refs.contains(&expected), "missing {expected:?} in {refs:?}");
        }
        assert_eq!(w.template.containers[0].recorded, vec![("STAKATER_CM_A_CONFIGMAP".into(), "abc".into())]);
    }

    #[test]
    fn reloader_lookalike_keys_are_recognised_in_any_case() {
        for key in ["reloader.stakater.com/auto", "Reloader.Stakter.com/auto", "x.staketer.io/y", "my-reloader/z"] {
            assert!(looks_like_reloader(key), "{key}");
        }
        for key in ["app.kubernetes.io/name", "deployment.kubernetes.io/revision", "stak"] {
            assert!(!looks_like_reloader(key), "{key}");
        }
    }

    #[test]
    fn configmap_state_hashes_data_and_reads_exact_true_annotations() {
        let cm: SlimConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "c", "namespace": "n",
                          "annotations": { "reloader.stakater.com/ignore": "True", "reloader.stakater.com/match": "true" } },
            "data": { "test": "test" }, "binaryData": { "bintest": "dGVzdA==" }
        }))
        .expect("valid configmap JSON");
        let state = compactor().configmap(&cm);
        assert_eq!(state.hash.to_string(), "0d58150de76a895b24f4ca213f590766160c4349");
        assert!(!state.ignored, "ignore needs exactly \"true\"");
        assert!(state.search_match);
    }
}

#[cfg(test)]
mod bounds {
    use super::*;
    use serde_json::json;

    fn compactor() -> Compactor {
        let reloading = vec!["reloader.stakater.com/auto".to_string(), "configmap.reloader.stakater.com/reload".into()];
        let mut workload = reloading.clone();
        workload.push("configmaps.exclude.reloader.stakater.com/reload".into());
        Compactor::new(AnnotationKeys { workload, reloading, ignore: "i".into(), search_match: "m".into() }, false)
            .keeping_lookalikes()
    }

    fn cronjob(annotations: Value, env_bytes: usize) -> SlimRaw {
        serde_json::from_value(json!({
            "metadata": { "name": "nightly", "namespace": "team", "annotations": annotations },
            "spec": { "jobTemplate": { "spec": { "template": { "spec": { "containers": [{
                "name": "job", "env": [{ "name": "BIG", "value": "x".repeat(env_bytes) }]
            }] } } } } }
        }))
        .expect("a CronJob")
    }

    /// Issue 49: every annotation whose key contained "reloader" was kept whole, so a tenant
    /// decided what the controller holds. Now: the keys the rules read, cut to the length they
    /// are read to, and a few look-alikes for the lint, cut shorter.
    #[test]
    fn what_annotations_make_the_controller_keep_is_bounded() {
        let mut annotations = serde_json::Map::new();
        for i in 0..50 {
            annotations.insert(format!("reloader.example.com/note-{i}"), json!("v".repeat(200 * 1024)));
        }
        annotations.insert("configmap.reloader.stakater.com/reload".into(), json!("a,".repeat(50 * 1024)));
        annotations.insert("reloader.stakater.com/auto".into(), json!("true"));
        let stored =
            compactor().compact_raw(WorkloadKind::CronJob, &cronjob(Value::Object(annotations), 10)).expect("stored");
        let bytes: usize = stored.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes < VALUE_LIMIT + LOOKALIKES_KEPT * 200 + 200, "{bytes} bytes of annotations kept");
        let list = stored.annotations.get("configmap.reloader.stakater.com/reload").expect("kept");
        assert_eq!(list.len(), VALUE_LIMIT, "cut past the limit");
        assert_eq!(stored.annotations.len(), 2 + LOOKALIKES_KEPT);
    }

    #[test]
    fn only_a_key_that_can_reload_keeps_the_template_and_only_a_small_one() {
        let c = compactor();
        let raw = |annotations: Value, bytes: usize| {
            c.compact_raw(WorkloadKind::CronJob, &cronjob(annotations, bytes)).expect("stored").raw.is_some()
        };
        assert!(raw(json!({ "reloader.stakater.com/auto": "true" }), 10));
        assert!(!raw(json!({ "reloader.example.com/anything": "true" }), 10), "a look-alike reloads nothing");
        assert!(!raw(json!({ "configmaps.exclude.reloader.stakater.com/reload": "x" }), 10), "an exclude list neither");
        assert!(!raw(json!({ "reloader.stakater.com/auto": "true" }), RAW_LIMIT), "read when written, not kept");
        let object = cronjob(json!({ "reloader.stakater.com/auto": "true" }), RAW_LIMIT);
        assert!(Compactor::raw_of(WorkloadKind::CronJob, &object).is_some_and(|r| r.len() > RAW_LIMIT));
    }
}
