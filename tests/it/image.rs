//! The image, run for real: its unpacked root filesystem, its entrypoint and user from the
//! image config, the chart's rendered arguments and environment (field references resolved as
//! the kubelet resolves them), a read-only root, and no kubeconfig: in-cluster configuration
//! from `KUBERNETES_SERVICE_HOST`/`PORT` and a ServiceAccount token mounted where the kubelet
//! mounts it, in a private mount namespace (`unshare`; a container runtime does not run on these
//! machines). The chart's probes answer on the paths and port it renders, and the reload suite
//! passes with the chart's RBAC and fails with any one rule of it taken away.
//!
//! `hack/image` builds the image and unpacks it to `target/image/rootfs` (hack/test runs it first).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::time::{Duration, Instant};

use crate::support::controller::{Controller, http_get};
use crate::support::suite::{Login, SuiteRun};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::process::Command;

const IMAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/image");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/reloader");
/// Where the kubelet mounts a pod's ServiceAccount token, CA and namespace.
const SERVICE_ACCOUNT_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";
/// Mounts a pod's root needs beside its files (the runtime makes these mount points).
const MOUNT_POINTS: [&str; 3] = [SERVICE_ACCOUNT_DIR, "proc", "dev"];

/// The image's configuration (`hack/image` writes it next to the root filesystem).
fn image_config() -> Value {
    let path = Path::new(IMAGE).join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no image at {}: {e}. Build it with hack/image (hack/test does).", path.display()));
    serde_json::from_str(&text).expect("the image config is JSON")
}

/// The chart rendered as release `ns` in namespace `ns`: HA (a Lease), restricted to the suite's
/// namespaces by the chart's own selector value.
fn chart_documents(ns: &str) -> Vec<Value> {
    let label = format!("{}=image-rules", support::TEST_LABEL);
    let out = StdCommand::new(support::tool("helm"))
        .args(["template", ns, CHART, "--namespace", ns])
        .args(["--set", "reloader.enableHA=true", "--set-string", &format!("reloader.namespaceSelector={label}")])
        .output()
        .expect("run helm template");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// The chart's container: its arguments, and its environment with the pod's fields resolved.
fn chart_container(ns: &str, pod: &str) -> (Vec<String>, Vec<(String, String)>, Value) {
    let docs = chart_documents(ns);
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("the chart's Deployment");
    let container = deployment["spec"]["template"]["spec"]["containers"][0].clone();
    let args = container["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string));
    let env = support::controller::pod_env(&container, ns, pod);
    (args.collect(), env, container)
}

/// The API server's address and CA, from the local control plane's kubeconfig.
fn api_server() -> (String, String, Vec<u8>) {
    let kubeconfig = kube::config::Kubeconfig::read_from(support::kubeconfig_path()).expect("admin kubeconfig");
    let cluster = kubeconfig.clusters[0].cluster.as_ref().expect("a cluster");
    let server = cluster.server.as_deref().expect("a server URL");
    let hostport = server.trim_start_matches("https://");
    let (host, port) = hostport.rsplit_once(':').expect("host:port");
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster.certificate_authority_data.as_deref().expect("CA data"))
        .expect("base64 CA");
    (host.to_string(), port.to_string(), ca)
}

/// Start the image's entrypoint as the chart's pod would run: see the module doc.
fn start_image(ns: String, login: Login) -> BoxFuture<'static, Option<Controller>> {
    Box::pin(async move {
        let config = image_config();
        let rootfs = PathBuf::from(IMAGE).join("rootfs");
        for dir in MOUNT_POINTS {
            std::fs::create_dir_all(rootfs.join(dir)).expect("a mount point");
        }
        // The projected volume: token, CA and namespace, readable by the pod's user.
        let secrets = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{ns}-serviceaccount"));
        std::fs::create_dir_all(&secrets).expect("the token folder");
        let (host, port, ca) = api_server();
        std::fs::write(secrets.join("token"), &login.token).expect("token");
        std::fs::write(secrets.join("ca.crt"), ca).expect("ca.crt");
        std::fs::write(secrets.join("namespace"), &ns).expect("namespace");

        let pod = format!("{ns}-reloader-7d9f8-x2x4q");
        let (args, env, _) = chart_container(&ns, &pod);
        let entrypoint: Vec<String> = config["config"]["Entrypoint"]
            .as_array()
            .expect("an entrypoint")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let user = config["config"]["User"].as_str().expect("a user").to_string();
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "--", "sh", "-ec", MOUNT_AND_RUN, "run"])
            .arg(&rootfs)
            .arg(&secrets)
            .arg(&user)
            .args(&entrypoint)
            .args(&args)
            .env_clear()
            .envs(env)
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .env("HOSTNAME", &pod);
        let started = Instant::now();
        let controller =
            Controller::try_start_command(&format!("{ns}-image"), command, Duration::from_secs(10)).await?;
        println!("{ns}: the image's process was ready {:.2?} after its start", started.elapsed());
        Some(controller)
    })
}

/// Run in the private mount namespace: the root filesystem read-only, the ServiceAccount
/// folder and /proc and /dev mounted in it, then the entrypoint as the image's user.
/// Arguments: root, ServiceAccount folder, user, entrypoint and its arguments.
const MOUNT_AND_RUN: &str = r#"
root=$1; secrets=$2; user=$3; shift 3
mount --bind "$root" "$root"
mount --bind -o ro "$secrets" "$root/var/run/secrets/kubernetes.io/serviceaccount"
mount -o remount,bind,ro "$root/var/run/secrets/kubernetes.io/serviceaccount"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,size=64k tmpfs "$root/dev"
for dev in null zero random urandom; do touch "$root/dev/$dev"; mount --bind "/dev/$dev" "$root/dev/$dev"; done
mount -o remount,bind,ro "$root"
exec chroot --userspec="$user" "$root" "$@"
"#;

