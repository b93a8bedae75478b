//! One test scenario: a fresh namespace, a controller scoped to it, and checks of what the
//! controller recorded on workloads, for either strategy.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind;

use super::controller::Controller;
use serde_json::Value;

use super::fixtures::{Kind, KindExt, recorded_annotation_in, recorded_env_in, workload_json_opt};
use super::{wait_for, with_temp_ns};

/// What a scenario body gets.
#[derive(Clone)]
pub struct Ctx {
    pub client: Client,
    pub ns: String,
    pub strategy: Strategy,
    /// Set by [`Ctx::expect_lint_findings`]; else a scenario ends by checking that the
    /// annotation lint found nothing in its objects.
    lint_findings_expected: Arc<AtomicBool>,
}

/// Run `body` in a new namespace with a controller started with `--namespaces=<ns>`, the
/// strategy, and `args`. The controller is stopped gracefully afterwards.
pub async fn scenario<F, Fut>(name: &str, strategy: Strategy, args: &[&str], body: F)
where
    F: FnOnce(Ctx, Controller) -> Fut,
    Fut: Future<Output = Controller>,
{
    let test = format!(
        "{name}-{}",
        match strategy {
            Strategy::EnvVars => "env",
            Strategy::Annotations => "ann",
        }
    );
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    with_temp_ns(&test, |client, ns| async move {
        let mut all = vec![format!("--namespaces={ns}"), format!("--reload-strategy={strategy}")];
        all.extend(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let controller = Controller::start(&ns, &ns, &refs).await;
        let expected = Arc::new(AtomicBool::new(false));
        let ctx = Ctx::new(client, ns, strategy);
        let ctx = Ctx { lint_findings_expected: expected.clone(), ..ctx };
        let controller = body(ctx, controller).await;
        if !expected.load(Ordering::Relaxed) {
            let findings = lint_findings(&controller).await;
            assert_eq!(
                findings,
                0.0,
                "the annotation lint found mistakes in this test's objects; see {}",
                controller.log.display()
            );
        }
        controller.stop().await;
    })
    .await;
}

impl Ctx {
    pub fn new(client: Client, ns: String, strategy: Strategy) -> Ctx {
        Ctx { client, ns, strategy, lint_findings_expected: Arc::default() }
    }

    /// This scenario's objects carry mistakes on purpose: skip the final lint check.
    pub fn expect_lint_findings(&self) {
        self.lint_findings_expected.store(true, Ordering::Relaxed);
    }

    /// Start another controller scoped to this namespace with this strategy and `extra` flags
    /// (as a restart of the scenario's controller would).
    pub async fn start_controller(&self, name: &str, extra: &[&str]) -> Controller {
        let ns = format!("--namespaces={}", self.ns);
        let strategy = format!("--reload-strategy={}", self.strategy);
        let mut args = vec![ns.as_str(), strategy.as_str()];
        args.extend_from_slice(extra);
        Controller::start(&format!("{}-{name}", self.ns), &self.ns, &args).await
    }

    /// The hash the workload records for the resource, under this scenario's strategy.
    pub async fn recorded(&self, kind: Kind, workload: &str, rkind: ResourceKind, rname: &str) -> Option<String> {
        let object = workload_json_opt(&self.client, &self.ns, kind, workload).await?;
        self.recorded_in(&object, &kind.template_pointer(), rkind, rname)
    }

    /// The hash the pod template at `pointer` in `object` records for the resource.
    pub fn recorded_in(&self, object: &Value, pointer: &str, rkind: ResourceKind, rname: &str) -> Option<String> {
        match self.strategy {
            Strategy::EnvVars => recorded_env_in(pointer, object, rkind, rname).map(|r| r.hash),
            Strategy::Annotations => {
                let source = recorded_annotation_in(pointer, object)?;
                (source["type"] == rkind.type_suffix() && source["name"] == rname)
                    .then(|| source["hash"].as_str().unwrap_or_default().to_string())
            }
        }
    }

    /// Wait until the workload records `hash` for the resource.
    pub async fn wait_reloaded(&self, kind: Kind, workload: &str, rkind: ResourceKind, rname: &str, hash: &str) {
        let what = format!("{kind:?} {}/{workload} to record {} {rname} = {hash}", self.ns, rkind.kind());
        wait_for(&what, || async {
            (self.recorded(kind, workload, rkind, rname).await.as_deref() == Some(hash)).then_some(())
        })
        .await;
    }

    /// Assert the workload does not record `hash` for the resource (call after a sentinel
    /// proved the controller has processed the change).
    pub async fn assert_not_reloaded(&self, kind: Kind, workload: &str, rkind: ResourceKind, rname: &str, hash: &str) {
        let recorded = self.recorded(kind, workload, rkind, rname).await;
        assert_ne!(
            recorded.as_deref(),
            Some(hash),
            "{kind:?} {workload} must not have been reloaded for {} {rname}",
            rkind.kind()
        );
    }
}

/// Wait until the controller's store holds at least these many workloads, so that changes
/// made next are matched against them.
pub async fn wait_stored(controller: &Controller, workloads: usize) {
    wait_for(&format!("the controller to store {workloads} workloads"), || async {
        (controller.metric("reloader_store_objects{kind=\"workloads\"}").await >= workloads as f64).then_some(())
    })
    .await;
}

/// Wait until the annotation lint has checked everything the watches passed it (all received,
/// no workload waiting), then the number of findings it reported.
pub async fn lint_findings(controller: &Controller) -> f64 {
    wait_for("the annotation lint to be idle", || async {
        let sent = controller.metric("reloader_annotation_lint_queued_total{result=\"sent\"}").await;
        let received = controller.metric("reloader_annotation_lint_received_total").await;
        let pending = controller.metric("reloader_annotation_lint_pending").await;
        (sent == received && pending == 0.0).then_some(())
    })
    .await;
    controller.metric_sum("reloader_annotation_lint_findings_total").await
}

/// Wait until the controller's store holds at least these many ConfigMaps and Secrets.
pub async fn wait_stored_resources(controller: &Controller, resources: usize) {
    wait_for(&format!("the controller to store {resources} resources"), || async {
        (controller.metric("reloader_store_objects{kind=\"resources\"}").await >= resources as f64).then_some(())
    })
    .await;
}

/// Wait until `controller` watches CronJobs again (the metric and the warning gone), then check
/// that a CronJob is reloaded: a change of `cm` to `k=value` makes it a Job.
pub async fn cronjobs_watched_and_reloaded(controller: &Controller, client: &Client, ns: &str, value: &str) {
    wait_for("CronJobs watched again", || async {
        let gone = controller.metric("reloader_watch_kinds_forbidden{kind=\"CronJob\"}").await == 0.0;
        let clear = !controller.get("/readyz").await.contains("cronjobs");
        (gone && clear).then_some(())
    })
    .await;
    let name = format!("nightly-{value}");
    super::fixtures::Workload::new(Kind::CronJob, &name).auto().env_from_configmap("cm").create(client, ns).await;
    wait_for("the CronJob stored", || async {
        (controller.metric("reloader_store_objects{kind=\"workloads\"}").await >= 2.0).then_some(())
    })
    .await;
    super::fixtures::patch_configmap(client, ns, "cm", serde_json::json!({ "data": { "k": value } })).await;
    wait_for("a Job of the CronJob", || async {
        let jobs = Kind::Job.api(client, ns).list(&Default::default()).await.ok()?;
        jobs.items.iter().any(|j| j.metadata.name.as_deref().is_some_and(|n| n.starts_with(&name))).then_some(())
    })
    .await;
}
