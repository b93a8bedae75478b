//! Balance and cost of the two shard placements. Not a test: it prints figures.
//!
//!     cargo bench --bench placement
//!
//! For sequential names (`lt-0000`, `tenant-00000`) and realistic ones (team-app-env-n), with
//! S = 16, 64, 256 shards: the busiest shard and the busiest of 3 replicas (shards dealt round
//! robin, as Leases spread them) as a multiple of the mean, the `shardSelector` of one replica
//! (ranges, characters) and the namespaces that move when the placement or S changes. Then the
//! fleet past this machine, by simulation: 1,000,000 namespaces over 1,024 shards and 100
//! replicas (Leases placed as the lease room places them): the namespaces that move when a
//! replica joins or leaves, against the ideal 1/N, and the checkpoint bytes of a shard.

use std::collections::BTreeSet;

use reloader_fleet::lease::assign;
use reloader_fleet::reload::checkpoint::{ShardMap, footprint};
use reloader_fleet::shard::{Placement, Ring};
use reloader_fleet::watch::{ResourceKey, ResourceKind};

const REPLICAS: u32 = 3;

fn name_sets() -> Vec<(&'static str, Vec<String>)> {
    let teams = ["payments", "search", "checkout", "identity", "ml", "data", "infra", "web", "mobile", "ads"];
    let apps = ["api", "worker", "db", "cache", "ui", "batch"];
    let envs = ["dev", "staging", "prod", "qa"];
    // Every 12th of the 120,000 combinations: 10,000 names with every team, app and env.
    let mut realistic = Vec::new();
    for team in teams {
        for app in apps {
            for env in envs {
                for n in 0..500 {
                    realistic.push(format!("{team}-{app}-{env}-{n}"));
                }
            }
        }
    }
    let realistic: Vec<String> = realistic.into_iter().step_by(12).collect();
    vec![
        ("lt-0000..lt-1999", (0..2000).map(|i| format!("lt-{i:04}")).collect()),
        ("lt-0000..lt-9999", (0..10_000).map(|i| format!("lt-{i:04}")).collect()),
        ("tenant-00000..09999", (0..10_000).map(|i| format!("tenant-{i:05}")).collect()),
        ("10,000 team-app-env-n", realistic),
    ]
}

fn max_over_mean(counts: &[usize]) -> f64 {
    let total: usize = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0);
    max as f64 / (total as f64 / counts.len() as f64)
}

fn main() {
    println!("| names | S | placement | busiest shard / mean | busiest of 3 replicas / mean | selector of 1 replica |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (label, names) in name_sets() {
        for shards in [16, 64, 256] {
            for placement in [Placement::Hashring, Placement::FnvRanges] {
                let ring = Ring::with_placement(shards, placement).expect("a valid shard count");
                let mut per_shard = vec![0usize; shards as usize];
                for name in &names {
                    per_shard[ring.shard_of(name) as usize] += 1;
                }
                let mut per_replica = vec![0usize; REPLICAS as usize];
                for (shard, count) in per_shard.iter().enumerate() {
                    per_replica[shard % REPLICAS as usize] += count;
                }
                let replica_0: BTreeSet<u32> = (0..shards).filter(|s| s % REPLICAS == 0).collect();
                let selector = match ring.shard_selector(&replica_0) {
                    Some(text) => format!("{} ranges, {} chars", ring.ranges(&replica_0).len(), text.len()),
                    None => "none (client-side filter)".to_string(),
                };
                println!(
                    "| {label} | {shards} | {placement} | {:.2} | {:.2} | {selector} |",
                    max_over_mean(&per_shard),
                    max_over_mean(&per_replica)
                );
            }
        }
    }
    println!();
    println!("| names | change | namespaces that move |");
    println!("| --- | --- | --- |");
    for (label, names) in name_sets() {
        let moved = |a: &Ring, b: &Ring| {
            let n = names.iter().filter(|n| a.shard_of(n) != b.shard_of(n)).count();
            format!("{:.1}%", 100.0 * n as f64 / names.len() as f64)
        };
        let ring = |s, p| Ring::with_placement(s, p).expect("a valid shard count");
        let (hash16, fnv16, fnv17) =
            (ring(16, Placement::Hashring), ring(16, Placement::FnvRanges), ring(17, Placement::FnvRanges));
        println!("| {label} | hashring -> fnv-ranges, S=16 | {} |", moved(&hash16, &fnv16));
        println!("| {label} | fnv-ranges S=16 -> 17 | {} (ideal {:.1}%) |", moved(&fnv16, &fnv17), 100.0 / 17.0);
    }
    simulate_fleet();
}

