//! Issue 41, part 2: custom resources declared with `--custom-kinds-file` are rolled like
//! Deployments, on the real API server with the operators' own CRDs: Knative Serving's
//! `Service` (a pod template at `spec.template`) and VictoriaMetrics' `VMAgent` (the pod's
//! metadata at `spec.podMetadata`, its containers and volumes right under `spec`), plus a
//! made-up `Worker` whose declaration sets a restart field. Both strategies; references are
//! found at the declared paths; `explain` knows the kinds; a replay writes nothing.

use crate::support;

use crate::support::crds;
use crate::support::explain::explain_json;
use crate::support::fixtures::{cm_hash, create_configmap, create_secret, patch_configmap, patch_secret, secret_hash};
use crate::support::scenario::{Ctx, scenario, wait_stored};
use crate::support::wait_for;
use kube::Client;
use kube::api::{ApiResource, DynamicObject, PostParams};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::{Value, json};

const KINDS: &str = "kinds:
  - kind: Service
    apiVersion: serving.knative.dev/v1
    plural: services
    template: spec.template
  - kind: VMAgent
    apiVersion: operator.victoriametrics.com/v1beta1
    plural: vmagents
    podMetadata: spec.podMetadata
    podSpec: spec
  - kind: Worker
    apiVersion: workloads.example.com/v1
    plural: workers
    template: spec.template
    restartField: spec.restartedAt
";

/// One declared kind as the test reads it back.
struct Declared {
    resource: ApiResource,
    /// Where the test finds the pod's metadata and spec in an object, as a pod template.
    as_template: fn(&Value) -> Value,
}

fn template_at_spec_template(object: &Value) -> Value {
    object["spec"]["template"].clone()
}

fn vmagent_pod(object: &Value) -> Value {
    json!({ "metadata": object["spec"]["podMetadata"], "spec": object["spec"] })
}

fn declared(group: &str, version: &str, kind: &str, plural: &str, as_template: fn(&Value) -> Value) -> Declared {
    let api_version = format!("{group}/{version}");
    let resource = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version,
        kind: kind.into(),
        plural: plural.into(),
    };
    Declared { resource, as_template }
}

fn knative() -> Declared {
    declared("serving.knative.dev", "v1", "Service", "services", template_at_spec_template)
}

fn vmagent() -> Declared {
    declared("operator.victoriametrics.com", "v1beta1", "VMAgent", "vmagents", vmagent_pod)
}

fn worker() -> Declared {
    declared("workloads.example.com", "v1", "Worker", "workers", template_at_spec_template)
}

impl Declared {
    async fn get(&self, client: &Client, ns: &str, name: &str) -> Value {
        let api = kube::Api::<DynamicObject>::namespaced_with(client.clone(), ns, &self.resource);
        let object = api.get(name).await.unwrap_or_else(|e| panic!("get {} {name}: {e}", self.resource.kind));
        serde_json::to_value(object).expect("object to JSON")
    }

    async fn create(&self, client: &Client, ns: &str, object: Value) {
        let api = kube::Api::<DynamicObject>::namespaced_with(client.clone(), ns, &self.resource);
        let object: DynamicObject = serde_json::from_value(object).expect("object JSON");
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", self.resource.kind));
    }

    async fn generation(&self, client: &Client, ns: &str, name: &str) -> i64 {
        self.get(client, ns, name).await["metadata"]["generation"].as_i64().unwrap_or(0)
    }

    /// Wait until the object records `hash` for the resource under the scenario's strategy.
    async fn wait_reloaded(
        &self,
        ctx: &Ctx,
        name: &str,
        rkind: reloader_fleet::watch::ResourceKind,
        rname: &str,
        hash: &str,
    ) -> Value {
        let what = format!("{} {name} to record {rname} = {hash}", self.resource.kind);
        wait_for(&what, || async {
            let object = self.get(&ctx.client, &ctx.ns, name).await;
            let view = json!({ "pod": (self.as_template)(&object) });
            (ctx.recorded_in(&view, "/pod", rkind, rname).as_deref() == Some(hash)).then_some(object)
        })
        .await
    }
}

/// A container `app` that reads ConfigMap `app-config` (envFrom) and mounts Secret `db`.
fn app_container() -> Value {
    json!({
        "name": "app", "image": "app:1",
        "envFrom": [{ "configMapRef": { "name": "app-config" } }],
        "volumeMounts": [{ "name": "db", "mountPath": "/db" }]
    })
}

fn db_volume() -> Value {
    json!({ "name": "db", "secret": { "secretName": "db" } })
}

fn auto() -> Value {
    json!({ "reloader.stakater.com/auto": "true" })
}

fn kinds_file() -> String {
    let path = std::env::temp_dir().join(format!("reloader-fleet-custom-kinds-{}.yaml", std::process::id()));
    std::fs::write(&path, KINDS).expect("write the kinds file");
    path.display().to_string()
}

