//! One admin listener with the limits any port a pod exposes needs: no client, however slow
//! or many its connections, can keep the kubelet's probes or Prometheus from an answer, many
//! clients cannot queue work without bound, and no request runs for ever.
//!
//! ```text
//!  accept ─▶ at most MAX_CONNECTIONS open, MAX_PER_PEER from one address (more: closed at once)
//!         ─▶ HTTP/1.1, one request per connection, headers within HEADER_READ_TIMEOUT
//!         ─▶ probes (/live /healthz /readyz) answered at once, from memory
//!            any other request: at most MAX_IN_FLIGHT at once (one more is answered 503),
//!            the answer within the request timeout (408)
//! ```
//! A slow client costs a task and a socket, not a slot others need: a thousand of them held
//! open leave the probes answering (`cargo test --lib slow_clients`, and `loadtest/noisy`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
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

/// Connections open at once: a connection waiting for its headers costs a task, a socket and
/// hyper's read buffer (about 8 KiB), so thousands fit where 32 slots did not.
const MAX_CONNECTIONS: usize = 2048;
/// Connections one peer address may hold at once: one pod cannot take the listener alone (the
/// kubelet and Prometheus connect from addresses of their own).
const MAX_PER_PEER: usize = 128;
/// Requests other than the probes handled at once; one more is answered 503 at once.
const MAX_IN_FLIGHT: usize = 32;
/// Time a client has to send its request headers (the kubelet sends them at once).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long accepting waits after an error (out of file descriptors, say) before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// How long, and how much of its request, a refused client is given to read the refusal.
const BUSY_GRACE: Duration = Duration::from_secs(1);
const BUSY_DRAIN: u64 = 16 * 1024;
/// Refusals answered at once; past that a connection over the limits is closed unanswered, so a
/// flood of connections costs no more than it takes to close them.
const MAX_REFUSALS: usize = 64;
/// The whole answer to a connection over the limit.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
/// Paths answered outside [`MAX_IN_FLIGHT`]: the probes, which read a flag and a few strings.
const PROBES: [&str; 3] = ["/live", "/healthz", "/readyz"];

/// Connections held per peer address; each [`PeerSlot`] gives its place back when dropped.
#[derive(Clone, Default)]
struct Peers(Arc<Mutex<HashMap<IpAddr, usize>>>);

struct PeerSlot {
    peers: Peers,
    addr: IpAddr,
}

impl Peers {
    /// A place for one more connection from `addr`, unless it holds [`MAX_PER_PEER`].
    fn enter(&self, addr: IpAddr) -> Option<PeerSlot> {
        let mut held = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(addr).or_default();
        if *count >= MAX_PER_PEER {
            return None;
        }
        *count += 1;
        Some(PeerSlot { peers: self.clone(), addr })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.peers.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.addr) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.addr);
            }
        }
    }
}

/// Serve `router` on `listener` until `shutdown`, each request within `request_timeout`.
/// A failed accept or connection is logged and the listener goes on.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    request_timeout: Duration,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let peers = Peers::default();
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    warn!(error = %err, "accepting an admin connection failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        let slots = open.clone().try_acquire_owned().ok().zip(peers.enter(peer.ip()));
        let Some((permit, peer_slot)) = slots else {
            debug!(peer = %peer.ip(), "too many admin connections; refusing one");
            refuse(stream, &refusals);
            continue;
        };
        let (router, in_flight) = (router.clone(), in_flight.clone());
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            answer(router.clone(), request, request_timeout, in_flight.clone())
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
            drop((permit, peer_slot));
        });
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        debug!("admin requests still in flight at shutdown were dropped");
    }
}

/// Answer 503 to a connection over the limits, or close it unanswered when many are being
/// refused already.
fn refuse(mut stream: tokio::net::TcpStream, refusals: &Arc<Semaphore>) {
    let Ok(permit) = refusals.clone().try_acquire_owned() else { return };
    tokio::spawn(async move {
        let _permit = permit;
        // Answered, then the request read and dropped: closing with it unread would reset the
        // connection before the client reads the answer.
        let refuse = async {
            stream.write_all(BUSY).await?;
            stream.shutdown().await?;
            tokio::io::copy(&mut (&mut stream).take(BUSY_DRAIN), &mut tokio::io::sink()).await
        };
        let _ = tokio::time::timeout(BUSY_GRACE, refuse).await;
    });
}

