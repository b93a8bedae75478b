//! The watch task's handling of the Secrets Store CSI driver's objects: pod statuses folded
//! into one state per SecretProviderClass ([`crate::watch::csi`]), and the classes' annotations.

use std::sync::Arc;

use kube::runtime::watcher::Event as WatchEvent;

use super::{Error, WatchTask};
use crate::watch::csi;
use crate::watch::wire::{SlimSecretProviderClass, SlimSpcPodStatus};
use crate::watch::{Cause, Change};

impl WatchTask {
    /// A pod status of the CSI driver. Like Reloader, only an update of one pod's status to
    /// other versions is a change (its hash is the class's new state); a status appearing or
    /// going is not. N pods reporting the same rotation are one change: the first one is
    /// acted on, the others find the hash already acted on.
    pub(super) async fn apply_pod_status_event(
        &mut self,
        stream: usize,
        event: WatchEvent<SlimSpcPodStatus>,
    ) -> Result<(), Error> {
        let emit = self.stream(stream).synced_once || self.shards.all_synced;
        match event {
            WatchEvent::Init => self.stream(stream).start_list(),
            WatchEvent::InitApply(status) | WatchEvent::Apply(status) => {
                let cause = if self.stream(stream).is_listing() { Cause::Listed } else { Cause::Event };
                let Some(report) = csi::PodStatus::of(&status) else { return Ok(()) };
                self.metrics.events_received.with_label_values(&["update", csi::POD_STATUS_PLURAL]).inc();
                if !self.is_selected(&report.namespace) {
                    return Ok(());
                }
                self.stream(stream).saw(&report.namespace, &report.object);
                let update = self.csi.apply_pod_status(&self.writer, &report);
                if let Some(previous) = update
                    && emit
                {
                    let key = report.class_key();
                    self.send(Change { key, observed: Some(report.hash), previous: Some(previous), cause }).await?;
                }
            }
            WatchEvent::Delete(status) => {
                if let Some(report) = csi::PodStatus::of(&status) {
                    self.metrics.events_received.with_label_values(&["delete", csi::POD_STATUS_PLURAL]).inc();
                    self.csi.delete_pod_status(&self.writer, &report.namespace, &report.object);
                }
            }
            WatchEvent::InitDone => {
                let listed = self.stream(stream).finish_list();
                let ring = &self.config.ring;
                self.csi.retain_pod_statuses(&self.writer, |ns, name| listed.missed(ring, ns, name));
            }
        }
        Ok(())
    }

    /// A SecretProviderClass: its `ignore` and `match` annotations go onto the class's state.
    pub(super) fn apply_class_event(&mut self, stream: usize, event: WatchEvent<SlimSecretProviderClass>) {
        match event {
            WatchEvent::Init => self.stream(stream).start_list(),
            WatchEvent::InitApply(class) | WatchEvent::Apply(class) => {
                let (Some(namespace), Some(name)) = (class.metadata.namespace.clone(), class.metadata.name.clone())
                else {
                    return;
                };
                if !self.is_selected(&namespace) {
                    return;
                }
                let (namespace, name): (Arc<str>, Arc<str>) = (namespace.into(), name.into());
                self.stream(stream).saw(&namespace, &name);
                let flags = self.compactor.secret_provider_class(&class, crate::watch::DataHash::of_bytes(b""));
                self.csi.apply_class(&self.writer, namespace, name, flags.ignored, flags.search_match);
            }
            WatchEvent::Delete(class) => {
                if let (Some(namespace), Some(name)) =
                    (class.metadata.namespace.as_deref(), class.metadata.name.as_deref())
                {
                    self.csi.delete_class(&self.writer, namespace, name);
                }
            }
            WatchEvent::InitDone => {
                let listed = self.stream(stream).finish_list();
                let ring = &self.config.ring;
                self.csi.retain_classes(&self.writer, |ns, name| listed.missed(ring, ns, name));
            }
        }
    }
}
