use super::*;
use crate::watch::ResourceKind;

fn key(namespace: &str, name: &str) -> ResourceKey {
    ResourceKey { kind: ResourceKind::ConfigMap, namespace: namespace.into(), name: name.into() }
}

fn shard_map(entries: &[(&ResourceKey, ShortHash)]) -> ShardMap {
    entries.iter().map(|(k, h)| ((*k).clone(), *h)).collect()
}

#[test]
fn the_journal_holds_what_changed_and_what_was_removed() {
    let (a, b, c) = (key("ns", "a"), key("ns", "b"), key("ns", "c"));
    let base = shard_map(&[(&a, 1), (&b, 2)]);
    let now = shard_map(&[(&a, 1), (&b, 3), (&c, 4)]);
    let mut lines = journal(&base, &now);
    lines.sort();
    assert_eq!(lines, vec![(b.clone(), Some(3)), (c, Some(4))]);
    assert_eq!(journal(&now, &base).into_iter().filter(|(_, h)| h.is_none()).count(), 1, "c removed");
    assert!(journal(&base, &base).is_empty());
}

#[test]
fn a_layout_is_a_power_of_two_and_shrinks_only_by_a_factor_of_four() {
    assert_eq!(layout_for(1, 0), 1);
    assert_eq!(layout_for(PART_TARGET * 3, 0), 4);
    assert_eq!(layout_for(PART_TARGET * 3, 8), 8, "within a factor of four: kept");
    assert_eq!(layout_for(PART_TARGET, 8), 1);
    assert_eq!(layout_for(PART_TARGET * 9, 8), 16, "grows at once");
    assert_eq!(layout_for(usize::MAX / 2, 0), MAX_PARTS);
    for parts in [0, 1, 2, 4, 8, 16, 32] {
        assert!(is_layout(parts));
    }
    for parts in [3, 6, 64, u32::MAX] {
        assert!(!is_layout(parts), "{parts}");
    }
}

/// A part as `write_parts` leaves it in the cluster: its layout and its keys.
type Cluster = BTreeMap<u32, (u32, Vec<ResourceKey>)>;

fn parts_of(keys: &[ResourceKey], parts: u32) -> Cluster {
    let mut cluster: Cluster = (0..parts).map(|i| (i, (parts, Vec::new()))).collect();
    for key in keys {
        if let Some((_, part)) = cluster.get_mut(&format::part_of(key, parts)) {
            part.push(key.clone());
        }
    }
    cluster
}

/// What a read with the head at `head` parts vouches for, as `load_v2` reads: the head's parts,
/// then the parts of any other layout one of them holds.
fn readable(cluster: &Cluster, head: u32, keys: &[ResourceKey]) -> usize {
    let mut covered: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let mut wanted: Vec<u32> = (0..head).collect();
    let mut read = BTreeSet::new();
    while let Some(i) = wanted.pop() {
        if !read.insert(i) {
            continue;
        }
        let Some((layout, _)) = cluster.get(&i) else { continue };
        covered.entry(*layout).or_default().insert(i);
        wanted.extend(0..*layout);
    }
    keys.iter().filter(|k| covered.iter().any(|(&layout, parts)| parts.contains(&format::part_of(k, layout)))).count()
}

/// Regression guard for the write order: a save cut short after any part, growing or
/// shrinking, leaves every resource readable from one layout or the other (a resource that
/// is not would be taken as a baseline, and a change of it made meanwhile missed).
#[test]
fn a_rewrite_cut_short_after_any_part_leaves_every_resource_readable() {
    let keys: Vec<ResourceKey> = (0..2000).map(|i| key(&format!("team-{}", i % 37), &format!("config-{i}"))).collect();
    for (previous, parts) in [(1, 2), (1, 8), (2, 32), (4, 8), (8, 4), (32, 1), (8, 8)] {
        let new = parts_of(&keys, parts);
        let mut cluster = parts_of(&keys, previous);
        for (step, i) in write_order(previous, parts).enumerate() {
            cluster.insert(i, new[&i].clone());
            assert_eq!(
                readable(&cluster, previous, &keys),
                keys.len(),
                "{previous} -> {parts} parts, cut short after writing {} parts (the last part {i})",
                step + 1
            );
        }
        assert_eq!(readable(&cluster, parts, &keys), keys.len());
    }
}

#[test]
fn a_part_reads_back_only_as_the_part_it_says_it_is() {
    let keys: Vec<ResourceKey> = (0..500).map(|i| key("team-a", &format!("c-{i}"))).collect();
    let entries: ShardMap = keys.iter().map(|k| (k.clone(), 7)).collect();
    let packed = pack_parts(&entries, 4);
    let checkpoint_part = |layout: &str, bytes: &[u8]| ConfigMap {
        metadata: ObjectMeta {
            labels: Some(BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(KEY_LAYOUT.to_string(), layout.to_string())])),
        binary_data: Some(BTreeMap::from([(KEY_ENTRIES.to_string(), ByteString(bytes.to_vec()))])),
        ..ConfigMap::default()
    };
    let mut total = 0;
    for i in 0..4 {
        let part = read_part(&checkpoint_part(&format!("{i}/4"), &packed[i as usize].1), i).expect("readable");
        assert_eq!((part.layout, part.unreadable, part.digest), (4, 0, packed[i as usize].0));
        total += part.lines.len();
    }
    assert_eq!(total, 500);
    // Part 1's content presented as part 2 (copied, or renamed): its lines belong elsewhere.
    let moved = read_part(&checkpoint_part("2/4", &packed[1].1), 2).expect("readable");
    assert!(moved.lines.is_empty() && moved.unreadable > 0);
    for layout in ["1/4", "2/3", "2/64", "x", "2/0"] {
        assert!(read_part(&checkpoint_part(layout, &packed[2].1), 2).is_none(), "{layout}");
    }
    let mut foreign = checkpoint_part("0/4", &packed[0].1);
    foreign.metadata.labels = None;
    assert!(read_part(&foreign, 0).is_none(), "not ours");
}

#[test]
fn coverage_names_the_resources_a_checkpoint_cannot_vouch_for() {
    let (a, b) = (key("ns", "a"), key("ns", "b"));
    let whole = Loaded { entries: HashMap::new(), coverage: None };
    assert!(whole.is_whole() && whole.knows(&a));
    let part_a = format::part_of(&a, 2);
    let partial = Loaded {
        entries: HashMap::new(),
        coverage: Some(Coverage {
            parts: BTreeMap::from([(2, BTreeSet::from([part_a]))]),
            journaled: HashSet::from([b.clone()]),
        }),
    };
    assert!(!partial.is_whole());
    assert!(partial.knows(&a), "its part was read");
    assert!(partial.knows(&b), "the journal names it");
    let others: Vec<ResourceKey> = (0..50).map(|i| key("ns", &format!("x{i}"))).collect();
    assert!(others.iter().any(|k| !partial.knows(k)), "the other part's resources are not vouched for");
}
