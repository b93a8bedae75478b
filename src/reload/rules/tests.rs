use super::*;
use crate::watch::{Container, DataHash, Volume};

fn keys() -> Keys {
    Keys::default()
}

fn state() -> ResourceState {
    ResourceState { hash: DataHash::of_bytes(b"x"), ignored: false, search_match: false, wide: None, keys: None }
}

fn annotations(pairs: &[(&str, &str)]) -> Annotations {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn container(name: &str) -> Container {
    Container { name: name.into(), ..Default::default() }
}

/// A template with one container `app` that uses ConfigMap `cm` through envFrom.
fn template_using_cm() -> PodTemplate {
    let mut app = container("app");
    app.env_refs.push((ResourceKind::ConfigMap, "cm".into()));
    PodTemplate { containers: vec![app], ..Default::default() }
}

fn decide(
    keys: &Keys,
    options: &Options,
    kind: ResourceKind,
    name: &str,
    state: &ResourceState,
    metadata: &Annotations,
    template: &PodTemplate,
) -> Verdict {
    let verdict = Rules::new(keys.clone(), options.clone()).decide(kind, name, state, metadata, template);
    explain_agrees(keys, options, kind, name, state, metadata, template);
    verdict
}

/// `explain` says what the engine does: for every case of these tests, its verdict for the
/// pair (from a store holding the workload and the resource) equals the engine's decision.
fn explain_agrees(
    keys: &Keys,
    options: &Options,
    kind: ResourceKind,
    name: &str,
    state: &ResourceState,
    metadata: &Annotations,
    template: &PodTemplate,
) {
    use crate::reload::explain;
    use crate::watch::{ResourceKey, Store, Workload, WorkloadKind};
    let workload = Workload {
        uid: "u".into(),
        annotations: metadata.clone(),
        template: template.clone(),
        ..Workload::test(WorkloadKind::Deployment, "ns", "web")
    };
    let engine = Rules::new(keys.clone(), options.clone()).evaluate(kind, name, state, &workload);
    let (store, writer) = Store::new(keys.explicit_keys());
    let resource = ResourceKey { kind, namespace: "ns".into(), name: name.into() };
    writer.apply_resource(resource.clone(), state.clone());
    writer.apply_workload(workload.clone());
    let scope = explain::Scope {
        strategy: crate::reload::Strategy::EnvVars,
        kinds: WorkloadKind::ALL.to_vec(),
        resources: vec![ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass],
        damping: None,
        orphaned_env_vars: Default::default(),
    };
    let absent = |_: &ResourceKey| "absent".to_string();
    let rules = Rules::new(keys.clone(), options.clone());
    let mut explainer =
        explain::Explainer { rules, store: &store, scope: &scope, absent_reason: &absent, damped: None };
    let by_resource = explainer.resource(Default::default(), &resource);
    let by_workload = explainer.workload(Default::default(), &workload.key);
    for report in [by_resource, by_workload] {
        let pair = report.pairs.iter().find(|p| p.resource == name && p.resource_kind == kind.kind());
        match pair {
            Some(pair) => {
                assert_eq!(pair.reloads, engine.reloads(), "explain disagrees with the engine: {pair:?} vs {engine:?}");
                if engine.reloads() || engine.verdict.mode.is_none() {
                    let word = serde_json::to_value(engine.verdict.rule).expect("a rule serializes");
                    assert_eq!(Some(pair.rule.as_str()), word.as_str(), "rule of {pair:?}");
                }
            }
            None => assert!(!engine.reloads(), "explain ({}) omits a pair the engine reloads: {engine:?}", report.kind),
        }
    }
}

fn mode_for(meta: &[(&str, &str)], template: &PodTemplate, name: &str) -> Option<Mode> {
    decide(&keys(), &Options::default(), ResourceKind::ConfigMap, name, &state(), &annotations(meta), template).mode
}

#[test]
fn auto_reloads_for_any_resource_and_needs_a_reference_later() {
    assert_eq!(mode_for(&[("reloader.stakater.com/auto", "true")], &template_using_cm(), "cm"), Some(Mode::Auto));
}

#[test]
fn auto_accepts_go_parse_bool_spellings() {
    for value in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(mode_for(&[("reloader.stakater.com/auto", value)], &template_using_cm(), "cm"), Some(Mode::Auto));
    }
    for value in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(mode_for(&[("reloader.stakater.com/auto", value)], &template_using_cm(), "cm"), None);
    }
}

