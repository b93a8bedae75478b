//! No update lost and none applied twice across restarts, crashes and replays (DESIGN
//! principles 1 and 2), on the real API server.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::checkpoint::{configmap_key, short_of};
use crate::support::controller::Controller;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, generation, patch_configmap, recorded_env};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{wait_for, with_temp_ns};
use kube::Api;
use reloader_fleet::reload::{self, Inputs, Keys, Options, Outputs, Strategy};
use reloader_fleet::shard::Ring;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use reloader_fleet::watch::{
    Cause, Change, Compactor, DataHash, ResourceKey, ResourceState, SlimDeployment, Store, Writer,
};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const CHECKPOINT: &str = "reloader-fleet-checkpoint";

/// The hash the checkpoint holds for ConfigMap `name` of the context's namespace.
async fn checkpoint_entry(ctx: &Ctx, name: &str) -> Option<u64> {
    support::checkpoint::configmap_entry(&ctx.client, &ctx.ns, CHECKPOINT, &ctx.ns, name).await
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
            assert_eq!(checkpoint_entry(&ctx, "cm").await, Some(short_of(&cm_hash(&[("k", "2")]))));
            let rolled = generation(c, ns, Kind::Deployment, "web").await;

            // A plain restart.
            let second = start(&ctx, "second").await;
            assert_eq!(generation(c, ns, Kind::Deployment, "web").await, rolled, "a restart rolled the workload");
            second.stop().await;

            // A crash before the checkpoint was saved: the checkpoint still holds the old hash of
            // `cm`, so the next start replays that change. The workload already records it.
            let stale = short_of(&cm_hash(&[("k", "1")]));
            support::checkpoint::rewind(c, ns, CHECKPOINT, &configmap_key(ns, "cm"), stale).await;
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
        support::wait_for("the baseline to be checkpointed", || async { checkpoint_entry(&ctx, "cm").await }).await;
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
        let mut has_baseline = false;
        for shard in 0..16 {
            let name = format!("reloader-fleet-checkpoint-shard-{shard}");
            has_baseline |= support::checkpoint::configmap_entry(c, ns, &name, ns, "cm").await.is_some();
        }
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
    use support::proxy::{Proxy, api_server_addr, kubeconfig_via};

    with_temp_ns("lost-at-take-up", |client, ns| async move {
        const RESOURCES: usize = 50;
        let proxy = Proxy::start_with_latency(api_server_addr(), Duration::from_millis(300)).await;
        let slow = support::client_from(&kubeconfig_via(proxy.addr, "lost-at-take-up")).await;
        let (store, writer) = Store::new(Vec::new());
        for n in 0..RESOURCES {
            let key = ResourceKey { kind: Cm, namespace: ns.as_str().into(), name: format!("cm-{n}").into() };
            let hash = DataHash::of_bytes(n.to_string().as_bytes());
            writer.apply_resource(
                key,
                ResourceState { hash, ignored: false, search_match: false, wide: None, keys: None },
            );
        }
        let mut engine = InProcess::start(slow, &ns, "lost-at-take-up", 1, store, BTreeSet::from([0]));
        // Said before the checkpoint is read, which takes a TLS handshake and a GET, 300 ms a leg.
        engine.wait_active("the take-up starts", |a| a.contains(&0)).await;
        // As when the replica leaves: the Lease goes, the watch room says the shard is no longer
        // synced, then drops its objects.
        engine.owned.send_replace(BTreeSet::new());
        engine.synced.send_replace(Some(BTreeSet::new()));
        writer.forget_namespace(&ns);
        engine.wait_active("the shard is let go", BTreeSet::is_empty).await;
        engine.stop().await;
        let lines = support::checkpoint::entries(&client, &ns, "lost-at-take-up").await.map(|e| e.len());
        assert!(
            lines.is_none() || lines == Some(RESOURCES),
            "a checkpoint saved with {lines:?} of the {RESOURCES} resources the shard holds"
        );
    })
    .await;
}

