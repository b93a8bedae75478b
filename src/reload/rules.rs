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

use crate::reload::Keys;
use crate::watch::{Annotations, PodTemplate, Reference, ResourceKind, ResourceState};

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

/// The rule that decided a verdict, in Reloader's order of precedence. `explain` shows it;
/// the engine only needs the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The resource carries the `ignore` annotation (exactly `true`).
    ResourceIgnored,
    /// The workload's exclude annotation names the resource.
    Excluded,
    /// An entry of the workload's `.../reload` list matches the resource's name.
    ExplicitList,
    /// The workload has `search: "true"` and the resource `match: "true"`.
    SearchMatch,
    /// `reloader.stakater.com/auto` is true.
    Auto,
    /// The typed auto key (`configmap.`/`secret.`/`secretproviderclass.reloader.stakater.com/auto`) is true.
    TypedAuto,
    /// `--auto-reload-all`, with neither auto key set.
    AutoReloadAll,
    /// The workload has `search` but the resource lacks `match: "true"`.
    SearchWithoutMatch,
    /// The workload has a `.../reload` list for this kind and no entry matches the name.
    NotInExplicitList,
    /// An auto key is set, but not to true.
    AutoOff,
    /// None of Reloader's annotations for this kind is on the workload.
    NoAnnotation,
}

impl Rule {
    /// A sentence for people: what decided, naming the annotation.
    pub fn describe(self, keys: &Keys, kind: ResourceKind) -> String {
        let typed = keys.for_kind(kind);
        match self {
            Rule::ResourceIgnored => format!("the {} has {}: \"true\"", kind.kind(), keys.ignore),
            Rule::Excluded => format!("the workload's {} names it", typed.exclude),
            Rule::ExplicitList => format!("an entry of the workload's {} matches its name", typed.explicit),
            Rule::SearchMatch => {
                format!(
                    "the workload has {}: \"true\" and the {} {}: \"true\"",
                    keys.search,
                    kind.kind(),
                    keys.search_match
                )
            }
            Rule::Auto => format!("the workload has {}: \"true\"", keys.auto),
            Rule::TypedAuto => format!("the workload has {}: \"true\"", typed.auto),
            Rule::AutoReloadAll => "--auto-reload-all is set and the workload has no auto annotation".to_string(),
            Rule::SearchWithoutMatch => format!(
                "the workload has {} but the {} lacks {}: \"true\"",
                keys.search,
                kind.kind(),
                keys.search_match
            ),
            Rule::NotInExplicitList => format!("no entry of the workload's {} matches its name", typed.explicit),
            Rule::AutoOff => format!("{} / {} is set, but not to true", keys.auto, typed.auto),
            Rule::NoAnnotation => {
                format!("the workload has none of {}, {}, {} or {}", keys.auto, typed.auto, typed.explicit, keys.search)
            }
        }
    }
}

/// The verdict for one (resource, workload) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub mode: Option<Mode>,
    /// What decided.
    pub rule: Rule,
    /// Annotation values on the workload that could not be understood. Each one is reported as
    /// a Warning Event on the workload; the decision goes on without the bad value.
    pub problems: Vec<Problem>,
}

/// An annotation value that Reloader's rules cannot use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Problem {
    pub annotation: String,
    /// The value as users see it in the Event and the log: at most 64 characters and its size.
    pub value: String,
    pub reason: String,
}

impl Problem {
    /// A problem with `value` of `annotation`, the value shortened for people.
    pub fn new(annotation: &str, value: &str, reason: String) -> Problem {
        Problem { annotation: annotation.to_string(), value: crate::reload::duration::shown(value), reason }
    }
}

/// The engine's decision for one (resource, workload) pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The container that records the reload; `None`: no reload.
    pub container: Option<usize>,
}

impl Decision {
    pub fn reloads(&self) -> bool {
        self.container.is_some()
    }
}

/// Longest `.../reload` list read. Kubernetes allows 256 KiB of annotations per object; a
/// list this long is a mistake, and reading it entry by entry on every change would stall
/// the engine for everyone.
pub const EXPLICIT_LIST_LIMIT: usize = 16 * 1024;

/// The rules with their settings, plus the compiled explicit-list patterns (a list is
/// otherwise compiled again for every change of its namespace), kept within a budget.
#[derive(Debug)]
pub struct Rules {
    keys: Keys,
    options: Options,
    patterns: Patterns,
}

impl Rules {
    pub fn new(keys: Keys, options: Options) -> Self {
        Rules { keys, options, patterns: Patterns::default() }
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
        metadata: &Annotations,
        template: &PodTemplate,
    ) -> Verdict {
        let mut problems = Vec::new();
        let (mode, rule) = self.mode(kind, resource_name, state, metadata, template, &mut problems);
        Verdict { mode, rule, problems }
    }

    /// The whole decision for one (resource, workload) pair, as the engine acts on it: the
    /// verdict, and the container that records the reload. An automatic verdict without a
    /// container that uses the resource reloads nothing.
    pub fn evaluate(
        &mut self,
        kind: ResourceKind,
        resource_name: &str,
        state: &ResourceState,
        workload: &crate::watch::Workload,
    ) -> Decision {
        let verdict = self.decide(kind, resource_name, state, &workload.annotations, &workload.template);
        let container = verdict.mode.and_then(|mode| target_container(&workload.template, kind, resource_name, mode));
        Decision { verdict, container }
    }

