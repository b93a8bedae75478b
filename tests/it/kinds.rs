//! The kinds beyond Deployments, DaemonSets and StatefulSets, on the real API server: CronJobs
//! (a Job per change), Jobs (created again), Argo Rollouts, OpenShift DeploymentConfigs, and
//! Secrets Store CSI rotations, each with both strategies where Reloader has both.

use crate::support;

use std::collections::BTreeMap;

use crate::support::crds;
use crate::support::explain::explain_json;
use crate::support::fixtures::{
    Kind, KindExt, Workload, annotate_configmap, cm_hash, create_configmap, create_secret, generation, patch_configmap,
    patch_secret, secret_hash, workload_json,
};
use crate::support::scenario::{Ctx, scenario, wait_stored};
use crate::support::wait_for;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use reloader_fleet::reload::{CRONJOB_RELOAD_STRATEGY, RELOADED_HASHES, Strategy};
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec, SecretProviderClass as Spc};
use reloader_fleet::watch::{DataHash, ResourceKind};
use serde_json::{Value, json};

const STRATEGIES: [Strategy; 2] = [Strategy::EnvVars, Strategy::Annotations];
const CHECKPOINT: &str = "reloader-fleet-checkpoint";

/// One container `app` using ConfigMap `cm` (envFrom) and Secret `secret` (a mounted volume).
fn uses_both(w: Workload, cm: &str, secret: &str) -> Workload {
    w.container(json!({
        "name": "app",
        "envFrom": [{ "configMapRef": { "name": cm } }],
        "volumeMounts": [{ "name": "secret", "mountPath": "/secret" }]
    }))
    .volume(json!({ "name": "secret", "secret": { "secretName": secret } }))
}

