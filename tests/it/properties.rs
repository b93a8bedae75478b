//! Properties of the pure parsers and mappings, on generated input (proptest): no panic on any
//! input, round trips where a printed form exists, agreement with a simple reference, and the
//! ring's stability and balance. No control plane needed.
//!
//!     cargo test --test it properties:: -- --nocapture # prints the cases run per property

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use reloader_fleet::reload::duration::GoDuration;
use reloader_fleet::reload::{Keys, Options, Rules, env_var_name, parse_checkpoint, parse_go_duration};
use reloader_fleet::shard::{LabelSelector, Placement, Ring};
use reloader_fleet::watch::{Annotations, DataHash, PodTemplate, ResourceKind, ResourceState};

const CASES: u32 = 2_000;

fn config() -> ProptestConfig {
    ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() }
}

/// A requirement of the selector grammar, over a small alphabet so that labels often match.
#[derive(Clone, Debug)]
enum Req {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("team".to_string()),
        Just("env".to_string()),
        Just("example.com/tier".to_string()),
        "[a-z][a-z0-9]{0,3}"
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![Just("a".to_string()), Just("prod".to_string()), Just("x-1".to_string()), "[a-z0-9]{1,4}"]
}

fn requirement() -> impl Strategy<Value = Req> {
    prop_oneof![
        key().prop_map(Req::Exists),
        key().prop_map(Req::NotExists),
        (key(), value()).prop_map(|(k, v)| Req::Eq(k, v)),
        (key(), value()).prop_map(|(k, v)| Req::Ne(k, v)),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Req::In(k, v)),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Req::NotIn(k, v)),
    ]
}

fn text(req: &Req) -> String {
    match req {
        Req::Exists(k) => k.clone(),
        Req::NotExists(k) => format!("!{k}"),
        Req::Eq(k, v) => format!("{k}={v}"),
        Req::Ne(k, v) => format!("{k}!={v}"),
        Req::In(k, v) => format!("{k} in ({})", v.join(",")),
        Req::NotIn(k, v) => format!("{k} notin ({})", v.join(",")),
    }
}

