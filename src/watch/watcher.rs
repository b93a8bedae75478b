//! The watch task: one watch per kind (cluster-wide, or one per namespace in namespace-scoped
//! mode), merged into one stream whose events this task alone applies to the store.
//!
//! ```text
//!  Namespaces (labels) ─┐
//!  ConfigMaps, Secrets ─┼─▶ filter to selected namespaces ─▶ Writer ─▶ Store (readers)
//!  Deployments, ...    ─┘                                      └──▶ changes: Change ─▶ reload
//! ```
//! A resource whose hash changes, appears or disappears is sent on `changes` (once every
//! stream has finished its first list; before that the engine reconciles the whole store).
//! Relists after `410 Gone` or a reconnect are diffed against the store, so a change that
//! happened while the watch was down is still sent.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Client, Resource};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::shard::{LabelSelector, NamespaceFilter, Ring};
use crate::watch::csi::CsiState;
use crate::watch::wire::{Compactor, SlimConfigMap, SlimSecret, SlimSecretProviderClass, SlimSpcPodStatus};
use crate::watch::{
    Annotations, Cause, Change, Metrics, ResourceKey, ResourceKind, ResourceState, ServerShards, Stored, Workload,
    WorkloadKey, WorkloadKind, Writer, looks_like_reloader,
};

mod bridge;
mod csi_events;
mod events;
mod list_watch;
mod namespaces;
mod opening;
mod seed;
mod standby;
mod streams;
mod unselected;

use namespaces::{namespace_stream, next_namespace_event};

use standby::Standby;
use streams::list_config;
pub use streams::streaming_lists_served;
use unselected::Unselected;

/// What to watch and what to keep.
#[derive(Clone, Debug)]
pub struct Config {
    /// `None`: cluster-wide watches. `Some`: one watch per listed namespace and nothing
    /// cluster-scoped, so a namespaced Role is enough.
    pub namespaces: Option<Vec<String>>,
    /// Namespace list, ignore list and selector (the selector only in cluster-wide mode).
    pub filter: NamespaceFilter,
    /// `--resource-label-selector`, applied by the API server to ConfigMaps and Secrets.
    pub resource_label_selector: Option<LabelSelector>,
    pub watch_configmaps: bool,
    pub watch_secrets: bool,
    /// Turns wire objects into stored forms (which annotation keys to keep).
    pub compactor: Compactor,
    /// Workload kinds to watch (`--ignored-workload-types` removes some; Rollouts and
    /// DeploymentConfigs only when enabled and served).
    pub workload_kinds: Vec<WorkloadKind>,
    /// Start watches with a streaming list where the API server serves them
    /// ([`streaming_lists_served`]); else with a LIST.
    pub streaming_lists: bool,
    /// Watch SecretProviderClassPodStatuses and SecretProviderClasses (`--enable-csi-integration`
    /// with the group served). The resource label selector does not apply to them: the driver
    /// labels nothing, so it would silently turn CSI reloads off (Reloader v1's bug).
    pub csi: bool,
    /// Namespace -> shard; only namespaces of owned shards are stored.
    pub ring: Arc<Ring>,
    /// The collections the API server filters by shard (probed at start; none without the
    /// `fnv-ranges` placement or the server's ShardedListAndWatch feature).
    pub server_shards: ServerShards,
}

/// The collections watched; a change (a kind whose RBAC was granted since the start, see
/// [`crate::watch::access`]) relists every watch with the new set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kinds {
    pub workload_kinds: Vec<WorkloadKind>,
    pub configmaps: bool,
    pub secrets: bool,
    pub csi: bool,
}

