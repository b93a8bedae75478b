//! `reloader explain KIND/NAME -n NS`: the engine's answer for live objects, read with the
//! user's kubeconfig. The objects of the namespace go into a store of their own, compacted as
//! the watches compact them, and the same decision code as the admin endpoint's answers.

use crate::reload::checkpoint::{Checkpoint, SAVED_AT_ANNOTATION};
use crate::reload::explain::{self, Explainer, Scope, Serving, Subject};
use crate::reload::{Keys, Options, Rules};
use crate::shard::{LabelSelector, NamespaceFilter, Ring};
use crate::watch::{Compactor, ResourceKey, ResourceKind, Snapshot, Store};
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::PartialObjectMeta;
use kube::{Api, Client};

/// Everything the command decides with, as the controller would with the same flags.
pub struct Request<'a> {
    pub target: &'a str,
    pub namespace: String,
    pub json: bool,
    pub keys: Keys,
    pub options: Options,
    pub scope: Scope,
    pub compactor: Compactor,
    pub filter: &'a NamespaceFilter,
    pub scoped_namespaces: Option<&'a [String]>,
    pub resource_label_selector: Option<&'a LabelSelector>,
    /// The fleet's Leases: namespace, name prefix, and the ring of `--shards` and
    /// `--shard-placement` when they record none.
    pub lease_namespace: String,
    pub lease_prefix: &'a str,
    pub ring: &'a Ring,
    /// `--checkpoint-name`: the shard's checkpoint, in the Leases' namespace, says when it was
    /// last saved.
    pub checkpoint_name: &'a str,
}

/// Seconds since the checkpoint of `shard` (of `shards`) was saved; `None` when there is none
/// (or it cannot be read: a detail of the answer).
async fn checkpoint_age(client: &Client, request: &Request<'_>, shard: u32, shards: u32) -> Option<u64> {
    let name = Checkpoint::name_of(request.checkpoint_name, shard, shards);
    let api: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), &request.lease_namespace);
    let head = api.get_metadata_opt(&name).await.ok()??;
    let saved: jiff::Timestamp = head.metadata.annotations?.get(SAVED_AT_ANNOTATION)?.parse().ok()?;
    Some(jiff::Timestamp::now().duration_since(saved).as_secs().max(0) as u64)
}

/// Print the answer on stdout.
pub async fn print(client: Client, request: Request<'_>) -> anyhow::Result<()> {
    let Some((kind, name)) = request.target.split_once('/') else {
        bail!("expected KIND/NAME, like deployment/web or configmap/app-config (got {:?})", request.target);
    };
    let subject = Subject::parse(kind).map_err(anyhow::Error::msg)?;
    let ns = request.namespace.as_str();

    let namespaces: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let labels = match namespaces.get_metadata_opt(ns).await.with_context(|| format!("cannot read namespace {ns}"))? {
        Some(object) => object.metadata.labels.unwrap_or_default(),
        None => bail!("namespace {ns} does not exist"),
    };
    let mut serving = Serving::default();
    if let Some(scoped) = request.scoped_namespaces.filter(|list| !list.iter().any(|n| n == ns)) {
        serving.not_selected = Some(format!("not in --namespaces ({})", scoped.join(",")));
    } else {
        let selection = request.filter.select(ns, &labels);
        serving.not_selected = (!selection.is_selected()).then(|| selection.reason().to_string());
    }
    match super::fleet_status::serving(client.clone(), &request.lease_namespace, request.lease_prefix, request.ring, ns)
        .await
    {
        Ok(Some((shard, replica, shards))) => {
            (serving.shard, serving.replica) = (Some(shard), replica);
            serving.checkpoint_saved_seconds_ago = checkpoint_age(&client, &request, shard, shards).await;
        }
        Ok(None) => {
            let shard = request.ring.shard_of(ns);
            serving.checkpoint_saved_seconds_ago =
                checkpoint_age(&client, &request, shard, request.ring.shards()).await;
        }
        // Reading Leases is a detail of the answer: without the permission, say so and go on.
        Err(err) => tracing::warn!(error = %format!("{err:#}"), "cannot tell which replica serves the namespace"),
    }

    let (store, writer) = Store::new(request.keys.explicit_keys());
    let snapshot = Snapshot {
        namespace: ns,
        kinds: &request.scope.kinds,
        resources: &request.scope.resources,
        label_selector: request.resource_label_selector,
        compactor: &request.compactor,
    };
    let left_out = snapshot.load(&client, &writer).await?;
    let selector = request.resource_label_selector.map(ToString::to_string).unwrap_or_default();
    let absent = |key: &ResourceKey| {
        if left_out.contains(key) {
            format!("{} {} does not match --resource-label-selector {selector}", key.kind.kind(), key.name)
        } else if key.kind == ResourceKind::SecretProviderClass {
            format!("no SecretProviderClass {} reported by a pod (SecretProviderClassPodStatus)", key.name)
        } else {
            format!("no {} {} in namespace {}", key.kind.kind(), key.name, key.namespace)
        }
    };
    let rules = Rules::new(request.keys.clone(), request.options.clone());
    let mut explainer = Explainer { rules, store: &store, scope: &request.scope, absent_reason: &absent, damped: None };
    let report = explainer.explain(subject, ns, name, serving);
    if request.json {
        println!("{}", serde_json::to_string_pretty(&report).context("serializing the report")?);
    } else {
        print!("{}", explain::text(&report));
    }
    Ok(())
}
