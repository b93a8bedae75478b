//! Per-shard Leases on the real API server: exclusivity, balance, handoff on a graceful stop
//! and on a crash, and self-fencing when cut off from the API server.
//!
//! Managers run in this process with short timings (lease 4 s, renew deadline 3 s, retry
//! 0.5 s). Waits have deadlines; measured handoff times are printed, not asserted.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::proxy::{Proxy, api_server_addr, kubeconfig_via};
use crate::support::{wait_for, with_temp_ns};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use reloader_fleet::lease::{self, Ownership};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const SHARDS: u32 = 16;

struct Replica {
    ownership: watch::Receiver<Ownership>,
    task: JoinHandle<Result<(), lease::Error>>,
    stop: CancellationToken,
}

fn config(ns: &str, identity: &str) -> lease::Config {
    lease::Config {
        namespace: ns.to_string(),
        identity: identity.to_string(),
        pod_namespace: ns.to_string(),
        prefix: "fleet".to_string(),
        shards: SHARDS,
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        ring: ring(SHARDS),
        release_on_cancel: true,
        hot_standby: false,
    }
}

/// The fingerprint of a hash ring of `shards` shards, as a replica records it.
fn ring(shards: u32) -> String {
    reloader_fleet::shard::Ring::with_placement(shards, reloader_fleet::shard::Placement::Hashring)
        .expect("a valid shard count")
        .fingerprint()
}

fn start(client: &Client, ns: &str, identity: &str) -> Replica {
    spawn(client, config(ns, identity), None)
}

/// A replica whose engine reports, on `working`, the shards it is still acting on.
fn spawn(client: &Client, config: lease::Config, working: Option<watch::Receiver<BTreeSet<u32>>>) -> Replica {
    let stop = CancellationToken::new();
    let metrics = lease::Metrics::register(&prometheus::Registry::new()).expect("fresh registry");
    let (shards, task) = lease::spawn(client.clone(), config, working, None, metrics, stop.clone());
    let ownership = shards.ownership;
    Replica { ownership, task, stop }
}

/// Stop replicas gracefully: each releases its Leases.
async fn stop(replicas: impl IntoIterator<Item = Replica>) {
    for r in replicas {
        r.stop.cancel();
        r.task.await.expect("lease task").expect("clean release");
    }
}

fn held(replica: &Replica) -> BTreeSet<u32> {
    replica.ownership.borrow().held.clone()
}

/// Every shard is held by exactly one of `replicas`, and each holds floor or ceil of S/R.
fn settled(replicas: &[&Replica]) -> bool {
    let sets: Vec<BTreeSet<u32>> = replicas.iter().map(|r| held(r)).collect();
    let total: usize = sets.iter().map(BTreeSet::len).sum();
    let union: BTreeSet<u32> = sets.iter().flatten().copied().collect();
    let (floor, ceil) = (SHARDS as usize / replicas.len(), (SHARDS as usize).div_ceil(replicas.len()));
    total == SHARDS as usize
        && union.len() == SHARDS as usize
        && sets.iter().all(|s| s.len() == floor || s.len() == ceil)
}

/// No shard is in two replicas' held sets.
fn exclusive(replicas: &[&Replica]) -> bool {
    let mut seen = BTreeSet::new();
    replicas.iter().all(|r| held(r).into_iter().all(|s| seen.insert(s)))
}

