//! docs/migrating.md tried as written: a Reloader v1 install made by its own chart 2.2.16
//! becomes reloader-fleet with `helm upgrade` of the same release and values file; the first
//! start rolls nothing, the next change rolls once, and `helm rollback` gives Reloader's
//! install back. Reloader's pods run on the fake nodes; what acts is the binary run as the
//! release's pod would run it (its arguments and environment): under the arguments Reloader's
//! chart renders it stands in for Reloader, with the test's own credentials (Reloader's
//! ClusterRole has no `watch` on workloads, which this binary needs: the RBAC that changes);
//! under this chart's, as the release's ServiceAccount.

use crate::support;

use crate::chart::{helm_in, tempfile};
use crate::chart_parity::reloaders_chart;
use crate::support::controller::start_as_pod_of;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{kubeconfig_path, wait_for, with_temp_ns};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;

/// The release's Deployment once a template whose arguments contain `args_contain` has rolled
/// out and is Ready.
async fn rolled_out(api: &Api<Deployment>, name: &str, args_contain: &str) -> Deployment {
    wait_for(&format!("Deployment {name} with {args_contain} rolled out"), || async {
        let d = api.get(name).await.ok()?;
        let container = &d.spec.as_ref()?.template.spec.as_ref()?.containers[0];
        let args = container.args.clone().unwrap_or_default().join(" ");
        let status = d.status.as_ref()?;
        let done = status.observed_generation == d.metadata.generation
            && status.updated_replicas == status.replicas
            && status.ready_replicas == status.replicas;
        (args.contains(args_contain) && done).then_some(d)
    })
    .await
}

fn args(d: &Deployment) -> Vec<String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers[0].args.clone())
        .unwrap_or_default()
}

fn image(d: &Deployment) -> Option<String> {
    d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|p| p.containers[0].image.clone())
}

#[tokio::test]
async fn upgrading_reloaders_release_in_place_rolls_nothing_then_reloads_and_rolls_back() {
    with_temp_ns("migrate", |client, ns| async move {
        let release = ns.clone();
        let fullname = format!("{release}-reloader");
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        // The user's values file, kept as it is; it confines the install to this test's namespace.
        let label = format!("{}=migrate", support::TEST_LABEL);
        let values = tempfile(&format!("reloader:\n  namespaceSelector: '{label}'\n  reloadStrategy: annotations\n"));
        let values = values.to_string_lossy().into_owned();
        let theirs = reloaders_chart();

        // Reloader v1 as its chart installs it, acting on a workload.
        helm_in(&ns, &["install", &release, &theirs, "--values", &values]);
        let reloaders = rolled_out(&deployments, &fullname, "--namespace-selector").await;
        let kubeconfig = kubeconfig_path();
        create_configmap(&client, &ns, "app", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("app").create(&client, &ns).await;
        let reloader = start_as_pod_of(&reloaders, &ns, &kubeconfig, &[]).await;
        wait_stored(&reloader, 1).await;
        patch_configmap(&client, &ns, "app", json!({ "data": { "k": "2" } })).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::Annotations);
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "app", &cm_hash(&[("k", "2")])).await;
        reloader.stop().await;
        let before = deployments.get("web").await.expect("web").metadata.generation;

        // The upgrade in place: the same release name and values file, this chart.
        helm_in(&ns, &["upgrade", &release, crate::chart::CHART, "--values", &values]);
        let ours = rolled_out(&deployments, &fullname, "--namespace-selector").await;
        // The values file means the same: the same arguments, another image.
        assert_eq!(args(&ours), args(&reloaders));
        assert_ne!(image(&ours), image(&reloaders), "the upgrade changed the release's image");
        let kubeconfig = support::login_as(&client, &ns, &fullname).await;
        let controller = start_as_pod_of(&ours, &ns, &kubeconfig, &[]).await;
        wait_stored(&controller, 1).await;
        // The first start rolls nothing: the hash Reloader wrote is the hash it computes. The
        // next change rolls the workload once: one generation more than Reloader left.
        patch_configmap(&client, &ns, "app", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "app", &cm_hash(&[("k", "3")])).await;
        let after = deployments.get("web").await.expect("web").metadata.generation;
        assert_eq!(after, before.map(|g| g + 1), "rolled once for the one change, not at start");
        let refused = controller.refused_calls();
        assert!(refused.is_empty(), "no call refused by the upgraded RBAC: {refused:?}");
        controller.stop().await;

        // Back: helm rollback restores Reloader's release as it was.
        helm_in(&ns, &["rollback", &release, "1"]);
        let back = wait_for("the rollback to restore Reloader's image", || async {
            let d = deployments.get(&fullname).await.ok()?;
            (image(&d) == image(&reloaders)).then_some(d)
        })
        .await;
        let reloader = start_as_pod_of(&back, &ns, &kubeconfig_path(), &[]).await;
        wait_stored(&reloader, 1).await;
        patch_configmap(&client, &ns, "app", json!({ "data": { "k": "4" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "app", &cm_hash(&[("k", "4")])).await;
        reloader.stop().await;
        helm_in(&ns, &["uninstall", &release]);
    })
    .await;
}
