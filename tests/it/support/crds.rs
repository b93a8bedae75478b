//! CustomResourceDefinitions of the custom kinds the controller rolls, installed into the local
//! control plane: Argo Rollouts', the Secrets Store CSI driver's, Knative Serving's and the
//! VictoriaMetrics operator's come from their projects' Go modules (`hack/cluster up` copies
//! them to `.cluster/crds/`); OpenShift's DeploymentConfig and a made-up `Worker` are written
//! by hand (`tests/crds/`).

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

use super::wait_for;

/// The Argo Rollouts `Rollout` CRD file in `.cluster/crds/`.
pub const ROLLOUT: &str = "rollout-crd.yaml";
/// The Secrets Store CSI CRD files in `.cluster/crds/`.
pub const SECRETS_STORE: [&str; 2] = [
    "secrets-store.csi.x-k8s.io_secretproviderclasses.yaml",
    "secrets-store.csi.x-k8s.io_secretproviderclasspodstatuses.yaml",
];
/// Knative Serving's `Service` and VictoriaMetrics' `VMAgent` CRD files in `.cluster/crds/`:
/// two operators' kinds declared with `--custom-kinds-file`.
pub const KNATIVE_SERVICE: &str = "knative-service-crd.yaml";
pub const VMAGENT: &str = "vmagent-crd.yaml";
/// A made-up kind with a restart field, written for the tests.
pub const WORKER: &str = include_str!("../../crds/worker.yaml");
/// The DeploymentConfig CRD, written for the tests.
pub const DEPLOYMENT_CONFIG: &str = include_str!("../../crds/deploymentconfig.yaml");

fn crd_dir() -> PathBuf {
    super::kubeconfig_path().parent().map(|p| p.join("crds")).unwrap_or_else(|| PathBuf::from(".cluster/crds"))
}

/// Install (server-side apply) the CRDs of these files in `.cluster/crds/` and wait until each
/// is established. Idempotent, so tests running at once may all call it.
pub async fn install(client: &Client, files: &[&str]) {
    for file in files {
        let path = crd_dir().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("reading {} ({e}); `hack/cluster up` puts the pinned CRDs there", path.display())
        });
        install_yaml(client, &text).await;
    }
}

/// Install one CRD given as YAML and wait until it is established.
pub async fn install_yaml(client: &Client, yaml: &str) {
    let crd: CustomResourceDefinition = serde_saphyr::from_str(yaml.trim_start_matches("---\n")).expect("a CRD");
    let name = crd.metadata.name.clone().expect("a named CRD");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("reloader-fleet-tests").force();
    api.patch(&name, &params, &Patch::Apply(&crd)).await.unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    wait_for(&format!("CRD {name} to be established"), || async {
        let crd = api.get(&name).await.ok()?;
        let conditions = crd.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

/// Delete a CRD by name and wait until it is gone (its objects go with it).
pub async fn uninstall(client: &Client, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait_for(&format!("CRD {name} to be gone"), || async {
        matches!(api.get(name).await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
}
