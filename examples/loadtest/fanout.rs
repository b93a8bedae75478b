//! S2, the fan-out scenario, and its floor.
//!
//! ```text
//!  controller rounds: driver PATCHes the ConfigMap ─▶ controller PATCHes D Deployments ─▶ driver's watch sees all D
//!  floor rounds:      driver PATCHes the D Deployments itself (same patch, same writes in flight) ─▶ the same watch
//! ```
//! The floor is what the API server on this machine takes for the fan-out's writes with no
//! controller in the way; both are measured in one run, so their ratio is what the controller
//! adds, whatever else the machine is doing. Each is measured at two paces: back to back (the
//! next round as soon as the last is recorded) and settled (one change on a quiet cluster).

use super::*;

/// Writes in flight when the arguments do not say (the controller's default).
const DEFAULT_WRITES_IN_FLIGHT: usize = 64;
/// The env var the controller records the shared ConfigMap's hash in.
const ENV_VAR: &str = "STAKATER_SHARED_CONFIGMAP";
/// The longest a round, or settling before one, may take.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);

/// What the driver's watch last saw of one Deployment.
#[derive(Clone, Default)]
struct Seen {
    /// The value of [`ENV_VAR`].
    recorded: String,
    generation: i64,
    /// The generation the deployment controller has acted on (`status.observedGeneration`).
    observed: i64,
}

type SeenAll = Arc<Mutex<HashMap<String, Seen>>>;

/// How rounds follow each other.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Pace {
    /// The next round as soon as every Deployment records the last: the deployment
    /// controller's answers to one round (and the controller's Events) share the API server
    /// with the next.
    BackToBack,
    /// The next round once the deployment controller has caught up (every Deployment's status
    /// observes its generation) and no Event of the controller waits: one change on a quiet
    /// cluster, as a user usually makes it.
    Settled,
}

impl Pace {
    fn name(self) -> &'static str {
        match self {
            Pace::BackToBack => "back to back",
            Pace::Settled => "settled",
        }
    }
}

/// The fan-out scenario (S2): one ConfigMap used by `deployments` Deployments, `updates`
/// updates one after the other at each pace; for each, the time until the driver's watch
/// sees every Deployment record it, and at the end whether each rolled exactly once per
/// update. Then the floor: the same rounds with the driver writing the Deployments itself.
pub(crate) async fn fanout(
    deployments: usize,
    updates: usize,
    replicas: usize,
    extra: &[String],
) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let api = create_fanout(&client, deployments).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), FANOUT);
    let in_flight = writes_in_flight(extra)?;
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

    let seen: SeenAll = Arc::default();
    let watch = tokio::spawn(watch_seen(api.clone(), seen.clone()));
    let generations = |list: &kube::core::ObjectList<Deployment>| -> HashMap<String, i64> {
        list.items
            .iter()
            .map(|d| (d.metadata.name.clone().unwrap_or_default(), d.metadata.generation.unwrap_or(0)))
            .collect()
    };
    let before = generations(&api.list(&ListParams::default()).await?);
    let before_calls: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let mut controller_times = HashMap::new();
    for pace in [Pace::BackToBack, Pace::Settled] {
        let mut times = Vec::new();
        for u in 0..updates {
            if pace == Pace::Settled {
                settle(&seen, deployments, &ports).await?;
            }
            let value = format!("r{run}-{}-u{u}", pace.name().replace(' ', "-"));
            let hash =
                DataHash::of_configmap(&[("v".to_string(), value.clone())].into(), &Default::default()).to_string();
            let started = Instant::now();
            cms.patch("shared", &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": value } }))).await?;
            wait_recorded(&seen, &hash, deployments, started).await?;
            times.push(started.elapsed().as_secs_f64());
        }
        println!("all {deployments} patched after each of {updates} updates, {}: {}", pace.name(), p50_max(&mut times));
        controller_times.insert(pace, times);
    }
    let after_calls: Vec<HashMap<String, f64>> = futures::future::join_all(ports.iter().map(|p| api_calls(*p))).await;
    let after = generations(&api.list(&ListParams::default()).await?);
    let rolled: i64 = after.iter().map(|(name, g)| g - before.get(name).copied().unwrap_or(0)).sum();
    let expected = (deployments * updates * 2) as i64;
    let calls = |verb: &str| -> f64 {
        after_calls
            .iter()
            .zip(&before_calls)
            .map(|(a, b)| a.get(verb).unwrap_or(&0.0) - b.get(verb).unwrap_or(&0.0))
            .sum()
    };
    println!(
        "{rolled} rollouts for {expected} (duplicates {}); calls: {} PATCH, {} POST (Event series are PATCHes, new Events POSTs)",
        rolled - expected,
        calls("patch"),
        calls("create")
    );
    // The floor's writes would look to a running controller like someone else's edits.
    for (child, _) in controllers.iter_mut() {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    }
    // Round 0 opens the driver's connections and is not counted.
    write_all(&api, deployments, &format!("floor-r{run}-warm"), in_flight).await?;
    for pace in [Pace::BackToBack, Pace::Settled] {
        let mut floor = Vec::new();
        for u in 0..updates {
            if pace == Pace::Settled {
                settle(&seen, deployments, &[]).await?;
            }
            let value = format!("floor-r{run}-{}-u{u}", pace.name().replace(' ', "-"));
            let started = Instant::now();
            write_all(&api, deployments, &value, in_flight).await?;
            wait_recorded(&seen, &value, deployments, started).await?;
            floor.push(started.elapsed().as_secs_f64());
        }
        let summary = p50_max(&mut floor);
        let controller = controller_times.get(&pace).map(|t| median(t)).unwrap_or(f64::NAN);
        println!(
            "floor, {}: the driver's own {deployments} PATCHes ({in_flight} in flight, no controller): {summary}; controller / floor at p50: {:.2}",
            pace.name(),
            controller / median(&floor)
        );
    }
    watch.abort();
    Ok(())
}

