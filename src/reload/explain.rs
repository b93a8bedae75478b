//! "Why didn't it reload?": for a workload, every resource it uses or names and whether a change
//! of it would reload the workload; for a resource, every workload a change of it concerns.
//!
//! The answer comes from the engine's own decision ([`Rules::evaluate`]) over a [`Store`], so
//! it cannot disagree with what the engine does: the admin endpoint asks the live store, the
//! `explain` command a store it fills from the API with the user's kubeconfig.
//!
//! ```text
//!  namespace not selected -> kind not rolled -> resource kind not watched -> resource absent
//!    -> the annotation rules (Rule) -> a container that records it -> reloads
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::reload::lint::{self, Finding};
use crate::reload::strategy::{self, OrphanedEnvVars, Strategy};
use crate::reload::{Damped, FlapDamping, Keys, Mode, Problem, Rule, Rules};
use crate::watch::{Reference, ResourceKey, ResourceKind, ResourceState, Store, Workload, WorkloadKey, WorkloadKind};

/// The settings that decide outside a workload's annotations.
#[derive(Clone, Debug)]
pub struct Scope {
    pub strategy: Strategy,
    /// Workload kinds this controller rolls (after `--ignored-workload-types`, the Argo and
    /// OpenShift flags and discovery).
    pub kinds: Vec<WorkloadKind>,
    /// Resource kinds it watches (after `--resources-to-ignore` and the CSI flag).
    pub resources: Vec<ResourceKind>,
    /// `--flap-damping-changes` and `--flap-damping-window`, when on.
    pub damping: Option<FlapDamping>,
    /// `--remove-orphaned-env-vars` and `--remove-orphaned-env-vars-at-once`.
    pub orphaned_env_vars: OrphanedEnvVars,
}

/// Where the namespace stands: selected or not, and in a fleet who serves it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Serving {
    /// `None`: selected; else why not (the namespace filter's reason).
    pub not_selected: Option<String>,
    pub shard: Option<u32>,
    /// The replica holding that shard's Lease, if known.
    pub replica: Option<String>,
    /// Seconds since that shard's checkpoint was saved, if known (`reloader explain` reads it):
    /// an age that keeps growing means a change made while no replica runs may be missed.
    pub checkpoint_saved_seconds_ago: Option<u64>,
}

/// What is asked about: `deployment/web`, `deploy/web`, `cm/app-config`, `secret/db`...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    Workload(WorkloadKind),
    Resource(ResourceKind),
}

impl Subject {
    /// A kind as kubectl users type it: the kind, its plural or its short name, any case.
    pub fn parse(kind: &str) -> Result<Subject, String> {
        let lower = kind.trim().to_ascii_lowercase();
        let short = match lower.as_str() {
            "deploy" => Some(Subject::Workload(WorkloadKind::Deployment)),
            "ds" => Some(Subject::Workload(WorkloadKind::DaemonSet)),
            "sts" => Some(Subject::Workload(WorkloadKind::StatefulSet)),
            "cj" => Some(Subject::Workload(WorkloadKind::CronJob)),
            "ro" => Some(Subject::Workload(WorkloadKind::Rollout)),
            "dc" => Some(Subject::Workload(WorkloadKind::DeploymentConfig)),
            "cm" | "configmap" | "configmaps" => Some(Subject::Resource(ResourceKind::ConfigMap)),
            "secret" | "secrets" => Some(Subject::Resource(ResourceKind::Secret)),
            "spc" | "secretproviderclass" | "secretproviderclasses" => {
                Some(Subject::Resource(ResourceKind::SecretProviderClass))
            }
            _ => None,
        };
        short.or_else(|| WorkloadKind::from_type_name(&lower).map(Subject::Workload)).ok_or_else(|| {
            format!(
                "unknown kind {kind:?}: expected a workload (deployment, daemonset, statefulset, cronjob, job, rollout, \
                 deploymentconfig, a kind of --custom-kinds-file) or a resource (configmap, secret, secretproviderclass)"
            )
        })
    }
}

/// The answer for one workload or one resource.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Whether the object was found (in the store, or in the cluster for the command).
    pub found: bool,
    /// Why nothing was found or nothing can reload, when the answer is that short.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub serving: Serving,
    pub strategy: String,
    /// One per (resource, workload) pair.
    pub pairs: Vec<Pair>,
    /// Annotation values the rules could not use.
    pub problems: Vec<Problem>,
    /// The annotation lint's findings on the workload (misspelt keys, `match` on a workload...).
    pub findings: Vec<Finding>,
    /// The `STAKATER_*` variables the workload records for resources it no longer references,
    /// and what becomes of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orphaned: Option<String>,
}

