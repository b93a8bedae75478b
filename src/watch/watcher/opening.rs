//! Which streams run: one set per scope (cluster-wide, or one per namespace in
//! namespace-scoped mode), and, with server-side sharding, one more set per group of gained
//! shards, so that a gained shard is a list of its range alone while the other watches run on.

use std::collections::{BTreeSet, HashSet};

use futures::StreamExt;
use kube::Client;
use kube::runtime::watcher;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::seed::{SEED_MIN_NAMESPACES, Seeds};
use super::streams::{
    cached_list_config, gated, list_config, raw_workload_stream, tagged, watch_kind, workload_stream,
};
use super::{BoxedTagged, Incoming, Merged, StreamState, WatchTask};
use crate::watch::WorkloadKind;
use crate::watch::wire::{
    INTERNAL_LABEL, SlimConfigMap, SlimDaemonSet, SlimDeployment, SlimSecret, SlimSecretProviderClass,
    SlimSpcPodStatus, SlimStatefulSet,
};

/// Groups of gained-shard watches at most; one more restarts every watch with the held shards
/// (one set again), and every held shard waits for that relist. A group is a watch per kind,
/// multiplexed on the HTTP/2 connections: a replica that gained shards one at a time while a
/// fleet formed had used 4 groups up, and its next gain, at a handoff, relisted 8 shards in
/// 0.7 s instead of listing 2.
const MAX_GROUPS: usize = 16;
/// A gain of more than one shard in this many lists its shards streamed, not held whole.
const MAX_GROUP_SHARE: usize = 4;

/// The watch configs of one set of streams.
struct Configs {
    /// Workloads and the CSI kinds.
    list: watcher::Config,
    secrets: watcher::Config,
    configmaps: watcher::Config,
}

/// What the streams of one set select, besides their scope.
struct SetOf {
    covers: Option<BTreeSet<u32>>,
    group: Option<String>,
    /// Its initial lists take the background permits (see [`super::BACKGROUND_LISTS`]).
    background: bool,
}

impl WatchTask {
    /// The scopes to watch: none while nothing is owned; one cluster-wide scope; or, in
    /// namespace-scoped mode, the listed namespaces of owned shards (each open watch is a
    /// connection of its own).
    fn wanted_scopes(&self) -> HashSet<Option<String>> {
        match &self.config.namespaces {
            _ if self.shards.owned.is_empty() => HashSet::new(),
            None => HashSet::from([None]),
            Some(list) => list
                .iter()
                .filter(|ns| self.shards.owned.contains(&self.config.ring.shard_of(ns)))
                .cloned()
                .map(Some)
                .collect(),
        }
    }

    /// Stop every stream; `open_streams` then starts them afresh, each with a full list. With
    /// server-side sharding they then select every held shard, in one set.
    pub(super) fn stop_streams(&mut self) {
        for (_, state) in self.streams.running.drain() {
            state.stop.cancel();
        }
        if self.config.server_shards.active() {
            self.config.server_shards.select(&self.config.ring, &self.shards.owned);
        }
        self.metrics.streams.set(0);
    }

    /// Stop the streams of scopes no longer wanted and start those of wanted scopes that have
    /// none; each new stream starts with a full list.
    pub(super) fn open_streams(&mut self, client: &Client, merged: &mut Merged) {
        let wanted = self.wanted_scopes();
        let server_shards = self.config.server_shards.clone();
        self.streams.running.retain(|_, state| {
            let keep = wanted.contains(&state.namespace);
            if !keep {
                stop(&server_shards, state);
            }
            keep
        });
        self.metrics.streams.set(self.streams.running.len() as i64);
        let running: HashSet<Option<String>> = self.streams.running.values().map(|s| s.namespace.clone()).collect();
        let configs = self.configs(None);
        let covers = server_shards.active().then(|| self.shards.owned.clone());
        let new: Vec<&Option<String>> = wanted.difference(&running).collect();
        let mut seeds = self.seeds(&new);
        for scope in new {
            let background =
                scope.as_ref().is_some_and(|ns| self.shards.background.contains(&self.config.ring.shard_of(ns)));
            let set = SetOf { covers: covers.clone(), group: None, background };
            self.start_set(client, merged, scope, &configs, set, &mut seeds);
        }
    }

