//! `--enable-pprof`: CPU profiles in the pprof format at `/debug/pprof/profile?seconds=N`,
//! on `--pprof-addr` (`127.0.0.1:6060`: loopback, reached with `kubectl port-forward`),
//! readable by `go tool pprof` as Reloader's are.
//!
//! Sampling is pprof-rs's (a timer signal at 99 Hz, stacks unwound in the process). Heap
//! profiles are not served: Rust's allocator keeps no per-site record to sample (that needs a
//! profiling allocator such as jemalloc's); `/debug/pprof/` says so and shows the process's
//! resident memory instead.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pprof::protos::Message;
use tokio_util::sync::CancellationToken;

use crate::admin::Error;

/// Sampling frequency; not a multiple of common timer rates, as Go's runtime chooses 100.
const FREQUENCY: i32 = 99;
/// Longest profile one request may ask for.
const MAX_SECONDS: u64 = 300;
const DEFAULT_SECONDS: u64 = 30;

pub fn pprof_router() -> Router {
    Router::new().route("/debug/pprof/", get(index)).route("/debug/pprof/profile", get(profile))
}

/// Serve the profiling endpoints on `addr` until `shutdown`, with the limits of every admin
/// listener (a profile may take its [`MAX_SECONDS`] and a little more).
///
/// # Errors
/// [`Error::Bind`] when the address is taken.
pub async fn serve_pprof(addr: SocketAddr, shutdown: CancellationToken) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })?;
    let timeout = Duration::from_secs(MAX_SECONDS + 10);
    crate::admin::listener::serve(listener, pprof_router(), timeout, shutdown).await;
    Ok(())
}

async fn index() -> impl IntoResponse {
    let status = tokio::fs::read_to_string("/proc/self/status").await.unwrap_or_default();
    let rss = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: unknown");
    format!(
        "profile?seconds=N  CPU profile in the pprof format (go tool pprof)\n\
         heap               not available: needs a profiling allocator; resident memory now: {}\n",
        rss.trim_start_matches("VmRSS:").trim()
    )
}

async fn profile(Query(params): Query<HashMap<String, String>>) -> Response {
    let seconds = match params.get("seconds").map(|s| s.parse::<u64>()) {
        None => DEFAULT_SECONDS,
        Some(Ok(s)) if (1..=MAX_SECONDS).contains(&s) => s,
        Some(_) => {
            return (StatusCode::BAD_REQUEST, format!("seconds must be a whole number from 1 to {MAX_SECONDS}\n"))
                .into_response();
        }
    };
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        // The sampler is process-wide: one profile at a time.
        Err(err) => return (StatusCode::CONFLICT, format!("cannot start profiling: {err}\n")).into_response(),
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let encoded = guard.report().build().and_then(|report| report.pprof()).map(|p| p.write_to_bytes());
    match encoded {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Ok(Err(err)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the profile: {err}\n")).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("building the profile: {err}\n")).into_response(),
    }
}
