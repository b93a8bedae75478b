//! The compact in-memory store of resources and workloads, and the index between them.
//!
//! ```text
//!  ResourceKey ──refs──▶ {WorkloadKey}     workloads whose pod template references it
//!  namespace ──explicit─▶ {WorkloadKey}    workloads carrying an explicit `.../reload` list
//! ```
//! A change of one resource is matched against `refs[resource] ∪ explicit[namespace]` only, so
//! the cost of a change does not grow with the number of workloads in the cluster, and no LIST
//! or GET is needed: the store answers.
//!
//! One [`Writer`] (owned by the watch task) changes the store; any number of [`Store`] readers
//! look at it. Locks are held only for map operations, never across `.await`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use crate::watch::used_keys::{KeyHashes, key_id};
use crate::watch::{
    DataHash, PodTemplate, ResourceKey, ResourceKind, ResourceMap, ResourceState, WideHash, Workload, WorkloadKey,
    WorkloadKind,
};

#[derive(Default)]
struct Inner {
    resources: ResourceMap<Entry>,
    workloads: HashMap<WorkloadKey, Arc<Workload>>,
    refs: ResourceMap<KeySet>,
    explicit: HashMap<Arc<str>, KeySet>,
    /// Stored objects (resources and workloads) per namespace; a namespace is here while it
    /// has at least one.
    per_namespace: HashMap<Arc<str>, usize>,
    /// Per Deployment, the Argo Rollouts that run its pod template (`spec.workloadRef`): they
    /// are stored with its template, and stored again when it changes.
    runs_template_of: HashMap<WorkloadKey, BTreeSet<WorkloadKey>>,
    /// With `--hash=sha512-256`, the resources' SHA-512/256 (empty otherwise: the entries stay
    /// as small as without it).
    wide: HashMap<ResourceKey, WideHash>,
    /// Per-key hashes of the keys that workloads reloading only for the keys they use read of
    /// a resource (empty while none does).
    key_hashes: HashMap<ResourceKey, KeyHashes>,
    /// Every key's hash of resources new to the store, whose workloads may not be stored yet
    /// (a list brings ConfigMaps and Deployments side by side; an install creates the ConfigMap
    /// first), with when they came: kept for [`UNCLAIMED_FOR`], or until the watches are in sync.
    unclaimed: HashMap<ResourceKey, (Instant, KeyHashes)>,
    /// When unclaimed hashes were last settled.
    settled_at: Option<Instant>,
}

/// How long every key's hash of a new resource is kept for workloads still to come.
const UNCLAIMED_FOR: Duration = Duration::from_secs(30);

/// A stored resource.
struct Entry {
    state: Slim,
    /// The hash the resource had when it was loaded (by a list, or as the baseline of a
    /// namespace that joined); none for a resource a watch event created. Changes made since
    /// may still be on their way to the engine, which takes this, not the current hash, as what
    /// was known before them. Its [`short`](crate::watch::DataHash::short) form, as bytes: the
    /// entry stays 31 bytes (a whole hash made it 43; 60,000 resources are stored).
    baseline: Option<[u8; 8]>,
}

/// A [`ResourceState`] without its wide and per-key hashes (kept aside in [`Inner::wide`] and
/// [`Inner::key_hashes`]).
#[derive(Clone)]
struct Slim {
    hash: DataHash,
    ignored: bool,
    search_match: bool,
}

impl Slim {
    fn of(state: ResourceState) -> (Slim, Option<Box<WideHash>>, Option<Box<KeyHashes>>) {
        let ResourceState { hash, ignored, search_match, wide, keys } = state;
        (Slim { hash, ignored, search_match }, wide, keys)
    }
}

/// Workload keys sorted without duplicates. Most resources are used by one or two workloads:
/// a `BTreeSet` would allocate a node for eleven keys (over 450 bytes) for each.
#[derive(Default)]
struct KeySet(Vec<WorkloadKey>);

impl KeySet {
    fn insert(&mut self, key: WorkloadKey) {
        if let Err(i) = self.0.binary_search(&key) {
            // Exact growth while small: a first push would reserve room for four keys.
            if self.0.len() < 8 {
                self.0.reserve_exact(1);
            }
            self.0.insert(i, key);
        }
    }