/// Regression: a shard's take-up read its checkpoint on the engine's loop, so a change of
/// any other shard waited for that read (0.1-0.2 s under load at a handoff, up to the 10 s
/// API timeout on a stuck server). The engine runs in process here, on a client that holds
/// the read of the gained shard's checkpoint until told: a change of the shard it already
/// acts on must be written meanwhile.
#[tokio::test]
async fn a_change_never_waits_for_another_shards_take_up() {
    with_temp_ns("take-up-aside", |client, ns| async move {
        let (mine, gained) = two_shards_of(&ns);
        let (store, writer) = app_on_cfg(&client, &ns).await;
        let checkpoint = "take-up-aside";
        let hold = HoldRequests::of(http::Method::GET, &format!("/configmaps/{checkpoint}-shard-{gained}"));
        let mut engine = InProcess::start(hold.client().await, &ns, checkpoint, 2, store, BTreeSet::from([mine]));
        wait_for("the engine to be ready", || async { engine.reconciled.borrow().then_some(()) }).await;

        // The other shard is gained: its checkpoint's read is held.
        engine.owned.send_replace(BTreeSet::from([mine, gained]));
        engine.synced.send_replace(Some(BTreeSet::from([mine, gained])));
        wait_for("the take-up's read to be held", || async { (hold.held() == 1).then_some(()) }).await;

        change_cfg_while_held(&client, &ns, &writer, &engine, &hold).await;
        hold.release();
        engine.wait_active("the gained shard taken up", |a| a.contains(&gained) && a.contains(&mine)).await;
        engine.stop().await;
    })
    .await;
}

/// Regression: letting a shard go saved its checkpoint on the engine's loop, so a change of
/// any other shard waited for that save (and for a second one when the first failed). Here
/// the save of the shard let go is held until told: a change of the shard kept must be
/// written meanwhile, and the shard leaves `active` (its Lease may go) only once saved.
#[tokio::test]
async fn a_change_never_waits_for_another_shards_let_go() {
    with_temp_ns("let-go-aside", |client, ns| async move {
        let (mine, lost) = two_shards_of(&ns);
        let (store, writer) = app_on_cfg(&client, &ns).await;
        // A resource of the other shard, so that its checkpoint has something new to save.
        let ring = Ring::new(2).expect("two shards");
        let elsewhere = (0..).map(|n| format!("{ns}-{n}")).find(|n| ring.shard_of(n) == lost).expect("a namespace");
        let other = ResourceKey { kind: Cm, namespace: elsewhere.as_str().into(), name: "other".into() };
        writer.apply_resource(other.clone(), cfg_state("1"));
        let checkpoint = "let-go-aside";
        let hold = HoldRequests::of(http::Method::PUT, &format!("/configmaps/{checkpoint}-shard-{lost}"));
        let mut engine = InProcess::start(hold.client().await, &ns, checkpoint, 2, store, BTreeSet::from([mine, lost]));
        wait_for("the engine to be ready", || async { engine.reconciled.borrow().then_some(()) }).await;
        let processed = engine.processed();
        let previous = writer.apply_resource(other.clone(), cfg_state("2")).map(|s| s.hash);
        let change = Change { key: other, observed: Some(cm_data_hash("2")), previous, cause: Cause::Event };
        engine.changes.send(change).await.expect("engine running");
        wait_for("the other shard's change handled", || async { (engine.processed() > processed).then_some(()) }).await;

        // The other shard goes: its checkpoint's save is held.
        engine.owned.send_replace(BTreeSet::from([mine]));
        engine.synced.send_replace(Some(BTreeSet::from([mine])));
        wait_for("the let-go's save to be held", || async { (hold.held() == 1).then_some(()) }).await;
        assert!(engine.active.borrow().contains(&lost), "a shard let go is active until its checkpoint is saved");

        change_cfg_while_held(&client, &ns, &writer, &engine, &hold).await;
        hold.release();
        engine.wait_active("the shard let go", |a| *a == BTreeSet::from([mine])).await;
        engine.stop().await;
    })
    .await;
}