#[tokio::test]
async fn three_replicas_balance_sixteen_shards_and_never_share_one() {
    with_temp_ns("leases-balance", |client, ns| async move {
        let a = start(&client, &ns, "replica-a");
        let b = start(&client, &ns, "replica-b");
        let c = start(&client, &ns, "replica-c");
        let all = [&a, &b, &c];
        let started = Instant::now();
        wait_for("16 shards balanced over 3 replicas", || async { settled(&all).then_some(()) }).await;
        println!("settled after {:?}: {:?}", started.elapsed(), all.iter().map(|r| held(r).len()).collect::<Vec<_>>());

        // Sample every 200 ms while a fourth replica joins and leaves again.
        let d = start(&client, &ns, "replica-d");
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut samples = 0;
        while Instant::now() < deadline {
            assert!(exclusive(&[&a, &b, &c, &d]), "a shard was held by two replicas at once");
            samples += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("{samples} samples during churn, never shared");
        wait_for("16 shards balanced over 4 replicas", || async { settled(&[&a, &b, &c, &d]).then_some(()) }).await;
        stop([a, b, c, d]).await;
    })
    .await;
}

#[tokio::test]
async fn a_moving_shard_is_withdrawn_first_and_released_only_once_the_engine_let_go() {
    with_temp_ns("leases-drain", |client, ns| async move {
        let (working_tx, working_rx) = watch::channel(BTreeSet::new());
        let a = spawn(&client, config(&ns, "replica-a"), Some(working_rx));
        wait_for("a to hold every shard", || async { (held(&a).len() == SHARDS as usize).then_some(()) }).await;
        working_tx.send_replace(held(&a));
        let withdrawn_at = record_withdrawals(a.ownership.clone());
        let released_at = record_releases(client.clone(), &ns, "replica-a");

        // B joins; A withdraws half, but its engine is still on them: the Leases stay A's.
        let b = start(&client, &ns, "replica-b");
        let all: BTreeSet<u32> = (0..SHARDS).collect();
        let moving: BTreeSet<u32> = wait_for("a to withdraw half of its shards", || async {
            let held = held(&a);
            (held.len() == SHARDS as usize / 2).then(|| all.difference(&held).copied().collect())
        })
        .await;
        let hold_until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < hold_until {
            assert!(lock(&released_at).is_empty(), "a Lease was released while the engine still acted on its shard");
            assert!(held(&b).is_empty(), "b acted on a shard a's engine had not let go of");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // The engine lets go: the Leases move.
        let let_go = Instant::now();
        working_tx.send_replace(held(&a));
        wait_for("a and b to share the shards", || async { settled(&[&a, &b]).then_some(()) }).await;
        println!("shards moved {:?} after the engine let go", let_go.elapsed());
        assert_eq!(held(&b), moving);

        // An engine on nothing (still taking shards up, say): a withdrawal is still published
        // before the Lease is released, so the engine cannot start on a shard being given away.
        working_tx.send_replace(BTreeSet::new());
        let c = start(&client, &ns, "replica-c");
        wait_for("a, b and c to share the shards", || async { settled(&[&a, &b, &c]).then_some(()) }).await;
        let (withdrawn, released) = (lock(&withdrawn_at).clone(), lock(&released_at).clone());
        assert!(released.len() > moving.len(), "c took none of a's shards");
        for (shard, released) in released {
            let withdrawn = withdrawn.get(&shard).unwrap_or_else(|| panic!("shard {shard} released, never withdrawn"));
            assert!(*withdrawn < released, "shard {shard}'s Lease was released before a stopped acting on it");
        }
        stop([a, b, c]).await;
    })
    .await;
}

#[tokio::test]
async fn replicas_of_different_rings_never_hold_shards_at_once() {
    with_temp_ns("leases-rings", |client, ns| async move {
        let start_ring = |identity: &str, shards: u32| {
            spawn(&client, lease::Config { shards, ring: ring(shards), ..config(&ns, identity) }, None)
        };
        // An old fleet of 16 shards; a replica with 32 (a rolling update changing --shards)
        // sorts after it and waits.
        let old = start_ring("replica-old", 16);
        wait_for("the old replica to hold its 16 shards", || async { (held(&old).len() == 16).then_some(()) }).await;
        let new = start_ring("replica-new", 32);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            assert!(held(&new).is_empty(), "a replica of another ring took shards while the old one was live");
            if let Some(ring) = new.ownership.borrow().yielding_to.clone() {
                assert_eq!(ring, self::ring(16), "it says whom it waits for");
            }
            assert_eq!(held(&old).len(), 16);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(new.ownership.borrow().yielding_to, Some(ring(16)));
        stop([old]).await;
        wait_for("the new replica to take all 32", || async { (held(&new).len() == 32).then_some(()) }).await;
        assert_eq!(new.ownership.borrow().yielding_to, None);

        // A replica of a ring that sorts first appears: the other gives everything back first.
        let first = start_ring("replica-first", 16);
        let mut samples = 0;
        while held(&first).len() != 16 {
            assert!(held(&first).is_empty() || held(&new).is_empty(), "two rings held shards at once");
            samples += 1;
            assert!(samples < 300, "the first ring did not get its shards within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(held(&new).is_empty());
        stop([new, first]).await;
    })
    .await;
}

type Times = Arc<Mutex<HashMap<u32, Instant>>>;

fn lock(times: &Times) -> std::sync::MutexGuard<'_, HashMap<u32, Instant>> {
    times.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// When each shard first left the replica's published `held` set.
fn record_withdrawals(mut ownership: watch::Receiver<Ownership>) -> Times {
    let times = Times::default();
    let recorded = times.clone();
    tokio::spawn(async move {
        let mut before = ownership.borrow_and_update().held.clone();
        while ownership.changed().await.is_ok() {
            let now = ownership.borrow_and_update().held.clone();
            for shard in before.difference(&now) {
                lock(&recorded).entry(*shard).or_insert_with(Instant::now);
            }
            before = now;
        }
    });
    times
}

/// When each shard Lease held by `holder` was first seen naming someone else (or no one).
fn record_releases(client: Client, ns: &str, holder: &str) -> Times {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::runtime::{WatchStreamExt, watcher};
    let times = Times::default();
    let recorded = times.clone();
    let holder = holder.to_string();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut stream = watcher(leases, watcher::Config::default()).default_backoff().applied_objects().boxed();
        let mut theirs = BTreeSet::new();
        while let Some(Ok(lease)) = stream.next().await {
            let name = lease.metadata.name.unwrap_or_default();
            let Some(shard) = name.strip_prefix("fleet-shard-").and_then(|n| n.parse::<u32>().ok()) else { continue };
            if lease.spec.and_then(|s| s.holder_identity).as_deref() == Some(holder.as_str()) {
                theirs.insert(shard);
            } else if theirs.remove(&shard) {
                lock(&recorded).entry(shard).or_insert_with(Instant::now);
            }
        }
    });
    times
}

/// A replica with `--hot-standby` whose watches report `to_watch` loaded at once, or, when
/// `loads` is false, nothing beyond the shards it holds.
fn spawn_standby(client: &Client, ns: &str, identity: &str, loads: bool) -> Replica {
    let stop = CancellationToken::new();
    let metrics = lease::Metrics::register(&prometheus::Registry::new()).expect("fresh registry");
    let (loaded_tx, loaded_rx) = watch::channel(Some(BTreeSet::new()));
    let config = lease::Config { hot_standby: true, ..config(ns, identity) };
    let (shards, task) = lease::spawn(client.clone(), config, None, Some(loaded_rx), metrics, stop.clone());
    let ownership = shards.ownership;
    let mut follow = ownership.clone();
    tokio::spawn(async move {
        while follow.changed().await.is_ok() {
            let o = follow.borrow_and_update().clone();
            let loaded = if loads { o.to_watch(&BTreeSet::new()) } else { o.held.clone() };
            loaded_tx.send_if_modified(|current| current.replace(loaded.clone()) != Some(loaded));
        }
    });
    Replica { ownership, task, stop }
}

fn standby(replica: &Replica) -> BTreeSet<u32> {
    replica.ownership.borrow().standby.clone()
}

/// Each replica stands by for shards of the others (never its own), growing the standby one
/// shard at a time as its watches load them: one whose watches load nothing beyond what it
/// holds never asks for a second shard it has not loaded. A departure then hands the leaver's
/// shards to the replicas that stood by for them.
#[tokio::test]
async fn a_hot_standby_stands_by_for_the_others_shards_one_loaded_shard_at_a_time() {
    with_temp_ns("leases-standby", |client, ns| async move {
        let a = spawn_standby(&client, &ns, "replica-a", true);
        let b = spawn_standby(&client, &ns, "replica-b", true);
        let c = spawn_standby(&client, &ns, "replica-c", false);
        wait_for("16 shards balanced over 3 replicas", || async { settled(&[&a, &b, &c]).then_some(()) }).await;
        wait_for("a and b to stand by for about half of each other replica's shards", || async {
            [&a, &b].iter().all(|r| (4..=11).contains(&standby(r).len())).then_some(())
        })
        .await;
        for r in [&a, &b] {
            let (mine, theirs) = (held(r), standby(r));
            assert!(mine.is_disjoint(&theirs), "a standby of its own shards: {mine:?} {theirs:?}");
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            // c's watches load only what it holds (a shard it still holds on its way elsewhere
            // may be in its standby, loaded).
            let o = c.ownership.borrow().clone();
            let unloaded: Vec<&u32> = o.standby.difference(&o.held).collect();
            assert!(unloaded.len() <= 1, "c asked for more standby before loading the first: {unloaded:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let b_shards = held(&b);
        let stood_by: BTreeSet<u32> = standby(&a).intersection(&b_shards).copied().collect();
        stop([b]).await;
        wait_for("a and c to hold all 16 shards", || async { settled(&[&a, &c]).then_some(()) }).await;
        assert!(stood_by.is_subset(&held(&a)), "a got the shards of b it stood by for: {stood_by:?} of {:?}", held(&a));
        stop([a, c]).await;
    })
    .await;
}

#[tokio::test]
async fn a_graceful_stop_hands_shards_over_quickly_and_a_crash_after_the_lease_expires() {
    with_temp_ns("leases-handoff", |client, ns| async move {
        let a = start(&client, &ns, "replica-a");
        let b = start(&client, &ns, "replica-b");
        let c = start(&client, &ns, "replica-c");
        wait_for("balanced", || async { settled(&[&a, &b, &c]).then_some(()) }).await;

        // Graceful: released Leases are taken within a few retry periods.
        let stopped = Instant::now();
        stop([c]).await;
        wait_for("a and b to cover every shard", || async { settled(&[&a, &b]).then_some(()) }).await;
        let graceful = stopped.elapsed();

        // Crash: nothing is released; the others wait for the Leases to expire.
        let crashed = Instant::now();
        b.task.abort();
        wait_for("a to cover every shard", || async { (held(&a).len() == SHARDS as usize).then_some(()) }).await;
        let crash = crashed.elapsed();
        println!("handoff after a graceful stop: {graceful:?}; after a crash: {crash:?} (lease 4 s, retry 0.5 s)");
        assert!(graceful < crash, "a graceful stop must hand over faster than waiting for expiry");
        stop([a]).await;
    })
    .await;
}

#[tokio::test]
async fn without_release_on_cancel_a_stopped_replica_leaves_its_leases_to_expire() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("leases-keep", |client, ns| async move {
        let keeper = spawn(&client, lease::Config { release_on_cancel: false, ..config(&ns, "replica-keeper") }, None);
        wait_for("the keeper to hold every shard", || async { (held(&keeper).len() == 16).then_some(()) }).await;
        let other = start(&client, &ns, "replica-other");
        wait_for("two replicas sharing the shards", || async { settled(&[&keeper, &other]).then_some(()) }).await;
        let theirs = held(&keeper);
        stop([keeper]).await;
        // Stopped, yet its Leases still name it: nobody may take them before they expire.
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        for shard in &theirs {
            let lease = leases.get(&format!("fleet-shard-{shard}")).await.expect("shard Lease");
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            assert_eq!(holder, "replica-keeper", "shard {shard} was released");
        }
        wait_for("the other replica to take them once expired", || async { (held(&other).len() == 16).then_some(()) })
            .await;
        stop([other]).await;
    })
    .await;
}

#[tokio::test]
async fn a_replica_cut_off_from_the_api_server_stops_acting_before_anyone_else_takes_over() {
    with_temp_ns("leases-fence", |client, ns| async move {
        let proxy = Proxy::start(api_server_addr()).await;
        let path = kubeconfig_via(proxy.addr, &ns);
        let kubeconfig = Kubeconfig::read_from(&path).expect("proxied kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("proxied config");
        let cut_client = Client::try_from(config).expect("proxied client");

        let a = start(&client, &ns, "replica-a");
        let cut = start(&cut_client, &ns, "replica-cut");
        wait_for("balanced", || async { settled(&[&a, &cut]).then_some(()) }).await;
        let theirs = held(&cut);

        proxy.cut();
        let mut fenced_at = None;
        let mut taken_at = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && (fenced_at.is_none() || taken_at.is_none()) {
            if fenced_at.is_none() && held(&cut).is_empty() {
                fenced_at = Some(Instant::now());
            }
            if taken_at.is_none() && !held(&a).is_disjoint(&theirs) {
                taken_at = Some(Instant::now());
            }
            assert!(exclusive(&[&a, &cut]), "the cut replica still acted on a shard another replica holds");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (fenced_at, taken_at) = (fenced_at.expect("the cut replica fenced itself"), taken_at.expect("a took over"));
        println!("fenced {:?} before the takeover", taken_at.saturating_duration_since(fenced_at));
        assert!(fenced_at < taken_at, "the cut replica must stop acting before its shards are taken");
        cut.task.abort();
        stop([a]).await;
    })
    .await;
}

#[tokio::test]
async fn reloaders_own_lock_is_respected_until_it_expires_then_adopted() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("leases-adopt", |client, ns| async move {
        // Reloader v1's lock, as client-go writes it: no labels, held by an old pod.
        let old: Lease = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "stakater-reloader-lock" },
            "spec": { "holderIdentity": "reloader-old-pod", "leaseDurationSeconds": 3,
                      "renewTime": jiff::Timestamp::now().to_string(), "leaseTransitions": 4 }
        }))
        .expect("lease JSON");
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        leases.create(&kube::api::PostParams::default(), &old).await.expect("create the old lock");

        let stop = CancellationToken::new();
        let config = lease::Config { prefix: "stakater-reloader-lock".into(), shards: 1, ..config(&ns, "replica-new") };
        let metrics = lease::Metrics::register(&prometheus::Registry::new()).expect("fresh registry");
        let (shards, task) = lease::spawn(client.clone(), config, None, None, metrics, stop.clone());
        let ownership = shards.ownership;
        let started = Instant::now();
        let mut respected = true;
        while started.elapsed() < Duration::from_secs(2) {
            respected &= ownership.borrow().held.is_empty();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(respected, "the old holder's lock was taken before it expired");
        wait_for("the lock to be adopted", || async { (ownership.borrow().held.len() == 1).then_some(()) }).await;
        let adopted = leases.get("stakater-reloader-lock").await.expect("lock");
        let spec = adopted.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("replica-new"));
        assert_eq!(spec.lease_transitions, Some(5), "a takeover counts as a transition");
        stop.cancel();
        task.await.expect("lease task").expect("clean release");
    })
    .await;
}

