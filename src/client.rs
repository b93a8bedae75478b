//! The Kubernetes client: kube's layers (base URI, auth, headers, retries of 429/503/504) over
//! a small pool of HTTP/2 connections, so that thousands of watches (namespace-scoped mode)
//! share a few connections as client-go's do, instead of a connection each.
//!
//! ```text
//!  request ─▶ our layers ─▶ kube's layers ─▶ Connections: watches | other requests, each on
//!            (counting,     (URI, auth,        the first connection with fewer open than the
//!             shardSelector) retries)          server allows (watches) or 16 (others), else
//!                                              a new one (a watch is open until its body ends)
//! ```
//! TLS offers `h2` and `http/1.1` (ALPN); a server that picks HTTP/1.1 gets it, and each
//! connection slot then keeps an HTTP/1.1 pool, as kube's own client does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use prometheus::IntCounter;
use tower::{BoxError, Layer, Service, ServiceBuilder};

/// Requests open at once on one HTTP/2 connection, at most, when the server's own limit could
/// not be read: below the 100 streams kube-apiserver allows on one unless
/// `--http2-max-streams-per-connection` says otherwise. A request past the server's limit waits,
/// unsent and silent (hyper holds it), for a stream that a watch holds for good: with 200 a
/// connection, namespace-scoped watches lost events (docs/performance.md, "Behind the code").
pub const STREAMS_PER_CONNECTION: usize = 90;
/// Requests other than watches open at once on one connection, at most: a burst of writes
/// (a fan-out's 64) spreads over a few connections. kube-apiserver serves each HTTP/2
/// connection's frames from one goroutine, which on a busy server waits its turn like any
/// other, so 64 PATCHes on one connection took longer than over HTTP/1.1, and 16 a connection
/// about as long (`loadtest/fanout`; docs/performance.md, "Behind the code").
const REQUEST_STREAMS_PER_CONNECTION: usize = 16;
/// Streams left unused below the server's limit: a stream closed here is counted free a moment
/// before the server (and h2) count it closed.
const STREAMS_SPARE: usize = 10;
/// How long reading the server's stream limit may take before the default is used.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection (and every watch on it) is dropped and opened again.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(10));

/// How the client talks to the API server.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Offer HTTP/2 (else only HTTP/1.1).
    pub http2: bool,
    /// Requests a second, at most (`--kube-api-qps`), with bursts of `burst`; `None`: no limit.
    pub rate: Option<(f64, u32)>,
    /// Counters of the response body bytes of watches and of other requests.
    pub response_bytes: ResponseBytes,
    /// Set to the requests kept open on one connection.
    pub streams_per_connection: prometheus::IntGauge,
}

/// Response body bytes received, by watches and by other requests.
#[derive(Clone, Debug)]
pub struct ResponseBytes {
    pub watches: IntCounter,
    pub others: IntCounter,
}

/// A client over `config`, with `outer` around everything (it sees each request once, before
/// kube's retries). Each connection carries as many requests as the API server allows on one
/// (read from it first, see [`server_stream_limit`]).
///
/// # Errors
/// When the TLS or auth settings of `config` cannot be used.
pub async fn build<L>(config: &kube::Config, settings: Settings, outer: L) -> anyhow::Result<kube::Client>
where
    L: Layer<tower::util::BoxService<Request<Body>, Response<Counted>, BoxError>>,
    L::Service: Service<Request<Body>, Response = Response<Counted>, Error = BoxError> + Send + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send,
{
    let mut tls = config.rustls_client_config().context("the kubeconfig's TLS settings")?;
    tls.alpn_protocols =
        if settings.http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request as several frames: without this, Nagle holds the later ones back.
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnector::from((http, Arc::new(tls)));
    let per_connection =
        if settings.http2 { streams_per_connection(&https, &config.cluster_url).await } else { STREAMS_PER_CONNECTION };
    settings.streams_per_connection.set(i64::try_from(per_connection).unwrap_or(i64::MAX));
    let make: MakeClient = Arc::new(move || {
        HyperClient::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(KEEP_ALIVE.0)
            .http2_keep_alive_timeout(KEEP_ALIVE.1)
            .http2_keep_alive_while_idle(true)
            .build(https.clone())
    });
    let connections = Connections(Arc::new(Slots {
        watches: Pool::new(make.clone(), per_connection),
        requests: Pool::new(make, per_connection.min(REQUEST_STREAMS_PER_CONNECTION)),
        limiter: settings.rate.map(|(qps, burst)| Limiter::new(qps, burst)),
        bytes: settings.response_bytes,
    }));
    let retry =
        config.default_retry.then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let kube_layers = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer().context("the kubeconfig's credentials")?)
        .layer(config.extra_headers_layer().context("the kubeconfig's extra headers")?)
        .map_err(BoxError::from)
        .service(connections);
    let service = outer.layer(tower::util::BoxService::new(kube_layers));
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// Whether a request's query asks for a watch (`watch=true` or `watch=1`): such a request stays
/// open, which both the connection it is sent on and the API call count must know.
pub fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;
type Hyper = HyperClient<Https, Body>;

