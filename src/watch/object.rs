//! The compact forms the stores keep, and the identities of resources and workloads.
//!
//! ```text
//!  ConfigMap / Secret / SPC  --(referenced by)-->  Workload --(has)--> PodTemplate
//!   ResourceKey + DataHash                          WorkloadKey          containers, init containers,
//!                                                                        volumes, annotations
//! ```

use std::fmt;
use std::sync::Arc;

use crate::watch::used_keys::{KeyHashes, KeyUses};
use crate::watch::{DataHash, Hashes, WideHash, WorkloadKind};

/// The kinds of resource whose data changes roll workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    ConfigMap,
    Secret,
    /// A SecretProviderClass, whose mounted content is reported by SecretProviderClassPodStatus.
    SecretProviderClass,
}

impl ResourceKind {
    /// The upper-case type Reloader writes in env var names and `last-reloaded-from`.
    pub fn type_suffix(self) -> &'static str {
        match self {
            ResourceKind::ConfigMap => "CONFIGMAP",
            ResourceKind::Secret => "SECRET",
            ResourceKind::SecretProviderClass => "SECRETPROVIDERCLASS",
        }
    }

    /// The Kubernetes kind, for logs and Events.
    pub fn kind(self) -> &'static str {
        match self {
            ResourceKind::ConfigMap => "ConfigMap",
            ResourceKind::Secret => "Secret",
            ResourceKind::SecretProviderClass => "SecretProviderClass",
        }
    }

    /// Reloader's resource type in metric labels (`configmaps`, `secrets`, ...).
    pub fn plural(self) -> &'static str {
        match self {
            ResourceKind::ConfigMap => "configmaps",
            ResourceKind::Secret => "secrets",
            ResourceKind::SecretProviderClass => "secretproviderclasspodstatuses",
        }
    }
}

/// Identity of a ConfigMap, Secret or SecretProviderClass.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub kind: ResourceKind,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.kind(), self.namespace, self.name)
    }
}

/// Identity of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: WorkloadKind,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.kind(), self.namespace, self.name)
    }
}

/// A resource whose data changed, appeared or disappeared, as one watch event showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: ResourceKey,
    /// The hash the event carried; `None` for a deletion. The store may already hold a newer
    /// one; this one tells what the event itself saw (a create is baselined at this hash).
    pub observed: Option<DataHash>,
    /// The hash the store held before this event, if it held the resource: the baseline for a
    /// resource the engine never saw change.
    pub previous: Option<DataHash>,
    /// Whether a live watch event or a (re)list reported it.
    pub cause: Cause,
}

/// Where a [`Change`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A live add, update or delete.
    Event,
    /// A relist (after a watch gap, or when namespaces join the selection) found the resource
    /// new or different. New-to-us is not "created": such a resource is taken as a baseline.
    Listed,
}

/// An object the watches stored that carries an annotation that looks like Reloader's: what
/// the annotation lint checks. Sent only for owned namespaces, and for a workload only when
/// its annotations differ from the version stored before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The lint reads the workload from the store (the version current when it looks).
    Workload(WorkloadKey),
    /// Resources keep no annotations in the store: they travel with the message.
    Resource { key: ResourceKey, uid: String, annotations: Annotations },
}

/// What the engine knows of a ConfigMap, Secret or SecretProviderClass: its hash and the two
/// annotations Reloader reads on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceState {
    pub hash: DataHash,
    /// The ignore annotation is exactly `"true"`: this resource never triggers reloads.
    pub ignored: bool,
    /// The match annotation is exactly `"true"`: workloads with `search` reload for it.
    pub search_match: bool,
    /// With `--hash=sha512-256`, the data's SHA-512/256 (boxed: 8 bytes when off).
    pub wide: Option<Box<WideHash>>,
    /// Per-key hashes, while some workload reloads only for the keys it uses: all keys as an
    /// event brings them, the keys used selectively as the store keeps them.
    pub keys: Option<Box<KeyHashes>>,
}

impl ResourceState {
    /// The forms a workload may record for this data.
    pub fn hashes(&self) -> Hashes {
        Hashes { sha1: self.hash, wide: self.wide.as_deref().copied() }
    }
}

