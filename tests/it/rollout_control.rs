//! Coalesced rollouts and the rollout budget on the real API server: changes of a ConfigMap and
//! a Secret 100 ms apart make one rollout within a window and two without; a restart inside
//! the window loses neither hash; 300 Deployments on one ConfigMap are rolled at no more than
//! the budget a second, none lost across a SIGTERM of the replica serving them; a Secret
//! rewritten 10 times a second is damped to one rollout per window.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::controller::{Controller, start_fleet_replica_with};
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_secret, generation, patch_configmap, patch_secret, secret_hash,
};
use crate::support::scenario::{Ctx, scenario, wait_stored};
use crate::support::{kubeconfig_path, wait_for, with_temp_ns};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use reloader_fleet::reload::{COALESCE_WINDOW, Strategy};
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::json;

/// A Deployment `name` using ConfigMap `cm` and Secret `sec` through envFrom.
fn uses_both(name: &str) -> Workload {
    Workload::new(Kind::Deployment, name).auto().container(json!({
        "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "secretRef": { "name": "sec" } }]
    }))
}

async fn replica_sets(client: &Client, ns: &str, deployment: &str) -> usize {
    let list = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={deployment}")))
        .await
        .expect("list ReplicaSets");
    list.items.len()
}

/// Change `cm`, then `sec` 100 ms later.
async fn change_both(ctx: &Ctx, value: &str) {
    patch_configmap(&ctx.client, &ctx.ns, "cm", json!({ "data": { "k": value } })).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    patch_secret(&ctx.client, &ctx.ns, "sec", json!({ "stringData": { "k": value } })).await;
}

async fn wait_both(ctx: &Ctx, name: &str, value: &str) {
    ctx.wait_reloaded(Kind::Deployment, name, Cm, "cm", &cm_hash(&[("k", value)])).await;
    ctx.wait_reloaded(Kind::Deployment, name, Sec, "sec", &secret_hash(&[("k", value)])).await;
}

#[tokio::test]
async fn a_configmap_and_a_secret_changed_100ms_apart_are_one_rollout_within_the_window() {
    scenario("coalesce", Strategy::EnvVars, &["--coalesce-window=2s"], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        create_secret(c, ns, "sec", &[("k", "1")]).await;
        uses_both("coalesced").create(c, ns).await;
        uses_both("one-by-one").annotate(COALESCE_WINDOW, "0").create(c, ns).await;
        wait_stored(&controller, 2).await;
        for name in ["coalesced", "one-by-one"] {
            support::fixtures::wait_deployment_ready(c, ns, name).await;
        }
        let before = (generation(c, ns, Kind::Deployment, "coalesced").await, generation(c, ns, Kind::Deployment, "one-by-one").await);

        change_both(&ctx, "2").await;
        wait_both(&ctx, "coalesced", "2").await;
        wait_both(&ctx, "one-by-one", "2").await;
        let coalesced = generation(c, ns, Kind::Deployment, "coalesced").await - before.0;
        let one_by_one = generation(c, ns, Kind::Deployment, "one-by-one").await - before.1;
        let sets = (replica_sets(c, ns, "coalesced").await, replica_sets(c, ns, "one-by-one").await);
        println!("2 s window: {coalesced} write(s), {} new ReplicaSet(s); window 0: {one_by_one} writes, {} new ReplicaSet(s)", sets.0 - 1, sets.1 - 1);
        assert_eq!((coalesced, sets.0), (1, 2), "one write, one new ReplicaSet within the window");
        assert_eq!(one_by_one, 2, "a write per change without a window");
        controller
    })
    .await;
}

#[tokio::test]
async fn a_restart_inside_the_window_loses_neither_hash() {
    with_temp_ns("coalesce-restart", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        create_secret(c, ns, "sec", &[("k", "1")]).await;
        uses_both("web").create(c, ns).await;
        let first = ctx.start_controller("first", &["--coalesce-window=3s"]).await;
        wait_stored(&first, 1).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        change_both(&ctx, "2").await;
        // Both changes are pending in the window when the replica stops.
        wait_for("both changes deferred", || async {
            (first.metric("reloader_deferred_writes").await == 1.0
                && log_contains(&first, "change handled in part; writes deferred", "name=sec"))
            .then_some(())
        })
        .await;
        first.stop().await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before, "nothing was written inside the window");

        let second = ctx.start_controller("second", &["--coalesce-window=3s"]).await;
        wait_both(&ctx, "web", "2").await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "both hashes in one write");
        second.stop().await;
    })
    .await;
}

