//! Annotation lint: the mistakes that make "I changed the ConfigMap and nothing happened", found
//! when an object is stored and reported once as a Warning Event on it, with the fix.
//!
//! Pure checks here; [`run`](task::run) reports them. Findings (bounded, the metric's label):
//! ```text
//!  misspelt-key            a key a few edits from a Reloader key        (any object)
//!  not-a-boolean           auto/search/match/ignore with another value  (any object)
//!  match-on-workload       match on a workload (it belongs on the resource)
//!  ignore-on-workload      ignore on a workload (read only on resources)
//!  search-on-resource      search on a ConfigMap/Secret (it belongs on the workload)
//!  workload-key-on-resource auto, reload lists, excludes... on a ConfigMap/Secret
//!  auto-and-search         both on one workload: search then does nothing
//!  absent-in-list          a .../reload list names a resource the namespace lacks
//!  invalid-pattern         a .../reload list entry that is no regular expression
//!  invalid-duration        a pause period or coalesce window that is no duration, or too long
//!  unknown-value           a rollout or CronJob reload strategy Reloader does not know
//!  empty-pod               auto or search on a declared kind with no container or volume at
//!                          its declared pod place (a wrong path in --custom-kinds-file)
//! ```

use crate::reload::duration::{COALESCE_WINDOW_MAX, PAUSE_PERIOD_MAX, parse_go_duration, shown};
use crate::reload::{
    COALESCE_WINDOW, CRONJOB_RELOAD_STRATEGY, EXPLICIT_LIST_LIMIT, Keys, LAST_RELOADED_FROM, Patterns, RELOADED_HASHES,
    ROLLOUT_STRATEGY, Refused, named_entries, parse_go_bool, refused_too_many,
};
use crate::watch::{Annotations, ResourceKind, Workload, used_keys};

mod task;

pub use task::{Inputs, Metrics, REASON, run};

/// Edits at most between a key and the Reloader key it is taken for.
const MAX_EDITS: usize = 3;

/// One mistake on one object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Finding {
    /// The metric label: one of the words in the module table.
    pub code: &'static str,
    /// The annotation concerned.
    pub annotation: String,
    /// What is wrong and how to fix it, for the Event and the log.
    pub message: String,
}

/// Which of Reloader's keys go where.
struct Known<'a> {
    workload: Vec<&'a str>,
    resource: Vec<&'a str>,
    /// Written by a controller: right anywhere they appear.
    written: Vec<&'a str>,
}

impl<'a> Known<'a> {
    fn new(keys: &'a Keys) -> Self {
        Known {
            workload: vec![
                &keys.auto,
                &keys.configmap_auto,
                &keys.secret_auto,
                &keys.secret_provider_class_auto,
                &keys.configmap_reload,
                &keys.secret_reload,
                &keys.secret_provider_class_reload,
                &keys.configmap_exclude,
                &keys.secret_exclude,
                &keys.secret_provider_class_exclude,
                &keys.search,
                &keys.pause_period,
                ROLLOUT_STRATEGY,
                CRONJOB_RELOAD_STRATEGY,
                COALESCE_WINDOW,
                used_keys::ANNOTATION,
            ],
            resource: vec![&keys.search_match, &keys.ignore],
            written: vec![&keys.paused_at, LAST_RELOADED_FROM, RELOADED_HASHES],
        }
    }

    fn all(&self) -> impl Iterator<Item = &&'a str> {
        self.workload.iter().chain(&self.resource).chain(&self.written)
    }

    fn is_known(&self, key: &str) -> bool {
        self.all().any(|k| *k == key)
    }

    /// The Reloader key `key` is most likely a misspelling of, if any is close.
    fn nearest(&self, key: &str) -> Option<&'a str> {
        self.all()
            .map(|k| (strsim::levenshtein(key, k), *k))
            .filter(|(edits, _)| *edits <= MAX_EDITS)
            .min()
            .map(|(_, k)| k)
    }
}

