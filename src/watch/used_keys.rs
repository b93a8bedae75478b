//! Reloads for the keys a workload uses (`--reload-on-used-keys`, Reloader #507, #786, #129).
//!
//! A workload that reads two keys of a shared ConfigMap of forty (`configMapKeyRef`,
//! `secretKeyRef`, a volume with `items`, a `subPath` mount) need not roll when only the other
//! thirty-eight change. Here: which keys a pod template uses of each resource ([`KeyUses`]), and
//! per-key hashes of a resource's data ([`KeyHashes`]), kept only for keys used that way.
//!
//! ```text
//!  env valueFrom configMapKeyRef/secretKeyRef   the key
//!  volume configMap/secret with items           the items' keys
//!  volume without items, every mount a subPath  the subPaths' first segments
//!  projected source with items                  the items' keys
//!  envFrom, a whole-volume mount, CSI           the whole object (as Reloader)
//! ```

use std::collections::BTreeMap;

/// The workload annotation that turns key-level reloads on (`"true"`) or off (`"false"`) for
/// one workload, whatever `--reload-on-used-keys` says.
pub const ANNOTATION: &str = "reloader-fleet.stakater.com/reload-on-used-keys";

use crate::watch::ResourceKind;
use crate::watch::pod_wire::{WireKeyToPath, WirePodSpec, WireProjection};

/// A data key's id: its name's xxh3-64. Ids, not names, are what the hashes are kept under:
/// 16 bytes a key, whatever its name's length.
pub fn key_id(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// The hash kept for a key the data lacks.
pub const ABSENT: u64 = u64::MAX;

/// Per-key hashes of a resource's data, sorted by key id: (id, xxh3-64 of the value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyHashes(Box<[(u64, u64)]>);

impl KeyHashes {
    /// A ConfigMap's `data` and `binaryData` (a key is in one or the other).
    pub fn of_configmap(data: &BTreeMap<String, String>, binary: &BTreeMap<String, Vec<u8>>) -> Self {
        let text = data.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
        KeyHashes::of(text.chain(binary.iter().map(|(k, v)| (k.as_str(), v.as_slice()))))
    }

    /// A Secret's `data`.
    pub fn of_secret(data: &BTreeMap<String, Vec<u8>>) -> Self {
        KeyHashes::of(data.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
    }

    fn of<'a>(entries: impl Iterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut all: Vec<(u64, u64)> =
            entries.map(|(key, value)| (key_id(key), xxhash_rust::xxh3::xxh3_64(value))).collect();
        all.sort_unstable();
        KeyHashes(all.into_boxed_slice())
    }

    /// The hash of the key with this id, if the data has it.
    pub fn get(&self, id: u64) -> Option<u64> {
        self.0.binary_search_by_key(&id, |(k, _)| *k).ok().map(|i| self.0[i].1)
    }

    /// Only the keys of these ids (`ids` sorted), each of them: a key the data lacks is kept as
    /// [`ABSENT`], so that "no such key" compares too, and a key not kept is "not known".
    pub fn only(&self, ids: &[u64]) -> KeyHashes {
        KeyHashes(ids.iter().map(|&id| (id, self.get(id).unwrap_or(ABSENT))).collect())
    }

    /// Only the kept keys whose ids are in `ids` (sorted); none is added.
    pub fn narrowed(&self, ids: &[u64]) -> KeyHashes {
        KeyHashes(self.0.iter().filter(|(id, _)| ids.binary_search(id).is_ok()).copied().collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held beside the struct.
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.0)
    }
}

/// What a pod template uses of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Used {
    /// Every key (envFrom, a whole-volume mount...): any change concerns it.
    Whole,
    /// Only these keys.
    Keys(Vec<String>),
}

/// The resources a pod template uses only some keys of, as one string (a line per resource:
/// its kind letter and name, then its keys, sorted, tab-separated): a Deployment reading two
/// keys of one ConfigMap keeps about 30 bytes. On a workload only when there is such a
/// resource (most templates have none: `None`, 8 bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyUses(Box<str>);

/// The keys a workload reads of one resource, sorted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedKeys<'a>(&'a str);

