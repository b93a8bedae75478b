//! The `reloader` binary: parse configuration, connect to Kubernetes, wire the rooms, supervise.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use reloader_fleet::admin;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A sharded, highly-available drop-in successor to Stakater Reloader.
#[derive(Debug, Parser)]
#[command(name = "reloader", version)]
struct Args {
    /// Log format: `json`, or empty for text.
    #[arg(long = "log-format", default_value = "")]
    log_format: String,
    /// Log level: trace, debug, info, warning, error, fatal or panic.
    #[arg(long = "log-level", default_value = "info")]
    log_level: String,
    /// Address of the admin server (metrics, health, shard ownership).
    #[arg(long = "metrics-addr", default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        log_format,
        log_level,
        metrics_addr,
    } = Args::parse();
    init_tracing(&log_format, &log_level)?;

    // Kubeconfig from $KUBECONFIG or ~/.kube/config, else the in-cluster service account.
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client from the kubeconfig or in-cluster config")?;
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the Kubernetes API server")?;
    info!(version = %version.git_version, "connected to the Kubernetes API server");

    let shutdown = CancellationToken::new();
    let state = admin::AdminState::default();
    state
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    let admin_task = tokio::spawn(admin::serve(metrics_addr, state, shutdown.clone()));
    info!(addr = %metrics_addr, "admin server listening");

    tokio::select! {
        res = admin_task => res.context("admin task panicked")?.context("admin server stopped")?,
        () = wait_for_signal() => {
            info!("shutting down");
            shutdown.cancel();
        }
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn init_tracing(format: &str, level: &str) -> anyhow::Result<()> {
    let level = match level {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "fatal" | "panic" => "error",
        other => anyhow::bail!(
            "invalid --log-level {other:?}: expected one of trace, debug, info, warning, error, fatal, panic"
        ),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        "json" => builder.json().init(),
        _ => builder.init(),
    }
    Ok(())
}