/// Findings on a workload, from its metadata and pod template annotations. The absent-resource
/// check needs the store and is [`listed_names`]' business.
pub fn workload(keys: &Keys, workload: &Workload, patterns: &mut Patterns) -> Vec<Finding> {
    let known = Known::new(keys);
    let mut out = Vec::new();
    for annotations in [&workload.annotations, &workload.template.annotations] {
        common(keys, &known, annotations, &mut out);
        for key in annotations.keys() {
            if *key == keys.search_match {
                out.push(Finding {
                    code: "match-on-workload",
                    annotation: key.clone(),
                    message: format!(
                        "{key:?} belongs on a ConfigMap or Secret, not on a workload: set {:?}: \"true\" on the workload \
                         and {key:?}: \"true\" on the ConfigMaps and Secrets it should reload for",
                        keys.search
                    ),
                });
            } else if *key == keys.ignore {
                out.push(Finding {
                    code: "ignore-on-workload",
                    annotation: key.clone(),
                    message: format!(
                        "{key:?} is read only on ConfigMaps, Secrets and SecretProviderClasses and does nothing on a \
                         workload: to stop this workload reloading, remove its auto annotation or name the resource \
                         in {:?}",
                        keys.configmap_exclude
                    ),
                });
            }
        }
        reload_lists(keys, annotations, patterns, &mut out);
        let on = |key: &str| annotations.get(key).is_some_and(|v| parse_go_bool(v) == Some(true));
        if on(&keys.auto) && annotations.get(&keys.search).is_some_and(|v| v == "true") {
            out.push(Finding {
                code: "auto-and-search",
                annotation: keys.search.clone(),
                message: format!(
                    "both {:?} and {:?} are set: auto already reloads for every ConfigMap and Secret the workload \
                     uses, so search does nothing; remove one",
                    keys.auto, keys.search
                ),
            });
        }
    }
    for (key, known) in [(ROLLOUT_STRATEGY, ["rollout", "restart"]), (CRONJOB_RELOAD_STRATEGY, ["create", "patch"])] {
        let Some(value) = workload.annotations.get(key) else { continue };
        if !known.contains(&value.as_str()) {
            out.push(Finding {
                code: "unknown-value",
                annotation: key.to_string(),
                message: format!(
                    "{key:?} is {:?}, which is not {:?} or {:?}: it does what it does without the annotation",
                    shown(value),
                    known[0],
                    known[1]
                ),
            });
        }
    }
    for (key, max) in [(keys.pause_period.as_str(), PAUSE_PERIOD_MAX), (COALESCE_WINDOW, COALESCE_WINDOW_MAX)] {
        let Some(value) = workload.annotations.get(key) else { continue };
        if let Err(err) = parse_go_duration(value, max) {
            out.push(Finding {
                code: "invalid-duration",
                annotation: key.to_string(),
                message: format!(
                    "{key:?} is {:?}, which is {err}, and is ignored: use a Go duration such as \"5m\"",
                    shown(value)
                ),
            });
        }
    }
    out.extend(empty_declared_pod(keys, workload));
    out.sort();
    out.dedup();
    out
}

/// Findings on the reload lists of one set of annotations, read under the engine's own limits:
/// a list too long to read, entries that are no regular expression, more patterns than a list
/// may hold.
fn reload_lists(keys: &Keys, annotations: &Annotations, patterns: &mut Patterns, out: &mut Vec<Finding>) {
    for list_key in [&keys.configmap_reload, &keys.secret_reload, &keys.secret_provider_class_reload] {
        let Some(list) = annotations.get(list_key) else { continue };
        // Read under the engine's own limits: the lint never holds or compiles more.
        if list.len() > EXPLICIT_LIST_LIMIT {
            out.push(Finding {
                code: "list-too-long",
                annotation: list_key.clone(),
                message: format!(
                    "{list_key:?} is {} bytes, longer than the {EXPLICIT_LIST_LIMIT} read: the list is ignored",
                    list.len()
                ),
            });
            continue;
        }
        for (entry, why) in patterns.refused(list) {
            let message = match why {
                Refused::Invalid(err) => {
                    let why = err.lines().last().unwrap_or_default().trim().to_string();
                    format!(
                        "{list_key:?} entry {entry:?} is not a valid regular expression ({why}) and never \
                         matches: fix or remove it"
                    )
                }
                Refused::TooMany => {
                    out.push(Finding {
                        code: "too-many-patterns",
                        annotation: list_key.clone(),
                        message: format!("{list_key:?} entry {entry:?}: {}", refused_too_many()),
                    });
                    break;
                }
            };
            out.push(Finding { code: "invalid-pattern", annotation: list_key.clone(), message });
        }
    }
}

