//! An HTTPS proxy in front of the API server that answers `429 Too Many Requests` (with
//! `Retry-After: 1`, as kube-apiserver's max-in-flight and priority-and-fairness filters do)
//! to every `every`-th request and forwards the others; or one that drops a query parameter,
//! slows every Deployment PATCH, or holds those of one Deployment until told.
//!
//! It terminates TLS with the control plane's serving certificate (so clients that trust the
//! local CA trust it) and talks to the API server as the admin client. Each forwarded request
//! goes with `Connection: close`, so that every request comes on a connection of its own and
//! is counted and judged, however the client pools its connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub struct Throttle {
    pub addr: SocketAddr,
    requests: Arc<AtomicU64>,
    /// Deployment PATCHes in flight now, and the most at once.
    writes: Arc<(AtomicU64, AtomicU64)>,
    /// Requests answered 429, by HTTP method.
    throttled: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Held writes let go of (see [`Throttle::holding_writes_to`]), and how many wait now.
    release: tokio::sync::watch::Sender<bool>,
    held: Arc<AtomicU64>,
    /// Held writes whose client hung up (gave up waiting).
    abandoned: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

/// What the proxy does to Deployment PATCHes before forwarding them.
#[derive(Clone)]
enum Slow {
    None,
    Delay(std::time::Duration),
    /// Hold those whose path contains this until [`Throttle::release`].
    Hold(&'static str),
    /// Answer 500 to every request whose path contains this, until [`Throttle::release`].
    Fail(&'static str),
}

fn pki(file: &str) -> PathBuf {
    super::kubeconfig_path().parent().expect("the kubeconfig's folder").join("pki").join(file)
}

fn certs(file: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(pki(file))
        .expect("read a certificate")
        .map(|c| c.expect("a PEM certificate"))
        .collect()
}

impl Throttle {
    /// Start the proxy; every `every`-th request (the 1st, the `every+1`-th, ...) gets a 429.
    pub async fn start(upstream: SocketAddr, every: u64) -> Throttle {
        Self::start_with(upstream, Some(every), None, Slow::None).await
    }

    /// A proxy that drops query parameter `param` from every request (as an API server that
    /// does not know it would ignore it), throttling none.
    pub async fn dropping(upstream: SocketAddr, param: &'static str) -> Throttle {
        Self::start_with(upstream, None, Some(param), Slow::None).await
    }

    /// A proxy that holds every Deployment PATCH for `delay` before forwarding it (a slow API
    /// server), so that writes sent side by side are in flight together
    /// ([`Throttle::most_writes_in_flight`]).
    pub async fn slowing_writes(upstream: SocketAddr, delay: std::time::Duration) -> Throttle {
        Self::start_with(upstream, None, None, Slow::Delay(delay)).await
    }

    /// A proxy that holds every Deployment PATCH whose path contains `path` (say
    /// `/deployments/web`) until [`Throttle::release`]: an API server stuck on one object.
    pub async fn holding_writes_to(upstream: SocketAddr, path: &'static str) -> Throttle {
        Self::start_with(upstream, None, None, Slow::Hold(path)).await
    }

    /// A proxy that answers `500 Internal Server Error` to every request whose path contains
    /// `path` (say `selfsubjectaccessreviews`) until [`Throttle::release`]: an API server that
    /// cannot answer one kind of call for a while.
    pub async fn failing(upstream: SocketAddr, path: &'static str) -> Throttle {
        Self::start_with(upstream, None, None, Slow::Fail(path)).await
    }

    /// Held writes waiting now, and those whose client gave up on them.
    pub fn held_writes(&self) -> (u64, u64) {
        (self.held.load(Ordering::SeqCst), self.abandoned.load(Ordering::SeqCst))
    }

    /// Let the held writes go, and hold none from now on.
    pub fn release(&self) {
        self.release.send_replace(true);
    }

    /// The most Deployment PATCHes that were in flight at once.
    pub fn most_writes_in_flight(&self) -> u64 {
        self.writes.1.load(Ordering::SeqCst)
    }

    async fn start_with(
        upstream: SocketAddr,
        every: Option<u64>,
        drop_param: Option<&'static str>,
        slow: Slow,
    ) -> Throttle {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = PrivateKeyDer::from_pem_file(pki("serving.key")).expect("the serving key");
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs("serving.crt"), key)
            .expect("a server TLS config");
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs("ca.crt") {
            roots.add(ca).expect("the local CA");
        }
        let admin_key = PrivateKeyDer::from_pem_file(pki("admin.key")).expect("the admin key");
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs("admin.crt"), admin_key)
            .expect("a client TLS config");
        let (acceptor, connector) = (TlsAcceptor::from(Arc::new(server)), TlsConnector::from(Arc::new(client)));

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the throttling proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (requests, throttled) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(BTreeMap::new())));
        let writes = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let (release, released) = tokio::sync::watch::channel(false);
        let (held, abandoned) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let accept = tokio::spawn({
            let (requests, throttled, writes) = (requests.clone(), throttled.clone(), writes.clone());
            let (held, abandoned) = (held.clone(), abandoned.clone());
            async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, connector) = (acceptor.clone(), connector.clone());
                    let (requests, throttled, writes) = (requests.clone(), throttled.clone(), writes.clone());
                    let (slow, mut released, held) = (slow.clone(), released.clone(), held.clone());
                    let abandoned = abandoned.clone();
                    tokio::spawn(async move {
                        let Ok(mut client) = acceptor.accept(tcp).await else { return };
                        let Some((head, mut rest)) = read_head(&mut client).await else { return };
                        let write = is_deployment_patch(&head).then(|| InFlight::enter(writes.clone()));
                        match (&slow, &write) {
                            (Slow::Delay(delay), Some(_)) => tokio::time::sleep(*delay).await,
                            (Slow::Hold(path), Some(_)) if request_line(&head).contains(path) => {
                                held.fetch_add(1, Ordering::SeqCst);
                                // Held until released; the rest of the body is kept meanwhile. A
                                // client that gives up (its request timed out) is let go, counted.
                                let mut chunk = [0u8; 4096];
                                loop {
                                    tokio::select! {
                                        _ = released.wait_for(|r| *r) => break,
                                        read = client.read(&mut chunk) => match read {
                                            Ok(n) if n > 0 => rest.extend_from_slice(&chunk[..n]),
                                            _ => {
                                                held.fetch_sub(1, Ordering::SeqCst);
                                                abandoned.fetch_add(1, Ordering::SeqCst);
                                                return;
                                            }
                                        },
                                    }
                                }
                                held.fetch_sub(1, Ordering::SeqCst);
                            }
                            _ => {}
                        }
                        if let Slow::Fail(path) = &slow
                            && request_line(&head).contains(path)
                            && !*released.borrow()
                        {
                            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcdserver: leader changed","reason":"InternalError","code":500}"#;
                            let answer = format!(
                                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = client.write_all(answer.as_bytes()).await;
                            let _ = client.shutdown().await;
                            return;
                        }
                        let n = requests.fetch_add(1, Ordering::Relaxed);
                        if every.is_some_and(|every| n % every == 0) {
                            let method = head.split(|b| *b == b' ').next().unwrap_or_default();
                            let method = String::from_utf8_lossy(method).into_owned();
                            *throttled.lock().unwrap_or_else(|p| p.into_inner()).entry(method).or_insert(0) += 1;
                            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"throttled by the test proxy","reason":"TooManyRequests","code":429}"#;
                            let answer = format!(
                                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = client.write_all(answer.as_bytes()).await;
                            let _ = client.shutdown().await;
                            return;
                        }
                        let Ok(tcp) = TcpStream::connect(upstream).await else { return };
                        let name = ServerName::IpAddress(upstream.ip().into());
                        let Ok(mut server) = connector.connect(name, tcp).await else { return };
                        let head = match drop_param {
                            Some(param) => without_param(&head, param),
                            None => head,
                        };
                        if server.write_all(&close_after(&head)).await.is_err()
                            || server.write_all(&rest).await.is_err()
                        {
                            return;
                        }
                        if let Some(write) = write {
                            // A write is in flight until its answer starts: the client may send
                            // the next one while this connection is still closing.
                            let Some((answer, more)) = read_head(&mut server).await else { return };
                            drop(write);
                            if client.write_all(&answer).await.is_err() || client.write_all(&more).await.is_err() {
                                return;
                            }
                        }
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                }
            }
        });
        Throttle { addr, requests, writes, throttled, release, held, abandoned, accept }
    }

    /// Requests seen, and those answered 429 by HTTP method.
    pub fn counts(&self) -> (u64, BTreeMap<String, u64>) {
        let throttled = self.throttled.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.requests.load(Ordering::Relaxed), throttled)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn request_line(head: &[u8]) -> String {
    String::from_utf8_lossy(head.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned()
}

fn is_deployment_patch(head: &[u8]) -> bool {
    let line = request_line(head);
    line.starts_with("PATCH ") && line.contains("/deployments/")
}

/// One request counted in flight until dropped, raising the most seen at once.
struct InFlight(Arc<(AtomicU64, AtomicU64)>);

impl InFlight {
    fn enter(counts: Arc<(AtomicU64, AtomicU64)>) -> InFlight {
        let now = counts.0.fetch_add(1, Ordering::SeqCst) + 1;
        counts.1.fetch_max(now, Ordering::SeqCst);
        InFlight(counts)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The request head (through the blank line) and whatever was read after it.
async fn read_head(stream: &mut (impl AsyncReadExt + Unpin)) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head with query parameter `param` taken out of its request line.
fn without_param(head: &[u8], param: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let (line, rest) = text.split_once("\r\n").unwrap_or((&text, ""));
    let mut parts: Vec<&str> = line.splitn(3, ' ').collect();
    let Some(target) = parts.get(1).copied() else { return head.to_vec() };
    let rewritten = match target.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query.split('&').filter(|p| p.split('=').next() != Some(param)).collect();
            if kept.is_empty() { path.to_string() } else { format!("{path}?{}", kept.join("&")) }
        }
        None => target.to_string(),
    };
    parts[1] = &rewritten;
    format!("{}\r\n{rest}", parts.join(" ")).into_bytes()
}

/// The head with `Connection: close` instead of any connection header of its own.
fn close_after(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines: Vec<&str> = text.trim_end_matches("\r\n").split("\r\n").collect();
    lines.retain(|l| !l.to_ascii_lowercase().starts_with("connection:"));
    let mut out = lines.join("\r\n");
    out.push_str("\r\nConnection: close\r\n\r\n");
    out.into_bytes()
}
