use super::*;

/// Our own output, pinned: two versions of the binary must place every namespace alike.
/// Regenerate only on purpose (REGENERATE_GOLDEN=1 cargo test ring) and review the diff.
const GOLDEN_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/ring-assignments.txt");
const GOLDEN: &str = include_str!("../../../tests/golden/ring-assignments.txt");
const FNV_GOLDEN_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/ring-fnv-ranges.txt");
const FNV_GOLDEN: &str = include_str!("../../../tests/golden/ring-fnv-ranges.txt");
const SHARD_COUNTS: [u32; 4] = [1, 16, 64, 256];

fn golden_namespaces() -> Vec<String> {
    let mut names: Vec<String> = ["default", "kube-system", "kube-public", "kube-node-lease", "monitoring", "argocd"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.extend((0..12).map(|i| format!("tenant-{i:05}")));
    names.extend(
        [
            "team-a-prod",
            "team-a-staging",
            "payments",
            "payments-canary",
            "ml.batch",
            "x",
            "a-very-long-namespace-name-that-is-exactly-sixty-three-chars-xx",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    names
}

fn render(placement: Placement) -> String {
    let rings: Vec<Ring> =
        SHARD_COUNTS.iter().map(|&s| Ring::with_placement(s, placement).expect("valid shard count")).collect();
    let algorithm = rings[0].algorithm();
    let mut out = format!(
        "# Source: reloader-fleet's own ring ({algorithm}, {VNODES} virtual nodes per shard).\n\
         # Regenerate only with REGENERATE_GOLDEN=1 and review the diff: a change moves namespaces.\n\
         # namespace shard-of(S=1) shard-of(S=16) shard-of(S=64) shard-of(S=256)\n"
    );
    for ns in golden_namespaces() {
        let shards: Vec<String> = rings.iter().map(|r| r.shard_of(&ns).to_string()).collect();
        out.push_str(&format!("{ns} {}\n", shards.join(" ")));
    }
    out
}

#[test]
fn placement_matches_the_golden_file() {
    for (placement, path, golden) in
        [(Placement::Hashring, GOLDEN_PATH, GOLDEN), (Placement::FnvRanges, FNV_GOLDEN_PATH, FNV_GOLDEN)]
    {
        let now = render(placement);
        if std::env::var_os("REGENERATE_GOLDEN").is_some() {
            std::fs::write(path, &now).expect("write the golden file");
            continue;
        }
        assert_eq!(
            now, golden,
            "the {placement} namespace -> shard mapping changed: old and new replicas would disagree during a rolling update"
        );
    }
}

/// Values from Go's `hash/fnv` (`New64a`), which the API server's `shardSelector` uses.
#[test]
fn the_namespace_hash_is_the_api_servers() {
    for (namespace, go) in [
        ("", 0xcbf2_9ce4_8422_2325_u64),
        ("default", 0xebad_a516_8620_c5fe),
        ("kube-system", 0xdf65_c7bc_1d82_b35e),
        ("lt-0001", 0x7d76_1d3d_0872_f413),
        ("team-a-prod", 0x76c7_3bae_f348_ba20),
    ] {
        assert_eq!(fnv1a_64(namespace), go, "{namespace:?}");
    }
}

#[test]
fn fingerprints_round_trip() {
    for placement in [Placement::Hashring, Placement::FnvRanges] {
        let ring = Ring::with_placement(16, placement).expect("valid");
        let back = Ring::from_fingerprint(&ring.fingerprint()).expect("a fingerprint");
        assert_eq!((back.shards(), back.placement()), (16, placement));
    }
    assert_eq!(Ring::new(16).expect("valid").fingerprint(), "shards=16,vnodes=512,hashring-xxh3-64-v1");
    assert!(Ring::from_fingerprint("no ring").is_none());
    assert!(Ring::with_placement(MAX_FNV_SHARDS + 1, Placement::FnvRanges).is_err());
}

/// The selector of any set of shards stays well under the API server's limit of 100,000
/// characters on a CEL expression, for every shard count up to 1024 and the worst sets (every
/// other shard, a random half).
#[test]
fn shard_selectors_fit_the_api_servers_limit() {
    for shards in [2, 16, 64, 256, 1024] {
        let ring = Ring::with_placement(shards, Placement::FnvRanges).expect("valid");
        let alternate: BTreeSet<u32> = (0..shards).step_by(2).collect();
        let selector = ring.shard_selector(&alternate).expect("a strict subset");
        assert!(selector.len() < 60_000, "S={shards}: {} characters", selector.len());
        println!(
            "S={shards}, every other shard: {} ranges, {} characters",
            ring.ranges(&alternate).len(),
            selector.len()
        );
    }
    let ring = Ring::with_placement(16, Placement::FnvRanges).expect("valid");
    assert_eq!(ring.shard_selector(&(0..16).collect()), None, "all shards: no filter");
    assert_eq!(
        ring.shard_selector(&BTreeSet::new()).as_deref(),
        Some("shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000001')")
    );
    assert_eq!(Ring::new(16).expect("valid").shard_selector(&BTreeSet::from([1])), None, "hashring has no ranges");
}

#[test]
fn shard_counts_are_validated() {
    assert!(Ring::new(0).is_err());
    assert!(Ring::new(MAX_SHARDS + 1).is_err());
    assert!(Ring::new(1).is_ok());
}

#[test]
fn one_shard_takes_everything() {
    let fnv = Ring::with_placement(1, Placement::FnvRanges).expect("valid");
    assert!(golden_namespaces().iter().all(|ns| fnv.shard_of(ns) == 0));
    let ring = Ring::new(1).expect("valid");
    assert!(golden_namespaces().iter().all(|ns| ring.shard_of(ns) == 0));
}

#[test]
fn five_thousand_sequential_names_spread_within_thirty_percent_of_the_mean() {
    let ring = Ring::new(64).expect("valid");
    let mut counts = vec![0u32; 64];
    for i in 0..5000 {
        counts[ring.shard_of(&format!("tenant-{i:05}")) as usize] += 1;
    }
    let mean = 5000.0 / 64.0;
    let max = f64::from(*counts.iter().max().expect("64 shards"));
    let min = f64::from(*counts.iter().min().expect("64 shards"));
    println!("S=64, 5000 namespaces: max/mean {:.3}, min/mean {:.3}", max / mean, min / mean);
    assert!(max / mean <= 1.3, "most loaded shard holds {:.3}x the mean", max / mean);
    assert!(min > 0.0, "no shard may be empty");
}

#[test]
fn adding_a_shard_moves_about_one_in_s_plus_one_namespaces() {
    let (before, after) = (Ring::new(16).expect("valid"), Ring::new(17).expect("valid"));
    let names: Vec<String> = (0..5000).map(|i| format!("ns-{i}")).collect();
    let moved = names.iter().filter(|n| before.shard_of(n) != after.shard_of(n)).count();
    let fraction = moved as f64 / names.len() as f64;
    println!("16 -> 17 shards moved {:.1}% of namespaces (ideal {:.1}%)", fraction * 100.0, 100.0 / 17.0);
    assert!(fraction < 2.0 / 17.0, "a consistent ring moves about 1/(S+1), not {fraction:.3}");
    let moved_elsewhere =
        names.iter().filter(|n| before.shard_of(n) != after.shard_of(n) && after.shard_of(n) != 16).count();
    assert_eq!(moved_elsewhere, 0, "namespaces only move to the new shard");
}

#[test]
fn fingerprints_of_every_ring_are_recognised_and_garbage_is_not() {
    for placement in [Placement::Hashring, Placement::FnvRanges] {
        for shards in [1, 16, 2048] {
            let ring = Ring::with_placement(shards, placement).expect("valid");
            assert!(is_fingerprint(&ring.fingerprint()), "{}", ring.fingerprint());
        }
    }
    assert!(is_fingerprint("shards=16,vnodes=512,hashring-xxh3-64-v2"), "a later version's ring");
    for garbage in [
        "",
        "!",
        "a",
        "shards=0,vnodes=512,hashring-xxh3-64-v1",
        "shards=99999,vnodes=512,hashring-xxh3-64-v1",
        "shards=16",
        "shards=16,vnodes=x,hashring",
        "shards=16,vnodes=512,Hashring",
        &format!("shards=16,vnodes=512,{}", "a".repeat(200)),
    ] {
        assert!(!is_fingerprint(garbage), "{garbage:?}");
    }
}
