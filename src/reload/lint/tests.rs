use super::*;

fn workload_findings(keys: &Keys, workload: &Workload) -> Vec<Finding> {
    super::workload(keys, workload, &mut Patterns::default())
}
use crate::watch::{PodTemplate, WorkloadKind};

fn map(pairs: &[(&str, &str)]) -> Annotations {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn workload_with(meta: &[(&str, &str)], template: &[(&str, &str)]) -> Workload {
    Workload {
        uid: "u".into(),
        annotations: map(meta),
        template: PodTemplate { annotations: map(template), ..Default::default() },
        ..Workload::test(WorkloadKind::Deployment, "ns", "web")
    }
}

fn codes(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().map(|f| f.code).collect()
}

#[test]
fn a_misspelt_key_names_the_key_it_is_taken_for() {
    let keys = Keys::default();
    let found = workload_findings(&keys, &workload_with(&[("reloader.stakter.com/auto", "true")], &[]));
    assert_eq!(codes(&found), ["misspelt-key"]);
    assert!(found[0].message.contains("did you mean \"reloader.stakater.com/auto\""), "{}", found[0].message);
    let plural = workload_findings(&keys, &workload_with(&[], &[("secrets.reloader.stakater.com/reload", "db")]));
    assert!(plural[0].message.contains("\"secret.reloader.stakater.com/reload\""), "{plural:?}");
    let on_resource = resource(&keys, ResourceKind::ConfigMap, &map(&[("reloader.stakater.com/ignroe", "true")]));
    assert!(on_resource[0].message.contains("\"reloader.stakater.com/ignore\""), "{on_resource:?}");
}

#[test]
fn keys_on_the_wrong_side_are_found() {
    let keys = Keys::default();
    let w = workload_findings(
        &keys,
        &workload_with(&[("reloader.stakater.com/match", "true"), ("reloader.stakater.com/ignore", "true")], &[]),
    );
    assert_eq!(codes(&w), ["ignore-on-workload", "match-on-workload"]);
    assert!(
        w[1].message.contains("set \"reloader.stakater.com/search\": \"true\" on the workload"),
        "{}",
        w[1].message
    );
    let r = resource(
        &keys,
        ResourceKind::ConfigMap,
        &map(&[("reloader.stakater.com/search", "true"), ("reloader.stakater.com/auto", "true")]),
    );
    assert_eq!(codes(&r), ["search-on-resource", "workload-key-on-resource"]);
}

#[test]
fn auto_with_search_and_values_that_are_no_boolean_are_found() {
    let keys = Keys::default();
    let both = workload_findings(
        &keys,
        &workload_with(&[("reloader.stakater.com/auto", "true"), ("reloader.stakater.com/search", "true")], &[]),
    );
    assert_eq!(codes(&both), ["auto-and-search"]);
    let bad = workload_findings(&keys, &workload_with(&[("reloader.stakater.com/auto", "yes")], &[]));
    assert_eq!(codes(&bad), ["not-a-boolean"]);
    let pattern =
        workload_findings(&keys, &workload_with(&[("configmap.reloader.stakater.com/reload", "ok,(unclosed")], &[]));
    assert_eq!(codes(&pattern), ["invalid-pattern"]);
    assert!(
        pattern[0].message.contains("entry \"(unclosed\" is not a valid regular expression"),
        "{}",
        pattern[0].message
    );
    let exact = resource(&keys, ResourceKind::Secret, &map(&[("reloader.stakater.com/ignore", "True")]));
    assert_eq!(codes(&exact), ["not-a-boolean"]);
    assert!(exact[0].message.contains("only exactly \"true\" counts"), "{}", exact[0].message);
}

#[test]
fn correct_annotations_raise_nothing() {
    let keys = Keys::default();
    for meta in [
        vec![("reloader.stakater.com/auto", "true")],
        vec![("reloader.stakater.com/auto", "false"), ("app.kubernetes.io/name", "web")],
        vec![("configmap.reloader.stakater.com/reload", "a,b"), ("secret.reloader.stakater.com/auto", "True")],
        vec![("reloader.stakater.com/search", "true"), ("deployment.reloader.stakater.com/pause-period", "5m")],
        vec![
            ("configmaps.exclude.reloader.stakater.com/reload", "a"),
            ("reloader.stakater.com/rollout-strategy", "restart"),
        ],
        vec![
            ("reloader-fleet.stakater.com/reloaded-hashes", "{}"),
            ("deployment.reloader.stakater.com/paused-at", "x"),
        ],
    ] {
        assert_eq!(workload_findings(&keys, &workload_with(&meta, &[])), vec![], "{meta:?}");
        assert_eq!(workload_findings(&keys, &workload_with(&[], &meta)), vec![], "on the template: {meta:?}");
    }
    for annotations in [vec![("reloader.stakater.com/match", "true")], vec![("reloader.stakater.com/ignore", "false")]]
    {
        assert_eq!(resource(&keys, ResourceKind::ConfigMap, &map(&annotations)), vec![], "{annotations:?}");
    }
}

#[test]
fn only_names_in_reload_lists_must_exist() {
    let keys = Keys::default();
    let w = workload_with(
        &[
            ("configmap.reloader.stakater.com/reload", "a, app.conf,b.*,c|d"),
            ("secret.reloader.stakater.com/reload", "db"),
        ],
        &[],
    );
    let names: Vec<(ResourceKind, String)> = listed_names(&keys, &w).into_iter().map(|(k, n, _)| (k, n)).collect();
    assert_eq!(
        names,
        [
            (ResourceKind::ConfigMap, "a".into()),
            (ResourceKind::ConfigMap, "app.conf".into()),
            (ResourceKind::Secret, "db".into())
        ]
    );
    let finding = absent("configmap.reloader.stakater.com/reload", ResourceKind::ConfigMap, "a", "ns");
    assert!(
        finding.message.contains("names ConfigMap \"a\", which does not exist in namespace ns"),
        "{}",
        finding.message
    );
}

#[test]
fn durations_that_are_unusable_or_too_long_are_found() {
    let keys = Keys::default();
    let period = "deployment.reloader.stakater.com/pause-period";
    let found = workload_findings(
        &keys,
        &workload_with(&[(period, "99999999999999999999999h"), (COALESCE_WINDOW, "2 seconds")], &[]),
    );
    assert_eq!(codes(&found), ["invalid-duration", "invalid-duration"]);
    assert!(found.iter().any(|f| f.annotation == period && f.message.contains("longer than the 24h0m0s")), "{found:?}");
    assert!(found.iter().any(|f| f.annotation == COALESCE_WINDOW && f.message.contains("not a duration")), "{found:?}");
    let fine = workload_findings(&keys, &workload_with(&[(period, "5m"), (COALESCE_WINDOW, "0")], &[]));
    assert!(fine.is_empty(), "{fine:?}");
}

#[test]
fn a_strategy_value_reloader_does_not_know_is_found_and_known_ones_are_not() {
    let keys = Keys::default();
    for (key, value) in [(ROLLOUT_STRATEGY, "restart"), (CRONJOB_RELOAD_STRATEGY, "patch")] {
        assert!(workload_findings(&keys, &workload_with(&[(key, value)], &[])).is_empty(), "{key}: {value}");
    }
    let typo = workload_findings(&keys, &workload_with(&[(CRONJOB_RELOAD_STRATEGY, "Patch")], &[]));
    assert_eq!(codes(&typo), ["unknown-value"]);
    assert!(typo[0].message.contains("\"Patch\", which is not \"create\" or \"patch\""), "{}", typo[0].message);
    let rollout = workload_findings(&keys, &workload_with(&[(ROLLOUT_STRATEGY, "restrat")], &[]));
    assert_eq!(codes(&rollout), ["unknown-value"]);
}

#[test]
fn auto_on_a_declared_kind_with_no_pod_at_its_path_is_found() {
    let keys = Keys::default();
    let vmagent = crate::watch::custom_kinds::declare_for_tests()[1];
    let mut agent = workload_with(&[("reloader.stakater.com/auto", "true")], &[]);
    agent.key.kind = vmagent;
    let found = workload_findings(&keys, &agent);
    assert_eq!(codes(&found), ["empty-pod"]);
    assert!(found[0].message.contains("spec.podMetadata and spec"), "{}", found[0].message);
    agent.template.containers.push(Default::default());
    assert!(workload_findings(&keys, &agent).is_empty(), "a container at the path: auto can find what it uses");
    let deployment = workload_with(&[("reloader.stakater.com/auto", "true")], &[]);
    assert!(workload_findings(&keys, &deployment).is_empty(), "built-in kinds are not checked");
}

#[test]
fn the_used_keys_annotation_takes_true_or_false_only() {
    let keys = Keys::default();
    let key = crate::watch::used_keys::ANNOTATION;
    for good in ["true", "false"] {
        assert!(workload_findings(&keys, &workload_with(&[(key, good)], &[])).is_empty(), "{good}");
    }
    let found = workload_findings(&keys, &workload_with(&[(key, "yes")], &[]));
    assert_eq!(codes(&found), ["not-a-boolean"]);
    assert!(found[0].message.contains("--reload-on-used-keys decides"), "{}", found[0].message);
}