/// The whole chart's RBAC passes the suite through the image's process, and each rule is
/// needed. Before the suite, the chart's probes answer on the paths and port it renders.
const IMAGE_RUN: SuiteRun = SuiteRun {
    prefix: "image-rules",
    documents: chart_documents,
    service_account: |ns| format!("{ns}-reloader"),
    start: start_image,
};

#[tokio::test]
async fn the_image_runs_as_the_charts_pod_and_reloads_with_the_charts_rbac_alone() {
    let config = image_config();
    assert_eq!(config["config"]["User"], "65534:65534", "the image runs as nobody");
    assert!(
        config["config"]["Labels"]["org.opencontainers.image.version"].is_string(),
        "OCI labels: {}",
        config["config"]["Labels"]
    );
    // The probes first, on one run: the rendered paths on the rendered port.
    support::with_temp_ns("image-probes", |client, ns| async move {
        let (login, cluster_scoped) =
            support::suite::apply_and_login(&client, &ns, chart_documents(&ns), &format!("{ns}-reloader")).await;
        let controller = start_image(ns.clone(), login).await.expect("the image's process becomes ready");
        let (_, _, container) = chart_container(&ns, "x");
        let port = container["ports"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "http")).expect("port");
        let port = port["containerPort"].as_u64().expect("a port number");
        for probe in ["livenessProbe", "readinessProbe"] {
            let path = container[probe]["httpGet"]["path"].as_str().expect("an HTTP probe");
            assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
            let answer = http_get(&format!("http://127.0.0.1:{port}{path}")).await;
            assert_eq!(answer.map(|(code, _)| code), Some(200), "{probe} {path} on {port}");
        }
        assert!(controller.refused_calls().is_empty(), "{:?}", controller.refused_calls());
        controller.stop().await;
        support::suite::delete_cluster_scoped(cluster_scoped).await;
    })
    .await;
    support::suite::every_rule_is_needed(&IMAGE_RUN).await;
}

/// A file of the image's OCI archive (`hack/image` writes it), by its path inside.
fn archive_file(inside: &str) -> Vec<u8> {
    let archive = Path::new(IMAGE).join(format!("reloader-fleet-{}.oci.tar", env!("CARGO_PKG_VERSION")));
    let out = StdCommand::new("tar").arg("-xOf").arg(&archive).arg(inside).output().expect("run tar");
    assert!(out.status.success(), "{} has no {inside}: {}", archive.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn archive_json(digest: &str) -> Value {
    let path = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    serde_json::from_slice(&archive_file(&path)).expect("an OCI blob of JSON")
}

/// Issue 53: the archive holds an image index and, for its linux/amd64 image, a CycloneDX SBOM
/// attached as an artifact whose subject is that image's manifest. It lists the crates compiled
/// into the binary (cargo-auditable's list inside it) at the versions Cargo.lock pins, and not
/// the test-only crates or the proc macros and build-script helpers that run only at build time.
#[test]
fn the_archive_carries_an_sbom_of_the_crates_compiled_into_the_binary() {
    let index: Value = serde_json::from_slice(&archive_file("index.json")).expect("index.json");
    let entries = index["manifests"].as_array().expect("manifests");
    let images = archive_json(entries[0]["digest"].as_str().expect("digest"));
    let amd64 = images["manifests"]
        .as_array()
        .expect("an image index")
        .iter()
        .find(|m| m["platform"]["architecture"] == "amd64")
        .expect("a linux/amd64 image");
    let sbom = entries
        .iter()
        .find(|e| e["artifactType"] == "application/vnd.cyclonedx+json")
        .map(|e| archive_json(e["digest"].as_str().expect("digest")))
        .expect("an SBOM artifact in index.json");
    assert_eq!(sbom["subject"]["digest"], amd64["digest"], "the SBOM's subject is the amd64 image");
    let bom = archive_json(sbom["layers"][0]["digest"].as_str().expect("the SBOM layer"));
    assert_eq!((bom["bomFormat"].as_str(), bom["specVersion"].as_str()), (Some("CycloneDX"), Some("1.5")));
    assert_eq!(bom["metadata"]["component"]["name"], "reloader-fleet");

    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).expect("Cargo.lock");
    let components = bom["components"].as_array().expect("components");
    let names: Vec<&str> = components.iter().filter_map(|c| c["name"].as_str()).collect();
    for c in components {
        let (name, version) = (c["name"].as_str().unwrap_or_default(), c["version"].as_str().unwrap_or_default());
        assert!(
            lock.contains(&format!("name = \"{name}\"\nversion = \"{version}\"")),
            "{name} {version} is not in Cargo.lock"
        );
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"));
    }
    for shipped in ["kube-client", "k8s-openapi", "tokio", "serde_json", "sha1", "tikv-jemalloc-sys"] {
        assert!(names.contains(&shipped), "the SBOM lacks {shipped}");
    }
    for not_shipped in ["proptest", "stats_alloc", "serde_derive", "thiserror-impl", "cc"] {
        assert!(!names.contains(&not_shipped), "the SBOM lists {not_shipped}, which is not in the binary");
    }
}
