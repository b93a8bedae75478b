//! The integration tests, one binary: each module is one subject, run against the project's real
//! control plane (`hack/cluster`), and `support` holds what they share. One binary links and
//! compiles the helpers once, and its tests share the test threads instead of each file waiting
//! for the slowest test of the one before. `cargo test --test it fleet::` runs one subject.
//!
//! Only tests/outages.rs is a binary of its own: it stops the API server, which would break any
//! test running beside it.

mod support;

mod alerts;
mod api_calls;
mod bad_input;
mod chaos;
mod chart;
mod chart_parity;
mod checkpoint;
mod control_plane;
mod custom_kinds;
mod dashboard;
mod docs;
mod explain;
mod fleet;
mod fleet_scoped;
mod image;
mod kinds;
mod kubectl_plugin;
mod leases;
mod lint;
mod manifests;
mod migrating;
mod pause;
mod properties;
mod reconnect;
mod reliability;
mod reload_flags;
mod reload_rules;
mod restart;
mod rollout_control;
mod server_sharding;
mod used_keys;
