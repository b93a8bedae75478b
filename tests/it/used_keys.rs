//! Issue 41, part 1: `--reload-on-used-keys` on the real API server. A workload reading only
//! some keys of a shared ConfigMap or Secret (configMapKeyRef, secretKeyRef, volume items, a
//! subPath, a projected source with items) rolls only when one of them changes; envFrom,
//! whole-volume mounts and resources named by annotation keep whole-object reloads; the
//! workload annotation wins over the flag both ways; switching the mode rolls nothing by itself;
//! a restarted controller keeps deciding by key; `explain` names the keys.

use crate::support::explain::explain_json;
use crate::support::fixtures::{
    Kind, Workload, cm_hash, create_configmap, create_secret, generation, patch_configmap, patch_secret, secret_hash,
};
use crate::support::scenario::{Ctx, scenario, wait_stored};
use reloader_fleet::reload::Strategy;
use reloader_fleet::watch::ResourceKind::{ConfigMap as Cm, Secret as Sec};
use serde_json::{Value, json};

const OPT: &str = "reloader-fleet.stakater.com/reload-on-used-keys";
const FLAG: &str = "--reload-on-used-keys";
const SHARED: [(&str, &str); 4] = [("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")];

fn app(extra: Value) -> Value {
    let mut container = json!({ "name": "app" });
    if let (Some(c), Some(e)) = (container.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    container
}

fn env_key(kind_ref: &str, name: &str, key: &str) -> Value {
    app(json!({ "env": [{ "name": "V", "valueFrom": { kind_ref: { "name": name, "key": key } } }] }))
}

fn mounted(volume: &str, sub_path: Option<&str>) -> Value {
    let mut mount = json!({ "name": volume, "mountPath": "/etc/app" });
    if let Some(path) = sub_path {
        mount["subPath"] = json!(path);
    }
    app(json!({ "volumeMounts": [mount] }))
}

/// The workloads of the scenario, each reading `shared` (or `db`) its own way.
async fn create_workloads(ctx: &Ctx) {
    let (c, ns) = (&ctx.client, ctx.ns.as_str());
    let deployment = |name: &str| Workload::new(Kind::Deployment, name).auto();
    let whole = deployment("whole")
        .container(app(json!({ "envFrom": [{ "configMapRef": { "name": "shared" } }],
                               "volumeMounts": [{ "name": "db", "mountPath": "/db" }] })))
        .volume(json!({ "name": "db", "secret": { "secretName": "db" } }));
    let items = json!({ "name": "v", "configMap": { "name": "shared", "items": [{ "key": "b", "path": "b.conf" }] } });
    let projected = json!({ "name": "v", "projected": { "sources": [
        { "configMap": { "name": "shared", "items": [{ "key": "d", "path": "d.conf" }] } } ] } });
    let workloads = [
        whole,
        deployment("key-a").container(env_key("configMapKeyRef", "shared", "a")),
        deployment("items-b").container(mounted("v", None)).volume(items),
        deployment("subpath-c")
            .container(mounted("v", Some("c")))
            .volume(json!({ "name": "v", "configMap": { "name": "shared" } })),
        deployment("projected-d").container(mounted("v", None)).volume(projected),
        deployment("opted-out").annotate(OPT, "false").container(env_key("configMapKeyRef", "shared", "a")),
        deployment("opted-in").annotate(OPT, "true").container(env_key("configMapKeyRef", "shared", "a")),
        // Named by annotation: every change of the data counts.
        Workload::new(Kind::Deployment, "listed")
            .annotate("configmap.reloader.stakater.com/reload", "shared")
            .container(env_key("configMapKeyRef", "shared", "a")),
        deployment("secret-user").container(env_key("secretKeyRef", "db", "user")),
    ];
    for workload in &workloads {
        workload.create(c, ns).await;
    }
}

const ALL: [&str; 9] =
    ["whole", "key-a", "items-b", "subpath-c", "projected-d", "opted-out", "opted-in", "listed", "secret-user"];

async fn generations(ctx: &Ctx) -> Vec<i64> {
    let mut out = Vec::new();
    for name in ALL {
        out.push(generation(&ctx.client, &ctx.ns, Kind::Deployment, name).await);
    }
    out
}

/// Change one key of `shared`, wait until `rolled` record it, then check that exactly they
/// were written (one write each) and every other workload was left alone.
async fn change_shared_key(ctx: &Ctx, data: &mut Vec<(&'static str, String)>, key: &'static str, rolled: &[&str]) {
    change_shared_key_but(ctx, data, key, rolled, None).await;
}

/// As [`change_shared_key`]; `either` may or may not be rolled.
async fn change_shared_key_but(
    ctx: &Ctx,
    data: &mut Vec<(&'static str, String)>,
    key: &'static str,
    rolled: &[&str],
    either: Option<&str>,
) {
    let before = generations(ctx).await;
    let value = format!("{}-next", data.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str()).unwrap_or("x"));
    patch_configmap(&ctx.client, &ctx.ns, "shared", json!({ "data": { key: value } })).await;
    for entry in data.iter_mut().filter(|(k, _)| *k == key) {
        entry.1 = value.clone();
    }
    let pairs: Vec<(&str, &str)> = data.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let hash = cm_hash(&pairs);
    // The change is decided for every workload at once: once these record it, the rest were
    // decided too (and are not written later).
    for name in rolled {
        ctx.wait_reloaded(Kind::Deployment, name, Cm, "shared", &hash).await;
    }
    let after = generations(ctx).await;
    for (i, name) in ALL.iter().enumerate().filter(|(_, name)| Some(**name) != either) {
        let expected = before[i] + i64::from(rolled.contains(name));
        assert_eq!(after[i], expected, "{name} after a change of key {key} (rolled: {rolled:?})");
    }
}

#[tokio::test]
async fn a_change_rolls_only_the_workloads_that_read_a_changed_key() {
    for strategy in [Strategy::EnvVars, Strategy::Annotations] {
        scenario("used-keys", strategy, &[FLAG], |ctx, controller| async move {
            let (c, ns) = (&ctx.client, ctx.ns.as_str());
            create_configmap(c, ns, "shared", &SHARED).await;
            create_secret(c, ns, "db", &[("user", "u1"), ("password", "p1")]).await;
            create_workloads(&ctx).await;
            wait_stored(&controller, ALL.len()).await;
            let mut data: Vec<(&str, String)> = SHARED.iter().map(|(k, v)| (*k, v.to_string())).collect();
            let always = ["whole", "opted-out", "listed"];

            change_shared_key(&ctx, &mut data, "c", &[&always[..], &["subpath-c"]].concat()).await;
            change_shared_key(&ctx, &mut data, "a", &[&always[..], &["key-a", "opted-in"]].concat()).await;
            change_shared_key(&ctx, &mut data, "d", &[&always[..], &["projected-d"]].concat()).await;

            // Secrets: a password change leaves the workload reading only the user alone.
            let before = generation(c, ns, Kind::Deployment, "secret-user").await;
            patch_secret(c, ns, "db", json!({ "stringData": { "password": "p2" } })).await;
            ctx.wait_reloaded(
                Kind::Deployment,
                "whole",
                Sec,
                "db",
                &secret_hash(&[("user", "u1"), ("password", "p2")]),
            )
            .await;
            assert_eq!(generation(c, ns, Kind::Deployment, "secret-user").await, before, "password only");
            patch_secret(c, ns, "db", json!({ "stringData": { "user": "u2" } })).await;
            let user_changed = secret_hash(&[("user", "u2"), ("password", "p2")]);
            ctx.wait_reloaded(Kind::Deployment, "secret-user", Sec, "db", &user_changed).await;

            let report = explain_json(&["deploy/key-a", "-n", ns, FLAG]).await;
            let keys = report["pairs"][0]["keys"].as_str().unwrap_or_default();
            assert!(keys.contains("only keys a"), "explain names the keys: {report:#}");

            // A restarted controller (its baselines from the checkpoint and a fresh list) keeps
            // deciding by key, and switching the mode off rolls nothing by itself.
            controller.stop().await;
            let before = generations(&ctx).await;
            let controller = ctx.start_controller("whole-mode", &[]).await;
            wait_stored(&controller, ALL.len()).await;
            assert_eq!(generations(&ctx).await, before, "switching the mode off rolled");
            // Without the flag only the annotated workload (opted-in) reads by key, from the
            // first change on (issue 48: per-key hashes were made once a workload asked for
            // them, so when the list brought the ConfigMap first, the first change after every
            // start rolled it as a whole).
            let whole_mode = [&always[..], &["key-a", "items-b", "subpath-c", "projected-d"]].concat();
            change_shared_key(&ctx, &mut data, "b", &whole_mode).await;
            change_shared_key(&ctx, &mut data, "c", &whole_mode).await;
            controller.stop().await;
            let before = generations(&ctx).await;
            let controller = ctx.start_controller("key-mode", &[FLAG]).await;
            wait_stored(&controller, ALL.len()).await;
            assert_eq!(generations(&ctx).await, before, "switching the mode on rolled");
            change_shared_key(&ctx, &mut data, "b", &[&always[..], &["items-b"]].concat()).await;
            controller
        })
        .await;
    }
}