#[tokio::test]
async fn declared_custom_resources_roll_with_both_strategies_at_their_own_paths() {
    let client = support::client().await;
    crds::install(&client, &[crds::KNATIVE_SERVICE, crds::VMAGENT]).await;
    crds::install_yaml(&client, crds::WORKER).await;
    let flag = format!("--custom-kinds-file={}", kinds_file());
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        let flag_in_body = flag.clone();
        scenario("custom-kinds", strategy, &[flag.as_str()], |ctx, controller| async move {
            let flag = flag_in_body;
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            create_secret(c, ns, "db", &[("password", "a")]).await;
            let (knative, vmagent, worker) = (knative(), vmagent(), worker());
            let pod_spec = json!({ "containers": [app_container()], "volumes": [db_volume()] });
            knative
                .create(
                    c,
                    ns,
                    json!({
                        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
                        "metadata": { "name": "web", "annotations": auto() },
                        "spec": { "template": { "metadata": { "annotations": { "team": "web" } }, "spec": pod_spec } }
                    }),
                )
                .await;
            // The operator makes the vmagent container; `containers` adds or patches containers.
            vmagent
                .create(
                    c,
                    ns,
                    json!({
                        "apiVersion": "operator.victoriametrics.com/v1beta1", "kind": "VMAgent",
                        "metadata": { "name": "agent", "annotations": auto() },
                        "spec": {
                            "podMetadata": { "labels": { "team": "metrics" } },
                            "containers": [app_container()], "volumes": [db_volume()], "replicaCount": 1,
                            "remoteWrite": [{ "url": "http://vminsert:8480/insert/0/prometheus/api/v1/write" }]
                        }
                    }),
                )
                .await;
            worker
                .create(
                    c,
                    ns,
                    json!({
                        "apiVersion": "workloads.example.com/v1", "kind": "Worker",
                        "metadata": { "name": "batch", "annotations": auto() },
                        "spec": { "template": { "spec": pod_spec } }
                    }),
                )
                .await;
            wait_stored(&controller, 3).await;

            let report = explain_json(&["vmagents.operator.victoriametrics.com/agent", "-n", ns, &flag]).await;
            let resources: Vec<&str> = report["pairs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["reloads"] == true)
                .filter_map(|p| p["resource"].as_str())
                .collect();
            assert_eq!(
                resources,
                ["app-config", "db"],
                "explain finds the references at the declared paths: {report:#}"
            );
            let writes = report["pairs"][0]["writes"].as_str().unwrap_or_default();
            assert!(writes.contains("at spec.podMetadata and spec (--custom-kinds-file)"), "{report:#}");

            // One change at a time: the annotations strategy records the last one only.
            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let b = cm_hash(&[("mode", "b")]);
            for (declared, name) in [(&knative, "web"), (&vmagent, "agent"), (&worker, "batch")] {
                declared.wait_reloaded(&ctx, name, Cm, "app-config", &b).await;
            }
            patch_secret(c, ns, "db", json!({ "stringData": { "password": "b" } })).await;
            let db_b = secret_hash(&[("password", "b")]);
            for (declared, name) in [(&knative, "web"), (&vmagent, "agent"), (&worker, "batch")] {
                declared.wait_reloaded(&ctx, name, Sec, "db", &db_b).await;
            }
            let web = knative.get(c, ns, "web").await;
            assert_eq!(web["spec"]["template"]["metadata"]["annotations"]["team"], "web", "other annotations stay");
            let agent = vmagent.get(c, ns, "agent").await;
            assert_eq!(agent["spec"]["podMetadata"]["labels"]["team"], "metrics", "the pod's labels stay");
            assert!(agent["spec"]["template"].is_null(), "nothing written at a template path a VMAgent has not");
            let batch = worker.get(c, ns, "batch").await;
            assert!(batch["spec"]["restartedAt"].is_string(), "the declared restart field is set: {batch:#}");
            assert!(web["spec"]["restartedAt"].is_null(), "no restart field where none is declared");

            // A new controller replays nothing it has rolled already.
            let generations = || async {
                [
                    knative.generation(c, ns, "web").await,
                    vmagent.generation(c, ns, "agent").await,
                    worker.generation(c, ns, "batch").await,
                ]
            };
            let before = generations().await;
            controller.stop().await;
            let controller = ctx.start_controller("again", &[flag.as_str()]).await;
            wait_stored(&controller, 3).await;
            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "c" } })).await;
            let c_hash = cm_hash(&[("mode", "c")]);
            for (declared, name) in [(&knative, "web"), (&vmagent, "agent"), (&worker, "batch")] {
                declared.wait_reloaded(&ctx, name, Cm, "app-config", &c_hash).await;
            }
            assert_eq!(
                generations().await,
                before.map(|g| g + 1),
                "one write each for the one change after the restart"
            );
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn a_bad_kinds_file_stops_the_controller_with_what_is_wrong() {
    let path = std::env::temp_dir().join(format!("reloader-fleet-bad-kinds-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "kinds:\n  - kind: Service\n    apiVersion: v1\n    plural: services\n    template: spec.template\n",
    )
    .expect("write the kinds file");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .arg(format!("--custom-kinds-file={}", path.display()))
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .await
        .expect("run the controller");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a bad kinds file must stop the controller: {stderr}");
    assert!(
        stderr.contains("--custom-kinds-file") && stderr.contains("must be group/version"),
        "the error names the flag and the mistake: {stderr}"
    );
}
