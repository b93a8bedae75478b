//! Namespace-scoped mode, when a running replica gains many namespaces at once (a handoff): one
//! cluster-wide LIST per kind, split by namespace, is the initial list of every gained
//! namespace's watch, which then watches from that list's resourceVersion. Listing each
//! namespace instead is a LIST per namespace and kind, about 2,300 for a third of 2,000
//! namespaces, queued 32 at a time on an API server that is also moving Leases: such a
//! handoff took 4.6-5.6 s, seeded 2.5-4.3 s (the rest is opening the watches).
//!
//! The seed's resourceVersion starts a bridge (see `bridge`): a cluster-wide watch that feeds
//! the gained namespaces their events until each has opened its own, so that a gained
//! namespace counts as loaded as soon as its seed is stored: 0.67-1.4 s against 1.4-2.2 s
//! seeded alone, alternating on one control plane (loadtest/README.md).
//!
//! The cluster-wide LIST needs a ClusterRole that namespace-scoped mode does not: when it is
//! refused (403), the watches list their namespaces one by one, and no later gain tries again.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::bridge::{Bridge, Feed};
use super::events::watch_params;

/// Gained namespaces at least, for a seed: below, their own LISTs are few.
pub(super) const SEED_MIN_NAMESPACES: usize = 16;

/// Bridged namespaces opening their own watches at once, per batch of gained namespaces: as
/// many as initial lists run at once (all at once, a handoff's thousands of opens held the
/// Lease calls of the fleet behind them for seconds).
const OPENS_AT_ONCE: usize = 32;

/// One kind's objects of the gained namespaces, as one list found them.
pub(super) struct Seed<K> {
    version: String,
    objects: Mutex<HashMap<String, Vec<K>>>,
    /// `None` if the bridge watch did not open.
    bridge: Option<Arc<Bridge<K>>>,
}

impl<K> Seed<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// The objects of `namespace` (each namespace takes its own once), the list's
    /// resourceVersion, and the namespace's feed from the bridge, if there is one (else its
    /// watch starts at that resourceVersion).
    pub fn take(&self, namespace: &str) -> (Vec<K>, String, Option<Feed<K>>) {
        let mut objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        let feed = self.bridge.as_ref().and_then(|b| b.take(namespace));
        (objects.remove(namespace).unwrap_or_default(), self.version.clone(), feed)
    }
}

/// The list, shared by the watches of the gained namespaces; `None` when it failed (they then
/// list their namespaces).
pub(super) type SeedFuture<K> = Shared<BoxFuture<'static, Option<Arc<Seed<K>>>>>;

/// Whether the seeds' cluster-wide LIST was refused, once for the process.
#[derive(Clone, Default)]
pub(super) struct SeedRefused(Arc<AtomicBool>);

impl SeedRefused {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Start (on first poll) the cluster-wide LIST of `api`'s kind with `config`'s selectors, from
/// the watch cache, keeping the objects of `namespaces` only.
pub(super) fn seed<K>(
    api: Api<K>,
    config: &watcher::Config,
    namespaces: Arc<HashSet<String>>,
    refused: SeedRefused,
    opens: Arc<Semaphore>,
) -> SeedFuture<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // resourceVersion 0 with no limit: one answer from the watch cache, as the per-namespace
    // lists it replaces (see `cached_list_config`). It holds one kind's objects of the cluster
    // at once, as a cluster-wide watch's relist does.
    let params = ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        ..ListParams::default()
    }
    .match_any();
    let kind = api.resource_url().to_string();
    let watch = watch_params(config, false);
    async move {
        match api.list(&params).await {
            Ok(list) => {
                let version = list.metadata.resource_version.filter(|v| !v.is_empty())?;
                let mut objects: HashMap<String, Vec<K>> = HashMap::new();
                let listed = list.items.len();
                for object in list.items {
                    if let Some(ns) = object.namespace().filter(|ns| namespaces.contains(ns)) {
                        objects.entry(ns).or_default().push(object);
                    }
                }
                let kept: usize = objects.values().map(Vec::len).sum();
                let bridge = Bridge::start(api, watch, version.clone(), namespaces.iter().cloned(), opens).await;
                info!(
                    kind,
                    listed,
                    kept,
                    namespaces = namespaces.len(),
                    bridged = bridge.is_some(),
                    "gained namespaces seeded from one list"
                );
                Some(Arc::new(Seed { version, objects: Mutex::new(objects), bridge }))
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                refused.0.store(true, Ordering::Relaxed);
                info!(kind, "cluster-wide list refused; gained namespaces are listed one by one");
                None
            }
            Err(err) => {
                warn!(kind, error = %err, "cluster-wide list for gained namespaces failed; listing them one by one");
                None
            }
        }
    }
    .boxed()
    .shared()
}

/// The seeds of one batch of gained namespaces: a list per kind, started on first use.
pub(super) struct Seeds {
    namespaces: Arc<HashSet<String>>,
    refused: SeedRefused,
    lists: HashMap<String, Box<dyn Any + Send>>,
    /// Paces the bridged namespaces' own watches, over every kind.
    opens: Arc<Semaphore>,
}

impl Seeds {
    pub fn new(namespaces: HashSet<String>, refused: SeedRefused) -> Self {
        let opens = Arc::new(Semaphore::new(OPENS_AT_ONCE));
        Seeds { namespaces: Arc::new(namespaces), refused, lists: HashMap::new(), opens }
    }

    /// The seed of `all`'s kind (a cluster-wide `Api`), listed with `config`'s selectors.
    pub fn of<K>(&mut self, all: Api<K>, config: &watcher::Config) -> SeedFuture<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let url = all.resource_url().to_string();
        if let Some(seed) = self.lists.get(&url).and_then(|s| s.downcast_ref::<SeedFuture<K>>()) {
            return seed.clone();
        }
        let seed = seed(all, config, self.namespaces.clone(), self.refused.clone(), self.opens.clone());
        self.lists.insert(url, Box::new(seed.clone()));
        seed
    }
}
