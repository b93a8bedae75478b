//! A map keyed by [`ResourceKey`] that stores each namespace's entries together.
//!
//! ```text
//!  namespace ──▶ [(kind, name, value), ...]   sorted, exact size, while a namespace has few
//!            └─▶ {(kind, name) ─▶ value}      a hash table once it has many
//! ```
//! A hash table keyed by the whole key spends a 40-byte key per slot on up to twice as many
//! slots as entries (60,002 resources sat in 131,072 slots). Grouped, the namespace is stored
//! once, a typical namespace's handful of entries sits in one exact allocation, and the
//! questions asked by namespace or shard (drop a namespace, the baselines of a shard) visit
//! only the namespaces concerned.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use crate::watch::{ResourceKey, ResourceKind};

/// Above this many entries a namespace's group becomes a hash table: a sorted vector's
/// inserts move the entries after them.
const FEW: usize = 32;

#[derive(Clone, Debug)]
pub struct ResourceMap<V> {
    namespaces: HashMap<Arc<str>, Group<V>>,
    len: usize,
}

#[derive(Clone, Debug)]
enum Group<V> {
    /// Sorted by kind and name, without duplicates.
    Few(Vec<(ResourceKind, Arc<str>, V)>),
    Many(HashMap<(ResourceKind, Arc<str>), V>),
}

impl<V> Default for ResourceMap<V> {
    fn default() -> Self {
        Self { namespaces: HashMap::new(), len: 0 }
    }
}

impl<V> Group<V> {
    fn find(entries: &[(ResourceKind, Arc<str>, V)], kind: ResourceKind, name: &str) -> Result<usize, usize> {
        entries.binary_search_by(|(k, n, _)| (*k, &**n).cmp(&(kind, name)))
    }

    fn get(&self, kind: ResourceKind, name: &Arc<str>) -> Option<&V> {
        match self {
            Group::Few(entries) => Self::find(entries, kind, name).ok().map(|i| &entries[i].2),
            Group::Many(map) => map.get(&(kind, name.clone())),
        }
    }

    fn get_mut(&mut self, kind: ResourceKind, name: &Arc<str>) -> Option<&mut V> {
        match self {
            Group::Few(entries) => Self::find(entries, kind, name).ok().map(|i| &mut entries[i].2),
            Group::Many(map) => map.get_mut(&(kind, name.clone())),
        }
    }

    /// The value of `kind`/`name`, inserted by `make` first when absent (then `true`).
    fn entry(&mut self, kind: ResourceKind, name: Arc<str>, make: impl FnOnce() -> V) -> (&mut V, bool) {
        if let Group::Few(entries) = self
            && entries.len() == FEW
            && Self::find(entries, kind, &name).is_err()
        {
            *self = Group::Many(entries.drain(..).map(|(k, n, v)| ((k, n), v)).collect());
        }
        match self {
            Group::Few(entries) => match Self::find(entries, kind, &name) {
                Ok(i) => (&mut entries[i].2, false),
                Err(i) => {
                    // Exact growth: a typical namespace holds a few resources for good.
                    entries.reserve_exact(1);
                    entries.insert(i, (kind, name, make()));
                    (&mut entries[i].2, true)
                }
            },
            Group::Many(map) => match map.entry((kind, name)) {
                Entry::Occupied(slot) => (slot.into_mut(), false),
                Entry::Vacant(slot) => (slot.insert(make()), true),
            },
        }
    }

    fn remove(&mut self, kind: ResourceKind, name: &Arc<str>) -> Option<V> {
        match self {
            Group::Few(entries) => {
                let i = Self::find(entries, kind, name).ok()?;
                let (_, _, value) = entries.remove(i);
                if entries.len() <= entries.capacity() / 2 {
                    entries.shrink_to_fit();
                }
                Some(value)
            }
            Group::Many(map) => map.remove(&(kind, name.clone())),
        }
    }

