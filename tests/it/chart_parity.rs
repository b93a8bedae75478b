//! The chart beside Reloader's own chart 2.2.16 (`hack/reloader-chart`): the same values files
//! render the same container, the helm-unittest suites hold those renders, and a switch written
//! as a string, image pull secrets and the release notes behave as there.

use crate::support;

use std::path::PathBuf;
use std::process::Command;

use crate::chart::{CHART, find, helm, render, tempfile, template};
use crate::support::kubeconfig_path;
use serde_json::{Value, json};

/// The values files under `charts/reloader/tests/values/` (`v1-*`: files Reloader's chart 2.2.16
/// accepts; `v2-*`: Reloader v2's, with v2 semantics chosen), by name.
fn values_files(prefix: &str) -> Vec<(String, String)> {
    let dir = PathBuf::from(CHART).join("tests/values");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("the chart's test values")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_prefix(prefix)?.strip_suffix(".yaml")?.to_string();
            Some((stem, std::fs::read_to_string(dir.join(&name)).ok()?))
        })
        .collect();
    files.sort();
    files
}

/// What an image swap must keep: the container's arguments, environment, probes and ports.
fn container_contract(documents: &[Value]) -> Value {
    let deployment = documents.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    json!({
        "args": c["args"].as_array().cloned().unwrap_or_default(),
        "env": c["env"].as_array().cloned().unwrap_or_default(),
        "livenessProbe": c["livenessProbe"]["httpGet"],
        "readinessProbe": c["readinessProbe"]["httpGet"],
        "ports": c["ports"],
    })
}

