//! The namespace watch: which namespaces are selected (labels, the ignore list), owned (the
//! ring) or kept for a standby, and what a namespace joining or leaving the selection does.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{WatchTask, list_config, standby};

pub(super) type NamespaceStream =
    Pin<Box<dyn Stream<Item = Result<WatchEvent<PartialObjectMeta<Namespace>>, watcher::Error>> + Send>>;

pub(super) fn namespace_stream(client: Client, streaming: bool) -> NamespaceStream {
    // Metadata only: labels are all the filter needs.
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    watcher::watcher(api, list_config(streaming)).default_backoff().boxed()
}

pub(super) async fn next_namespace_event(
    namespaces: &mut Option<NamespaceStream>,
) -> Option<Result<WatchEvent<PartialObjectMeta<Namespace>>, watcher::Error>> {
    match namespaces {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

impl WatchTask {
    pub(super) async fn sync_namespaces(&mut self, stream: &mut NamespaceStream) {
        while let Some(event) = stream.next().await {
            let done = matches!(event, Ok(WatchEvent::InitDone));
            self.apply_namespace_event(event);
            if done {
                return;
            }
        }
    }

    /// Apply a namespace event; returns whether a namespace joined the selection (the object
    /// watches must then relist to load its objects).
    pub(super) fn apply_namespace_event(
        &mut self,
        event: Result<WatchEvent<PartialObjectMeta<Namespace>>, watcher::Error>,
    ) -> bool {
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                self.metrics.watch_errors.inc();
                warn!(error = %err, kind = "Namespace", "watch failed; retrying with backoff");
                return false;
            }
        };
        let mut gained = false;
        match event {
            WatchEvent::Init => self.namespaces.labelled.clear(),
            WatchEvent::InitApply(ns) | WatchEvent::Apply(ns) => {
                let name = ns.metadata.name.clone().unwrap_or_default();
                let labels = ns.metadata.labels.unwrap_or_default();
                let labelled = self.config.filter.select(&name, &labels).is_selected();
                self.namespaces.labelled.insert(name.clone(), labelled);
                gained |= self.reselect(&name, ns.metadata.resource_version.as_deref());
            }
            WatchEvent::Delete(ns) => {
                let name = ns.metadata.name.clone().unwrap_or_default();
                self.namespaces.labelled.remove(&name);
                self.reselect(&name, None);
            }
            WatchEvent::InitDone => {
                let known: Vec<String> = self.namespaces.selected.iter().cloned().collect();
                for name in known {
                    self.reselect(&name, None);
                }
            }
        }
        gained
    }

    /// Re-evaluate one namespace (its Namespace object now at `resource_version`); returns true
    /// if it newly joined.
    pub(super) fn reselect(&mut self, name: &str, resource_version: Option<&str>) -> bool {
        let selected = self.namespaces.labelled.get(name).copied().unwrap_or(false);
        if selected {
            let joined = self.namespaces.selected.insert(name.to_string());
            if joined && self.shards.all_synced {
                self.namespaces.loading.insert(name.to_string());
                // The relist that loads it diffs against the state its resources had when it
                // joined: a change made since is a change, not a first sighting.
                let owned = self.shards.owned.contains(&self.config.ring.shard_of(name));
                for (key, state) in self.unselected.take_namespace(name, resource_version) {
                    if owned {
                        self.writer.apply_resource(key, state);
                    } else if self.keeps_standby {
                        self.standby.keep_resource(key, state);
                    }
                }
            }
            joined
        } else {
            self.namespaces.loading.remove(name);
            self.namespaces.deferred.retain(|c| &*c.key.namespace != name);
            if self.namespaces.selected.remove(name) {
                debug!(namespace = name, "namespace left the selection; forgetting its objects");
                // Of a foreign namespace, the standby holds the objects.
                let kept = self.standby.take(|ns| ns == name).resources;
                for (key, state) in self.writer.forget_namespace(name).0.into_iter().chain(kept) {
                    self.unselected.keep(key, state);
                }
                self.csi.forget_namespace(name);
            }
            false
        }
    }

    /// Whether resources of unselected namespaces are kept: only where a namespace can join at
    /// run time (cluster-wide watches with a label selector), in owned shards and, with the
    /// standby, in all (a gained shard then has them without a relist).
    pub(super) fn keeps_unselected(&self, namespace: &str) -> bool {
        self.config.namespaces.is_none()
            && self.config.filter.needs_labels()
            && (self.keeps_standby || self.shards.owned.contains(&self.config.ring.shard_of(namespace)))
    }

    /// Whether an object of `namespace`, a shard held elsewhere, goes to the standby: if the
    /// namespace is selected (by labels, or by name).
    pub(super) fn stands_by(&self, namespace: &str) -> bool {
        self.keeps_standby
            && if self.config.filter.needs_labels() {
                self.namespaces.selected.contains(namespace)
            } else {
                self.config.filter.select(namespace, &BTreeMap::new()).is_selected()
            }
    }

    /// Update the store gauges, and publish the owned shards as synced once every stream has
    /// listed them.
    pub(super) fn publish_sync(&mut self, synced: &watch::Sender<Option<BTreeSet<u32>>>) {
        let (resources, workloads) = self.writer.store().len();
        self.metrics.store_objects.with_label_values(&["resources"]).set(resources as i64);
        self.metrics.store_objects.with_label_values(&["workloads"]).set(workloads as i64);
        self.metrics.store_objects.with_label_values(&["unselected"]).set(self.unselected.len() as i64);
        let (standby_resources, standby_workloads) = self.standby.len();
        self.metrics.store_objects.with_label_values(&["standby"]).set((standby_resources + standby_workloads) as i64);
        self.metrics.namespaces_owned.set(self.writer.store().namespace_count() as i64);
        let all_listed = self.streams.running.values().all(|s| s.synced_once);
        let newly_synced = all_listed && self.shards.synced_for.as_ref() != Some(&self.shards.owned);
        if all_listed {
            self.writer.settle_key_hashes(newly_synced);
        }
        if newly_synced {
            // Every workload is listed: per-key hashes are kept on only if one reads by key.
            let used = self.writer.store().reads_keys_selectively() || self.standby.reads_keys_selectively();
            self.config.compactor.settle_key_hashes(used);
            if !used {
                self.standby.drop_key_hashes();
                self.unselected.drop_key_hashes();
            }
            self.shards.all_synced = true;
            self.shards.synced_for = Some(self.shards.owned.clone());
            info!(resources, workloads, shards = ?self.shards.owned, "store in sync");
            synced.send_replace(self.shards.synced_for.clone());
        }
    }

    /// Adopt a new owned set: forget lost shards at once (into the standby, if kept) and load
    /// gained ones from the standby; returns whether shards were gained (then, without the
    /// standby, the watches must relist to load them).
    pub(super) fn apply_ownership(
        &mut self,
        now_owned: BTreeSet<u32>,
        synced: &watch::Sender<Option<BTreeSet<u32>>>,
    ) -> bool {
        let lost: BTreeSet<u32> = self.shards.owned.difference(&now_owned).copied().collect();
        let gained: BTreeSet<u32> = now_owned.difference(&self.shards.owned).copied().collect();
        let standby = self.keeps_standby;
        // Lost shards leave `synced` before their objects leave the store: an engine that read
        // the store while taking a shard up and then still finds it synced read it whole.
        if let Some(done) = self.shards.synced_for.as_mut() {
            done.retain(|s| now_owned.contains(s));
            synced.send_replace(self.shards.synced_for.clone());
        }
        if !lost.is_empty() {
            for namespace in self.writer.store().namespaces() {
                if lost.contains(&self.config.ring.shard_of(&namespace)) {
                    let (resources, workloads) = self.writer.forget_namespace(&namespace);
                    self.csi.forget_namespace(&namespace);
                    if standby {
                        self.standby.keep(standby::Objects { resources, workloads });
                    }
                }
            }
            if !standby {
                let (ring, owned) = (self.config.ring.clone(), now_owned.clone());
                self.unselected.retain_namespaces(|ns| owned.contains(&ring.shard_of(ns)));
            }
            info!(lost = ?lost, kept = standby, "lost shards; their objects left the store");
        }
        if now_owned.is_empty() {
            self.standby.clear();
            self.unselected.retain_namespaces(|_| false);
        }
        if standby && !gained.is_empty() {
            let ring = self.config.ring.clone();
            let objects = self.standby.take(|ns| gained.contains(&ring.shard_of(ns)));
            let (resources, workloads) = (objects.resources.len(), objects.workloads.len());
            // Loaded, as a relist would find them: each state is its resource's baseline, and
            // the engine reconciles the shard against its checkpoint.
            for (key, state) in objects.resources {
                self.writer.apply_resource(key, state);
            }
            for workload in objects.workloads {
                self.writer.apply_workload(Arc::unwrap_or_clone(workload));
            }
            info!(shards = ?gained, resources, workloads, "gained shards; loaded from the standby, no relist");
        }
        self.shards.owned = now_owned;
        !gained.is_empty()
    }

    /// Whether `namespace` is in a shard held elsewhere; counts the object as foreign if so.
    pub(super) fn is_foreign(&self, namespace: &str) -> bool {
        let foreign = !self.shards.owned.contains(&self.config.ring.shard_of(namespace));
        if foreign {
            self.metrics.events_foreign.inc();
        }
        foreign
    }

    pub(super) fn is_selected(&self, namespace: &str) -> bool {
        if !self.shards.owned.contains(&self.config.ring.shard_of(namespace)) {
            return false;
        }
        if self.config.namespaces.is_some() {
            // Namespace-scoped watches only ever see listed namespaces.
            return true;
        }
        if self.config.filter.needs_labels() {
            self.namespaces.selected.contains(namespace)
        } else {
            self.config.filter.select(namespace, &BTreeMap::new()).is_selected()
        }
    }
}