/// Requests to keep open on one connection: the server's limit less [`STREAMS_SPARE`], or
/// [`STREAMS_PER_CONNECTION`] when it cannot be read.
async fn streams_per_connection(https: &Https, server: &http::Uri) -> usize {
    match tokio::time::timeout(PROBE_TIMEOUT, server_stream_limit(https, server)).await {
        Ok(Ok(Some(limit))) => {
            let usable = limit.saturating_sub(STREAMS_SPARE).max(1);
            tracing::info!(server_limit = limit, used = usable, "HTTP/2 streams per connection");
            usable
        }
        // HTTP/1.1: a slot's pool opens a connection per request in flight anyway.
        Ok(Ok(None)) => STREAMS_PER_CONNECTION,
        Ok(Err(err)) => {
            tracing::warn!(error = %format!("{err:#}"), default = STREAMS_PER_CONNECTION,
                "cannot read the API server's HTTP/2 stream limit; using the default");
            STREAMS_PER_CONNECTION
        }
        Err(_) => {
            tracing::warn!(
                default = STREAMS_PER_CONNECTION,
                within = ?PROBE_TIMEOUT,
                "the API server's HTTP/2 stream limit was not read in time; using the default"
            );
            STREAMS_PER_CONNECTION
        }
    }
}

/// The streams the API server lets one HTTP/2 connection open (its
/// `SETTINGS_MAX_CONCURRENT_STREAMS`), read on a connection of its own, as hyper keeps the
/// value to itself; `None` when the server does not speak HTTP/2 to us.
async fn server_stream_limit(https: &Https, server: &http::Uri) -> anyhow::Result<Option<usize>> {
    use hyper_util::client::legacy::connect::Connection as _;
    let stream = https.clone().call(server.clone()).await.map_err(|e| anyhow::anyhow!(e)).context("connecting")?;
    if !stream.connected().is_negotiated_h2() {
        return Ok(None);
    }
    let (_requests, mut connection) =
        h2::client::handshake(hyper_util::rt::TokioIo::new(stream)).await.context("HTTP/2 handshake")?;
    let mut pings = connection.ping_pong().context("HTTP/2 pings taken")?;
    // The server's SETTINGS come first; two ping round trips later they are applied.
    for _ in 0..2 {
        tokio::select! {
            ended = &mut connection => {
                ended.context("HTTP/2 connection")?;
                anyhow::bail!("the API server closed the connection");
            }
            pong = pings.ping(h2::Ping::opaque()) => { pong.context("HTTP/2 ping")?; }
        }
    }
    Ok(Some(connection.max_concurrent_send_streams()))
}

type MakeClient = Arc<dyn Fn() -> Hyper + Send + Sync>;

/// Watches on connections of their own, other requests on others, so that a write never
/// queues behind watch streams on one connection.
struct Slots {
    watches: Pool,
    requests: Pool,
    limiter: Option<Limiter>,
    bytes: ResponseBytes,
}

/// Connection slots, one hyper client each (one HTTP/2 connection, or an HTTP/1.1 pool), with
/// the requests each has open; a slot is added when every slot has `per_connection` open.
struct Pool {
    make: MakeClient,
    per_connection: usize,
    slots: std::sync::RwLock<Vec<(Hyper, Arc<AtomicUsize>)>>,
}

