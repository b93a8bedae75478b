//! No update lost and none applied twice across restarts, crashes and replays (DESIGN
//! principles 1 and 2), on the real API server.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::json;
use support::controller::Controller;
use support::fixtures::{Kind, Workload, cm_hash, create_configmap, generation, patch_configmap};
use support::scenario::{Ctx, wait_stored};
use support::{wait_for, with_temp_ns};

const CHECKPOINT: &str = "reloader-fleet-checkpoint";

async fn checkpoint_line(ctx: &Ctx, name: &str) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns).get_opt(CHECKPOINT).await.ok()??;
    let text = cm.data?.get("checkpoint")?.clone();
    text.lines().find(|l| l.split(' ').nth(2) == Some(name)).map(str::to_string)
}

/// Start a controller scoped to the context's namespace.
async fn start(ctx: &Ctx, name: &str) -> Controller {
    ctx.start_controller(name, &[]).await
}

/// Start a fleet replica (16 shards, Leases) scoped to the context's namespace; return once
/// it acts on every shard (shards are taken up after start, once their Leases are held).
async fn start_replica(ctx: &Ctx, name: &str) -> Controller {
    let scope = format!("--namespaces={}", ctx.ns);
    let name = format!("{}-{name}", ctx.ns);
    let replica =
        support::controller::start_fleet_replica_with(&ctx.ns, &name, &[scope.as_str()], &support::kubeconfig_path())
            .await;
    wait_for("the shards acted on", || async {
        (replica.metric("reloader_shards_active").await == 16.0).then_some(())
    })
    .await;
    replica
}

#[tokio::test]
async fn a_restart_or_a_replayed_checkpoint_rolls_nothing_again() {
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        with_temp_ns("replay", |client, ns| async move {
            let ctx = Ctx::new(client, ns, strategy);
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            create_configmap(c, ns, "other", &[("k", "1")]).await;
            Workload::new(Kind::Deployment, "web")
                .auto()
                .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "configMapRef": { "name": "other" } }] }))
                .create(c, ns)
                .await;
            let first = start(&ctx, "first").await;
            wait_stored(&first, 1).await;
            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
            // A second resource overwrites last-reloaded-from in the annotations strategy.
            patch_configmap(c, ns, "other", json!({ "data": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "web", Cm, "other", &cm_hash(&[("k", "2")])).await;
            first.stop().await;
            // A graceful stop saves the checkpoint.
            let old_line = checkpoint_line(&ctx, "cm").await;
            let rolled = generation(c, ns, Kind::Deployment, "web").await;

            // A plain restart.
            let second = start(&ctx, "second").await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, rolled, "a restart rolled the workload");
            second.stop().await;

            // A crash before the checkpoint was saved: the checkpoint still holds the old hash of
            // `cm`, so the next start replays that change. The workload already records it.
            let stale = format!("C {ns} cm {:016x}", u64::from_str_radix(&cm_hash(&[("k", "1")])[..16], 16).unwrap_or(0));
            let current = Api::<ConfigMap>::namespaced(c.clone(), ns).get(CHECKPOINT).await.expect("checkpoint exists");
            let text = current.data.and_then(|d| d.get("checkpoint").cloned()).unwrap_or_default();
            let replaced = text.replace(old_line.as_deref().unwrap_or("<none>"), &stale);
            assert_ne!(replaced, text, "the checkpoint must hold a line for cm");
            Api::<ConfigMap>::namespaced(c.clone(), ns)
                .patch(CHECKPOINT, &PatchParams::default(), &Patch::Merge(json!({ "data": { "checkpoint": replaced } })))
                .await
                .expect("rewind the checkpoint");
            let third = start(&ctx, "third").await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, rolled, "a replayed change rolled the workload again");
            assert_eq!(
                third.metric("reloader_reload_executed_total{success=\"true\"}").await,
                0.0,
                "the replay must not write"
            );
            third.stop().await;
        })
        .await;
    }
}

#[tokio::test]
async fn a_change_made_while_stopped_or_crashed_rolls_exactly_once() {
    with_temp_ns("while-down", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        let first = start(&ctx, "first").await;
        wait_stored(&first, 1).await;
        first.stop().await;

        // Changed while stopped (graceful stop: the checkpoint is current).
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        let second = start(&ctx, "second").await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "exactly one rollout");

        // Killed right after acting (no graceful checkpoint save), then changed again.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "3")])).await;
        drop(second); // SIGKILL
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "4" } })).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        let third = start(&ctx, "third").await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "4")])).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "exactly one rollout after a crash");
        third.stop().await;
    })
    .await;
}

