//! The checkpoint: the hash last acted on for every resource, kept in a ConfigMap so that a
//! change made while no replica watched is still acted on (DESIGN principle 2).
//!
//! # Guarantees
//! - An entry is written only after every workload the change concerns records the hash, so
//!   a checkpoint can lag behind the workloads but never run ahead of them.
//! - A lagging checkpoint is harmless: replaying a change finds the hash already recorded on
//!   each workload and writes nothing.
//!
//! # Trust
//! The ConfigMap is read as untrusted input: one without this controller's labels (someone
//! else's ConfigMap of that name) is not used, a line that is not an entry of a valid name and
//! hash is skipped, and either is logged at error level and counted
//! (`reloader_errors_total{type="checkpoint_rejected"}`). What cannot be checked is who wrote
//! it: anyone who may write ConfigMaps in the controller's namespace can make it skip or replay
//! changes, so that namespace is the controller's own (docs/operations.md, "Security").
//!
//! # Format
//! One ConfigMap per shard, data key `checkpoint`, one line per resource:
//! `<C|S|P> <namespace> <name> <first 16 hex characters of the hash>`. 64 bits are plenty to
//! tell "changed" from "unchanged" and keep about 12,000 resources within the 1 MiB object limit.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use tracing::{error, warn};

use crate::reload::api::API_TIMEOUT;
use crate::shard::{is_dns_label, is_dns_subdomain};
use crate::watch::{DataHash, INTERNAL_LABEL, ResourceKey, ResourceKind, ResourceMap};

const DATA_KEY: &str = "checkpoint";
/// The labels every checkpoint carries: `app.kubernetes.io/managed-by`, and the internal
/// label the watches skip.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "reloader-fleet");

/// The short form of a hash kept in the checkpoint.
pub type ShortHash = u64;

pub fn short(hash: &DataHash) -> ShortHash {
    hash.short()
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the checkpoint ConfigMap failed; retrying later may help.
    #[error("checkpoint {namespace}/{name}: API call failed")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The call did not finish within the API timeout; retrying may help.
    #[error("checkpoint {namespace}/{name}: API call timed out")]
    Timeout { namespace: String, name: String },
}

/// Where a checkpoint lives and how to read and write it.
#[derive(Clone)]
pub struct Checkpoint {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// The resourceVersion last read or written, for the write precondition.
    resource_version: Option<String>,
    /// The digest of the text last read or written: a save of the same text writes nothing
    /// (the texts themselves were 1.7 MiB at 50,000 resources).
    text: Option<DataHash>,
    /// Why the last load used none or part of what it read (`foreign`, `unreadable`), for
    /// the engine to count.
    rejected: Option<&'static str>,
}

impl Checkpoint {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Checkpoint {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            resource_version: None,
            text: None,
            rejected: None,
        }
    }

    /// Why the last [`load`](Self::load) used none or part of what it read, if it did.
    pub fn rejected(&self) -> Option<&'static str> {
        self.rejected
    }

    fn api_error(&self, source: kube::Error) -> Error {
        Error::Api { namespace: self.namespace.clone(), name: self.name.clone(), source }
    }

    async fn timed<T>(&self, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, Error> {
        match tokio::time::timeout(API_TIMEOUT, call).await {
            Ok(result) => result.map_err(|e| self.api_error(e)),
            Err(_) => Err(Error::Timeout { namespace: self.namespace.clone(), name: self.name.clone() }),
        }
    }

    /// Load the checkpoint; `None` when it does not exist yet (a first start).
    ///
    /// # Errors
    /// When the ConfigMap cannot be read.
    pub async fn load(&mut self) -> Result<Option<HashMap<ResourceKey, ShortHash>>, Error> {
        let Some(cm) = self.timed(self.api.get_opt(&self.name)).await? else {
            self.resource_version = None;
            return Ok(None);
        };
        self.resource_version = cm.metadata.resource_version.clone();
        self.rejected = None;
        let labels = cm.metadata.labels.as_ref();
        if labels.and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) != Some(MANAGED_BY.1) {
            // Not ours (a ConfigMap of the same name, made by someone else): not trusted, and
            // replaced by the next save.
            error!(namespace = %self.namespace, name = %self.name,
                "the checkpoint ConfigMap was not written by reloader-fleet (it lacks the managed-by label); \
                 ignoring it and taking the current state as baseline");
            self.rejected = Some("foreign");
            return Ok(None);
        }
        let text = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)).map(String::as_str).unwrap_or("");
        self.text = Some(DataHash::of_bytes(text.as_bytes()));
        let (entries, unreadable) = parse(text);
        if unreadable > 0 && entries.is_empty() {
            // Nothing usable (edited by hand, or written by something else): taken like a first
            // start, so the current state is the baseline. Treating every resource as new
            // would reload all their workloads with --reload-on-create.
            warn!(namespace = %self.namespace, name = %self.name, unreadable,
                "the checkpoint is unreadable; taking the current state as baseline");
            self.rejected = Some("unreadable");
            return Ok(None);
        }
        if unreadable > 0 {
            warn!(namespace = %self.namespace, name = %self.name, unreadable, "skipping unreadable checkpoint lines");
            self.rejected = Some("unreadable");
        }
        Ok(Some(entries))
    }

    /// Write `entries` as the new checkpoint, guarded by the resourceVersion last seen. A
    /// conflict (someone else wrote) re-reads the version and writes again: this replica owns
    /// the checkpoint while it acts on the shard.
    ///
    /// # Errors
    /// When the ConfigMap cannot be written.
    pub async fn save(&mut self, entries: &ResourceMap<ShortHash>) -> Result<(), Error> {
        let text = render(entries);
        let digest = DataHash::of_bytes(text.as_bytes());
        if self.text == Some(digest) {
            return Ok(());
        }
        let data = BTreeMap::from([(DATA_KEY.to_string(), text)]);
        for _ in 0..3 {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    resource_version: self.resource_version.clone(),
                    labels: Some(BTreeMap::from([
                        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                        (INTERNAL_LABEL.to_string(), "checkpoint".to_string()),
                    ])),
                    ..ObjectMeta::default()
                },
                data: Some(data.clone()),
                ..ConfigMap::default()
            };
            let result = match &self.resource_version {
                None => self.timed(self.api.create(&PostParams::default(), &cm)).await,
                Some(_) => self.timed(self.api.replace(&self.name, &PostParams::default(), &cm)).await,
            };
            match result {
                Ok(written) => {
                    self.resource_version = written.metadata.resource_version;
                    self.text = Some(digest);
                    return Ok(());
                }
                Err(Error::Api { source: kube::Error::Api(status), .. }) if status.code == 409 => {
                    let current = self.timed(self.api.get_opt(&self.name)).await?;
                    self.resource_version = current.and_then(|c| c.metadata.resource_version);
                }
                Err(err) => return Err(err),
            }
        }
        Err(Error::Timeout { namespace: self.namespace.clone(), name: self.name.clone() })
    }
}