/// Auto or search on a kind of `--custom-kinds-file` that finds no container or volume where the
/// file says its pod is: they can find nothing to reload for (a wrong path, or an operator that
/// makes the containers itself, where only named resources work).
fn empty_declared_pod(keys: &Keys, workload: &Workload) -> Option<Finding> {
    let template = &workload.template;
    let empty = template.containers.is_empty() && template.init_containers.is_empty() && template.volumes.is_empty();
    if !(workload.key.kind.is_declared() && empty) {
        return None;
    }
    let on = |key: &String| workload.annotations.get(key).is_some_and(|v| parse_go_bool(v) == Some(true));
    let key = [&keys.auto, &keys.configmap_auto, &keys.secret_auto, &keys.search].into_iter().find(|k| on(k))?;
    let kind = workload.key.kind.spec();
    Some(Finding {
        code: "empty-pod",
        annotation: key.clone(),
        message: format!(
            "{key:?} finds nothing to reload for: this {} has no container or volume at {}, where --custom-kinds-file \
             says its pod is; check that path, or name the resources in {:?} / {:?}",
            kind.kind,
            kind.pod.describe(),
            keys.configmap_reload,
            keys.secret_reload
        ),
    })
}

/// Findings on a ConfigMap, Secret or SecretProviderClass from its annotations.
pub fn resource(keys: &Keys, kind: ResourceKind, annotations: &Annotations) -> Vec<Finding> {
    let known = Known::new(keys);
    let mut out = Vec::new();
    common(keys, &known, annotations, &mut out);
    for key in annotations.keys().filter(|k| known.workload.contains(&k.as_str())) {
        let (code, message) = if *key == keys.search {
            (
                "search-on-resource",
                format!(
                    "{key:?} belongs on the workload: set {:?}: \"true\" on this {} and {key:?}: \"true\" on the \
                     workloads that use it",
                    keys.search_match,
                    kind.kind()
                ),
            )
        } else {
            (
                "workload-key-on-resource",
                format!(
                    "{key:?} is read on workloads (Deployments, StatefulSets, ...), not on a {}: move it to the \
                     workloads that use this {}",
                    kind.kind(),
                    kind.kind()
                ),
            )
        };
        out.push(Finding { code, annotation: key.clone(), message });
    }
    out.sort();
    out
}

/// Checks that apply wherever the annotation is: misspelt keys and values that are no boolean.
fn common(keys: &Keys, known: &Known<'_>, annotations: &Annotations, out: &mut Vec<Finding>) {
    for (key, value) in annotations {
        if !known.is_known(key) {
            if let Some(meant) = known.nearest(key) {
                out.push(Finding {
                    code: "misspelt-key",
                    annotation: key.clone(),
                    message: format!("{key:?} is not a Reloader annotation and is ignored: did you mean {meant:?}?"),
                });
            }
            continue;
        }
        let autos = [&keys.auto, &keys.configmap_auto, &keys.secret_auto, &keys.secret_provider_class_auto];
        let exact = [&keys.search, &keys.search_match, &keys.ignore];
        if autos.contains(&key) && parse_go_bool(value).is_none() {
            out.push(Finding {
                code: "not-a-boolean",
                annotation: key.clone(),
                message: format!(
                    "{key:?} is {value:?}, which is not a boolean and counts as false: use \"true\" or \"false\""
                ),
            });
        } else if key == used_keys::ANNOTATION && !matches!(value.trim(), "true" | "false") {
            out.push(Finding {
                code: "not-a-boolean",
                annotation: key.clone(),
                message: format!(
                    "{key:?} is {value:?}, which is neither \"true\" nor \"false\": --reload-on-used-keys decides for \
                     this workload"
                ),
            });
        } else if exact.contains(&key) && value != "true" && value != "false" {
            out.push(Finding {
                code: "not-a-boolean",
                annotation: key.clone(),
                message: format!("{key:?} is {value:?}, but only exactly \"true\" counts: use \"true\" or \"false\""),
            });
        }
    }
}

/// The resources a workload's `.../reload` lists spell out by name (entries that are no
/// pattern), per kind, with the list's key: what must exist in its namespace.
pub fn listed_names(keys: &Keys, workload: &Workload) -> Vec<(ResourceKind, String, String)> {
    let mut out = Vec::new();
    for kind in [ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass] {
        let key = keys.for_kind(kind).explicit;
        let list = workload.annotations.get(key).or_else(|| workload.template.annotations.get(key));
        for entry in list.into_iter().flat_map(|l| named_entries(l)) {
            out.push((kind, entry.to_string(), key.to_string()));
        }
    }
    out
}

/// The finding for a listed resource the namespace lacks.
pub fn absent(annotation: &str, kind: ResourceKind, name: &str, namespace: &str) -> Finding {
    Finding {
        code: "absent-in-list",
        annotation: annotation.to_string(),
        message: format!(
            "{annotation:?} names {} {name:?}, which does not exist in namespace {namespace}: create it or fix the name",
            kind.kind()
        ),
    }
}

#[cfg(test)]
mod tests;
