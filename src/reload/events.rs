//! Events are best effort, as in Reloader: posted in the background, a few at once, so that
//! neither the engine nor the lint ever waits for one. They also yield to reload writes: a post
//! waits (up to [`EVENT_PATIENCE`]) for a moment with no write out, so that the Events of one
//! fan-out do not slow the PATCHes of the next on a busy API server. At most
//! [`EVENT_BACKLOG`] wait: past that a new Event is dropped and counted, so that writes
//! faster than Events can be posted never pile them up in memory.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use prometheus::{IntCounter, IntGauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::{debug, warn};

use crate::reload::api::API_TIMEOUT;

/// Events sent at once; more wait their turn in the background.
pub(crate) const EVENT_POSTS: usize = 8;
/// The longest an Event waits for the reload writes to pause, from when it was made.
const EVENT_PATIENCE: Duration = Duration::from_secs(5);
/// Events made and not yet posted, at most (about 1 KB each).
pub(crate) const EVENT_BACKLOG: usize = 10_000;

/// How many reload writes are out; Events wait for none. Cheap to clone.
#[derive(Clone)]
pub(crate) struct WritesOut(Arc<watch::Sender<usize>>);

impl WritesOut {
    pub(crate) fn new() -> Self {
        WritesOut(Arc::new(watch::Sender::new(0)))
    }

    /// Count a write as out until the guard is dropped.
    pub(crate) fn enter(&self) -> WriteOut {
        self.0.send_modify(|n| *n += 1);
        WriteOut(self.0.clone())
    }
}

/// One write out (see [`WritesOut::enter`]).
pub(crate) struct WriteOut(Arc<watch::Sender<usize>>);

impl Drop for WriteOut {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Posts Events on objects, at most [`EVENT_POSTS`] at once. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Events {
    recorder: Recorder,
    permits: Arc<Semaphore>,
    /// One permit per Event made and not yet posted.
    backlog: Arc<Semaphore>,
    dropped: IntCounter,
    /// Events made and not yet posted (or given up on).
    pending: IntGauge,
    writes: WritesOut,
}

impl Events {
    /// Events that yield to the writes counted by `writes`; those waiting are counted in
    /// `pending`, those dropped for a full backlog in `dropped`.
    pub(crate) fn new(recorder: Recorder, writes: WritesOut, dropped: IntCounter, pending: IntGauge) -> Self {
        Events {
            recorder,
            permits: Arc::new(Semaphore::new(EVENT_POSTS)),
            backlog: Arc::new(Semaphore::new(EVENT_BACKLOG)),
            dropped,
            pending,
            writes,
        }
    }

    /// Post in the background; failures are logged at debug level.
    pub(crate) fn post(&self, regarding: ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        let Ok(permit) = self.backlog.clone().try_acquire_owned() else {
            if self.dropped.get().is_multiple_of(1000) {
                warn!(
                    backlog = EVENT_BACKLOG,
                    dropped = self.dropped.get() + 1,
                    "Events are made faster than they can be posted; dropping some"
                );
            }
            self.dropped.inc();
            return;
        };
        let waiting = Waiting::new(permit, self.pending.clone());
        let event = Event {
            type_,
            reason: reason.to_string(),
            // The Event API caps notes at 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: action.to_string(),
            secondary: None,
        };
        let (recorder, permits) = (self.recorder.clone(), self.permits.clone());
        let mut writes = self.writes.0.subscribe();
        // From now, so that under steady writes Events are late, not piled up.
        let due = tokio::time::Instant::now() + EVENT_PATIENCE;
        tokio::spawn(async move {
            let _waiting = waiting;
            let Ok(_permit) = permits.acquire_owned().await else { return };
            // Never closed while this task holds a receiver of it; when due it posts anyway.
            let _ = tokio::time::timeout_at(due, writes.wait_for(|out| *out == 0)).await;
            let name = regarding.name.clone().unwrap_or_default();
            match tokio::time::timeout(API_TIMEOUT, recorder.publish(&event, &regarding)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => debug!(object = %name, error = %err, "publishing an Event failed"),
                Err(_) => debug!(object = %name, "publishing an Event timed out"),
            }
        });
    }
}

impl Events {
    /// Wait (at most `limit`) until every Event made is posted or given up on: at shutdown,
    /// so that the last reloads' Events, and one saying a shard was let go with its checkpoint
    /// unsaved, are not lost with the process.
    pub(crate) async fn flush(&self, limit: Duration) {
        let all = EVENT_BACKLOG as u32;
        if tokio::time::timeout(limit, self.backlog.acquire_many(all)).await.is_err() {
            debug!(pending = self.pending.get(), "Events still pending at shutdown are dropped");
        }
    }
}

/// One Event's place in the backlog, counted as pending until dropped.
struct Waiting {
    _place: OwnedSemaphorePermit,
    pending: IntGauge,
}

impl Waiting {
    fn new(place: OwnedSemaphorePermit, pending: IntGauge) -> Self {
        pending.inc();
        Waiting { _place: place, pending }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.pending.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_out_count_until_their_guards_drop() {
        let out = WritesOut::new();
        let mut seen = out.0.subscribe();
        let (first, second) = (out.enter(), out.enter());
        assert_eq!(*seen.borrow_and_update(), 2);
        drop(first);
        assert_eq!(*seen.borrow_and_update(), 1);
        drop(second);
        let idle = tokio::time::timeout(Duration::from_secs(5), seen.wait_for(|n| *n == 0)).await;
        assert!(idle.is_ok_and(|r| r.is_ok()), "the count goes back to 0 when every write is back");
    }

    #[tokio::test]
    async fn events_past_the_backlog_are_dropped_and_counted() -> anyhow::Result<()> {
        // Nothing listens there: the posts could only fail, and none starts before the writes
        // are back (or 5 s have passed), because one write stays out.
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
        let recorder = Recorder::new(client, "test".into());
        let writes = WritesOut::new();
        let _out = writes.enter();
        let dropped = IntCounter::new("dropped", "dropped")?;
        let pending = IntGauge::new("pending", "pending")?;
        let events = Events::new(recorder, writes, dropped.clone(), pending.clone());
        let regarding = ObjectReference { name: Some("w".into()), ..ObjectReference::default() };
        for _ in 0..EVENT_BACKLOG + 3 {
            events.post(regarding.clone(), EventType::Normal, "Reloaded", "Reload", "note".into());
        }
        assert_eq!(dropped.get(), 3);
        assert_eq!(pending.get(), EVENT_BACKLOG as i64, "every Event in the backlog counts as pending");
        Ok(())
    }

    #[tokio::test]
    async fn an_event_stops_counting_as_pending_once_its_post_is_over() -> anyhow::Result<()> {
        // Nothing listens there: each post fails at once, and no write is out to wait for.
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
        let pending = IntGauge::new("pending", "pending")?;
        let events = Events::new(
            Recorder::new(client, "test".into()),
            WritesOut::new(),
            IntCounter::new("dropped", "dropped")?,
            pending.clone(),
        );
        let regarding = ObjectReference { name: Some("w".into()), ..ObjectReference::default() };
        for _ in 0..3 {
            events.post(regarding.clone(), EventType::Normal, "Reloaded", "Reload", "note".into());
        }
        assert!(pending.get() > 0, "made and not posted yet");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while pending.get() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "{} Events still pending after 10 s", pending.get());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