#[tokio::test]
async fn a_shard_lease_left_by_a_stranger_with_a_day_long_duration_is_taken_after_the_fleets_duration() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("leases-stranger", |client, ns| async move {
        // Shard 3's Lease as a fleet writes it, but held by a replica that is gone and was
        // never a member, with leaseDurationSeconds of a day.
        let ghost: Lease = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "fleet-shard-3",
                          "labels": { lease::FLEET_LABEL: "fleet", lease::ROLE_LABEL: "shard" },
                          "annotations": { lease::RING_ANNOTATION: ring(SHARDS) } },
            "spec": { "holderIdentity": "gone-replica", "leaseDurationSeconds": 86400,
                      "renewTime": jiff::Timestamp::now().to_string() }
        }))
        .expect("lease JSON");
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        leases.create(&kube::api::PostParams::default(), &ghost).await.expect("create the stranger's Lease");
        let started = Instant::now();
        let replica = start(&client, &ns, "replica-a");
        wait_for("every shard held, the stranger's too", || async { (held(&replica).len() == 16).then_some(()) }).await;
        let took = started.elapsed();
        println!("the stranger's shard was taken after {took:?} (fleet lease duration 4 s)");
        assert!(took >= Duration::from_secs(4), "taken before the fleet's lease duration passed: {took:?}");
        stop([replica]).await;
    })
    .await;
}