impl Report {
    /// The report with every hash cut to its first `digits` hex digits (what the admin
    /// endpoint shows: enough to compare, not the whole hash of a Secret's data).
    #[must_use]
    pub fn with_short_hashes(mut self, digits: usize) -> Report {
        // By characters: a recorded hash is read from the workload and may be any text.
        let cut = |hash: &mut Option<String>| {
            if let Some(h) = hash {
                *h = h.chars().take(digits).collect();
            }
        };
        for pair in &mut self.pairs {
            cut(&mut pair.recorded_hash);
            cut(&mut pair.current_hash);
        }
        self
    }

    fn new(kind: &str, namespace: &str, name: &str, serving: Serving, scope: &Scope) -> Report {
        Report {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            found: false,
            note: None,
            serving,
            strategy: scope.strategy.to_string(),
            pairs: Vec::new(),
            problems: Vec::new(),
            findings: Vec::new(),
            orphaned: None,
        }
    }
}

/// Would a change of `resource` reload `workload`, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pair {
    pub resource_kind: &'static str,
    pub resource: String,
    pub workload_kind: &'static str,
    pub workload: String,
    pub reloads: bool,
    /// What decided, as a stable word for scripts (`typed-auto`, `excluded`, `not-referenced`...).
    pub rule: String,
    /// The same for people, naming the annotation or the flag.
    pub reason: String,
    /// How the workload uses the resource (`volume config of container app`, `env of app`);
    /// empty when it only names it in a `.../reload` list.
    pub uses: Vec<String>,
    /// Where a reload is written (env var or annotation), when it reloads.
    pub writes: Option<String>,
    /// The hash the workload records for the resource now.
    pub recorded_hash: Option<String>,
    /// The keys of the resource the workload reads, when it reloads only for those
    /// (`--reload-on-used-keys`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<String>,
    /// When the resource changes too often and its reloads are damped: since when, and how.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damped: Option<String>,
    /// The resource's hash now.
    pub current_hash: Option<String>,
}

/// What an explanation reads: the rules, the store and what this controller serves.
pub struct Explainer<'a> {
    pub rules: Rules,
    pub store: &'a Store,
    pub scope: &'a Scope,
    /// Why a resource is missing from the store (the command knows whether the label selector
    /// left it out; the live store does not).
    pub absent_reason: &'a dyn Fn(&ResourceKey) -> String,
    /// The resources flap damping holds now (the running engine's; none for the command).
    pub damped: Option<&'a Damped>,
}

