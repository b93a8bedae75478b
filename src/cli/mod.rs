//! The command line: Reloader v1's flags with their spellings and type quirks, the v2
//! additions and this project's own, grouped by room in [`flags`] and flattened here into one
//! parser; [`Settings`] is what they say, checked.
//!
//! Every flag can also come from the environment variable Reloader v2 reads (the flag name in
//! UPPER_SNAKE case) and from a YAML, JSON or TOML file given with `--config` (keys are flag
//! names). Precedence: command line, then environment, then file, then defaults.

mod flags;
mod settings;
mod values;

use std::collections::BTreeMap;
use std::ffi::OsString;

use anyhow::{Context, bail};
use clap::Parser;

pub use flags::{AlertFlags, AnnotationFlags, FleetFlags, ProcessFlags, ReloadFlags, ServingFlags, WatchFlags};
pub use settings::{
    ClientSettings, Environment, FleetSettings, Logging, ReloadSettings, ServingSettings, Settings, WatchSettings,
};

/// A sharded, highly-available drop-in successor to Stakater Reloader.
#[derive(Debug, Parser)]
#[command(name = "reloader", version, args_override_self = true, args_conflicts_with_subcommands = false)]
pub struct Args {
    /// Read flags from this YAML, JSON or TOML file (keys are flag names without `--`).
    #[arg(long, env = "RELOADER_CONFIG", global = true)]
    pub config: Option<String>,
    #[command(flatten)]
    pub reload: ReloadFlags,
    #[command(flatten)]
    pub watch: WatchFlags,
    #[command(flatten)]
    pub annotations: AnnotationFlags,
    #[command(flatten)]
    pub fleet: FleetFlags,
    #[command(flatten)]
    pub serving: ServingFlags,
    #[command(flatten)]
    pub alerts: AlertFlags,
    #[command(flatten)]
    pub process: ProcessFlags,
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Where each setting's value came from, for messages: `flag --namespaces`,
    /// `environment variable NAMESPACES`, `config file x.yaml` (filled in by [`parse`]).
    #[arg(skip)]
    pub sources: BTreeMap<String, String>,
}

/// Commands for people; without one, `reloader` runs the controller.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Look at the fleet.
    Fleet {
        #[command(subcommand)]
        what: FleetCommand,
    },
    /// Say whether a change would reload a workload, and why: `explain deployment/web -n team-a`
    /// (every resource it uses or names) or `explain configmap/app -n team-a` (every workload
    /// a change concerns). Reads live objects with your kubeconfig; pass the controller's flags
    /// after it so that it decides with the same settings.
    Explain {
        /// KIND/NAME, KIND as kubectl takes it: deployment, deploy, daemonset, ds, statefulset,
        /// sts, cronjob, cj, job, rollout, deploymentconfig, dc, configmap, cm, secret,
        /// secretproviderclass, spc.
        target: String,
        /// The namespace (default: the kubeconfig's).
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
        /// text for people, json for scripts.
        #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
        output: String,
    },
    /// Print a completion script for a shell: `reloader completions bash >
    /// /etc/bash_completion.d/reloader`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `reloader man > reloader.1; man ./reloader.1`.
    Man,
}

#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Print which replica holds which shard, lease ages and namespace counts.
    Status,
}

/// The parser, named as it was called: `kubectl reloader` when installed as the kubectl plugin
/// `kubectl-reloader` (krew's convention), else `reloader`.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    match called_as().as_deref().and_then(|f| f.strip_prefix("kubectl-")) {
        Some(plugin) => Args::command().bin_name(format!("kubectl {}", plugin.replace('_', "-"))),
        None => Args::command(),
    }
}

/// The file name the program was started by: `reloader`, `kubectl-reloader`, ...
pub fn called_as() -> Option<String> {
    let called = std::env::args_os().next().map(std::path::PathBuf::from)?;
    called.file_name().map(|f| f.to_string_lossy().into_owned())
}

/// Parse the process arguments, with the config file's values placed before the command line
/// so that the command line wins.
pub fn parse() -> anyhow::Result<Args> {
    use clap::FromArgMatches;
    let mut cli: Vec<OsString> = std::env::args_os().collect();
    let first = Args::from_arg_matches(&command().get_matches_from(cli.iter())).unwrap_or_else(|e| e.exit());
    let Some(path) = first.config.clone() else {
        return with_sources(cli, 0, "");
    };
    let file_args = file_args(&path)?;
    let program = cli.remove(0);
    let merged: Vec<OsString> =
        std::iter::once(program).chain(file_args.iter().map(OsString::from)).chain(cli).collect();
    with_sources(merged, file_args.len(), &path).with_context(|| format!("invalid value in config file {path}"))
}

/// Parse `argv`, whose first `from_file` arguments after the program name came from config
/// file `file`, and note where each setting's value came from (the last occurrence wins, as
/// in parsing).
fn with_sources(argv: Vec<OsString>, from_file: usize, file: &str) -> anyhow::Result<Args> {
    use clap::FromArgMatches;
    use clap::parser::ValueSource;
    let matches = command().try_get_matches_from(argv)?;
    let mut args = Args::from_arg_matches(&matches)?;
    for arg in command().get_arguments() {
        let id = arg.get_id().as_str();
        let flag = format!("--{}", arg.get_long().unwrap_or(id));
        // Indices count the arguments after the program name from 1.
        let last_index = matches.indices_of(id).and_then(Iterator::max).unwrap_or(usize::MAX);
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) if last_index <= from_file => format!("config file {file}"),
            Some(ValueSource::CommandLine) => format!("flag {flag}"),
            Some(ValueSource::EnvVariable) => {
                format!("environment variable {}", arg.get_env().map(|e| e.to_string_lossy()).unwrap_or_default())
            }
            _ => format!("the default of {flag}"),
        };
        args.sources.insert(id.to_string(), source);
    }
    Ok(args)
}

fn file_args(path: &str) -> anyhow::Result<Vec<String>> {
    let settings = config::Config::builder()
        .add_source(config::File::with_name(path))
        .build()
        .with_context(|| format!("cannot read config file {path}"))?;
    let table = settings
        .try_deserialize::<BTreeMap<String, config::Value>>()
        .with_context(|| format!("config file {path} must be a map of flag names to values"))?;
    let mut args = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        if key == "config" {
            bail!("config file {path}: `config` cannot be set from a config file");
        }
        match value.clone().into_array() {
            Ok(items) => {
                let joined: Vec<String> = items.into_iter().map(|v| v.to_string()).collect();
                args.push(format!("{flag}={}", joined.join(",")));
            }
            Err(_) => args.push(format!("{flag}={value}")),
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests;
