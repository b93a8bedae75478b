//! The consistent hash ring from namespaces to shards, in one of two placements.
//!
//! ```text
//!  hashring:   namespace ──xxh3-64(bytes)──▶ point on the ring ──next vnode clockwise──▶ shard
//!  fnv-ranges: namespace ──fnv1a-64(bytes)──▶ top 11 bits: cell 0..2048 ──cell's shard──▶ shard
//!              cell c's shard: the ring's shard of the key "cell-<c>"
//!  shard s has VNODES points: xxh3-64("shard-<s>#<v>") for v in 0..VNODES
//! ```
//! `fnv-ranges` exists for the API server's sharded list and watch (`shardSelector`, the
//! ShardedListAndWatch feature): it filters by ranges of the FNV-1a hash of the namespace, so
//! a placement the server can apply must be a union of such ranges. Each cell is one range
//! and the cells of a set of shards are its [`Ring::shard_selector`]. FNV-1a spreads the high
//! bits of short, similar names poorly, so this placement balances worse than `hashring`
//! (README, "Server-side sharding", has the figures); it is chosen only for that feature.
//! Every replica, of every version, must compute the same mapping, or two of them would act
//! on one namespace during a rolling update. So the ring never hashes Rust values with
//! Rust's `Hash` (not a stable format): nodes and keys write explicit bytes into a hasher
//! that digests exactly those bytes with xxh3-64, a fixed algorithm. Golden tests pin the
//! mapping for S = 1, 16, 64 and 256.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash, Hasher};

use hashring::HashRing;

/// Virtual nodes per shard: enough that ring arcs differ by a few percent, so that the
/// spread between shards is dominated by the namespaces themselves.
pub const VNODES: u32 = 512;

/// The name and version of the `hashring` placement, reported by the admin endpoint. Change it
/// whenever the mapping changes.
pub const ALGORITHM: &str = "hashring-xxh3-64-v1";

/// The name and version of the `fnv-ranges` placement.
pub const FNV_RANGES_ALGORITHM: &str = "fnv1a-64-ranges-v1";

/// `fnv-ranges` cuts the FNV-1a space into `2^CELL_BITS` equal cells: fine enough to spread
/// clustered hashes over the shards, few enough that the selector of a third of them stays far
/// below the API server's 100,000-character limit on a selector (about 40,000 characters).
pub const CELL_BITS: u32 = 11;
const CELLS: usize = 1 << CELL_BITS;

/// How namespaces are placed on shards (`--shard-placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// xxh3-64 on a consistent ring: the best balance.
    #[default]
    Hashring,
    /// Cells of the FNV-1a space, so that the API server can filter watches by shard.
    FnvRanges,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "hashring" => Ok(Placement::Hashring),
            "fnv-ranges" => Ok(Placement::FnvRanges),
            other => Err(format!("unknown shard placement {other:?}: expected hashring or fnv-ranges")),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Hashring => "hashring",
            Placement::FnvRanges => "fnv-ranges",
        })
    }
}

/// Maps namespaces to shards `0..shards`.
#[derive(Clone, Debug)]
pub struct Ring {
    shards: u32,
    ring: HashRing<VirtualNode, Xxh3Build>,
    /// `fnv-ranges`: the shard of each cell. Empty for `hashring`.
    cells: Vec<u32>,
}

/// One point of a shard on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct VirtualNode {
    shard: u32,
    replica: u32,
}

impl Hash for VirtualNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(format!("shard-{}#{}", self.shard, self.replica).as_bytes());
    }
}

/// A namespace as ring key: exactly its UTF-8 bytes (`str`'s `Hash` would add a terminator).
struct NamespaceKey<'a>(&'a str);

impl Hash for NamespaceKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0.as_bytes());
    }
}

/// Builds hashers that collect the bytes written to them and digest them with xxh3-64.
#[derive(Clone, Copy, Debug, Default)]
struct Xxh3Build;

#[derive(Default)]
struct Xxh3Bytes(Vec<u8>);

impl BuildHasher for Xxh3Build {
    type Hasher = Xxh3Bytes;
    fn build_hasher(&self) -> Xxh3Bytes {
        Xxh3Bytes::default()
    }
}

impl Hasher for Xxh3Bytes {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn finish(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.0)
    }
}

/// A cell index as ring key: the bytes `cell-<c>`.
struct CellKey(usize);

impl Hash for CellKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(format!("cell-{}", self.0).as_bytes());
    }
}

/// Why a ring cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the shard count must be between 1 and {max}, got {shards}")]
pub struct InvalidShards {
    pub shards: u32,
    pub max: u32,
}

/// The largest supported shard count (one Lease each).
pub const MAX_SHARDS: u32 = 4096;

/// The largest shard count of `fnv-ranges`: each shard needs cells.
pub const MAX_FNV_SHARDS: u32 = CELLS as u32;

/// Longest ring fingerprint read from a Lease.
const FINGERPRINT_LIMIT: usize = 128;

/// Whether `text` has the shape of a ring fingerprint ([`Ring::fingerprint`]), of this version
/// or a later one: `shards=<1..MAX_SHARDS>`, then `name=<number>` parts, then one algorithm
/// name of lowercase letters, digits and dashes. A ring annotation on a Lease is untrusted
/// input, and a replica gives way to another ring only when it is one.
pub fn is_fingerprint(text: &str) -> bool {
    if text.len() > FINGERPRINT_LIMIT {
        return false;
    }
    let mut parts = text.split(',');
    let shards = parts.next().and_then(|p| p.strip_prefix("shards=")).and_then(|n| n.parse::<u32>().ok());
    if !shards.is_some_and(|n| (1..=MAX_SHARDS).contains(&n)) {
        return false;
    }
    let rest: Vec<&str> = parts.collect();
    let Some((algorithm, numbers)) = rest.split_last() else { return false };
    let is_number_part = |part: &&str| {
        part.split_once('=').is_some_and(|(name, n)| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase()) && n.parse::<u32>().is_ok()
        })
    };
    numbers.iter().all(is_number_part)
        && !algorithm.is_empty()
        && algorithm.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The API server's hash of a namespace for `shardSelector`: 64-bit FNV-1a of its bytes.
