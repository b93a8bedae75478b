//! The bridge of a seeded handoff: one cluster-wide watch per kind, from the seed's
//! resourceVersion, whose events go to the gained namespaces until each has a watch of its own.
//! A gained namespace then counts as loaded as soon as its seed is stored, and its changes
//! flow at once, while its own watch opens later at the pace the API server allows (thousands
//! of opens, 1,200-1,500 a second on 2 cores: most of a seeded handoff, during which the
//! leaver had to keep serving).
//!
//! A namespace leaves the bridge at a resourceVersion: every event of it up to there has been
//! sent to it, none after, and its own watch starts there. Nothing is seen twice, so no event
//! is replayed over a newer one, and no resourceVersions are compared.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::WatchParams;
use kube::core::WatchEvent;
use kube::runtime::watcher::Event;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, info, warn};

use super::events::Events;

/// How often the bridge looks for namespaces that no longer listen (stopped streams).
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// An event on its way to a namespace, boxed: a channel allocates 32 slots at once, and a
/// handoff's thousands of channels of unboxed objects (about 450 bytes each) were tens of MiB.
type Fed<K> = Box<Event<K>>;

/// What the bridge and the namespaces it feeds share.
struct Shared<K> {
    /// Where the bridge is: every event up to this resourceVersion has been sent.
    position: String,
    /// The namespaces still fed, and where their events go.
    feeds: HashMap<String, mpsc::UnboundedSender<Fed<K>>>,
}

/// A bridge, until every namespace has left it.
pub(super) struct Bridge<K> {
    shared: Arc<Mutex<Shared<K>>>,
    /// Feeds not yet taken by their namespace's stream.
    untaken: Mutex<HashMap<String, mpsc::UnboundedReceiver<Fed<K>>>>,
    /// Paces the namespaces' own watches.
    opens: Arc<Semaphore>,
}

/// One namespace's part of a bridge.
pub(super) struct Feed<K> {
    namespace: String,
    shared: Arc<Mutex<Shared<K>>>,
    events: mpsc::UnboundedReceiver<Fed<K>>,
    opens: Arc<Semaphore>,
}

impl<K> Bridge<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// Open the cluster-wide watch of `api` from `version` and start feeding `namespaces`;
    /// `None` if the watch does not open (the namespaces then open their own before they
    /// count as loaded).
    pub async fn start(
        api: Api<K>,
        params: WatchParams,
        version: String,
        namespaces: impl Iterator<Item = String>,
        opens: Arc<Semaphore>,
    ) -> Option<Arc<Bridge<K>>> {
        let client = api.clone().into_client();
        let kind = api.resource_url().to_string();
        let events = match Events::open(&api, &client, &params, &version).await {
            Ok(events) => events,
            Err(err) => {
                warn!(kind, error = %err, "cannot open the bridge watch; gained namespaces open theirs first");
                return None;
            }
        };
        let (mut feeds, mut untaken) = (HashMap::new(), HashMap::new());
        for namespace in namespaces {
            let (sender, receiver) = mpsc::unbounded_channel();
            feeds.insert(namespace.clone(), sender);
            untaken.insert(namespace, receiver);
        }
        let shared = Arc::new(Mutex::new(Shared { position: version, feeds }));
        tokio::spawn(run(api, client, params, events, shared.clone(), kind));
        Some(Arc::new(Bridge { shared, untaken: Mutex::new(untaken), opens }))
    }

    /// The feed of `namespace` (each namespace takes its own once).
    pub fn take(&self, namespace: &str) -> Option<Feed<K>> {
        let events = self.untaken.lock().unwrap_or_else(PoisonError::into_inner).remove(namespace)?;
        Some(Feed { namespace: namespace.to_string(), shared: self.shared.clone(), events, opens: self.opens.clone() })
    }
}

impl<K> Feed<K> {
    /// The next event for this namespace; `None` once the bridge has stopped feeding it.
    pub async fn next(&mut self) -> Option<Event<K>> {
        self.events.recv().await.map(|event| *event)
    }

