//! Reloader's annotation rules: does a change of one resource reload one workload, and which
//! container records it. Pure functions: no client, no I/O.
//!
//! Precedence, as in Reloader v1 (`ShouldReload`):
//! ```text
//! ignored workload type -> resource `ignore` -> exclude list -> explicit `.../reload` regexes
//!   -> `search` + `match` -> `auto` / typed auto / --auto-reload-all -> no reload
//! ```
//! Explicit lists reload whether or not the workload references the resource; every other rule
//! requires a reference (a container that uses it).

use std::collections::{BTreeMap, HashMap};

use regex::Regex;

use crate::reload::Keys;
use crate::watch::{PodTemplate, ResourceKind, ResourceState};

/// Global switches that take part in the decision.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--auto-reload-all`: workloads with neither `auto` nor the typed auto key reload.
    pub auto_reload_all: bool,
}

/// Why a workload is to reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Named by an explicit `.../reload` list: no reference needed.
    Explicit,
    /// `auto`, typed auto, `search` or `--auto-reload-all`: only if a container uses the resource.
    Auto,
}

/// The verdict for one (resource, workload) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub mode: Option<Mode>,
    /// Annotation values on the workload that could not be understood. Each one is reported as
    /// a Warning Event on the workload; the decision goes on without the bad value.
    pub problems: Vec<Problem>,
}

/// An annotation value that Reloader's rules cannot use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub annotation: String,
    pub value: String,
    pub reason: String,
}

/// Compiled explicit-list patterns kept at most; the cache starts over beyond that.
const PATTERN_CACHE_LIMIT: usize = 10_000;
/// Longest `.../reload` list read. Kubernetes allows 256 KiB of annotations per object; a
/// list this long is a mistake, and compiling it entry by entry on every change would stall
/// the engine for everyone.
const EXPLICIT_LIST_LIMIT: usize = 16 * 1024;
/// Compiled size a single entry may reach (the regex crate's default is 10 MiB).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// The rules with their settings, plus a cache of compiled explicit-list patterns (an
/// explicit list is otherwise compiled again for every change of its namespace).
#[derive(Debug)]
pub struct Rules {
    keys: Keys,
    options: Options,
    patterns: HashMap<String, Result<Regex, String>>,
}

