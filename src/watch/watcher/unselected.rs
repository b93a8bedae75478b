//! ConfigMaps and Secrets of namespaces outside the label selection, kept as their compact state
//! (hash and two flags) in owned shards, so that a namespace labelled in has a baseline.
//!
//! Without one, the relist that loads a joining namespace would take whatever it lists as the
//! first state, and a change made just after the label (`kubectl apply` of the namespace and
//! its ConfigMap in one go) would be lost. The ConfigMap watch and the Namespace watch are two
//! streams, so the ConfigMap's change can arrive before the label that selects its namespace:
//! each entry also keeps the state before its last change and the resourceVersion of that
//! change, and a change written after the label is undone in the baseline. resourceVersions are
//! integers that grow with every write (KEP-5504, stable in Kubernetes 1.35); a Namespace's and
//! a ConfigMap's compare as long as one etcd stores both, which is the default. When one does
//! not parse, the last state is the baseline (the behaviour without this room).

use std::sync::Arc;

use crate::lease::revision;
use crate::watch::{ResourceKey, ResourceKind, ResourceMap, ResourceState};

#[derive(Default)]
pub(super) struct Unselected {
    entries: ResourceMap<Entry>,
}

struct Entry {
    state: ResourceState,
    /// The state before the last change of the hash; `None` if none was seen.
    before: Option<ResourceState>,
    /// The resourceVersion of the last change of the hash (or of the first sighting).
    changed_at: Option<u64>,
}

impl Unselected {
    /// A resource seen in an unselected namespace (an event or a list item).
    pub fn observe(&mut self, key: ResourceKey, state: ResourceState, resource_version: Option<&str>) {
        let at = revision(resource_version);
        match self.entries.get_mut(&key) {
            Some(entry) if entry.state.hash == state.hash => entry.state = state,
            Some(entry) => {
                entry.before = Some(std::mem::replace(&mut entry.state, state));
                entry.changed_at = at;
            }
            None => {
                self.entries.insert(key, Entry { state, before: None, changed_at: at });
            }
        }
    }

    /// A resource left the selection with its namespace: its stored state is the baseline.
    pub fn keep(&mut self, key: ResourceKey, state: ResourceState) {
        self.entries.insert(key, Entry { state, before: None, changed_at: None });
    }

    /// Drop the per-key hashes kept with resources: no workload reads by key.
    pub fn drop_key_hashes(&mut self) {
        self.entries.retain(|_, _, _, entry| {
            entry.state.keys = None;
            if let Some(before) = entry.before.as_mut() {
                before.keys = None;
            }
            true
        });
    }

    pub fn remove(&mut self, key: &ResourceKey) {
        self.entries.remove(key);
    }

    /// A cluster-wide list of `kind` ended: keep the entries of that kind for which `kept`
    /// (namespace, name) holds (those it saw, or did not cover).
    pub fn retain_listed(&mut self, kind: ResourceKind, kept: impl Fn(&Arc<str>, &Arc<str>) -> bool) {
        self.entries.retain(|k, ns, name, _| k != kind || kept(ns, name));
    }

    /// Keep only the entries whose namespace passes `keep` (the shards still owned).
    pub fn retain_namespaces(&mut self, keep: impl Fn(&str) -> bool) {
        self.entries.retain(|_, ns, _, _| keep(ns));
    }

    /// The namespace joined the selection at `joined_at` (the resourceVersion of the Namespace
    /// event that selected it): take out its resources with the state each had then. A resource
    /// created after that has none (its first list is its first state).
    pub fn take_namespace(&mut self, namespace: &str, joined_at: Option<&str>) -> Vec<(ResourceKey, ResourceState)> {
        let joined_at = revision(joined_at);
        self.entries
            .remove_namespace(namespace)
            .into_iter()
            .filter_map(|(key, entry)| {
                let changed_after_join = matches!((entry.changed_at, joined_at), (Some(c), Some(j)) if c > j);
                let baseline = if changed_after_join { entry.before } else { Some(entry.state) };
                baseline.map(|state| (key, state))
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::DataHash;

    fn key(ns: &str, name: &str) -> ResourceKey {
        ResourceKey { kind: ResourceKind::ConfigMap, namespace: Arc::from(ns), name: Arc::from(name) }
    }

    fn state(data: &str) -> ResourceState {
        ResourceState {
            hash: DataHash::of_bytes(data.as_bytes()),
            ignored: false,
            search_match: false,
            wide: None,
            keys: None,
        }
    }

    #[test]
    fn a_change_after_the_label_is_undone_in_the_baseline() {
        let mut kept = Unselected::default();
        kept.observe(key("a", "cm"), state("0"), Some("100"));
        kept.observe(key("a", "cm"), state("1"), Some("205"));
        assert_eq!(kept.take_namespace("a", Some("200")), vec![(key("a", "cm"), state("0"))]);
        assert_eq!(kept.len(), 0);
    }

    #[test]
    fn a_change_before_the_label_is_the_baseline() {
        let mut kept = Unselected::default();
        kept.observe(key("a", "cm"), state("0"), Some("100"));
        kept.observe(key("a", "cm"), state("1"), Some("150"));
        // A relabel of the same data (a later resourceVersion, same hash) moves nothing.
        kept.observe(key("a", "cm"), state("1"), Some("300"));
        kept.observe(key("b", "cm"), state("x"), Some("120"));
        assert_eq!(kept.take_namespace("a", Some("200")), vec![(key("a", "cm"), state("1"))]);
        assert_eq!(kept.len(), 1, "another namespace's entry stays");
    }

    #[test]
    fn a_resource_created_after_the_label_has_no_baseline() {
        let mut kept = Unselected::default();
        kept.observe(key("a", "new"), state("0"), Some("250"));
        assert!(kept.take_namespace("a", Some("200")).is_empty());
    }

    #[test]
    fn resource_versions_that_do_not_parse_fall_back_to_the_last_state() {
        let mut kept = Unselected::default();
        kept.observe(key("a", "cm"), state("0"), Some("100"));
        kept.observe(key("a", "cm"), state("1"), Some("opaque"));
        assert_eq!(kept.take_namespace("a", Some("200")), vec![(key("a", "cm"), state("1"))]);
    }

    #[test]
    fn a_list_drops_what_it_did_not_see() {
        let mut kept = Unselected::default();
        kept.observe(key("a", "gone"), state("0"), Some("1"));
        kept.observe(key("a", "here"), state("0"), Some("2"));
        let seen = |_: &Arc<str>, name: &Arc<str>| &**name == "here";
        kept.retain_listed(ResourceKind::Secret, seen);
        assert_eq!(kept.len(), 2, "a Secret list says nothing of ConfigMaps");
        kept.retain_listed(ResourceKind::ConfigMap, seen);
        assert_eq!(kept.take_namespace("a", None), vec![(key("a", "here"), state("0"))]);
    }
}
