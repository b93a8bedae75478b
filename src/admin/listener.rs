//! One admin listener with the limits any port a pod exposes needs: a slow or silent client
//! cannot hold it, many clients cannot queue work without bound, and no request runs for ever.
//!
//! ```text
//!  accept ─▶ at most MAX_IN_FLIGHT connections open (one more is answered 503 and closed)
//!         ─▶ HTTP/1.1, one request per connection (so as many requests at once),
//!            headers within HEADER_READ_TIMEOUT, the answer within the request timeout (408)
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, warn};

/// Connections, and so requests, open at once; one more is answered 503 at once.
const MAX_IN_FLIGHT: usize = 32;
/// Time a client has to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long accepting waits after an error (out of file descriptors, say) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// How long, and how much of its request, a refused client is given to read the refusal.
const BUSY_GRACE: Duration = Duration::from_secs(1);
const BUSY_DRAIN: u64 = 16 * 1024;
/// The whole answer to a connection over the limit.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Serve `router` on `listener` until `shutdown`, each request within `request_timeout`.
/// A failed accept or connection is logged and the listener goes on.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    request_timeout: Duration,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let graceful = GracefulShutdown::new();
    loop {
        let mut stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    warn!(error = %err, "accepting an admin connection failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            debug!("too many admin requests at once; answering 503");
            tokio::spawn(async move {
                // Answered, then the request read and dropped: closing with it unread would
                // reset the connection before the client reads the answer.
                let refuse = async {
                    stream.write_all(BUSY).await?;
                    stream.shutdown().await?;
                    tokio::io::copy(&mut (&mut stream).take(BUSY_DRAIN), &mut tokio::io::sink()).await
                };
                let _ = tokio::time::timeout(BUSY_GRACE, refuse).await;
            });
            continue;
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            answer(router.clone(), request, request_timeout)
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                debug!(error = %err, "admin connection ended with an error");
            }
            drop(permit);
        });
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        debug!("admin requests still in flight at shutdown were dropped");
    }
}

/// The router's answer to `request`, or 408 once `timeout` has passed.
async fn answer(
    router: Router,
    request: Request<hyper::body::Incoming>,
    timeout: Duration,
) -> Result<Response<Body>, Infallible> {
    match tokio::time::timeout(timeout, router.oneshot(request.map(Body::new))).await {
        Ok(answered) => answered,
        Err(_) => Ok((StatusCode::REQUEST_TIMEOUT, "the request took too long\n").into_response()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    async fn started(router: Router, timeout: Duration) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a free port");
        let addr = listener.local_addr().expect("bound");
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, router, timeout, stop.clone()));
        (addr, stop)
    }

    async fn request(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.expect("send");
        let mut answer = String::new();
        match stream.read_to_string(&mut answer).await {
            Ok(_) => answer,
            Err(err) => format!("no answer: {err}"),
        }
    }

    #[tokio::test]
    async fn a_slow_handler_is_cut_at_its_timeout() {
        let router = Router::new().route("/slow", get(|| async { std::future::pending::<&str>().await }));
        let (addr, stop) = started(router, Duration::from_millis(200)).await;
        let answer = request(addr, "/slow").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_client_that_sends_no_headers_is_dropped() {
        let (addr, stop) = started(Router::new().route("/", get(|| async { "ok" })), Duration::from_secs(1)).await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let started = tokio::time::Instant::now();
        let mut buf = Vec::new();
        let _ = silent.read_to_end(&mut buf).await;
        assert!(started.elapsed() < HEADER_READ_TIMEOUT * 3, "held for {:?}", started.elapsed());
        stop.cancel();
    }

    #[tokio::test]
    async fn requests_beyond_the_limit_are_refused_not_queued() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let gate = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let (held, count) = (gate.clone(), entered.clone());
        let router = Router::new().route(
            "/hold",
            get(move || {
                let (held, count) = (held.clone(), count.clone());
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    held.notified().await;
                    "done"
                }
            }),
        );
        let (addr, stop) = started(router, Duration::from_secs(30)).await;
        let holders: Vec<_> = (0..MAX_IN_FLIGHT).map(|_| tokio::spawn(request(addr, "/hold"))).collect();
        while entered.load(Ordering::SeqCst) < MAX_IN_FLIGHT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let refused = tokio::time::timeout(Duration::from_secs(5), request(addr, "/hold")).await;
        assert!(refused.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 503")), "{refused:?}");
        assert_eq!(entered.load(Ordering::SeqCst), MAX_IN_FLIGHT, "the refused request reached the handler");
        gate.notify_waiters();
        for holder in holders {
            let answer = holder.await.unwrap_or_default();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        stop.cancel();
    }
}
