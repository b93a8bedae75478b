//! The checkpoint's text, its compressed form, and which part holds a resource.
//!
//! ```text
//!  version 2 (written)                         version 1 (read, for upgrades)
//!  @<namespace>                                <C|S|P> <namespace> <name> <16 hex>
//!  <C|S|P> <name> <16 hex digits>   an entry
//!  <C|S|P> <name> -                 (journal) the entry was removed
//! ```
//! Entries are sorted and grouped by namespace, so a namespace's name is written once and the
//! deflate stream sees similar names side by side: about 17-19 bytes an entry compressed, for
//! names as long as real ones (`docs/fleet.md`, "Sizing").

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::reload::checkpoint::ShortHash;
use crate::shard::{is_dns_label, is_dns_subdomain};
use crate::watch::{ResourceKey, ResourceKind};

/// The most text one compressed object may unpack to: a checkpoint object is at most 1 MiB,
/// and real text packs about 5:1, so anything past this is not a checkpoint (a deflate
/// stream can claim a thousand times its size).
pub(super) const MAX_TEXT: usize = 64 << 20;

/// One entry: a resource and the hash acted on, or `None` for a removal (journal only).
pub(super) type Line = (ResourceKey, Option<ShortHash>);

fn kind_letter(kind: ResourceKind) -> char {
    match kind {
        ResourceKind::ConfigMap => 'C',
        ResourceKind::Secret => 'S',
        ResourceKind::SecretProviderClass => 'P',
    }
}

fn kind_of(letter: &str) -> Option<ResourceKind> {
    match letter {
        "C" => Some(ResourceKind::ConfigMap),
        "S" => Some(ResourceKind::Secret),
        "P" => Some(ResourceKind::SecretProviderClass),
        _ => None,
    }
}

fn hash_of(text: &str) -> Option<ShortHash> {
    (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| u64::from_str_radix(text, 16).ok())?
}

/// Version 2 text of `entries`, sorted (the same entries always give the same text).
pub(super) fn render<K: Borrow<ResourceKey>>(entries: impl IntoIterator<Item = (K, Option<ShortHash>)>) -> String {
    let mut entries: Vec<(K, Option<ShortHash>)> = entries.into_iter().collect();
    entries.sort_unstable_by(|(a, _), (b, _)| {
        let (a, b) = (a.borrow(), b.borrow());
        (&a.namespace, a.kind, &a.name).cmp(&(&b.namespace, b.kind, &b.name))
    });
    let mut out = String::with_capacity(entries.len() * 48);
    let mut namespace: Option<&str> = None;
    for (key, hash) in &entries {
        let key = key.borrow();
        if namespace != Some(&*key.namespace) {
            out.push('@');
            out.push_str(&key.namespace);
            out.push('\n');
            namespace = Some(&key.namespace);
        }
        out.push(kind_letter(key.kind));
        out.push(' ');
        out.push_str(&key.name);
        match hash {
            // Writing to a String cannot fail.
            Some(hash) => _ = write!(out, " {hash:016x}"),
            None => out.push_str(" -"),
        }
        out.push('\n');
    }
    out
}

/// The lines of version 2 text, and how many non-empty lines did not parse (skipped: at worst
/// a resource is treated as not in the checkpoint). Removals (`-`) are read only where
/// `removals` allows (the journal).
pub(super) fn parse(text: &str, removals: bool) -> (Vec<Line>, usize) {
    let mut lines = Vec::new();
    let mut unreadable = 0;
    let mut namespace: Option<Arc<str>> = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(name) = line.strip_prefix('@') {
            namespace = is_dns_label(name).then(|| Arc::from(name));
            if namespace.is_none() {
                unreadable += 1;
            }
            continue;
        }
        let entry = namespace.as_ref().and_then(|namespace| {
            let mut parts = line.split(' ');
            let (kind, name, hash) = (kind_of(parts.next()?)?, parts.next()?, parts.next()?);
            if parts.next().is_some() || !is_dns_subdomain(name) {
                return None;
            }
            let hash = match hash {
                "-" if removals => None,
                hash => Some(hash_of(hash)?),
            };
            Some((ResourceKey { kind, namespace: namespace.clone(), name: name.into() }, hash))
        });
        match entry {
            Some(entry) => lines.push(entry),
            None => unreadable += 1,
        }
    }
    (lines, unreadable)
}

/// Version 1 text (`<C|S|P> <namespace> <name> <16 hex>` a line, as checkpoints were written
/// before parts and the journal): the entries, and how many non-empty lines did not parse.
pub fn parse_v1(text: &str) -> (HashMap<ResourceKey, ShortHash>, usize) {
    let mut entries = HashMap::new();
    let mut unreadable = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let entry = (|| {
            let mut parts = line.split(' ');
            let kind = kind_of(parts.next()?)?;
            let (namespace, name, hash) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() || !is_dns_label(namespace) || !is_dns_subdomain(name) {
                return None;
            }
            Some((ResourceKey { kind, namespace: namespace.into(), name: name.into() }, hash_of(hash)?))
        })();
        match entry {
            Some((key, hash)) => _ = entries.insert(key, hash),
            None => unreadable += 1,
        }
    }
    (entries, unreadable)
}