/// A checkpoint naming one of the shard's resources (written by hand by someone who may write
/// ConfigMaps where the checkpoint lives, or left half-written) is not believed to know the
/// others: with `--reload-on-create` they would all look created and roll every workload
/// using them. They are taken as found, and the next real change still rolls.
#[tokio::test]
async fn a_checkpoint_naming_one_resource_of_many_rolls_nothing_on_create() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use reloader_fleet::reload::checkpoint::short;

    with_temp_ns("forged-checkpoint", |client, ns| async move {
        const RESOURCES: usize = 10;
        let names: Vec<String> = (0..RESOURCES).map(|n| format!("cm-{n}")).collect();
        let (store, writer) = Store::new(Vec::new());
        for name in &names {
            create_configmap(&client, &ns, name, &[("k", "1")]).await;
            writer.apply_resource(
                ResourceKey { kind: Cm, namespace: ns.as_str().into(), name: name.as_str().into() },
                cfg_state("1"),
            );
        }
        let env_from: Vec<_> = names.iter().map(|n| json!({ "configMapRef": { "name": n } })).collect();
        Workload::new(Kind::Deployment, "app")
            .auto()
            .container(json!({ "name": "app", "envFrom": env_from }))
            .create(&client, &ns)
            .await;
        let deployment: SlimDeployment = Api::namespaced(client.clone(), &ns).get("app").await.expect("get app");
        writer.apply_workload(compactor().compact(&deployment).expect("a workload the engine keeps"));
        // One valid line: cm-0 as it is.
        let line = format!("C {ns} cm-0 {:016x}\n", short(&cm_data_hash("1")));
        let forged: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "forged", "labels": { "app.kubernetes.io/managed-by": "reloader-fleet" } },
            "data": { "checkpoint": line }
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&Default::default(), &forged)
            .await
            .expect("write the forged checkpoint");

        let engine = InProcess::start(client.clone(), &ns, "forged", 1, store, BTreeSet::from([0]));
        wait_for("the engine to be ready", || async { engine.reconciled.borrow().then_some(()) }).await;
        for name in &names {
            let recorded = recorded_env(&client, &ns, Kind::Deployment, "app", Cm, name).await;
            assert!(recorded.is_none(), "{name} taken as created from a checkpoint naming one resource: {recorded:?}");
        }
        assert_eq!(engine.metrics.errors.with_label_values(&["checkpoint_partial"]).get(), 1, "said once");
        // Still acting: the next change of one rolls the app.
        patch_configmap(&client, &ns, "cm-3", json!({ "data": { "k": "2" } })).await;
        let key = ResourceKey { kind: Cm, namespace: ns.as_str().into(), name: "cm-3".into() };
        let previous = writer.apply_resource(key.clone(), cfg_state("2")).map(|s| s.hash);
        let change = Change { key, observed: Some(cm_data_hash("2")), previous, cause: Cause::Event };
        engine.changes.send(change).await.expect("engine running");
        let hash = cm_hash(&[("k", "2")]);
        wait_for("app to record the change", || async {
            let recorded = recorded_env(&client, &ns, Kind::Deployment, "app", Cm, "cm-3").await;
            recorded.is_some_and(|r| r.hash == hash).then_some(())
        })
        .await;
        engine.stop().await;
    })
    .await;
}

/// The shard of `ns` in a ring of two, and the other one.
fn two_shards_of(ns: &str) -> (u32, u32) {
    let shard = Ring::new(2).expect("two shards").shard_of(ns);
    (shard, 1 - shard)
}

/// ConfigMap `cfg` and Deployment `app` using it in `ns`, and a store holding both, as the
/// watches would.
async fn app_on_cfg(client: &kube::Client, ns: &str) -> (Store, Writer) {
    create_configmap(client, ns, "cfg", &[("k", "1")]).await;
    Workload::new(Kind::Deployment, "app").auto().env_from_configmap("cfg").create(client, ns).await;
    let (store, writer) = Store::new(Vec::new());
    writer.apply_resource(cfg_key(ns), cfg_state("1"));
    let app: SlimDeployment = Api::namespaced(client.clone(), ns).get("app").await.expect("get app");
    writer.apply_workload(compactor().compact(&app).expect("a workload the engine keeps"));
    (store, writer)
}

fn cfg_key(ns: &str) -> ResourceKey {
    ResourceKey { kind: Cm, namespace: ns.into(), name: "cfg".into() }
}

fn cfg_state(value: &str) -> ResourceState {
    ResourceState { hash: cm_data_hash(value), ignored: false, search_match: false, wide: None, keys: None }
}

/// Change `cfg` as the watch would tell it, and check that `app` records the change while
/// `hold` still holds its request.
async fn change_cfg_while_held(
    client: &kube::Client,
    ns: &str,
    writer: &Writer,
    engine: &InProcess,
    hold: &HoldRequests,
) {
    patch_configmap(client, ns, "cfg", json!({ "data": { "k": "2" } })).await;
    let previous = writer.apply_resource(cfg_key(ns), cfg_state("2")).map(|s| s.hash);
    let change = Change { key: cfg_key(ns), observed: Some(cm_data_hash("2")), previous, cause: Cause::Event };
    engine.changes.send(change).await.expect("engine running");
    let hash = cm_hash(&[("k", "2")]);
    wait_for("app to record the change", || async {
        let recorded = recorded_env(client, ns, Kind::Deployment, "app", Cm, "cfg").await;
        recorded.is_some_and(|r| r.hash == hash).then_some(())
    })
    .await;
    assert_eq!(hold.held(), 1, "the change was written only once the other shard's held call ended");
}

fn cm_data_hash(value: &str) -> DataHash {
    DataHash::of_configmap(&[("k".to_string(), value.to_string())].into(), &Default::default())
}

fn compactor() -> Compactor {
    let keys = Keys::default();
    Compactor::new(keys.annotation_keys(), false)
}