#[test]
fn unparseable_auto_is_reported_and_counts_as_false() {
    let verdict = decide(
        &keys(),
        &Options::default(),
        ResourceKind::ConfigMap,
        "cm",
        &state(),
        &annotations(&[("reloader.stakater.com/auto", "yes")]),
        &template_using_cm(),
    );
    assert_eq!(verdict.mode, None);
    assert_eq!(verdict.problems.len(), 1);
    assert_eq!(verdict.problems[0].value, "yes");
}

#[test]
fn typed_auto_only_reacts_to_its_own_kind() {
    let meta = annotations(&[("secret.reloader.stakater.com/auto", "true")]);
    let t = template_using_cm();
    let cm = decide(&keys(), &Options::default(), ResourceKind::ConfigMap, "cm", &state(), &meta, &t);
    let secret = decide(&keys(), &Options::default(), ResourceKind::Secret, "cm", &state(), &meta, &t);
    assert_eq!(cm.mode, None);
    assert_eq!(secret.mode, Some(Mode::Auto));
}

#[test]
fn explicit_list_is_anchored_regex_per_entry() {
    let t = PodTemplate::default();
    let meta = [("configmap.reloader.stakater.com/reload", "foo, app-.*-config ,bar")];
    assert_eq!(mode_for(&meta, &t, "app-web-config"), Some(Mode::Explicit));
    assert_eq!(mode_for(&meta, &t, "foo"), Some(Mode::Explicit));
    assert_eq!(mode_for(&meta, &t, "xfoo"), None, "entries are anchored at both ends");
    assert_eq!(mode_for(&meta, &t, "baz"), None);
}

#[test]
fn explicit_alternation_is_not_grouped_exactly_like_reloader() {
    // `^a|b$` means "starts with a" or "ends with b".
    let meta = [("configmap.reloader.stakater.com/reload", "a|b")];
    assert_eq!(mode_for(&meta, &PodTemplate::default(), "abc"), Some(Mode::Explicit));
    assert_eq!(mode_for(&meta, &PodTemplate::default(), "xxb"), Some(Mode::Explicit));
    assert_eq!(mode_for(&meta, &PodTemplate::default(), "xbx"), None);
}

#[test]
fn a_dot_in_an_explicit_name_is_a_wildcard() {
    let meta = [("configmap.reloader.stakater.com/reload", "my.cfg")];
    assert_eq!(mode_for(&meta, &PodTemplate::default(), "my-cfg"), Some(Mode::Explicit));
}

#[test]
fn empty_explicit_value_never_matches() {
    let meta = [("configmap.reloader.stakater.com/reload", "")];
    assert_eq!(mode_for(&meta, &PodTemplate::default(), "cm"), None);
}

#[test]
fn invalid_regex_entry_is_reported_and_skipped_without_panicking() {
    let verdict = decide(
        &keys(),
        &Options::default(),
        ResourceKind::ConfigMap,
        "good",
        &state(),
        &annotations(&[("configmap.reloader.stakater.com/reload", "bad[,good")]),
        &PodTemplate::default(),
    );
    assert_eq!(verdict.mode, Some(Mode::Explicit), "the valid entry still matches");
    assert_eq!(verdict.problems.len(), 1);
    assert_eq!(verdict.problems[0].value, "bad[");
}

#[test]
fn resource_ignore_wins_over_everything() {
    let ignored = ResourceState { ignored: true, ..state() };
    let verdict = decide(
        &keys(),
        &Options { auto_reload_all: true },
        ResourceKind::ConfigMap,
        "cm",
        &ignored,
        &annotations(&[("configmap.reloader.stakater.com/reload", "cm"), ("reloader.stakater.com/auto", "true")]),
        &template_using_cm(),
    );
    assert_eq!(verdict.mode, None);
}

