//! The Reloader-compatible engine: pure decision rules apart from the actions that write.
//!
//! Pure (no client): [`keys`](Keys), [`rules`](decide), [`strategy`](plan), env var names.
//! Actions: the engine (`run`) and the checkpoint it keeps in the cluster.

mod alert;
mod api;
pub mod checkpoint;
pub mod duration;
mod engine;
mod env_var;
mod events;
pub mod explain;
mod keys;
pub mod lint;
pub mod meta_info;
mod metrics;
mod pause;
mod rules;
mod strategy;
mod webhook;
mod write;

pub use alert::{ALERT_QUEUE, Alert, AlertConfig, Sink, http_client, run_sender as run_alert_sender};
pub use api::FIELD_MANAGER;
pub use checkpoint::parse as parse_checkpoint;
pub use duration::{DurationError, parse_go_duration};
pub use engine::{Config, Damped, DampedSince, Error, FlapDamping, Inputs, Outputs, Pacing, run};
pub use env_var::env_var_name;
pub use keys::{
    COALESCE_WINDOW, CRONJOB_RELOAD_STRATEGY, Keys, LAST_RELOADED_FROM, RELOADED_HASHES, ROLLOUT_STRATEGY, TypedKeys,
};
pub use metrics::{CheckpointStatus, Metrics, NamespaceCounts, NamespaceStats, ShardCheckpoint};
pub use pause::{merge_patch, pause_patch, resume_patch};
pub use rules::{
    Decision, EXPLICIT_LIST_LIMIT, Mode, Options, Patterns, Problem, Refused, Rule, Rules, Verdict, compile_entry,
    named_entries, parse_go_bool, refused_too_many, target_container,
};
pub use strategy::{
    Item, OrphanedEnvVars, ReloadSource, Strategy, Target, apply_strategic, delete_marker, orphaned_env_vars, plan,
    plan_all,
};
pub use webhook::Webhook;