/// The Jobs whose controller is the CronJob `cronjob`.
async fn jobs_of(client: &Client, ns: &str, cronjob: &str) -> Vec<Value> {
    let jobs = Kind::Job.api(client, ns).list(&ListParams::default()).await.expect("list Jobs");
    jobs.items
        .into_iter()
        .map(|j| serde_json::to_value(j).expect("Job to JSON"))
        .filter(|j| {
            j["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["name"] == cronjob && r["controller"] == true))
        })
        .collect()
}

/// Wait until CronJob `cronjob` has exactly `count` Jobs, one of them recording `hash` for the
/// resource (creation times have whole seconds: two Jobs may not sort by age).
async fn wait_jobs(ctx: &Ctx, cronjob: &str, count: usize, rkind: ResourceKind, rname: &str, hash: &str) {
    let what = format!("CronJob {cronjob} to have {count} Job(s), one recording {rname} = {hash}");
    wait_for(&what, || async {
        let jobs = jobs_of(&ctx.client, &ctx.ns, cronjob).await;
        let recorded = jobs.iter().any(|j| ctx.recorded_in(j, "/spec/template", rkind, rname).as_deref() == Some(hash));
        (jobs.len() == count && recorded).then_some(())
    })
    .await
}

/// Put an older hash of ConfigMap `name` into the stopped controller's checkpoint, as a crash
/// before the checkpoint was saved would leave it: the next start replays that change.
async fn make_checkpoint_stale(ctx: &Ctx, name: &str, old_hash: &str) {
    let key = support::checkpoint::configmap_key(&ctx.ns, name);
    support::checkpoint::rewind(&ctx.client, &ctx.ns, CHECKPOINT, &key, support::checkpoint::short_of(old_hash)).await;
}

#[tokio::test]
async fn a_cronjob_gets_one_job_per_change_also_when_suspended_and_after_a_restart_or_replay() {
    for strategy in STRATEGIES {
        scenario("cronjobs", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            create_secret(c, ns, "app-secret", &[("password", "a")]).await;
            let cj = |name: &str| Workload::new(Kind::CronJob, name);
            uses_both(cj("auto").auto(), "app-config", "app-secret").create(c, ns).await;
            uses_both(cj("suspended").auto().suspended(), "app-config", "app-secret").create(c, ns).await;
            cj("typed")
                .annotate("configmap.reloader.stakater.com/auto", "true")
                .env_from_configmap("app-config")
                .create(c, ns)
                .await;
            // (Every rule on CronJobs: `every_rule_applies_to_cronjobs_jobs_and_rollouts...`.)
            wait_stored(&controller, 3).await;

            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let b = cm_hash(&[("mode", "b")]);
            for name in ["auto", "suspended", "typed"] {
                wait_jobs(&ctx, name, 1, Cm, "app-config", &b).await;
            }

            let job = &jobs_of(c, ns, "auto").await[0];
            let meta = &job["metadata"];
            assert_eq!(meta["generateName"], "auto-");
            assert!(meta["name"].as_str().is_some_and(|n| n.starts_with("auto-")));
            assert_eq!(meta["annotations"]["cronjob.kubernetes.io/instantiate"], "manual");
            assert_eq!(meta["labels"]["app"], "auto", "labels come from the job template");
            let owner = &meta["ownerReferences"][0];
            assert_eq!((owner["kind"].as_str(), owner["apiVersion"].as_str()), (Some("CronJob"), Some("batch/v1")));
            assert_eq!(owner["blockOwnerDeletion"], true);
            let cronjob = workload_json(c, ns, Kind::CronJob, "suspended").await;
            assert_eq!(cronjob["metadata"]["generation"], 1, "the CronJob's spec is never changed");
            assert_eq!(cronjob["spec"]["suspend"], true);
            assert!(cronjob["metadata"]["annotations"][RELOADED_HASHES].as_str().is_some_and(|r| r.contains(&b)));

            // A restart, and a replay of the change from a stale checkpoint: no second Job.
            controller.stop().await;
            make_checkpoint_stale(&ctx, "app-config", &cm_hash(&[("mode", "a")])).await;
            let controller = ctx.start_controller("again", &[]).await;
            // Ready means the take-up (and its replay) is done; a Secret change then makes the
            // second Job of exactly the CronJobs that use the Secret.
            patch_secret(c, ns, "app-secret", json!({ "stringData": { "password": "b" } })).await;
            let s = secret_hash(&[("password", "b")]);
            wait_jobs(&ctx, "auto", 2, Sec, "app-secret", &s).await;
            wait_jobs(&ctx, "suspended", 2, Sec, "app-secret", &s).await;
            assert_eq!(jobs_of(c, ns, "typed").await.len(), 1, "CronJob typed after a restart and a replay");
            controller
        })
        .await;
    }
}

