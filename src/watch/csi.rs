//! Secrets Store CSI: many pod statuses folded into one resource per SecretProviderClass.
//!
//! ```text
//!  SecretProviderClassPodStatus (one per pod and class)  --hash of id=version, class-->  ResourceKey
//!  SecretProviderClass (annotations: ignore, match)      ----------------------------->  (SPC, ns, class)
//! ```
//! The store holds one [`ResourceState`] per class: the hash most recently reported by an
//! update of one of its pod statuses, with the class's `ignore` and `match` annotations. The
//! pod statuses themselves are remembered here only by their hash, to tell an update from a
//! label-only change.

use std::collections::HashMap;
use std::sync::Arc;

use crate::watch::wire::{Compactor, SlimSpcPodStatus};
use crate::watch::{DataHash, ResourceKey, ResourceKind, ResourceState, Writer};

/// Reloader's resource type for CSI in metric labels.
pub(crate) const POD_STATUS_PLURAL: &str = "secretproviderclasspodstatuses";

type Name = (Arc<str>, Arc<str>);

/// One pod status as the watch saw it.
pub(crate) struct PodStatus {
    pub namespace: Arc<str>,
    /// The pod status object's own name.
    pub object: Arc<str>,
    pub class: Arc<str>,
    pub hash: DataHash,
}

impl PodStatus {
    /// `None` without namespace, name or class name (a status the driver has not filled in).
    pub fn of(status: &SlimSpcPodStatus) -> Option<PodStatus> {
        let class = status.status.secret_provider_class_name.as_str();
        if class.is_empty() {
            return None;
        }
        Some(PodStatus {
            namespace: status.metadata.namespace.as_deref()?.into(),
            object: status.metadata.name.as_deref()?.into(),
            class: class.into(),
            hash: Compactor::spc_pod_status_hash(status),
        })
    }

    pub fn class_key(&self) -> ResourceKey {
        ResourceKey {
            kind: ResourceKind::SecretProviderClass,
            namespace: self.namespace.clone(),
            name: self.class.clone(),
        }
    }
}

#[derive(Default)]
pub(crate) struct CsiState {
    /// Each pod status: its class and the hash it reported last.
    pod_statuses: HashMap<Name, (Arc<str>, DataHash)>,
    /// Pod statuses per class; the class's state leaves the store with the last one.
    per_class: HashMap<Name, usize>,
    /// `(ignored, match)` per SecretProviderClass.
    classes: HashMap<Name, (bool, bool)>,
}

impl CsiState {
    /// Take in one pod status. Returns the status's previous hash when this is an update of
    /// that status to another hash: a change of the class, whose state then holds the new
    /// hash. A status seen for the first time is not a change; it gives the class its first
    /// state if it has none.
    pub fn apply_pod_status(&mut self, writer: &Writer, report: &PodStatus) -> Option<DataHash> {
        let name = (report.namespace.clone(), report.object.clone());
        let previous = self.pod_statuses.insert(name, (report.class.clone(), report.hash));
        let key = report.class_key();
        match previous {
            Some((class, hash)) if class == report.class => {
                if hash == report.hash {
                    return None;
                }
                writer.apply_resource(key.clone(), self.state(&key, report.hash));
                Some(hash)
            }
            other => {
                if let Some((old_class, _)) = other {
                    self.release(writer, &report.namespace, &old_class);
                }
                *self.per_class.entry((key.namespace.clone(), key.name.clone())).or_default() += 1;
                if writer.store().resource(&key).is_none() {
                    writer.apply_resource(key.clone(), self.state(&key, report.hash));
                }
                None
            }
        }
    }

    pub fn delete_pod_status(&mut self, writer: &Writer, namespace: &str, object: &str) {
        let name: Name = (namespace.into(), object.into());
        if let Some((class, _)) = self.pod_statuses.remove(&name) {
            self.release(writer, namespace, &class);
        }
    }

    /// After a list of `scope`: forget the pod statuses it did not see.
    /// A list of pod statuses ended: forget those it `missed` (covered, not seen).
    pub fn retain_pod_statuses(&mut self, writer: &Writer, missed: impl Fn(&Arc<str>, &Arc<str>) -> bool) {
        let gone: Vec<Name> = self.pod_statuses.keys().filter(|n| missed(&n.0, &n.1)).cloned().collect();
        for (namespace, object) in gone {
            self.delete_pod_status(writer, &namespace, &object);
        }
    }

