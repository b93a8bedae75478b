//! A controller cut off from the API server reconnects and acts on what changed meanwhile.

use crate::support::controller::Controller;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap};
use crate::support::proxy::{Proxy, api_server_addr, kubeconfig_via};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{wait_for, with_temp_ns};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;

#[tokio::test]
async fn a_change_made_while_the_api_server_was_unreachable_is_acted_on_after_reconnecting() {
    with_temp_ns("reconnect", |client, ns| async move {
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        create_configmap(&client, &ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, &ns).await;

        let proxy = Proxy::start(api_server_addr()).await;
        let kubeconfig = kubeconfig_via(proxy.addr, &ns);
        let scope = format!("--namespaces={ns}");
        let controller = Controller::start_with_kubeconfig(&ns, &ns, &[scope.as_str()], &kubeconfig).await;
        wait_stored(&controller, 1).await;

        proxy.cut();
        wait_for("the controller to notice the cut", || async {
            (controller.metric("reloader_watch_errors_total").await > 0.0).then_some(())
        })
        .await;
        patch_configmap(&client, &ns, "cm", json!({ "data": { "k": "2" } })).await;
        proxy.restore();

        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        controller.stop().await;
    })
    .await;
}