#[test]
fn exclude_wins_over_explicit_and_auto_and_is_exact() {
    let meta = [
        ("configmaps.exclude.reloader.stakater.com/reload", "other, cm"),
        ("configmap.reloader.stakater.com/reload", "cm"),
        ("reloader.stakater.com/auto", "true"),
    ];
    assert_eq!(mode_for(&meta, &template_using_cm(), "cm"), None);
    let regexy = [("configmaps.exclude.reloader.stakater.com/reload", "c."), ("reloader.stakater.com/auto", "true")];
    assert_eq!(mode_for(&regexy, &template_using_cm(), "cm"), Some(Mode::Auto), "exclude lists are not regexes");
}

#[test]
fn exclude_on_the_pod_template_is_not_read() {
    let mut t = template_using_cm();
    t.annotations = annotations(&[
        ("configmaps.exclude.reloader.stakater.com/reload", "cm"),
        ("reloader.stakater.com/auto", "true"),
    ]);
    assert_eq!(mode_for(&[], &t, "cm"), Some(Mode::Auto));
}

#[test]
fn search_needs_match_on_the_resource() {
    let meta = [("reloader.stakater.com/search", "true")];
    assert_eq!(mode_for(&meta, &template_using_cm(), "cm"), None);
    let matched = ResourceState { search_match: true, ..state() };
    let verdict = decide(
        &keys(),
        &Options::default(),
        ResourceKind::ConfigMap,
        "cm",
        &matched,
        &annotations(&meta),
        &template_using_cm(),
    );
    assert_eq!(verdict.mode, Some(Mode::Auto));
}

#[test]
fn pod_template_annotations_are_read_when_metadata_has_none_of_the_keys() {
    let mut t = template_using_cm();
    t.annotations = annotations(&[("reloader.stakater.com/auto", "true")]);
    assert_eq!(mode_for(&[("unrelated", "x")], &t, "cm"), Some(Mode::Auto));
}

#[test]
fn presence_of_a_key_on_metadata_blocks_the_template_fallback() {
    let mut t = template_using_cm();
    t.annotations = annotations(&[("reloader.stakater.com/auto", "true")]);
    assert_eq!(mode_for(&[("reloader.stakater.com/auto", "false")], &t, "cm"), None);
}

#[test]
fn template_with_configmap_list_does_not_reload_for_a_secret() {
    let mut t = template_using_cm();
    t.annotations = annotations(&[("configmap.reloader.stakater.com/reload", "cm")]);
    let verdict =
        decide(&keys(), &Options::default(), ResourceKind::Secret, "cm", &state(), &Annotations::default(), &t);
    assert_eq!(verdict.mode, None);
}

#[test]
fn auto_reload_all_applies_unless_auto_or_typed_auto_is_set() {
    let all = Options { auto_reload_all: true };
    let t = template_using_cm();
    let run = |meta: &[(&str, &str)]| {
        decide(&keys(), &all, ResourceKind::ConfigMap, "cm", &state(), &annotations(meta), &t).mode
    };
    assert_eq!(run(&[]), Some(Mode::Auto));
    assert_eq!(run(&[("reloader.stakater.com/auto", "false")]), None);
    assert_eq!(run(&[("configmap.reloader.stakater.com/auto", "no")]), None);
    assert_eq!(
        run(&[("secret.reloader.stakater.com/auto", "true")]),
        Some(Mode::Auto),
        "another type's key does not opt out"
    );
}

#[test]
fn no_annotation_no_reload() {
    assert_eq!(mode_for(&[], &template_using_cm(), "cm"), None);
}

// Container choice: Reloader v1 `getContainerUsingResource` cases.

fn mounting_template() -> PodTemplate {
    let mut sidecar = container("sidecar");
    sidecar.volume_mounts.push("other".into());
    let mut app = container("app");
    app.volume_mounts.push("config".into());
    PodTemplate {
        containers: vec![sidecar, app],
        volumes: vec![Volume { name: "config".into(), sources: vec![(ResourceKind::ConfigMap, "cm".into())] }],
        ..Default::default()
    }
}