#[tokio::test]
async fn malformed_shard_leases_are_taken_over_without_a_crash() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("leases-malformed", |client, ns| async move {
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        let far_future = "2100-01-01T00:00:00.000000Z";
        // Each as a hand edit or another tool might leave it: no holder and no times; a holder
        // of odd characters with no duration; a renewal time a century ahead; a ring
        // annotation that is no ring.
        let specs = [
            (1, serde_json::json!({}), ring(SHARDS)),
            (
                2,
                serde_json::json!({ "holderIdentity": "\u{1F4A5} not a pod/..", "renewTime": far_future }),
                ring(SHARDS),
            ),
            (
                4,
                serde_json::json!({ "holderIdentity": "x", "leaseDurationSeconds": 1, "renewTime": far_future }),
                "garbage".to_string(),
            ),
            (5, serde_json::json!({ "holderIdentity": "", "leaseDurationSeconds": 30 }), String::new()),
        ];
        for (shard, spec, ring) in specs {
            let lease: Lease = serde_json::from_value(serde_json::json!({
                "metadata": { "name": format!("fleet-shard-{shard}"),
                              "labels": { lease::FLEET_LABEL: "fleet", lease::ROLE_LABEL: "shard" },
                              "annotations": { lease::RING_ANNOTATION: ring } },
                "spec": spec
            }))
            .expect("lease JSON");
            leases.create(&kube::api::PostParams::default(), &lease).await.expect("create a malformed Lease");
        }
        let started = Instant::now();
        let replica = start(&client, &ns, "replica-a");
        wait_for("every shard held, the malformed ones too", || async { (held(&replica).len() == 16).then_some(()) })
            .await;
        println!("16 shards held {:?} after start, 4 of them over malformed Leases", started.elapsed());
        for shard in [1, 2, 4, 5] {
            let lease = leases.get(&format!("fleet-shard-{shard}")).await.expect("the Lease");
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            assert_eq!(holder, "replica-a", "shard {shard} is held on record");
        }
        stop([replica]).await;
    })
    .await;
}