/// Issue 43 (Reloader PR #1100, issue #822): `cronjob-reload-strategy: patch` writes the reload
/// into the CronJob's job template, once per change, and creates no Job (so a suspended CronJob
/// gets none); a replay from a stale checkpoint writes nothing.
#[tokio::test]
async fn a_cronjob_with_the_patch_strategy_gets_its_template_updated_and_no_job() {
    for strategy in STRATEGIES {
        scenario("cronjob-patch", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            for name in ["nightly", "paused"] {
                let cj = Workload::new(Kind::CronJob, name).auto().annotate(CRONJOB_RELOAD_STRATEGY, "patch");
                let cj = if name == "paused" { cj.suspended() } else { cj };
                cj.env_from_configmap("app-config").create(c, ns).await;
            }
            wait_stored(&controller, 2).await;
            for (round, mode) in ["b", "c"].into_iter().enumerate() {
                patch_configmap(c, ns, "app-config", json!({ "data": { "mode": mode } })).await;
                let hash = cm_hash(&[("mode", mode)]);
                for name in ["nightly", "paused"] {
                    wait_for(&format!("{name}'s job template to record {mode}"), || async {
                        let cronjob = workload_json(c, ns, Kind::CronJob, name).await;
                        let recorded = ctx.recorded_in(&cronjob, &Kind::CronJob.template_pointer(), Cm, "app-config");
                        (recorded.as_deref() == Some(hash.as_str())).then_some(cronjob)
                    })
                    .await;
                    assert_eq!(
                        generation(c, ns, Kind::CronJob, name).await,
                        2 + round as i64,
                        "{name}: once per change"
                    );
                    assert!(jobs_of(c, ns, name).await.is_empty(), "{name}: no Job from a change");
                }
            }
            // A replay from a stale checkpoint finds the record and writes nothing.
            controller.stop().await;
            make_checkpoint_stale(&ctx, "app-config", &cm_hash(&[("mode", "b")])).await;
            let controller = ctx.start_controller("again", &[]).await;
            for name in ["nightly", "paused"] {
                assert_eq!(generation(c, ns, Kind::CronJob, name).await, 3, "{name} after a replay");
                assert!(jobs_of(c, ns, name).await.is_empty());
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn a_job_is_created_again_under_its_name_and_a_replay_recreates_nothing() {
    for strategy in STRATEGIES {
        scenario("jobs", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            create_secret(c, ns, "app-secret", &[("password", "a")]).await;
            Workload::new(Kind::Job, "worker").auto().env_from_configmap("app-config").create(c, ns).await;
            Workload::new(Kind::Job, "valuefrom")
                .auto()
                .container(json!({ "name": "app", "env": [{ "name": "P", "valueFrom": { "secretKeyRef": { "name": "app-secret", "key": "password" } } }] }))
                .create(c, ns)
                .await;
            wait_stored(&controller, 2).await;
            let uid = |job: &Value| job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            let first_uid = uid(&workload_json(c, ns, Kind::Job, "worker").await);

            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let b = cm_hash(&[("mode", "b")]);
            let job = wait_for("Job worker to be created again recording the new hash", || async {
                let job = serde_json::to_value(Kind::Job.api(c, ns).get_opt("worker").await.ok()??).ok()?;
                (uid(&job) != first_uid && ctx.recorded_in(&job, "/spec/template", Cm, "app-config").as_deref() == Some(b.as_str()))
                    .then_some(job)
            })
            .await;
            let labels = &job["spec"]["template"]["metadata"]["labels"];
            assert_eq!(labels["batch.kubernetes.io/controller-uid"].as_str(), Some(uid(&job).as_str()), "selector labels are the new Job's");
            assert_eq!(labels["app"], "worker", "the template's own labels are kept");
            patch_secret(c, ns, "app-secret", json!({ "stringData": { "password": "b" } })).await;
            ctx.wait_reloaded(Kind::Job, "valuefrom", Sec, "app-secret", &secret_hash(&[("password", "b")])).await;

            controller.stop().await;
            make_checkpoint_stale(&ctx, "app-config", &cm_hash(&[("mode", "a")])).await;
            let controller = ctx.start_controller("again", &[]).await;
            // Ready: the replay of the stale checkpoint is done, and it found the hash recorded.
            let after = workload_json(c, ns, Kind::Job, "worker").await;
            assert_eq!(uid(&after), uid(&job), "a replayed change must not create the Job again");
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn rollouts_reload_by_template_or_restart_and_catch_up_after_downtime() {
    let client = support::client().await;
    crds::install(&client, &[crds::ROLLOUT]).await;
    for strategy in STRATEGIES {
        scenario("rollouts", strategy, &["--is-Argo-Rollouts=true"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            Workload::new(Kind::Rollout, "canary").auto().env_from_configmap("app-config").create(c, ns).await;
            Workload::new(Kind::Rollout, "restarted")
                .auto()
                .annotate("reloader.stakater.com/rollout-strategy", "restart")
                .env_from_configmap("app-config")
                .create(c, ns)
                .await;
            wait_stored(&controller, 2).await;
            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let b = cm_hash(&[("mode", "b")]);
            ctx.wait_reloaded(Kind::Rollout, "canary", Cm, "app-config", &b).await;
            ctx.wait_reloaded(Kind::Rollout, "restarted", Cm, "app-config", &b).await;
            let restarted = workload_json(c, ns, Kind::Rollout, "restarted").await;
            assert!(restarted["spec"]["restartAt"].is_string(), "restart sets spec.restartAt");
            let canary = workload_json(c, ns, Kind::Rollout, "canary").await;
            assert!(canary["spec"]["restartAt"].is_null(), "the default strategy changes only the template");

            // A change made while no controller runs is acted on once when one returns.
            controller.stop().await;
            let before = generation(c, ns, Kind::Rollout, "canary").await;
            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "c" } })).await;
            let controller = ctx.start_controller("again", &["--is-Argo-Rollouts=true"]).await;
            ctx.wait_reloaded(Kind::Rollout, "canary", Cm, "app-config", &cm_hash(&[("mode", "c")])).await;
            ctx.wait_reloaded(Kind::Rollout, "restarted", Cm, "app-config", &cm_hash(&[("mode", "c")])).await;
            assert_eq!(
                generation(c, ns, Kind::Rollout, "canary").await,
                before + 1,
                "exactly one write for the change"
            );
            controller
        })
        .await;
    }
}

/// Issue 43 (Reloader #1090, PRs #1117/#1118): a Rollout with `spec.workloadRef` runs a
/// Deployment's pod template. Its references are read from that template, and each change
/// restarts the Rollout once (`spec.restartAt`, the record on its metadata); the Deployment is
/// left alone, and a replay restarts nothing.
#[tokio::test]
async fn a_rollout_with_a_workload_ref_is_restarted_once_per_change_of_its_deployments_references() {
    let client = support::client().await;
    crds::install(&client, &[crds::ROLLOUT]).await;
    for strategy in STRATEGIES {
        scenario("rollout-ref", strategy, &["--is-Argo-Rollouts=true"], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            // The template's Deployment, scaled to zero as Argo's docs have it; no Reloader keys.
            let template = Workload::new(Kind::Deployment, "web-template").env_from_configmap("app-config");
            let mut deployment = template.to_json();
            deployment["spec"]["replicas"] = json!(0);
            let deployment: DynamicObject = serde_json::from_value(deployment).expect("Deployment JSON");
            Kind::Deployment.api(c, ns).create(&PostParams::default(), &deployment).await.expect("the Deployment");
            let rollout: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                "metadata": { "name": "web", "annotations": { "reloader.stakater.com/auto": "true" } },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "web-template" } },
                    "workloadRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web-template" },
                    "strategy": { "canary": { "steps": [] } }
                }
            }))
            .expect("Rollout JSON");
            Kind::Rollout.api(c, ns).create(&PostParams::default(), &rollout).await.expect("the Rollout");
            wait_stored(&controller, 2).await;
            let report = explain_json(&["rollout/web", "-n", ns, "--is-Argo-Rollouts=true"]).await;
            let pair = &report["pairs"][0];
            assert_eq!((&pair["resource"], &pair["reloads"]), (&json!("app-config"), &json!(true)), "{report:#}");
            let writes = pair["writes"].as_str().unwrap_or_default();
            assert!(writes.contains("spec.restartAt") && writes.contains("web-template"), "{report:#}");
            for (round, mode) in ["b", "c"].into_iter().enumerate() {
                patch_configmap(c, ns, "app-config", json!({ "data": { "mode": mode } })).await;
                let hash = cm_hash(&[("mode", mode)]);
                let restarted = wait_for(&format!("the Rollout to record {mode}"), || async {
                    let rollout = workload_json(c, ns, Kind::Rollout, "web").await;
                    let record = rollout["metadata"]["annotations"][RELOADED_HASHES].as_str().unwrap_or_default();
                    record.contains(&hash).then_some(rollout)
                })
                .await;
                assert!(restarted["spec"]["restartAt"].is_string(), "a restart");
                assert!(restarted["spec"]["template"].is_null(), "no template written on the Rollout");
                assert_eq!(generation(c, ns, Kind::Rollout, "web").await, 2 + round as i64, "once per change");
            }
            assert_eq!(generation(c, ns, Kind::Deployment, "web-template").await, 1, "the Deployment is left alone");
            controller.stop().await;
            make_checkpoint_stale(&ctx, "app-config", &cm_hash(&[("mode", "b")])).await;
            let controller = ctx.start_controller("again", &["--is-Argo-Rollouts=true"]).await;
            assert_eq!(generation(c, ns, Kind::Rollout, "web").await, 3, "a replay restarts nothing");
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn deploymentconfigs_roll_when_enabled_or_detected_and_are_skipped_when_not_served() {
    let client = support::client().await;
    // Only this test touches the DeploymentConfig CRD (CRDs are cluster-wide).
    crds::uninstall(&client, "deploymentconfigs.apps.openshift.io").await;
    scenario("dc-absent", Strategy::EnvVars, &["--is-openshift=auto"], |ctx, controller| async move {
        // Ready without the CRD: nothing was watched that cannot be listed.
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        assert!(log.contains("watching these workload kinds") && !log.contains("DeploymentConfig]"), "{log}");
        let _ = ctx;
        controller
    })
    .await;
    crds::install_yaml(&client, crds::DEPLOYMENT_CONFIG).await;
    // Enabled by the flag and by detection; every rule, both strategies.
    for (flag, strategy) in [("--is-openshift=true", Strategy::EnvVars), ("--is-openshift=", Strategy::Annotations)] {
        scenario("dc", strategy, &[flag], |ctx, controller| async move {
            let reads = controller.api_reads().await;
            every_rule_applies_to(&ctx, &controller, Kind::DeploymentConfig).await;
            assert_eq!(controller.api_reads().await, reads, "changes cost no LIST or GET");
            assert_eq!(
                generation(&ctx.client, &ctx.ns, Kind::DeploymentConfig, "auto").await,
                3,
                "one write per change ({flag})"
            );
            controller
        })
        .await;
    }
}

