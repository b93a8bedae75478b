//! Reloader's annotation rules and reference methods, proven on the real API server for
//! Deployments, DaemonSets and StatefulSets and both strategies.
//!
//! Negative checks use a sentinel: a workload that does reload for the same change. The
//! engine handles one change in one pass over its candidates, so once the sentinel records
//! the new hash every other candidate has been decided.

use crate::support::fixtures::{
    ALL_KINDS, Kind, Workload, annotate_configmap, cm_hash, create_configmap, create_secret, generation,
    patch_configmap, patch_secret, recorded_annotation, recorded_env, secret_hash,
};
use crate::support::scenario::{scenario, wait_stored};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap, Secret};
use serde_json::json;

const STRATEGIES: [Strategy; 2] = [Strategy::EnvVars, Strategy::Annotations];

#[tokio::test]
async fn every_workload_kind_reloads_on_configmap_and_secret_changes() {
    for strategy in STRATEGIES {
        scenario("kinds", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("mode", "a")]).await;
            create_secret(c, ns, "app-secret", &[("password", "a")]).await;
            for kind in ALL_KINDS {
                Workload::new(kind, &format!("{kind:?}").to_lowercase())
                    .auto()
                    .container(json!({
                        "name": "app",
                        "envFrom": [{ "configMapRef": { "name": "app-config" } }],
                        "volumeMounts": [{ "name": "secret", "mountPath": "/secret" }]
                    }))
                    .volume(json!({ "name": "secret", "secret": { "secretName": "app-secret" } }))
                    .create(c, ns)
                    .await;
            }
            wait_stored(&controller, 3).await;

            patch_configmap(c, ns, "app-config", json!({ "data": { "mode": "b" } })).await;
            let cm = cm_hash(&[("mode", "b")]);
            for kind in ALL_KINDS {
                ctx.wait_reloaded(kind, &format!("{kind:?}").to_lowercase(), ConfigMap, "app-config", &cm).await;
            }
            patch_secret(c, ns, "app-secret", json!({ "stringData": { "password": "b" } })).await;
            let secret = secret_hash(&[("password", "b")]);
            for kind in ALL_KINDS {
                ctx.wait_reloaded(kind, &format!("{kind:?}").to_lowercase(), Secret, "app-secret", &secret).await;
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn annotation_rules_decide_who_reloads_on_one_change() {
    for strategy in STRATEGIES {
        scenario("rules", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "app-config", &[("v", "1")]).await;
            annotate_configmap(c, ns, "app-config", "reloader.stakater.com/match", "true").await;
            // What the lists name exists (a list naming nothing would be a lint finding).
            create_configmap(c, ns, "other", &[("v", "1")]).await;
            create_secret(c, ns, "app-config", &[("v", "1")]).await;
            let uses = |w: Workload| w.env_from_configmap("app-config");
            let d = |name: &str| Workload::new(Kind::Deployment, name);
            let workloads = [
                // Should reload:
                uses(d("auto")).auto(),
                uses(d("typed-auto")).annotate("configmap.reloader.stakater.com/auto", "true"),
                d("explicit-regex")
                    .annotate("configmap.reloader.stakater.com/reload", "other, app-.*")
                    .container(json!({ "name": "first" })),
                uses(d("search")).annotate("reloader.stakater.com/search", "true"),
                uses(d("template-auto")).annotate_template("reloader.stakater.com/auto", "true"),
                uses(d("auto-and-explicit")).auto().annotate("configmap.reloader.stakater.com/reload", "app-config"),
                // Should not reload:
                uses(d("secret-typed-auto")).annotate("secret.reloader.stakater.com/auto", "true"),
                d("explicit-other")
                    .annotate("configmap.reloader.stakater.com/reload", "other")
                    .container(json!({ "name": "first" })),
                uses(d("excluded")).auto().annotate("configmaps.exclude.reloader.stakater.com/reload", "x, app-config"),
                uses(d("auto-false")).annotate("reloader.stakater.com/auto", "false"),
                uses(d("no-annotation")),
                uses(d("metadata-blocks-template"))
                    .annotate("reloader.stakater.com/auto", "false")
                    .annotate_template("reloader.stakater.com/auto", "true"),
                d("auto-without-reference").auto().container(json!({ "name": "first" })),
                uses(d("template-secret-list")).annotate_template("secret.reloader.stakater.com/reload", "app-config"),
            ];
            for w in &workloads {
                w.create(c, ns).await;
            }
            wait_stored(&controller, workloads.len()).await;

            patch_configmap(c, ns, "app-config", json!({ "data": { "v": "2" } })).await;
            let hash = cm_hash(&[("v", "2")]);
            for name in ["auto", "typed-auto", "explicit-regex", "search", "template-auto", "auto-and-explicit"] {
                ctx.wait_reloaded(Kind::Deployment, name, ConfigMap, "app-config", &hash).await;
            }
            for name in [
                "secret-typed-auto",
                "explicit-other",
                "excluded",
                "auto-false",
                "no-annotation",
                "metadata-blocks-template",
                "auto-without-reference",
                "template-secret-list",
            ] {
                ctx.assert_not_reloaded(Kind::Deployment, name, ConfigMap, "app-config", &hash).await;
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn every_reference_method_is_recognised() {
    for strategy in STRATEGIES {
        scenario("refs", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            create_secret(c, ns, "sec", &[("k", "1")]).await;
            let d = |name: &str| Workload::new(Kind::Deployment, name).auto();
            let workloads = [
                d("value-from-cm").container(json!({ "name": "app", "env": [
                    { "name": "K", "valueFrom": { "configMapKeyRef": { "name": "cm", "key": "k" } } } ] })),
                d("value-from-secret").container(json!({ "name": "app", "env": [
                    { "name": "K", "valueFrom": { "secretKeyRef": { "name": "sec", "key": "k" } } } ] })),
                d("projected").container(json!({ "name": "app", "volumeMounts": [{ "name": "p", "mountPath": "/p" }] }))
                    .volume(json!({ "name": "p", "projected": { "sources": [
                        { "configMap": { "name": "cm" } }, { "secret": { "name": "sec" } } ] } })),
                d("init-env-from").container(json!({ "name": "main" }))
                    .init_container(json!({ "name": "init", "envFrom": [{ "configMapRef": { "name": "cm" } }, { "secretRef": { "name": "sec" } }] })),
                d("init-volume").container(json!({ "name": "main" }))
                    .init_container(json!({ "name": "init", "volumeMounts": [{ "name": "s", "mountPath": "/s" }] }))
                    .volume(json!({ "name": "s", "secret": { "secretName": "sec" } })),
                d("cm-volume").container(json!({ "name": "app", "volumeMounts": [{ "name": "c", "mountPath": "/c" }] }))
                    .volume(json!({ "name": "c", "configMap": { "name": "cm" } })),
            ];
            for w in &workloads {
                w.create(c, ns).await;
            }
            wait_stored(&controller, workloads.len()).await;

            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            let cm = cm_hash(&[("k", "2")]);
            for name in ["value-from-cm", "projected", "init-env-from", "cm-volume"] {
                ctx.wait_reloaded(Kind::Deployment, name, ConfigMap, "cm", &cm).await;
            }
            patch_secret(c, ns, "sec", json!({ "stringData": { "k": "2" } })).await;
            let sec = secret_hash(&[("k", "2")]);
            for name in ["value-from-secret", "projected", "init-env-from", "init-volume"] {
                ctx.wait_reloaded(Kind::Deployment, name, Secret, "sec", &sec).await;
            }
            if ctx.strategy == Strategy::EnvVars {
                // An init container's use is recorded on the first regular container.
                let r = recorded_env(c, ns, Kind::Deployment, "init-volume", Secret, "sec").await.expect("recorded");
                assert_eq!(r.container, "main");
            }
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn only_the_container_using_the_resource_records_it() {
    for strategy in STRATEGIES {
        scenario("containers", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            let mut many = Workload::new(Kind::Deployment, "twenty").auto();
            for i in 0..20 {
                many = if i == 13 {
                    many.container(
                        json!({ "name": format!("c{i}"), "volumeMounts": [{ "name": "cfg", "mountPath": "/cfg" }] }),
                    )
                } else {
                    many.container(json!({ "name": format!("c{i}") }))
                };
            }
            many.volume(json!({ "name": "cfg", "configMap": { "name": "cm" } })).create(c, ns).await;
            Workload::new(Kind::Deployment, "explicit-first")
                .annotate("configmap.reloader.stakater.com/reload", "cm")
                .container(json!({ "name": "a" }))
                .container(json!({ "name": "b" }))
                .create(c, ns)
                .await;
            wait_stored(&controller, 2).await;

            patch_configmap(c, ns, "cm", json!({ "data": { "k": "2" } })).await;
            let hash = cm_hash(&[("k", "2")]);
            ctx.wait_reloaded(Kind::Deployment, "twenty", ConfigMap, "cm", &hash).await;
            ctx.wait_reloaded(Kind::Deployment, "explicit-first", ConfigMap, "cm", &hash).await;
            let container = |name: &'static str| {
                let ctx = ctx.clone();
                async move {
                    match ctx.strategy {
                        Strategy::EnvVars => {
                            recorded_env(&ctx.client, &ctx.ns, Kind::Deployment, name, ConfigMap, "cm")
                                .await
                                .map(|r| r.container)
                                .unwrap_or_default()
                        }
                        Strategy::Annotations => recorded_annotation(&ctx.client, &ctx.ns, Kind::Deployment, name)
                            .await
                            .and_then(|s| s["containerRefs"][0].as_str().map(str::to_string))
                            .unwrap_or_default(),
                    }
                }
            };
            assert_eq!(container("twenty").await, "c13", "the mounting container records the hash");
            assert_eq!(
                container("explicit-first").await,
                "a",
                "an explicit list without a reference takes the first container"
            );
            controller
        })
        .await;
    }
}

#[tokio::test]
async fn changes_that_are_not_data_changes_roll_nothing() {
    for strategy in STRATEGIES {
        scenario("no-data-change", strategy, &[], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "cm", &[("k", "1")]).await;
            create_configmap(c, ns, "ignored", &[("k", "1")]).await;
            create_configmap(c, ns, "no-match", &[("k", "1")]).await;
            create_configmap(c, ns, "sentinel", &[("k", "1")]).await;
            for kind in ALL_KINDS {
                Workload::new(kind, "web").auto().env_from_configmap("cm").create(c, ns).await;
            }
            Workload::new(Kind::Deployment, "uses-ignored").auto().env_from_configmap("ignored").create(c, ns).await;
            Workload::new(Kind::Deployment, "searcher")
                .annotate("reloader.stakater.com/search", "true")
                .env_from_configmap("no-match")
                .create(c, ns)
                .await;
            Workload::new(Kind::Deployment, "canary").auto().env_from_configmap("sentinel").create(c, ns).await;
            wait_stored(&controller, 6).await;
            let mut before = Vec::new();
            for kind in ALL_KINDS {
                before.push(generation(c, ns, kind, "web").await);
            }

            // Labels and annotations are not data; `ignore` and search-without-match never reload.
            patch_configmap(
                c,
                ns,
                "cm",
                json!({ "metadata": { "labels": { "new": "label" }, "annotations": { "x": "y" } } }),
            )
            .await;
            annotate_configmap(c, ns, "ignored", "reloader.stakater.com/ignore", "true").await;
            patch_configmap(c, ns, "ignored", json!({ "data": { "k": "2" } })).await;
            patch_configmap(c, ns, "no-match", json!({ "data": { "k": "2" } })).await;
            patch_configmap(c, ns, "sentinel", json!({ "data": { "k": "2" } })).await;
            ctx.wait_reloaded(Kind::Deployment, "canary", ConfigMap, "sentinel", &cm_hash(&[("k", "2")])).await;

            for (kind, before) in ALL_KINDS.into_iter().zip(before) {
                assert_eq!(generation(c, ns, kind, "web").await, before, "a label-only change rolled the {kind:?}");
            }
            ctx.assert_not_reloaded(Kind::Deployment, "uses-ignored", ConfigMap, "ignored", &cm_hash(&[("k", "2")]))
                .await;
            ctx.assert_not_reloaded(Kind::Deployment, "searcher", ConfigMap, "no-match", &cm_hash(&[("k", "2")])).await;
            controller
        })
        .await;
    }
}
