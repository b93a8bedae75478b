//! Any text as a checkpoint ConfigMap's data (anyone who may write ConfigMaps in the controller's
//! namespace can write it): never a panic, and every line is either an entry or counted as
//! unreadable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reloader_fleet::reload::parse_checkpoint;

fuzz_target!(|text: &str| {
    let (entries, unreadable) = parse_checkpoint(text);
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(entries.len() + unreadable <= lines, "{} entries and {unreadable} unreadable of {lines} lines", entries.len());
});
