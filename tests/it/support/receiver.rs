//! A local HTTP receiver (axum on 127.0.0.1) standing in for Slack, Teams, Google Chat, a
//! webhook or an HTTP proxy: it records every request and answers with the status it is told.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request target: a path, or an absolute URL when sent to a proxy.
    pub uri: String,
    pub content_type: String,
    pub body: String,
    /// The status this receiver answered.
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    received: Vec<Received>,
    /// Statuses to answer next, in order; 200 once they run out.
    script: VecDeque<u16>,
    /// Answer this to everything (after the script), e.g. 503 for an outage.
    fallback: Option<u16>,
    /// Requests whose body contains this are held unanswered until [`Receiver::release`].
    hold: Option<String>,
    /// Requests held now.
    held: usize,
}

/// A running receiver; stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    released: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let released = Arc::new(tokio::sync::Notify::new());
        let app = Router::new().fallback(record).with_state((inner.clone(), released.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let addr = listener.local_addr().expect("the receiver's address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, inner, released, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answer these statuses to the next requests, then 200 (or the fallback).
    pub fn script(&self, statuses: &[u16]) {
        self.lock().script.extend(statuses);
    }

    /// Answer `status` to every request from now on (`None`: 200 again).
    pub fn answer_always(&self, status: Option<u16>) {
        self.lock().fallback = status;
    }

    /// Hold every request whose body contains `text` unanswered until [`Receiver::release`]
    /// (a receiver that hangs).
    pub fn hold(&self, text: &str) {
        self.lock().hold = Some(text.to_string());
    }

    /// Answer the held requests, and hold no more.
    pub fn release(&self) {
        self.lock().hold = None;
        self.released.notify_waiters();
    }

    /// Requests held unanswered now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The requests answered 200: the ones a sender counts as delivered.
    pub fn delivered(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.status == 200).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Shared = (Arc<Mutex<Inner>>, Arc<tokio::sync::Notify>);

async fn record(State((inner, released)): State<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    let text = String::from_utf8_lossy(&body).to_string();
    let lock = || inner.lock().unwrap_or_else(|p| p.into_inner());
    if lock().hold.as_ref().is_some_and(|h| text.contains(h.as_str())) {
        let release = released.notified();
        lock().held += 1;
        release.await;
        lock().held -= 1;
    }
    let mut inner = lock();
    let status = inner.script.pop_front().or(inner.fallback).unwrap_or(200);
    inner.received.push(Received {
        uri: uri.to_string(),
        content_type: headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string(),
        body: text,
        status,
    });
    StatusCode::from_u16(status).unwrap_or(StatusCode::OK)
}
