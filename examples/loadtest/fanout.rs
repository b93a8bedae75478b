//! S2, the fan-out scenario.

use super::*;

/// The fan-out scenario (S2): one ConfigMap used by `deployments` Deployments, `updates`
/// updates one after the other; for each, the time until the driver's watch sees every
/// Deployment record it, and at the end whether each rolled exactly once per update.
pub(crate) async fn fanout(
    deployments: usize,
    updates: usize,
    replicas: usize,
    extra: &[String],
) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(FANOUT).await?.is_none() {
        let ns = json!({ "metadata": { "name": FANOUT, "labels": { LABEL: "1" } } });
        namespaces.create(&PostParams::default(), &serde_json::from_value(ns)?).await?;
        populate(&client, 0).await?; // the home namespace
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), FANOUT);
    if cms.get_opt("shared").await?.is_none() {
        let cm = json!({ "metadata": { "name": "shared" }, "data": { "v": "0" } });
        cms.create(&PostParams::default(), &serde_json::from_value(cm)?).await?;
    }
    let api: Api<Deployment> = Api::namespaced(client.clone(), FANOUT);
    let existing = api.list_metadata(&ListParams::default()).await?.items.len();
    futures::stream::iter(existing..deployments)
        .map(|d| {
            let api = api.clone();
            async move {
                let name = format!("fan-{d:04}");
                let deployment = json!({
                    "metadata": { "name": name, "annotations": { "reloader.stakater.com/auto": "true" } },
                    "spec": { "replicas": 0, "selector": { "matchLabels": { "app": name } },
                        "template": { "metadata": { "labels": { "app": name } },
                            "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1",
                                "envFrom": [{ "configMapRef": { "name": "shared" } }] }] } } }
                });
                api.create(&PostParams::default(), &serde_json::from_value(deployment)?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let mode = "fanout";
    for r in 0..replicas {
        let _ = std::fs::remove_file(log_path(mode, replicas, r));
    }
    let mut controllers = Vec::new();
    for r in 0..replicas {
        controllers.push(start_one_with(r, replicas, 0, mode, extra).await?);
    }
    let ports: Vec<u16> = controllers.iter().map(|(_, p)| *p).collect();
    wait_ready(&ports, replicas, 16).await?;
    println!("fan-out: {deployments} Deployments on one ConfigMap, {replicas} replica(s), args {extra:?}");

    let generation = |list: &kube::core::ObjectList<Deployment>| -> HashMap<String, i64> {
        list.items
            .iter()
            .map(|d| (d.metadata.name.clone().unwrap_or_default(), d.metadata.generation.unwrap_or(0)))
            .collect()
    };
    let before = generation(&api.list(&ListParams::default()).await?);
    let recorded: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let watch = tokio::spawn({
        let (api, recorded) = (api.clone(), recorded.clone());
        async move {
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
            while let Some(Ok(d)) = stream.next().await {
                let value = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|s| {
                    s.containers[0].env.as_ref()?.iter().find(|e| e.name == "STAKATER_SHARED_CONFIGMAP")?.value.clone()
                });
                if let (Some(name), Some(value), Ok(mut recorded)) = (d.metadata.name.clone(), value, recorded.lock()) {
                    recorded.insert(name, value);
                }
            }
        }
    });
    let before_calls: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut times = Vec::new();
    for u in 0..updates {
        let value = format!("r{run}-u{u}");
        let hash = DataHash::of_configmap(&[("v".to_string(), value.clone())].into(), &Default::default()).to_string();
        let started = Instant::now();
        cms.patch("shared", &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": value } }))).await?;
        let deadline = started + Duration::from_secs(120);
        loop {
            let done = recorded.lock().map(|r| r.values().filter(|v| **v == hash).count()).unwrap_or(0);
            if done == deployments {
                break;
            }
            if Instant::now() > deadline {
                bail!("update {u}: {done} of {deployments} Deployments recorded it within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        times.push(started.elapsed().as_secs_f64());
    }
    watch.abort();
    let after_calls: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let after = generation(&api.list(&ListParams::default()).await?);
    let rolled: i64 = after.iter().map(|(name, g)| g - before.get(name).copied().unwrap_or(0)).sum();
    let expected = (deployments * updates) as i64;
    let patches: f64 = after_calls
        .iter()
        .zip(&before_calls)
        .map(|(a, b)| a.get("patch").copied().unwrap_or(0.0) - b.get("patch").copied().unwrap_or(0.0))
        .sum();
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "all {deployments} patched after each of {updates} updates: p50 {:.3} s, max {:.3} s; {rolled} rollouts for {expected} (duplicates {}), {patches} PATCH",
        times[times.len() / 2],
        times.last().copied().unwrap_or(f64::NAN),
        rolled - expected
    );
    for (child, _) in controllers.iter_mut() {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }
    Ok(())
}