/// Per second (the API server's clock, from each Deployment's managedFields), how many of the
/// Deployments were last written by the controller in it.
async fn writes_per_second(client: &Client, ns: &str) -> BTreeMap<String, usize> {
    let list = Api::<Deployment>::namespaced(client.clone(), ns).list(&ListParams::default()).await.expect("list");
    let mut counts = BTreeMap::new();
    for d in list.items {
        let time = d
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.manager.as_deref() == Some("Reloader"))
            .find_map(|m| m.time.clone());
        if let Some(time) = time {
            *counts.entry(time.0.to_string()).or_default() += 1;
        }
    }
    counts
}

const DEPLOYMENTS: usize = 300;
const BUDGET: usize = 50;

/// `DEPLOYMENTS` auto Deployments with no replicas (the budget is about writes, not pods),
/// all using ConfigMap `shared`.
async fn many_deployments(client: &Client, ns: &str, count: usize) {
    create_configmap(client, ns, "shared", &[("k", "1")]).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for i in 0..count {
        let name = format!("web-{i:03}");
        let d: Deployment = serde_json::from_value(json!({
            "metadata": { "name": name, "annotations": { "reloader.stakater.com/auto": "true" } },
            "spec": { "replicas": 0, "selector": { "matchLabels": { "app": name } }, "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "app", "image": "x", "envFrom": [{ "configMapRef": { "name": "shared" } }] }] }
            } }
        }))
        .expect("deployment JSON");
        api.create(&PostParams::default(), &d).await.expect("create deployment");
    }
}

/// How many of the first `count` Deployments record `hash` for `shared`.
async fn rolled(ctx: &Ctx, hash: &str, count: usize) -> usize {
    let mut rolled = 0;
    for i in 0..count {
        if ctx.recorded(Kind::Deployment, &format!("web-{i:03}"), Cm, "shared").await.as_deref() == Some(hash) {
            rolled += 1;
        }
    }
    rolled
}