/// The watch task's channels to and from the other rooms.
pub struct Links {
    /// Shards this replica owns, from the lease room (constant without leases).
    pub owned: watch::Receiver<BTreeSet<u32>>,
    /// Of the owned shards, those that may load slowly (the hot standby): their initial lists
    /// take [`BACKGROUND_LISTS`] permits of their own, so they never crowd out the writes.
    pub background: watch::Receiver<BTreeSet<u32>>,
    /// Changes to the engine; the watch task is the only sender.
    pub changes: mpsc::Sender<Change>,
    /// The shards the store is complete for: `None` before the first full list, then the owned
    /// shards once every watch has listed them. The watch task is the only sender.
    pub synced: watch::Sender<Option<BTreeSet<u32>>>,
    /// Objects for the annotation lint (`None`: lint off). Never waited on: a full queue
    /// drops the message.
    pub lint: Option<mpsc::Sender<Stored>>,
    /// Workloads that record a `STAKATER_*` variable and were edited (a reference dropped,
    /// annotations changed), for the engine to look for orphaned variables (`None`: off).
    pub edits: Option<mpsc::UnboundedSender<WorkloadKey>>,
    /// The collections to watch, as the access checks find them; the runtime sends.
    pub kinds: watch::Receiver<Kinds>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The changes receiver is gone: the engine stopped. Not retryable.
    #[error("the reload engine stopped receiving changes")]
    EngineGone,
}

/// One incoming event, tagged with the stream it came from.
enum Incoming {
    ConfigMap(WatchEvent<SlimConfigMap>),
    Secret(WatchEvent<SlimSecret>),
    Workload(WorkloadKind, WatchEvent<Option<Workload>>),
    SpcPodStatus(WatchEvent<SlimSpcPodStatus>),
    SecretProviderClass(WatchEvent<SlimSecretProviderClass>),
}

type Tagged = (usize, Result<Incoming, watcher::Error>);
type BoxedTagged = Pin<Box<dyn Stream<Item = Tagged> + Send>>;
type Merged = futures::stream::SelectAll<BoxedTagged>;

/// Namespace and name of the objects a list has seen.
pub(crate) type Seen = HashSet<(Arc<str>, Arc<str>)>;

/// A stream's scope and whether it has completed a list since (re)start.
struct StreamState {
    namespace: Option<String>,
    /// Server-sharded: the shards its selector covers (its lists diff only their namespaces).
    covers: Option<BTreeSet<u32>>,
    /// Server-sharded: the group of a watch of gained shards only (see
    /// [`ServerShards::add_group`]).
    group: Option<String>,
    synced_once: bool,
    /// Objects seen by the list in progress, if one is.
    seen: Option<Seen>,
    /// Ends the stream (it then leaves the merged stream).
    stop: CancellationToken,
    /// When it started, for the log line of its first list.
    started: Instant,
}

impl StreamState {
    fn start_list(&mut self) {
        self.seen = Some(HashSet::new());
    }

    fn is_listing(&self) -> bool {
        self.seen.is_some()
    }

    fn saw(&mut self, namespace: &Arc<str>, name: &Arc<str>) {
        if let Some(seen) = self.seen.as_mut() {
            seen.insert((namespace.clone(), name.clone()));
        }
    }

    /// End the list: the scope it covered and what it saw; anything else in that scope is gone.
    fn finish_list(&mut self) -> Listed {
        if !self.synced_once {
            let objects = self.seen.as_ref().map_or(0, HashSet::len);
            debug!(namespace = ?self.namespace, group = ?self.group, objects, elapsed = ?self.started.elapsed(), "stream listed");
        }
        self.synced_once = true;
        Listed {
            namespace: self.namespace.clone(),
            covers: self.covers.clone(),
            seen: self.seen.take().unwrap_or_default(),
        }
    }
}

/// What a finished list covered and saw.
struct Listed {
    namespace: Option<String>,
    covers: Option<BTreeSet<u32>>,
    seen: Seen,
}

impl Listed {
    /// Whether the list covered every namespace (not one namespace, nor some shards alone).
    fn is_whole(&self) -> bool {
        self.namespace.is_none() && self.covers.is_none()
    }

    /// Whether the list covered the object's namespace and did not see the object.
    fn missed(&self, ring: &Ring, namespace: &Arc<str>, name: &Arc<str>) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == &**namespace)
            && self.covers.as_ref().is_none_or(|c| c.contains(&ring.shard_of(namespace)))
            && !self.seen.contains(&(namespace.clone(), name.clone()))
    }
}

