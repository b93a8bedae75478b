//! One watch response read as events, line by line, holding no buffer between lines: the
//! reader the list-watch loop, the bridge and the seeds share.

use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use http::HeaderValue;
use http_body::Body as _;
use hyper::body::Bytes;
use kube::api::WatchParams;
use kube::client::Body;
use kube::core::{Status, WatchEvent};
use kube::runtime::watcher::{self, InitialListStrategy};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// How long a watch may stay silent past the timeout it asked the server for (kube's margin).
/// How long a watch may stay silent past the timeout it asked the server for (kube's margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);
/// The watch timeout asked for when the config names none (kube's).
const DEFAULT_TIMEOUT_S: u32 = 290;

pub(super) fn watch_params(config: &watcher::Config, initial_events: bool) -> WatchParams {
    WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        bookmarks: config.bookmarks,
        send_initial_events: initial_events && config.initial_list_strategy == InitialListStrategy::StreamingList,
    }
}

/// The events of one watch response, read line by line.
pub(super) struct Events<K> {
    body: Body,
    lines: Lines,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource + DeserializeOwned> Events<K> {
    pub(super) async fn open(
        api: &Api<K>,
        client: &Client,
        params: &WatchParams,
        version: &str,
    ) -> kube::Result<Events<K>> {
        let mut request =
            kube::core::Request::new(api.resource_url()).watch(params, version).map_err(kube::Error::BuildRequest)?;
        // As kube does: each watch event is a gzip member of its own, which its decoder mishandles.
        request.headers_mut().insert(http::header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        request.extensions_mut().insert("watch");
        let response = client.send(request.map(Body::from)).await?;
        let status = response.status();
        let mut events = Events { body: response.into_body(), lines: Lines::default(), kind: PhantomData };
        if status.is_client_error() || status.is_server_error() {
            let mut text = Vec::new();
            while let Some(chunk) = events.next_chunk().await {
                text.extend_from_slice(&chunk?);
            }
            let failure = serde_json::from_slice::<Status>(&text).unwrap_or_else(|_| {
                Status::failure(String::from_utf8_lossy(&text).trim(), "Failed to parse error data")
                    .with_code(status.as_u16())
            });
            return Err(kube::Error::Api(failure.boxed()));
        }
        Ok(events)
    }

    /// The next event; `None` when the watch ended, or was silent past its timeout.
    pub(super) async fn next(&mut self, timeout: Option<u32>) -> Option<kube::Result<WatchEvent<K>>> {
        if timeout == Some(0) {
            return self.next_event().await;
        }
        let idle = Duration::from_secs(u64::from(timeout.unwrap_or(DEFAULT_TIMEOUT_S))) + IDLE_MARGIN;
        tokio::time::timeout(idle, self.next_event()).await.unwrap_or(None)
    }

    async fn next_event(&mut self) -> Option<kube::Result<WatchEvent<K>>> {
        loop {
            let line = self.next_line().await?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(serde_json::from_slice::<WatchEvent<K>>(&line).map_err(|err| {
                // A line that is no event is an error the server sent as a bare Status.
                match serde_json::from_slice::<Status>(&line) {
                    Ok(status) => kube::Error::Api(status.boxed()),
                    Err(_) => kube::Error::SerdeError(err),
                }
            }));
        }
    }

    /// The next whole line. A read error ends the watch as its end does (kube ends it on the
    /// errors a dropped connection gives), so that it resumes from its last resourceVersion.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.lines.next() {
                return Some(line);
            }
            match self.next_chunk().await {
                Some(Ok(chunk)) => self.lines.push(chunk),
                Some(Err(err)) => {
                    tracing::debug!(error = %err, "watch response ended by a read error; resuming");
                    return None;
                }
                // An unfinished last line is no event.
                None => return None,
            }
        }
    }

    async fn next_chunk(&mut self) -> Option<kube::Result<Bytes>> {
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await?;
            match frame.map(http_body::Frame::into_data) {
                Ok(Ok(data)) => return Some(Ok(data)),
                // Trailers: no data.
                Ok(Err(_)) => {}
                Err(err) => return Some(Err(err)),
            }
        }
    }
}

/// Splits the frames of a response body into lines. A line inside one frame is a slice of it;
/// only a line that spans frames is copied, and nothing is kept between lines.
#[derive(Default)]
struct Lines {
    /// What is left of the last frame.
    chunk: Bytes,
    /// The start of a line that an earlier frame did not finish.
    partial: Vec<u8>,
}

impl Lines {
    /// The next whole line (with its newline) of the frames pushed, if they hold one.
    fn next(&mut self) -> Option<Bytes> {
        let Some(end) = self.chunk.iter().position(|&b| b == b'\n') else {
            self.partial.extend_from_slice(&self.chunk);
            // An empty slice still holds the frame's allocation.
            self.chunk = Bytes::new();
            return None;
        };
        let line = self.chunk.split_to(end + 1);
        if self.chunk.is_empty() {
            self.chunk = Bytes::new();
        }
        if self.partial.is_empty() {
            return Some(line);
        }
        self.partial.extend_from_slice(&line);
        Some(Bytes::from(std::mem::take(&mut self.partial)))
    }

    /// The next frame, once [`Lines::next`] found no line in what came before.
    fn push(&mut self, frame: Bytes) {
        self.partial.extend_from_slice(&self.chunk);
        self.chunk = frame;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(frames: &[&str]) -> (Vec<String>, Lines) {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for frame in frames {
            while let Some(line) = lines.next() {
                out.push(String::from_utf8_lossy(&line).into_owned());
            }
            lines.push(Bytes::copy_from_slice(frame.as_bytes()));
        }
        while let Some(line) = lines.next() {
            out.push(String::from_utf8_lossy(&line).into_owned());
        }
        (out, lines)
    }

    #[test]
    fn lines_split_across_frames_are_joined_and_nothing_is_kept_between_lines() {
        let (out, lines) = lines_of(&["{\"a\":1}\n{\"b\"", ":2}\n", "{\"c\":", "", "3}\n{\"d\":4}\n"]);
        assert_eq!(out, ["{\"a\":1}\n", "{\"b\":2}\n", "{\"c\":3}\n", "{\"d\":4}\n"]);
        assert!(lines.chunk.is_empty() && lines.partial.capacity() == 0, "an idle watch holds no buffer");
    }

    #[test]
    fn an_unfinished_line_is_held_until_its_end_comes() {
        let (out, lines) = lines_of(&["{\"a\":1}\n{\"b\""]);
        assert_eq!(out, ["{\"a\":1}\n"]);
        assert_eq!(lines.partial, b"{\"b\"");
    }

    /// Two events in two frames, split at every byte, decode to the same two events.
    #[test]
    fn events_split_at_every_byte_decode_the_same() {
        let text = concat!(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"1"}}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"2"}}}"#,
            "\n"
        );
        for split in 0..text.len() {
            let (out, _) = lines_of(&[&text[..split], &text[split..]]);
            let events: Vec<WatchEvent<k8s_openapi::api::core::v1::ConfigMap>> =
                out.iter().map(|l| serde_json::from_str(l).expect("an event")).collect();
            assert!(matches!(&events[..], [WatchEvent::Added(a), WatchEvent::Bookmark(b)]
                if a.metadata.name.as_deref() == Some("a") && b.metadata.resource_version == "2"));
        }
    }
}