impl Rules {
    pub fn new(keys: Keys, options: Options) -> Self {
        Rules { keys, options, patterns: HashMap::new() }
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Decide whether a change of `resource_name` (of `kind`, with `state`) reloads a workload
    /// with these metadata annotations and pod template.
    pub fn decide(
        &mut self,
        kind: ResourceKind,
        resource_name: &str,
        state: &ResourceState,
        metadata: &BTreeMap<String, String>,
        template: &PodTemplate,
    ) -> Verdict {
        let mut problems = Vec::new();
        let mode = self.mode(kind, resource_name, state, metadata, template, &mut problems);
        Verdict { mode, problems }
    }

    /// The rules in Reloader's order; the first that applies decides.
    fn mode(
        &mut self,
        kind: ResourceKind,
        resource_name: &str,
        state: &ResourceState,
        metadata: &BTreeMap<String, String>,
        template: &PodTemplate,
        problems: &mut Vec<Problem>,
    ) -> Option<Mode> {
        if state.ignored {
            return None;
        }
        let keys = &self.keys;
        let typed = keys.for_kind(kind);

        // Exclude lists are read from workload metadata only, as in Reloader v1.
        if let Some(excluded) = metadata.get(typed.exclude)
            && excluded.split(',').any(|n| n.trim() == resource_name)
        {
            return None;
        }

        // Presence, not value, of any of these keys on metadata decides where they are read from.
        let selection = [typed.explicit, keys.auto.as_str(), typed.auto, keys.search.as_str()];
        let source = if selection.iter().any(|k| metadata.contains_key(*k)) { metadata } else { &template.annotations };
        let read = |key: &str| source.get(key).map(String::as_str).unwrap_or("");

        if let Some(list) = source.get(typed.explicit)
            && explicit_list_matches(&mut self.patterns, typed.explicit, list, resource_name, problems)
        {
            return Some(Mode::Explicit);
        }

        if read(&keys.search) == "true" && state.search_match {
            return Some(Mode::Auto);
        }

        let auto = read(&keys.auto);
        let typed_auto = read(typed.auto);
        let enabled = parse_bool(&keys.auto, auto, problems) || parse_bool(typed.auto, typed_auto, problems);
        if enabled || (auto.is_empty() && typed_auto.is_empty() && self.options.auto_reload_all) {
            return Some(Mode::Auto);
        }
        None
    }
}

/// One entry per comma, each trimmed and anchored as `^entry$` (not grouped: `a|b` means
/// "starts with a or ends with b", exactly as Reloader builds it). A bad entry is reported and
/// skipped; the others still count.
fn explicit_list_matches(
    patterns: &mut HashMap<String, Result<Regex, String>>,
    annotation: &str,
    list: &str,
    name: &str,
    problems: &mut Vec<Problem>,
) -> bool {
    if list.len() > EXPLICIT_LIST_LIMIT {
        problems.push(Problem {
            annotation: annotation.to_string(),
            value: format!("{}... ({} bytes)", list.chars().take(64).collect::<String>(), list.len()),
            reason: format!("the list is longer than {EXPLICIT_LIST_LIMIT} bytes"),
        });
        return false;
    }
    for entry in list.split(',').map(str::trim) {
        if patterns.len() >= PATTERN_CACHE_LIMIT && !patterns.contains_key(entry) {
            patterns.clear();
        }
        let compiled = patterns.entry(entry.to_string()).or_insert_with(|| {
            regex::RegexBuilder::new(&format!("^{entry}$"))
                .size_limit(PATTERN_SIZE_LIMIT)
                .build()
                .map_err(|err| err.to_string())
        });
        match compiled {
            Ok(re) if re.is_match(name) => return true,
            Ok(_) => {}
            Err(err) => problems.push(Problem {
                annotation: annotation.to_string(),
                value: entry.to_string(),
                reason: format!("invalid regular expression: {err}"),
            }),
        }
    }
    false
}

/// Go's `strconv.ParseBool`, which Reloader v1 uses for `auto` values. Empty means absent;
/// anything else unparseable is reported and counts as false.
fn parse_bool(annotation: &str, value: &str, problems: &mut Vec<Problem>) -> bool {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
        "" | "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
        other => {
            problems.push(Problem {
                annotation: annotation.to_string(),
                value: other.to_string(),
                reason: "not a boolean (expected true or false)".to_string(),
            });
            false
        }
    }
}

/// The one container that records a reload for the resource, by Reloader v1's rules:
/// the first container mounting the first volume that projects it; else the first container
/// whose env uses it; an init container's use points at `containers[0]`; with no use at all,
/// an explicit reload still takes `containers[0]` and an automatic one takes none.
pub fn target_container(template: &PodTemplate, kind: ResourceKind, name: &str, mode: Mode) -> Option<usize> {
    let first = (!template.containers.is_empty()).then_some(0);
    let uses = |refs: &[(ResourceKind, String)]| refs.iter().any(|(k, n)| *k == kind && n == name);

    if let Some(volume) = template.volumes.iter().find(|v| uses(&v.sources)) {
        let mounts = |c: &crate::watch::Container| c.volume_mounts.contains(&volume.name);
        if let Some(i) = template.containers.iter().position(mounts) {
            return Some(i);
        }
        if template.init_containers.iter().any(mounts) {
            return first;
        }
    }
    if let Some(i) = template.containers.iter().position(|c| uses(&c.env_refs)) {
        return Some(i);
    }
    if template.init_containers.iter().any(|c| uses(&c.env_refs)) {
        return first;
    }
    match mode {
        Mode::Explicit => first,
        Mode::Auto => None,
    }
}

#[cfg(test)]
mod tests;
