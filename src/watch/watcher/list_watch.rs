//! List, then watch, as kube's `watcher` does: the same events (`Init`, `InitApply`...,
//! `InitDone`, then `Apply` and `Delete`), the same errors and recovery (a watch that ends resumes
//! from its last resourceVersion, `410 Gone` lists again) and the same `watcher::Config`. What
//! differs is memory: kube reads each watch through a line reader that keeps 8 KiB for good,
//! which thousands of namespace-scoped watches multiply (docs/performance.md, "Behind the
//! code"); here a watch holds a buffer only while a line is incomplete.

use std::collections::VecDeque;
use std::fmt::Debug;

use futures::Stream;
use kube::api::{ListParams, VersionMatch};
use kube::core::WatchEvent;
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::bridge::Feed;
use super::events::{Events, watch_params};
use super::seed::SeedFuture;

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

type Item<K> = Result<Event<K>, watcher::Error>;

/// The events of `api`'s objects, from a full list on: a drop-in for `kube::runtime::watcher`.
/// With a seed, its first list is the seed's objects of `api`'s namespace (see `seed`).
pub(super) fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    seed: Option<SeedFuture<K>>,
) -> impl Stream<Item = Item<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let client = api.clone().into_client();
    let start = seed.map_or(State::Empty, State::Seeded);
    futures::stream::unfold((api, client, config, start), |(api, client, config, mut state)| async move {
        loop {
            let (item, next) = step(&api, &client, &config, state).await;
            state = next;
            if let Some(item) = item {
                return Some((item, (api, client, config, state)));
            }
        }
    })
}

enum State<K> {
    /// Nothing known: list (or open a streaming list) next.
    Empty,
    /// The first list is a seed's, once it is listed (if it fails, as `Empty`).
    Seeded(SeedFuture<K>),
    /// Paging through the list: objects of the page left to send, where the next page starts,
    /// and the list's resourceVersion.
    Page {
        objects: VecDeque<K>,
        continue_token: Option<String>,
        version: Option<String>,
    },
    /// A seed's objects left to send, and the watch already open from the seed's version.
    SeedPage(VecDeque<K>, String, Events<K>),
    /// A seed's objects left to send, then the bridge's events (see `bridge`).
    BridgedPage(VecDeque<K>, Feed<K>),
    /// Fed by the bridge until this namespace's turn to open its own watch.
    Bridged(Feed<K>),
    /// Left the bridge at `version`: the events it sent up to there, then the watch from there,
    /// opened while holding the turn.
    Opening {
        version: String,
        left: VecDeque<Event<K>>,
        turn: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// A streaming list, until the bookmark that ends its initial events.
    InitialEvents(Events<K>),
    /// Listed (or watched) up to this resourceVersion: watch from it.
    Listed(String),
    Watching(String, Events<K>),
}

/// One step: at most one item, and the state after it.
async fn step<K>(
    api: &Api<K>,
    client: &Client,
    config: &watcher::Config,
    state: State<K>,
) -> (Option<Item<K>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    use watcher::Error::WatchStartFailed;
    match state {
        State::Empty => match config.initial_list_strategy {
            InitialListStrategy::ListWatch => {
                (Some(Ok(Event::Init)), State::Page { objects: VecDeque::new(), continue_token: None, version: None })
            }
            InitialListStrategy::StreamingList => {
                match Events::open(api, client, &watch_params(config, true), "0").await {
                    Ok(events) => (Some(Ok(Event::Init)), State::InitialEvents(events)),
                    Err(err) => (Some(Err(WatchStartFailed(err))), State::Empty),
                }
            }
        },
        // The watch opens before the seed's objects are sent, so that the initial list is done
        // only once events flow, and the list permits pace the watches' opening as they pace
        // lists: a handoff's thousands of seeded watches, all opened at once, held the Lease
        // calls of the fleet behind them for seconds.
        // With a bridge, the namespace is loaded at once and fed by the bridge meanwhile.
        State::Seeded(seed) => match (seed.await, api.namespace()) {
            (Some(seed), Some(namespace)) => match seed.take(namespace) {
                (objects, _, Some(feed)) => (Some(Ok(Event::Init)), State::BridgedPage(objects.into(), feed)),
                (objects, version, None) => {
                    match Events::open(api, client, &watch_params(config, false), &version).await {
                        Ok(events) => (Some(Ok(Event::Init)), State::SeedPage(objects.into(), version, events)),
                        Err(err) => (Some(Err(WatchStartFailed(err))), State::Empty),
                    }
                }
            },
            _ => (None, State::Empty),
        },
        State::SeedPage(mut objects, version, events) => match objects.pop_front() {
            Some(object) => (Some(Ok(Event::InitApply(object))), State::SeedPage(objects, version, events)),
            None => (Some(Ok(Event::InitDone)), State::Watching(version, events)),
        },
        State::BridgedPage(mut objects, feed) => match objects.pop_front() {
            Some(object) => (Some(Ok(Event::InitApply(object))), State::BridgedPage(objects, feed)),
            None => (Some(Ok(Event::InitDone)), State::Bridged(feed)),
        },
        State::Bridged(feed) => bridged(feed).await,
        State::Opening { version, mut left, turn } => match left.pop_front() {
            Some(event) => (Some(Ok(event)), State::Opening { version, left, turn }),
            None => match Events::open(api, client, &watch_params(config, false), &version).await {
                Ok(events) => (None, State::Watching(version, events)),
                Err(err) => (Some(Err(WatchStartFailed(err))), State::Listed(version)),
            },
        },
        State::Page { objects, continue_token, version } => page(api, config, objects, continue_token, version).await,
        State::InitialEvents(events) => initial_event(config, events).await,
        State::Listed(version) => match Events::open(api, client, &watch_params(config, false), &version).await {
            Ok(events) => (None, State::Watching(version, events)),
            Err(err) => (Some(Err(WatchStartFailed(err))), State::Listed(version)),
        },
        State::Watching(version, events) => watch_event(config, version, events).await,
    }
}

/// The next object of a listed page, or the next page.
async fn page<K>(
    api: &Api<K>,
    config: &watcher::Config,
    mut objects: VecDeque<K>,
    continue_token: Option<String>,
    version: Option<String>,
) -> (Option<Item<K>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    use watcher::Error::{InitialListFailed, NoResourceVersion};
    if let Some(object) = objects.pop_front() {
        return (Some(Ok(Event::InitApply(object))), State::Page { objects, continue_token, version });
    }
    if continue_token.is_none()
        && let Some(version) = version
    {
        return (Some(Ok(Event::InitDone)), State::Listed(version));
    }
    let mut params = list_params(config);
    params.continue_token = continue_token;
    match api.list(&params).await {
        Ok(list) => {
            let version = list.metadata.resource_version.filter(|v| !v.is_empty());
            let continue_token = list.metadata.continue_.filter(|c| !c.is_empty());
            if version.is_none() && continue_token.is_none() {
                return (Some(Err(NoResourceVersion)), State::Empty);
            }
            (None, State::Page { objects: list.items.into(), continue_token, version })
        }
        Err(err) => (Some(Err(InitialListFailed(err))), State::Empty),
    }
}

/// The next event fed by the bridge; when it stops (or this stream's turn to open comes), the
/// events it still holds are handed on and the stream opens its own watch.
async fn bridged<K>(mut feed: Feed<K>) -> (Option<Item<K>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let opens = feed.opens();
    let next = tokio::select! {
        biased;
        event = feed.next() => Ok(event),
        turn = opens.clone().acquire_owned() => Err(turn.ok()),
    };
    let turn = match next {
        Ok(Some(event)) => return (Some(Ok(event)), State::Bridged(feed)),
        // The bridge stopped: open now, in turn.
        Ok(None) => opens.acquire_owned().await.ok(),
        Err(turn) => turn,
    };
    let (version, left) = feed.leave();
    (None, State::Opening { version, left: left.into(), turn })
}

/// The next event of a streaming list, until the bookmark that ends its initial events.
async fn initial_event<K>(config: &watcher::Config, mut events: Events<K>) -> (Option<Item<K>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    use watcher::Error::{WatchError, WatchFailed};
    match events.next(config.timeout).await {
        Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
            (Some(Ok(Event::InitApply(object))), State::InitialEvents(events))
        }
        // The API server sends none before the initial state is complete.
        Some(Ok(WatchEvent::Deleted(_))) => (None, State::InitialEvents(events)),
        Some(Ok(WatchEvent::Bookmark(mark))) if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) => {
            (Some(Ok(Event::InitDone)), State::Watching(mark.metadata.resource_version, events))
        }
        Some(Ok(WatchEvent::Bookmark(_))) => (None, State::InitialEvents(events)),
        Some(Ok(WatchEvent::Error(status))) => {
            let next = if status.code == 410 { State::Empty } else { State::InitialEvents(events) };
            (Some(Err(WatchError(status))), next)
        }
        Some(Err(err)) => (Some(Err(WatchFailed(err))), State::Empty),
        None => (None, State::Empty),
    }
}

