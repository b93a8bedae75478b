//! The consistent hash ring from namespaces to shards.
//!
//! ```text
//!  namespace ──xxh3-64(bytes)──▶ point on the ring ──next vnode clockwise──▶ shard id
//!  shard s has VNODES points: xxh3-64("shard-<s>#<v>") for v in 0..VNODES
//! ```
//! Every replica, of every version, must compute the same mapping, or two of them would act
//! on one namespace during a rolling update. So the ring never hashes Rust values with
//! Rust's `Hash` (not a stable format): nodes and keys write explicit bytes into a hasher
//! that digests exactly those bytes with xxh3-64, a fixed algorithm. Golden tests pin the
//! mapping for S = 1, 16, 64 and 256.

use std::hash::{BuildHasher, Hash, Hasher};

use hashring::HashRing;

/// Virtual nodes per shard: enough that ring arcs differ by a few percent, so that the
/// spread between shards is dominated by the namespaces themselves.
pub const VNODES: u32 = 512;

/// The name and version of the placement function, reported by the admin endpoint. Change it
/// whenever the mapping changes.
pub const ALGORITHM: &str = "hashring-xxh3-64-v1";

/// Maps namespaces to shards `0..shards`.
#[derive(Clone, Debug)]
pub struct Ring {
    shards: u32,
    ring: HashRing<VirtualNode, Xxh3Build>,
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

/// Why a ring cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the shard count must be between 1 and {max}, got {shards}")]
pub struct InvalidShards {
    pub shards: u32,
    pub max: u32,
}

/// The largest supported shard count (one Lease each).
pub const MAX_SHARDS: u32 = 4096;

impl Ring {
    /// A ring of `shards` shards.
    ///
    /// # Errors
    /// When `shards` is 0 or above [`MAX_SHARDS`].
    pub fn new(shards: u32) -> Result<Ring, InvalidShards> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(InvalidShards { shards, max: MAX_SHARDS });
        }
        let mut ring = HashRing::with_hasher(Xxh3Build);
        ring.batch_add(
            (0..shards).flat_map(|shard| (0..VNODES).map(move |replica| VirtualNode { shard, replica })).collect(),
        );
        Ok(Ring { shards, ring })
    }

    /// What two replicas must agree on to share shards: the shard count and the placement.
    pub fn fingerprint(&self) -> String {
        format!("shards={},vnodes={VNODES},{ALGORITHM}", self.shards())
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard that owns `namespace`.
    pub fn shard_of(&self, namespace: &str) -> u32 {
        // The ring has at least one node (shards >= 1), so `get` always finds one.
        self.ring.get(&NamespaceKey(namespace)).map(|node| node.shard).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