/// The folder of Reloader's own chart 2.2.16 (from its Go module: `hack/reloader-chart`).
pub(crate) fn reloaders_chart() -> String {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/reloader-chart")).output().expect("run it");
    assert!(out.status.success(), "hack/reloader-chart: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Reloader's own chart 2.2.16 rendered as release
/// `r` in namespace `ops` with `values`.
fn render_reloaders(values: &str) -> Vec<Value> {
    template(&reloaders_chart(), values, &[]).unwrap_or_else(|e| panic!("Reloader's chart refuses {values}: {e}"))
}

/// Issue 43: for every values file, this chart renders the container Reloader's chart 2.2.16
/// renders (arguments, environment, probes, ports), the two charts rendered side by side.
#[test]
fn every_v1_values_file_renders_the_container_reloaders_chart_renders() {
    let files = values_files("v1-");
    assert!(files.len() >= 21, "{} values files", files.len());
    let mut differ = Vec::new();
    for (name, values) in &files {
        let (theirs, ours) = (container_contract(&render_reloaders(values)), container_contract(&render(values)));
        if theirs != ours {
            differ.push(format!("{name}:\n  Reloader's: {theirs}\n  ours:       {ours}"));
        }
    }
    assert!(differ.is_empty(), "renders that differ from Reloader's chart 2.2.16:\n{}", differ.join("\n"));
    // The binary takes every argument Reloader's chart renders.
    for (name, values) in &files {
        let args: Vec<String> = container_contract(&render(values))["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_reloader")).args(&args).arg("--help").output().expect("reloader");
        assert!(out.status.success(), "{name}: {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// What a values file decides beside the container: the objects rendered (kind and name), the
/// Deployment's replicas and history, the pod's labels and annotations, scheduling, pull secrets and the settings the file
/// sets (this chart keeps its restricted security context and resources where the file sets
/// none).
fn pod_settings(documents: &[Value], values: &Value) -> Value {
    let deployment = documents.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let (spec, pod) = (&deployment["spec"], &deployment["spec"]["template"]["spec"]);
    let mut settings = json!({
        "replicas": spec["replicas"],
        "revisionHistoryLimit": spec["revisionHistoryLimit"],
        "selector": spec["selector"],
        "pod labels": versions_blanked(&spec["template"]["metadata"]["labels"]),
        "pod annotations": spec["template"]["metadata"]["annotations"],
        "serviceAccountName": pod["serviceAccountName"],
    });
    for key in [
        "imagePullSecrets",
        "hostUsers",
        "nodeSelector",
        "affinity",
        "tolerations",
        "topologySpreadConstraints",
        "priorityClassName",
        "runtimeClassName",
        "schedulerName",
        "dnsConfig",
    ] {
        settings[key] = pod[key].clone();
    }
    let mut objects: Vec<String> = documents
        .iter()
        .map(|d| {
            format!("{} {}", d["kind"].as_str().unwrap_or_default(), d["metadata"]["name"].as_str().unwrap_or_default())
        })
        .collect();
    objects.sort();
    settings["objects"] = json!(objects);
    let set = &values["reloader"]["deployment"];
    if !set["securityContext"].is_null() {
        settings["securityContext"] = pod["securityContext"].clone();
    }
    if !set["resources"].is_null() {
        settings["resources"] = pod["containers"][0]["resources"].clone();
    }
    settings
}

/// Labels whose value is a chart's or an app's version (each chart names its own), blanked.
fn versions_blanked(labels: &Value) -> Value {
    let mut labels = labels.clone();
    for key in ["chart", "helm.sh/chart", "app.kubernetes.io/version", "version"] {
        if let Some(value) = labels.get_mut(key) {
            *value = json!("<version>");
        }
    }
    labels
}

/// Issue 53: for every values file, this chart renders the pod settings Reloader's chart 2.2.16
/// renders (`v1-pod-settings.yaml` sets each of them, labels and annotations with templates).
#[test]
fn every_v1_values_file_renders_the_pod_settings_reloaders_chart_renders() {
    let mut differ = Vec::new();
    for (name, text) in values_files("v1-") {
        let values: Value = serde_saphyr::from_str(&text).unwrap_or(Value::Null);
        let (theirs, ours) = (pod_settings(&render_reloaders(&text), &values), pod_settings(&render(&text), &values));
        for key in theirs.as_object().into_iter().flatten().map(|(k, _)| k) {
            if theirs[key] != ours[key] {
                differ.push(format!("{name}: {key}\n  Reloader's: {}\n  ours:       {}", theirs[key], ours[key]));
            }
        }
    }
    assert!(differ.is_empty(), "pod settings that differ from Reloader's chart 2.2.16:\n{}", differ.join("\n"));
}

const V1_SUITE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/reloader/tests/reloader_v1_test.yaml");

/// The helm-unittest suite of the v1 values files: what Reloader's chart 2.2.16 renders for
/// each, as assertions on this chart. Generated from Reloader's chart; `REGENERATE_GOLDEN=1
/// cargo test --test it chart_parity::the_helm_unittest_suite` writes it again (review the diff).
fn v1_suite() -> String {
    let mut out = String::from(
        "# Generated by tests/it/chart.rs from Reloader's own chart 2.2.16 (hack/reloader-chart): for each\n\
         # values file, the container it renders. REGENERATE_GOLDEN=1 cargo test --test it chart_parity::the_helm_unittest_suite\n\
         suite: renders the container Reloader's chart 2.2.16 renders\ntemplates:\n  - deployment.yaml\n\
         release:\n  name: r\n  namespace: ops\ntests:\n",
    );
    for (name, values) in values_files("v1-") {
        let contract = container_contract(&render_reloaders(&values));
        out.push_str(&format!("  - it: {name}\n    values:\n      - values/v1-{name}.yaml\n    asserts:\n"));
        for (path, key) in [
            ("spec.template.spec.containers[0].args", "args"),
            ("spec.template.spec.containers[0].env", "env"),
            ("spec.template.spec.containers[0].livenessProbe.httpGet", "livenessProbe"),
            ("spec.template.spec.containers[0].readinessProbe.httpGet", "readinessProbe"),
            ("spec.template.spec.containers[0].ports", "ports"),
        ] {
            let value = match (key, &contract[key]) {
                // helm-unittest reads no args as null.
                ("args", Value::Array(a)) if a.is_empty() => Value::Null,
                (_, v) => v.clone(),
            };
            out.push_str(&format!("      - equal:\n          path: {path}\n          value: {value}\n"));
        }
    }
    out
}

#[test]
fn the_helm_unittest_suite_holds_what_reloaders_chart_renders() {
    let generated = v1_suite();
    if std::env::var_os("REGENERATE_GOLDEN").is_some() {
        std::fs::write(V1_SUITE, &generated).expect("write the suite");
    }
    let committed = std::fs::read_to_string(V1_SUITE).unwrap_or_default();
    assert!(committed == generated, "{V1_SUITE} is not what Reloader's chart renders; regenerate it (see its header)");
}

/// helm-unittest (built from its Go module: `hack/tools helm-unittest`) runs the chart's
/// suites: the v1 renders above and the v2 semantics.
#[test]
fn the_charts_helm_unittest_suites_pass() {
    let out = Command::new(support::tool("helm-unittest")).args(["--color=false", CHART]).output().expect("run it");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm-unittest:\n{text}");
    assert!(text.contains("Test Suites:") && !text.contains("FAIL"), "{text}");
}

/// `helm template` of `chart` with `values`, the API groups of the monitoring, OpenShift, Argo
/// and VPA objects declared served; the documents, or helm's error.
fn template_with_crds(chart: &str, values: &str) -> Result<Vec<Value>, String> {
    template(
        chart,
        values,
        &["monitoring.coreos.com/v1", "apps.openshift.io/v1", "argoproj.io/v1alpha1", "autoscaling.k8s.io/v1"],
    )
}

/// The kinds of the rendered objects, sorted, and the container: what a values file decides.
fn objects_and_container(docs: &[Value]) -> (Vec<String>, Value) {
    let mut kinds: Vec<String> = docs.iter().filter_map(|d| d["kind"].as_str().map(str::to_string)).collect();
    kinds.sort();
    (kinds, container_contract(docs))
}

/// The chart's on/off switches (`"type": ["boolean", "string"]` in its schema), as dotted paths.
fn switches() -> Vec<String> {
    fn walk(node: &Value, path: &str, out: &mut Vec<String>) {
        if node["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "boolean")) {
            out.push(path.trim_start_matches('.').to_string());
        }
        for (key, child) in node["properties"].as_object().into_iter().flatten() {
            walk(child, &format!("{path}.{key}"), out);
        }
    }
    let schema: Value = serde_json::from_str(include_str!("../../charts/reloader/values.schema.json")).expect("JSON");
    let mut out = Vec::new();
    walk(&schema, "", &mut out);
    out
}

/// `path` (dotted) set to `value`, as a values file.
fn values_at(path: &str, value: &str) -> String {
    let mut yaml = serde_json::to_string(value).expect("a JSON string is YAML");
    for key in path.rsplit('.') {
        yaml = format!("{{{key}: {yaml}}}");
    }
    yaml
}

/// Issue 53: a switch written as a string (`enabled: "${enable_service_monitor}"` from a
/// template that was not filled in, or `"false"`) renders what Reloader's chart 2.2.16 renders
/// for it, objects and container; where that chart refuses a string, this one does too and says
/// what to write. The chart's own switches refuse strings the same way.
#[test]
fn a_switch_written_as_a_string_renders_as_reloaders_chart_renders_it() {
    let theirs = reloaders_chart();
    let reloaders_values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(format!("{theirs}/values.yaml")).expect("values"))
            .expect("YAML");
    let switches = switches();
    assert!(switches.len() >= 25, "{switches:?}");
    let mut differ = Vec::new();
    for path in &switches {
        let known_to_reloader = path.split('.').try_fold(&reloaders_values, |v, k| v.get(k)).is_some();
        for value in ["true", "false", "${enable_it}", ""] {
            let values = values_at(path, value);
            let ours = template_with_crds(CHART, &values);
            let reloaders = if known_to_reloader { template_with_crds(&theirs, &values) } else { Err(String::new()) };
            match (reloaders, ours) {
                (Ok(r), Ok(o)) if objects_and_container(&r) == objects_and_container(&o) => {}
                (Ok(r), Ok(o)) => differ.push(format!(
                    "{values}:\n  Reloader's: {:?}\n  ours:       {:?}",
                    objects_and_container(&r),
                    objects_and_container(&o)
                )),
                (Ok(_), Err(e)) => differ.push(format!("{values}: Reloader's chart renders it, ours refuses: {e}")),
                (Err(_), Ok(_)) => differ.push(format!("{values}: ours renders a string Reloader's chart refuses")),
                (Err(_), Err(e)) if e.contains(&format!("{path} is the string")) && e.contains("without quotes") => {}
                (Err(_), Err(e)) => differ.push(format!("{values}: refused without saying what to write: {e}")),
            }
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Issue 53: `global.imagePullSecrets` (names or `{name: ...}`, as Reloader's chart takes them)
/// and `reloader.deployment.imagePullSecrets` name each secret once, on the pod and on the
/// ServiceAccount.
#[test]
fn each_image_pull_secret_is_rendered_once() {
    let docs = render(
        "global: {imagePullSecrets: [regcred, {name: mirror}]}\nreloader: {deployment: {imagePullSecrets: [{name: regcred}, {name: own}]}}",
    );
    let pod = &find(&docs, "Deployment", "r-reloader").expect("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}, {"name": "mirror"}, {"name": "own"}]));
    let account = find(&docs, "ServiceAccount", "r-reloader").expect("ServiceAccount");
    assert_eq!(account["imagePullSecrets"], pod["imagePullSecrets"]);
    let docs = render("global: {imagePullSecrets: [regcred]}");
    let theirs = render_reloaders("global: {imagePullSecrets: [regcred]}");
    let pull = |docs: &[Value]| {
        find(docs, "Deployment", "r-reloader").expect("Deployment")["spec"]["template"]["spec"]["imagePullSecrets"]
            .clone()
    };
    assert_eq!(pull(&docs), pull(&theirs));
}

/// Issue 53: a switch Reloader's chart reads as on because it is a non-empty string is named
/// in the release notes, with what to write instead.
#[test]
fn the_release_notes_name_a_switch_written_as_a_string() {
    let out = Command::new(helm())
        .args(["install", "--dry-run=client", "r", CHART, "--namespace", "ops", "--kubeconfig"])
        .arg(kubeconfig_path())
        .arg("--values")
        .arg(tempfile("reloader: {ignoreSecrets: 'false', enableHA: true}"))
        .output()
        .expect("helm install --dry-run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let notes = text.split("NOTES:").nth(1).expect("release notes");
    assert!(
        notes.contains("reloader.ignoreSecrets is the string \"false\", read as on")
            && notes.contains("without quotes"),
        "{notes}"
    );
    assert!(!notes.contains("reloader.enableHA is the string"), "{notes}");
}