/// The reference: Kubernetes' meaning of each requirement, written out plainly.
fn holds(req: &Req, labels: &BTreeMap<String, String>) -> bool {
    match req {
        Req::Exists(k) => labels.contains_key(k),
        Req::NotExists(k) => !labels.contains_key(k),
        Req::Eq(k, v) => labels.get(k) == Some(v),
        Req::Ne(k, v) => labels.get(k) != Some(v),
        Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
        Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
    }
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key(), value(), 0..4)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_selector_text_parses_or_fails_without_panicking(text in any::<String>()) {
        let _ = text.parse::<LabelSelector>();
    }

    #[test]
    fn selector_text_near_the_grammar_never_panics(text in "[a-z!=(),:* .-]{0,40}") {
        if let Ok(selector) = text.parse::<LabelSelector>() {
            // Whatever parses prints to a form that parses to the same selector.
            let printed = selector.to_string();
            prop_assert_eq!(printed.parse::<LabelSelector>().ok(), Some(selector), "printed {:?}", printed);
        }
    }

    #[test]
    fn selectors_agree_with_the_reference_and_round_trip(reqs in prop::collection::vec(requirement(), 1..5), l in labels()) {
        let joined = reqs.iter().map(text).collect::<Vec<_>>().join(",");
        let selector: LabelSelector = joined.parse().map_err(|e| TestCaseError::fail(format!("{joined:?}: {e}")))?;
        prop_assert_eq!(selector.matches(&l), reqs.iter().all(|r| holds(r, &l)), "{} on {:?}", joined, l);
        let again = selector.to_string().parse::<LabelSelector>().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again, selector);
    }

    #[test]
    fn go_durations_round_trip(h in 0u64..100, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
        let text = format!("{h}h{m}m{s}s{ms}ms");
        let expected = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
        let parsed = parse_go_duration(&text, Duration::MAX).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed, expected, "{}", text);
        let printed = GoDuration(parsed).to_string();
        prop_assert_eq!(parse_go_duration(&printed, Duration::MAX), Ok(parsed), "printed {}", printed);
    }

    #[test]
    fn any_duration_text_parses_or_fails_without_panicking(text in any::<String>()) {
        let _ = parse_go_duration(&text, Duration::MAX);
    }

    /// Numbers of any size (the pause period of 99999999999999999999999h panicked the engine):
    /// never a panic, never past the ceiling.
    #[test]
    fn duration_text_near_the_grammar_stays_under_its_ceiling(
        text in "[+-]?([0-9]{0,30}(\\.[0-9]{0,30})?(h|m|s|ms|us|µs|ns|d|)){1,4}",
        max_secs in 0u64..100_000,
    ) {
        let max = Duration::from_secs(max_secs);
        if let Ok(parsed) = parse_go_duration(&text, max) {
            prop_assert!(parsed <= max, "{} -> {:?} over {:?}", text, parsed, max);
        }
    }

    #[test]
    fn env_var_names_are_always_valid_names(name in any::<String>()) {
        let var = env_var_name(&name, ResourceKind::ConfigMap);
        prop_assert!(var.starts_with("STAKATER_") && var.ends_with("_CONFIGMAP"), "{}", var);
        prop_assert!(var.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'), "{}", var);
        // Only a separator makes `_` inside the name; plain letters and digits never do.
        let plain = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric());
        prop_assert!(!plain || !var.contains("__"), "{}", var);
    }

    #[test]
    fn an_explicit_list_of_plain_names_matches_exactly_its_names(
        names in prop::collection::btree_set("[a-z][a-z0-9-]{0,12}", 1..6),
        probe in "[a-z][a-z0-9-]{0,12}",
    ) {
        let list = names.iter().cloned().collect::<Vec<_>>().join(", ");
        let mut rules = Rules::new(Keys::default(), Options::default());
        let metadata = Annotations::from([("configmap.reloader.stakater.com/reload".to_string(), list)]);
        let verdict = rules.decide(ResourceKind::ConfigMap, &probe, &state(), &metadata, &PodTemplate::default());
        prop_assert_eq!(verdict.mode.is_some(), names.contains(&probe));
        prop_assert!(verdict.problems.is_empty());
    }

    #[test]
    fn any_explicit_list_is_decided_without_panicking(list in any::<String>(), name in any::<String>()) {
        let mut rules = Rules::new(Keys::default(), Options::default());
        let metadata = Annotations::from([("configmap.reloader.stakater.com/reload".to_string(), list)]);
        let _ = rules.decide(ResourceKind::ConfigMap, &name, &state(), &metadata, &PodTemplate::default());
    }

    /// The API server, given a replica's `shardSelector`, sends exactly the namespaces of the
    /// replica's shards: the server's rule (Go's `sharding.Matches`: "0x" + 16 hex digits of
    /// FNV-1a, compared by length, then as text, start inclusive, end exclusive) applied to the
    /// selector text agrees with `shard_of` for any name and any set of owned shards.
    #[test]
    fn the_api_server_selects_exactly_the_owned_namespaces(
        names in prop::collection::vec("[a-z0-9][a-z0-9-]{0,20}", 1..40),
        shards in prop::sample::select(vec![2u32, 16, 64, 256]),
        owned_bits in any::<u64>(),
    ) {
        let ring = fnv_ring(shards);
        let owned: BTreeSet<u32> = (0..shards).filter(|s| owned_bits.rotate_left(*s) & 1 == 1).collect();
        let Some(selector) = ring.shard_selector(&owned) else {
            prop_assert_eq!(owned.len() as u32, shards, "no selector only when every shard is owned");
            return Ok(());
        };
        let ranges = server_ranges(&selector);
        for name in &names {
            let hash = format!("0x{:016x}", reloader_fleet::shard::fnv1a_64(name));
            let served = ranges.iter().any(|(start, end)| !hex_less(&hash, start) && hex_less(&hash, end));
            prop_assert_eq!(served, owned.contains(&ring.shard_of(name)), "{} in {:?}", name, owned);
        }
    }

    /// The checkpoint ConfigMap is untrusted: any text is entries and unreadable lines, never a
    /// panic; a rendered line of a valid name and hash reads back as itself.
    #[test]
    fn checkpoint_text_is_entries_or_unreadable_lines(text in any::<String>()) {
        let (entries, unreadable) = parse_checkpoint(&text);
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        prop_assert!(entries.len() + unreadable <= lines);
    }

    #[test]
    fn checkpoint_lines_of_valid_names_read_back(
        ns in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
        name in "[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?",
        hash in any::<u64>(),
    ) {
        prop_assume!(!name.contains("..") && !name.contains(".-") && !name.contains("-."));
        let (entries, unreadable) = parse_checkpoint(&format!("S {ns} {name} {hash:016x}"));
        prop_assert_eq!(unreadable, 0);
        prop_assert_eq!(entries.values().copied().collect::<Vec<_>>(), vec![hash]);
    }

    /// A Lease's annotations are untrusted: a ring only from a fingerprint, no shard beyond the
    /// largest count.
    #[test]
    fn lease_annotations_never_name_a_ring_or_shard_that_cannot_be(text in "[a-z0-9=,-]{0,40}") {
        if Ring::from_fingerprint(&text).is_some() {
            prop_assert!(reloader_fleet::shard::is_fingerprint(&text), "{}", text);
        }
        prop_assert!(reloader_fleet::lease::parse_shards(&text).iter().all(|s| *s < reloader_fleet::shard::MAX_SHARDS));
    }

    #[test]
    fn the_ring_places_every_name_in_range_and_the_same_way_twice(names in prop::collection::vec(any::<String>(), 1..50)) {
        for (ring, again) in rings() {
            for name in &names {
                let shard = ring.shard_of(name);
                prop_assert!(shard < ring.shards());
                prop_assert_eq!(shard, again.shard_of(name), "two rings of one shard count disagree");
            }
        }
    }
}