/// Run the watches until `shutdown`, keeping `writer`'s store current with the objects of
/// selected namespaces in owned shards.
///
/// `links.changes` receives every resource whose data changed, appeared or disappeared once
/// the first list is done; `links.synced` says which shards the store is complete for. A gained
/// shard relists every watch (its objects load); a lost one is forgotten at once.
///
/// # Errors
/// [`Error::EngineGone`] when the receiver of `changes` is dropped. API errors are retried
/// with backoff and logged; they never end the task.
pub async fn run(
    client: Client,
    config: Config,
    writer: Writer,
    metrics: Metrics,
    links: Links,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let Links { mut owned, background, changes, synced, lint, edits, mut kinds } = links;
    let shards = Shards {
        owned: owned.borrow_and_update().clone(),
        background: background.borrow().clone(),
        synced_for: None,
        all_synced: false,
    };
    let mut task = WatchTask::new(config, writer, metrics, Out { changes, lint, edits }, shards);
    let use_namespace_watch = task.config.namespaces.is_none() && task.config.filter.needs_labels();
    let mut namespaces = use_namespace_watch.then(|| namespace_stream(client.clone(), task.config.streaming_lists));
    if let Some(ns_stream) = namespaces.as_mut() {
        // Objects can only be filtered once namespace labels are known.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = task.sync_namespaces(ns_stream) => {}
        }
    }
    let mut merged: Merged = futures::stream::SelectAll::new();
    let server_sharded = task.config.server_shards.active();
    if server_sharded {
        task.config.server_shards.select(&task.config.ring, &task.shards.owned);
    }
    task.open_streams(&client, &mut merged);
    // With no stream to start (no owned namespace in scoped mode) the store is complete now.
    task.publish_sync(&synced);
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            Ok(()) = kinds.changed() => {
                let now = kinds.borrow_and_update().clone();
                task.watch_kinds(now, &client, &mut merged);
                task.publish_sync(&synced);
            }
            Some(event) = next_namespace_event(&mut namespaces) => {
                if task.apply_namespace_event(event) {
                    info!("namespace selection gained namespaces; relisting watches");
                    task.stop_streams();
                    task.open_streams(&client, &mut merged);
                }
            }
            Ok(()) = owned.changed() => {
                let now_owned = owned.borrow_and_update().clone();
                task.shards.background = background.borrow().clone();
                task.follow_ownership(now_owned, server_sharded, &synced, &client, &mut merged);
                task.publish_sync(&synced);
            }
            Some((stream, item)) = merged.next() => {
                match item {
                    Ok(incoming) => task.apply(stream, incoming).await?,
                    Err(err) => {
                        task.metrics.watch_errors.inc();
                        warn!(error = %err, "watch failed; retrying with backoff");
                    }
                }
                task.publish_sync(&synced);
                task.release_loaded().await?;
            }
        }
    }
}

/// Initial lists running at once. Namespace-scoped mode opens thousands of watches when it
/// takes up shards; starting them all at once stalls the API server (and the Lease renewals
/// waiting behind them). Streaming lists take about as long as LISTs here: each waits in the
/// server for its watch cache to be known fresh. 128 at once started 16,000 watches in 33 s
/// instead of 53, but three replicas doing so starved their Lease renewals on 2 cores.
const CONCURRENT_LISTS: usize = 32;

/// Initial lists running at once for the hot standby. Its lists are no hurry, and 32 of them at
/// once kept the API server busy enough that the writes of updates right after a departure
/// waited behind them (figures: docs/performance.md, "Behind the code").
pub(super) const BACKGROUND_LISTS: usize = 4;

