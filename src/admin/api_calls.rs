//! Counts this process's own Kubernetes API calls by verb and resource, so that "no LIST or
//! GET per change" is something a test and an operator can check.

use http::{Method, Request};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};
use tower::util::MapRequestLayer;

use crate::client::is_watch;
use crate::metrics::{int_counter_vec, int_gauge};

/// `reloader_api_requests_total{verb, resource}`; verbs are Kubernetes verbs (get, list,
/// watch, create, update, patch, delete). And `reloader_api_response_bytes_total{request}`:
/// the body bytes received, for watches and for other requests, so that what server-side
/// sharding saves each replica can be read off. And `reloader_api_streams_per_connection`: the
/// requests the client keeps open on one HTTP/2 connection (the server's limit, less a few).
#[derive(Clone)]
pub struct ApiCalls {
    requests: IntCounterVec,
    response_bytes: IntCounterVec,
    streams_per_connection: IntGauge,
}

impl ApiCalls {
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = int_counter_vec(
            registry,
            "reloader_api_requests_total",
            "Kubernetes API requests sent, by verb and resource",
            &["verb", "resource"],
        )?;
        let response_bytes = int_counter_vec(
            registry,
            "reloader_api_response_bytes_total",
            "Response body bytes received from the Kubernetes API",
            &["request"],
        )?;
        let streams_per_connection = int_gauge(
            registry,
            "reloader_api_streams_per_connection",
            "Requests kept open on one HTTP/2 connection to the Kubernetes API, at most",
        )?;
        Ok(ApiCalls { requests, response_bytes, streams_per_connection })
    }

    /// The gauge of requests kept open on one connection (set once the client is built).
    pub fn streams_per_connection(&self) -> IntGauge {
        self.streams_per_connection.clone()
    }

    /// The counter of response body bytes of watches (`watch`) or of other requests.
    pub fn response_bytes(&self, watch: bool) -> IntCounter {
        self.response_bytes.with_label_values(&[if watch { "watch" } else { "other" }])
    }

    /// A client layer that counts every request passing through it.
    pub fn layer<B>(&self) -> MapRequestLayer<impl Fn(Request<B>) -> Request<B> + Clone + use<B>> {
        let requests = self.requests.clone();
        MapRequestLayer::new(move |req: Request<B>| {
            let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query().unwrap_or(""));
            requests.with_label_values(&[verb, resource]).inc();
            req
        })
    }
}

/// Kubernetes verb and resource of a request path such as
/// `/apis/apps/v1/namespaces/ns/deployments/web` or `/api/v1/configmaps?watch=true`.
fn classify<'a>(method: &Method, path: &'a str, query: &str) -> (&'static str, &'a str) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // Skip "api/v1" or "apis/<group>/<version>", then an optional "namespaces/<ns>".
    let mut rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or(&[]),
        Some(&"apis") => segments.get(3..).unwrap_or(&[]),
        _ => &[],
    };
    if rest.len() > 2 && rest[0] == "namespaces" {
        rest = &rest[2..];
    }
    let Some(resource) = rest.first().copied() else {
        // Discovery, /version and other non-resource paths.
        return (if *method == Method::GET { "get" } else { "other" }, "nonresource");
    };
    let named = rest.len() > 1;
    let watching = is_watch(Some(query));
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_kubernetes_verb() {
        assert_eq!(
            classify(&Method::GET, "/api/v1/configmaps", "watch=true&resourceVersion=1"),
            ("watch", "configmaps")
        );
        assert_eq!(classify(&Method::GET, "/api/v1/configmaps", "limit=500"), ("list", "configmaps"));
        assert_eq!(classify(&Method::GET, "/api/v1/namespaces/a/configmaps/b", ""), ("get", "configmaps"));
        assert_eq!(classify(&Method::GET, "/apis/apps/v1/namespaces/a/deployments", ""), ("list", "deployments"));
        assert_eq!(
            classify(&Method::PATCH, "/apis/apps/v1/namespaces/a/deployments/web", ""),
            ("patch", "deployments")
        );
        assert_eq!(classify(&Method::GET, "/version", ""), ("get", "nonresource"));
    }
}