/// 300 ConfigMaps created while no replica ran, and the one in use changed: the take-up of
/// the shard (after start, once its Lease is held) queues more changes than the engine looks
/// at in one go (256), and the change that sorts last is still rolled, once.
#[tokio::test]
async fn a_take_up_with_hundreds_of_changes_acts_on_the_last_one_too() {
    use futures::StreamExt;
    with_temp_ns("many-while-down", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "zz-used", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("zz-used").create(c, ns).await;
        let first = start_replica(&ctx, "first").await;
        first.stop().await;

        futures::stream::iter(0..300)
            .for_each_concurrent(
                16,
                |i| async move { create_configmap(c, ns, &format!("new-{i:03}"), &[("k", "1")]).await },
            )
            .await;
        patch_configmap(c, ns, "zz-used", json!({ "data": { "k": "2" } })).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        let second = start_replica(&ctx, "second").await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "zz-used", &cm_hash(&[("k", "2")])).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "exactly one rollout");
        second.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_first_start_takes_the_current_state_as_baseline() {
    with_temp_ns("baseline", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        let first = start(&ctx, "first").await;
        wait_stored(&first, 1).await;
        support::wait_for("the baseline to be checkpointed", || async { checkpoint_line(&ctx, "cm").await }).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before, "no mass rollout on a first start");
        first.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_fleet_replica_killed_as_soon_as_it_acts_on_its_shards_leaves_their_baselines() {
    with_temp_ns("killed-at-take-up", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        // Each shard's take-up is a first start: its checkpoint is written before the replica
        // acts on it.
        let first = start_replica(&ctx, "first").await;
        let saved = Api::<ConfigMap>::namespaced(c.clone(), ns).list(&Default::default()).await.expect("list");
        let has_baseline = saved.items.iter().any(|cm| {
            cm.metadata.name.as_deref().is_some_and(|n| n.starts_with("reloader-fleet-checkpoint-shard-"))
                && cm.data.as_ref().and_then(|d| d.get("checkpoint")).is_some_and(|t| t.contains(" cm "))
        });
        assert!(has_baseline, "no checkpoint with the ConfigMap's baseline once the shards are acted on");
        drop(first); // SIGKILL, before any save a timer would make
        // Changed while nobody runs: the next replica finds the baseline, not a first start.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        let before = generation(c, ns, Kind::Deployment, "web").await;
        let second = start_replica(&ctx, "second").await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        assert_eq!(generation(c, ns, Kind::Deployment, "web").await, before + 1, "exactly one rollout");
        second.stop().await;
    })
    .await;
}

/// A replica that loses a shard while its checkpoint loads (it is leaving, or the Lease went)
/// leaves the shard alone. Compared with a store the watch room is emptying, the take-up saw
/// every resource as deleted, and a first start saved that empty store as the baseline, so
/// the next owner would take every resource as created (a rollout each with
/// `--reload-on-create`). The engine runs in process here, its API calls 300 ms slower, so the
/// shard is gone long before the checkpoint's read returns.
#[tokio::test]
async fn a_shard_lost_while_its_checkpoint_loads_is_not_taken_up() {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use reloader_fleet::reload::{self, Inputs, Keys, Options, Outputs};
    use reloader_fleet::watch::{Compactor, DataHash, ResourceKey, ResourceState, Store};
    use support::proxy::{Proxy, api_server_addr, kubeconfig_via};
    use tokio::sync::{mpsc, watch};

    with_temp_ns("lost-at-take-up", |client, ns| async move {
        const RESOURCES: usize = 50;
        let proxy = Proxy::start_with_latency(api_server_addr(), Duration::from_millis(300)).await;
        let slow = support::client_from(&kubeconfig_via(proxy.addr, "lost-at-take-up")).await;
        let (store, writer) = Store::new(Vec::new());
        for n in 0..RESOURCES {
            let key = ResourceKey { kind: Cm, namespace: ns.as_str().into(), name: format!("cm-{n}").into() };
            let hash = DataHash::of_bytes(n.to_string().as_bytes());
            writer.apply_resource(key, ResourceState { hash, ignored: false, search_match: false });
        }
        let keys = Keys::default();
        let compactor = Compactor::new(keys.workload_keys(), keys.ignore.clone(), keys.search_match.clone(), false);
        let config = reload::Config {
            strategy: Strategy::EnvVars,
            keys,
            options: Options { auto_reload_all: false },
            reload_on_create: true,
            reload_on_delete: false,
            sync_after_restart: false,
            checkpoint_namespace: ns.clone(),
            checkpoint_name: "lost-at-take-up".to_string(),
            ring: std::sync::Arc::new(reloader_fleet::shard::Ring::new(1).expect("one shard")),
            reporter: kube::runtime::events::Reporter { controller: "reloader".into(), instance: None },
            compactor,
            webhook: None,
            coalesce_window: Duration::ZERO,
            max_rollouts_per_second: None,
            max_concurrent_rollouts: None,
            max_concurrent_writes: 8,
        };
        let metrics = reload::Metrics::register(&prometheus::Registry::new(), false).expect("metrics");
        let (synced_tx, synced) = watch::channel(Some(BTreeSet::from([0])));
        let (owned_tx, owned) = watch::channel(BTreeSet::from([0]));
        let (_changes_tx, changes) = mpsc::channel(16);
        let (active, mut active_rx) = watch::channel(BTreeSet::new());
        let (reconciled, _) = watch::channel(false);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let inputs = Inputs { store, changes, synced, owned };
        let outputs = Outputs { reconciled, active, alerts: None };
        let engine = tokio::spawn(reload::run(slow, config, inputs, metrics, outputs, shutdown.clone()));
        // Said before the checkpoint is read, which takes a TLS handshake and a GET, 300 ms a leg.
        let within = Duration::from_secs(30);
        tokio::time::timeout(within, active_rx.wait_for(|a| a.contains(&0)))
            .await
            .expect("the take-up starts")
            .expect("engine running");
        // As when the replica leaves: the Lease goes, the watch room says the shard is no longer
        // synced, then drops its objects.
        owned_tx.send_replace(BTreeSet::new());
        synced_tx.send_replace(Some(BTreeSet::new()));
        writer.forget_namespace(&ns);
        tokio::time::timeout(within, active_rx.wait_for(BTreeSet::is_empty))
            .await
            .expect("the shard is let go")
            .expect("engine running");
        shutdown.cancel();
        engine.await.expect("engine task").expect("engine");
        let saved = Api::<ConfigMap>::namespaced(client, &ns).get_opt("lost-at-take-up").await.expect("get");
        let lines =
            saved.map(|cm| cm.data.and_then(|d| d.get("checkpoint").cloned()).unwrap_or_default().lines().count());
        assert!(
            lines.is_none() || lines == Some(RESOURCES),
            "a checkpoint saved with {lines:?} of the {RESOURCES} resources the shard holds"
        );
    })
    .await;
}