fn spc_api(client: &Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "secrets-store.csi.x-k8s.io".into(),
        version: "v1".into(),
        api_version: "secrets-store.csi.x-k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Create a SecretProviderClass, annotated as given.
async fn create_class(client: &Client, ns: &str, name: &str, annotations: Value) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClass",
        "metadata": { "name": name, "annotations": annotations },
        "spec": { "provider": "vault", "parameters": { "roleName": "app" } }
    }))
    .expect("class JSON");
    let api = spc_api(client, ns, "SecretProviderClass", "secretproviderclasses");
    api.create(&PostParams::default(), &object).await.expect("create the SecretProviderClass");
}

/// Write the pod status of `pod` for `class` as the CSI driver does, reporting `version`.
async fn report(client: &Client, ns: &str, pod: &str, class: &str, version: &str) {
    let api = spc_api(client, ns, "SecretProviderClassPodStatus", "secretproviderclasspodstatuses");
    let name = format!("{pod}-{ns}-{class}");
    let object = json!({
        "apiVersion": "secrets-store.csi.x-k8s.io/v1", "kind": "SecretProviderClassPodStatus",
        "metadata": { "name": name, "labels": { "secrets-store.csi.k8s.io/node-name": "fake-node-0" } },
        "status": { "podName": pod, "secretProviderClassName": class, "mounted": true, "targetPath": "/var/lib/kubelet",
                    "objects": [{ "id": "secret/password", "version": version }] }
    });
    let params = PatchParams::apply("secrets-store-csi-driver").force();
    api.patch(&name, &params, &Patch::Apply(&object)).await.expect("write the pod status");
}

