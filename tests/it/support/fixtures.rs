//! Small builders for the objects tests create, and readers for what the controller recorded.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use reloader_fleet::reload::{LAST_RELOADED_FROM, env_var_name};
use reloader_fleet::watch::{DataHash, PodPlace, ResourceKind};
use serde_json::{Value, json};

/// The workload kinds, as the controller's own table has them.
pub use reloader_fleet::watch::WorkloadKind as Kind;

/// The kinds patched in place, which every reload-rule test covers.
pub const ALL_KINDS: [Kind; 3] = [Kind::Deployment, Kind::DaemonSet, Kind::StatefulSet];

/// What tests do with a kind, from the controller's kind table.
pub trait KindExt {
    fn api(self, client: &Client, ns: &str) -> Api<DynamicObject>;
    /// Where the pod template sits in an object of this kind (a JSON pointer).
    fn template_pointer(self) -> String;
}

impl KindExt for Kind {
    fn api(self, client: &Client, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), ns, &self.api_resource())
    }

    fn template_pointer(self) -> String {
        match self.spec().pod {
            PodPlace::Template(path) => format!("/spec/{}", path.join("/")),
            PodPlace::Split { .. } => panic!("{} has no pod template", self.kind()),
        }
    }
}

/// A workload under construction: `Workload::new(Kind::Deployment, "web").auto()...`.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: Kind,
    pub name: String,
    annotations: BTreeMap<String, String>,
    template_annotations: BTreeMap<String, String>,
    containers: Vec<Value>,
    init_containers: Vec<Value>,
    volumes: Vec<Value>,
    suspended: bool,
}

impl Workload {
    pub fn new(kind: Kind, name: &str) -> Self {
        Workload {
            kind,
            name: name.to_string(),
            annotations: BTreeMap::new(),
            template_annotations: BTreeMap::new(),
            containers: vec![],
            init_containers: vec![],
            volumes: vec![],
            suspended: false,
        }
    }

    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    pub fn annotate_template(mut self, key: &str, value: &str) -> Self {
        self.template_annotations.insert(key.to_string(), value.to_string());
        self
    }

    pub fn auto(self) -> Self {
        self.annotate("reloader.stakater.com/auto", "true")
    }

    /// Add a container (JSON of a core/v1 Container; `image` is filled in).
    pub fn container(mut self, mut container: Value) -> Self {
        container["image"] = json!("registry.invalid/app:1");
        self.containers.push(container);
        self
    }

    pub fn init_container(mut self, mut container: Value) -> Self {
        container["image"] = json!("registry.invalid/init:1");
        self.init_containers.push(container);
        self
    }

    pub fn volume(mut self, volume: Value) -> Self {
        self.volumes.push(volume);
        self
    }

    /// One container `app` taking every key of ConfigMap `cm` as env vars.
    pub fn env_from_configmap(self, cm: &str) -> Self {
        self.container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": cm } }] }))
    }

    pub fn to_json(&self) -> Value {
        let labels = json!({ "app": self.name });
        let mut template = json!({
            "metadata": { "labels": labels, "annotations": self.template_annotations },
            "spec": { "containers": self.containers, "initContainers": self.init_containers, "volumes": self.volumes }
        });
        if matches!(self.kind, Kind::CronJob | Kind::Job) {
            template["spec"]["restartPolicy"] = json!("Never");
        }
        let selector = json!({ "matchLabels": labels });
        let spec = match self.kind {
            Kind::Deployment | Kind::Rollout => json!({ "replicas": 1, "selector": selector, "template": template }),
            Kind::StatefulSet => {
                json!({ "replicas": 1, "serviceName": self.name, "selector": selector, "template": template })
            }
            Kind::DaemonSet => json!({ "selector": selector, "template": template }),
            Kind::DeploymentConfig => json!({ "replicas": 1, "selector": labels, "template": template }),
            Kind::Job => json!({ "backoffLimit": 0, "template": template }),
            Kind::CronJob => json!({
                "schedule": "0 0 1 1 *",
                "suspend": self.suspended,
                "jobTemplate": { "metadata": { "labels": labels }, "spec": { "backoffLimit": 0, "template": template } }
            }),
            Kind::Custom(_) => json!({ "template": template }),
        };
        let kind = self.kind;
        json!({
            "apiVersion": kind.api_version(), "kind": kind.kind(),
            "metadata": { "name": self.name, "annotations": self.annotations },
            "spec": spec
        })
    }

    /// A suspended CronJob (Reloader still creates its Job on a change).
    pub fn suspended(mut self) -> Self {
        self.suspended = true;
        self
    }

    pub async fn create(&self, client: &Client, ns: &str) {
        let object: DynamicObject = serde_json::from_value(self.to_json()).expect("workload JSON");
        self.kind
            .api(client, ns)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {:?} {}: {e}", self.kind, self.name));
    }
}

/// Create namespace `name` with `labels` (a JSON object of label keys and values).
pub async fn create_namespace(client: &Client, name: &str, labels: Value) {
    let ns: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).expect("namespace JSON");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create namespace");
}