/// The next event of a watch from `version`; a closed watch is reopened from where it was.
async fn watch_event<K>(config: &watcher::Config, version: String, mut events: Events<K>) -> (Option<Item<K>>, State<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    use watcher::Error::{NoResourceVersion, WatchError, WatchFailed};
    match events.next(config.timeout).await {
        Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
            match object.resource_version().filter(|v| !v.is_empty()) {
                Some(at) => (Some(Ok(Event::Apply(object))), State::Watching(at, events)),
                None => (Some(Err(NoResourceVersion)), State::Empty),
            }
        }
        Some(Ok(WatchEvent::Deleted(object))) => match object.resource_version().filter(|v| !v.is_empty()) {
            Some(at) => (Some(Ok(Event::Delete(object))), State::Watching(at, events)),
            None => (Some(Err(NoResourceVersion)), State::Empty),
        },
        Some(Ok(WatchEvent::Bookmark(mark))) => (None, State::Watching(mark.metadata.resource_version, events)),
        Some(Ok(WatchEvent::Error(status))) => {
            let next = if status.code == 410 { State::Empty } else { State::Watching(version, events) };
            (Some(Err(WatchError(status))), next)
        }
        Some(Err(err)) => (Some(Err(WatchFailed(err))), State::Listed(version)),
        None => (None, State::Listed(version)),
    }
}

/// kube's list parameters for `config`: a list from the watch cache (resourceVersion 0) for
/// [`ListSemantic::Any`], else a consistent one; pages of the config's size.
fn list_params(config: &watcher::Config) -> ListParams {
    let (resource_version, version_match) = match config.list_semantic {
        ListSemantic::Any => (Some("0".to_string()), Some(VersionMatch::NotOlderThan)),
        ListSemantic::MostRecent => (None, None),
    };
    ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        resource_version,
        version_match,
        limit: config.page_size,
        ..ListParams::default()
    }
}