impl Pool {
    fn new(make: MakeClient, per_connection: usize) -> Pool {
        Pool { make, per_connection, slots: std::sync::RwLock::new(Vec::new()) }
    }

    /// The first slot below the stream limit (so a few connections fill up before another
    /// opens), else a new one; the request is counted open on it.
    fn take(&self) -> (Hyper, Open) {
        let free = |slots: &[(Hyper, Arc<AtomicUsize>)]| {
            slots
                .iter()
                .find(|(_, open)| open.load(Ordering::Relaxed) < self.per_connection)
                .map(|(client, open)| (client.clone(), Open::new(open.clone())))
        };
        if let Some(found) = free(&self.slots.read().unwrap_or_else(std::sync::PoisonError::into_inner)) {
            return found;
        }
        let mut slots = self.slots.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = free(&slots) {
            return found;
        }
        let (client, open) = ((self.make)(), Arc::new(AtomicUsize::new(0)));
        slots.push((client.clone(), open.clone()));
        (client, Open::new(open))
    }
}

/// The service over the slots.
#[derive(Clone)]
struct Connections(Arc<Slots>);

impl Service<Request<Body>> for Connections {
    type Response = Response<Counted>;
    type Error = hyper_util::client::legacy::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let watch = is_watch(request.uri().query());
        let (client, open) = if watch { self.0.watches.take() } else { self.0.requests.take() };
        let bytes = if watch { self.0.bytes.watches.clone() } else { self.0.bytes.others.clone() };
        let limiter = self.0.limiter.clone();
        Box::pin(async move {
            if let Some(limiter) = limiter {
                limiter.acquire().await;
            }
            let response = client.request(request).await?;
            Ok(response.map(|body| Counted { body, bytes, _open: open }))
        })
    }
}

/// The client-side rate limit, as client-go's: a token bucket of `burst` tokens refilled at
/// `qps` a second; each request takes one before it is sent, waiting in turn when none is left.
#[derive(Clone)]
struct Limiter(Arc<std::sync::Mutex<Bucket>>);

struct Bucket {
    qps: f64,
    burst: f64,
    /// Tokens now; below zero: requests already promised the next tokens.
    tokens: f64,
    at: tokio::time::Instant,
}

impl Limiter {
    fn new(qps: f64, burst: u32) -> Limiter {
        let burst = f64::from(burst.max(1));
        Limiter(Arc::new(std::sync::Mutex::new(Bucket { qps, burst, tokens: burst, at: tokio::time::Instant::now() })))
    }

    /// Take a token, waiting for it if the bucket is empty (the wait is reserved at once, so
    /// requests go in the order they came).
    async fn acquire(&self) {
        let wait = {
            let mut bucket = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = tokio::time::Instant::now();
            let refill = now.duration_since(bucket.at).as_secs_f64() * bucket.qps;
            bucket.tokens = (bucket.tokens + refill).min(bucket.burst) - 1.0;
            bucket.at = now;
            // Checked: a rate near zero (refused at start) or a huge queue must not panic here.
            (bucket.tokens < 0.0)
                .then(|| Duration::try_from_secs_f64(-bucket.tokens / bucket.qps).unwrap_or(Duration::MAX))
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One open request of a slot, until dropped (with the response body, when it is read).
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(count: Arc<AtomicUsize>) -> Open {
        count.fetch_add(1, Ordering::Relaxed);
        Open(count)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that holds its request's place on the connection until it ends.
pub struct Counted {
    body: Incoming,
    bytes: IntCounter,
    _open: Open,
}

impl HttpBody for Counted {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.bytes.inc_by(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 25 requests at 10/s with a burst of 5: 5 at once, then one every 100 ms (paused time).
    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_lets_a_burst_through_then_paces_requests() {
        let limiter = Limiter::new(10.0, 5);
        let started = tokio::time::Instant::now();
        let mut at = Vec::new();
        for _ in 0..25 {
            limiter.acquire().await;
            at.push(started.elapsed().as_millis());
        }
        assert_eq!(&at[..5], &[0, 0, 0, 0, 0], "the burst goes at once");
        assert_eq!(at[5], 100);
        assert_eq!(at[24], 2000, "20 more at 10 a second");
    }
}