/// The router's answer to `request`, or 408 once `timeout` has passed; 503 at once when
/// [`MAX_IN_FLIGHT`] requests other than probes are being answered.
async fn answer(
    router: Router,
    request: Request<hyper::body::Incoming>,
    timeout: Duration,
    in_flight: Arc<Semaphore>,
) -> Result<Response<Body>, Infallible> {
    let _permit = if PROBES.contains(&request.uri().path()) {
        None
    } else {
        match in_flight.try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return Ok((StatusCode::SERVICE_UNAVAILABLE, "too many requests at once\n").into_response()),
        }
    };
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

    /// A connection from `source` (a loopback address of its own) that sends its request one
    /// byte at a time, every `pace`, and connects again when cut: a slowloris.
    async fn slow_client(
        addr: std::net::SocketAddr,
        source: std::net::IpAddr,
        pace: Duration,
        stop: CancellationToken,
    ) {
        let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        while !stop.is_cancelled() {
            let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
            if socket.bind(std::net::SocketAddr::new(source, 0)).is_err() {
                return;
            }
            let Ok(mut stream) = socket.connect(addr).await else {
                tokio::time::sleep(pace).await;
                continue;
            };
            for byte in request.iter() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pace) => {}
                }
                if stream.write_all(&[*byte]).await.is_err() {
                    break;
                }
            }
        }
    }

    /// Issue 49: 40 clients sending one header byte at a time took the 32 connection slots
    /// and 75 of 80 kubelet probes (1 s timeout) failed. A thousand slow clients now, from
    /// eight addresses, and every probe from another address answers within the kubelet's
    /// timeout; one address alone holds no more than its share.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_clients_by_the_thousand_leave_the_probes_answering() {
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        let (addr, stop) = started(router, Duration::from_secs(5)).await;
        let clients = CancellationToken::new();
        for i in 0..1000u32 {
            let source = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2 + (i % 8) as u8));
            tokio::spawn(slow_client(addr, source, Duration::from_millis(100), clients.clone()));
        }
        // One more address trying to hold far more than its share.
        for _ in 0..300 {
            let source = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 10));
            tokio::spawn(slow_client(addr, source, Duration::from_millis(100), clients.clone()));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The kubelet restarts the pod after 3 probes in a row fail their 1 s timeout. Every
        // probe is answered 200 (none refused or cut, as all 20 were before), and no 3 in a row
        // take longer than that timeout (a loaded test machine may slow one).
        let (mut refused, mut late_in_a_row, mut most_late_in_a_row) = (Vec::new(), 0, 0);
        for probe in 0..20 {
            let started = tokio::time::Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(10), request(addr, "/healthz")).await;
            if !answer.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200")) {
                refused.push((probe, answer));
            }
            late_in_a_row = if started.elapsed() > Duration::from_secs(1) { late_in_a_row + 1 } else { 0 };
            most_late_in_a_row = most_late_in_a_row.max(late_in_a_row);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        clients.cancel();
        stop.cancel();
        assert!(refused.is_empty(), "{} of 20 probes were not answered 200: {refused:?}", refused.len());
        assert!(most_late_in_a_row < 3, "{most_late_in_a_row} probes in a row missed the kubelet's 1 s timeout");
    }

    #[test]
    fn one_address_holds_at_most_its_share() {
        let peers = Peers::default();
        let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let held: Vec<PeerSlot> = (0..MAX_PER_PEER * 2).filter_map(|_| peers.enter(addr)).collect();
        assert_eq!(held.len(), MAX_PER_PEER);
        assert!(peers.enter(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1))).is_some(), "others get in");
        drop(held);
        assert!(peers.enter(addr).is_some(), "places are given back");
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
