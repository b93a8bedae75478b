//! Server-side sharded list and watch (the alpha ShardedListAndWatch feature of Kubernetes
//! 1.36, KEP-5866): a `shardSelector` of FNV-1a ranges of the namespace on a cluster-wide list
//! or watch makes the API server send only the objects of those namespaces, so a replica
//! decodes only its shards' events and a gained shard is a list of its own range alone.
//!
//! kube's watcher knows no such parameter, so a client layer adds it to the list and watch
//! requests of the resources the server was seen to honour it for ([`ServerShards::probe`]:
//! a list answered with `metadata.shardInfo`), never assumed: the selector of every held
//! shard, or, for the watches of a group of gained shards, the group's (the watch names its
//! group with a field selector that the layer takes out). The watches keep filtering by
//! shard on the client, so a server that ignores the selector costs bandwidth, not
//! correctness.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use http::{Method, Request, Uri};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::DynamicObject;
use kube::{Api, Client};
use tower::util::MapRequestLayer;
use tracing::{debug, warn};

use crate::shard::{Placement, Ring};
use crate::watch::Config;
use crate::watch::wire::{SlimSecretProviderClass, SlimSpcPodStatus};

/// The selector every namespace matches: what the probe asks with.
const EVERYTHING: &str = "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')";

/// The paths that take the selector and the selector of the shards held now, shared by the
/// client layer and the watch task.
#[derive(Clone, Default)]
pub struct ServerShards {
    inner: Arc<RwLock<Inner>>,
}

impl std::fmt::Debug for ServerShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths = self.inner.read().map(|inner| inner.paths.len()).unwrap_or(0);
        f.debug_struct("ServerShards").field("sharded_collections", &paths).finish()
    }
}

#[derive(Default)]
struct Inner {
    /// Cluster-wide collection paths (`/api/v1/configmaps`) whose lists and watches the API
    /// server filters by shard.
    paths: HashSet<String>,
    /// The query parameter of the watches of every held shard, percent-encoded; `None`: no
    /// filter.
    parameter: Option<String>,
    /// Watches of gained shards only, by marker (see [`ServerShards::add_group`]): their
    /// parameters, percent-encoded.
    groups: HashMap<String, String>,
    next_group: u64,
}

impl ServerShards {
    /// A client layer adding the selector to GETs of the honoured collection paths (lists and
    /// watches; a request that names its own selector, like the probe, is left alone).
    pub fn layer<B>(&self) -> MapRequestLayer<impl Fn(Request<B>) -> Request<B> + Clone + use<B>> {
        let shards = self.clone();
        MapRequestLayer::new(move |mut req: Request<B>| {
            if req.method() != Method::GET {
                return req;
            }
            let Ok(inner) = shards.inner.read() else { return req };
            let (Some(parameter), true) = (&inner.parameter, inner.paths.contains(req.uri().path())) else {
                return req;
            };
            let query = req.uri().query().unwrap_or("");
            if query.split('&').any(|p| p.starts_with("shardSelector=")) {
                return req;
            }
            // A group's watch names its group in a field selector of its own: that selector
            // goes, the group's shards come instead of all held.
            let group = query.split('&').find_map(|p| {
                let (key, value) = form_urlencoded::parse(p.as_bytes()).next()?;
                (key == "fieldSelector").then(|| inner.groups.get_key_value(value.as_ref()).map(|g| (p, g.1)))?
            });
            let (query, parameter) = match group {
                Some((marker, group)) => {
                    (query.split('&').filter(|p| *p != marker).collect::<Vec<_>>().join("&"), group)
                }
                None => (query.to_string(), parameter),
            };
            let joined = if query.is_empty() { parameter.clone() } else { format!("{query}&{parameter}") };
            if let Ok(uri) = format!("{}?{joined}", req.uri().path()).parse::<Uri>() {
                *req.uri_mut() = uri;
            }
            req
        })
    }

    /// Ask the API server whether it filters lists of the collection at `path` by shard: a
    /// list with a selector must come back with `metadata.shardInfo`. Remembers the answer.
    pub async fn probe(&self, client: &Client, path: &str) -> bool {
        let uri = format!("{path}?limit=1&{}", encode(EVERYTHING));
        let honoured = match Request::get(uri).body(Vec::new()) {
            Ok(request) => match client.request::<serde_json::Value>(request).await {
                Ok(list) => list.pointer("/metadata/shardInfo").is_some(),
                Err(err) => {
                    warn!(path, error = %err, "the shard selector probe failed; filtering by shard on the client");
                    false
                }
            },
            Err(_) => false,
        };
        debug!(path, honoured, "server-side shard selector probe");
        if honoured && let Ok(mut inner) = self.inner.write() {
            inner.paths.insert(path.to_string());
        }
        honoured
    }