    /// The rules in Reloader's order; the first that applies decides.
    fn mode(
        &mut self,
        kind: ResourceKind,
        resource_name: &str,
        state: &ResourceState,
        metadata: &Annotations,
        template: &PodTemplate,
        problems: &mut Vec<Problem>,
    ) -> (Option<Mode>, Rule) {
        if state.ignored {
            return (None, Rule::ResourceIgnored);
        }
        let keys = &self.keys;
        let typed = keys.for_kind(kind);

        // Exclude lists are read from workload metadata only, as in Reloader v1.
        if let Some(excluded) = metadata.get(typed.exclude)
            && excluded.split(',').any(|n| n.trim() == resource_name)
        {
            return (None, Rule::Excluded);
        }

        // Presence, not value, of any of these keys on metadata decides where they are read from.
        let selection = [typed.explicit, keys.auto.as_str(), typed.auto, keys.search.as_str()];
        let source = if selection.iter().any(|k| metadata.contains_key(k)) { metadata } else { &template.annotations };
        let read = |key: &str| source.get(key).map(String::as_str).unwrap_or("");

        let list = source.get(typed.explicit);
        if let Some(list) = list
            && explicit_list_matches(&mut self.patterns, typed.explicit, list, resource_name, problems)
        {
            return (Some(Mode::Explicit), Rule::ExplicitList);
        }

        let search = read(&keys.search) == "true";
        if search && state.search_match {
            return (Some(Mode::Auto), Rule::SearchMatch);
        }

        let auto = read(&keys.auto);
        let typed_auto = read(typed.auto);
        if parse_bool(&keys.auto, auto, problems) {
            return (Some(Mode::Auto), Rule::Auto);
        }
        if parse_bool(typed.auto, typed_auto, problems) {
            return (Some(Mode::Auto), Rule::TypedAuto);
        }
        if auto.is_empty() && typed_auto.is_empty() && self.options.auto_reload_all {
            return (Some(Mode::Auto), Rule::AutoReloadAll);
        }
        let rule = if search {
            Rule::SearchWithoutMatch
        } else if list.is_some() {
            Rule::NotInExplicitList
        } else if !auto.is_empty() || !typed_auto.is_empty() {
            Rule::AutoOff
        } else {
            Rule::NoAnnotation
        };
        (None, rule)
    }
}

/// One entry per comma, each trimmed and anchored as `^entry$` (not grouped: `a|b` means
/// "starts with a or ends with b", exactly as Reloader builds it). A bad entry is reported and
/// skipped; the others still count. Past [`patterns::PER_LIST`] regular expressions the
/// rest are reported once and not read.
fn explicit_list_matches(
    patterns: &mut Patterns,
    annotation: &str,
    list: &str,
    name: &str,
    problems: &mut Vec<Problem>,
) -> bool {
    if list.len() > EXPLICIT_LIST_LIMIT {
        problems.push(Problem::new(annotation, list, format!("the list is longer than {EXPLICIT_LIST_LIMIT} bytes")));
        return false;
    }
    let mut too_many = false;
    patterns.any_matches(list, name, |entry, why| match why {
        Refused::Invalid(err) => {
            problems.push(Problem::new(annotation, entry, format!("invalid regular expression: {err}")));
        }
        Refused::TooMany if !too_many => {
            too_many = true;
            problems.push(Problem::new(annotation, entry, refused_too_many()));
        }
        Refused::TooMany => {}
    })
}

/// The reason given for the entries past [`patterns::PER_LIST`] regular expressions.
pub fn refused_too_many() -> String {
    format!(
        "more than {} regular expressions in one list: this entry and the later regular expressions are not read \
         (names are not counted)",
        patterns::PER_LIST
    )
}

/// Go's `strconv.ParseBool`, which Reloader v1 uses for `auto` values. Empty means absent;
/// anything else unparseable is reported and counts as false.
fn parse_bool(annotation: &str, value: &str, problems: &mut Vec<Problem>) -> bool {
    match parse_go_bool(value) {
        Some(b) => b,
        None if value.is_empty() => false,
        None => {
            problems.push(Problem::new(annotation, value, "not a boolean (expected true or false)".to_string()));
            false
        }
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The entries of a `.../reload` list that name one resource rather than a pattern: what must
/// exist for the list to mean anything. A dot is a regex wildcard, but in an entry it is
/// nearly always meant as the dot of a name.
pub fn named_entries(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|entry| {
        !entry.is_empty() && entry.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    })
}

/// The one container that records a reload for the resource, by Reloader v1's rules:
/// the first container mounting the first volume that projects it; else the first container
/// whose env uses it; an init container's use points at `containers[0]`; with no use at all,
/// an explicit reload still takes `containers[0]` and an automatic one takes none.
pub fn target_container(template: &PodTemplate, kind: ResourceKind, name: &str, mode: Mode) -> Option<usize> {
    let first = (!template.containers.is_empty()).then_some(0);
    let uses = |refs: &[Reference]| refs.iter().any(|(k, n)| *k == kind && **n == *name);

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

mod patterns;

pub use patterns::{Patterns, Refused, compile_entry};

#[cfg(test)]
mod tests;
