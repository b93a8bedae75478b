//! Commands for people, run with the user's kubeconfig and the controller's flags (so that they
//! decide as the controller would), printing on stdout: `explain` and `fleet status`; and
//! `completions` and `man`, which need no cluster.

mod explain;
mod fleet_status;
mod manual;

use crate::cli::{Command, FleetCommand, Settings};
use crate::runtime::{self, compactor, discover, fleet_namespace};

/// Run `command`.
pub async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Completions { shell } => return manual::completions(shell, &mut std::io::stdout()),
        Command::Man => return manual::man_page(&mut std::io::stdout()),
        Command::Fleet { .. } | Command::Explain { .. } => {}
    }
    let connection = runtime::connect(&settings).await?;
    let client = connection.client.clone();
    let lease_namespace = fleet_namespace(&settings.fleet.lease_namespace, &settings.env, &client);
    let lease_prefix = settings.fleet.lease_prefix.as_str();
    match command {
        Command::Fleet { what: FleetCommand::Status } => {
            let names = (lease_prefix, settings.reload.checkpoint_name.as_str());
            fleet_status::print(client, &lease_namespace, names, &connection.ring, &settings.watch.filter).await
        }
        Command::Explain { target, namespace, output } => {
            let watched = discover(&client, &settings.watch).await;
            let reload = &settings.reload;
            let request = explain::Request {
                target: &target,
                namespace: namespace.unwrap_or_else(|| client.default_namespace().to_string()),
                json: output == "json",
                keys: reload.keys.clone(),
                options: crate::reload::Options { auto_reload_all: reload.auto_reload_all },
                scope: watched.scope(reload),
                compactor: compactor(&settings),
                filter: &settings.watch.filter,
                scoped_namespaces: settings.watch.scoped_namespaces.as_deref(),
                resource_label_selector: settings.watch.resource_label_selector.as_ref(),
                lease_namespace,
                lease_prefix,
                ring: &connection.ring,
                checkpoint_name: &settings.reload.checkpoint_name,
            };
            explain::print(client, request).await
        }
        Command::Completions { .. } | Command::Man => Ok(()),
    }
}