    pub fn apply_class(&mut self, writer: &Writer, namespace: Arc<str>, name: Arc<str>, ignored: bool, matched: bool) {
        let key = ResourceKey { kind: ResourceKind::SecretProviderClass, namespace, name };
        let changed = self.classes.insert((key.namespace.clone(), key.name.clone()), (ignored, matched))
            != Some((ignored, matched));
        if changed && let Some(current) = writer.store().resource(&key) {
            writer.apply_resource(key.clone(), self.state(&key, current.hash));
        }
    }

    pub fn delete_class(&mut self, writer: &Writer, namespace: &str, name: &str) {
        self.apply_class(writer, namespace.into(), name.into(), false, false);
        self.classes.remove(&(Arc::from(namespace), Arc::from(name)));
    }

    /// A list of classes ended: forget those it `missed` (covered, not seen).
    pub fn retain_classes(&mut self, writer: &Writer, missed: impl Fn(&Arc<str>, &Arc<str>) -> bool) {
        let gone: Vec<Name> = self.classes.keys().filter(|n| missed(&n.0, &n.1)).cloned().collect();
        for (namespace, name) in gone {
            self.delete_class(writer, &namespace, &name);
        }
    }

    /// The namespace left this replica (the store forgets it on its own).
    pub fn forget_namespace(&mut self, namespace: &str) {
        self.pod_statuses.retain(|n, _| &*n.0 != namespace);
        self.per_class.retain(|n, _| &*n.0 != namespace);
        self.classes.retain(|n, _| &*n.0 != namespace);
    }

    fn state(&self, key: &ResourceKey, hash: DataHash) -> ResourceState {
        let (ignored, search_match) =
            self.classes.get(&(key.namespace.clone(), key.name.clone())).copied().unwrap_or_default();
        ResourceState { hash, ignored, search_match, wide: None, keys: None }
    }

    /// One pod status of `class` is gone; the class's state goes with its last one.
    fn release(&mut self, writer: &Writer, namespace: &str, class: &Arc<str>) {
        let name: Name = (namespace.into(), class.clone());
        if let Some(count) = self.per_class.get_mut(&name) {
            *count -= 1;
            if *count == 0 {
                self.per_class.remove(&name);
                writer.delete_resource(&ResourceKey {
                    kind: ResourceKind::SecretProviderClass,
                    namespace: name.0,
                    name: name.1,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::Store;

    fn report(object: &str, version: &str) -> PodStatus {
        PodStatus {
            namespace: "ns".into(),
            object: object.into(),
            class: "spc".into(),
            hash: DataHash::of_secret_provider_class("spc", [("secret/password", version)]),
        }
    }

    #[test]
    fn only_an_update_of_one_status_to_other_versions_is_a_change() {
        let (store, writer) = Store::new(vec![]);
        let mut csi = CsiState::default();
        let key = report("a", "v1").class_key();
        assert_eq!(csi.apply_pod_status(&writer, &report("a", "v1")), None, "a new status is no change");
        assert_eq!(csi.apply_pod_status(&writer, &report("b", "v1")), None);
        assert_eq!(store.resource(&key).map(|s| s.hash), Some(report("a", "v1").hash));
        assert_eq!(csi.apply_pod_status(&writer, &report("a", "v1")), None, "same versions (labels only)");
        assert_eq!(csi.apply_pod_status(&writer, &report("a", "v2")), Some(report("a", "v1").hash));
        assert_eq!(store.resource(&key).map(|s| s.hash), Some(report("a", "v2").hash));
        // The second pod's update reports the hash already stored: the engine skips it.
        assert_eq!(csi.apply_pod_status(&writer, &report("b", "v2")), Some(report("b", "v1").hash));
        csi.delete_pod_status(&writer, "ns", "a");
        assert!(store.resource(&key).is_some(), "the class stays while a status reports it");
        csi.delete_pod_status(&writer, "ns", "b");
        assert!(store.resource(&key).is_none());
    }

    #[test]
    fn class_annotations_reach_the_state() {
        let (store, writer) = Store::new(vec![]);
        let mut csi = CsiState::default();
        csi.apply_pod_status(&writer, &report("a", "v1"));
        csi.apply_class(&writer, "ns".into(), "spc".into(), true, false);
        let key = report("a", "v1").class_key();
        assert!(store.resource(&key).is_some_and(|s| s.ignored));
        csi.delete_class(&writer, "ns", "spc");
        assert!(store.resource(&key).is_some_and(|s| !s.ignored));
    }
}
