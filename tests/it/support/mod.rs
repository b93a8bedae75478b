//! Test helpers for integration tests against the project's real control plane (`hack/cluster`).
//!
//! Every test gets its own randomly named namespace, labelled with the test name, deleted
//! afterwards even when the test panics. Waits poll a condition until a deadline; they never
//! sleep and hope.

pub mod checkpoint;
pub mod controller;
pub mod crds;
pub mod explain;
pub mod fixtures;
pub mod fleet;
pub mod proxy;
pub mod receiver;
pub mod scenario;
pub mod suite;
pub mod throttle;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Label put on every namespace a test creates, with the test's name as value.
pub const TEST_LABEL: &str = "reloader-fleet.test";

/// How long a test waits for the control plane to do something before it fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Where `hack/cluster up` writes its kubeconfig.
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cluster/kubeconfig"))
}

/// A client for the local control plane. Panics with instructions when none is running, so a
/// missing control plane is a loud failure, never a silent skip.
pub async fn client() -> Client {
    client_from(&kubeconfig_path()).await
}

/// A client for the control plane as `path` reaches it (the admin kubeconfig, or one through a
/// proxy).
pub async fn client_from(path: &std::path::Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).unwrap_or_else(|err| {
        panic!(
            "no control plane: cannot read kubeconfig {} ({err}). \
             Start one with `hack/cluster up --nodes 2`, or run everything with `hack/test`.",
            path.display()
        )
    });
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig written by hack/cluster is valid");
    let client = Client::try_from(config).expect("client from a valid config");
    if let Err(err) = client.apiserver_version().await {
        panic!(
            "no control plane: the API server in {} does not answer ({err}). \
             Start one with `hack/cluster up --nodes 2`, or run everything with `hack/test`.",
            path.display()
        );
    }
    client
}

/// Run `test` with a fresh namespace, then delete the namespace whether the test passed or not.
pub async fn with_temp_ns<F, Fut>(test_name: &str, test: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let name = format!("t-{}-{}", short(test_name), random_suffix());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { TEST_LABEL: short(test_name) } }
    }))
    .expect("static namespace JSON");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|err| panic!("creating namespace {name}: {err}"));

    let outcome = std::panic::AssertUnwindSafe(test(client, name.clone())).catch_unwind().await;

    if let Err(err) = namespaces.delete(&name, &DeleteParams::background()).await {
        eprintln!("warning: deleting test namespace {name}: {err}");
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Poll `check` until it returns `Some`, failing the test with `what` after [`DEADLINE`].
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {DEADLINE:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A DNS-label-safe prefix of the test name (namespace names are at most 63 characters).
fn short(test_name: &str) -> String {
    let cleaned: String =
        test_name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    cleaned.trim_matches('-').chars().take(40).collect::<String>().trim_end_matches('-').to_string()
}

fn random_suffix() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    );
    format!("{:08x}", hasher.finish() as u32)
}

/// A kubeconfig (written under the test target folder) that authenticates as ServiceAccount
/// `name` of `ns` with a token of its own: what the controller runs as in a pod.
pub async fn login_as(client: &Client, ns: &str, name: &str) -> PathBuf {
    kubeconfig_with_token(ns, name, &token_for(client, ns, name).await)
}

/// A token for ServiceAccount `name` of `ns` (TokenRequest, an hour), as the kubelet mounts one.
pub async fn token_for(client: &Client, ns: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({ "spec": { "audiences": [], "expirationSeconds": 3600 } }))
            .expect("token request JSON");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token for the ServiceAccount")
        .status
        .expect("token status")
        .token
        .expect("a token in the status")
}

/// A kubeconfig for the local control plane that authenticates with `token`.
pub fn kubeconfig_with_token(ns: &str, name: &str, token: &str) -> PathBuf {
    let admin = Kubeconfig::read_from(kubeconfig_path()).expect("admin kubeconfig");
    let cluster = admin.clusters[0].cluster.as_ref().expect("a cluster entry");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "local", "cluster": {
            "server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data } }],
        "users": [{ "name": "reloader", "user": { "token": token } }],
        "contexts": [{ "name": "local", "context": { "cluster": "local", "user": "reloader" } }],
        "current-context": "local"
    });
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{ns}-{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig.to_string()).expect("write kubeconfig");
    path
}

/// The path of a tool `hack/tools` builds from its pinned Go module (helm, kubectl,
/// prometheus); built on first use.
pub fn tool(name: &str) -> PathBuf {
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/tools"))
        .arg(name)
        .output()
        .expect("run hack/tools");
    assert!(out.status.success(), "hack/tools {name} failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
