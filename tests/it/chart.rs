//! The Helm chart (`charts/reloader`): Reloader chart 2.2.16's values render the arguments,
//! environment and RBAC they render there (plus the fleet's values), `helm lint` passes, and
//! `helm install` gives a Deployment whose pods become Ready and whose rendered arguments,
//! environment and ServiceAccount are enough for the controller to reload.
//!
//! helm is built from its Go module by `hack/tools helm` (pinned in hack/helm/go.mod).

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::support::controller::start_as_pod_of;
use crate::support::fixtures::{Kind, Workload, cm_hash, create_configmap, patch_configmap, wait_deployment_ready};
use crate::support::scenario::{Ctx, wait_stored};
use crate::support::{kubeconfig_path, with_temp_ns};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap as Cm;
use serde_json::{Value, json};

pub(crate) const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/reloader");

pub(crate) fn helm() -> PathBuf {
    support::tool("helm")
}

/// `helm template` of `chart` as release `r` in namespace `ops` with `values` (YAML), the API
/// groups in `served` declared served; the rendered documents, or helm's error.
pub(crate) fn template(chart: &str, values: &str, served: &[&str]) -> Result<Vec<Value>, String> {
    let mut command = Command::new(helm());
    command.args(["template", "r", chart, "--namespace", "ops"]);
    for group in served {
        command.args(["--api-versions", group]);
    }
    let out = command.arg("--values").arg(tempfile(values)).output().expect("run helm template");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("helm renders YAML");
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// `helm <args> --namespace ns --wait --kubeconfig ...` against the test control plane, which
/// must succeed.
pub(crate) fn helm_in(ns: &str, args: &[&str]) {
    let out = Command::new(helm())
        .args(args)
        .args(["--namespace", ns, "--wait", "--timeout", "90s", "--kubeconfig"])
        .arg(kubeconfig_path())
        .output()
        .expect("run helm");
    assert!(out.status.success(), "helm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// This chart rendered with `values`; the documents, or helm's error.
fn try_render(values: &str) -> Result<Vec<Value>, String> {
    template(CHART, values, &[])
}

pub(crate) fn render(values: &str) -> Vec<Value> {
    try_render(values).unwrap_or_else(|e| panic!("helm template failed for values\n{values}\n{e}"))
}

pub(crate) fn tempfile(contents: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("values-{}-{n}.yaml", std::process::id()));
    std::fs::write(&path, contents).expect("write values");
    path
}

pub(crate) fn find<'a>(documents: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    documents.iter().find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn container(documents: &[Value]) -> &Value {
    let deployment = find(documents, "Deployment", "r-reloader").expect("the Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(documents: &[Value]) -> Vec<String> {
    container(documents)["args"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default()
}

/// Env var name -> its value, or `<from ...>` for a reference.
fn env(documents: &[Value]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in container(documents)["env"].as_array().into_iter().flatten() {
        let name = entry["name"].as_str().unwrap_or_default().to_string();
        let value = match (&entry["value"], &entry["valueFrom"]) {
            (Value::String(v), _) => v.clone(),
            (_, from) if from["fieldRef"].is_object() => format!("<field {}>", from["fieldRef"]["fieldPath"]),
            (_, from) if from["resourceFieldRef"].is_object() => {
                format!("<resource {}>", from["resourceFieldRef"]["resource"])
            }
            (_, from) if from["secretKeyRef"].is_object() => {
                format!("<secret {} {}>", from["secretKeyRef"]["name"], from["secretKeyRef"]["key"])
            }
            _ => String::new(),
        };
        out.insert(name, value);
    }
    out
}

/// Every rule of a Role or ClusterRole as `group/resource: verbs` lines (`group/resource[names]:
/// verbs` for a rule limited to named objects), sorted.
fn rules(role: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        let verbs: Vec<&str> = rule["verbs"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let names: Vec<&str> =
            rule["resourceNames"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let names = if names.is_empty() { String::new() } else { format!("[{}]", names.join(",")) };
        for group in rule["apiGroups"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            for resource in rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                out.push(format!("{group}/{resource}{names}: {}", verbs.join(",")));
            }
        }
    }
    out.sort();
    out
}

fn has_rule(role: &Value, rule: &str) -> bool {
    rules(role).iter().any(|r| r == rule)
}

#[test]
fn helm_lint_passes_with_defaults_and_with_a_fleet() {
    for values in ["{}", "reloader: {enableHA: true, deployment: {replicas: 3}, sharding: {shards: 16}}"] {
        let file = tempfile(values);
        let out = Command::new(helm()).args(["lint", CHART, "--values"]).arg(&file).output().expect("helm lint");
        assert!(out.status.success(), "helm lint with {values}: {}", String::from_utf8_lossy(&out.stdout));
    }
}

#[test]
fn defaults_render_reloaders_cluster_wide_install() {
    let docs = render("{}");
    assert_eq!(args(&docs), vec!["--log-level=info"]);
    let reloaders = BTreeMap::from([
        ("GOMAXPROCS".to_string(), "<resource \"limits.cpu\">".to_string()),
        ("GOMEMLIMIT".to_string(), "<resource \"limits.memory\">".to_string()),
        ("RELOADER_DEPLOYMENT_NAME".to_string(), "r-reloader".to_string()),
        ("RELOADER_NAMESPACE".to_string(), "<field \"metadata.namespace\">".to_string()),
    ]);
    assert_eq!(env(&docs), reloaders, "Reloader's chart's environment (the meta-info ConfigMap's place and name)");
    let deployment = find(&docs, "Deployment", "r-reloader").expect("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], json!({ "app": "r-reloader", "release": "r" }));
    assert_eq!(container(&docs)["image"], format!("reloader-fleet/reloader:{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(container(&docs)["imagePullPolicy"], "IfNotPresent");
    assert_eq!(container(&docs)["readinessProbe"]["httpGet"]["path"], "/metrics", "Reloader v1's readiness");
    assert_eq!(container(&docs)["livenessProbe"]["httpGet"]["path"], "/live");
    let role = find(&docs, "ClusterRole", "r-reloader-role").expect("ClusterRole");
    assert_eq!(
        rules(role),
        vec![
            "/configmaps: list,get,watch",
            "/secrets: list,get,watch",
            "apps/daemonsets: list,get,watch,patch",
            "apps/deployments: list,get,watch,patch",
            "apps/statefulsets: list,get,watch,patch",
            "batch/cronjobs: list,get,watch,patch",
            "batch/jobs: create,delete,list,get,watch",
            "events.k8s.io/events: create,patch",
        ],
        "no update: every workload write is a PATCH"
    );
    let binding = find(&docs, "ClusterRoleBinding", "r-reloader-role-binding").expect("ClusterRoleBinding");
    assert_eq!(binding["subjects"][0], json!({ "kind": "ServiceAccount", "name": "r-reloader", "namespace": "ops" }));
    let metadata = find(&docs, "Role", "r-reloader-metadata-role").expect("the metadata Role");
    assert_eq!(
        rules(metadata),
        vec![
            "/configmaps: create".to_string(),
            parts_rule(&["reloader-fleet-checkpoint"]),
            "/configmaps[reloader-meta-info,reloader-fleet-checkpoint]: get,update".to_string()
        ]
    );
    assert!(find(&docs, "ServiceAccount", "r-reloader").is_some());
    for kind in ["Secret", "Service", "PodDisruptionBudget", "NetworkPolicy"] {
        assert!(docs.iter().all(|d| d["kind"] != kind), "no {kind} by default");
    }
}

/// The rule for the parts of the checkpoints `heads` (32 each), as [`rules`] prints it.
fn parts_rule(heads: &[&str]) -> String {
    let names: Vec<String> = heads.iter().flat_map(|h| (0..32).map(move |i| format!("{h}-part-{i}"))).collect();
    format!("/configmaps[{}]: get,update,delete", names.join(","))
}

/// The default image is the binary's own version: the chart's appVersion is the crate's.
#[test]
fn the_charts_app_version_is_the_binarys_version() {
    let chart: Value = serde_saphyr::from_str(include_str!("../../charts/reloader/Chart.yaml")).expect("Chart.yaml");
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"), "bump charts/reloader/Chart.yaml with Cargo.toml");
    // The pods' `version` label, as Reloader's chart sets its own in its values.
    let values: Value = serde_saphyr::from_str(include_str!("../../charts/reloader/values.yaml")).expect("values");
    let label = &values["reloader"]["deployment"]["labels"]["version"];
    assert_eq!(label, &format!("v{}", env!("CARGO_PKG_VERSION")), "bump charts/reloader/values.yaml too");
}

#[test]
fn watch_globally_false_is_a_role_in_the_release_namespace() {
    let docs = render("reloader: {watchGlobally: false, ignoreNamespaces: x, namespaceSelector: 'a=b'}");
    assert!(docs.iter().all(|d| d["kind"] != "ClusterRole"));
    let role = find(&docs, "Role", "r-reloader-role").expect("Role");
    assert_eq!(role["metadata"]["namespace"], "ops");
    assert!(!has_rule(role, "/namespaces: get,list,watch"));
    assert_eq!(env(&docs)["KUBERNETES_NAMESPACE"], "<field \"metadata.namespace\">");
    assert_eq!(args(&docs), vec!["--log-level=info"], "ignore list and selector are for cluster-wide mode");
}

#[test]
fn scoped_namespaces_get_one_role_each_and_the_flag_lists_them_with_the_release_namespace() {
    let docs = render("reloader: {watchGlobally: false, namespaces: [b, a, ops, b]}");
    assert!(args(&docs).contains(&"--namespaces=a,b,ops".to_string()), "{:?}", args(&docs));
    let namespaces: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" && d["metadata"]["name"] == "r-reloader-role-binding")
        .filter_map(|d| d["metadata"]["namespace"].as_str())
        .collect();
    assert_eq!(namespaces, vec!["a", "b", "ops"]);
    let err = try_render("reloader: {namespaces: [a]}").expect_err("namespaces with watchGlobally");
    assert!(err.contains("reloader.namespaces needs reloader.watchGlobally: false"), "{err}");
}

#[test]
fn enable_ha_with_three_replicas_renders_leader_election_and_lease_rbac() {
    let docs = render("reloader: {enableHA: true, deployment: {replicas: 3}}");
    let deployment = find(&docs, "Deployment", "r-reloader").expect("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(args(&docs), vec!["--log-level=info", "--enable-ha=true"]);
    let env = env(&docs);
    assert_eq!(env["POD_NAME"], "<field \"metadata.name\">");
    assert_eq!(env["POD_NAMESPACE"], "<field \"metadata.namespace\">");
    let affinity = &deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert!(affinity["preferredDuringSchedulingIgnoredDuringExecution"].is_array(), "{affinity}");
    let metadata = find(&docs, "Role", "r-reloader-metadata-role").expect("the metadata Role");
    assert!(has_rule(metadata, "coordination.k8s.io/leases: list,watch,create,get,update,delete"));
    let fleet = render("reloader: {enableHA: true, sharding: {shards: 3}}");
    let metadata = find(&fleet, "Role", "r-reloader-metadata-role").expect("the metadata Role");
    let names = "reloader-meta-info,reloader-fleet-checkpoint-shard-0,reloader-fleet-checkpoint-shard-1,\
                 reloader-fleet-checkpoint-shard-2";
    assert!(has_rule(metadata, &format!("/configmaps[{names}]: get,update")), "{:?}", rules(metadata));
    let heads: Vec<String> = (0..3).map(|s| format!("reloader-fleet-checkpoint-shard-{s}")).collect();
    let heads: Vec<&str> = heads.iter().map(String::as_str).collect();
    assert!(has_rule(metadata, &parts_rule(&heads)), "{:?}", rules(metadata));
    // Without HA, replicas stay 1 and no HA flag is rendered (Reloader renders --enable-ha for
    // replicas > 1 without the POD_NAME it needs).
    let docs = render("reloader: {deployment: {replicas: 3}}");
    assert_eq!(find(&docs, "Deployment", "r-reloader").expect("Deployment")["spec"]["replicas"], 1);
    assert_eq!(args(&docs), vec!["--log-level=info"]);
}

#[test]
fn sharding_values_render_the_fleet() {
    let docs = render(
        "reloader: {enableHA: true, deployment: {replicas: 3}, podDisruptionBudget: {enabled: true},
          leaderElection: {leaseDuration: 20s, renewDeadline: 15s, retryPeriod: 3s},
          sharding: {shards: 16, placement: fnv-ranges, hotStandby: true}}",
    );
    assert_eq!(
        args(&docs),
        vec![
            "--log-level=info",
            "--enable-ha=true",
            "--leader-election-lease-duration=20s",
            "--leader-election-renew-deadline=15s",
            "--leader-election-retry-period=3s",
            "--shards=16",
            "--shard-placement=fnv-ranges",
            "--hot-standby=true",
        ]
    );
    let pdb = find(&docs, "PodDisruptionBudget", "r-reloader").expect("PDB");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1, "a fleet keeps all replicas but one");
    let err = try_render("reloader: {sharding: {shards: 4}}").expect_err("shards without HA");
    assert!(err.contains("reloader.sharding.shards needs reloader.enableHA: true"), "{err}");
    let docs = render(
        "reloader: {annotationLint: false, coalesceWindow: 2s, maxRolloutsPerSecond: 50, maxConcurrentRollouts: 5,
          maxConcurrentWrites: 32, flapDampingChanges: 5, flapDampingWindow: 30s, removeOrphanedEnvVars: true,
          removeOrphanedEnvVarsAtOnce: true, reloadOnUsedKeys: true, hash: sha512-256, http2: false}",
    );
    assert_eq!(
        args(&docs),
        vec![
            "--log-level=info",
            "--annotation-lint=false",
            "--coalesce-window=2s",
            "--max-rollouts-per-second=50",
            "--max-concurrent-rollouts=5",
            "--max-concurrent-writes=32",
            "--flap-damping-changes=5",
            "--hash=sha512-256",
            "--remove-orphaned-env-vars=true",
            "--remove-orphaned-env-vars-at-once=true",
            "--reload-on-used-keys=true",
            "--flap-damping-window=30s",
            "--http2=false"
        ],
        "the lint and HTTP/2 are on unless turned off; coalescing and the budget are off unless set"
    );
}

#[test]
fn reload_settings_render_reloaders_flags() {
    let cases: &[(&str, &[&str])] = &[
        ("reloader: {reloadStrategy: annotations}", &["--reload-strategy=annotations"]),
        ("reloader: {ignoreSecrets: true}", &["--resources-to-ignore=secrets"]),
        ("reloader: {ignoreJobs: true, ignoreCronJobs: true}", &["--ignored-workload-types=jobs,cronjobs"]),
        // Quoted, as Reloader's chart renders it (the binary reads the value as CSV).
        ("reloader: {namespaceSelector: 'team=a,env!=dev'}", &["--namespace-selector=\"team=a,env!=dev\""]),
        ("reloader: {ignoreNamespaces: 'kube-system,x'}", &["--namespaces-to-ignore=kube-system,x"]),
        ("reloader: {resourceLabelSelector: 'reload=yes'}", &["--resource-label-selector=reload=yes"]),
        (
            "reloader: {reloadOnCreate: true, syncAfterRestart: true}",
            &["--reload-on-create=true", "--sync-after-restart=true"],
        ),
        ("reloader: {isArgoRollouts: true}", &["--is-Argo-Rollouts=true"]),
        ("reloader: {enableCSIIntegration: true}", &["--enable-csi-integration=true"]),
        ("reloader: {autoReloadAll: true, logFormat: json}", &["--log-format=json", "--auto-reload-all=true"]),
        // As Reloader's chart 2.2.16 renders it: only with custom annotations (a values file
        // that sets only the URL reloaded there, and must keep reloading after the swap).
        ("reloader: {webhookUrl: 'http://hook'}", &[]),
        (
            "reloader: {webhookUrl: 'http://hook', custom_annotations: {auto: my.co/auto}}",
            &["--auto-annotation", "my.co/auto", "--webhook-url", "http://hook"],
        ),
        ("reloader: {enablePProf: true}", &["--enable-pprof", "--pprof-addr=:6060"]),
    ];
    for (values, expected) in cases {
        let rendered = args(&render(values));
        let mut wanted = vec!["--log-level=info".to_string()];
        wanted.extend(expected.iter().map(ToString::to_string));
        if values.contains("logFormat") {
            wanted.swap(0, 1);
        }
        assert_eq!(rendered, wanted, "values {values}");
    }
}

#[test]
fn rbac_follows_the_features() {
    let role = |values: &str| find(&render(values), "ClusterRole", "r-reloader-role").cloned().expect("ClusterRole");
    let ignoring = role("reloader: {ignoreSecrets: true, ignoreJobs: true, ignoreCronJobs: true}");
    assert!(!has_rule(&ignoring, "/secrets: list,get,watch"));
    assert!(has_rule(&ignoring, "/configmaps: list,get,watch"));
    assert!(rules(&ignoring).iter().all(|r| !r.starts_with("batch/")), "{:?}", rules(&ignoring));
    assert!(has_rule(&role("reloader: {namespaceSelector: 'a=b'}"), "/namespaces: get,list,watch"));
    assert!(has_rule(&role("reloader: {isArgoRollouts: true}"), "argoproj.io/rollouts: list,get,watch,patch"));
    let openshift = role("reloader: {isOpenshift: true}");
    assert!(has_rule(&openshift, "apps.openshift.io/deploymentconfigs: list,get,watch,patch"));
    let csi = role("reloader: {enableCSIIntegration: true}");
    assert!(has_rule(&csi, "secrets-store.csi.x-k8s.io/secretproviderclasspodstatuses: list,get,watch"));
    assert!(has_rule(&csi, "secrets-store.csi.x-k8s.io/secretproviderclasses: list,get,watch"));
}

#[test]
fn custom_kinds_render_the_file_the_binary_reads_its_mount_and_their_rbac() {
    let values = "reloader: {customKinds: [
          {kind: Service, apiVersion: serving.knative.dev/v1, plural: services, template: spec.template},
          {kind: VMAgent, apiVersion: operator.victoriametrics.com/v1beta1, plural: vmagents,
           podMetadata: spec.podMetadata, podSpec: spec}]}";
    let docs = render(values);
    assert!(args(&docs).contains(&"--custom-kinds-file=/etc/reloader-fleet/custom-kinds.yaml".to_string()));
    let kinds = find(&docs, "ConfigMap", "r-reloader-custom-kinds").expect("the kinds ConfigMap");
    let text = kinds["data"]["custom-kinds.yaml"].as_str().expect("custom-kinds.yaml");
    let rows = reloader_fleet::watch::custom_kinds::parse("custom-kinds.yaml", text).expect("the binary reads it");
    let names: Vec<(&str, &str)> = rows.iter().map(|r| (r.kind.as_str(), r.group.as_str())).collect();
    assert_eq!(names, [("Service", "serving.knative.dev"), ("VMAgent", "operator.victoriametrics.com")]);
    let mount = &container(&docs)["volumeMounts"][0];
    assert_eq!((&mount["mountPath"], &mount["readOnly"]), (&json!("/etc/reloader-fleet"), &json!(true)));
    let deployment = find(&docs, "Deployment", "r-reloader").expect("the Deployment");
    let pod = &deployment["spec"]["template"];
    assert_eq!(pod["spec"]["volumes"][0]["configMap"]["name"], "r-reloader-custom-kinds");
    let checksum = &pod["metadata"]["annotations"]["reloader-fleet.stakater.com/custom-kinds-checksum"];
    assert!(checksum.is_string(), "a changed list rolls the controller, which reads it at start");
    let role = find(&docs, "ClusterRole", "r-reloader-role").expect("ClusterRole");
    assert!(has_rule(role, "serving.knative.dev/services: list,get,watch,patch"), "{:?}", rules(role));
    assert!(has_rule(role, "operator.victoriametrics.com/vmagents: list,get,watch,patch"), "{:?}", rules(role));
    let plain = render("reloader: {}");
    assert!(find(&plain, "ConfigMap", "r-reloader-custom-kinds").is_none(), "nothing without custom kinds");
    let err = try_render("reloader: {customKinds: [{kind: Service, apiVersion: v1, plural: services}]}")
        .expect_err("a core apiVersion");
    assert!(err.contains("customKinds"), "{err}");
}

#[test]
fn every_custom_annotation_key_renders_its_flag_and_an_unknown_key_is_an_error() {
    let keys = [
        ("configmap", "--configmap-annotation"),
        ("secret", "--secret-annotation"),
        ("auto", "--auto-annotation"),
        ("secret_auto", "--secret-auto-annotation"),
        ("configmap_auto", "--configmap-auto-annotation"),
        ("search", "--auto-search-annotation"),
        ("match", "--search-match-annotation"),
        ("ignore", "--ignore-annotation"),
        ("pausePeriod", "--pause-deployment-annotation"),
        ("pauseTime", "--pause-deployment-time-annotation"),
        ("configmap_exclude", "--configmap-exclude-annotation"),
        ("secret_exclude", "--secret-exclude-annotation"),
        ("secretproviderclass", "--secretproviderclass-annotation"),
        ("secretproviderclass_auto", "--secretproviderclass-auto-annotation"),
        ("secretproviderclass_exclude", "--secretproviderclass-exclude-annotation"),
    ];
    let values: Vec<String> = keys.iter().map(|(k, _)| format!("{k}: my.co/{k}")).collect();
    let rendered = args(&render(&format!("reloader: {{custom_annotations: {{{}}}}}", values.join(", "))));
    for (key, flag) in keys {
        let at = rendered.iter().position(|a| a == flag).unwrap_or_else(|| panic!("{flag} missing: {rendered:?}"));
        assert_eq!(rendered[at + 1], format!("my.co/{key}"));
    }
    // The controller takes every rendered flag.
    let out = Command::new(env!("CARGO_BIN_EXE_reloader")).args(&rendered).arg("--help").output().expect("reloader");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // values.schema.json names the misspelt key before the template's own check would.
    let err = try_render("reloader: {custom_annotations: {atuo: x}}").expect_err("a misspelt key");
    assert!(err.contains("/reloader/custom_annotations") && err.contains("'atuo' not allowed"), "{err}");
}

#[test]
fn env_secret_goes_into_the_charts_secret_and_the_other_env_kinds_render() {
    let docs = render(
        "reloader: {deployment: {env: {
           secret: {ALERT_ON_RELOAD: 'true', ALERT_SINK: slack, ALERT_WEBHOOK_URL: 'http://hook'},
           open: {TZ: UTC}, field: {NODE: spec.nodeName}, existing: {alerts: {ALERT_ADDITIONAL_INFO: info}}}},
          enableMetricsByNamespace: true}",
    );
    let env = env(&docs);
    assert_eq!(env["ALERT_ON_RELOAD"], "<secret \"r-reloader\" \"ALERT_ON_RELOAD\">");
    assert_eq!(env["ALERT_WEBHOOK_URL"], "<secret \"r-reloader\" \"ALERT_WEBHOOK_URL\">");
    assert_eq!(env["ALERT_ADDITIONAL_INFO"], "<secret \"alerts\" \"info\">");
    assert_eq!(env["TZ"], "UTC");
    assert_eq!(env["NODE"], "<field \"spec.nodeName\">");
    assert_eq!(env["METRICS_COUNT_BY_NAMESPACE"], "enabled");
    let secret = find(&docs, "Secret", "r-reloader").expect("the chart Secret");
    assert_eq!(secret["data"]["ALERT_SINK"], "c2xhY2s=", "base64 of slack");
}

