//! Any text as a Lease's annotations (the ring it was written with, the shards its replica has
//! loaded): never a panic, a ring only from a fingerprint, and no shard past the largest count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reloader_fleet::lease::parse_shards;
use reloader_fleet::shard::{MAX_SHARDS, Ring, is_fingerprint};

/// Rings built at most this large here (a 4,096-shard ring takes a while to build).
const SMALL: u32 = 64;

fuzz_target!(|text: &str| {
    let shards = text.strip_prefix("shards=").and_then(|rest| rest.split(',').next()?.parse::<u32>().ok());
    if shards.is_none_or(|n| n <= SMALL) {
        let ring = Ring::from_fingerprint(text);
        assert!(ring.is_none() || is_fingerprint(text), "a ring from {text:?}, which is no fingerprint");
    }
    assert!(parse_shards(text).iter().all(|s| *s < MAX_SHARDS), "{text:?}");
});