struct WatchTask {
    config: Config,
    compactor: Compactor,
    writer: Writer,
    metrics: Metrics,
    /// Where changes and stored objects go.
    out: Out,
    /// What is known of each namespace, and what waits for one to load.
    namespaces: Namespaces,
    /// The running watch streams and the permits their lists take.
    streams: Streams,
    /// The shards this task loads, and how far it got.
    shards: Shards,
    /// ConfigMaps and Secrets of owned namespaces outside the label selection: the baseline of
    /// a namespace labelled in.
    unselected: Unselected,
    /// Objects of other replicas' shards, where the watches decode them anyway (see
    /// [`WatchTask::stands_by`]): a gained shard is loaded from here, without a relist.
    standby: Standby,
    /// Whether the standby is kept (decided at start).
    keeps_standby: bool,
    /// Pod statuses and classes of the Secrets Store CSI driver, folded into one resource
    /// per SecretProviderClass.
    csi: CsiState,
    /// Whether gained namespaces may be seeded from cluster-wide lists (see [`seed`]).
    seed_refused: seed::SeedRefused,
}

/// Where the watch task's results go (see [`Links`]).
struct Out {
    changes: mpsc::Sender<Change>,
    lint: Option<mpsc::Sender<Stored>>,
    edits: Option<mpsc::UnboundedSender<WorkloadKey>>,
}

#[derive(Default)]
struct Namespaces {
    /// Every namespace seen, and whether its labels pass the namespace filter (the labels
    /// themselves are not kept: a map of them per namespace grows with every namespace).
    labelled: HashMap<String, bool>,
    selected: HashSet<String>,
    /// Namespaces that joined the selection while the watches relist to load them.
    loading: HashSet<String>,
    /// Changes in `loading` namespaces, held until they are loaded.
    deferred: Vec<Change>,
}

struct Streams {
    /// Running streams by id; an item of an id not here is from a stopped stream.
    running: HashMap<usize, StreamState>,
    next_id: usize,
    list_permits: Arc<Semaphore>,
    /// See [`BACKGROUND_LISTS`].
    background_permits: Arc<Semaphore>,
}

struct Shards {
    /// Shards owned now.
    owned: BTreeSet<u32>,
    /// Of those, the ones that may load slowly: see [`Links::background`].
    background: BTreeSet<u32>,
    /// Shards the store is complete for.
    synced_for: Option<BTreeSet<u32>>,
    /// Whether the first full list is done (later lists are diffed and sent as changes).
    all_synced: bool,
}

impl WatchTask {
    fn new(config: Config, writer: Writer, metrics: Metrics, out: Out, shards: Shards) -> Self {
        // Where the watches decode every object of the cluster anyway (cluster-wide, not
        // filtered by the API server, whose filtering was probed before this task starts), they
        // keep other replicas' shards too. CSI pod statuses are folded as they arrive, so with
        // CSI a gained shard relists as before.
        let keeps_standby = config.namespaces.is_none() && !config.server_shards.active() && !config.csi;
        WatchTask {
            compactor: config.compactor.clone(),
            config,
            writer,
            metrics,
            out,
            namespaces: Namespaces::default(),
            streams: Streams {
                running: HashMap::new(),
                next_id: 0,
                list_permits: Arc::new(Semaphore::new(CONCURRENT_LISTS)),
                background_permits: Arc::new(Semaphore::new(BACKGROUND_LISTS)),
            },
            shards,
            unselected: Unselected::default(),
            standby: Standby::default(),
            keeps_standby,
            csi: CsiState::default(),
            seed_refused: seed::SeedRefused::default(),
        }
    }

    /// The collections to watch changed (a kind granted or taken away): relist every watch.
    fn watch_kinds(&mut self, now: Kinds, client: &Client, merged: &mut Merged) {
        info!(kinds = ?now.workload_kinds, configmaps = now.configmaps, secrets = now.secrets, csi = now.csi,
            "the collections watched changed; relisting watches");
        self.config.workload_kinds = now.workload_kinds;
        self.config.watch_configmaps = now.configmaps;
        self.config.watch_secrets = now.secrets;
        self.config.csi = now.csi;
        self.stop_streams();
        self.open_streams(client, merged);
    }