#[test]
fn read_only_root_file_system_and_security_contexts() {
    let docs = render(
        "reloader: {readOnlyRootFileSystem: true, deployment: {containerSecurityContext: {readOnlyRootFilesystem: false}}}",
    );
    assert_eq!(container(&docs)["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container(&docs)["volumeMounts"][0], json!({ "mountPath": "/tmp/", "name": "tmp-volume" }));
    let docs = render("reloader: {deployment: {containerSecurityContext: null}}");
    assert!(container(&docs)["securityContext"].is_null());
    let pod = &find(&docs, "Deployment", "r-reloader").expect("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65534);
}

#[test]
fn a_reloader_values_file_with_go_only_keys_still_renders() {
    let docs = render(
        &[
            "image: {repository: my/reloader, tag: v9}",
            "global: {imageRegistry: reg.example}",
            "reloader: {deployment: {gomaxprocsOverride: '2', gomemlimitOverride: 100MiB,",
            "  resources: {limits: {cpu: 100m, memory: 512Mi}}},",
            "  service: {port: 9090}, podMonitor: {enabled: true}, netpol: {enabled: true}}",
        ]
        .join("\n"),
    );
    assert_eq!(container(&docs)["image"], "reg.example/my/reloader:v9");
    // As Reloader's chart renders them; a Rust binary reads neither.
    assert_eq!((env(&docs)["GOMAXPROCS"].as_str(), env(&docs)["GOMEMLIMIT"].as_str()), ("2", "100MiB"));
    assert!(find(&docs, "Service", "r-reloader").is_some());
    assert!(find(&docs, "NetworkPolicy", "r-reloader").is_some());
    // Rendered whenever enabled, as Reloader's chart does: `helm template` has no cluster to ask.
    assert!(find(&docs, "PodMonitor", "r-reloader").is_some());
}

/// Issue 39: the chart's pod passes Pod Security "restricted" by default, as the real API
/// server's admission judges it (a server-side dry run of the rendered pod in a namespace that
/// enforces it); the pod without the chart's container security context does not.
#[tokio::test]
async fn the_default_pod_passes_pod_security_restricted() {
    use k8s_openapi::api::core::v1::Pod;
    with_temp_ns("chart-restricted", |client, ns| async move {
        let namespace = format!("{ns}-restricted");
        let labels = json!({ "pod-security.kubernetes.io/enforce": "restricted" });
        support::fixtures::create_namespace(&client, &namespace, labels).await;
        let account: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({ "metadata": { "name": "r-reloader" } })).expect("account JSON");
        kube::Api::namespaced(client.clone(), &namespace)
            .create(&Default::default(), &account)
            .await
            .expect("the chart's ServiceAccount");
        let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &namespace);
        let dry_run = |values: &'static str| {
            let pods = pods.clone();
            async move {
                let docs = render(values);
                let template = &find(&docs, "Deployment", "r-reloader").expect("Deployment")["spec"]["template"];
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": { "name": "reloader", "labels": template["metadata"]["labels"] },
                    "spec": template["spec"],
                }))
                .expect("the rendered pod template is a pod");
                pods.create(&kube::api::PostParams { dry_run: true, ..Default::default() }, &pod).await
            }
        };
        let admitted = dry_run("{}").await;
        assert!(admitted.is_ok(), "the default pod is refused: {admitted:?}");
        let refused = dry_run("reloader: {deployment: {containerSecurityContext: null}}").await;
        let message = refused.expect_err("a pod without the container security context is refused").to_string();
        assert!(message.contains("restricted"), "{message}");
        support::fixtures::delete_namespaces(&client, &[namespace]).await;
    })
    .await;
}