/// The reload engine run in this process on a store the test fills, with the channels the
/// watch and lease rooms would hold.
struct InProcess {
    changes: mpsc::Sender<Change>,
    synced: watch::Sender<Option<BTreeSet<u32>>>,
    owned: watch::Sender<BTreeSet<u32>>,
    active: watch::Receiver<BTreeSet<u32>>,
    reconciled: watch::Receiver<bool>,
    metrics: reload::Metrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), reload::Error>>,
}

impl InProcess {
    /// Start it with `shards` shards (`--reload-on-create`, env-vars), its checkpoints
    /// `checkpoint` in `ns`, owning and synced for `owned`.
    fn start(
        client: kube::Client,
        ns: &str,
        checkpoint: &str,
        shards: u32,
        store: Store,
        owned: BTreeSet<u32>,
    ) -> Self {
        let config = reload::Config {
            strategy: Strategy::EnvVars,
            keys: Keys::default(),
            options: Options { auto_reload_all: false },
            reload_on_create: true,
            reload_on_delete: false,
            sync_after_restart: false,
            orphaned_env_vars: reloader_fleet::reload::OrphanedEnvVars::Keep,
            checkpoint_namespace: ns.to_string(),
            checkpoint_name: checkpoint.to_string(),
            ring: Arc::new(Ring::new(shards).expect("a ring")),
            reporter: kube::runtime::events::Reporter { controller: "reloader".into(), instance: None },
            compactor: compactor(),
            webhook: None,
            pacing: reload::Pacing { max_concurrent_writes: 8, ..reload::Pacing::default() },
            pod: None,
        };
        let metrics = reload::Metrics::register(&prometheus::Registry::new(), false).expect("metrics");
        let (synced, synced_rx) = watch::channel(Some(owned.clone()));
        let (owned, owned_rx) = watch::channel(owned);
        let (changes, changes_rx) = mpsc::channel(16);
        let (active_tx, active) = watch::channel(BTreeSet::new());
        let (reconciled_tx, reconciled) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let inputs = Inputs { store, changes: changes_rx, synced: synced_rx, owned: owned_rx, edits: None };
        let outputs =
            Outputs { reconciled: reconciled_tx, active: active_tx, alerts: None, damped: Default::default() };
        let task = tokio::spawn(reload::run(client, config, inputs, metrics.clone(), outputs, shutdown.clone()));
        InProcess { changes, synced, owned, active, reconciled, metrics, shutdown, task }
    }

    /// Changes the engine has handled, whatever their result.
    fn processed(&self) -> u64 {
        ["success", "skipped", "error"].iter().map(|r| self.metrics.reconcile.count(r)).sum()
    }

    async fn wait_active(&mut self, what: &str, done: impl Fn(&BTreeSet<u32>) -> bool) {
        tokio::time::timeout(support::DEADLINE, self.active.wait_for(done))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("engine running");
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("engine task").expect("engine");
    }
}

/// A client layer that holds every request of one method whose path contains a text until
/// released: an API server slow to answer one call. A held request dropped by its caller
/// stops counting.
#[derive(Clone)]
struct HoldRequests {
    method: http::Method,
    path: Arc<str>,
    release: Arc<watch::Sender<bool>>,
    held: Arc<AtomicUsize>,
}

impl HoldRequests {
    fn of(method: http::Method, path: &str) -> Self {
        HoldRequests { method, path: path.into(), release: Arc::new(watch::channel(false).0), held: Arc::default() }
    }

    /// A client of the local control plane, through this layer.
    async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(support::kubeconfig_path()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
        kube::client::ClientBuilder::try_from(config).expect("client builder").with_layer(self).build()
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.release.send_replace(true);
    }
}

impl<S> tower::Layer<S> for HoldRequests {
    type Service = Holding<S>;

    fn layer(&self, inner: S) -> Holding<S> {
        Holding { inner, hold: self.clone() }
    }
}

struct Holding<S> {
    inner: S,
    hold: HoldRequests,
}

impl<S> tower::Service<http::Request<kube::client::Body>> for Holding<S>
where
    S: tower::Service<http::Request<kube::client::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let held = request.method() == self.hold.method && request.uri().path().contains(&*self.hold.path);
        // Nothing is sent before the returned future is polled.
        let call = self.inner.call(request);
        let (mut released, count) = (self.hold.release.subscribe(), self.hold.held.clone());
        Box::pin(async move {
            if held {
                count.fetch_add(1, Ordering::SeqCst);
                let _counted = Counted(count);
                let _ = released.wait_for(|r| *r).await;
            }
            call.await
        })
    }
}

