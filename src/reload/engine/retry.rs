//! The retry book: resources whose change failed, each waiting for its next try with a doubling,
//! jittered backoff ([`retry_delay`]), and the attempts of failed deferred writes per workload.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue;

use crate::reload::api::retry_delay;
use crate::watch::{ResourceKey, WorkloadKey};

#[derive(Default)]
pub(super) struct Retries {
    due: DelayQueue<ResourceKey>,
    waiting: HashMap<ResourceKey, delay_queue::Key>,
    /// Failed tries per resource, until one succeeds: each waits twice as long as the last.
    attempts: HashMap<ResourceKey, u32>,
    /// Failed deferred writes per workload, for their backoff.
    write_attempts: HashMap<WorkloadKey, u32>,
}

impl Retries {
    /// The change of `key` failed: try it again later, later each time; how much later.
    pub(super) fn failed(&mut self, key: ResourceKey) -> Duration {
        let attempt = self.attempts.entry(key.clone()).or_insert(0);
        *attempt += 1;
        let delay = retry_delay(*attempt);
        match self.waiting.get(&key) {
            Some(existing) => self.due.reset(existing, delay),
            None => {
                let handle = self.due.insert(key.clone(), delay);
                self.waiting.insert(key, handle);
            }
        }
        delay
    }

    /// The change of `key` was acted on, or needs no more tries.
    pub(super) fn clear(&mut self, key: &ResourceKey) {
        self.attempts.remove(key);
        if let Some(handle) = self.waiting.remove(key) {
            self.due.remove(&handle);
        }
    }

    /// Whether a resource waits for a try.
    pub(super) fn is_waiting(&self) -> bool {
        !self.due.is_empty()
    }

    /// The next resource due for a try (its attempts are kept: a failure doubles its wait);
    /// `None` while none waits.
    pub(super) async fn next_due(&mut self) -> Option<ResourceKey> {
        let key = self.due.next().await?.into_inner();
        self.waiting.remove(&key);
        Some(key)
    }

    /// A deferred write of `workload` failed: how long until it is tried again.
    pub(super) fn write_failed(&mut self, workload: &WorkloadKey) -> Duration {
        let attempt = self.write_attempts.entry(workload.clone()).or_insert(0);
        *attempt += 1;
        retry_delay(*attempt)
    }

    /// A deferred write of `workload` landed, or needs no more tries.
    pub(super) fn write_done(&mut self, workload: &WorkloadKey) {
        self.write_attempts.remove(workload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{ResourceKind, WorkloadKind};

    fn cm(name: &str) -> ResourceKey {
        ResourceKey { kind: ResourceKind::ConfigMap, namespace: "ns".into(), name: name.into() }
    }

    /// `delay` is `base` plus its random part (less than `base` again).
    fn about(delay: Duration, base_ms: u64) -> bool {
        let base = Duration::from_millis(base_ms);
        delay >= base && delay < base * 2
    }

    #[tokio::test(start_paused = true)]
    async fn each_failure_doubles_the_wait_and_a_success_starts_over() {
        let mut retries = Retries::default();
        assert!(about(retries.failed(cm("a")), 400));
        assert_eq!(retries.next_due().await, Some(cm("a")));
        assert!(!retries.is_waiting());
        assert!(about(retries.failed(cm("a")), 800), "a second failure waits longer");
        retries.clear(&cm("a"));
        assert!(!retries.is_waiting(), "a success takes it out");
        assert!(about(retries.failed(cm("a")), 400), "and the next failure starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn resources_come_due_in_the_order_of_their_waits() {
        let mut retries = Retries::default();
        retries.failed(cm("slow"));
        retries.failed(cm("slow")); // 800-1600 ms
        retries.failed(cm("fast")); // 400-800 ms
        assert_eq!(retries.next_due().await, Some(cm("fast")));
        assert_eq!(retries.next_due().await, Some(cm("slow")));
        assert_eq!(retries.next_due().await, None);
    }

    #[test]
    fn failed_writes_back_off_per_workload() {
        let mut retries = Retries::default();
        let web = WorkloadKey { kind: WorkloadKind::Deployment, namespace: "ns".into(), name: "web".into() };
        assert!(about(retries.write_failed(&web), 400));
        assert!(about(retries.write_failed(&web), 800));
        retries.write_done(&web);
        assert!(about(retries.write_failed(&web), 400));
    }
}