#[test]
fn the_network_policy_admits_the_monitoring_namespaces_and_allows_dns() {
    let docs = render("reloader: {netpol: {enabled: true}}");
    let policy = find(&docs, "NetworkPolicy", "r-reloader").expect("NetworkPolicy");
    let from = &policy["spec"]["ingress"][0]["from"];
    assert_eq!(from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring", "{from}");
    let egress = policy["spec"]["egress"].as_array().expect("egress rules");
    let dns = egress.iter().flat_map(|r| r["ports"].as_array().into_iter().flatten()).filter(|p| p["port"] == 53);
    assert_eq!(dns.count(), 2, "DNS over UDP and TCP: {egress:?}");
    let docs = render("reloader: {netpol: {enabled: true, from: [{podSelector: {matchLabels: {app: prometheus}}}]}}");
    let policy = find(&docs, "NetworkPolicy", "r-reloader").expect("NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app"], "prometheus");
}

/// `helm install` into a test namespace; the release's pods become Ready on the fake nodes, and
/// the controller run locally with the rendered arguments and environment, as the release's
/// ServiceAccount, reloads.
async fn install_and_reload(name: &str, values: &str) {
    with_temp_ns(name, |client, ns| async move {
        let release = ns.clone();
        let label = format!("{}={name}", support::TEST_LABEL);
        // The chart's own value restricts the cluster-wide install to this test's namespace.
        let selector = tempfile(&format!("reloader: {{namespaceSelector: '{label}'}}\n"));
        let (values, selector) = (tempfile(values).display().to_string(), selector.display().to_string());
        helm_in(&ns, &["install", &release, CHART, "--values", &values, "--values", &selector]);
        let fullname = format!("{release}-reloader");
        let rendered = wait_deployment_ready(&client, &ns, &fullname).await;
        let kubeconfig = support::login_as(&client, &ns, &fullname).await;
        create_configmap(&client, &ns, "cm", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "web").auto().env_from_configmap("cm").create(&client, &ns).await;
        let controller = start_as_pod_of(&rendered, &ns, &kubeconfig, &[]).await;
        wait_stored(&controller, 1).await;
        patch_configmap(&client, &ns, "cm", json!({ "data": { "k": "2" } })).await;
        let ctx = Ctx::new(client.clone(), ns.clone(), Strategy::EnvVars);
        ctx.wait_reloaded(Kind::Deployment, "web", Cm, "cm", &cm_hash(&[("k", "2")])).await;
        let refused = controller.refused_calls();
        assert!(refused.is_empty(), "no call refused by the RBAC: {refused:?}");
        controller.stop().await;
        helm_in(&ns, &["uninstall", &release]);
    })
    .await;
}