/// The part (of `parts`, a power of two) that holds `key`: xxh3-64 of its kind letter,
/// namespace and name, modulo the count. Stable across builds and versions (pinned by a test
/// below): a replica reads parts another version wrote.
pub(super) fn part_of(key: &ResourceKey, parts: u32) -> u32 {
    let mut bytes = Vec::with_capacity(key.namespace.len() + key.name.len() + 3);
    bytes.push(kind_letter(key.kind) as u8);
    bytes.push(b' ');
    bytes.extend_from_slice(key.namespace.as_bytes());
    bytes.push(b' ');
    bytes.extend_from_slice(key.name.as_bytes());
    (xxhash_rust::xxh3::xxh3_64(&bytes) % u64::from(parts.max(1))) as u32
}

/// The digest that tells whether a part's text changed since it was written.
pub(super) fn digest(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// zlib at a middle level: a checkpoint is written far more often than it is read, and level
/// 6 packs it about 10% smaller than level 1 for a little more time (`cargo bench --bench
/// checkpoint`).
pub(super) fn compress(text: &str) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec_zlib(text.as_bytes(), 6)
}

/// The text of a compressed object, or `None` when it is not zlib, unpacks past [`MAX_TEXT`]
/// or is not UTF-8.
pub(super) fn decompress(bytes: &[u8]) -> Option<String> {
    let text = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(bytes, MAX_TEXT).ok()?;
    String::from_utf8(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: ResourceKind, namespace: &str, name: &str) -> ResourceKey {
        ResourceKey { kind, namespace: namespace.into(), name: name.into() }
    }

    #[test]
    fn entries_and_removals_round_trip_through_the_text_and_its_compressed_form() {
        let a = key(ResourceKind::ConfigMap, "team-a", "app.config");
        let b = key(ResourceKind::Secret, "team-a", "creds");
        let c = key(ResourceKind::SecretProviderClass, "team-b", "vault");
        let text = render([(&c, Some(7)), (&a, Some(u64::MAX)), (&b, None)]);
        assert_eq!(text, "@team-a\nC app.config ffffffffffffffff\nS creds -\n@team-b\nP vault 0000000000000007\n");
        let (lines, unreadable) = parse(&decompress(&compress(&text)).expect("zlib"), true);
        assert_eq!((lines, unreadable), (vec![(a.clone(), Some(u64::MAX)), (b, None), (c, Some(7))], 0));
        assert_eq!(parse(&text, false).1, 1, "a removal is not an entry of a base");
    }

    #[test]
    fn garbage_lines_are_counted_and_skipped() {
        let text = "C before-any-namespace 0123456789abcdef\n@Bad_NS\nC x 0123456789abcdef\n@ok\n\
                    C ../x 0123456789abcdef\nC x 0123456789abcde\nC x +123456789abcdef\nX x 0123456789abcdef\n\
                    C x 0123456789abcdef extra\nC fine 0123456789abcdef";
        let (lines, unreadable) = parse(text, true);
        assert_eq!(lines, vec![(key(ResourceKind::ConfigMap, "ok", "fine"), Some(0x0123_4567_89ab_cdef))]);
        assert_eq!(unreadable, 8);
    }

    #[test]
    fn version_1_text_still_reads() {
        let (entries, unreadable) = parse_v1("C a my.cfg 0123456789abcdef\nS b s 0000000000000000\nC Bad_NS b 0\n");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[&key(ResourceKind::ConfigMap, "a", "my.cfg")], 0x0123_4567_89ab_cdef);
        assert_eq!(unreadable, 1);
    }

    #[test]
    fn a_deflate_bomb_is_refused() {
        let bomb = miniz_oxide::deflate::compress_to_vec_zlib(&vec![b'a'; MAX_TEXT + 1], 9);
        assert!(bomb.len() < 1 << 20, "small on the wire");
        assert_eq!(decompress(&bomb), None);
        assert_eq!(decompress(b"not zlib"), None);
    }

    /// Golden: which part holds a resource is a format: changing it strands every checkpoint
    /// written in parts.
    #[test]
    fn the_part_of_a_resource_is_stable() {
        let parts: Vec<u32> = ["kube-root-ca.crt", "application-settings-for-service-0042-v2", "x"]
            .iter()
            .map(|name| part_of(&key(ResourceKind::ConfigMap, "team-payments-production-001", name), 32))
            .collect();
        assert_eq!(parts, vec![GOLDEN_PARTS[0], GOLDEN_PARTS[1], GOLDEN_PARTS[2]]);
        assert_eq!(part_of(&key(ResourceKind::Secret, "a", "b"), 1), 0);
    }

    const GOLDEN_PARTS: [u32; 3] = [12, 14, 4];
}