fn spc_hash(class: &str, version: &str) -> String {
    DataHash::of_secret_provider_class(class, [("secret/password", version)]).to_string()
}

#[tokio::test]
async fn a_csi_rotation_reported_by_five_pods_rolls_the_workload_once() {
    let client = support::client().await;
    crds::install(&client, &crds::SECRETS_STORE).await;
    for strategy in STRATEGIES {
        // Pod statuses carry no user labels: the resource label selector must not filter them
        // (with Reloader v1 it silently turns CSI reloads off).
        let args = ["--enable-csi-integration", "--resource-label-selector=team=payments"];
        scenario("csi", strategy, &args, |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_class(c, ns, "vault", json!({})).await;
            create_class(c, ns, "quiet", json!({ "reloader.stakater.com/ignore": "true" })).await;
            let mounts = |w: Workload, class: &str| {
                w.container(
                    json!({ "name": "app", "volumeMounts": [{ "name": "secrets", "mountPath": "/mnt/secrets" }] }),
                )
                .volume(json!({ "name": "secrets", "csi": { "driver": "secrets-store.csi.k8s.io", "readOnly": true,
                                   "volumeAttributes": { "secretProviderClass": class } } }))
            };
            mounts(
                Workload::new(Kind::Deployment, "web")
                    .annotate("secretproviderclass.reloader.stakater.com/auto", "true"),
                "vault",
            )
            .create(c, ns)
            .await;
            mounts(Workload::new(Kind::Deployment, "ignored").auto(), "quiet").create(c, ns).await;
            for pod in 0..5 {
                report(c, ns, &format!("web-{pod}"), "vault", "v1").await;
            }
            report(c, ns, "ignored-0", "quiet", "v1").await;
            wait_stored(&controller, 2).await;
            wait_for("the controller to store both classes' states", || async {
                (controller.metric("reloader_store_objects{kind=\"resources\"}").await >= 2.0).then_some(())
            })
            .await;
            let skipped = "reloader_skipped_total{reason=\"no_data_change\"}";
            let skipped_before = controller.metric(skipped).await;
            let reads_before = controller.api_reads().await;

            // A label-only change of a pod status is no rotation.
            let api = spc_api(c, ns, "SecretProviderClassPodStatus", "secretproviderclasspodstatuses");
            api.patch(
                &format!("web-0-{ns}-vault"),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
            )
            .await
            .expect("label a pod status");
            // The ignored class rotates first: the same watch delivers its update before the others.
            report(c, ns, "ignored-0", "quiet", "v2").await;
            for pod in 0..5 {
                report(c, ns, &format!("web-{pod}"), "vault", "v2").await;
            }
            let v2 = spc_hash("vault", "v2");
            ctx.wait_reloaded(Kind::Deployment, "web", Spc, "vault", &v2).await;
            // The four later reports of the same rotation are each a change already acted on.
            wait_for("the four other pods' reports to be handled", || async {
                (controller.metric(skipped).await >= skipped_before + 4.0).then_some(())
            })
            .await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, 2, "five reports of one rotation roll once");
            assert_eq!(
                controller.api_reads().await,
                reads_before,
                "a rotation costs no LIST or GET (the class is in the store)"
            );
            assert_eq!(generation(c, ns, Kind::Deployment, "ignored").await, 1, "an ignored class rolls nothing");
            let env = ctx.recorded(Kind::Deployment, "web", Spc, "vault").await;
            if strategy == Strategy::EnvVars {
                let object = workload_json(c, ns, Kind::Deployment, "web").await;
                let names: BTreeMap<String, Value> = object["spec"]["template"]["spec"]["containers"][0]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| (e["name"].as_str().unwrap_or_default().to_string(), e["value"].clone()))
                    .collect();
                assert_eq!(names.get("STAKATER_VAULT_SECRETPROVIDERCLASS"), Some(&json!(v2)), "{names:?}");
            }
            assert_eq!(env.as_deref(), Some(v2.as_str()));
            // `reloader explain` folds the pod statuses as the watches do: the class's state is
            // the rotation, and the ignored class is named as such.
            let report = explain_json(&["spc/vault", "-n", ns, "--enable-csi-integration"]).await;
            assert_eq!(report["found"], true, "{report:#}");
            assert_eq!(report["pairs"][0]["current_hash"], json!(v2), "{report:#}");
            assert_eq!(report["pairs"][0]["reloads"], true, "{report:#}");
            let quiet = explain_json(&["spc/quiet", "-n", ns, "--enable-csi-integration"]).await;
            assert_eq!(quiet["pairs"][0]["rule"], "resource-ignored", "{quiet:#}");
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn without_the_csi_flag_nothing_csi_is_watched() {
    let client = support::client().await;
    crds::install(&client, &crds::SECRETS_STORE).await;
    scenario("csi-off", Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_class(c, ns, "vault", json!({})).await;
        report(c, ns, "web-0", "vault", "v1").await;
        report(c, ns, "web-0", "vault", "v2").await;
        // The other watches are running (a ConfigMap is stored); a CSI one would count its events.
        create_configmap(c, ns, "sentinel", &[("k", "v")]).await;
        support::scenario::wait_stored_resources(&controller, 1).await;
        let metrics = controller.metrics().await;
        assert!(!metrics.contains("secretproviderclasspodstatuses"), "no CSI events may be received:\n{metrics}");
        controller
    })
    .await;
}