#[test]
fn the_container_mounting_the_volume_is_chosen() {
    assert_eq!(target_container(&mounting_template(), ResourceKind::ConfigMap, "cm", Mode::Auto), Some(1));
}

#[test]
fn projected_sources_count_as_a_volume_reference() {
    let mut t = mounting_template();
    t.volumes[0].sources = vec![(ResourceKind::Secret, "s".into()), (ResourceKind::ConfigMap, "cm".into())];
    assert_eq!(target_container(&t, ResourceKind::ConfigMap, "cm", Mode::Auto), Some(1));
    assert_eq!(target_container(&t, ResourceKind::Secret, "s", Mode::Auto), Some(1));
}

#[test]
fn an_init_container_reference_points_at_the_first_container() {
    let mut init = container("init");
    init.volume_mounts.push("config".into());
    let t = PodTemplate {
        containers: vec![container("a"), container("b")],
        init_containers: vec![init],
        volumes: vec![Volume { name: "config".into(), sources: vec![(ResourceKind::ConfigMap, "cm".into())] }],
        ..Default::default()
    };
    assert_eq!(target_container(&t, ResourceKind::ConfigMap, "cm", Mode::Auto), Some(0));

    let mut init_env = container("init");
    init_env.env_refs.push((ResourceKind::Secret, "s".into()));
    let t = PodTemplate { containers: vec![container("a")], init_containers: vec![init_env], ..Default::default() };
    assert_eq!(target_container(&t, ResourceKind::Secret, "s", Mode::Auto), Some(0));
}

#[test]
fn env_reference_is_used_when_no_volume_is_mounted() {
    let mut b = container("b");
    b.env_refs.push((ResourceKind::ConfigMap, "cm".into()));
    let t = PodTemplate {
        containers: vec![container("a"), b],
        // Declared but mounted by nobody: falls through to env references.
        volumes: vec![Volume { name: "unused".into(), sources: vec![(ResourceKind::ConfigMap, "cm".into())] }],
        ..Default::default()
    };
    assert_eq!(target_container(&t, ResourceKind::ConfigMap, "cm", Mode::Auto), Some(1));
}

#[test]
fn explicit_without_reference_takes_the_first_container_auto_takes_none() {
    let t = PodTemplate { containers: vec![container("a"), container("b")], ..Default::default() };
    assert_eq!(target_container(&t, ResourceKind::ConfigMap, "cm", Mode::Explicit), Some(0));
    assert_eq!(target_container(&t, ResourceKind::ConfigMap, "cm", Mode::Auto), None);
}

#[test]
fn no_containers_means_no_target() {
    assert_eq!(target_container(&PodTemplate::default(), ResourceKind::ConfigMap, "cm", Mode::Explicit), None);
}

#[test]
fn csi_volume_names_the_secret_provider_class() {
    let mut app = container("app");
    app.volume_mounts.push("secrets".into());
    let t = PodTemplate {
        containers: vec![app],
        volumes: vec![Volume {
            name: "secrets".into(),
            sources: vec![(ResourceKind::SecretProviderClass, "vault-spc".into())],
        }],
        ..Default::default()
    };
    assert_eq!(target_container(&t, ResourceKind::SecretProviderClass, "vault-spc", Mode::Auto), Some(0));
}

#[test]
fn a_cached_pattern_decides_like_a_fresh_one() {
    let mut rules = Rules::new(keys(), Options::default());
    let meta = annotations(&[("configmap.reloader.stakater.com/reload", "app-.*, bad[")]);
    let t = PodTemplate::default();
    for _ in 0..3 {
        let hit = rules.decide(ResourceKind::ConfigMap, "app-1", &state(), &meta, &t);
        assert_eq!(hit.mode, Some(Mode::Explicit));
        let miss = rules.decide(ResourceKind::ConfigMap, "other", &state(), &meta, &t);
        assert_eq!(miss.mode, None);
        assert_eq!(miss.problems.len(), 1, "a cached bad pattern is still reported");
    }
}