    /// Keeps the entries for which `keep` (kind, name, value) holds.
    fn retain(&mut self, mut keep: impl FnMut(ResourceKind, &Arc<str>, &mut V) -> bool) {
        match self {
            Group::Few(entries) => {
                entries.retain_mut(|(k, n, v)| keep(*k, n, v));
                if entries.len() <= entries.capacity() / 2 {
                    entries.shrink_to_fit();
                }
            }
            Group::Many(map) => map.retain(|(k, n), v| keep(*k, n, v)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Group::Few(entries) => entries.len(),
            Group::Many(map) => map.len(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = (ResourceKind, &Arc<str>, &V)> {
        let (few, many) = match self {
            Group::Few(entries) => (Some(entries), None),
            Group::Many(map) => (None, Some(map)),
        };
        let few = few.into_iter().flatten().map(|(k, n, v)| (*k, n, v));
        few.chain(many.into_iter().flatten().map(|((k, n), v)| (*k, n, v)))
    }

    fn into_entries(self) -> Vec<(ResourceKind, Arc<str>, V)> {
        match self {
            Group::Few(entries) => entries,
            Group::Many(map) => map.into_iter().map(|((k, n), v)| (k, n, v)).collect(),
        }
    }
}

impl<V> ResourceMap<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &ResourceKey) -> Option<&V> {
        self.namespaces.get(&key.namespace)?.get(key.kind, &key.name)
    }

    pub fn get_mut(&mut self, key: &ResourceKey) -> Option<&mut V> {
        self.namespaces.get_mut(&key.namespace)?.get_mut(key.kind, &key.name)
    }

    /// Inserts or replaces; returns the value replaced. The namespace's name is kept once,
    /// from the first key of it.
    pub fn insert(&mut self, key: ResourceKey, value: V) -> Option<V> {
        if let Some(slot) = self.get_mut(&key) {
            return Some(std::mem::replace(slot, value));
        }
        self.entry(key, || value);
        None
    }

    /// The value of `key`, inserted by `make` first when absent.
    pub fn get_or_insert_with(&mut self, key: ResourceKey, make: impl FnOnce() -> V) -> &mut V {
        self.entry(key, make).0
    }

    fn entry(&mut self, key: ResourceKey, make: impl FnOnce() -> V) -> (&mut V, bool) {
        let ResourceKey { kind, namespace, name } = key;
        let group = self.namespaces.entry(namespace).or_insert_with(|| Group::Few(Vec::new()));
        let (value, inserted) = group.entry(kind, name, make);
        if inserted {
            self.len += 1;
        }
        (value, inserted)
    }

    pub fn remove(&mut self, key: &ResourceKey) -> Option<V> {
        let group = self.namespaces.get_mut(&key.namespace)?;
        let value = group.remove(key.kind, &key.name)?;
        if group.len() == 0 {
            self.namespaces.remove(&key.namespace);
        }
        self.len -= 1;
        Some(value)
    }

    /// Removes and returns every entry of `namespace`.
    pub fn remove_namespace(&mut self, namespace: &str) -> Vec<(ResourceKey, V)> {
        let Some((namespace, group)) = self.namespaces.remove_entry(namespace) else {
            return Vec::new();
        };
        let entries = group.into_entries();
        self.len -= entries.len();
        entries
            .into_iter()
            .map(|(kind, name, value)| (ResourceKey { kind, namespace: namespace.clone(), name }, value))
            .collect()
    }

    /// Removes and returns every entry of the namespaces for which `take` holds.
    pub fn remove_namespaces(&mut self, take: impl Fn(&str) -> bool) -> Vec<(ResourceKey, V)> {
        let taken: Vec<Arc<str>> = self.namespaces.keys().filter(|ns| take(ns)).cloned().collect();
        taken.iter().flat_map(|ns| self.remove_namespace(ns)).collect()
    }

    /// Keeps the entries for which `keep` (kind, namespace, name, value) holds.
    pub fn retain(&mut self, mut keep: impl FnMut(ResourceKind, &Arc<str>, &Arc<str>, &mut V) -> bool) {
        let mut len = 0;
        self.namespaces.retain(|ns, group| {
            group.retain(|kind, name, value| keep(kind, ns, name, value));
            len += group.len();
            group.len() > 0
        });
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.namespaces.clear();
        self.len = 0;
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceKey, &V)> {
        self.iter_namespaces(|_| true)
    }

    /// The entries of the namespaces for which `keep` holds: a question by shard asks once per
    /// namespace, not once per entry.
    pub fn iter_namespaces(&self, keep: impl Fn(&str) -> bool) -> impl Iterator<Item = (ResourceKey, &V)> {
        self.namespaces.iter().filter(move |(ns, _)| keep(ns)).flat_map(|(ns, group)| keyed(ns, group))
    }

    /// The entries of one namespace.
    pub fn in_namespace(&self, namespace: &str) -> impl Iterator<Item = (ResourceKey, &V)> {
        self.namespaces.get_key_value(namespace).into_iter().flat_map(|(ns, group)| keyed(ns, group))
    }

    pub fn keys(&self) -> impl Iterator<Item = ResourceKey> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

/// A group's entries with their whole keys.
fn keyed<'a, V>(namespace: &'a Arc<str>, group: &'a Group<V>) -> impl Iterator<Item = (ResourceKey, &'a V)> {
    group
        .iter()
        .map(|(kind, name, value)| (ResourceKey { kind, namespace: namespace.clone(), name: name.clone() }, value))
}

impl<V> FromIterator<(ResourceKey, V)> for ResourceMap<V> {
    fn from_iter<I: IntoIterator<Item = (ResourceKey, V)>>(iter: I) -> Self {
        let mut map = ResourceMap::default();
        for (key, value) in iter {
            map.insert(key, value);
        }
        map
    }
}

impl<V: PartialEq> PartialEq for ResourceMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(k, v)| other.get(&k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(kind: u8, ns: u8, name: u8) -> ResourceKey {
        let kind =
            [ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass][kind as usize % 3];
        ResourceKey { kind, namespace: format!("ns-{ns}").into(), name: format!("n-{name}").into() }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8, u8, u32),
        Remove(u8, u8, u8),
        RemoveNamespace(u8),
        /// Keep the entries whose name's number is not a multiple of this.
        Retain(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few namespaces and many names, so that groups pass the size where they change form.
        prop_oneof![
            6 => (0..3u8, 0..3u8, 0..80u8, any::<u32>()).prop_map(|(k, ns, n, v)| Op::Insert(k, ns, n, v)),
            3 => (0..3u8, 0..3u8, 0..80u8).prop_map(|(k, ns, n)| Op::Remove(k, ns, n)),
            1 => (0..3u8).prop_map(Op::RemoveNamespace),
            1 => (2..9u8).prop_map(Op::Retain),
        ]
    }

    proptest! {
        /// Whatever the order of inserts and removals, it answers as a plain hash map would.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut map = ResourceMap::default();
            let mut model: HashMap<ResourceKey, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, ns, n, v) => prop_assert_eq!(map.insert(key(k, ns, n), v), model.insert(key(k, ns, n), v)),
                    Op::Remove(k, ns, n) => prop_assert_eq!(map.remove(&key(k, ns, n)), model.remove(&key(k, ns, n))),
                    Op::RemoveNamespace(ns) => {
                        let mut gone = map.remove_namespace(&format!("ns-{ns}"));
                        let mut expected: Vec<_> = model.iter().filter(|(k, _)| *k.namespace == *format!("ns-{ns}")).map(|(k, v)| (k.clone(), *v)).collect();
                        model.retain(|k, _| *k.namespace != *format!("ns-{ns}"));
                        gone.sort();
                        expected.sort();
                        prop_assert_eq!(gone, expected);
                    }
                    Op::Retain(m) => {
                        let keep = |name: &str| name.trim_start_matches("n-").parse::<u8>().is_ok_and(|n| n % m != 0);
                        map.retain(|_, _, name, _| keep(name));
                        model.retain(|k, _| keep(&k.name));
                    }
                }
                prop_assert_eq!(map.len(), model.len());
            }
            let mut all: Vec<_> = map.iter().map(|(k, v)| (k, *v)).collect();
            all.sort();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort();
            prop_assert_eq!(all, expected);
        }
    }

    #[test]
    fn a_namespace_is_stored_once_and_dropped_with_its_last_entry() {
        let mut map = ResourceMap::default();
        let first = key(0, 1, 1);
        map.insert(first.clone(), 1);
        map.insert(key(1, 1, 2), 2);
        assert!(map.iter().all(|(k, _)| Arc::ptr_eq(&k.namespace, &first.namespace)));
        assert_eq!(map.remove(&first), Some(1));
        assert_eq!(map.remove(&key(1, 1, 2)), Some(2));
        assert!(map.is_empty());
        assert!(map.namespaces.is_empty());
    }

    #[test]
    fn namespaces_are_removed_by_a_predicate() {
        let mut map: ResourceMap<u32> = (0..4).map(|ns| (key(0, ns, 0), u32::from(ns))).collect();
        let mut taken = map.remove_namespaces(|ns| ns == "ns-1" || ns == "ns-3");
        taken.sort();
        assert_eq!(taken, vec![(key(0, 1, 0), 1), (key(0, 3, 0), 3)]);
        assert_eq!(map.len(), 2);
        map.clear();
        assert!(map.is_empty() && map.get(&key(0, 0, 0)).is_none());
    }

    #[test]
    fn get_or_insert_with_keeps_what_is_there() {
        let mut map = ResourceMap::default();
        *map.get_or_insert_with(key(0, 0, 0), || 5) += 1;
        *map.get_or_insert_with(key(0, 0, 0), || 50) += 1;
        assert_eq!(map.get(&key(0, 0, 0)), Some(&7));
        assert_eq!(map.len(), 1);
    }
}