impl<'a> UsedKeys<'a> {
    pub fn iter(self) -> impl Iterator<Item = &'a str> {
        self.0.split('\t')
    }
}

impl std::fmt::Display for UsedKeys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, key) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(key)?;
        }
        Ok(())
    }
}

fn letter(kind: ResourceKind) -> char {
    match kind {
        ResourceKind::ConfigMap => 'C',
        ResourceKind::Secret => 'S',
        ResourceKind::SecretProviderClass => 'P',
    }
}

impl KeyUses {
    /// The keys used of the resource, or `None` when it is used whole (or not at all).
    pub fn keys(&self, kind: ResourceKind, name: &str) -> Option<UsedKeys<'_>> {
        self.0.lines().find_map(|line| {
            let rest = line.strip_prefix(letter(kind))?.strip_prefix(name)?.strip_prefix('\t')?;
            Some(UsedKeys(rest))
        })
    }
}

/// What a change did to the keys a workload uses.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyChange<'a> {
    /// None of them changed: the change need not roll the workload.
    Untouched,
    /// These changed (appeared, went or took another value).
    Changed(Vec<&'a str>),
    /// Not known (no per-key hashes of the data acted on, or a key not kept): roll.
    Unknown,
}

/// Compare the used `keys` between `acted` (the per-key hashes of the data last acted on) and
/// `current`.
pub fn compare<'a>(keys: UsedKeys<'a>, current: Option<&KeyHashes>, acted: Option<&KeyHashes>) -> KeyChange<'a> {
    let (Some(current), Some(acted)) = (current, acted) else { return KeyChange::Unknown };
    let mut changed = Vec::new();
    for key in keys.iter() {
        let id = key_id(key);
        match (current.get(id), acted.get(id)) {
            (Some(now), Some(before)) if now == before => {}
            (Some(_), Some(_)) => changed.push(key),
            _ => return KeyChange::Unknown,
        }
    }
    if changed.is_empty() { KeyChange::Untouched } else { KeyChange::Changed(changed) }
}

/// Collects what a pod spec uses of each resource.
#[derive(Default)]
struct Uses(BTreeMap<(ResourceKind, String), Used>);

impl Uses {
    fn add(&mut self, kind: ResourceKind, name: Option<&String>, used: Used) {
        let Some(name) = name.filter(|n| !n.is_empty()) else { return };
        let entry = self.0.entry((kind, name.clone())).or_insert(Used::Keys(Vec::new()));
        match (entry, used) {
            (Used::Whole, _) => {}
            (entry, Used::Whole) => *entry = Used::Whole,
            (Used::Keys(mine), Used::Keys(more)) => mine.extend(more),
        }
    }

    fn keys(items: &[WireKeyToPath]) -> Used {
        if items.is_empty() { Used::Whole } else { Used::Keys(items.iter().map(|i| i.key.clone()).collect()) }
    }
}

