//! Chaos: 3 replicas share 16 shards over 200 namespaces while ConfigMaps and Secrets change
//! and replicas are killed (SIGKILL) or stopped (SIGTERM) and replaced at random. At the end
//! every workload records the current hash of both resources it uses, and no workload rolled
//! more often than the content changes that concern it. Sampled every 200 ms, no shard is
//! ever acted on by two live replicas.
//!
//! Prints updates, kills, handoffs and rollouts expected vs observed. CHAOS_SECONDS (default
//! 120) sets the length; CHAOS_SEED replays a run.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::controller::{Controller, start_fleet_replica as start};
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_namespace, create_secret, generation, patch_configmap,
    patch_secret, secret_hash,
};
use crate::support::scenario::Ctx;
use crate::support::{wait_for, with_temp_ns};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::DeleteParams;
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::json;
use tokio::sync::Mutex;
use tokio::time::Instant;

const NAMESPACES: usize = 200;
const REPLICAS: usize = 3;

/// xorshift64*: a tiny deterministic generator, so a failing run can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[tokio::test]
async fn kills_and_restarts_lose_no_update_and_roll_nothing_twice() {
    with_temp_ns("chaos", |client, home| async move {
        let seconds: u64 = std::env::var("CHAOS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
        let seed: u64 = std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
        });
        println!("chaos: {seconds}s, seed {seed} (CHAOS_SEED={seed} replays it)");
        let mut rng = Rng(seed);
        let label = format!("reloader-fleet.test/chaos={home}");
        let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("{home}-{i}")).collect();
        let api: Api<Namespace> = Api::all(client.clone());
        for ns in &namespaces {
            let labels = json!({ "reloader-fleet.test/chaos": home, support::TEST_LABEL: "chaos" });
            create_namespace(&client, ns, labels).await;
            create_configmap(&client, ns, "cm", &[("v", "0")]).await;
            create_secret(&client, ns, "sec", &[("v", "0")]).await;
            Workload::new(Kind::Deployment, "web")
                .auto()
                .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "secretRef": { "name": "sec" } }] }))
                .create(&client, ns)
                .await;
        }

        let mut serial = 0;
        let name = |serial: &mut usize| {
            *serial += 1;
            format!("{home}-r{serial}")
        };
        let live: Arc<Mutex<Vec<Controller>>> = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..REPLICAS {
            let n = name(&mut serial);
            live.lock().await.push(start(&home, &n, &label).await);
        }
        wait_for("16 shards held", || async {
            let mut total = 0.0;
            for c in live.lock().await.iter() {
                total += c.metric("reloader_shards_active").await;
            }
            (total == 16.0).then_some(())
        })
        .await;
        let mut initial = BTreeMap::new();
        for ns in &namespaces {
            initial.insert(ns.clone(), generation(&client, ns, Kind::Deployment, "web").await);
        }

        // Exclusivity sampler: every 200 ms, no shard is active on two live replicas.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampling = tokio::spawn({
            let live = live.clone();
            let done = done.clone();
            async move {
                let mut samples = 0u64;
                let mut violations = Vec::new();
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let mut holders: BTreeMap<u64, Vec<String>> = BTreeMap::new();
                    for c in live.lock().await.iter() {
                        let Ok(body) = serde_json::from_str::<serde_json::Value>(&c.get("/shards").await) else { continue };
                        for shard in body["shards"].as_array().into_iter().flatten() {
                            if shard["held_here"] == true && shard["state"] == "active" {
                                holders.entry(shard["id"].as_u64().unwrap_or(0)).or_default().push(body["identity"].to_string());
                            }
                        }
                    }
                    samples += 1;
                    violations.extend(holders.into_iter().filter(|(_, h)| h.len() > 1));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                (samples, violations)
            }
        });

        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut changes: BTreeMap<String, u64> = BTreeMap::new();
        let (mut updates, mut kills, mut stops, mut next_disruption) = (0u64, 0u64, 0u64, Instant::now() + Duration::from_secs(8));
        let mut values: BTreeMap<(String, bool), u64> = BTreeMap::new();
        while Instant::now() < deadline {
            let ns = namespaces[rng.below(NAMESPACES)].clone();
            let secret = rng.below(2) == 1;
            let value = values.entry((ns.clone(), secret)).or_insert(0);
            *value += 1;
            let text = value.to_string();
            if secret {
                patch_secret(&client, &ns, "sec", json!({ "stringData": { "v": text } })).await;
            } else {
                patch_configmap(&client, &ns, "cm", json!({ "data": { "v": text } })).await;
            }
            *changes.entry(ns).or_default() += 1;
            updates += 1;
            if Instant::now() >= next_disruption {
                let victim = {
                    let mut guard = live.lock().await;
                    let i = rng.below(guard.len());
                    guard.remove(i)
                };
                if rng.below(2) == 0 {
                    drop(victim); // SIGKILL
                    kills += 1;
                } else {
                    victim.stop().await;
                    stops += 1;
                }
                let n = name(&mut serial);
                let replacement = start(&home, &n, &label).await;
                live.lock().await.push(replacement);
                next_disruption = Instant::now() + Duration::from_millis(6000 + rng.below(8000) as u64);
            }
            tokio::time::sleep(Duration::from_millis(150 + rng.below(150) as u64)).await;
        }

        // Every workload ends up recording the current content of both resources.
        for ns in &namespaces {
            let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
            let cm_value = values.get(&(ns.clone(), false)).copied().unwrap_or(0).to_string();
            let sec_value = values.get(&(ns.clone(), true)).copied().unwrap_or(0).to_string();
            if cm_value != "0" {
                ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("v", &cm_value)])).await;
            }
            if sec_value != "0" {
                ctx.wait_reloaded(Kind::Deployment, "web", Sec, "sec", &secret_hash(&[("v", &sec_value)])).await;
            }
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let (samples, violations) = sampling.await.expect("sampler");
        println!("{samples} ownership samples");
        assert!(violations.is_empty(), "shards active on two live replicas at once: {violations:?}");
        // Once the churn stops, every shard is active on exactly one replica.
        wait_for("every shard active on one replica", || async {
            let mut active = 0.0;
            for c in live.lock().await.iter() {
                active += c.metric("reloader_shards_active").await;
            }
            (active == 16.0).then_some(())
        })
        .await;
        // And the Leases say the same: each of the 16 names a live replica.
        let mut identities = Vec::new();
        for c in live.lock().await.iter() {
            let body: serde_json::Value = serde_json::from_str(&c.get("/shards").await).expect("/shards is JSON");
            identities.push(body["identity"].as_str().unwrap_or_default().to_string());
        }
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &home);
        for shard in 0..16 {
            let lease = leases.get(&format!("stakater-reloader-lock-shard-{shard}")).await.expect("shard Lease");
            let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            assert!(identities.contains(&holder), "shard {shard} held by {holder:?}, not a live replica");
        }
        let (mut expected, mut observed) = (0i64, 0i64);
        for ns in &namespaces {
            let rolled = generation(&client, ns, Kind::Deployment, "web").await - initial[ns];
            let allowed = changes.get(ns).copied().unwrap_or(0) as i64;
            assert!(rolled <= allowed, "{ns} rolled {rolled} times for {allowed} content changes");
            expected += allowed;
            observed += rolled;
        }
        let mut handoffs = 0.0;
        for c in live.lock().await.iter() {
            handoffs += c.metric("reloader_lease_acquisitions_total").await;
        }
        println!(
            "updates {updates}, SIGKILLs {kills}, SIGTERMs {stops}, lease acquisitions by the final replicas {handoffs}, \
             rollouts expected at most {expected}, observed {observed} (fewer when changes coalesced)"
        );
        for c in live.lock().await.drain(..) {
            c.stop().await;
        }
        for ns in &namespaces {
            let _ = api.delete(ns, &DeleteParams::background()).await;
        }
    })
    .await;
}