    /// Removes `key`; returns whether the set is empty now. Room is given back only when
    /// half of it is unused: an update of a workload removes and inserts its key again.
    fn remove(&mut self, key: &WorkloadKey) -> bool {
        if let Ok(i) = self.0.binary_search(key) {
            self.0.remove(i);
            if self.0.len() <= self.0.capacity() / 2 {
                self.0.shrink_to_fit();
            }
        }
        self.0.is_empty()
    }
}

impl Inner {
    /// The full state of a stored resource.
    fn state(&self, key: &ResourceKey, slim: &Slim) -> ResourceState {
        let wide = if self.wide.is_empty() { None } else { self.wide.get(key).map(|w| Box::new(*w)) };
        let keys = if self.key_hashes.is_empty() && self.unclaimed.is_empty() {
            None
        } else {
            let unclaimed = || self.unclaimed.get(key).map(|(_, all)| all);
            self.key_hashes.get(key).or_else(unclaimed).map(|k| Box::new(k.clone()))
        };
        ResourceState { hash: slim.hash, ignored: slim.ignored, search_match: slim.search_match, wide, keys }
    }

    /// Keep the per-key hashes of `key` that its stored workloads use selectively (of `all`,
    /// the hashes of every key an event brought), or drop them. A resource new to the store
    /// also keeps them all for a while ([`Inner::unclaimed`]).
    fn set_keys(&mut self, key: &ResourceKey, all: Option<Box<KeyHashes>>, new_to_store: bool) {
        let Some(all) = all else {
            if !self.key_hashes.is_empty() || !self.unclaimed.is_empty() {
                self.key_hashes.remove(key);
                self.unclaimed.remove(key);
            }
            return;
        };
        let ids = self.used_ids(key);
        if ids.is_empty() {
            self.key_hashes.remove(key);
        } else {
            self.key_hashes.insert(key.clone(), all.only(&ids));
        }
        if new_to_store {
            self.unclaimed.insert(key.clone(), (Instant::now(), *all));
        } else if let Some(unclaimed) = self.unclaimed.get_mut(key) {
            unclaimed.1 = *all;
        }
    }