/// What `spec` uses of each resource; `None` when it uses every resource whole.
pub fn key_uses(spec: &WirePodSpec) -> Option<Box<KeyUses>> {
    let mut uses = Uses::default();
    let containers = spec.containers.iter().chain(&spec.init_containers);
    for container in containers.clone() {
        for var in &container.env {
            let Some(from) = &var.value_from else { continue };
            for (kind, reference) in
                [(ResourceKind::ConfigMap, &from.config_map_key_ref), (ResourceKind::Secret, &from.secret_key_ref)]
            {
                if let Some(r) = reference {
                    // A reference without a key is invalid in Kubernetes; taken whole.
                    let used = r.key.clone().map_or(Used::Whole, |k| Used::Keys(vec![k]));
                    uses.add(kind, r.name.as_ref(), used);
                }
            }
        }
        for from in &container.env_from {
            uses.add(ResourceKind::ConfigMap, from.config_map_ref.as_ref().and_then(|r| r.name.as_ref()), Used::Whole);
            uses.add(ResourceKind::Secret, from.secret_ref.as_ref().and_then(|r| r.name.as_ref()), Used::Whole);
        }
    }
    for volume in &spec.volumes {
        // Without items, a volume whose every mount reads one file (`subPath`) uses those keys.
        let sub_paths = || {
            let mounts = containers.clone().flat_map(|c| &c.volume_mounts).filter(|m| m.name == volume.name);
            let paths: Option<Vec<String>> = mounts
                .map(|m| {
                    let path = m.sub_path.as_deref().filter(|p| !p.is_empty())?;
                    Some(path.split('/').next().unwrap_or(path).to_string())
                })
                .collect();
            match paths {
                Some(paths) if !paths.is_empty() => Used::Keys(paths),
                _ => Used::Whole,
            }
        };
        let used = |items: &[WireKeyToPath]| {
            if items.is_empty() { sub_paths() } else { Uses::keys(items) }
        };
        if let Some(cm) = &volume.config_map {
            uses.add(ResourceKind::ConfigMap, cm.name.as_ref(), used(&cm.items));
        }
        if let Some(secret) = &volume.secret {
            uses.add(ResourceKind::Secret, secret.secret_name.as_ref(), used(&secret.items));
        }
        for WireProjection { config_map, secret } in volume.projected.iter().flat_map(|p| &p.sources) {
            if let Some(cm) = config_map {
                uses.add(ResourceKind::ConfigMap, cm.name.as_ref(), Uses::keys(&cm.items));
            }
            if let Some(s) = secret {
                uses.add(ResourceKind::Secret, s.name.as_ref(), Uses::keys(&s.items));
            }
        }
    }
    let mut text = String::new();
    for ((kind, name), used) in uses.0 {
        let Used::Keys(mut keys) = used else { continue };
        // A key with a tab or newline (never valid in Kubernetes) cannot be told apart here.
        if keys.iter().any(|k| k.is_empty() || k.contains(['\t', '\n'])) || name.contains(['\t', '\n']) {
            continue;
        }
        keys.sort_unstable();
        keys.dedup();
        text.push(letter(kind));
        text.push_str(&name);
        for key in keys {
            text.push('\t');
            text.push_str(&key);
        }
        text.push('\n');
    }
    (!text.is_empty()).then(|| Box::new(KeyUses(text.into_boxed_str())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn uses(spec: serde_json::Value) -> Option<Box<KeyUses>> {
        key_uses(&serde_json::from_value(spec).expect("a pod spec"))
    }

    fn keys(u: &KeyUses, kind: ResourceKind, name: &str) -> Option<Vec<String>> {
        u.keys(kind, name).map(|k| k.iter().map(str::to_string).collect())
    }

    #[test]
    fn selective_references_name_their_keys_and_any_whole_use_wins() {
        use ResourceKind::{ConfigMap as Cm, Secret as Sec};
        let u = uses(json!({
            "containers": [{
                "name": "app",
                "env": [
                    { "name": "A", "valueFrom": { "configMapKeyRef": { "name": "shared", "key": "a" } } },
                    { "name": "B", "valueFrom": { "configMapKeyRef": { "name": "shared", "key": "b" } } },
                    { "name": "P", "valueFrom": { "secretKeyRef": { "name": "db", "key": "password" } } },
                    { "name": "W", "valueFrom": { "configMapKeyRef": { "name": "whole", "key": "x" } } }
                ],
                "envFrom": [{ "configMapRef": { "name": "whole" } }],
                "volumeMounts": [
                    { "name": "items", "mountPath": "/items" },
                    { "name": "one-file", "mountPath": "/etc/app.conf", "subPath": "app.conf" },
                    { "name": "tls", "mountPath": "/tls" }
                ]
            }],
            "volumes": [
                { "name": "items", "configMap": { "name": "files", "items": [{ "key": "f1", "path": "one" }] } },
                { "name": "one-file", "configMap": { "name": "conf" } },
                { "name": "tls", "secret": { "secretName": "certs" } },
                { "name": "proj", "projected": { "sources": [
                    { "secret": { "name": "proj-s", "items": [{ "key": "token", "path": "t" }] } },
                    { "configMap": { "name": "proj-whole" } } ] } }
            ]
        }))
        .expect("some resources are used selectively");
        assert_eq!(keys(&u, Cm, "shared"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(keys(&u, Sec, "db"), Some(vec!["password".into()]));
        assert_eq!(keys(&u, Cm, "files"), Some(vec!["f1".into()]));
        assert_eq!(keys(&u, Cm, "conf"), Some(vec!["app.conf".into()]));
        assert_eq!(keys(&u, Sec, "proj-s"), Some(vec!["token".into()]));
        for (kind, whole) in [(Cm, "whole"), (Sec, "certs"), (Cm, "proj-whole")] {
            assert_eq!(keys(&u, kind, whole), None, "{whole} is used whole");
        }
        assert!(
            uses(json!({ "containers": [{ "name": "a", "envFrom": [{ "configMapRef": { "name": "x" } }] }] }))
                .is_none()
        );
    }

    #[test]
    fn a_change_is_untouched_only_when_every_used_key_is_known_and_equal() {
        let data = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let hashes = |pairs: &[(&str, &str)], kept: &[&str]| {
            let mut ids: Vec<u64> = kept.iter().map(|k| key_id(k)).collect();
            ids.sort_unstable();
            KeyHashes::of_configmap(&data(pairs), &BTreeMap::new()).only(&ids)
        };
        let uses = KeyUses("Cshared\ta\tnew\n".into());
        let used = uses.keys(ResourceKind::ConfigMap, "shared").expect("read by key");
        assert_eq!(used.to_string(), "a, new");
        let before = hashes(&[("a", "1"), ("b", "1")], &["a", "new"]);
        let b_changed = hashes(&[("a", "1"), ("b", "2")], &["a", "new"]);
        assert_eq!(compare(used, Some(&b_changed), Some(&before)), KeyChange::Untouched);
        let a_changed = hashes(&[("a", "2"), ("b", "1")], &["a", "new"]);
        assert_eq!(compare(used, Some(&a_changed), Some(&before)), KeyChange::Changed(vec!["a"]));
        let new_key = hashes(&[("a", "1"), ("new", "x")], &["a", "new"]);
        assert_eq!(compare(used, Some(&new_key), Some(&before)), KeyChange::Changed(vec!["new"]), "a key appearing");
        let not_kept = hashes(&[("a", "1"), ("b", "2")], &["a"]);
        assert_eq!(compare(used, Some(&not_kept), Some(&before)), KeyChange::Unknown, "a key not kept");
        assert_eq!(compare(used, None, Some(&before)), KeyChange::Unknown);
        assert_eq!(compare(used, Some(&b_changed), None), KeyChange::Unknown, "no baseline: roll");
    }

    #[test]
    fn a_volume_mounted_once_whole_and_once_by_sub_path_is_used_whole() {
        let u = uses(json!({
            "containers": [
                { "name": "a", "volumeMounts": [{ "name": "v", "mountPath": "/x", "subPath": "k" }] },
                { "name": "b", "volumeMounts": [{ "name": "v", "mountPath": "/all" }] }
            ],
            "volumes": [{ "name": "v", "configMap": { "name": "cm" } }]
        }));
        assert!(u.is_none(), "{u:?}");
    }

    #[test]
    fn key_hashes_tell_which_keys_changed() {
        let data = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let before = KeyHashes::of_configmap(&data(&[("a", "1"), ("b", "2")]), &BTreeMap::new());
        let after = KeyHashes::of_configmap(&data(&[("a", "1"), ("b", "3"), ("c", "4")]), &BTreeMap::new());
        let (a, b, c) = (key_id("a"), key_id("b"), key_id("c"));
        assert_eq!(before.get(a), after.get(a));
        assert_ne!(before.get(b), after.get(b));
        assert_eq!((before.get(c), after.get(c).is_some()), (None, true), "a new key is a change of it");
        let mut ids = [a, c, key_id("gone")];
        ids.sort_unstable();
        let only = after.only(&ids);
        assert_eq!((only.get(a), only.get(b)), (after.get(a), None), "b is not kept: not known");
        assert_eq!(only.get(key_id("gone")), Some(ABSENT), "a used key the data lacks is kept as absent");
        assert_eq!(only.heap_bytes(), 48);
        let bin = KeyHashes::of_configmap(&BTreeMap::new(), &[("a".to_string(), b"1".to_vec())].into());
        assert_eq!(bin.get(a), before.get(a), "the same bytes in data or binaryData");
    }
}
