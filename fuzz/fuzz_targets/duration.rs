//! Any text as a Go duration (flags, `pause-period`, `coalesce-window`): never a panic, never
//! past its ceiling, and what parses prints to a form that parses to the same duration.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use reloader_fleet::reload::duration::{GoDuration, PAUSE_PERIOD_MAX};
use reloader_fleet::reload::parse_go_duration;

fuzz_target!(|text: &str| {
    if let Ok(parsed) = parse_go_duration(text, PAUSE_PERIOD_MAX) {
        assert!(parsed <= PAUSE_PERIOD_MAX, "{text:?} -> {parsed:?}");
        let printed = GoDuration(parsed).to_string();
        assert_eq!(parse_go_duration(&printed, Duration::MAX), Ok(parsed), "{text:?} printed {printed:?}");
    }
});