#[tokio::test]
async fn ignored_workload_types_leave_cronjobs_and_jobs_alone() {
    for (types, jobs_roll) in [("cronjobs", true), ("jobs,cronjobs", false)] {
        let flag = format!("--ignored-workload-types={types}");
        scenario("ignored-types", Strategy::EnvVars, &[flag.as_str()], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            Workload::new(Kind::CronJob, "nightly").auto().env_from_configmap("app-config").create(c, ns).await;
            Workload::new(Kind::Job, "batch").auto().env_from_configmap("app-config").create(c, ns).await;
            Workload::new(Kind::Deployment, "sentinel").auto().env_from_configmap("app-config").create(c, ns).await;
            // Ignored kinds are not even watched.
            wait_stored(&controller, if jobs_roll { 2 } else { 1 }).await;
            let uid = workload_json(c, ns, Kind::Job, "batch").await["metadata"]["uid"].clone();
            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let b = cm_hash(&[("mode", "b")]);
            ctx.wait_reloaded(Kind::Deployment, "sentinel", Cm, "app-config", &b).await;
            if jobs_roll {
                ctx.wait_reloaded(Kind::Job, "batch", Cm, "app-config", &b).await;
            } else {
                assert_eq!(workload_json(c, ns, Kind::Job, "batch").await["metadata"]["uid"], uid, "{types}: Job kept");
            }
            assert!(jobs_of(c, ns, "nightly").await.is_empty(), "{types}: no Job for an ignored CronJob");
            controller
        })
        .await;
    }
}