impl Explainer<'_> {
    /// Explain the workload or resource `subject` names.
    pub fn explain(&mut self, subject: Subject, namespace: &str, name: &str, serving: Serving) -> Report {
        let (namespace, name) = (namespace.into(), name.into());
        match subject {
            Subject::Workload(kind) => self.workload(serving, &WorkloadKey { kind, namespace, name }),
            Subject::Resource(kind) => self.resource(serving, &ResourceKey { kind, namespace, name }),
        }
    }

    /// Explain a workload: every resource it uses or names.
    pub fn workload(&mut self, serving: Serving, key: &WorkloadKey) -> Report {
        let (store, scope) = (self.store, self.scope);
        let mut report = Report::new(key.kind.kind(), &key.namespace, &key.name, serving, scope);
        if !scope.kinds.contains(&key.kind) {
            report.note =
                Some(format!("{} is not rolled by this controller ({})", key.kind.kind(), kind_off(key.kind)));
            return report;
        }
        let Some(workload) = store.workload(key) else {
            report.note = Some(match &report.serving.not_selected {
                Some(why) => format!("namespace {} is not served: {why}", key.namespace),
                None => format!("no {} {} in namespace {}", key.kind.kind(), key.name, key.namespace),
            });
            return report;
        };
        report.found = true;
        report.findings = lint::workload(self.rules.keys(), &workload, &mut crate::reload::Patterns::default());
        let mut resources: BTreeSet<(ResourceKind, String)> =
            workload.template.references().map(|(k, n)| (*k, n.to_string())).collect();
        // Resources a `.../reload` list may name: every stored one of that kind in the namespace,
        // and each plain name the list spells out (so a missing one shows up as absent).
        for kind in [ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass] {
            let Some(list) = explicit_list(self.rules.keys(), &workload, kind) else { continue };
            for stored in store.resource_keys(kind, Some(&key.namespace)) {
                resources.insert((kind, stored.name.to_string()));
            }
            for entry in crate::reload::named_entries(list) {
                resources.insert((kind, entry.to_string()));
            }
        }
        let mut problems = BTreeSet::new();
        for (kind, name) in resources {
            let resource = ResourceKey { kind, namespace: key.namespace.clone(), name: name.as_str().into() };
            let pair = self.pair(&report.serving, &resource, &workload, &mut problems);
            if concerns(self.rules.keys(), &workload, kind, &pair) {
                report.pairs.push(pair);
            }
        }
        report.problems = problems.into_iter().collect();
        if let Some(orphans) = strategy::orphaned_env_vars(&workload, self.rules.keys()) {
            let fate = scope.orphaned_env_vars.fate();
            report.orphaned = Some(format!("{} of resources it no longer uses: {fate}", orphans.names.join(", ")));
        }
        report
    }

    /// Explain a resource: every workload a change of it concerns.
    pub fn resource(&mut self, serving: Serving, key: &ResourceKey) -> Report {
        let mut report = Report::new(key.kind.kind(), &key.namespace, &key.name, serving, self.scope);
        report.found = self.store.resource(key).is_some();
        if !report.found {
            report.note = Some((self.absent_reason)(key));
        }
        let mut problems = BTreeSet::new();
        for workload in self.store.candidates(key) {
            let pair = self.pair(&report.serving, key, &workload, &mut problems);
            if concerns(self.rules.keys(), &workload, key.kind, &pair) {
                report.pairs.push(pair);
            }
        }
        report.problems = problems.into_iter().collect();
        report
    }

    /// What a change of `resource` does to `workload`, and why.
    fn pair(
        &mut self,
        serving: &Serving,
        resource: &ResourceKey,
        workload: &Workload,
        problems: &mut BTreeSet<Problem>,
    ) -> Pair {
        let (rules, store, scope, absent_reason) = (&mut self.rules, self.store, self.scope, self.absent_reason);
        let state = store.resource(resource);
        let mut pair = Pair {
            resource_kind: resource.kind.kind(),
            resource: resource.name.to_string(),
            workload_kind: workload.key.kind.kind(),
            workload: workload.key.name.to_string(),
            reloads: false,
            rule: String::new(),
            reason: String::new(),
            uses: uses(workload, resource.kind, &resource.name),
            writes: None,
            recorded_hash: None,
            current_hash: state.as_ref().map(|s| s.hashes().written()),
            keys: None,
            damped: None,
        };
        let outer = if let Some(why) = &serving.not_selected {
            Some(("namespace-not-selected", format!("namespace {} is not served: {why}", resource.namespace)))
        } else if !scope.kinds.contains(&workload.key.kind) {
            Some((
                "ignored-workload-type",
                format!("{} is not rolled ({})", workload.key.kind.kind(), kind_off(workload.key.kind)),
            ))
        } else if !scope.resources.contains(&resource.kind) {
            Some((
                "ignored-resource-type",
                format!("{}s are not watched ({})", resource.kind.kind(), resource_off(resource.kind)),
            ))
        } else {
            None
        };
        let state: ResourceState = match (outer, state) {
            (None, Some(state)) => state,
            (outer, _) => {
                let (rule, reason) = outer.unwrap_or_else(|| ("resource-absent", absent_reason(resource)));
                pair.rule = rule.to_string();
                pair.reason = reason;
                return pair;
            }
        };
        let decision = rules.evaluate(resource.kind, &resource.name, &state, workload);
        problems.extend(decision.verdict.problems.iter().cloned());
        let keys = rules.keys();
        (pair.rule, pair.reason) = match (decision.verdict.mode, decision.container) {
            (Some(Mode::Auto), None) => (
                "not-referenced".to_string(),
                format!(
                    "{}, but no container uses the {} (automatic reloads need a volume, env or envFrom reference)",
                    decision.verdict.rule.describe(keys, resource.kind),
                    resource.kind.kind()
                ),
            ),
            (Some(Mode::Explicit), None) => {
                ("no-containers".to_string(), "the pod template has no containers".to_string())
            }
            (_, _) => (rule_word(decision.verdict.rule), decision.verdict.rule.describe(keys, resource.kind)),
        };
        if let Some(container) = decision.container {
            pair.reloads = true;
            pair.writes =
                Some(strategy::record_place(scope.strategy, workload, resource.kind, &resource.name, container));
            pair.recorded_hash = strategy::recorded(scope.strategy, workload, resource.kind, &resource.name, container);
            pair.damped = damping_note(scope, self.damped, resource);
            pair.keys = used_keys_note(rules.keys(), workload, resource);
        }
        pair
    }
}