/// Regression (issue 39): a Lease with the fleet label, a ring that sorts first and a day-long
/// duration made every replica give its shards back and take none, for a day. A Lease is
/// believed for the fleet's own duration at most, and a ring annotation that is no ring is
/// never given way to.
#[tokio::test]
async fn a_planted_lease_of_another_ring_stops_the_fleet_for_the_fleets_duration_at_most() {
    use k8s_openapi::api::coordination::v1::Lease;
    with_temp_ns("leases-planted", |client, ns| async move {
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        let planted = |name: &str, role: &str, ring: &str| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name,
                              "labels": { lease::FLEET_LABEL: "fleet", lease::ROLE_LABEL: role },
                              "annotations": { lease::RING_ANNOTATION: ring } },
                "spec": { "holderIdentity": "intruder", "leaseDurationSeconds": 86400,
                          "renewTime": jiff::Timestamp::now().to_string() }
            }))
            .expect("lease JSON")
        };
        // "shards=1,..." sorts before this fleet's "shards=16,...": a ring to give way to while live.
        let first = "shards=1,vnodes=512,hashring-xxh3-64-v1";
        leases.create(&Default::default(), &planted("fleet-member-intruder", "member", first)).await.expect("plant");
        leases.create(&Default::default(), &planted("fleet-shard-7", "shard", "!")).await.expect("plant garbage");
        let started = Instant::now();
        let replica = start(&client, &ns, "replica-a");
        wait_for("every shard held despite the planted Leases", || async {
            (held(&replica).len() == 16).then_some(())
        })
        .await;
        let took = started.elapsed();
        println!("16 shards held {took:?} after start, past a planted ring with a day-long duration");
        assert!(took < Duration::from_secs(30), "the planted Lease held the fleet for {took:?}");
        stop([replica]).await;
    })
    .await;
}