/// Whether workload `name` of `kind` records `hash` for the resource: in its pod template, or
/// for a CronJob in one of its Jobs.
async fn has_recorded(ctx: &Ctx, kind: Kind, name: &str, rkind: ResourceKind, rname: &str, hash: &str) -> bool {
    if kind == Kind::CronJob {
        let jobs = jobs_of(&ctx.client, &ctx.ns, name).await;
        return jobs.iter().any(|j| ctx.recorded_in(j, "/spec/template", rkind, rname).as_deref() == Some(hash));
    }
    ctx.recorded(kind, name, rkind, rname).await.as_deref() == Some(hash)
}

async fn wait_recorded(ctx: &Ctx, kind: Kind, name: &str, rkind: ResourceKind, rname: &str, hash: &str) {
    wait_for(&format!("{kind:?} {name} to record {rname} = {hash}"), || async {
        has_recorded(ctx, kind, name, rkind, rname, hash).await.then_some(())
    })
    .await;
}

/// Reloader's rules on one kind: auto, typed auto, an explicit list, search + match, the
/// exclude list and `ignore` on the resource, for a ConfigMap and a Secret change. The
/// negatives are checked once a positive of the same change (or of a later one, in the same
/// watch) shows the change handled.
async fn every_rule_applies_to(ctx: &Ctx, controller: &support::controller::Controller, kind: Kind) {
    let (c, ns) = (&ctx.client, ctx.ns.as_str());
    create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
    annotate_configmap(c, ns, "app-config", "reloader.stakater.com/match", "true").await;
    create_configmap(c, ns, "quiet-config", &[("mode", "a")]).await;
    annotate_configmap(c, ns, "quiet-config", "reloader.stakater.com/ignore", "true").await;
    create_secret(c, ns, "app-secret", &[("password", "a")]).await;
    let w = |name: &str| Workload::new(kind, name);
    uses_both(w("auto").auto(), "app-config", "app-secret").create(c, ns).await;
    uses_both(w("typed").annotate("configmap.reloader.stakater.com/auto", "true"), "app-config", "app-secret")
        .create(c, ns)
        .await;
    w("explicit")
        .annotate("secret.reloader.stakater.com/reload", "app-.*")
        .container(json!({ "name": "plain" }))
        .create(c, ns)
        .await;
    w("search").annotate("reloader.stakater.com/search", "true").env_from_configmap("app-config").create(c, ns).await;
    uses_both(
        w("excluded").auto().annotate("secrets.exclude.reloader.stakater.com/reload", "app-secret"),
        "app-config",
        "app-secret",
    )
    .create(c, ns)
    .await;
    w("quiet").auto().env_from_configmap("quiet-config").create(c, ns).await;
    wait_stored(controller, 6).await;

    patch_configmap(c, ns, "quiet-config", json!({ "data": { "mode": "b" } })).await;
    patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
    let cm = cm_hash(&[("mode", "b")]);
    for name in ["auto", "typed", "search", "excluded"] {
        wait_recorded(ctx, kind, name, Cm, "app-config", &cm).await;
    }
    assert!(
        !has_recorded(ctx, kind, "explicit", Cm, "app-config", &cm).await,
        "{kind:?}: a Secret list ignores ConfigMaps"
    );
    assert!(
        !has_recorded(ctx, kind, "quiet", Cm, "quiet-config", &cm).await,
        "{kind:?}: an ignored ConfigMap rolls nothing"
    );

    patch_secret(c, ns, "app-secret", json!({ "stringData": { "password": "b" } })).await;
    let secret = secret_hash(&[("password", "b")]);
    for name in ["auto", "explicit"] {
        wait_recorded(ctx, kind, name, Sec, "app-secret", &secret).await;
    }
    assert!(
        !has_recorded(ctx, kind, "typed", Sec, "app-secret", &secret).await,
        "{kind:?}: typed auto is ConfigMaps only"
    );
    assert!(!has_recorded(ctx, kind, "excluded", Sec, "app-secret", &secret).await, "{kind:?}: an excluded Secret");
}

