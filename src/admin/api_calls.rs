//! Counts this process's own Kubernetes API calls by verb and resource, so that "no LIST or
//! GET per change" is something a test and an operator can check.

use http::{Method, Request};
use prometheus::{IntCounterVec, Opts, Registry};
use tower::util::MapRequestLayer;

/// `reloader_api_requests_total{verb, resource}`; verbs are Kubernetes verbs (get, list,
/// watch, create, update, patch, delete).
#[derive(Clone)]
pub struct ApiCalls {
    requests: IntCounterVec,
}

impl ApiCalls {
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new("reloader_api_requests_total", "Kubernetes API requests sent, by verb and resource"),
            &["verb", "resource"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        Ok(ApiCalls { requests })
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
    let watching = query.split('&').any(|p| p == "watch=true" || p == "watch=1");
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
