//! The real `reloader` binary, run as a process against the local control plane.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::kubeconfig_path;

/// A running controller. Killed when dropped; [`Controller::stop`] stops it gracefully.
pub struct Controller {
    child: Option<Child>,
    port: u16,
    pub log: PathBuf,
    /// Where this start's lines begin in `log` (a name started again appends).
    log_start: u64,
}

impl Controller {
    /// Start `reloader` with `args`, its checkpoint in `home_namespace`, and wait until it is
    /// ready (every watch listed). Logs go to `target/test-logs/<name>.log`.
    pub async fn start(name: &str, home_namespace: &str, args: &[&str]) -> Controller {
        Self::start_with_kubeconfig(name, home_namespace, args, &kubeconfig_path()).await
    }

    /// Like [`Controller::start`], with credentials from another kubeconfig.
    pub async fn start_with_kubeconfig(
        name: &str,
        home_namespace: &str,
        args: &[&str],
        kubeconfig: &std::path::Path,
    ) -> Controller {
        Self::start_with_kubeconfig_env(name, home_namespace, args, kubeconfig, &[]).await
    }

    /// Like [`Controller::start_with_kubeconfig`], with extra environment variables.
    pub async fn start_with_kubeconfig_env(
        name: &str,
        home_namespace: &str,
        args: &[&str],
        kubeconfig: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Controller {
        let mut controller = Self::spawn(name, home_namespace, args, kubeconfig, env);
        if let Err(why) = controller.wait_ready(super::DEADLINE).await {
            panic!("{why}");
        }
        controller
    }

    /// Start it and wait at most `deadline` for readiness; `None` if it did not become ready
    /// (it is then stopped), for tests that expect a start to fail.
    pub async fn try_start(
        name: &str,
        home_namespace: &str,
        args: &[&str],
        env: &[(&str, &str)],
        kubeconfig: &std::path::Path,
        deadline: Duration,
    ) -> Option<Controller> {
        let mut controller = Self::spawn(name, home_namespace, args, kubeconfig, env);
        controller.wait_ready(deadline).await.ok().map(|()| controller)
    }

    fn spawn(
        name: &str,
        home_namespace: &str,
        args: &[&str],
        kubeconfig: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Controller {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-logs");
        std::fs::create_dir_all(&dir).expect("create the test log folder");
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open the controller log");
        let log_start = file.metadata().map(|m| m.len()).unwrap_or(0);
        let err = file.try_clone().expect("clone the log handle");
        let child = Command::new(env!("CARGO_BIN_EXE_reloader"))
            .args(args)
            // Port 0: the controller binds a free port itself and logs it (a port picked here and
            // released could be taken by another process before the controller binds it).
            .arg("--metrics-addr=127.0.0.1:0")
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", home_namespace)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info,reloader_fleet=debug,kube=warn")
            // Tests run many controllers at once: no fixed health port (a test may set one).
            .env("HEALTH_ADDR", "127.0.0.1:0")
            // The data views on the same listener (the same address), for `get`.
            .env("ADMIN_ADDR", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .expect("start the reloader binary");
        Controller { child: Some(child), port: 0, log, log_start }
    }

    /// Run `command` (a controller started some other way: an image's entrypoint) with its
    /// output in `target/test-logs/<name>.log`, and wait at most `within` for readiness;
    /// `None` if it did not become ready (it is then stopped).
    pub async fn try_start_command(name: &str, mut command: Command, within: Duration) -> Option<Controller> {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-logs");
        std::fs::create_dir_all(&dir).expect("create the test log folder");
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open the controller log");
        let log_start = file.metadata().map(|m| m.len()).unwrap_or(0);
        let err = file.try_clone().expect("clone the log handle");
        let child = command
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .expect("start the controller's command");
        let mut controller = Controller { child: Some(child), port: 0, log, log_start };
        controller.wait_ready(within).await.ok().map(|()| controller)
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let log = self.log.clone();
        let child = self.child.as_mut().expect("running");
        let deadline = tokio::time::Instant::now() + within;
        let mut port = None;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("reloader exited with {status} before becoming ready; see {}", log.display()));
            }
            port = port.or_else(|| listening_port(&log, self.log_start));
            if let Some(port) = port {
                let url = format!("http://127.0.0.1:{port}/readyz");
                if http_get(&url).await.is_some_and(|(code, _)| code == 200) {
                    self.port = port;
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("reloader did not become ready within {within:?}; see {}", log.display()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The port of its metrics and admin server on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await
    }

    /// The body of an admin endpoint, e.g. `/shards`; empty when it does not answer.
    pub async fn get(&self, path: &str) -> String {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        http_get(&url).await.map(|(_, body)| body).unwrap_or_default()
    }

    /// The value of one metric series, e.g. `reloader_reload_executed_total{success="true"}`.
    pub async fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// The sum of every series of metric `name`, whatever its labels.
    pub async fn metric_sum(&self, name: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The log of this start.
    fn this_start_log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.get(self.log_start as usize..).unwrap_or_default().to_string()
    }

    /// Whether a log line of this start contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.this_start_log().contains(text)
    }

    /// Log lines of this start that tell of a call the RBAC refused. (The watch error count
    /// cannot tell: a watch may also fail with 410 Gone and relist, which is no refusal.)
    pub fn refused_calls(&self) -> Vec<String> {
        let log = self.this_start_log();
        log.lines().filter(|l| l.to_ascii_lowercase().contains("forbidden")).map(str::to_string).collect()
    }

    /// The controller's resident memory in KiB (`VmRSS` of its process).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.as_ref().and_then(|c| c.id()).expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Established TCP connections from this controller to the API server (`ss`).
    pub async fn api_connections(&self) -> usize {
        let pid = self.child.as_ref().and_then(|c| c.id()).expect("running");
        let server = super::proxy::api_server_addr();
        let out = Command::new("ss").args(["-tnpH", "state", "established"]).output().await.expect("run ss");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&format!("pid={pid},")) && l.contains(&format!("{server} ")))
            .count()
    }

