//! One namespace listed once and stored as the watches store it: the same compaction, the same
//! skip of the controller's own ConfigMaps, the same label selection and the same fold of the
//! CSI driver's pod statuses into one state per SecretProviderClass. What `reloader explain`
//! decides from, so that its answer is the controller's.

use std::collections::BTreeSet;

use kube::api::ListParams;
use kube::{Api, Client};

use crate::shard::LabelSelector;
use crate::watch::csi::{CsiState, PodStatus};
use crate::watch::wire::{Compactor, SlimConfigMap, SlimRaw, SlimSecret, SlimSecretProviderClass, SlimSpcPodStatus};
use crate::watch::{ResourceKey, ResourceKind, WorkloadKind, Writer};

/// What to list, and how the controller would filter it.
pub struct Snapshot<'a> {
    pub namespace: &'a str,
    pub kinds: &'a [WorkloadKind],
    pub resources: &'a [ResourceKind],
    /// `--resource-label-selector`: resources it leaves out are not stored, and are returned.
    pub label_selector: Option<&'a LabelSelector>,
    pub compactor: &'a Compactor,
}

/// A list the API server refused.
#[derive(Debug, thiserror::Error)]
#[error("cannot list {what} in {namespace}")]
pub struct ListError {
    what: String,
    namespace: String,
    #[source]
    source: kube::Error,
}

impl Snapshot<'_> {
    /// Store the namespace's workloads and resources in `writer`'s store; return the resources
    /// the label selector leaves out (the watches never see them).
    ///
    /// # Errors
    /// When a list is refused.
    pub async fn load(&self, client: &Client, writer: &Writer) -> Result<BTreeSet<ResourceKey>, ListError> {
        let ns = self.namespace;
        let params = ListParams::default();
        for kind in self.kinds {
            let api: Api<SlimRaw> = Api::namespaced_with(client.clone(), ns, &kind.api_resource());
            for object in api.list(&params).await.map_err(self.refused(kind.spec().plural))?.items {
                if let Some(workload) = self.compactor.compact_raw(*kind, &object) {
                    writer.apply_workload(workload);
                }
            }
        }
        let mut left_out = BTreeSet::new();
        let selected = |labels: &Option<std::collections::BTreeMap<String, String>>| {
            self.label_selector.is_none_or(|s| s.matches(labels.as_ref().unwrap_or(&Default::default())))
        };
        let key = |kind, name: &Option<String>| ResourceKey {
            kind,
            namespace: ns.into(),
            name: name.as_deref().unwrap_or_default().into(),
        };
        if self.resources.contains(&ResourceKind::ConfigMap) {
            let api: Api<SlimConfigMap> = Api::namespaced(client.clone(), ns);
            for cm in api.list(&params).await.map_err(self.refused("ConfigMaps"))?.items {
                if Compactor::is_internal(&cm) {
                    continue;
                }
                let key = key(ResourceKind::ConfigMap, &cm.metadata.name);
                if selected(&cm.metadata.labels) {
                    writer.apply_resource(key, self.compactor.configmap(&cm));
                } else {
                    left_out.insert(key);
                }
            }
        }
        if self.resources.contains(&ResourceKind::Secret) {
            let api: Api<SlimSecret> = Api::namespaced(client.clone(), ns);
            for secret in api.list(&params).await.map_err(self.refused("Secrets"))?.items {
                let key = key(ResourceKind::Secret, &secret.metadata.name);
                if selected(&secret.metadata.labels) {
                    writer.apply_resource(key, self.compactor.secret(&secret));
                } else {
                    left_out.insert(key);
                }
            }
        }
        if self.resources.contains(&ResourceKind::SecretProviderClass) {
            self.load_csi(client, writer).await?;
        }
        Ok(left_out)
    }

    /// The error of a list of `what` in this namespace.
    fn refused(&self, what: &str) -> impl FnOnce(kube::Error) -> ListError {
        let (what, namespace) = (what.to_string(), self.namespace.to_string());
        move |source| ListError { what, namespace, source }
    }

    /// The classes, then their pod statuses folded as the watches fold them, the newest report
    /// first (it gives the class its state). The label selector does not apply: the driver
    /// labels nothing.
    async fn load_csi(&self, client: &Client, writer: &Writer) -> Result<(), ListError> {
        let ns = self.namespace;
        let params = ListParams::default();
        let mut csi = CsiState::default();
        let classes: Api<SlimSecretProviderClass> = Api::namespaced(client.clone(), ns);
        for class in classes.list(&params).await.map_err(self.refused("SecretProviderClasses"))?.items {
            let Some(name) = class.metadata.name.clone() else { continue };
            let flags = self.compactor.secret_provider_class(&class, crate::watch::DataHash::of_bytes(b""));
            csi.apply_class(writer, ns.into(), name.into(), flags.ignored, flags.search_match);
        }
        let statuses: Api<SlimSpcPodStatus> = Api::namespaced(client.clone(), ns);
        let mut statuses = statuses.list(&params).await.map_err(self.refused("SecretProviderClassPodStatuses"))?.items;
        let version = |s: &SlimSpcPodStatus| s.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
        statuses.sort_by_key(|s| std::cmp::Reverse(version(s)));
        for status in &statuses {
            if let Some(report) = PodStatus::of(status) {
                csi.apply_pod_status(writer, &report);
            }
        }
        Ok(())
    }
}
