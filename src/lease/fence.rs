//! Self-fencing: a replica stops acting on a shard once its last successful renewal was sent
//! the renew deadline ago, whether or not a round is running (a round may hang on a slow API).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::lease::metrics::Metrics;
use crate::lease::ownership::Publisher;

/// How often the fence task checks renew deadlines.
const FENCE_CHECK: Duration = Duration::from_millis(100);

/// Withdraw from the published `held` set every shard whose last successful renewal was sent
/// `renew_deadline` ago or more, independently of the rounds (which may hang on a slow API).
pub(super) async fn fence(
    last_ok_send: Arc<Mutex<HashMap<u32, Instant>>>,
    tx: Arc<Publisher>,
    renew_deadline: Duration,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(FENCE_CHECK);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let fresh: BTreeSet<u32> = lock(&last_ok_send)
            .iter()
            .filter(|(_, sent)| now.saturating_duration_since(**sent) < renew_deadline)
            .map(|(shard, _)| *shard)
            .collect();
        tx.send_if_modified(|ownership| {
            let before = ownership.held.len();
            ownership.held.retain(|shard| fresh.contains(shard));
            let fenced = before - ownership.held.len();
            if fenced > 0 {
                warn!(fenced, "renew deadline passed; stopped acting on shards until renewed");
                metrics.losses.inc_by(fenced as u64);
                metrics.shards_held.set(ownership.held.len() as i64);
            }
            fenced > 0
        });
    }
}

/// Lock a mutex that is only held for map operations (a panic cannot leave it inconsistent).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