    /// Seeds for the first lists of `new` namespaces gained by a running replica (namespace-scoped
    /// mode), if they are many and the cluster-wide list was not refused before. The first
    /// lists at startup stay per namespace: they are streamed (see `configs`).
    fn seeds(&self, new: &[&Option<String>]) -> Option<Seeds> {
        let gained: HashSet<String> = new.iter().filter_map(|scope| scope.as_ref().cloned()).collect();
        let wanted = self.shards.all_synced && gained.len() >= SEED_MIN_NAMESPACES && !self.seed_refused.get();
        wanted.then(|| Seeds::new(gained, self.seed_refused.clone()))
    }

    /// Server-side sharding, after the held shards changed from `before`: shards gained, and
    /// none lost, get watches of their own (a list of their ranges alone) while the others run
    /// on: a handoff to the replicas left. A shard lost (a replica joined) restarts every
    /// watch with the held shards, so that the API server stops sending the lost ones; so do
    /// gains past [`MAX_GROUPS`] groups, and a gain onto nothing held (a replica starting).
    pub(super) fn follow_server_shards(&mut self, client: &Client, merged: &mut Merged, before: &BTreeSet<u32>) {
        let gained: BTreeSet<u32> = self.shards.owned.difference(before).copied().collect();
        let lost = !before.is_subset(&self.shards.owned);
        if gained.is_empty() && !lost {
            return;
        }
        let groups: HashSet<&String> = self.streams.running.values().filter_map(|s| s.group.as_ref()).collect();
        let group = if !lost && !before.is_empty() && groups.len() < MAX_GROUPS && !self.streams.running.is_empty() {
            self.config.server_shards.add_group(&self.config.ring, &gained)
        } else {
            None
        };
        let Some(marker) = group else {
            info!(shards = ?self.shards.owned, "shards changed; restarting the server-sharded watches with the held shards");
            self.stop_streams();
            return self.open_streams(client, merged);
        };
        info!(gained = ?gained, "gained shards; watching their ranges alone, the other watches run on");
        // A group's list is one LIST from the watch cache, held whole, for a handoff's few
        // shards; a gain of more than a MAX_GROUP_SHARE-th of the ring is listed streamed,
        // object by object (one LIST of every shard of a large cluster is held whole in memory
        // until it is read: docs/performance.md, "Behind the code").
        let few = gained.len() * MAX_GROUP_SHARE <= self.config.ring.shards() as usize;
        let configs = self.configs(Some((&marker, few)));
        let background = gained.is_subset(&self.shards.background);
        let set = SetOf { covers: Some(gained.clone()), group: Some(marker), background };
        self.start_set(client, merged, &None, &configs, set, &mut None);
    }

    /// The watch configs of a set; a group's carry its marker as a field selector.
    /// `group`: a group's marker, and whether its list is held whole (a LIST) or streamed.
    fn configs(&self, group: Option<(&str, bool)>) -> Configs {
        // Streaming lists keep a list from being held whole, cluster-wide or of one namespace.
        // A group's list holds a few shards' objects: a LIST from the watch cache, answered at
        // once (a streaming list first waits for the cache to be known fresh, 0.8 s of a 1.4 s
        // handoff at 2,000 namespaces).
        // So do the watches of namespaces gained after the first sync, in namespace-scoped mode:
        // a LIST of one namespace is small, and the API server spends about twice the CPU on a
        // streaming list of one namespace as on a LIST and a watch (a handoff of 650 namespaces
        // on 2 cores: 6.1-8.7 s streamed, 4.3-4.9 s listed).
        let list = match group {
            Some((marker, true)) => cached_list_config().fields(marker),
            Some((marker, false)) => list_config(self.config.streaming_lists).fields(marker),
            None if self.config.namespaces.is_some() && self.shards.all_synced => cached_list_config(),
            None => list_config(self.config.streaming_lists),
        };
        let selector = self.config.resource_label_selector.as_ref().map(ToString::to_string);
        let selector = selector.filter(|s| !s.is_empty());
        let secrets = match &selector {
            Some(s) => list.clone().labels(s),
            None => list.clone(),
        };
        // The controller's own ConfigMaps (checkpoints of up to 1 MiB, saved every few seconds
        // under load) are left out by the API server rather than decoded here and dropped.
        let own = format!("!{INTERNAL_LABEL}");
        let configmaps = match &selector {
            Some(s) => list.clone().labels(&format!("{s},{own}")),
            None => list.clone().labels(&own),
        };
        Configs { list, secrets, configmaps }
    }

