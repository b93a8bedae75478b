//! The `reloader` binary: read the flags, start logging, then run a command for people or the
//! controller (`reloader_fleet::runtime`).

use reloader_fleet::cli::{self, Logging};
use reloader_fleet::command;
use reloader_fleet::runtime::Runtime;

/// jemalloc gives freed pages back to the system on its own, where under glibc's allocator what
/// the first lists freed stayed resident (mimalloc, tried too, held more). `.cargo/config.toml`
/// builds it with one arena instead of four per core (`narenas:1`): each arena keeps pages of
/// its own, and this controller's few threads gain nothing from more; and it gives freed pages
/// back after one second instead of ten (`dirty_decay_ms:1000`), so what a burst of updates left
/// behind is gone by the next scrape. Figures: docs/performance.md, "Behind the code".
/// `_RJEM_MALLOC_CONF` overrides it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut settings = cli::parse()?.settings()?;
    init_tracing(&settings.logging);
    match settings.command.take() {
        Some(command) => command::run(command, settings).await,
        None => Runtime::build(settings).await?.run().await,
    }
}

/// Logs go to stderr, as Reloader's do; stdout is kept for command output. `RUST_LOG`, when
/// set, wins over `--log-level`.
fn init_tracing(logging: &Logging) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{},kube=warn", logging.level)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match logging.format.as_str() {
        "json" => builder.json().init(),
        _ => builder.init(),
    }
}