    /// The turns to open the namespaces' own watches.
    pub fn opens(&self) -> Arc<Semaphore> {
        self.opens.clone()
    }

    /// Leave the bridge: the resourceVersion to watch from, and the events sent up to there
    /// that this namespace has not read yet.
    pub fn leave(mut self) -> (String, Vec<Event<K>>) {
        let position = {
            let mut shared = lock(&self.shared);
            shared.feeds.remove(&self.namespace);
            shared.position.clone()
        };
        let mut left = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            left.push(*event);
        }
        (position, left)
    }
}

fn lock<K>(shared: &Mutex<Shared<K>>) -> std::sync::MutexGuard<'_, Shared<K>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Feed the namespaces until none is left. A watch that ends is opened again from the
/// position; an error stops the bridge where it is, and the namespaces still fed open their
/// own watches from there.
async fn run<K>(
    api: Api<K>,
    client: Client,
    params: WatchParams,
    mut events: Events<K>,
    shared: Arc<Mutex<Shared<K>>>,
    kind: String,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    let mut sent = 0usize;
    let reason = loop {
        let event = tokio::select! {
            event = events.next(params.timeout) => event,
            _ = prune.tick() => {
                let mut shared = lock(&shared);
                shared.feeds.retain(|_, feed| !feed.is_closed());
                if shared.feeds.is_empty() {
                    break "every namespace has its own watch";
                }
                continue;
            }
        };
        let (object, deleted) = match event {
            Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => (object, false),
            Some(Ok(WatchEvent::Deleted(object))) => (object, true),
            Some(Ok(WatchEvent::Bookmark(mark))) => {
                lock(&shared).position = mark.metadata.resource_version;
                continue;
            }
            Some(Ok(WatchEvent::Error(status))) => {
                warn!(kind, code = status.code, message = %status.message, "the bridge watch failed");
                break "the watch failed";
            }
            Some(Err(err)) => {
                warn!(kind, error = %err, "the bridge watch failed");
                break "the watch failed";
            }
            None => {
                let position = lock(&shared).position.clone();
                match Events::open(&api, &client, &params, &position).await {
                    Ok(reopened) => {
                        events = reopened;
                        continue;
                    }
                    Err(err) => {
                        warn!(kind, error = %err, "cannot reopen the bridge watch");
                        break "the watch could not be reopened";
                    }
                }
            }
        };
        if let Err(reason) = forward(&shared, object, deleted, &mut sent) {
            break reason;
        }
    };
    // Dropping the feeds tells the namespaces still fed to open their own watches.
    let left = {
        let mut shared = lock(&shared);
        let left = shared.feeds.len();
        shared.feeds.clear();
        left
    };
    if left == 0 {
        debug!(kind, sent, reason, "bridge closed");
    } else {
        info!(kind, sent, left, reason, "bridge closed early; the namespaces left open their own watches");
    }
}

/// Hand `object` to its namespace's feed, if that namespace is still fed, and move the
/// position on; `Err` with the reason when the bridge has nothing left to do.
fn forward<K: Resource>(
    shared: &Mutex<Shared<K>>,
    object: K,
    deleted: bool,
    sent: &mut usize,
) -> Result<(), &'static str> {
    let Some(version) = object.resource_version().filter(|v| !v.is_empty()) else {
        return Err("an event had no resourceVersion");
    };
    let mut shared = lock(shared);
    if let Some(namespace) = object.namespace()
        && let Some(feed) = shared.feeds.get(&namespace)
    {
        let event = if deleted { Event::Delete(object) } else { Event::Apply(object) };
        if feed.send(Box::new(event)).is_err() {
            shared.feeds.remove(&namespace);
        } else {
            *sent += 1;
        }
    }
    shared.position = version;
    if shared.feeds.is_empty() {
        return Err("every namespace has its own watch");
    }
    Ok(())
}
