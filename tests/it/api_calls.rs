//! After the initial sync, changes cost exactly the writes they need: no LIST and no GET
//! (Reloader issues one LIST per workload kind per change). Counted by the controller's own
//! client layer, `reloader_api_requests_total{verb, resource}`.

use crate::support;

use crate::support::controller::Controller;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap};
use crate::support::scenario::{scenario, wait_stored};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;

const WORKLOADS: usize = 4;
const UPDATES: usize = 6;

/// Sum of `reloader_api_requests_total` over series whose labels contain every filter.
async fn calls(controller: &Controller, filters: &[&str]) -> f64 {
    controller
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("reloader_api_requests_total{") && filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn changes_cost_only_their_writes_and_no_list_or_get() {
    scenario("api-calls", Strategy::EnvVars, &[], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "0")]).await;
        for i in 0..WORKLOADS {
            Workload::new(Kind::Deployment, &format!("web-{i}")).auto().env_from_configmap("cm").create(c, ns).await;
        }
        wait_stored(&controller, WORKLOADS).await;
        let lists = calls(&controller, &["verb=\"list\""]).await;
        let gets = calls(&controller, &["verb=\"get\""]).await;
        let patches = calls(&controller, &["verb=\"patch\"", "resource=\"deployments\""]).await;

        for n in 1..=UPDATES {
            let value = n.to_string();
            patch_configmap(c, ns, "cm", json!({ "data": { "k": value } })).await;
            let hash = cm_hash(&[("k", &value)]);
            for i in 0..WORKLOADS {
                ctx.wait_reloaded(Kind::Deployment, &format!("web-{i}"), Cm, "cm", &hash).await;
            }
        }

        let new_lists = calls(&controller, &["verb=\"list\""]).await - lists;
        let new_gets = calls(&controller, &["verb=\"get\""]).await - gets;
        let new_patches = calls(&controller, &["verb=\"patch\"", "resource=\"deployments\""]).await - patches;
        println!("{UPDATES} updates x {WORKLOADS} workloads: {new_patches} PATCH, {new_lists} LIST, {new_gets} GET");
        assert_eq!(new_lists, 0.0, "a change must not LIST");
        assert_eq!(new_gets, 0.0, "a change must not GET");
        assert_eq!(new_patches, (UPDATES * WORKLOADS) as f64, "exactly one PATCH per workload per change");
        controller
    })
    .await;
}

#[tokio::test]
async fn every_kind_costs_only_its_writes_per_change_and_no_list_or_get() {
    let client = support::client().await;
    support::crds::install(&client, &[support::crds::ROLLOUT]).await;
    scenario("api-calls-kinds", Strategy::EnvVars, &["--is-Argo-Rollouts=true"], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "0")]).await;
        for kind in [Kind::CronJob, Kind::Job, Kind::Rollout, Kind::StatefulSet] {
            Workload::new(kind, &format!("{kind:?}").to_lowercase()).auto().env_from_configmap("cm").create(c, ns).await;
        }
        wait_stored(&controller, 4).await;
        let (lists, gets) = (calls(&controller, &["verb=\"list\""]).await, calls(&controller, &["verb=\"get\""]).await);
        let writes = |verb: &str, resource: &str| {
            let filters = [format!("verb=\"{verb}\""), format!("resource=\"{resource}\"")];
            let controller = &controller;
            async move { calls(controller, &[filters[0].as_str(), filters[1].as_str()]).await }
        };
        let before = [
            writes("create", "jobs").await,
            writes("delete", "jobs").await,
            writes("patch", "cronjobs").await,
            writes("patch", "rollouts").await,
        ];
        for n in 1..=UPDATES {
            let value = n.to_string();
            patch_configmap(c, ns, "cm", json!({ "data": { "k": value } })).await;
            let hash = cm_hash(&[("k", &value)]);
            for kind in [Kind::Job, Kind::Rollout, Kind::StatefulSet] {
                ctx.wait_reloaded(kind, &format!("{kind:?}").to_lowercase(), Cm, "cm", &hash).await;
            }
            support::wait_for("the CronJob's record of the change", || async {
                let cronjob = support::fixtures::workload_json(c, ns, Kind::CronJob, "cronjob").await;
                let record = cronjob["metadata"]["annotations"][reloader_fleet::reload::RELOADED_HASHES].as_str()?.to_string();
                record.contains(&hash).then_some(())
            })
            .await;
        }
        let after = [
            writes("create", "jobs").await,
            writes("delete", "jobs").await,
            writes("patch", "cronjobs").await,
            writes("patch", "rollouts").await,
        ];
        let new_lists = calls(&controller, &["verb=\"list\""]).await - lists;
        let new_gets = calls(&controller, &["verb=\"get\""]).await - gets;
        let delta: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        println!(
            "{UPDATES} updates: Jobs created {}, Jobs deleted {}, CronJob patches {}, Rollout patches {}; {new_lists} LIST, {new_gets} GET",
            delta[0], delta[1], delta[2], delta[3]
        );
        assert_eq!(new_lists, 0.0, "a change must not LIST");
        assert_eq!(new_gets, 0.0, "a change must not GET");
        let n = UPDATES as f64;
        assert_eq!(delta, vec![2.0 * n, n, n, n], "a Job per CronJob change, one recreation of the Job, one record, one Rollout patch");
        controller
    })
    .await;
}