    /// LIST and GET requests this controller has sent so far, by series of its own API call
    /// counter (`verb` and `resource`), so that a difference names the request.
    pub async fn api_reads(&self) -> BTreeMap<String, f64> {
        self.metrics()
            .await
            .lines()
            .filter(|l| {
                l.starts_with("reloader_api_requests_total{")
                    && (l.contains("verb=\"list\"") || l.contains("verb=\"get\""))
            })
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse::<f64>().ok()?))
            })
            .collect()
    }

    /// SIGTERM and wait for a clean exit (it saves its checkpoint on the way out).
    pub async fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        if let Some(pid) = child.id() {
            // The kill command sends SIGTERM without unsafe code in the tests.
            let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
        }
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .unwrap_or_else(|_| panic!("reloader did not stop within 20s; see {}", self.log.display()))
            .expect("wait for reloader");
        assert!(status.success(), "reloader exited with {status}; see {}", self.log.display());
    }
}

/// Start one replica of a test fleet: 16 shards with Leases in `home`, short lease timings
/// (4 s / 3 s / 500 ms), serving the namespaces matching `selector`.
pub async fn start_fleet_replica(home: &str, name: &str, selector: &str) -> Controller {
    start_fleet_replica_via(home, name, selector, &kubeconfig_path()).await
}

/// [`start_fleet_replica`] reaching the API server through another kubeconfig (a proxy).
pub async fn start_fleet_replica_via(
    home: &str,
    name: &str,
    selector: &str,
    kubeconfig: &std::path::Path,
) -> Controller {
    start_fleet_replica_with(home, name, &[&format!("--namespace-selector={selector}")], kubeconfig).await
}

