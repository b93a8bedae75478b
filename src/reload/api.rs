//! How this controller's calls to the API server are made: the field manager it writes as,
//! how long a call may take, and how long a failed write waits before the next try.

use std::future::Future;
use std::time::Duration;

/// The field manager of every write, Reloader's.
pub const FIELD_MANAGER: &str = "Reloader";
/// How long one call may take before it counts as failed.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_BASE: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The one backoff rule for retries: doubling from 200 ms, capped at a minute.
pub(crate) fn retry_delay(attempt: u32) -> Duration {
    RETRY_BASE.saturating_mul(1u32 << attempt.min(16)).min(RETRY_MAX)
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
    fn retry_delay_doubles_and_caps() {
        assert_eq!(retry_delay(1), Duration::from_millis(400));
        assert_eq!(retry_delay(2), Duration::from_millis(800));
        assert_eq!(retry_delay(30), RETRY_MAX);
    }
}
