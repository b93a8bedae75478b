//! The watch streams the task merges: one per kind and scope, each tagged with its id, gated
//! so that only a few first lists run at once.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::seed::Seeds;
use super::{BoxedTagged, Incoming, list_watch};
use crate::watch::WorkloadKind;
use crate::watch::wire::{Compactor, SlimRaw, SlimWorkload};

/// Where the API server serves them, the initial state comes as a streaming list (a watch with
/// `sendInitialEvents`, served from the watch cache, as client-go's informers do with
/// WatchList): objects arrive one by one and are compacted as they come, so a list of large
/// objects is never held whole (a LIST buffers every object of its answer before the first is
/// compacted). Elsewhere a LIST in pages of 500: kube sends no resourceVersion 0 with a
/// limit, so each page is a consistent read, held one at a time.
pub(super) fn list_config(streaming: bool) -> watcher::Config {
    if streaming { watcher::Config::default().streaming_lists() } else { watcher::Config::default().any_semantic() }
}

/// A LIST answered from the watch cache at once (resourceVersion 0, so no limit: kube drops
/// the 0 from a paged LIST), for the lists of what a running replica gains: a few shards'
/// objects, or one namespace's. Paged, each page was a consistent read that first waited for
/// the cache to be known fresh, one round trip after another, so a handoff's heir waited many
/// times a LIST's time (docs/performance.md, "Behind the code").
pub(super) fn cached_list_config() -> watcher::Config {
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    config
}

/// How long the probe waits for the end of the initial events.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the API server serves streaming lists (the WatchList feature, on by default in
/// recent Kubernetes): a watch with `sendInitialEvents` of the ConfigMaps of `namespace` ends
/// its initial events with the marked bookmark within a few seconds. A server without it
/// refuses the parameter, or ignores it and never sends that bookmark; then the watches LIST.
pub async fn streaming_lists_served(client: &Client, namespace: &str) -> bool {
    use futures::TryStreamExt;
    use kube::api::WatchParams;
    use kube::core::WatchEvent as RawEvent;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
    let params = WatchParams { send_initial_events: true, bookmarks: true, ..WatchParams::default() }.timeout(5);
    let probe = async {
        let mut stream = api.watch_metadata(&params, "0").await.ok()?.boxed();
        while let Some(event) = stream.try_next().await.ok()? {
            if let RawEvent::Bookmark(mark) = event
                && mark.metadata.annotations.contains_key("k8s.io/initial-events-end")
            {
                return Some(());
            }
        }
        None
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe).await.ok().flatten().is_some()
}

/// The events of `K` in `namespace` (or cluster-wide); a namespace's first list comes from
/// `seeds` when given.
pub(super) fn watch_kind<K>(
    client: &Client,
    namespace: &Option<String>,
    config: watcher::Config,
    seeds: &mut Option<Seeds>,
) -> impl Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let seed = seeds.as_mut().filter(|_| namespace.is_some()).map(|s| s.of(Api::all(client.clone()), &config));
    list_watch::watcher(api, config, seed).default_backoff()
}

pub(super) fn workload_stream<K: SlimWorkload>(
    id: usize,
    client: &Client,
    scope: &Option<String>,
    compactor: &Compactor,
    list: watcher::Config,
    seeds: &mut Option<Seeds>,
) -> BoxedTagged {
    let compactor = compactor.clone();
    let stream = watch_kind::<K>(client, scope, list, seeds)
        .map(move |r| r.map(|e| map_event(e, |object| compactor.compact(&object))));
    Box::pin(stream.map(move |item| (id, item.map(|e| Incoming::Workload(K::KIND, e)))))
}

/// A workload kind read as [`SlimRaw`], its API resource from the kind table.
pub(super) fn raw_workload_stream(
    id: usize,
    kind: WorkloadKind,
    client: &Client,
    scope: &Option<String>,
    compactor: &Compactor,
    list: watcher::Config,
    seeds: &mut Option<Seeds>,
) -> BoxedTagged {
    let resource = kind.api_resource();
    let api: Api<SlimRaw> = match scope {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let seed =
        seeds.as_mut().filter(|_| scope.is_some()).map(|s| s.of(Api::all_with(client.clone(), &resource), &list));
    let compactor = compactor.clone();
    let stream = list_watch::watcher(api, list, seed)
        .default_backoff()
        .map(move |r| r.map(|e| map_event(e, |object| compactor.compact_raw(kind, &object))));
    Box::pin(stream.map(move |item| (id, item.map(|e| Incoming::Workload(kind, e)))))
}

pub(super) fn tagged<K: 'static, S>(id: usize, stream: S, wrap: fn(WatchEvent<K>) -> Incoming) -> BoxedTagged
where
    S: Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send + 'static,
{
    Box::pin(stream.map(move |item| (id, item.map(wrap))))
}

/// Hold back `stream` until a list permit is free, and keep the permit until its first list
/// is done (or failed: the watcher's retries then go ungated).
pub(super) fn gated(stream: BoxedTagged, permits: Arc<Semaphore>) -> BoxedTagged {
    enum Gate {
        Waiting(BoxedTagged, Arc<Semaphore>),
        Listing(BoxedTagged, OwnedSemaphorePermit),
        Open(BoxedTagged),
    }
    Box::pin(futures::stream::unfold(Gate::Waiting(stream, permits), |gate| async move {
        let (mut stream, permit) = match gate {
            // A closed semaphore never happens (it lives as long as the task); go ungated.
            Gate::Waiting(stream, permits) => (stream, permits.acquire_owned().await.ok()),
            Gate::Listing(stream, permit) => (stream, Some(permit)),
            Gate::Open(stream) => (stream, None),
        };
        let item = stream.next().await?;
        let listed = matches!(
            &item.1,
            Err(_)
                | Ok(Incoming::ConfigMap(WatchEvent::InitDone)
                    | Incoming::Secret(WatchEvent::InitDone)
                    | Incoming::Workload(_, WatchEvent::InitDone)
                    | Incoming::SpcPodStatus(WatchEvent::InitDone)
                    | Incoming::SecretProviderClass(WatchEvent::InitDone))
        );
        let next = match permit {
            Some(permit) if !listed => Gate::Listing(stream, permit),
            _ => Gate::Open(stream),
        };
        Some((item, next))
    }))
}

pub(super) fn map_event<A, B>(event: WatchEvent<A>, f: impl FnOnce(A) -> B) -> WatchEvent<B> {
    match event {
        WatchEvent::Apply(a) => WatchEvent::Apply(f(a)),
        WatchEvent::Delete(a) => WatchEvent::Delete(f(a)),
        WatchEvent::Init => WatchEvent::Init,
        WatchEvent::InitApply(a) => WatchEvent::InitApply(f(a)),
        WatchEvent::InitDone => WatchEvent::InitDone,
    }
}