/// Which keys of `resource` the workload reloads for, when it reads only some of them.
fn used_keys_note(keys: &Keys, workload: &Workload, resource: &ResourceKey) -> Option<String> {
    let used = workload.template.key_uses.as_deref()?.keys(resource.kind, &resource.name)?;
    let listed = used.to_string();
    Some(if keys.names_resources(resource.kind, workload) {
        format!("reads keys {listed}, but names resources by annotation: every change of the data counts")
    } else {
        format!("only keys {listed} (--reload-on-used-keys): a change of other keys rolls nothing")
    })
}

/// Whether a pair is worth showing: the workload uses the resource, its `.../reload` list
/// matches it, or the list spells out its name (then a miss is what the user asks about).
/// Every other resource of a namespace is a candidate only because the list exists.
fn concerns(keys: &Keys, workload: &Workload, kind: ResourceKind, pair: &Pair) -> bool {
    let named = explicit_list(keys, workload, kind).is_some_and(|l| l.split(',').any(|e| e.trim() == pair.resource));
    !pair.uses.is_empty() || pair.rule == "explicit-list" || named
}

/// The rule as one stable word (its serde name).
fn rule_word(rule: Rule) -> String {
    serde_json::to_value(rule).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The `.../reload` list for `kind`, read where the rules read it.
fn explicit_list<'a>(keys: &Keys, workload: &'a Workload, kind: ResourceKind) -> Option<&'a str> {
    let explicit = keys.for_kind(kind).explicit;
    workload.annotations.get(explicit).or_else(|| workload.template.annotations.get(explicit)).map(String::as_str)
}

/// How the workload uses the resource, for people.
fn uses(workload: &Workload, kind: ResourceKind, name: &str) -> Vec<String> {
    let is = |(k, n): &Reference| *k == kind && **n == *name;
    let template = &workload.template;
    let mut out = Vec::new();
    for volume in template.volumes.iter().filter(|v| v.sources.iter().any(is)) {
        let mounted: Vec<&str> = template
            .containers
            .iter()
            .chain(&template.init_containers)
            .filter(|c| c.volume_mounts.contains(&volume.name))
            .map(|c| c.name.as_str())
            .collect();
        out.push(if mounted.is_empty() {
            format!("volume {} (mounted by no container)", volume.name)
        } else {
            format!("volume {} mounted by {}", volume.name, mounted.join(", "))
        });
    }
    for container in template.containers.iter().filter(|c| c.env_refs.iter().any(is)) {
        out.push(format!("env of {}", container.name));
    }
    for container in template.init_containers.iter().filter(|c| c.env_refs.iter().any(is)) {
        out.push(format!("env of init container {}", container.name));
    }
    out
}

fn kind_off(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Rollout => {
            "needs --is-Argo-Rollouts=true and the argoproj.io Rollout API, or --ignored-workload-types lists it"
        }
        WorkloadKind::DeploymentConfig => {
            "needs --is-openshift and the apps.openshift.io API, or --ignored-workload-types lists it"
        }
        WorkloadKind::Custom(_) => {
            "the API server does not serve it or this service account may not watch it, or --ignored-workload-types \
             lists it"
        }
        _ => "--ignored-workload-types lists it",
    }
}

fn resource_off(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::SecretProviderClass => "needs --enable-csi-integration and the secrets-store.csi.x-k8s.io API",
        _ => "--resources-to-ignore lists them",
    }
}

/// Why and since when a resource's reloads are damped, if they are.
fn damping_note(scope: &Scope, damped: Option<&Damped>, resource: &ResourceKey) -> Option<String> {
    let config = scope.damping?;
    let since = damped?.get(resource)?;
    let at = jiff::Timestamp::try_from(since.since).map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string());
    Some(format!(
        "damped since {} ({} changes within {:?}, more than --flap-damping-changes={}): rolled at most once per {:?}, \
         with the latest data",
        at.unwrap_or_else(|_| "now".to_string()),
        since.changes,
        config.window,
        config.changes,
        config.window
    ))
}