#[tokio::test]
async fn every_rule_applies_to_cronjobs_jobs_and_rollouts_in_both_strategies() {
    let client = support::client().await;
    crds::install(&client, &[crds::ROLLOUT]).await;
    for kind in [Kind::CronJob, Kind::Job, Kind::Rollout] {
        for strategy in STRATEGIES {
            let name = format!("rules-{kind:?}").to_lowercase();
            scenario(&name, strategy, &["--is-Argo-Rollouts=true"], |ctx, controller| async move {
                every_rule_applies_to(&ctx, &controller, kind).await;
                controller
            })
            .await;
        }
    }
}

/// Issue 49: a CronJob's job template (or a Job's spec) is kept for its write only up to 64 KiB,
/// so that no object's size decides the controller's memory; a larger one is read with a GET
/// when its reload comes, and the CronJob still gets its Job with the new hash.
#[tokio::test]
async fn a_cronjob_too_large_to_keep_still_gets_its_job() {
    scenario("big-cronjob", Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
        let big = json!({ "name": "job", "envFrom": [{ "configMapRef": { "name": "app-config" } }],
                          "env": [{ "name": "PAYLOAD", "value": "x".repeat(reloader_fleet::watch::RAW_LIMIT + 1) }] });
        Workload::new(Kind::CronJob, "large").auto().container(big).create(c, ns).await;
        wait_stored(&controller, 1).await;
        patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
        wait_jobs(&ctx, "large", 1, Cm, "app-config", &cm_hash(&[("mode", "b")])).await;
        let job = &jobs_of(c, ns, "large").await[0];
        let payload = job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"].as_str().unwrap_or_default();
        assert_eq!(payload.len(), reloader_fleet::watch::RAW_LIMIT + 1, "the Job has the whole template");
        controller
    })
    .await;
}