fn kind_letter(kind: ResourceKind) -> char {
    match kind {
        ResourceKind::ConfigMap => 'C',
        ResourceKind::Secret => 'S',
        ResourceKind::SecretProviderClass => 'P',
    }
}

fn render(entries: &ResourceMap<ShortHash>) -> String {
    let mut lines: Vec<String> =
        entries.iter().map(|(k, h)| format!("{} {} {} {h:016x}", kind_letter(k.kind), k.namespace, k.name)).collect();
    lines.sort_unstable();
    lines.join("\n")
}

/// The entries, and how many non-empty lines did not parse (skipped: at worst a resource is
/// treated as new). A line is exactly what [`render`] writes: a kind letter, a namespace name,
/// an object name and 16 hex digits.
pub fn parse(text: &str) -> (HashMap<ResourceKey, ShortHash>, usize) {
    let entries = text.lines().filter(|line| !line.trim().is_empty()).filter_map(|line| {
        let mut parts = line.split(' ');
        let kind = match parts.next()? {
            "C" => ResourceKind::ConfigMap,
            "S" => ResourceKind::Secret,
            "P" => ResourceKind::SecretProviderClass,
            _ => return None,
        };
        let (namespace, name, hash) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some()
            || !is_dns_label(namespace)
            || !is_dns_subdomain(name)
            || hash.len() != 16
            || !hash.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return None;
        }
        let hash = u64::from_str_radix(hash, 16).ok()?;
        Some((ResourceKey { kind, namespace: namespace.into(), name: name.into() }, hash))
    });
    let entries = entries.collect::<Vec<_>>();
    let unreadable = text.lines().filter(|l| !l.trim().is_empty()).count() - entries.len();
    (entries.into_iter().collect(), unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_the_text_form() {
        let mut entries = ResourceMap::default();
        entries.insert(
            ResourceKey { kind: ResourceKind::ConfigMap, namespace: "a".into(), name: "my.cfg".into() },
            short(&DataHash::of_bytes(b"x")),
        );
        entries.insert(ResourceKey { kind: ResourceKind::Secret, namespace: "b".into(), name: "s".into() }, 0);
        let (parsed, unreadable) = parse(&render(&entries));
        assert_eq!((parsed.into_iter().collect::<ResourceMap<_>>(), unreadable), (entries, 0));
    }

    #[test]
    fn garbage_lines_are_skipped() {
        assert_eq!(parse("X a b 00\nC only-two\n\nC a b nothex"), (HashMap::new(), 3));
        let bad = [
            "C Bad_NS b 0123456789abcdef",
            "C a ../b 0123456789abcdef",
            "C a b 0123456789abcdef extra",
            "C a b 0123456789abcdef0",
            "C a b +123456789abcdef",
        ];
        assert_eq!(parse(&bad.join("\n")), (HashMap::new(), 5));
    }

    #[test]
    fn short_hash_is_the_first_64_bits() {
        let h = DataHash::of_bytes(b"");
        assert_eq!(format!("{:016x}", short(&h)), "da39a3ee5e6b4b0d");
    }
}