/// Issue 49: anyone who may write Leases in the controller's namespace (a tenant's operator
/// granted Leases cluster-wide) renewed a shard Lease in a made-up name every few seconds and
/// kept that shard from every replica for good, and a made-up member Lease was given shards
/// nobody took. A holder is believed only when it is a pod of the replicas' ServiceAccount:
/// here a forger rewrites every shard Lease twice a second, for a name with no pod and for a
/// pod of another ServiceAccount, and two replicas still share every shard, neither forged
/// name a member.
#[tokio::test]
async fn a_forger_renewing_the_fleets_leases_holds_no_shard_and_is_no_member() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::api::{Patch, PatchParams};
    with_temp_ns("leases-forged", |client, ns| async move {
        let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), &ns);
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
        for account in ["fleet", "other"] {
            let sa = serde_json::from_value(serde_json::json!({ "metadata": { "name": account } })).expect("SA");
            accounts.create(&Default::default(), &sa).await.expect("create the ServiceAccount");
        }
        for (pod, account) in [("replica-a", "fleet"), ("replica-b", "fleet"), ("mallory", "other")] {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": pod },
                "spec": { "serviceAccountName": account, "automountServiceAccountToken": false,
                          "containers": [{ "name": "app", "image": "app" }] }
            }))
            .expect("pod");
            pods.create(&Default::default(), &pod).await.expect("create the pod");
        }
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &ns);
        let forge = |name: String, role: &str, holder: &str| -> serde_json::Value {
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": name,
                              "labels": { lease::FLEET_LABEL: "fleet", lease::ROLE_LABEL: role },
                              "annotations": { lease::RING_ANNOTATION: ring(SHARDS) } },
                "spec": { "holderIdentity": holder, "leaseDurationSeconds": 4,
                          "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string() }
            })
        };
        let forger_stop = CancellationToken::new();
        let forger = tokio::spawn({
            let (leases, stop) = (leases.clone(), forger_stop.clone());
            async move {
                let apply = PatchParams::apply("forger").force();
                let mut rounds = 0u32;
                while !stop.is_cancelled() {
                    let mut writes = vec![("fleet-member-intruder".to_string(), "member", "intruder")];
                    for shard in 0..SHARDS {
                        let holder = if shard % 2 == 0 { "intruder" } else { "mallory" };
                        writes.push((format!("fleet-shard-{shard}"), "shard", holder));
                    }
                    for (name, role, holder) in writes {
                        let _ = leases.patch(&name, &apply, &Patch::Apply(forge(name.clone(), role, holder))).await;
                    }
                    rounds += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                rounds
            }
        });
        wait_for("the forged Leases written", || async {
            leases.get_opt(&format!("fleet-shard-{}", SHARDS - 1)).await.ok().flatten().map(|_| ())
        })
        .await;
        let (a, b) = (start(&client, &ns, "replica-a"), start(&client, &ns, "replica-b"));
        wait_for("the replicas sharing every shard past the forger", || async { settled(&[&a, &b]).then_some(()) })
            .await;
        for replica in [&a, &b] {
            let members = replica.ownership.borrow().members.clone();
            assert_eq!(members, vec!["replica-a".to_string(), "replica-b".to_string()], "forged members counted");
        }
        forger_stop.cancel();
        let rounds = forger.await.expect("forger");
        println!("the forger rewrote every Lease {rounds} times; the two replicas shared every shard");
        stop([a, b]).await;
    })
    .await;
}