    /// The shards held changed: load the gained ones and forget the lost, the way this mode
    /// watches.
    fn follow_ownership(
        &mut self,
        now_owned: BTreeSet<u32>,
        server_sharded: bool,
        synced: &watch::Sender<Option<BTreeSet<u32>>>,
        client: &Client,
        merged: &mut Merged,
    ) {
        let before = self.shards.owned.clone();
        let gained = self.apply_ownership(now_owned, synced);
        if server_sharded {
            // The API server sends the held shards only.
            self.follow_server_shards(client, merged, &before);
            return;
        }
        if gained && self.config.namespaces.is_none() && !self.keeps_standby {
            // One watch covers every namespace: it relists to load the gained ones.
            info!(shards = ?self.shards.owned, "gained shards; relisting watches to load them");
            self.stop_streams();
        }
        // Namespace-scoped: only the gained namespaces' watches start (and lost ones stop).
        self.open_streams(client, merged);
    }

    async fn apply(&mut self, stream: usize, incoming: Incoming) -> Result<(), Error> {
        if !self.streams.running.contains_key(&stream) {
            return Ok(()); // from a stream just stopped
        }
        match incoming {
            Incoming::ConfigMap(WatchEvent::InitApply(cm) | WatchEvent::Apply(cm) | WatchEvent::Delete(cm))
                if Compactor::is_internal(&cm) =>
            {
                Ok(())
            }
            Incoming::ConfigMap(event) => {
                let compactor = self.compactor.clone();
                self.apply_resource_event(stream, ResourceKind::ConfigMap, event, |cm| {
                    (cm.metadata.namespace.clone(), cm.metadata.name.clone(), compactor.configmap(cm))
                })
                .await
            }
            Incoming::Secret(event) => {
                let compactor = self.compactor.clone();
                self.apply_resource_event(stream, ResourceKind::Secret, event, |s| {
                    (s.metadata.namespace.clone(), s.metadata.name.clone(), compactor.secret(s))
                })
                .await
            }
            Incoming::Workload(kind, event) => {
                self.apply_workload_event(stream, kind, event);
                Ok(())
            }
            Incoming::SpcPodStatus(event) => self.apply_pod_status_event(stream, event).await,
            Incoming::SecretProviderClass(event) => {
                self.apply_class_event(stream, event);
                Ok(())
            }
        }
    }

    async fn apply_resource_event<K>(
        &mut self,
        stream: usize,
        kind: ResourceKind,
        event: WatchEvent<K>,
        compact: impl Fn(&K) -> (Option<String>, Option<String>, ResourceState),
    ) -> Result<(), Error>
    where
        K: Resource,
    {
        // The first list of all is reconciled by the engine as a whole; later lists send only
        // what differs from the store. A resource a list finds new (a shard or namespace just
        // gained) is not a change: its first change carries the store's hash as baseline. This
        // keeps a relist of thousands of objects from flooding the engine (and the watch task
        // from stalling on it while the API server waits for it to read).
        let emit = self.stream(stream).synced_once || self.shards.all_synced;
        match event {
            WatchEvent::Init => self.stream(stream).start_list(),
            WatchEvent::InitApply(obj) | WatchEvent::Apply(obj) => {
                let cause = if self.stream(stream).is_listing() { Cause::Listed } else { Cause::Event };
                let (Some(namespace), Some(name), state) = compact(&obj) else {
                    return Ok(());
                };
                self.metrics.events_received.with_label_values(&["update", kind.plural()]).inc();
                let key = ResourceKey { kind, namespace: namespace.into(), name: name.into() };
                if !self.is_selected(&key.namespace) {
                    if self.is_foreign(&key.namespace) && self.stands_by(&key.namespace) {
                        self.stream(stream).saw(&key.namespace, &key.name);
                        self.standby.keep_resource(key, state);
                    } else if self.keeps_unselected(&key.namespace) {
                        self.stream(stream).saw(&key.namespace, &key.name);
                        self.unselected.observe(key, state, obj.meta().resource_version.as_deref());
                    }
                    return Ok(());
                }
                self.stream(stream).saw(&key.namespace, &key.name);
                self.lint_resource(&key, obj.meta());
                let previous = self.writer.store().resource(&key).map(|p| p.hash);
                let new_here = previous.is_none() && cause == Cause::Event;
                if new_here {
                    self.writer.apply_created_resource(key.clone(), state.clone());
                } else {
                    self.writer.apply_resource(key.clone(), state.clone());
                }
                if emit && (new_here || previous.is_some_and(|p| p != state.hash)) {
                    self.send(Change { key, observed: Some(state.hash), previous, cause }).await?;
                }
            }
            WatchEvent::Delete(obj) => {
                let (Some(namespace), Some(name), _) = compact(&obj) else {
                    return Ok(());
                };
                self.metrics.events_received.with_label_values(&["delete", kind.plural()]).inc();
                let key = ResourceKey { kind, namespace: namespace.into(), name: name.into() };
                self.unselected.remove(&key);
                self.standby.remove_resource(&key);
                if let Some(gone) = self.writer.delete_resource(&key)
                    && emit
                {
                    self.send(Change { key, observed: None, previous: Some(gone.hash), cause: Cause::Event }).await?;
                }
            }
            WatchEvent::InitDone => self.resources_listed(stream, kind, emit).await?,
        }
        Ok(())
    }

