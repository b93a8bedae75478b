//! The runtime's tasks, each named and watched: any of them ending before shutdown (returning,
//! failing or panicking) is an error that shuts the process down cleanly; none is left to
//! vanish unnoticed.

use std::future::Future;
use std::time::Duration;

use futures::future::select_all;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};

/// Named tasks, each in a span of its name, and the two tokens that stop them in order.
#[derive(Default)]
pub(super) struct Tasks {
    running: Vec<(&'static str, JoinHandle<anyhow::Result<()>>)>,
    /// Cancelled first: the lease task hands the shards over.
    pub(super) leave: CancellationToken,
    /// Cancelled once the Leases are handed over: every other task stops.
    pub(super) shutdown: CancellationToken,
}

impl Tasks {
    pub(super) fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.running.push((name, tokio::spawn(task.instrument(info_span!("task", name)))));
    }

    /// The first task to end, as an error naming it; never resolves without a task.
    pub(super) async fn first_end(&mut self) -> anyhow::Error {
        if self.running.is_empty() {
            return std::future::pending().await;
        }
        let (ended, index, _) = select_all(self.running.iter_mut().map(|(_, handle)| handle)).await;
        let (name, _) = self.running.remove(index);
        match ended {
            Ok(Ok(())) => anyhow::anyhow!("the {name} task ended unexpectedly"),
            Ok(Err(err)) => err.context(format!("the {name} task failed")),
            Err(join) => anyhow::anyhow!("the {name} task panicked: {join}"),
        }
    }

    /// Wait up to `limit` for the task `name` to end by itself; whether it did.
    async fn finish(&mut self, name: &str, limit: Duration) -> bool {
        let Some(index) = self.running.iter().position(|(n, _)| *n == name) else { return true };
        let (_, mut handle) = self.running.remove(index);
        if handle.is_finished() {
            return true;
        }
        match tokio::time::timeout(limit, &mut handle).await {
            Ok(_) => true,
            Err(_) => {
                handle.abort();
                false
            }
        }
    }

    /// Stop in order. Hand the shards over first, the engine and watches still running: the
    /// lease task leaves (each shard released once its heir loaded it), then stops the
    /// engine's shards (drain and checkpoint) and gives back what is left, within `leaving`.
    /// Then the engine finishes its in-flight write and saves its checkpoint, within
    /// `saving`; the rest is stopped.
    pub(super) async fn stop(mut self, leaving: Duration, saving: Duration) {
        self.leave.cancel();
        if !self.finish("lease", leaving).await {
            warn!("releasing the leases did not finish in time; they will expire instead");
        }
        self.shutdown.cancel();
        if !self.finish("reload", saving).await {
            warn!("the reload engine did not stop in time; the next start replays recent changes");
        }
        for (_, handle) in self.running.drain(..) {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_is_named_whether_it_returns_fails_or_panics() {
        let mut tasks = Tasks::default();
        tasks.spawn("forever", std::future::pending());
        tasks.spawn("quits", async { Ok(()) });
        assert_eq!(tasks.first_end().await.to_string(), "the quits task ended unexpectedly");
        tasks.spawn("fails", async { Err(anyhow::anyhow!("no route")) });
        assert_eq!(format!("{:#}", tasks.first_end().await), "the fails task failed: no route");
        tasks.spawn("panics", async { panic!("boom") });
        assert!(tasks.first_end().await.to_string().starts_with("the panics task panicked"));
        assert!(!tasks.finish("forever", Duration::from_millis(10)).await, "still running: aborted");
        assert!(tasks.finish("gone", Duration::from_millis(10)).await);
    }
}