    /// The ids of the keys of `key` its stored workloads use selectively, sorted.
    fn used_ids(&self, key: &ResourceKey) -> Vec<u64> {
        let users = self.refs.get(key).into_iter().flat_map(|set| &set.0);
        let uses = users.filter_map(|w| self.workloads.get(w)?.template.key_uses.as_deref());
        let mut ids: Vec<u64> =
            uses.filter_map(|u| u.keys(key.kind, &key.name)).flat_map(|k| k.iter()).map(key_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Keep or drop the wide hash of `key`.
    fn set_wide(&mut self, key: &ResourceKey, wide: Option<Box<WideHash>>) -> Option<WideHash> {
        match wide {
            Some(wide) => self.wide.insert(key.clone(), *wide),
            None if self.wide.is_empty() => None,
            None => self.wide.remove(key),
        }
    }

    /// The stored copy of a namespace's name, so that the objects of one namespace share one
    /// allocation of it (70,000 copies at 10,000 namespaces of 7 objects otherwise).
    fn shared(&self, namespace: &Arc<str>) -> Arc<str> {
        self.per_namespace.get_key_value(&**namespace).map_or_else(|| namespace.clone(), |(k, _)| k.clone())
    }

    fn count(&mut self, namespace: &Arc<str>, added: bool) {
        if added {
            *self.per_namespace.entry(namespace.clone()).or_default() += 1;
        } else if let Some(n) = self.per_namespace.get_mut(namespace) {
            *n -= 1;
            if *n == 0 {
                self.per_namespace.remove(namespace);
            }
        }
    }
}

/// A read handle on the store. Cheap to clone.
#[derive(Clone, Default)]
pub struct Store {
    inner: Arc<RwLock<Inner>>,
    explicit_keys: Arc<[String]>,
}

/// The only handle that changes the store. Not `Clone`: one task owns it.
pub struct Writer {
    store: Store,
}

impl Store {
    /// A new empty store and its writer. `explicit_keys` are the annotation keys that make a
    /// workload a candidate for every change in its namespace.
    pub fn new(explicit_keys: Vec<String>) -> (Store, Writer) {
        let store = Store { inner: Arc::default(), explicit_keys: explicit_keys.into() };
        (store.clone(), Writer { store })
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every write is one insert
        // or remove at a time), so a poisoned lock is still safe to read.
        self.inner.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn resource(&self, key: &ResourceKey) -> Option<ResourceState> {
        let inner = self.read();
        inner.resources.get(key).map(|e| inner.state(key, &e.state))
    }

    pub fn workload(&self, key: &WorkloadKey) -> Option<Arc<Workload>> {
        self.read().workloads.get(key).cloned()
    }

    /// Workloads that may reload when `key` changes: those referencing it and those with an
    /// explicit list in its namespace. Sorted by key, without duplicates.
    pub fn candidates(&self, key: &ResourceKey) -> Vec<Arc<Workload>> {
        let inner = self.read();
        let referencing = inner.refs.get(key).into_iter().flat_map(|set| &set.0);
        let explicit = inner.explicit.get(&key.namespace).into_iter().flat_map(|set| &set.0);
        let keys: BTreeSet<&WorkloadKey> = referencing.chain(explicit).collect();
        keys.into_iter().filter_map(|k| inner.workloads.get(k).cloned()).collect()
    }

    /// Stored workloads for which `predicate` holds (a scan: for rare, periodic questions).
    pub fn find_workloads(&self, predicate: impl Fn(&Workload) -> bool) -> Vec<Arc<Workload>> {
        self.read().workloads.values().filter(|w| predicate(w)).cloned().collect()
    }

    /// The stored resources in the namespaces for which `keep` holds, with their states: what
    /// a shard compares with its checkpoint.
    pub fn resources_in(&self, keep: impl Fn(&str) -> bool) -> Vec<(ResourceKey, ResourceState)> {
        let inner = self.read();
        inner
            .resources
            .iter_namespaces(keep)
            .map(|(k, e)| {
                let state = inner.state(&k, &e.state);
                (k, state)
            })
            .collect()
    }

    /// The load-time hashes ([`Entry::baseline`], in [`short`](crate::watch::DataHash::short)
    /// form) of the resources in the namespaces for which `keep` holds.
    pub fn baselines(&self, keep: impl Fn(&str) -> bool) -> HashMap<ResourceKey, u64> {
        let inner = self.read();
        inner.resources.iter_namespaces(keep).filter_map(|(k, e)| Some((k, u64::from_be_bytes(e.baseline?)))).collect()
    }

    /// Keys of stored resources of `kind`, optionally only in one namespace.
    pub fn resource_keys(&self, kind: ResourceKind, namespace: Option<&str>) -> Vec<ResourceKey> {
        let inner = self.read();
        match namespace {
            Some(ns) => inner.resources.in_namespace(ns).map(|(k, _)| k).filter(|k| k.kind == kind).collect(),
            None => inner.resources.keys().filter(|k| k.kind == kind).collect(),
        }
    }

    /// Every namespace with a stored object.
    pub fn namespaces(&self) -> BTreeSet<Arc<str>> {
        self.read().per_namespace.keys().cloned().collect()
    }

    /// Whether the store holds anything of `namespace`.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.read().per_namespace.contains_key(namespace)
    }

    /// Whether a stored workload reloads only for the keys it uses (`--reload-on-used-keys`
    /// or its annotation).
    pub fn reads_keys_selectively(&self) -> bool {
        self.read().workloads.values().any(|w| w.template.key_uses.is_some())
    }

    /// How many namespaces have stored objects.
    pub fn namespace_count(&self) -> usize {
        self.read().per_namespace.len()
    }

    /// The ids of the keys of `key` that stored workloads use selectively, sorted; `None` while
    /// its workloads may still be on their way (a new resource).
    pub fn used_key_ids(&self, key: &ResourceKey) -> Option<Vec<u64>> {
        let inner = self.read();
        (!inner.unclaimed.contains_key(key)).then(|| inner.used_ids(key))
    }

    /// Numbers of stored resources and workloads.
    pub fn len(&self) -> (usize, usize) {
        let inner = self.read();
        (inner.resources.len(), inner.workloads.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }
}

impl Writer {
    /// A reader on the same store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.store.inner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Store a resource's state; returns the state it replaces. A resource new to the store is
    /// loaded: its state is its baseline.
    pub fn apply_resource(&self, key: ResourceKey, state: ResourceState) -> Option<ResourceState> {
        self.insert_resource(key, state, true)
    }

    /// Store a resource a watch event created: it has no baseline (its creation is a change).
    pub fn apply_created_resource(&self, key: ResourceKey, state: ResourceState) {
        self.insert_resource(key, state, false);
    }

    fn insert_resource(&self, mut key: ResourceKey, state: ResourceState, loaded: bool) -> Option<ResourceState> {
        let mut inner = self.write();
        let (state, wide, keys) = Slim::of(state);
        if let Some(entry) = inner.resources.get_mut(&key) {
            let previous = std::mem::replace(&mut entry.state, state);
            let previous_wide = inner.set_wide(&key, wide);
            let mut previous = inner.state(&key, &previous);
            previous.wide = previous_wide.map(Box::new);
            inner.set_keys(&key, keys, false);
            return Some(previous);
        }
        key.namespace = inner.shared(&key.namespace);
        let namespace = key.namespace.clone();
        let baseline = loaded.then(|| state.hash.short().to_be_bytes());
        inner.set_wide(&key, wide);
        inner.set_keys(&key, keys, true);
        inner.resources.insert(key, Entry { state, baseline });
        inner.count(&namespace, true);
        None
    }

    /// Keep, of the every-key hashes of new resources, only those their workloads use
    /// selectively: of all of them once the watches are in sync (`in_sync`: every workload
    /// listed is stored), else of those kept for [`UNCLAIMED_FOR`] (looked at every few
    /// seconds).
    pub fn settle_key_hashes(&self, in_sync: bool) {
        let now = Instant::now();
        let due = |inner: &Inner| {
            !inner.unclaimed.is_empty()
                && (in_sync || inner.settled_at.is_none_or(|at| now.duration_since(at) >= UNCLAIMED_FOR / 8))
        };
        // Called after every watch event: the write lock only when there is work.
        if !due(&self.store.read()) {
            return;
        }
        let mut inner = self.write();
        if !due(&inner) {
            return;
        }
        inner.settled_at = Some(now);
        let settled: Vec<ResourceKey> = inner
            .unclaimed
            .iter()
            .filter(|(_, (since, _))| in_sync || now.duration_since(*since) >= UNCLAIMED_FOR)
            .map(|(k, _)| k.clone())
            .collect();
        for key in settled {
            let Some((_, all)) = inner.unclaimed.remove(&key) else { continue };
            let ids = inner.used_ids(&key);
            if !ids.is_empty() {
                inner.key_hashes.insert(key, all.only(&ids));
            }
        }
        if inner.unclaimed.is_empty() {
            inner.unclaimed.shrink_to_fit();
        }
    }

    pub fn delete_resource(&self, key: &ResourceKey) -> Option<ResourceState> {
        let mut inner = self.write();
        let gone = inner.resources.remove(key)?;
        let mut gone = inner.state(key, &gone.state);
        gone.wide = inner.set_wide(key, None).map(Box::new);
        inner.set_keys(key, None, false);
        inner.count(&key.namespace, false);
        Some(gone)
    }

    /// Keys of stored workloads of `kind`, optionally only in one namespace.
    pub fn workload_keys(&self, kind: WorkloadKind, namespace: Option<&str>) -> Vec<WorkloadKey> {
        keys_in(self.store.read().workloads.keys(), |k| k.kind == kind && in_scope(&k.namespace, namespace))
    }

    /// Store a workload and re-index its references. A Rollout with a `workloadRef` is stored
    /// with its Deployment's pod template; a Deployment's Rollouts are stored again with its new
    /// one (or none, once it is deleted).
    pub fn apply_workload(&self, workload: Workload) {
        let key = workload.key.clone();
        let template = workload.template.clone();
        self.insert_workload(workload);
        if key.kind == WorkloadKind::Deployment {
            self.refresh_runners(&key, Some(template));
        }
    }

    /// The Rollouts running `deployment`'s pod template, stored again with `template`.
    fn refresh_runners(&self, deployment: &WorkloadKey, template: Option<PodTemplate>) {
        let runners: Vec<Arc<Workload>> = {
            let inner = self.store.read();
            let keys = inner.runs_template_of.get(deployment).into_iter().flatten();
            keys.filter_map(|k| inner.workloads.get(k).cloned()).collect()
        };
        for runner in runners {
            let mut updated = (*runner).clone();
            updated.template = template.clone().unwrap_or_default();
            self.insert_workload(updated);
        }
    }

    fn insert_workload(&self, mut workload: Workload) {
        {
            let mut inner = self.write();
            if let Some(old) = inner.workloads.get(&workload.key).cloned() {
                unlink_runner(&mut inner, &old);
            }
            if let Some(deployment) = referenced_deployment(&workload) {
                inner.runs_template_of.entry(deployment.clone()).or_default().insert(workload.key.clone());
                workload.template = inner.workloads.get(&deployment).map(|d| d.template.clone()).unwrap_or_default();
            }
        }
        let explicit = self
            .store
            .explicit_keys
            .iter()
            .any(|k| workload.annotations.contains_key(k) || workload.template.annotations.contains_key(k));
        let mut inner = self.write();
        // An update keeps the stored key (the map keeps it too): one copy of the names.
        workload.key = match inner.workloads.get_key_value(&workload.key) {
            Some((stored, _)) => stored.clone(),
            None => WorkloadKey { namespace: inner.shared(&workload.key.namespace), ..workload.key },
        };
        let workload = Arc::new(workload);
        let key = workload.key.clone();
        match inner.workloads.insert(key.clone(), workload.clone()) {
            Some(old) => unindex(&mut inner, &old),
            None => inner.count(&key.namespace, true),
        }
        for (kind, name) in workload.template.references() {
            let rkey = ResourceKey { kind: *kind, namespace: key.namespace.clone(), name: name.clone() };
            inner.refs.get_or_insert_with(rkey, KeySet::default).insert(key.clone());
        }
        if explicit {
            inner.explicit.entry(key.namespace.clone()).or_default().insert(key);
        }
    }

    pub fn delete_workload(&self, key: &WorkloadKey) {
        {
            let mut inner = self.write();
            if let Some(old) = inner.workloads.remove(key) {
                unindex(&mut inner, &old);
                inner.count(&key.namespace, false);
                unlink_runner(&mut inner, &old);
            }
        }
        if key.kind == WorkloadKind::Deployment {
            self.refresh_runners(key, None);
        }
    }

    /// Drop everything stored for a namespace (it left this replica's scope); returns its
    /// resources and workloads as they were.
    pub fn forget_namespace(&self, namespace: &str) -> (Vec<(ResourceKey, ResourceState)>, Vec<Arc<Workload>>) {
        let mut inner = self.write();
        let removed = inner.resources.remove_namespace(namespace);
        let resources = removed
            .into_iter()
            .map(|(k, e)| {
                let state = inner.state(&k, &e.state);
                (k, state)
            })
            .collect();
        if !inner.wide.is_empty() {
            inner.wide.retain(|k, _| &*k.namespace != namespace);
        }
        if !inner.key_hashes.is_empty() || !inner.unclaimed.is_empty() {
            inner.key_hashes.retain(|k, _| &*k.namespace != namespace);
            inner.unclaimed.retain(|k, _| &*k.namespace != namespace);
        }
        let keys = keys_in(inner.workloads.keys(), |k| &*k.namespace == namespace);
        let workloads = keys.iter().filter_map(|k| inner.workloads.remove(k)).collect();
        inner.refs.remove_namespace(namespace);
        inner.explicit.remove(namespace);
        inner.runs_template_of.retain(|d, _| &*d.namespace != namespace);
        inner.per_namespace.remove(namespace);
        (resources, workloads)
    }
}

fn keys_in<'a, K: Clone + 'a>(keys: impl Iterator<Item = &'a K>, keep: impl Fn(&K) -> bool) -> Vec<K> {
    keys.filter(|k| keep(k)).cloned().collect()
}

fn in_scope(namespace: &str, scope: Option<&str>) -> bool {
    scope.is_none_or(|ns| namespace == ns)
}

fn unindex(inner: &mut Inner, old: &Workload) {
    let key = &old.key;
    for (kind, name) in old.template.references() {
        let rkey = ResourceKey { kind: *kind, namespace: key.namespace.clone(), name: name.clone() };
        if inner.refs.get_mut(&rkey).is_some_and(|set| set.remove(key)) {
            inner.refs.remove(&rkey);
        }
    }
    if inner.explicit.get_mut(&key.namespace).is_some_and(|set| set.remove(key)) {
        inner.explicit.remove(&key.namespace);
    }
}

/// The Deployment whose pod template a Rollout runs (`spec.workloadRef`).
fn referenced_deployment(workload: &Workload) -> Option<WorkloadKey> {
    let name = workload.workload_ref.clone()?;
    Some(WorkloadKey { kind: WorkloadKind::Deployment, namespace: workload.key.namespace.clone(), name })
}

/// Forget that `runner` runs its Deployment's template (deleted, or pointed elsewhere).
fn unlink_runner(inner: &mut Inner, runner: &Workload) {
    let Some(deployment) = referenced_deployment(runner) else { return };
    if inner.runs_template_of.get_mut(&deployment).is_some_and(|r| r.remove(&runner.key) && r.is_empty()) {
        inner.runs_template_of.remove(&deployment);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Annotations, Container, DataHash, PodTemplate};

    fn workload(ns: &str, name: &str, uses: &[&str], annotations: &[(&str, &str)]) -> Workload {
        let container = Container {
            name: "app".into(),
            env_refs: uses.iter().map(|n| (ResourceKind::ConfigMap, Arc::from(*n))).collect(),
            ..Default::default()
        };
        Workload {
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Annotations>(),
            template: PodTemplate { containers: vec![container], ..Default::default() },
            ..Workload::test(WorkloadKind::Deployment, ns, name)
        }
    }

    fn cm(ns: &str, name: &str) -> ResourceKey {
        ResourceKey { kind: ResourceKind::ConfigMap, namespace: ns.into(), name: name.into() }
    }

    /// The state of data `data`, no wide or per-key hashes.
    fn plain(data: &[u8]) -> ResourceState {
        ResourceState { hash: DataHash::of_bytes(data), ignored: false, search_match: false, wide: None, keys: None }
    }

    fn names(workloads: Vec<Arc<Workload>>) -> Vec<String> {
        workloads.iter().map(|w| w.key.name.to_string()).collect()
    }

    const EXPLICIT: &str = "configmap.reloader.stakater.com/reload";

    #[test]
    fn candidates_are_referencing_workloads_plus_explicit_lists_in_the_namespace() {
        let (store, writer) = Store::new(vec![EXPLICIT.into()]);
        writer.apply_workload(workload("a", "uses-cm", &["cm"], &[]));
        writer.apply_workload(workload("a", "uses-other", &["other"], &[]));
        writer.apply_workload(workload("a", "explicit", &[], &[(EXPLICIT, "c.*")]));
        writer.apply_workload(workload("b", "other-namespace", &["cm"], &[(EXPLICIT, "cm")]));
        assert_eq!(names(store.candidates(&cm("a", "cm"))), vec!["explicit", "uses-cm"]);
    }

    #[test]
    fn updating_a_workload_moves_its_index_entries() {
        let (store, writer) = Store::new(vec![EXPLICIT.into()]);
        writer.apply_workload(workload("a", "w", &["old"], &[]));
        writer.apply_workload(workload("a", "w", &["new"], &[]));
        assert!(store.candidates(&cm("a", "old")).is_empty());
        assert_eq!(names(store.candidates(&cm("a", "new"))), vec!["w"]);
        writer.delete_workload(&WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "a".into(),
            name: "w".into(),
        });
        assert!(store.candidates(&cm("a", "new")).is_empty());
    }

    #[test]
    fn a_wide_hash_is_kept_aside_and_travels_with_the_state() {
        let (store, writer) = Store::new(vec![]);
        let wide = |data: &[u8]| {
            let map = [("k".to_string(), data.to_vec())].into();
            Some(Box::new(WideHash::of_secret(&map)))
        };
        let state = |data: &[u8], wide| ResourceState { wide, ..plain(data) };
        writer.apply_resource(cm("a", "s"), state(b"1", wide(b"1")));
        assert_eq!(store.resource(&cm("a", "s")).and_then(|s| s.wide), wide(b"1"));
        let previous = writer.apply_resource(cm("a", "s"), state(b"2", None)).expect("replaced");
        assert_eq!(previous.wide, wide(b"1"), "the replaced state comes back whole");
        assert_eq!(store.resource(&cm("a", "s")).and_then(|s| s.wide), None);
        writer.apply_resource(cm("a", "s"), state(b"3", wide(b"3")));
        assert_eq!(writer.delete_resource(&cm("a", "s")).and_then(|s| s.wide), wide(b"3"));
        writer.apply_resource(cm("b", "s"), state(b"4", wide(b"4")));
        let (resources, _) = writer.forget_namespace("b");
        assert_eq!(resources[0].1.wide, wide(b"4"));
        assert!(store.read().wide.is_empty(), "nothing is left aside");
    }

    #[test]
    fn forgetting_a_namespace_drops_its_objects_only() {
        let (store, writer) = Store::new(vec![]);
        let state = plain(b"");
        writer.apply_resource(cm("a", "cm"), state.clone());
        writer.apply_resource(cm("b", "cm"), state);
        writer.apply_workload(workload("a", "w", &["cm"], &[]));
        let (resources, workloads) = writer.forget_namespace("a");
        assert_eq!((resources.len(), workloads.len()), (1, 1));
        assert_eq!(store.len(), (1, 0));
        assert!(store.resource(&cm("b", "cm")).is_some());
        assert_eq!(store.namespaces().into_iter().collect::<Vec<_>>(), vec![Arc::from("b")]);
    }

    #[test]
    fn a_loaded_resource_keeps_its_baseline_through_updates_and_a_created_one_has_none() {
        let (store, writer) = Store::new(vec![]);
        let state = plain;
        writer.apply_resource(cm("a", "listed"), state(b"0"));
        writer.apply_resource(cm("a", "listed"), state(b"1"));
        writer.apply_created_resource(cm("a", "created"), state(b"0"));
        writer.apply_resource(cm("b", "listed"), state(b"0"));
        let in_a = store.baselines(|ns| ns == "a");
        assert_eq!(in_a, HashMap::from([(cm("a", "listed"), DataHash::of_bytes(b"0").short())]));
        writer.delete_resource(&cm("a", "listed"));
        let (forgotten, _) = writer.forget_namespace("b");
        assert_eq!(forgotten, vec![(cm("b", "listed"), state(b"0"))]);
        assert!(store.baselines(|_| true).is_empty());
    }

    #[test]
    fn a_namespace_counts_while_it_has_a_stored_object() {
        let (store, writer) = Store::new(vec![]);
        let state = plain(b"");
        writer.apply_resource(cm("a", "cm"), state.clone());
        writer.apply_resource(cm("a", "cm"), state.clone()); // an update is not a second object
        writer.apply_workload(workload("a", "w", &["cm"], &[]));
        writer.apply_workload(workload("a", "w", &["cm"], &[]));
        writer.apply_resource(cm("b", "cm"), state);
        assert_eq!(store.namespace_count(), 2);
        writer.delete_resource(&cm("a", "cm"));
        assert_eq!(store.namespace_count(), 2, "a still has its workload");
        writer.delete_workload(&workload("a", "w", &[], &[]).key);
        writer.delete_workload(&workload("a", "w", &[], &[]).key); // a second delete changes nothing
        assert_eq!(store.namespace_count(), 1);
        writer.delete_resource(&cm("b", "cm"));
        assert_eq!(store.namespace_count(), 0);
    }

    #[test]
    fn a_rollout_with_a_workload_ref_is_stored_with_its_deployments_template_and_follows_it() {
        let (store, writer) = Store::new(vec![]);
        let rollout = |to: &str| Workload {
            key: WorkloadKey { kind: WorkloadKind::Rollout, namespace: "a".into(), name: "web".into() },
            template: PodTemplate::default(),
            workload_ref: Some(to.into()),
            ..workload("a", "web", &[], &[])
        };
        writer.apply_workload(rollout("first")); // before its Deployment: no template yet
        assert!(store.candidates(&cm("a", "cm-1")).is_empty());
        writer.apply_workload(workload("a", "first", &["cm-1"], &[]));
        assert_eq!(names(store.candidates(&cm("a", "cm-1"))), vec!["first", "web"]);
        writer.apply_workload(workload("a", "first", &["cm-2"], &[]));
        assert_eq!(names(store.candidates(&cm("a", "cm-2"))), vec!["first", "web"], "follows an update");
        assert!(store.candidates(&cm("a", "cm-1")).is_empty());
        // Pointed at another Deployment: the first one's changes no longer reach it.
        writer.apply_workload(workload("a", "second", &["cm-3"], &[]));
        writer.apply_workload(rollout("second"));
        writer.apply_workload(workload("a", "first", &["cm-4"], &[]));
        assert_eq!(names(store.candidates(&cm("a", "cm-4"))), vec!["first"]);
        assert_eq!(names(store.candidates(&cm("a", "cm-3"))), vec!["second", "web"]);
        writer.delete_workload(&WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "a".into(),
            name: "second".into(),
        });
        assert!(store.candidates(&cm("a", "cm-3")).is_empty(), "its Deployment deleted: nothing to reload for");
        writer.forget_namespace("a");
        assert!(writer.write().runs_template_of.is_empty());
    }
}
