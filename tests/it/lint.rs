//! Annotation lint on the real API server: each mistake is one Warning Event on its object,
//! naming the fix; a correct object raises none; an unrelated update raises nothing again; a
//! missing listed ConfigMap is re-checked when it appears; the lint can be turned off.
//!
//! Every other scenario test ends by checking that the lint found nothing in its objects
//! (`support::scenario`): the reload tests' fixtures are the "correct objects".

use crate::support::fixtures::{Kind, KindExt, Workload, annotate_configmap, create_configmap, create_secret};
use crate::support::scenario::{lint_findings, scenario, wait_stored};
use crate::support::wait_for;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use reloader_fleet::reload::Strategy;
use serde_json::json;

const REASON: &str = reloader_fleet::reload::lint::REASON;

async fn lint_events(events: &Api<Event>, object: &str) -> Vec<Event> {
    let selector = format!("involvedObject.name={object},reason={REASON},type=Warning");
    events.list(&ListParams::default().fields(&selector)).await.map(|l| l.items).unwrap_or_default()
}

#[tokio::test]
async fn each_mistake_is_one_warning_event_that_names_the_fix_and_correct_objects_raise_none() {
    scenario("lint", Strategy::EnvVars, &[], |ctx, controller| async move {
        ctx.expect_lint_findings();
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "app", &[("k", "1")]).await;
        for (name, key, value) in [
            ("searching", "reloader.stakater.com/search", "true"),
            ("auto-cm", "reloader.stakater.com/auto", "true"),
            ("fine", "reloader.stakater.com/match", "true"),
        ] {
            create_configmap(c, ns, name, &[("k", "1")]).await;
            annotate_configmap(c, ns, name, key, value).await;
        }
        create_secret(c, ns, "exact", &[("k", "1")]).await;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.clone(), ns);
        let patch = json!({ "metadata": { "annotations": { "reloader.stakater.com/ignore": "True" } } });
        secrets
            .patch("exact", &Default::default(), &kube::api::Patch::Merge(&patch))
            .await
            .expect("annotate the Secret");
        let d = |name: &str| Workload::new(Kind::Deployment, name).env_from_configmap("app");
        d("misspelt").annotate("reloader.stakter.com/auto", "true").create(c, ns).await;
        d("matching").annotate("reloader.stakater.com/match", "true").create(c, ns).await;
        d("both").auto().annotate("reloader.stakater.com/search", "true").create(c, ns).await;
        d("yes").annotate("reloader.stakater.com/auto", "yes").create(c, ns).await;
        d("listing").annotate("configmap.reloader.stakater.com/reload", "later").create(c, ns).await;
        d("pattern").annotate("configmap.reloader.stakater.com/reload", "(unclosed").create(c, ns).await;
        d("ignoring").auto().annotate("reloader.stakater.com/ignore", "true").create(c, ns).await;
        d("good").auto().create(c, ns).await;
        wait_stored(&controller, 8).await;

        let expected = [
            ("misspelt", "did you mean \"reloader.stakater.com/auto\""),
            ("matching", "belongs on a ConfigMap or Secret, not on a workload"),
            ("both", "search does nothing; remove one"),
            ("yes", "\"yes\", which is not a boolean and counts as false: use \"true\" or \"false\""),
            ("listing", "names ConfigMap \"later\", which does not exist in namespace"),
            ("pattern", "is not a valid regular expression"),
            ("ignoring", "does nothing on a workload"),
            ("searching", "belongs on the workload: set \"reloader.stakater.com/match\": \"true\" on this ConfigMap"),
            ("auto-cm", "is read on workloads (Deployments, StatefulSets, ...), not on a ConfigMap"),
            ("exact", "only exactly \"true\" counts"),
        ];
        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        for (object, fix) in expected {
            let found = wait_for(&format!("a lint Event on {object}"), || async {
                let list = lint_events(&events, object).await;
                (!list.is_empty()).then_some(list)
            })
            .await;
            assert_eq!(found.len(), 1, "one Event on {object}: {found:?}");
            let note = found[0].message.clone().unwrap_or_default();
            assert!(note.contains(fix), "the Event on {object} names the fix ({fix}): {note}");
        }
        assert_eq!(lint_findings(&controller).await, expected.len() as f64);
        let missing = controller.metric("reloader_annotation_lint_findings_total{finding=\"absent-in-list\"}").await;
        assert_eq!(missing, 1.0);
        for object in ["good", "app", "fine"] {
            assert!(lint_events(&events, object).await.is_empty(), "no lint Event on the correct {object}");
        }

        // Updates that leave the annotations alone raise nothing again; the missing ConfigMap,
        // once created, resolves its finding.
        let api = Kind::Deployment.api(c, ns);
        let label = json!({ "metadata": { "labels": { "touched": "yes" } } });
        api.patch("misspelt", &Default::default(), &kube::api::Patch::Merge(&label)).await.expect("label");
        create_configmap(c, ns, "later", &[("k", "1")]).await;
        wait_for("the listing finding to be resolved", || async {
            let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
            log.lines().any(|l| l.contains("annotation lint: fixed") && l.contains("listing")).then_some(())
        })
        .await;
        assert_eq!(lint_findings(&controller).await, expected.len() as f64, "nothing reported twice");
        assert_eq!(lint_events(&events, "misspelt").await.len(), 1);
        controller
    })
    .await;
}

#[tokio::test]
async fn annotation_lint_false_turns_the_lint_off() {
    scenario("lint-off", Strategy::EnvVars, &["--annotation-lint=false"], |ctx, controller| async move {
        let (c, ns) = (&ctx.client, ctx.ns.as_str());
        create_configmap(c, ns, "app", &[("k", "1")]).await;
        Workload::new(Kind::Deployment, "misspelt")
            .annotate("reloader.stakter.com/auto", "true")
            .env_from_configmap("app")
            .create(c, ns)
            .await;
        wait_stored(&controller, 1).await;
        let metrics = controller.metrics().await;
        assert!(!metrics.contains("reloader_annotation_lint"), "no lint series when it is off");
        controller
    })
    .await;
}