    /// A list of `kind` is done: what it did not find is gone (a deletion while no watch ran),
    /// from the store, the unselected namespaces' and the standby's.
    async fn resources_listed(&mut self, stream: usize, kind: ResourceKind, emit: bool) -> Result<(), Error> {
        let listed = self.stream(stream).finish_list();
        let ring = self.config.ring.clone();
        if listed.namespace.is_none() {
            self.unselected.retain_listed(kind, |ns, name| !listed.missed(&ring, ns, name));
        }
        if listed.is_whole() {
            self.standby.retain_listed_resources(kind, &listed.seen);
        }
        for key in self.writer.store().resource_keys(kind, listed.namespace.as_deref()) {
            if listed.missed(&ring, &key.namespace, &key.name)
                && let Some(gone) = self.writer.delete_resource(&key)
                && emit
            {
                self.send(Change { key, observed: None, previous: Some(gone.hash), cause: Cause::Listed }).await?;
            }
        }
        Ok(())
    }

    fn apply_workload_event(&mut self, stream: usize, kind: WorkloadKind, event: WatchEvent<Option<Workload>>) {
        match event {
            WatchEvent::Init => self.stream(stream).start_list(),
            WatchEvent::InitApply(Some(w)) | WatchEvent::Apply(Some(w)) => {
                if !self.is_selected(&w.key.namespace) {
                    if self.is_foreign(&w.key.namespace) && self.stands_by(&w.key.namespace) {
                        self.stream(stream).saw(&w.key.namespace, &w.key.name);
                        self.standby.keep_workload(Arc::new(w));
                    }
                    return;
                }
                self.stream(stream).saw(&w.key.namespace, &w.key.name);
                let edited = self.workload_edited(&w).then(|| w.key.clone());
                self.writer.apply_workload(w);
                // After the store has the edit: the engine reads the workload from there.
                if let Some(key) = edited {
                    self.tell_edited(key);
                }
            }
            WatchEvent::Delete(Some(w)) => {
                self.standby.remove_workload(&w.key);
                self.writer.delete_workload(&w.key);
            }
            WatchEvent::InitApply(None) | WatchEvent::Apply(None) | WatchEvent::Delete(None) => {}
            WatchEvent::InitDone => {
                let listed = self.stream(stream).finish_list();
                if listed.is_whole() {
                    self.standby.retain_listed_workloads(kind, &listed.seen);
                }
                for key in self.writer.workload_keys(kind, listed.namespace.as_deref()) {
                    if listed.missed(&self.config.ring, &key.namespace, &key.name) {
                        self.writer.delete_workload(&key);
                    }
                }
            }
        }
    }