/// A test fleet replica with `args` (which choose its namespaces: `--namespace-selector=` or
/// `--namespaces=`, and anything else) on top of the fleet's shards and lease timings.
pub async fn start_fleet_replica_with(
    home: &str,
    name: &str,
    args: &[&str],
    kubeconfig: &std::path::Path,
) -> Controller {
    let mut all = vec![
        "--shards=16",
        "--enable-ha",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=500ms",
    ];
    all.extend_from_slice(args);
    Controller::start_with_kubeconfig(name, home, &all, kubeconfig).await
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// GET `url` (plain HTTP); the status code and body, or `None` when nothing answers.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (addr, path) = rest.split_once('/').map(|(a, p)| (a, format!("/{p}")))?;
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

/// The controller as a pod of `deployment` would run it: the first container's arguments (plus
/// `extra_args`) and environment, with the pod fields resolved as the kubelet would (namespace
/// `ns`, pod name `<deployment>-local`), credentials from `kubeconfig`.
pub async fn start_as_pod_of(
    deployment: &k8s_openapi::api::apps::v1::Deployment,
    ns: &str,
    kubeconfig: &std::path::Path,
    extra_args: &[&str],
) -> Controller {
    let name = format!("{}-local", deployment.metadata.name.clone().unwrap_or_default());
    let pod = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod template");
    let container = &pod.containers[0];
    let mut args: Vec<String> = container.args.clone().unwrap_or_default();
    args.extend(extra_args.iter().map(ToString::to_string));
    let container_json = serde_json::to_value(container).expect("a container is JSON");
    let env = pod_env(&container_json, ns, &name);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Controller::start_with_kubeconfig_env(&name, ns, &arg_refs, kubeconfig, &env_refs).await
}

/// A container's environment with the pod's fields resolved as the kubelet resolves them: the
/// pod's namespace and name, and the container's CPU and memory limits (the node's, 2 CPUs and
/// 4 GiB, without a limit), each in units of its divisor.
pub fn pod_env(container: &serde_json::Value, ns: &str, pod: &str) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().expect("an env name").to_string();
        let from = &var["valueFrom"];
        let value = match (
            var["value"].as_str(),
            from["fieldRef"]["fieldPath"].as_str(),
            from["resourceFieldRef"]["resource"].as_str(),
        ) {
            (Some(v), _, _) => v.to_string(),
            (None, Some("metadata.namespace"), _) => ns.to_string(),
            (None, Some("metadata.name"), _) => pod.to_string(),
            (None, _, Some("limits.cpu")) => {
                let limit = container["resources"]["limits"]["cpu"].as_str().map_or(2.0, cpu_cores);
                format!("{}", limit.ceil() as u64)
            }
            (None, _, Some("limits.memory")) => {
                let limit = container["resources"]["limits"]["memory"].as_str().map_or(4 << 30, memory_bytes);
                limit.to_string()
            }
            other => panic!("no local value for {name}: {other:?}"),
        };
        env.push((name, value));
    }
    env
}

/// `500m` or `2` CPUs.
fn cpu_cores(quantity: &str) -> f64 {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().unwrap_or(0.0) / 1000.0,
        None => quantity.parse().unwrap_or(0.0),
    }
}

/// `256Mi`, `1Gi` or plain bytes.
fn memory_bytes(quantity: &str) -> u64 {
    let units =
        [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("K", 1000), ("M", 1_000_000), ("G", 1_000_000_000)];
    units
        .iter()
        .find_map(|(suffix, unit)| quantity.strip_suffix(suffix).and_then(|n| n.parse::<u64>().ok()).map(|n| n * unit))
        .or_else(|| quantity.parse().ok())
        .unwrap_or(0)
}

/// The admin port a start logged in `log` after byte `from` (`admin server listening addr=...`).
fn listening_port(log: &std::path::Path, from: u64) -> Option<u16> {
    let bytes = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(bytes.get(usize::try_from(from).ok()?..)?);
    let line = text.lines().find(|l| l.contains("admin server listening"))?;
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("addr="))?;
    addr.rsplit(':').next()?.parse().ok()
}