    /// Probe every collection the watches of `config` list cluster-wide (nothing in
    /// namespace-scoped mode: those watches are per namespace already); returns the collections
    /// the server filters by shard and those it does not.
    pub async fn probe_watched(&self, client: &Client, config: &Config) -> (Vec<String>, Vec<String>) {
        if config.namespaces.is_some() || config.ring.placement() != Placement::FnvRanges {
            return (Vec::new(), Vec::new());
        }
        let mut paths = Vec::new();
        if config.watch_configmaps {
            paths.push(Api::<ConfigMap>::all(client.clone()).resource_url().to_string());
        }
        if config.watch_secrets {
            paths.push(Api::<Secret>::all(client.clone()).resource_url().to_string());
        }
        if config.csi {
            paths.push(Api::<SlimSpcPodStatus>::all(client.clone()).resource_url().to_string());
            paths.push(Api::<SlimSecretProviderClass>::all(client.clone()).resource_url().to_string());
        }
        for kind in &config.workload_kinds {
            paths.push(Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource()).resource_url().to_string());
        }
        let (mut honoured, mut not) = (Vec::new(), Vec::new());
        for path in paths {
            if self.probe(client, &path).await { honoured.push(path) } else { not.push(path) }
        }
        (honoured, not)
    }

    /// Whether the server filters any watched collection by shard.
    pub fn active(&self) -> bool {
        self.inner.read().is_ok_and(|inner| !inner.paths.is_empty())
    }

    /// Select the namespaces of `owned` from now on (the watches must restart to use it);
    /// forgets every group.
    pub fn select(&self, ring: &Ring, owned: &BTreeSet<u32>) {
        let parameter = ring.shard_selector(owned).map(|selector| encode(&selector));
        if let Ok(mut inner) = self.inner.write() {
            inner.parameter = parameter;
            inner.groups.clear();
        }
    }

    /// Register watches of `shards` alone (shards just gained, while the watches of the others
    /// run on): the field selector to give them, which this layer swaps for the shards'
    /// selector. `None` when the shards cannot be selected alone (all of them).
    pub fn add_group(&self, ring: &Ring, shards: &BTreeSet<u32>) -> Option<String> {
        let parameter = encode(&ring.shard_selector(shards)?);
        let mut inner = self.inner.write().ok()?;
        inner.next_group += 1;
        let marker = format!("metadata.name!=reloader-fleet-shard-group-{}", inner.next_group);
        inner.groups.insert(marker.clone(), parameter);
        Some(marker)
    }

    /// Forget a group whose watches stopped.
    pub fn remove_group(&self, marker: &str) {
        if let Ok(mut inner) = self.inner.write() {
            inner.groups.remove(marker);
        }
    }
}

fn encode(selector: &str) -> String {
    format!("shardSelector={}", form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    async fn sent_uri(shards: &ServerShards, method: Method, uri: &str) -> String {
        let service = tower::service_fn(|req: Request<()>| async move { Ok::<_, std::convert::Infallible>(req) });
        let mut service = shards.layer().layer(service);
        let request = Request::builder().method(method).uri(uri).body(()).expect("a request");
        let sent = service.ready().await.expect("ready").call(request).await.expect("infallible");
        sent.uri().to_string()
    }

    #[tokio::test]
    async fn only_lists_and_watches_of_honoured_paths_carry_the_selector() {
        let shards = ServerShards::default();
        shards.inner.write().expect("lock").paths.insert("/api/v1/configmaps".to_string());
        let ring = Ring::with_placement(16, Placement::FnvRanges).expect("valid");
        shards.select(&ring, &BTreeSet::from([3]));
        let watch = sent_uri(&shards, Method::GET, "/api/v1/configmaps?watch=true&resourceVersion=5").await;
        assert!(watch.starts_with("/api/v1/configmaps?watch=true&resourceVersion=5&shardSelector=shardRange%28"));
        let list = sent_uri(&shards, Method::GET, "/api/v1/configmaps").await;
        assert!(list.starts_with("/api/v1/configmaps?shardSelector="), "{list}");
        for (method, uri) in [
            (Method::GET, "/api/v1/secrets?watch=true"),
            (Method::GET, "/api/v1/namespaces"),
            (Method::PATCH, "/api/v1/configmaps"),
            (Method::GET, "/api/v1/configmaps?shardSelector=x"),
        ] {
            assert_eq!(sent_uri(&shards, method, uri).await, uri, "left alone");
        }
        shards.select(&ring, &(0..16).collect());
        assert_eq!(sent_uri(&shards, Method::GET, "/api/v1/configmaps").await, "/api/v1/configmaps", "all held");
    }

    #[tokio::test]
    async fn a_group_watch_carries_its_own_shards_instead_of_its_marker() {
        let shards = ServerShards::default();
        shards.inner.write().expect("lock").paths.insert("/api/v1/configmaps".to_string());
        let ring = Ring::with_placement(16, Placement::FnvRanges).expect("valid");
        shards.select(&ring, &BTreeSet::from([1, 2]));
        let marker = shards.add_group(&ring, &BTreeSet::from([3])).expect("one shard can be selected");
        let field = form_urlencoded::Serializer::new(String::new()).append_pair("fieldSelector", &marker).finish();
        let sent = sent_uri(&shards, Method::GET, &format!("/api/v1/configmaps?watch=true&{field}")).await;
        let only_3 = encode(&ring.shard_selector(&BTreeSet::from([3])).expect("a selector"));
        assert_eq!(sent, format!("/api/v1/configmaps?watch=true&{only_3}"), "the marker swapped for shard 3");
        let base = sent_uri(&shards, Method::GET, "/api/v1/configmaps?watch=true").await;
        assert!(base.ends_with(&encode(&ring.shard_selector(&BTreeSet::from([1, 2])).expect("a selector"))));
        shards.remove_group(&marker);
        let unknown = sent_uri(&shards, Method::GET, &format!("/api/v1/configmaps?{field}")).await;
        assert!(unknown.starts_with(&format!("/api/v1/configmaps?{field}&shardSelector=")), "{unknown}");
        assert!(shards.add_group(&ring, &(0..16).collect()).is_none(), "all shards: no group");
    }
}
