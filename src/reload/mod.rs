//! The Reloader-compatible engine: pure decision rules apart from the actions that write.

mod env_var;
mod keys;
mod rules;

pub use env_var::env_var_name;
pub use keys::{Keys, LAST_RELOADED_FROM, RELOADED_HASHES, TypedKeys};
pub use rules::{Mode, Options, Problem, Verdict, decide, target_container};