/// The report as text for people.
pub fn text(report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{} {}/{}", report.kind, report.namespace, report.name);
    let serving = &report.serving;
    match &serving.not_selected {
        Some(why) => {
            let _ = writeln!(out, "  namespace: not served ({why})");
        }
        None => {
            let _ = writeln!(out, "  namespace: selected");
        }
    }
    if let Some(shard) = serving.shard {
        let _ = writeln!(
            out,
            "  shard: {shard}, served by {}",
            serving.replica.as_deref().unwrap_or("no replica (no Lease holder)")
        );
    }
    if let Some(age) = serving.checkpoint_saved_seconds_ago {
        let _ = writeln!(out, "  checkpoint: saved {age}s ago");
    }
    if let Some(note) = &report.note {
        let _ = writeln!(out, "  {note}");
    }
    if report.found && report.pairs.is_empty() {
        let _ = writeln!(out, "  nothing to reload: no ConfigMap, Secret or SecretProviderClass is used or named");
    }
    let by_resource = report.kind == "ConfigMap" || report.kind == "Secret" || report.kind == "SecretProviderClass";
    let mut groups: BTreeMap<bool, Vec<&Pair>> = BTreeMap::new();
    for pair in &report.pairs {
        groups.entry(!pair.reloads).or_default().push(pair);
    }
    for (not, pairs) in groups {
        let _ = writeln!(out, "  {}:", if not { "would NOT reload" } else { "would reload" });
        for pair in pairs {
            let other = if by_resource {
                format!("{} {}", pair.workload_kind, pair.workload)
            } else {
                format!("{} {}", pair.resource_kind, pair.resource)
            };
            let _ = writeln!(out, "    {other}  [{}] {}", pair.rule, pair.reason);
            if !pair.uses.is_empty() {
                let _ = writeln!(out, "      uses: {}", pair.uses.join("; "));
            }
            if let Some(writes) = &pair.writes {
                let recorded = pair.recorded_hash.as_deref().unwrap_or("nothing yet");
                let now = pair.current_hash.as_deref().unwrap_or("-");
                let _ = writeln!(out, "      writes {writes}; records {recorded}; current hash {now}");
            }
            if let Some(keys) = &pair.keys {
                let _ = writeln!(out, "      {keys}");
            }
            if let Some(damped) = &pair.damped {
                let _ = writeln!(out, "      {damped}");
            }
        }
    }
    if let Some(orphaned) = &report.orphaned {
        let _ = writeln!(out, "  orphaned env vars: {orphaned}");
    }
    for problem in &report.problems {
        let _ = writeln!(out, "  unusable annotation {}={:?}: {}", problem.annotation, problem.value, problem.reason);
    }
    for finding in &report.findings {
        let _ = writeln!(out, "  annotation mistake [{}]: {}", finding.code, finding.message);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Container, DataHash, PodTemplate, Volume};

    fn scope() -> Scope {
        Scope {
            strategy: Strategy::EnvVars,
            kinds: vec![WorkloadKind::Deployment],
            resources: vec![ResourceKind::ConfigMap, ResourceKind::Secret],
            damping: None,
            orphaned_env_vars: OrphanedEnvVars::Keep,
        }
    }

    fn state(ignored: bool) -> ResourceState {
        ResourceState { hash: DataHash::of_bytes(b"v1"), ignored, search_match: false, wide: None, keys: None }
    }

    /// `web` mounts ConfigMap `config`, takes Secret `db` through envFrom, and names ConfigMap
    /// `missing` in its reload list; `db` is ignored.
    fn store() -> Store {
        let (store, writer) = Store::new(Keys::default().explicit_keys());
        for (kind, name, ignored) in [(ResourceKind::ConfigMap, "config", false), (ResourceKind::Secret, "db", true)] {
            writer.apply_resource(ResourceKey { kind, namespace: "ns".into(), name: name.into() }, state(ignored));
        }
        let app = Container {
            name: "app".into(),
            volume_mounts: vec!["conf".into()],
            env_refs: vec![(ResourceKind::Secret, "db".into())],
            recorded: vec![("STAKATER_CONFIG_CONFIGMAP".into(), "old".into())],
        };
        writer.apply_workload(Workload {
            uid: "u".into(),
            annotations: [
                ("reloader.stakater.com/auto".to_string(), "true".to_string()),
                ("configmap.reloader.stakater.com/reload".to_string(), "missing".to_string()),
            ]
            .into(),
            template: PodTemplate {
                containers: vec![app],
                volumes: vec![Volume {
                    name: "conf".into(),
                    sources: vec![(ResourceKind::ConfigMap, "config".into())],
                }],
                ..Default::default()
            },
            ..Workload::test(WorkloadKind::Deployment, "ns", "web")
        });
        store
    }

    fn absent(key: &ResourceKey) -> String {
        format!("no {} {}", key.kind.kind(), key.name)
    }

    fn explain(scope: &Scope, serving: Serving, subject: Subject, name: &str) -> Report {
        let store = store();
        let rules = Rules::new(Keys::default(), Default::default());
        Explainer { rules, store: &store, scope, absent_reason: &absent, damped: None }
            .explain(subject, "ns", name, serving)
    }

    #[test]
    fn a_workload_lists_each_resource_with_the_rule_that_decides() {
        let report = explain(&scope(), Serving::default(), Subject::Workload(WorkloadKind::Deployment), "web");
        let find = |name: &str| report.pairs.iter().find(|p| p.resource == name).expect("pair listed").clone();
        let config = find("config");
        assert!(config.reloads);
        assert_eq!(config.rule, "auto");
        assert_eq!(config.writes.as_deref(), Some("env var STAKATER_CONFIG_CONFIGMAP on container app"));
        assert_eq!(config.recorded_hash.as_deref(), Some("old"));
        assert_eq!(config.uses, vec!["volume conf mounted by app"]);
        let db = find("db");
        assert_eq!((db.reloads, db.rule.as_str()), (false, "resource-ignored"));
        let missing = find("missing");
        assert_eq!(
            (missing.reloads, missing.rule.as_str(), missing.reason.as_str()),
            (false, "resource-absent", "no ConfigMap missing")
        );
        let text = text(&report);
        assert!(text.contains("would reload:\n    ConfigMap config  [auto]"), "{text}");
        assert!(text.contains("would NOT reload:"), "{text}");
    }

    #[test]
    fn a_resource_lists_the_workloads_a_change_concerns_and_outer_rules_come_first() {
        let config = Subject::Resource(ResourceKind::ConfigMap);
        let report = explain(&scope(), Serving::default(), config, "config");
        assert_eq!(report.pairs.len(), 1);
        assert!(report.pairs[0].reloads);
        let off = Serving { not_selected: Some("in --namespaces-to-ignore".into()), ..Default::default() };
        let report = explain(&scope(), off, config, "config");
        assert_eq!(report.pairs[0].rule, "namespace-not-selected");
        let mut only_secrets = scope();
        only_secrets.resources = vec![ResourceKind::Secret];
        let report = explain(&only_secrets, Serving::default(), config, "config");
        assert_eq!(report.pairs[0].rule, "ignored-resource-type");
        let report = explain(&scope(), Serving::default(), Subject::Workload(WorkloadKind::CronJob), "web");
        assert!(!report.found);
        assert!(report.note.as_deref().is_some_and(|n| n.contains("--ignored-workload-types")), "{report:?}");
    }

    #[test]
    fn kinds_are_taken_as_kubectl_spells_them() {
        assert_eq!(Subject::parse("deploy"), Ok(Subject::Workload(WorkloadKind::Deployment)));
        assert_eq!(Subject::parse("Deployments"), Ok(Subject::Workload(WorkloadKind::Deployment)));
        assert_eq!(Subject::parse("cm"), Ok(Subject::Resource(ResourceKind::ConfigMap)));
        assert_eq!(Subject::parse("spc"), Ok(Subject::Resource(ResourceKind::SecretProviderClass)));
        assert!(Subject::parse("pod").is_err_and(|e| e.contains("unknown kind")));
    }

    #[test]
    fn short_hashes_cut_by_characters_whatever_the_workload_records() {
        let mut report = Report::new("Deployment", "ns", "web", Serving::default(), &scope());
        let pair = |recorded: &str| Pair {
            resource_kind: "Secret",
            resource: "db".into(),
            workload_kind: "Deployment",
            workload: "web".into(),
            reloads: true,
            rule: "auto".into(),
            reason: String::new(),
            uses: vec![],
            writes: None,
            recorded_hash: Some(recorded.into()),
            current_hash: Some(DataHash::of_bytes(b"secret").to_string()),
            keys: None,
            damped: None,
        };
        report.pairs = vec![
            pair("0123456789abcdef0123"),
            pair("\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"),
        ];
        let short = report.with_short_hashes(12);
        assert_eq!(short.pairs[0].recorded_hash.as_deref(), Some("0123456789ab"));
        assert_eq!(short.pairs[0].current_hash.as_ref().map(String::len), Some(12));
        assert_eq!(short.pairs[1].recorded_hash.as_ref().map(|h| h.chars().count()), Some(12));
    }
}
