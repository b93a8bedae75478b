//! `reloader explain` and `/explain` on the real API server: each rule outcome, text and JSON;
//! the command and the live store agree; and a change rolls exactly the workloads that
//! `explain` said it would.

use crate::support;

use crate::support::explain::{explain, explain_json};
use crate::support::fixtures::{
    Kind, Workload, annotate_configmap, cm_hash, create_configmap, create_secret, patch_configmap,
};
use crate::support::scenario::{Ctx, scenario, wait_stored};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::ConfigMap;
use serde_json::{Value, json};

/// The pair for `resource` (a workload report) or `workload` (a resource report).
fn pair<'a>(report: &'a Value, other: &str) -> &'a Value {
    report["pairs"]
        .as_array()
        .and_then(|pairs| pairs.iter().find(|p| p["resource"] == other || p["workload"] == other))
        .unwrap_or_else(|| panic!("no pair for {other} in {report:#}"))
}

fn verdict(report: &Value, other: &str) -> (bool, String) {
    let p = pair(report, other);
    (p["reloads"] == true, p["rule"].as_str().unwrap_or_default().to_string())
}

/// The pairs without the reason for an absent resource (only the command can tell a resource
/// the label selector leaves out from one that does not exist), and hashes to the 12 hex digits
/// the admin port shows (the command, run with the user's own credentials, shows them whole).
fn decided(report: &Value) -> Value {
    let mut pairs = report["pairs"].clone();
    for pair in pairs.as_array_mut().into_iter().flatten() {
        if pair["rule"] == "resource-absent" {
            pair["reason"] = Value::Null;
        }
        for hash in ["current_hash", "recorded_hash"] {
            if let Some(short) = pair[hash].as_str().map(|h| h.chars().take(12).collect::<String>()) {
                pair[hash] = Value::String(short);
            }
        }
    }
    pairs
}

/// A namespace holding one workload per rule outcome, all using ConfigMap `app` or the others.
async fn objects(ctx: &Ctx) {
    // `listed` names a ConfigMap that does not exist.
    ctx.expect_lint_findings();
    let (c, ns) = (&ctx.client, ctx.ns.as_str());
    create_configmap(c, ns, "app", &[("k", "1")]).await;
    create_configmap(c, ns, "matched", &[("k", "1")]).await;
    create_configmap(c, ns, "ignored", &[("k", "1")]).await;
    create_secret(c, ns, "db", &[("password", "1")]).await;
    annotate_configmap(c, ns, "matched", "reloader.stakater.com/match", "true").await;
    annotate_configmap(c, ns, "ignored", "reloader.stakater.com/ignore", "true").await;
    let uses = |w: Workload, cm: &str| w.env_from_configmap(cm);
    let d = |name: &str| Workload::new(Kind::Deployment, name);
    uses(d("typed").annotate("configmap.reloader.stakater.com/auto", "true"), "app").create(c, ns).await;
    d("listed")
        .annotate("configmap.reloader.stakater.com/reload", "app,not-there")
        .container(json!({ "name": "app" }))
        .create(c, ns)
        .await;
    d("searching")
        .annotate("reloader.stakater.com/search", "true")
        .container(json!({ "name": "app", "envFrom": [{ "configMapRef": { "name": "app" } }, { "configMapRef": { "name": "matched" } }] }))
        .create(c, ns)
        .await;
    uses(d("ignoring").auto(), "ignored").create(c, ns).await;
    uses(d("excluding").auto().annotate("configmaps.exclude.reloader.stakater.com/reload", "app"), "app")
        .create(c, ns)
        .await;
    uses(d("plain"), "app").create(c, ns).await;
    d("secretive")
        .annotate("configmap.reloader.stakater.com/auto", "true")
        .container(json!({ "name": "app", "envFrom": [{ "secretRef": { "name": "db" } }] }))
        .create(c, ns)
        .await;
    Workload::new(Kind::CronJob, "nightly").auto().env_from_configmap("app").create(c, ns).await;
}

