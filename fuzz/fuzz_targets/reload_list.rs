//! Any text as a `.../reload` list on a workload, matched against any name: never a panic, and
//! a list naming the resource exactly (a plain entry) always reloads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reloader_fleet::reload::{Keys, Options, Rules, named_entries};
use reloader_fleet::watch::{Annotations, DataHash, PodTemplate, ResourceKind, ResourceState};

const LIST: &str = "configmap.reloader.stakater.com/reload";

fuzz_target!(|input: (&str, &str)| {
    let (list, name) = input;
    let mut rules = Rules::new(Keys::default(), Options::default());
    let state =
        ResourceState { hash: DataHash::of_bytes(b"x"), ignored: false, search_match: false, wide: None, keys: None };
    let metadata = Annotations::from([(LIST.to_string(), list.to_string())]);
    let verdict = rules.decide(ResourceKind::ConfigMap, name, &state, &metadata, &PodTemplate::default());
    if list.len() <= 1024 && named_entries(list).any(|entry| entry == name) {
        assert!(verdict.mode.is_some(), "{list:?} names {name:?} but does not reload it: {verdict:?}");
    }
});