/// `fnv-ranges` rings, built once per shard count.
fn fnv_ring(shards: u32) -> &'static Ring {
    static RINGS: std::sync::OnceLock<BTreeMap<u32, Ring>> = std::sync::OnceLock::new();
    let rings = RINGS.get_or_init(|| {
        [2, 16, 64, 256]
            .into_iter()
            .map(|s| (s, Ring::with_placement(s, Placement::FnvRanges).expect("a shard count")))
            .collect()
    });
    &rings[&shards]
}

/// The `(start, end)` literals of a selector, read as the API server's parser reads them.
fn server_ranges(selector: &str) -> Vec<(String, String)> {
    selector
        .split(" || ")
        .map(|part| {
            let inner = part.strip_prefix("shardRange(object.metadata.namespace, ").and_then(|p| p.strip_suffix(')'));
            let literals: Vec<&str> = inner.expect("a shardRange call").split(", ").collect();
            let [start, end] = literals[..] else { panic!("two literals in {part}") };
            (start.trim_matches('\'').to_string(), end.trim_matches('\'').to_string())
        })
        .collect()
}

/// Go's `sharding.HexLess`.
fn hex_less(a: &str, b: &str) -> bool {
    if a.len() != b.len() { a.len() < b.len() } else { a < b }
}

/// Rings of 1, 16, 64 and 256 shards, each built twice (built once: a ring of 256 shards has
/// 131,072 points).
fn rings() -> &'static [(Ring, Ring)] {
    static RINGS: std::sync::OnceLock<Vec<(Ring, Ring)>> = std::sync::OnceLock::new();
    RINGS.get_or_init(|| {
        [1, 16, 64, 256]
            .into_iter()
            .map(|s| (Ring::new(s).expect("a shard count"), Ring::new(s).expect("a shard count")))
            .collect()
    })
}

fn state() -> ResourceState {
    ResourceState { hash: DataHash::of_bytes(b""), ignored: false, search_match: false, wide: None, keys: None }
}

#[test]
fn a_one_mebibyte_reload_list_is_a_problem_not_a_stall() {
    let mut rules = Rules::new(Keys::default(), Options::default());
    let huge = "a(b|c)*d,".repeat(1024 * 1024 / 9);
    let metadata = Annotations::from([("configmap.reloader.stakater.com/reload".to_string(), huge)]);
    let verdict = rules.decide(ResourceKind::ConfigMap, "abd", &state(), &metadata, &PodTemplate::default());
    assert_eq!(verdict.mode, None);
    assert_eq!(verdict.problems.len(), 1, "{:?}", verdict.problems);
    assert!(verdict.problems[0].reason.contains("longer than"), "{}", verdict.problems[0].reason);
    assert!(verdict.problems[0].value.len() < 200, "the report quotes only the start");
}

#[test]
fn an_entry_whose_regex_would_compile_huge_is_a_problem() {
    let mut rules = Rules::new(Keys::default(), Options::default());
    let metadata =
        Annotations::from([("configmap.reloader.stakater.com/reload".to_string(), "(a{1000}){1000}".to_string())]);
    let verdict = rules.decide(ResourceKind::ConfigMap, "a", &state(), &metadata, &PodTemplate::default());
    assert_eq!(verdict.mode, None);
    assert_eq!(verdict.problems.len(), 1, "{:?}", verdict.problems);
}

/// Random names, ten sets: the busiest of 16 shards holds at most 1.35x the mean.
#[test]
fn the_ring_is_balanced_for_random_names() {
    let ring = Ring::new(16).expect("16 shards");
    // xorshift64*: random enough for names, and the same sets on every run.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut worst: f64 = 0.0;
    for _ in 0..10 {
        let mut set = BTreeSet::new();
        while set.len() < 5_000 {
            let len = 3 + (next() % 18) as usize;
            let name: String = (0..len).map(|_| (b'a' + (next() % 26) as u8) as char).collect();
            set.insert(name);
        }
        let mut counts = [0usize; 16];
        for name in &set {
            counts[ring.shard_of(name) as usize] += 1;
        }
        let mean = set.len() as f64 / 16.0;
        let max = *counts.iter().max().expect("16 counts") as f64;
        worst = worst.max(max / mean);
    }
    println!("ring balance, 10 sets of 5,000 random names over 16 shards: worst max/mean {worst:.3}");
    assert!(worst <= 1.35, "worst max/mean {worst:.3}");
    println!("{CASES} generated cases per property");
}
