//! The admin HTTP server: Prometheus metrics, liveness, readiness and the fleet views.
//!
//! Reloader serves everything on `:9090` (`/metrics`, `/live`), and v2 adds `/healthz` and
//! `/readyz` on `--health-addr` (`:8080`); both addresses answer the probes here, so the probes
//! of either chart keep working. The data views (`/shards`, `/namespaces`, `/explain`) name
//! workloads and Secrets and answer from the store: they listen on `--admin-addr`, loopback
//! by default, so that `kubectl port-forward` is the way in. Every listener bounds its
//! connections, its requests at once and each request's time (`listener`).

mod api_calls;
mod explain;
mod fleet;
mod listener;
mod pprof;
mod router;

pub use api_calls::ApiCalls;
pub use explain::ExplainSettings;
pub use fleet::FleetView;
pub use pprof::{pprof_router, serve_pprof};
pub use router::{Addresses, AdminState, Error, data_router, router, serve};