/// A million namespaces named like a platform's (team-app-env-n).
fn million_names() -> Vec<String> {
    let teams = ["payments", "search", "checkout", "identity", "ml", "data", "infra", "web", "mobile", "ads"];
    let apps = ["api", "worker", "db", "cache", "ui", "batch"];
    let envs = ["dev", "staging", "prod", "qa"];
    let mut names = Vec::with_capacity(1_000_000);
    'all: for n in 0.. {
        for team in teams {
            for app in apps {
                for env in envs {
                    if names.len() == 1_000_000 {
                        break 'all;
                    }
                    names.push(format!("{team}-{app}-{env}-{n}"));
                }
            }
        }
    }
    names
}

/// Namespaces in the shards whose holder differs between two placements.
fn moved(
    per_shard: &[usize],
    before: &[usize],
    after: &[usize],
    members_before: &[String],
    members_after: &[String],
) -> usize {
    (0..per_shard.len()).filter(|&s| members_before[before[s]] != members_after[after[s]]).map(|s| per_shard[s]).sum()
}

fn simulate_fleet() {
    const SHARDS: u32 = 1024;
    const REPLICAS: usize = 100;
    let names = million_names();
    let ring = Ring::new(SHARDS).expect("a valid shard count");
    let mut per_shard = vec![0usize; SHARDS as usize];
    let mut in_shard: Vec<Vec<&str>> = vec![Vec::new(); SHARDS as usize];
    for name in &names {
        let shard = ring.shard_of(name) as usize;
        per_shard[shard] += 1;
        if shard < 4 {
            in_shard[shard].push(name);
        }
    }
    let members: Vec<String> = (0..REPLICAS).map(|r| format!("reloader-{r:03}")).collect();
    let initial = assign(SHARDS, &members, &[]);
    let holders: Vec<Option<&str>> = initial.iter().map(|&m| Some(members[m].as_str())).collect();
    let mut joined = members.clone();
    joined.push("reloader-100".to_string());
    joined.sort();
    let after_join = assign(SHARDS, &joined, &holders);
    let mut left = members.clone();
    left.remove(REPLICAS / 2);
    let after_leave = assign(SHARDS, &left, &holders);
    let total = names.len() as f64;
    let join = moved(&per_shard, &initial, &after_join, &members, &joined) as f64;
    let leave = moved(&per_shard, &initial, &after_leave, &members, &left) as f64;
    println!();
    println!("Simulated fleet: 1,000,000 namespaces (team-app-env-n), {SHARDS} shards, {REPLICAS} replicas");
    println!("| event | namespaces moved | ideal (1/N) | moved / ideal |");
    println!("| --- | --- | --- | --- |");
    for (event, moved, ideal) in
        [("a replica joins (101)", join, total / 101.0), ("a replica leaves (99)", leave, total / 100.0)]
    {
        println!("| {event} | {moved:.0} ({:.2}%) | {ideal:.0} | {:.2} |", 100.0 * moved / total, moved / ideal);
    }
    println!("busiest shard / mean: {:.2}", max_over_mean(&per_shard));
    // Each namespace as loadtest/scale makes them: kube-root-ca.crt, 3 ConfigMaps, 3 Secrets.
    println!("| shard | namespaces | resources | checkpoint parts | checkpoint bytes | bytes / resource |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (shard, namespaces) in in_shard.iter().enumerate().take(4) {
        let mut entries = ShardMap::default();
        for (n, namespace) in namespaces.iter().enumerate() {
            let names = [
                (ResourceKind::ConfigMap, "kube-root-ca.crt".to_string()),
                (ResourceKind::ConfigMap, "application-settings-for-service-0000-v2".to_string()),
                (ResourceKind::ConfigMap, "application-settings-for-service-0001-v2".to_string()),
                (ResourceKind::ConfigMap, "feature-flags-for-payments-gateway-v2".to_string()),
                (ResourceKind::Secret, "application-credentials-for-service-0000-v2".to_string()),
                (ResourceKind::Secret, "application-credentials-for-service-0001-v2".to_string()),
                (ResourceKind::Secret, "tls-certificate-for-payments-gateway-v2".to_string()),
            ];
            for (r, (kind, name)) in names.into_iter().enumerate() {
                let key = ResourceKey { kind, namespace: (*namespace).into(), name: name.into() };
                // As random as a SHA-1's first 64 bits.
                let mut x = (n * 7 + r) as u64 ^ 0x9E37_79B9_7F4A_7C15;
                for _ in 0..3 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                }
                entries.insert(key, x);
            }
        }
        let (parts, bytes) = footprint(&entries).unwrap_or((0, 0));
        println!(
            "| {shard} | {} | {} | {parts} | {bytes} | {:.1} |",
            namespaces.len(),
            entries.len(),
            bytes as f64 / entries.len().max(1) as f64
        );
    }
}
