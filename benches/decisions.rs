//! Decision throughput and store size. Not a test: it prints figures.
//!
//!     cargo bench --bench decisions
//!
//! Builds the compact store from realistic Deployment JSON (through the same slim wire types
//! and compactor the watches use), then times the engine's per-change work without the API:
//! index lookup, annotation rules, container choice and patch planning.

use std::alloc::System;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use reloader_fleet::reload::{Item, Keys, Options, Rules, Strategy, Target, plan, target_container};
use reloader_fleet::watch::{
    Compactor, DataHash, ResourceKey, ResourceKind, ResourceState, SlimConfigMap, SlimDeployment, SlimRaw, Store,
    WorkloadKind, used_keys,
};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CONFIGMAPS_PER_NS: usize = 1000;
const CHANGES: usize = 5_000;

/// A Deployment as a user writes it: image, resources, probes, ten env vars, two volumes.
fn deployment_json(ns: &str, i: usize, configmaps: usize) -> Value {
    let cm = format!("config-{}", i % configmaps);
    let mut annotations = json!({ "reloader.stakater.com/auto": "true", "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(600) });
    if i.is_multiple_of(100) {
        annotations["configmap.reloader.stakater.com/reload"] = json!("config-1.*,shared");
    }
    json!({
        "metadata": { "name": format!("app-{i}"), "namespace": ns, "uid": format!("uid-{i}"), "resourceVersion": "12345",
                      "labels": { "app": format!("app-{i}"), "team": "payments", "tier": "backend" },
                      "annotations": annotations },
        "spec": { "replicas": 3, "selector": { "matchLabels": { "app": format!("app-{i}") } },
            "template": { "metadata": { "labels": { "app": format!("app-{i}") } },
                "spec": {
                    "containers": [{
                        "name": "app", "image": "registry.example/team/app:1.2.3",
                        "resources": { "requests": { "cpu": "100m", "memory": "128Mi" }, "limits": { "memory": "256Mi" } },
                        "readinessProbe": { "httpGet": { "path": "/ready", "port": 8080 }, "periodSeconds": 5 },
                        "env": (0..10).map(|e| json!({ "name": format!("VAR_{e}"), "value": format!("value-{e}") })).collect::<Vec<_>>(),
                        "envFrom": [{ "configMapRef": { "name": cm } }],
                        "volumeMounts": [{ "name": "secret", "mountPath": "/secret" }, { "name": "tmp", "mountPath": "/tmp" }]
                    }],
                    "volumes": [{ "name": "secret", "secret": { "secretName": format!("secret-{}", i % 500) } },
                                { "name": "tmp", "emptyDir": {} }]
                } } }
    })
}

struct Built {
    store: Store,
    workloads: usize,
    resources: usize,
    workload_bytes: isize,
    resource_bytes: isize,
}

fn net(stats: stats_alloc::Stats) -> isize {
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize
}

fn build(namespaces: usize, workloads_per_ns: usize) -> Built {
    let keys = Keys::default();
    let compactor = Compactor::new(keys.annotation_keys(), false);
    let configmaps = CONFIGMAPS_PER_NS.min(workloads_per_ns);
    let jsons: Vec<Value> = (0..namespaces)
        .flat_map(|n| (0..workloads_per_ns).map(move |i| deployment_json(&format!("ns-{n}"), i, configmaps)))
        .collect();
    let region = Region::new(GLOBAL);
    let (store, writer) = Store::new(keys.explicit_keys());
    let mut resources = 0;
    for n in 0..namespaces {
        let ns: Arc<str> = Arc::from(format!("ns-{n}"));
        for c in 0..configmaps {
            let data = BTreeMap::from([("config.yaml".to_string(), format!("setting: {c}"))]);
            let key = ResourceKey {
                kind: ResourceKind::ConfigMap,
                namespace: ns.clone(),
                name: Arc::from(format!("config-{c}")),
            };
            let state = ResourceState {
                hash: DataHash::of_configmap(&data, &BTreeMap::new()),
                ignored: false,
                search_match: false,
                wide: None,
                keys: None,
            };
            writer.apply_resource(key, state);
            resources += 1;
        }
    }
    let resource_bytes = net(region.change());
    // Net bytes still held after the loop: the stored workloads and their index entries (the
    // slim wire objects are dropped inside the loop, the JSON outlives it).
    for value in &jsons {
        let slim: SlimDeployment = serde_json::from_value(value.clone()).expect("fixture parses");
        writer.apply_workload(compactor.compact(&slim).expect("named"));
    }
    let workload_bytes = net(region.change()) - resource_bytes;
    drop(jsons);
    Built { store, workloads: namespaces * workloads_per_ns, resources, workload_bytes, resource_bytes }
}

fn run_changes(built: &Built, namespaces: usize) -> (f64, usize) {
    let mut rules = Rules::new(Keys::default(), Options::default());
    let configmaps = CONFIGMAPS_PER_NS.min(built.workloads / namespaces);
    let started = Instant::now();
    let mut evaluated = 0usize;
    let mut planned = 0usize;
    for k in 0..CHANGES {
        let key = ResourceKey {
            kind: ResourceKind::ConfigMap,
            namespace: Arc::from(format!("ns-{}", k % namespaces)),
            name: Arc::from(format!("config-{}", k % configmaps)),
        };
        let state = ResourceState {
            hash: DataHash::of_bytes(format!("{k}").as_bytes()),
            ignored: false,
            search_match: false,
            wide: None,
            keys: None,
        };
        for w in built.store.candidates(&key) {
            evaluated += 1;
            let verdict = rules.decide(key.kind, &key.name, &state, &w.annotations, &w.template);
            let Some(mode) = verdict.mode else { continue };
            let Some(c) = target_container(&w.template, key.kind, &key.name, mode) else { continue };
            if plan(Strategy::EnvVars, &w, &Item::new(key.kind, &key.name, c, Target::Hash(state.hashes())), 0)
                .is_some()
            {
                planned += 1;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert!(planned > 0, "the benchmark must exercise real matches");
    (CHANGES as f64 / secs, evaluated / CHANGES)
}

fn typed_bytes_per_deployment() -> isize {
    let jsons: Vec<Value> = (0..1000).map(|i| deployment_json("ns", i, 100)).collect();
    let region = Region::new(GLOBAL);
    let typed: Vec<Deployment> = jsons.iter().map(|v| serde_json::from_value(v.clone()).expect("parses")).collect();
    let stats = region.change();
    drop(typed);
    (stats.bytes_allocated as isize - stats.bytes_deallocated as isize) / 1000
}

/// Bytes held per stored workload of `kind` (with index entries), 1,000 of them built from the
/// same realistic pod template as the Deployments, with the annotation that makes each keep
/// what its write needs (the job template, the Job's spec, the containers).
fn stored_bytes_per(kind: WorkloadKind) -> isize {
    let keys = Keys::default();
    let compactor = Compactor::new(keys.annotation_keys(), false);
    let jsons: Vec<Value> = (0..1000)
        .map(|i| {
            let mut d = deployment_json("ns", i, 100);
            let template = d["spec"]["template"].take();
            d["spec"] = match kind {
                WorkloadKind::CronJob => json!({ "schedule": "0 * * * *", "jobTemplate": {
                    "metadata": { "labels": { "app": "x" } }, "spec": { "backoffLimit": 1, "template": template } } }),
                WorkloadKind::Job => json!({ "backoffLimit": 1, "completions": 1, "template": template }),
                _ => json!({ "replicas": 3, "strategy": { "canary": { "steps": [ { "setWeight": 20 } ] } }, "template": template }),
            };
            d
        })
        .collect();
    let region = Region::new(GLOBAL);
    let (store, writer) = Store::new(keys.explicit_keys());
    for value in &jsons {
        let slim: SlimRaw = serde_json::from_value(value.clone()).expect("fixture parses");
        writer.apply_workload(compactor.compact_raw(kind, &slim).expect("named"));
    }
    let bytes = net(region.change());
    drop(store);
    bytes / 1000
}

/// Issue 41: a namespace with a ConfigMap of five keys read by key (`configMapKeyRef` of two
/// of them) beside the Deployment's own ConfigMap read whole, built through the compactor as the
/// watches do; the store's bytes, and changes decided a second (each compared by key when on).
fn used_keys_figures(namespaces: usize, on: bool) -> (isize, f64) {
    let keys = Keys::default();
    let compactor = Compactor::new(keys.annotation_keys(), false);
    let compactor = if on { compactor.reloading_on_used_keys() } else { compactor };
    let configmap = |ns: &str, name: &str, data: Value| -> SlimConfigMap {
        serde_json::from_value(
            json!({ "metadata": { "name": name, "namespace": ns, "resourceVersion": "1" }, "data": data }),
        )
        .expect("a ConfigMap")
    };
    let mut deployments = Vec::new();
    let mut configmaps = Vec::new();
    for n in 0..namespaces {
        let ns = format!("ns-{n}");
        let mut d = deployment_json(&ns, 0, 1);
        let reads_by_key = ["a", "b"].map(|k| {
            json!({ "name": format!("SHARED_{k}"),
            "valueFrom": { "configMapKeyRef": { "name": "shared", "key": k } } })
        });
        if let Some(env) = d["spec"]["template"]["spec"]["containers"][0]["env"].as_array_mut() {
            env.extend(reads_by_key);
        }
        deployments.push(d);
        configmaps.push(configmap(&ns, "config-0", json!({ "config.yaml": "setting: 1" })));
        let shared: BTreeMap<String, String> =
            (0..5).map(|k| (format!("{}", (b'a' + k) as char), "v".repeat(40))).collect();
        configmaps.push(configmap(&ns, "shared", json!(shared)));
    }
    let region = Region::new(GLOBAL);
    let (store, writer) = Store::new(keys.explicit_keys());
    for value in &deployments {
        let slim: SlimDeployment = serde_json::from_value(value.clone()).expect("fixture parses");
        writer.apply_workload(compactor.compact(&slim).expect("named"));
    }
    for cm in &configmaps {
        let key = ResourceKey {
            kind: ResourceKind::ConfigMap,
            namespace: Arc::from(cm.metadata.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(cm.metadata.name.as_deref().unwrap_or_default()),
        };
        writer.apply_resource(key, compactor.configmap(cm));
    }
    writer.settle_key_hashes(true);
    let bytes = net(region.change());
    drop(configmaps);
    let mut rules = Rules::new(Keys::default(), Options::default());
    let started = Instant::now();
    let mut planned = 0;
    for k in 0..CHANGES {
        let key = ResourceKey {
            kind: ResourceKind::ConfigMap,
            namespace: Arc::from(format!("ns-{}", k % namespaces)),
            name: Arc::from("shared"),
        };
        let Some(state) = store.resource(&key) else { continue };
        for w in store.candidates(&key) {
            if let Some(used) = w.template.key_uses.as_deref().and_then(|u| u.keys(key.kind, &key.name)) {
                let acted = state.keys.as_deref();
                if used_keys::compare(used, state.keys.as_deref(), acted) == used_keys::KeyChange::Untouched {
                    continue;
                }
            }
            let verdict = rules.decide(key.kind, &key.name, &state, &w.annotations, &w.template);
            let Some(mode) = verdict.mode else { continue };
            let Some(c) = target_container(&w.template, key.kind, &key.name, mode) else { continue };
            let item = Item::new(key.kind, &key.name, c, Target::Hash(state.hashes()));
            planned += usize::from(plan(Strategy::EnvVars, &w, &item, 0).is_some());
        }
    }
    let per_sec = CHANGES as f64 / started.elapsed().as_secs_f64();
    assert!(on || planned > 0, "the benchmark must exercise real matches");
    (bytes, per_sec)
}

fn main() {
    println!("decision benchmark: {CHANGES} ConfigMap changes, env-vars strategy, no API calls");
    for (label, namespaces, per_ns) in
        [("10,000 workloads in one namespace", 1, 10_000), ("10,000 workloads across 1,000 namespaces", 1000, 10)]
    {
        let built = build(namespaces, per_ns);
        let (per_sec, candidates) = run_changes(&built, namespaces);
        println!(
            "{label:<42} {per_sec:>8.0} changes/s  {candidates:>4} candidates/change  store: {:>5} B/workload (with index), {:>4} B/ConfigMap, {:.1} MiB in all",
            built.workload_bytes / built.workloads as isize,
            built.resource_bytes / built.resources as isize,
            (built.workload_bytes + built.resource_bytes) as f64 / 1048576.0
        );
    }
    println!("for comparison, a full k8s-openapi Deployment of the same JSON holds {} B", typed_bytes_per_deployment());
    for kind in [WorkloadKind::CronJob, WorkloadKind::Job, WorkloadKind::Rollout] {
        println!(
            "store: {:>5} B per {} with the same pod template (slim view, index, and what its write needs)",
            stored_bytes_per(kind),
            kind.kind()
        );
    }
    let namespaces = 10_000;
    let (off, off_rate) = used_keys_figures(namespaces, false);
    let (on, on_rate) = used_keys_figures(namespaces, true);
    println!(
        "--reload-on-used-keys, {namespaces} namespaces (a Deployment reading 2 of 5 keys of a shared ConfigMap, and one \
         ConfigMap whole): store {:.1} MiB off, {:.1} MiB on ({:+.1}%); {off_rate:.0} changes/s off, {on_rate:.0} on \
         (each compared by key, none rolled)",
        off as f64 / 1048576.0,
        on as f64 / 1048576.0,
        (on - off) as f64 * 100.0 / off as f64
    );
}