/// The fan-out's namespace, its ConfigMap and `deployments` Deployments using it, each made
/// unless it exists.
async fn create_fanout(client: &Client, deployments: usize) -> anyhow::Result<Api<Deployment>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(FANOUT).await?.is_none() {
        let ns = json!({ "metadata": { "name": FANOUT, "labels": { LABEL: "1" } } });
        namespaces.create(&PostParams::default(), &serde_json::from_value(ns)?).await?;
        populate(client, 0).await?; // the home namespace
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
    Ok(api)
}

/// Follow the Deployments: what each records in [`ENV_VAR`] and whether the deployment
/// controller has caught up with it.
async fn watch_seen(api: Api<Deployment>, seen: SeenAll) {
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    while let Some(Ok(d)) = stream.next().await {
        let recorded = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers[0].env.as_ref()?.iter().find(|e| e.name == ENV_VAR)?.value.clone())
            .unwrap_or_default();
        let now = Seen {
            recorded,
            generation: d.metadata.generation.unwrap_or(0),
            observed: d.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0),
        };
        if let (Some(name), Ok(mut seen)) = (d.metadata.name.clone(), seen.lock()) {
            seen.insert(name, now);
        }
    }
}

/// Wait until `done` holds for all `deployments`, at most [`ROUND_DEADLINE`] after `started`.
async fn wait_all(
    seen: &SeenAll,
    deployments: usize,
    started: Instant,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) -> anyhow::Result<()> {
    loop {
        let count = seen.lock().map(|s| s.values().filter(|s| done(s)).count()).unwrap_or(0);
        if count == deployments {
            return Ok(());
        }
        if started.elapsed() > ROUND_DEADLINE {
            bail!("{count} of {deployments} Deployments {what} within {ROUND_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Wait until all `deployments` record `value`.
async fn wait_recorded(seen: &SeenAll, value: &str, deployments: usize, started: Instant) -> anyhow::Result<()> {
    wait_all(seen, deployments, started, &format!("recorded {value}"), |s| s.recorded == value).await
}

/// Wait until the deployment controller has caught up with every Deployment and the
/// controllers at `ports` have no Event waiting.
async fn settle(seen: &SeenAll, deployments: usize, ports: &[u16]) -> anyhow::Result<()> {
    let started = Instant::now();
    wait_all(seen, deployments, started, "observed by the deployment controller", |s| s.observed >= s.generation)
        .await?;
    for port in ports {
        while metric(*port, "reloader_events_pending").await > 0.0 {
            if started.elapsed() > ROUND_DEADLINE {
                bail!("the controller's Events still waited after {ROUND_DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// The controller's env-vars write (the same strategic-merge patch and field manager) to every
/// Deployment, `in_flight` at a time.
async fn write_all(api: &Api<Deployment>, deployments: usize, value: &str, in_flight: usize) -> anyhow::Result<()> {
    let patch = json!({ "spec": { "template": { "spec": { "containers": [
        { "name": "app", "env": [{ "name": ENV_VAR, "value": value }] }
    ] } } } });
    let params = PatchParams { field_manager: Some("Reloader".into()), ..PatchParams::default() };
    futures::stream::iter(0..deployments)
        .map(|d| {
            let (api, patch, params) = (api, &patch, &params);
            async move {
                api.patch(&format!("fan-{d:04}"), params, &Patch::Strategic(patch)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// `--max-concurrent-writes` among the controller's arguments, else its default.
fn writes_in_flight(extra: &[String]) -> anyhow::Result<usize> {
    match extra.iter().find_map(|a| a.strip_prefix("--max-concurrent-writes=")) {
        Some(n) => n.parse().with_context(|| format!("--max-concurrent-writes={n}")),
        None => Ok(DEFAULT_WRITES_IN_FLIGHT),
    }
}

/// "p50 .. s, max .. s" of round times in seconds (sorts them).
fn p50_max(times: &mut [f64]) -> String {
    times.sort_by(|a, b| a.total_cmp(b));
    format!("p50 {:.3} s, max {:.3} s", median(times), times.last().copied().unwrap_or(f64::NAN))
}

/// The middle of sorted round times.
fn median(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}
