//! Events are best effort, as in Reloader: posted in the background, a few at once, so that
//! neither the engine nor the lint ever waits for one.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::Semaphore;
use tracing::debug;

use crate::reload::engine::API_TIMEOUT;

/// Events sent at once; more wait their turn in the background.
pub(crate) const EVENT_POSTS: usize = 8;

/// Posts Events on objects, at most [`EVENT_POSTS`] at once. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Events {
    recorder: Recorder,
    permits: Arc<Semaphore>,
}

impl Events {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Events { recorder, permits: Arc::new(Semaphore::new(EVENT_POSTS)) }
    }

    /// Post in the background; failures are logged at debug level.
    pub(crate) fn post(&self, regarding: ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            // The Event API caps notes at 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: action.to_string(),
            secondary: None,
        };
        let (recorder, permits) = (self.recorder.clone(), self.permits.clone());
        tokio::spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else { return };
            let name = regarding.name.clone().unwrap_or_default();
            match tokio::time::timeout(API_TIMEOUT, recorder.publish(&event, &regarding)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => debug!(object = %name, error = %err, "publishing an Event failed"),
                Err(_) => debug!(object = %name, "publishing an Event timed out"),
            }
        });
    }
}