/// A workload as the engine needs it: no status, no images, no resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub key: WorkloadKey,
    pub uid: String,
    pub resource_version: String,
    /// Workload metadata annotations, only the keys the engine reads.
    pub annotations: Annotations,
    pub template: PodTemplate,
    /// `spec.paused` (Deployments only; always false for other kinds).
    pub paused: bool,
    /// `metadata.generation`: which spec the rollout state below is about.
    pub generation: i64,
    /// Whether the last pod template change is rolled out (Deployments, StatefulSets and
    /// DaemonSets report it; other kinds count as rolled out at once).
    pub rolled_out: bool,
    /// What a write of this kind needs beyond the slim view, as compact JSON (the job
    /// template of a CronJob, the spec of a Job, the containers of a custom resource), kept
    /// only for workloads whose annotations (or `--auto-reload-all`) may make them reload.
    /// `None` for the kinds written by a strategic-merge patch.
    pub raw: Option<Arc<str>>,
    /// An Argo Rollout's `spec.workloadRef`: the Deployment (in its namespace) whose pod template
    /// it runs. Its references are that Deployment's (the store fills them in), and a reload is
    /// a restart of the Rollout recorded on its metadata, since it has no template to write.
    pub workload_ref: Option<Arc<str>>,
}

#[cfg(test)]
impl Workload {
    /// A rolled-out `kind` `namespace/name` at generation 1 and resourceVersion "1", with
    /// nothing else: unit tests set what they are about with struct update syntax.
    pub(crate) fn test(kind: WorkloadKind, namespace: &str, name: &str) -> Self {
        Workload {
            key: WorkloadKey { kind, namespace: namespace.into(), name: name.into() },
            uid: String::new(),
            resource_version: "1".into(),
            annotations: Annotations::default(),
            template: PodTemplate::default(),
            paused: false,
            generation: 1,
            rolled_out: true,
            raw: None,
            workload_ref: None,
        }
    }
}

/// The pod template parts that reference resources or record reloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodTemplate {
    /// Pod template annotations, only the keys the engine reads.
    pub annotations: Annotations,
    pub containers: Vec<Container>,
    pub init_containers: Vec<Container>,
    pub volumes: Vec<Volume>,
    /// The resources used only by some keys, when this workload reloads only for the keys it
    /// uses (`--reload-on-used-keys` or its annotation); `None` otherwise.
    pub key_uses: Option<Box<KeyUses>>,
}

/// A resource a pod template names. The name is shared with the store's index of who uses
/// what, which would otherwise hold a copy of it.
pub type Reference = (ResourceKind, Arc<str>);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    /// Names of the volumes this container mounts, in order.
    pub volume_mounts: Vec<String>,
    /// Resources named in `env[].valueFrom` or `envFrom[]`, in order.
    pub env_refs: Vec<Reference>,
    /// `STAKATER_*` env vars with literal values: what Reloader recorded here.
    pub recorded: Vec<(String, String)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    /// Resources this volume projects: a configMap, a secret, projected sources or a CSI class.
    pub sources: Vec<Reference>,
}

impl PodTemplate {
    /// Every resource this template references, in any way Reloader recognises.
    pub fn references(&self) -> impl Iterator<Item = &Reference> {
        self.volumes
            .iter()
            .flat_map(|v| v.sources.iter())
            .chain(self.containers.iter().chain(&self.init_containers).flat_map(|c| c.env_refs.iter()))
    }

    /// Whether a container records a `STAKATER_*` variable (which may be orphaned).
    pub fn records_a_variable(&self) -> bool {
        self.containers.iter().any(|c| !c.recorded.is_empty())
    }
}

/// The few annotations a stored object keeps, as a vector sorted by key. A `BTreeMap` would
/// allocate a node of eleven entries (over 500 bytes) for a single `reloader.stakater.com/auto`,
/// a fifth of what a stored workload costs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations(Vec<(String, String)>);

impl Annotations {
    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&String> {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Set `key` to `value`, replacing what it held.
    pub fn insert(&mut self, key: String, value: String) {
        match self.position(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.into_iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, String)> for Annotations {
    /// As a map collects: a key given twice keeps its last value.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        let mut annotations = Annotations::default();
        for (key, value) in pairs {
            annotations.insert(key, value);
        }
        annotations.0.shrink_to_fit();
        annotations
    }
}

impl<const N: usize> From<[(String, String); N]> for Annotations {
    fn from(pairs: [(String, String); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Annotations {
    type Item = (&'a String, &'a String);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (String, String)>, fn(&'a (String, String)) -> (&'a String, &'a String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn annotations_read_like_a_map_sorted_and_a_repeated_key_keeps_its_last_value() {
        let mut a: Annotations = [pair("b", "1"), pair("a", "2"), pair("b", "3")].into_iter().collect();
        assert_eq!(a.len(), 2);
        assert_eq!(a.get("b").map(String::as_str), Some("3"));
        assert!(a.contains_key("a") && !a.contains_key("c"));
        a.insert("c".into(), "4".into());
        a.insert("a".into(), "5".into());
        let all: Vec<(&str, &str)> = a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(all, vec![("a", "5"), ("b", "3"), ("c", "4")]);
        assert_eq!(a.keys().cloned().collect::<Vec<_>>(), vec!["a", "b", "c"]);
    }
}