#[tokio::test]
async fn explain_names_the_rule_for_each_outcome_and_a_change_rolls_exactly_what_it_said() {
    scenario("explain", Strategy::EnvVars, &[], |ctx, controller| async move {
        objects(&ctx).await;
        let ns = ctx.ns.as_str();
        wait_stored(&controller, 8).await;

        // Every annotation rule, from the workload's side.
        let cases = [
            ("typed", "app", true, "typed-auto"),
            ("listed", "app", true, "explicit-list"),
            ("listed", "not-there", false, "resource-absent"),
            ("searching", "matched", true, "search-match"),
            ("searching", "app", false, "search-without-match"),
            ("ignoring", "ignored", false, "resource-ignored"),
            ("excluding", "app", false, "excluded"),
            ("plain", "app", false, "no-annotation"),
            ("secretive", "db", false, "no-annotation"),
        ];
        for (workload, resource, reloads, rule) in cases {
            let report = explain_json(&[&format!("deployment/{workload}"), "-n", ns]).await;
            assert_eq!(verdict(&report, resource), (reloads, rule.to_string()), "{workload} / {resource}: {report:#}");
        }
        let typed = explain_json(&["deploy/typed", "-n", ns]).await;
        assert_eq!(pair(&typed, "app")["writes"], "env var STAKATER_APP_CONFIGMAP on container app");
        assert_eq!(pair(&typed, "app")["current_hash"], cm_hash(&[("k", "1")]));

        // From the resource's side, as text: who would roll and who would not, and why.
        let text = explain(&["configmap/app", "-n", ns]).await;
        let (yes, no) = text.split_once("would NOT reload:").unwrap_or_else(|| panic!("two groups expected:\n{text}"));
        for name in ["Deployment typed  [typed-auto]", "Deployment listed  [explicit-list]", "CronJob nightly  [auto]"]
        {
            assert!(yes.contains(name), "{name} should reload:\n{text}");
        }
        for name in [
            "Deployment excluding  [excluded]",
            "Deployment plain  [no-annotation]",
            "Deployment searching  [search-without-match]",
        ] {
            assert!(no.contains(name), "{name} should not reload:\n{text}");
        }
        assert!(text.contains("writes env var STAKATER_APP_CONFIGMAP on container app; records nothing yet"), "{text}");

        // The live store answers the same, with no API call.
        for workload in ["typed", "listed", "searching", "ignoring", "excluding", "plain", "secretive"] {
            let cli = explain_json(&[&format!("deployment/{workload}"), "-n", ns]).await;
            let live: Value =
                serde_json::from_str(&controller.get(&format!("/explain/{ns}/deployment/{workload}")).await)
                    .expect("/explain answers JSON");
            assert_eq!(decided(&live), decided(&cli), "/explain and the command disagree on {workload}");
        }
        let live = controller.get(&format!("/explain/{ns}/cm/app?output=text")).await;
        assert_eq!(
            live.lines().filter(|l| l.contains("  [")).count(),
            text.lines().filter(|l| l.contains("  [")).count(),
            "{live}\n{text}"
        );

        // The engine does what explain said: change `app`, then every workload it named as
        // reloading records the new hash and no other does.
        patch_configmap(&ctx.client, ns, "app", json!({ "data": { "k": "2" } })).await;
        let hash = cm_hash(&[("k", "2")]);
        for workload in ["typed", "listed"] {
            ctx.wait_reloaded(Kind::Deployment, workload, ConfigMap, "app", &hash).await;
        }
        for workload in ["searching", "excluding", "plain"] {
            ctx.assert_not_reloaded(Kind::Deployment, workload, ConfigMap, "app", &hash).await;
        }
        let after = explain_json(&["cm/app", "-n", ns]).await;
        assert_eq!(pair(&after, "typed")["recorded_hash"], hash.as_str(), "explain shows the recorded hash");
        controller
    })
    .await;
}

#[tokio::test]
async fn explain_says_when_a_flag_decides_namespace_filter_label_selector_and_ignored_kind() {
    scenario("explain-flags", Strategy::EnvVars, &[], |ctx, controller| async move {
        objects(&ctx).await;
        let ns = ctx.ns.as_str();

        let ignored_ns = format!("--namespaces-to-ignore={ns}");
        let report = explain_json(&["deployment/typed", "-n", ns, &ignored_ns]).await;
        assert_eq!(verdict(&report, "app"), (false, "namespace-not-selected".into()));
        assert_eq!(report["serving"]["not_selected"], "in --namespaces-to-ignore");

        let report = explain_json(&["deployment/typed", "-n", ns, "--resource-label-selector=team=a"]).await;
        assert_eq!(verdict(&report, "app"), (false, "resource-absent".into()));
        let reason = pair(&report, "app")["reason"].as_str().unwrap_or_default().to_string();
        assert!(reason.contains("does not match --resource-label-selector team=a"), "{reason}");

        let report = explain_json(&["cronjob/nightly", "-n", ns, "--ignored-workload-types=cronjobs"]).await;
        assert_eq!(report["found"], false);
        assert!(report["note"].as_str().is_some_and(|n| n.contains("--ignored-workload-types")), "{report:#}");
        let text = explain(&["cronjob/nightly", "-n", ns, "--ignored-workload-types=cronjobs"]).await;
        assert!(text.contains("CronJob is not rolled by this controller"), "{text}");

        let report = explain_json(&["deployment/typed", "-n", ns, "--resources-to-ignore=configmaps"]).await;
        assert_eq!(verdict(&report, "app"), (false, "ignored-resource-type".into()));

        // Bad input is an error naming it.
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
            .args(["explain", "pod/x", "-n", ns])
            .env("KUBECONFIG", support::kubeconfig_path())
            .output()
            .await
            .expect("run reloader explain");
        assert!(!output.status.success());
        assert!(String::from_utf8_lossy(&output.stderr).contains("unknown kind \"pod\""), "{output:?}");
        controller
    })
    .await;
}
