//! How this controller's calls to the API server are made: the field manager it writes as,
//! how long a call may take, and how long a failed write waits before the next try.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The field manager of every write, Reloader's.
pub const FIELD_MANAGER: &str = "Reloader";
/// How long one call may take before it counts as failed.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_BASE: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The one backoff rule for retries: doubling from 200 ms, capped at a minute, plus a random
/// part of up to as much again, so that retries which failed together (an API server outage)
/// do not all come back in the same instant.
pub(crate) fn retry_delay(attempt: u32) -> Duration {
    ExponentialBuilder::new()
        .with_min_delay(RETRY_BASE)
        .with_max_delay(RETRY_MAX)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(attempt.min(16) as usize)
        .unwrap_or(RETRY_MAX)
}

/// `call`, or an error once the API timeout has passed.
pub(crate) async fn timed<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(format!("timed out after {API_TIMEOUT:?}").into())),
    }
}

/// `err` and each of its causes, joined by `: `, for a log field or an Event: a message shows
/// its own level only, and "API call failed" alone names no cause.
pub(crate) fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_and_caps_with_a_random_part() {
        let within = |attempt, base: Duration| {
            let delays: Vec<Duration> = (0..50).map(|_| retry_delay(attempt)).collect();
            assert!(delays.iter().all(|d| *d >= base && *d < base * 2), "{attempt}: {delays:?}");
            assert!(delays.iter().any(|d| *d != delays[0]), "{attempt}: no random part: {delays:?}");
        };
        within(1, Duration::from_millis(400));
        within(2, Duration::from_millis(800));
        within(30, RETRY_MAX);
    }
}