    /// Before `w` replaces the stored version: tell the lint about annotations that changed;
    /// true if the engine is to hear of it: it records a variable and dropped a reference or
    /// changed annotations (the variable may be orphaned now).
    fn workload_edited(&self, w: &Workload) -> bool {
        if self.out.lint.is_none() && self.out.edits.is_none() {
            return false;
        }
        let before = self.writer.store().workload(&w.key);
        let annotated = before
            .as_ref()
            .is_none_or(|b| b.annotations != w.annotations || b.template.annotations != w.template.annotations);
        if annotated && (!w.annotations.is_empty() || !w.template.annotations.is_empty()) {
            self.to_lint(Stored::Workload(w.key.clone()));
        }
        let Some(before) = before.filter(|_| self.out.edits.is_some()) else { return false };
        let dropped = || before.template.references().any(|r| !w.template.references().any(|now| now == r));
        w.template.records_a_variable() && (annotated || dropped())
    }

    /// Tell the engine to look at `key` for orphaned variables (with the option on).
    fn tell_edited(&self, key: WorkloadKey) {
        if let Some(edits) = &self.out.edits {
            // Only the engine's end of the channel is dropped, when it stops.
            let _ = edits.send(key);
        }
    }

    /// Tell the lint about a stored resource with annotations that look like Reloader's.
    fn lint_resource(&self, key: &ResourceKey, meta: &kube::api::ObjectMeta) {
        if self.out.lint.is_none() {
            return;
        }
        let annotations: Annotations = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| looks_like_reloader(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !annotations.is_empty() {
            let uid = meta.uid.clone().unwrap_or_default();
            self.to_lint(Stored::Resource { key: key.clone(), uid, annotations });
        }
    }

    /// Pass a stored object to the lint, never waiting: a full queue drops it (counted).
    fn to_lint(&self, stored: Stored) {
        let Some(lint) = &self.out.lint else { return };
        let result = if lint.try_send(stored).is_ok() { "sent" } else { "dropped" };
        self.metrics.lint_queued.with_label_values(&[result]).inc();
    }

    /// The state of a running stream; `apply` checked that it runs.
    fn stream(&mut self, id: usize) -> &mut StreamState {
        self.streams.running.entry(id).or_insert_with(|| StreamState {
            namespace: None,
            covers: None,
            group: None,
            synced_once: false,
            seen: None,
            stop: CancellationToken::new(),
            started: Instant::now(),
        })
    }

    async fn send(&mut self, change: Change) -> Result<(), Error> {
        let key = &change.key;
        if self.namespaces.loading.contains(&*key.namespace) {
            debug!(kind = key.kind.kind(), namespace = %key.namespace, name = %key.name, "resource changed; held until the namespace is loaded");
            self.namespaces.deferred.push(change);
            return Ok(());
        }
        let hash = change.observed.map(|h| h.to_string()).unwrap_or_default();
        debug!(kind = key.kind.kind(), namespace = %key.namespace, name = %key.name, hash, "resource changed");
        self.out.changes.send(change).await.map_err(|_| Error::EngineGone)
    }

    /// Once every watch has listed, the namespaces that joined are loaded: send the changes
    /// held back for them (before that their workloads might not be stored yet, and a change
    /// would find nothing to reload).
    async fn release_loaded(&mut self) -> Result<(), Error> {
        if self.namespaces.loading.is_empty() || !self.streams.running.values().all(|s| s.synced_once) {
            return Ok(());
        }
        let joined = std::mem::take(&mut self.namespaces.loading);
        // A workload of a namespace that joined may record a variable of a resource it
        // stopped using while no one served it: the engine looks at it as at an edit.
        if self.out.edits.is_some() {
            let recording = self
                .writer
                .store()
                .find_workloads(|w| w.template.records_a_variable() && joined.contains(&*w.key.namespace));
            for workload in recording {
                self.tell_edited(workload.key.clone());
            }
        }
        for change in std::mem::take(&mut self.namespaces.deferred) {
            self.send(change).await?;
        }
        Ok(())
    }
}
