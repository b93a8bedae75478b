//! Balance and cost of the two shard placements. Not a test: it prints figures.
//!
//!     cargo bench --bench placement
//!
//! For sequential names (`lt-0000`, `tenant-00000`) and realistic ones (team-app-env-n), with
//! S = 16, 64, 256 shards: the busiest shard and the busiest of 3 replicas (shards dealt round
//! robin, as Leases spread them) as a multiple of the mean, the `shardSelector` of one replica
//! (ranges, characters) and the namespaces that move when the placement or S changes.

use std::collections::BTreeSet;

use reloader_fleet::shard::{Placement, Ring};

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
}
