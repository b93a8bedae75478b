//! `pause-period` on Deployments: the reload pauses the rollout, the pause ends on time even
//! across a restart, and a bad period is reported without blocking the reload.

use crate::support::controller::Controller;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap, workload_json};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{wait_for, with_temp_ns};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;

const PERIOD: &str = "deployment.reloader.stakater.com/pause-period";
const PAUSED_AT: &str = "deployment.reloader.stakater.com/paused-at";

async fn paused(ctx: &Ctx, name: &str) -> (bool, bool) {
    let w = workload_json(&ctx.client, &ctx.ns, Kind::Deployment, name).await;
    (w["spec"]["paused"].as_bool().unwrap_or(false), w["metadata"]["annotations"][PAUSED_AT].is_string())
}

#[tokio::test]
async fn a_reload_pauses_for_the_period_and_resumes_even_after_a_restart() {
    with_temp_ns("pause", |client, ns| async move {
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        create_configmap(&client, &ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "paused")
            .auto()
            .annotate(PERIOD, "3s")
            .env_from_configmap("cm")
            .create(&client, &ns)
            .await;
        Workload::new(Kind::Deployment, "bad-period")
            .auto()
            .annotate(PERIOD, "soon")
            .env_from_configmap("cm")
            .create(&client, &ns)
            .await;
        let scope = format!("--namespaces={ns}");
        let first = Controller::start(&format!("{ns}-1"), &ns, &[scope.as_str()]).await;
        wait_stored(&first, 2).await;

        patch_configmap(&client, &ns, "cm", json!({ "data": { "k": "2" } })).await;
        let hash = cm_hash(&[("k", "2")]);
        ctx.wait_reloaded(Kind::Deployment, "paused", Cm, "cm", &hash).await;
        assert_eq!(paused(&ctx, "paused").await, (true, true), "the reload paused the rollout and recorded when");

        // A bad period: the reload still happens, unpaused, and the workload gets a Warning.
        ctx.wait_reloaded(Kind::Deployment, "bad-period", Cm, "cm", &hash).await;
        assert_eq!(paused(&ctx, "bad-period").await, (false, false));
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        wait_for("a Warning Event on bad-period", || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=bad-period,reason=InvalidAnnotation"))
                .await
                .ok()?;
            (!list.items.is_empty()).then_some(())
        })
        .await;

        // Stopped during the pause; the next controller resumes it when the period is over.
        first.stop().await;
        let second = Controller::start(&format!("{ns}-2"), &ns, &[scope.as_str()]).await;
        wait_for("the pause to end", || async { (paused(&ctx, "paused").await == (false, false)).then_some(()) }).await;
        second.stop().await;
    })
    .await;
}