pub fn fnv1a_64(namespace: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(namespace.as_bytes());
    hasher.finish()
}

fn cell_of(namespace: &str) -> usize {
    (fnv1a_64(namespace) >> (64 - CELL_BITS)) as usize
}

impl Ring {
    /// A ring of `shards` shards.
    ///
    /// # Errors
    /// When `shards` is 0 or above [`MAX_SHARDS`].
    pub fn new(shards: u32) -> Result<Ring, InvalidShards> {
        Ring::with_placement(shards, Placement::Hashring)
    }

    /// A ring of `shards` shards placed by `placement`.
    ///
    /// # Errors
    /// When `shards` is 0 or above [`MAX_SHARDS`] ([`MAX_FNV_SHARDS`] for `fnv-ranges`).
    pub fn with_placement(shards: u32, placement: Placement) -> Result<Ring, InvalidShards> {
        let max = if placement == Placement::FnvRanges { MAX_FNV_SHARDS } else { MAX_SHARDS };
        if shards == 0 || shards > max {
            return Err(InvalidShards { shards, max });
        }
        let mut ring = HashRing::with_hasher(Xxh3Build);
        ring.batch_add(
            (0..shards).flat_map(|shard| (0..VNODES).map(move |replica| VirtualNode { shard, replica })).collect(),
        );
        let cells = match placement {
            Placement::Hashring => Vec::new(),
            Placement::FnvRanges => {
                (0..CELLS).map(|cell| ring.get(&CellKey(cell)).map(|node| node.shard).unwrap_or(0)).collect()
            }
        };
        Ok(Ring { shards, ring, cells })
    }

    /// The ring a fingerprint describes (as Leases record it), if it is one.
    pub fn from_fingerprint(fingerprint: &str) -> Option<Ring> {
        if !is_fingerprint(fingerprint) {
            return None;
        }
        let shards = fingerprint.split(',').find_map(|part| part.strip_prefix("shards="))?.parse().ok()?;
        let placement = if fingerprint.split(',').any(|part| part == FNV_RANGES_ALGORITHM) {
            Placement::FnvRanges
        } else {
            Placement::Hashring
        };
        Ring::with_placement(shards, placement).ok()
    }

    pub fn placement(&self) -> Placement {
        if self.cells.is_empty() { Placement::Hashring } else { Placement::FnvRanges }
    }

    /// The placement's name and version.
    pub fn algorithm(&self) -> &'static str {
        match self.placement() {
            Placement::Hashring => ALGORITHM,
            Placement::FnvRanges => FNV_RANGES_ALGORITHM,
        }
    }

    /// What two replicas must agree on to share shards: the shard count and the placement.
    pub fn fingerprint(&self) -> String {
        match self.placement() {
            Placement::Hashring => format!("shards={},vnodes={VNODES},{ALGORITHM}", self.shards()),
            Placement::FnvRanges => {
                format!("shards={},cells={CELLS},vnodes={VNODES},{FNV_RANGES_ALGORITHM}", self.shards())
            }
        }
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard that owns `namespace`.
    pub fn shard_of(&self, namespace: &str) -> u32 {
        if let Some(&shard) = self.cells.get(cell_of(namespace)) {
            return shard;
        }
        // The ring has at least one node (shards >= 1), so `get` always finds one.
        self.ring.get(&NamespaceKey(namespace)).map(|node| node.shard).unwrap_or(0)
    }

    /// The FNV-1a ranges `[start, end)` holding exactly the namespaces of `shards`, adjacent
    /// cells merged; `end` is up to 2^64. Empty for `hashring` (no ranges describe it).
    pub fn ranges(&self, shards: &BTreeSet<u32>) -> Vec<(u64, u128)> {
        let shift = 64 - CELL_BITS;
        let mut ranges: Vec<(u64, u128)> = Vec::new();
        for (cell, shard) in self.cells.iter().enumerate() {
            if !shards.contains(shard) {
                continue;
            }
            let (start, end) = ((cell as u64) << shift, ((cell as u128) + 1) << shift);
            match ranges.last_mut() {
                Some(last) if last.1 == u128::from(start) => last.1 = end,
                _ => ranges.push((start, end)),
            }
        }
        ranges
    }

    /// The API server's `shardSelector` for the namespaces of `shards`: `None` when the
    /// placement has no ranges or `shards` is every shard (nothing to filter). Owning no shard
    /// selects one hash value (a selector cannot be empty), which the watches then filter out.
    pub fn shard_selector(&self, shards: &BTreeSet<u32>) -> Option<String> {
        if self.cells.is_empty() || (0..self.shards).all(|s| shards.contains(&s)) {
            return None;
        }
        let mut ranges = self.ranges(shards);
        if ranges.is_empty() {
            ranges.push((0, 1));
        }
        let parts: Vec<String> = ranges
            .iter()
            .map(|(start, end)| {
                let end = if *end > u128::from(u64::MAX) {
                    "0x10000000000000000".to_string()
                } else {
                    format!("0x{end:016x}")
                };
                format!("shardRange(object.metadata.namespace, '0x{start:016x}', '{end}')")
            })
            .collect();
        Some(parts.join(" || "))
    }
}

#[cfg(test)]
mod tests;