    /// Start the streams of every watched kind in `scope`.
    fn start_set(
        &mut self,
        client: &Client,
        merged: &mut Merged,
        scope: &Option<String>,
        configs: &Configs,
        set: SetOf,
        seeds: &mut Option<Seeds>,
    ) {
        if self.config.watch_configmaps {
            let stream = watch_kind::<SlimConfigMap>(client, scope, configs.configmaps.clone(), seeds);
            self.add_stream(merged, scope, &set, |id| tagged(id, stream, Incoming::ConfigMap));
        }
        if self.config.watch_secrets {
            let stream = watch_kind::<SlimSecret>(client, scope, configs.secrets.clone(), seeds);
            self.add_stream(merged, scope, &set, |id| tagged(id, stream, Incoming::Secret));
        }
        if self.config.csi {
            let stream = watch_kind::<SlimSpcPodStatus>(client, scope, configs.list.clone(), seeds);
            self.add_stream(merged, scope, &set, |id| tagged(id, stream, Incoming::SpcPodStatus));
            let stream = watch_kind::<SlimSecretProviderClass>(client, scope, configs.list.clone(), seeds);
            self.add_stream(merged, scope, &set, |id| tagged(id, stream, Incoming::SecretProviderClass));
        }
        for kind in self.config.workload_kinds.clone() {
            let (compactor, list) = (self.compactor.clone(), configs.list.clone());
            self.add_stream(merged, scope, &set, |id| match kind {
                WorkloadKind::Deployment => {
                    workload_stream::<SlimDeployment>(id, client, scope, &compactor, list, seeds)
                }
                WorkloadKind::DaemonSet => workload_stream::<SlimDaemonSet>(id, client, scope, &compactor, list, seeds),
                WorkloadKind::StatefulSet => {
                    workload_stream::<SlimStatefulSet>(id, client, scope, &compactor, list, seeds)
                }
                other => raw_workload_stream(id, other, client, scope, &compactor, list, seeds),
            });
        }
    }

    /// Register a stream and add it to `merged`, its initial list waiting for a permit.
    fn add_stream(
        &mut self,
        merged: &mut Merged,
        scope: &Option<String>,
        set: &SetOf,
        make: impl FnOnce(usize) -> BoxedTagged,
    ) {
        let id = self.streams.next_id;
        self.streams.next_id += 1;
        let stop = CancellationToken::new();
        let permits = if set.background { &self.streams.background_permits } else { &self.streams.list_permits };
        let stream = gated(make(id), permits.clone()).take_until(stop.clone().cancelled_owned());
        merged.push(Box::pin(stream));
        let state = StreamState {
            namespace: scope.clone(),
            covers: set.covers.clone(),
            group: set.group.clone(),
            synced_once: false,
            seen: None,
            stop,
            started: Instant::now(),
        };
        self.streams.running.insert(id, state);
        self.metrics.streams_started.inc();
        self.metrics.streams.set(self.streams.running.len() as i64);
    }
}

/// End a stream (and forget its group: every stream of a group stops together).
fn stop(server_shards: &crate::watch::ServerShards, state: &StreamState) {
    state.stop.cancel();
    if let Some(group) = &state.group {
        server_shards.remove_group(group);
    }
}