pub async fn create_configmap(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": name },
        "data": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()
    }))
    .expect("configmap JSON");
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("create configmap {name}: {e}"));
}

/// Merge-patch a ConfigMap (data, labels, annotations...).
pub async fn patch_configmap(client: &Client, ns: &str, name: &str, patch: Value) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch configmap {name}: {e}"));
}

/// Set one annotation on a ConfigMap (`match`, `ignore`...).
pub async fn annotate_configmap(client: &Client, ns: &str, name: &str, key: &str, value: &str) {
    patch_configmap(client, ns, name, json!({ "metadata": { "annotations": { key: value } } })).await;
}

pub async fn create_secret(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": name },
        "stringData": data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()
    }))
    .expect("secret JSON");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create secret {name}: {e}"));
}

pub async fn patch_secret(client: &Client, ns: &str, name: &str, patch: Value) {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch secret {name}: {e}"));
}

/// Reloader's hash of ConfigMap data, as the workload should record it.
pub fn cm_hash(data: &[(&str, &str)]) -> String {
    let map = data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    DataHash::of_configmap(&map, &BTreeMap::new()).to_string()
}

pub fn secret_hash(data: &[(&str, &str)]) -> String {
    let map = data.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
    DataHash::of_secret(&map).to_string()
}

/// What a workload records for a resource, per strategy: the `STAKATER_*` env var value (and
/// the container holding it), or the hash in `last-reloaded-from` when it names the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub hash: String,
    pub container: String,
}

/// The object as JSON, or `None` while it does not exist (a Job between its deletion and its
/// creation again).
pub async fn workload_json_opt(client: &Client, ns: &str, kind: Kind, name: &str) -> Option<Value> {
    let object = kind.api(client, ns).get_opt(name).await.unwrap_or_else(|e| panic!("get {kind:?} {name}: {e}"))?;
    Some(serde_json::to_value(object).expect("object to JSON"))
}

pub async fn workload_json(client: &Client, ns: &str, kind: Kind, name: &str) -> Value {
    let object = kind.api(client, ns).get(name).await.unwrap_or_else(|e| panic!("get {kind:?} {name}: {e}"));
    serde_json::to_value(object).expect("object to JSON")
}

pub async fn recorded_env(
    client: &Client,
    ns: &str,
    kind: Kind,
    name: &str,
    rkind: ResourceKind,
    rname: &str,
) -> Option<Recorded> {
    let w = workload_json(client, ns, kind, name).await;
    recorded_env_in(&kind.template_pointer(), &w, rkind, rname)
}

/// The `STAKATER_*` record in an object's pod template (`template` at `pointer`).
pub fn recorded_env_in(pointer: &str, object: &Value, rkind: ResourceKind, rname: &str) -> Option<Recorded> {
    let template = object.pointer(pointer)?;
    let var = env_var_name(rname, rkind);
    let containers = template["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers.iter().find_map(|c| {
        let env = c["env"].as_array()?;
        let value = env.iter().find(|e| e["name"] == var.as_str())?["value"].as_str()?.to_string();
        Some(Recorded { hash: value, container: c["name"].as_str().unwrap_or_default().to_string() })
    })
}

pub async fn recorded_annotation(client: &Client, ns: &str, kind: Kind, name: &str) -> Option<Value> {
    let w = workload_json(client, ns, kind, name).await;
    recorded_annotation_in(&kind.template_pointer(), &w)
}

/// The parsed `last-reloaded-from` of an object's pod template at `pointer`.
pub fn recorded_annotation_in(pointer: &str, object: &Value) -> Option<Value> {
    let text = object.pointer(pointer)?["metadata"]["annotations"][LAST_RELOADED_FROM].as_str()?.to_string();
    serde_json::from_str(&text).ok()
}

/// The pod template's generation-visible state: `metadata.generation` of the workload.
pub async fn generation(client: &Client, ns: &str, kind: Kind, name: &str) -> i64 {
    workload_json(client, ns, kind, name).await["metadata"]["generation"].as_i64().unwrap_or(0)
}

/// Delete namespaces a test created besides its own (in the background, errors ignored: the
/// test is over).
pub async fn delete_namespaces(client: &Client, namespaces: &[String]) {
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let _ = api.delete(ns, &kube::api::DeleteParams::background()).await;
    }
}

/// Wait until every replica of Deployment `name` is Ready (kwok plays the kubelet), and return it.
pub async fn wait_deployment_ready(client: &Client, ns: &str, name: &str) -> k8s_openapi::api::apps::v1::Deployment {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), ns);
    super::wait_for(&format!("Deployment {ns}/{name}'s pods Ready"), || async {
        let d = api.get(name).await.ok()?;
        let wanted = d.spec.as_ref()?.replicas.unwrap_or(1);
        (d.status.as_ref()?.ready_replicas.unwrap_or(0) == wanted).then_some(d)
    })
    .await
}
