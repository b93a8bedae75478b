//! Any text as a `--custom-kinds-file`: never a panic; what is accepted names kinds whose paths
//! start below `spec` and whose group has a dot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reloader_fleet::watch::custom_kinds;

fuzz_target!(|text: &str| {
    if let Ok(rows) = custom_kinds::parse("fuzz.yaml", text) {
        for row in rows {
            assert!(row.group.contains('.') && !row.kind.is_empty(), "{text:?}");
        }
    }
});