#[tokio::test]
async fn helm_install_cluster_wide_reloads_with_the_releases_rbac() {
    install_and_reload("chart-global", "{}").await;
}

#[tokio::test]
async fn helm_install_of_a_fleet_reloads_with_the_releases_rbac() {
    install_and_reload("chart-fleet", "reloader: {enableHA: true, deployment: {replicas: 2}, sharding: {shards: 4}}")
        .await;
}

#[test]
fn the_grafana_dashboard_ships_as_a_sidecar_configmap_when_enabled() {
    assert!(render("{}").iter().all(|d| d["metadata"]["name"] != "r-reloader-dashboard"), "off by default");
    let docs = render("grafanaDashboard: {enabled: true, namespace: monitoring}");
    let cm = find(&docs, "ConfigMap", "r-reloader-dashboard").expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(cm["data"]["reloader-fleet.json"].as_str().expect("JSON text"))
        .expect("the shipped dashboard is JSON");
    let file: Value =
        serde_json::from_str(include_str!("../../deployments/grafana/reloader-fleet.json")).expect("JSON");
    assert_eq!(shipped, file);
}

/// The chart's default RBAC is the plain manifest's, whose every rule `tests/manifests.rs`
/// proves needed (taking any one away fails its reload suite) and enough.
#[test]
fn default_rbac_equals_the_manifest_whose_every_rule_is_proven_needed() {
    let manifest: Vec<Value> =
        serde_saphyr::from_multiple(include_str!("../../deployments/kubernetes/manifests/reloader.yaml"))
            .expect("YAML");
    let docs = render("{}");
    for (kind, chart_name, manifest_name) in [
        ("ClusterRole", "r-reloader-role", "reloader-reloader-role"),
        ("Role", "r-reloader-metadata-role", "reloader-reloader-metadata-role"),
    ] {
        let chart = find(&docs, kind, chart_name).expect("chart role");
        let plain = find(&manifest, kind, manifest_name).expect("manifest role");
        let mut plain_rules = rules(plain);
        // The manifest selects namespaces by label in its tests; the chart adds that rule only
        // with reloader.namespaceSelector.
        plain_rules.retain(|r| r != "/namespaces: get,list,watch");
        assert_eq!(rules(chart), plain_rules, "{kind}");
    }
}

#[tokio::test]
async fn helm_install_namespaced_reloads_with_the_releases_role() {
    install_and_reload("chart-namespaced", "reloader: {watchGlobally: false}").await;
}

#[tokio::test]
async fn helm_install_with_argo_rollouts_and_csi_watches_them_with_the_releases_rbac() {
    let client = support::client().await;
    support::crds::install(&client, &[support::crds::ROLLOUT]).await;
    support::crds::install(&client, &support::crds::SECRETS_STORE).await;
    install_and_reload("chart-argo-csi", "reloader: {isArgoRollouts: true, enableCSIIntegration: true}").await;
}
