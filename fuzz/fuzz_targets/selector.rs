//! Any text as a label selector (`--namespace-selector`, `--resource-label-selector`): never a
//! panic, and what parses prints to a form that parses to the same selector.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reloader_fleet::shard::LabelSelector;

fuzz_target!(|text: &str| {
    if let Ok(selector) = text.parse::<LabelSelector>() {
        let printed = selector.to_string();
        assert_eq!(printed.parse::<LabelSelector>().ok(), Some(selector), "{text:?} printed {printed:?}");
    }
});