/// Counts one held request out when dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A ValidatingAdmissionPolicy that refuses writes of the checkpoint's head in `ns` with the
/// message etcd gives an object past its limit, as the API server refused the checkpoint of
/// 14,400 resources (issue 48). Returns once it is in force (a dry-run write is refused).
async fn refuse_checkpoint_writes(
    client: &kube::Client,
    ns: &str,
) -> Vec<(kube::Api<kube::api::DynamicObject>, String)> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let gvk = |kind: &str| GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let policy = ApiResource::from_gvk(&gvk("ValidatingAdmissionPolicy"));
    let binding = ApiResource::from_gvk(&gvk("ValidatingAdmissionPolicyBinding"));
    let name = format!("{ns}-checkpoint-too-large");
    let objects = [
        (
            &policy,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": { "name": name },
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": { "resourceRules": [{
                        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]
                    }] },
                    "validations": [{
                        "expression": format!("!(object.metadata.name in ['{CHECKPOINT}', 'admission-probe'])"),
                        "message": "etcdserver: request is too large"
                    }]
                }
            }),
        ),
        (
            &binding,
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": { "name": name },
                "spec": {
                    "policyName": name, "validationActions": ["Deny"],
                    "matchResources": { "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } } }
                }
            }),
        ),
    ];
    let mut created = Vec::new();
    for (resource, object) in objects {
        let api: kube::Api<DynamicObject> = kube::Api::all_with(client.clone(), resource);
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        api.create(&PostParams::default(), &object).await.expect("create the admission policy");
        created.push((api, name.clone()));
    }
    let configmaps = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns);
    let probe: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({ "metadata": { "name": "admission-probe" } })).expect("a ConfigMap");
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    wait_for("the admission policy in force", || async {
        let refused = configmaps.create(&dry_run, &probe).await.err()?;
        refused.to_string().contains("request is too large").then_some(())
    })
    .await;
    created
}

async fn delete_all(objects: Vec<(kube::Api<kube::api::DynamicObject>, String)>) {
    for (api, name) in objects.into_iter().rev() {
        let _ = api.delete(&name, &Default::default()).await;
    }
}

/// Issue 48: a checkpoint the API server refuses is loud (the log, `/readyz` and a metric name
/// the server's answer; a replica leaving with it unsaved posts a Warning Event on its pod)
/// and is retried until the server takes it, when the warning goes.
#[tokio::test]
async fn a_checkpoint_the_api_server_refuses_is_said_everywhere_and_retried_until_it_holds() {
    with_temp_ns("refused-checkpoint", |client, ns| async move {
        let ctx = Ctx::new(client, ns, Strategy::EnvVars);
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(c, ns).await;
        let policy = refuse_checkpoint_writes(c, ns).await;
        let controller = start(&ctx, "first").await;
        let readyz = wait_for("/readyz to say the checkpoint is not being saved", || async {
            let body = controller.get("/readyz").await;
            body.contains("shard 0: the checkpoint is not being saved").then_some(body)
        })
        .await;
        assert!(readyz.starts_with("ok"), "still ready: every change is acted on: {readyz}");
        assert!(readyz.contains("etcdserver: request is too large"), "the server's message: {readyz}");
        assert_eq!(controller.metric("reloader_checkpoint_unsaved_shards").await, 1.0);
        assert!(controller.logged("etcdserver: request is too large"), "the log names the cause");
        // Live changes are still acted on.
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;

        delete_all(policy).await;
        wait_for("the checkpoint saved once the server takes it", || async {
            let saved = checkpoint_entry(&ctx, "cm").await == Some(short_of(&cm_hash(&[("k", "2")])));
            let clear = !controller.get("/readyz").await.contains("warning");
            let metric = controller.metric("reloader_checkpoint_unsaved_shards").await == 0.0;
            (saved && clear && metric).then_some(())
        })
        .await;

        // Refused again, and a change to save: the replica leaves with its checkpoint unsaved.
        let policy = refuse_checkpoint_writes(c, ns).await;
        patch_configmap(c, ns, "cm", json!({ "data": { "k": "3" } })).await;
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "3")])).await;
        controller.stop().await;
        let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.clone(), ns);
        let event = wait_for("a Warning Event on the controller's pod", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| e.reason.as_deref() == Some("CheckpointNotSaved"))
        })
        .await;
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let regarding = event.regarding.expect("regarding");
        assert_eq!(
            (regarding.kind.as_deref(), regarding.name.as_deref()),
            (Some("Pod"), Some(format!("{ns}-first").as_str()))
        );
        assert!(event.note.unwrap_or_default().contains("etcdserver: request is too large"));
        delete_all(policy).await;
    })
    .await;
}