/// Wait until `at_least` of the first `of` Deployments record `value`.
async fn wait_rolled(ctx: &Ctx, value: &str, at_least: usize, of: usize) {
    let hash = cm_hash(&[("k", value)]);
    wait_for(&format!("{at_least} Deployments to record {hash}"), || async {
        (rolled(ctx, &hash, of).await >= at_least).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_budget_spreads_300_rollouts_at_50_a_second_and_loses_none_across_a_sigterm() {
    with_temp_ns("budget", |client, home| async move {
        let ns = format!("{home}-apps");
        support::fixtures::create_namespace(&client, &ns, json!({ support::TEST_LABEL: "budget" })).await;
        many_deployments(&client, &ns, DEPLOYMENTS).await;
        let budget = format!("--max-rollouts-per-second={BUDGET}");
        let scope = format!("--namespaces={ns}");
        let args = [scope.as_str(), budget.as_str()];

        // One replica: the write rate never exceeds the budget.
        let a = start_fleet_replica_with(&home, &format!("{home}-a"), &args, &kubeconfig_path()).await;
        wait_stored(&a, DEPLOYMENTS).await;
        patch_configmap(&client, &ns, "shared", json!({ "data": { "k": "2" } })).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        wait_rolled(&ctx, "2", DEPLOYMENTS, DEPLOYMENTS).await;
        let counts = writes_per_second(&client, &ns).await;
        println!("writes per second, one replica, budget {BUDGET}/s: {counts:?}");
        assert_eq!(counts.values().sum::<usize>(), DEPLOYMENTS);
        assert!(counts.values().all(|n| *n <= BUDGET), "a second above the budget: {counts:?}");
        assert!(
            counts.len() >= DEPLOYMENTS / BUDGET,
            "spread over at least {} seconds: {counts:?}",
            DEPLOYMENTS / BUDGET
        );

        // Two replicas; the one serving the namespace gets a SIGTERM mid-way.
        let b = start_fleet_replica_with(&home, &format!("{home}-b"), &args, &kubeconfig_path()).await;
        let serving = wait_for("the 16 shards balanced, the namespace served by one replica", || async {
            let mut serving = None;
            for (i, replica) in [&a, &b].into_iter().enumerate() {
                if replica.metric("reloader_shards_active").await != 8.0 {
                    return None;
                }
                if replica.metric("reloader_namespaces_owned").await == 1.0 {
                    serving = Some(i);
                }
            }
            serving
        })
        .await;
        let (serving, other) = if serving == 0 { (a, b) } else { (b, a) };
        patch_configmap(&client, &ns, "shared", json!({ "data": { "k": "3" } })).await;
        wait_rolled(&ctx, "3", DEPLOYMENTS / 3, DEPLOYMENTS).await;
        serving.stop().await;
        wait_rolled(&ctx, "3", DEPLOYMENTS, DEPLOYMENTS).await;
        let counts = writes_per_second(&client, &ns).await;
        println!("writes per second across the SIGTERM (budget {BUDGET}/s per replica): {counts:?}");
        assert!(counts.values().all(|n| *n <= 2 * BUDGET), "{counts:?}");
        for i in 0..DEPLOYMENTS {
            let name = format!("web-{i:03}");
            assert_eq!(generation(&client, &ns, Kind::Deployment, &name).await, 3, "{name}: one write per change");
        }
        other.stop().await;
        support::fixtures::delete_namespaces(&client, &[ns]).await;
    })
    .await;
}

/// Whether the controller's log has a line containing both parts.
fn log_contains(controller: &Controller, line_part: &str, and: &str) -> bool {
    let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
    log.lines().any(|l| l.contains(line_part) && l.contains(and))
}

/// Deployments of `names` whose rollout is not complete, by `kubectl rollout status`'s rule.
async fn rolling(client: &Client, ns: &str) -> usize {
    let list = Api::<Deployment>::namespaced(client.clone(), ns).list(&ListParams::default()).await.expect("list");
    list.items
        .iter()
        .filter(|d| {
            let (Some(spec), status) = (d.spec.as_ref(), d.status.clone().unwrap_or_default()) else { return false };
            let wanted = spec.replicas.unwrap_or(1);
            let updated = status.updated_replicas.unwrap_or(0);
            status.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0)
                || updated < wanted
                || status.replicas.unwrap_or(0) > updated
                || status.available_replicas.unwrap_or(0) < updated
        })
        .count()
}

#[tokio::test]
async fn at_most_two_deployments_roll_at_once_with_max_concurrent_rollouts_2() {
    scenario("concurrent", Strategy::EnvVars, &["--max-concurrent-rollouts=2"], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        let names: Vec<String> = (0..8).map(|i| format!("web-{i}")).collect();
        for name in &names {
            Workload::new(Kind::Deployment, name).auto().env_from_configmap("cm").create(c, ns).await;
        }
        wait_stored(&controller, names.len()).await;
        for name in &names {
            support::fixtures::wait_deployment_ready(c, ns, name).await;
        }
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        let hash = cm_hash(&[("k", "2")]);
        let (most, most_in_flight) = (std::cell::Cell::new(0), std::cell::Cell::new(0.0f64));
        let started = tokio::time::Instant::now();
        wait_for("every Deployment rolled out with the new hash", || async {
            most.set(most.get().max(rolling(c, ns).await));
            most_in_flight.set(most_in_flight.get().max(controller.metric("reloader_rollouts_in_flight").await));
            let mut recorded = 0;
            for name in &names {
                if ctx.recorded(Kind::Deployment, name, Cm, "cm").await.as_deref() == Some(hash.as_str()) {
                    recorded += 1;
                }
            }
            (recorded == names.len() && rolling(c, ns).await == 0).then_some(())
        })
        .await;
        let (most, most_in_flight) = (most.get(), most_in_flight.get());
        println!(
            "8 Deployments with --max-concurrent-rollouts=2: rolled out in {:?}, at most {most} rolling at once \
             (sampled), at most {most_in_flight} in flight by the controller's count",
            started.elapsed()
        );
        assert!(most <= 2, "{most} Deployments rolled at once");
        assert!(most_in_flight <= 2.0);
        for name in &names {
            assert_eq!(generation(c, ns, Kind::Deployment, name).await, 2, "{name}: one write");
        }
        controller
    })
    .await;
}

const FAN_OUT: usize = 40;

/// One ConfigMap used by 40 Deployments, behind a proxy that holds each Deployment PATCH for
/// 100 ms (a slow API server): with `--max-concurrent-writes=8` at most 8 writes, and more
/// than one, are in flight at once; with 1, one at a time. Each Deployment rolls once.
#[tokio::test]
async fn a_fan_out_is_written_side_by_side_up_to_max_concurrent_writes() {
    use support::proxy::{api_server_addr, kubeconfig_via};
    use support::throttle::Throttle;
    with_temp_ns("fan-out", |client, ns| async move {
        many_deployments(&client, &ns, FAN_OUT).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        let mut took = Vec::new();
        for (value, limit) in [("2", 1u64), ("3", 8)] {
            let proxy = Throttle::slowing_writes(api_server_addr(), Duration::from_millis(100)).await;
            let name = format!("{ns}-w{limit}");
            let (scope, writes) = (format!("--namespaces={ns}"), format!("--max-concurrent-writes={limit}"));
            let args = [scope.as_str(), writes.as_str()];
            let controller =
                Controller::start_with_kubeconfig(&name, &ns, &args, &kubeconfig_via(proxy.addr, &name)).await;
            wait_stored(&controller, FAN_OUT).await;
            let mut before = Vec::new();
            for i in 0..FAN_OUT {
                before.push(generation(&client, &ns, Kind::Deployment, &format!("web-{i:03}")).await);
            }
            let started = tokio::time::Instant::now();
            patch_configmap(&client, &ns, "shared", json!({ "data": { "k": value } })).await;
            wait_rolled(&ctx, value, FAN_OUT, FAN_OUT).await;
            took.push(started.elapsed());
            let most = proxy.most_writes_in_flight();
            assert!(most <= limit, "{most} writes in flight with --max-concurrent-writes={limit}");
            assert!(limit == 1 || most > 1, "writes went one at a time with --max-concurrent-writes={limit}");
            for (i, before) in before.into_iter().enumerate() {
                let after = generation(&client, &ns, Kind::Deployment, &format!("web-{i:03}")).await;
                assert_eq!(after, before + 1, "web-{i:03} rolled once");
            }
            controller.stop().await;
            println!("--max-concurrent-writes={limit}: {FAN_OUT} writes, at most {most} in flight");
        }
        println!(
            "{FAN_OUT} Deployments behind 100 ms per write: {:?} one at a time, {:?} with 8 in flight",
            took[0], took[1]
        );
    })
    .await;
}

/// Deployment `name` using ConfigMap `cm` through envFrom.
fn uses(name: &str, cm: &str) -> Workload {
    Workload::new(Kind::Deployment, name)
        .auto()
        .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": cm } }] }))
}

/// Two Deployments on two ConfigMaps, behind a proxy that holds every PATCH of `stuck` until
/// the test lets it go (an API server stuck on one object): a change of the other ConfigMap
/// rolls `free` while `stuck`'s write is still held, and a second change of `stuck`'s
/// ConfigMap waits for the first write, so `stuck` ends up recording the last value after
/// exactly two writes.
#[tokio::test]
async fn a_held_write_holds_up_only_its_own_workload() {
    held_write_of(uses("stuck", "for-stuck"), "held-write").await;
}

/// As above with `stuck`'s writes coalesced (a window of its own): a deferred write that is
/// held holds up only its workload too. Regression: deferred writes went out one at a time
/// on the engine's loop, so every other change waited for a held one.
#[tokio::test]
async fn a_held_deferred_write_holds_up_only_its_own_workload() {
    held_write_of(uses("stuck", "for-stuck").annotate(COALESCE_WINDOW, "200ms"), "held-deferred").await;
}

async fn held_write_of(stuck: Workload, prefix: &str) {
    use support::proxy::{api_server_addr, kubeconfig_via};
    use support::throttle::Throttle;
    with_temp_ns(prefix, |client, ns| async move {
        let c = &client;
        create_configmap(c, &ns, "for-stuck", &[("k", "1")]).await;
        create_configmap(c, &ns, "for-free", &[("k", "1")]).await;
        stuck.create(c, &ns).await;
        uses("free", "for-free").create(c, &ns).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        let proxy = Throttle::holding_writes_to(api_server_addr(), "/deployments/stuck").await;
        let name = format!("{ns}-held");
        let scope = format!("--namespaces={ns}");
        let controller =
            Controller::start_with_kubeconfig(&name, &ns, &[scope.as_str()], &kubeconfig_via(proxy.addr, &name)).await;
        wait_stored(&controller, 2).await;
        let stuck_before = generation(c, &ns, Kind::Deployment, "stuck").await;

        patch_configmap(c, &ns, "for-stuck", json!({ "data": { "k": "2" } })).await;
        wait_for("the write of stuck to be held", || async { (proxy.held_writes() == (1, 0)).then_some(()) }).await;
        patch_configmap(c, &ns, "for-free", json!({ "data": { "k": "2" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "free", Cm, "for-free", &cm_hash(&[("k", "2")])).await;
        // Still held, and still waited for: free did not wait for stuck's write to time out.
        assert_eq!(proxy.held_writes(), (1, 0), "free rolled only once stuck's write was given up");

        // A second change of the held workload's ConfigMap waits for the first write.
        patch_configmap(c, &ns, "for-stuck", json!({ "data": { "k": "3" } })).await;
        proxy.release();
        ctx.wait_reloaded(Kind::Deployment, "stuck", Cm, "for-stuck", &cm_hash(&[("k", "3")])).await;
        assert_eq!(generation(c, &ns, Kind::Deployment, "stuck").await, stuck_before + 2, "one write per change");
        controller.stop().await;
    })
    .await;
}

/// A Secret rewritten 10 times a second for a minute (a certificate re-issued in a loop) with
/// `--flap-damping-changes=5 --flap-damping-window=10s`: the first 5 changes roll as usual,
/// then the Deployment is rolled at most once per window, always with the latest data; a
/// Warning Event, a metric and `/explain` say so. A Deployment on a quiet ConfigMap next to it
/// still rolls at once.
#[tokio::test]
async fn a_secret_rewritten_10_times_a_second_for_a_minute_rolls_at_most_once_per_damping_window() {
    const CHANGES: u32 = 5;
    const WINDOW_SECS: u64 = 10;
    const WRITES: u32 = 600;
    let args = ["--flap-damping-changes=5", "--flap-damping-window=10s"];
    scenario("flap-damping", Strategy::EnvVars, &args, |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_secret(c, ns, "tls", &[("crt", "0")]).await;
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web")
            .auto()
            .container(json!({ "name": "app", "envFrom": [{ "secretRef": { "name": "tls" } }] }))
            .create(c, ns)
            .await;
        uses("calm", "cm").create(c, ns).await;
        wait_stored(&controller, 2).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;

        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut explained = String::new();
        for i in 1..=WRITES {
            tick.tick().await;
            patch_secret(c, ns, "tls", json!({ "stringData": { "crt": i.to_string() } })).await;
            if i == WRITES / 2 {
                // Half way: a quiet ConfigMap's Deployment is not held up, and explain shows
                // the damping.
                patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
                ctx.wait_reloaded(Kind::Deployment, "calm", Cm, "cm", &cm_hash(&[("k", "2")])).await;
                explained = controller.get(&format!("/explain/{ns}/secret/tls?output=text")).await;
            }
        }
        let minute = started.elapsed();
        // The last data is applied within a window of the last change.
        ctx.wait_reloaded(Kind::Deployment, "web", Sec, "tls", &secret_hash(&[("crt", &WRITES.to_string())])).await;
        let rollouts = generation(c, ns, Kind::Deployment, "web").await - before;
        let bound = i64::from(CHANGES) + (minute.as_secs() / WINDOW_SECS) as i64 + 1;
        let damped = controller.metric("reloader_damped_changes_total").await;
        println!("{WRITES} changes in {minute:?}: {rollouts} rollouts (bound {bound}); {damped} damped changes");
        assert!(rollouts <= bound, "{rollouts} rollouts for {WRITES} changes in {minute:?}; at most {bound} expected");
        assert!(damped >= f64::from(WRITES - CHANGES) * 0.9, "the damped changes are counted: {damped}");
        assert!(explained.contains("damped since"), "explain shows the damping:\n{explained}");
        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        wait_for("a ReloadDamped Warning Event on web", || async {
            let selector = "involvedObject.name=web,reason=ReloadDamped,type=Warning";
            let list = events.list(&ListParams::default().fields(selector)).await.ok()?;
            (!list.items.is_empty()).then_some(())
        })
        .await;
        controller
    })
    .await;
}
