//! What this replica knows of the fleet's Leases: each as observed, with when *this* replica
//! saw its resourceVersion change (another holder's expiry is judged from that, never from
//! wall clocks), taken in from LISTs and watch events so that neither undoes a newer write of
//! this replica's own.
//!
//! ```text
//!  LIST (each tick, answered alongside the rounds) ─▶ merge_listing ─┐
//!  watch event of a Lease ─────────────────────────▶ take_in ────────┴─▶ observed ─▶ live members, ring to yield to
//! ```

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, ObjectList};
use tokio::time::Instant;

use super::{API_TIMEOUT, Manager};
use crate::lease::handoff::Sighting;
use crate::lease::record::{FLEET_LABEL, RING_ANNOTATION, holder_of, is_role};
use crate::lease::revision;
use crate::shard::is_fingerprint;

/// A Lease as observed: its record and when this replica saw its resourceVersion change.
#[derive(Clone, Debug)]
pub(super) struct Observed {
    pub lease: Lease,
    pub changed_at: Instant,
}

impl Observed {
    pub(super) fn holder(&self) -> &str {
        holder_of(&self.lease)
    }

    /// The Lease's duration, at most `ceiling` (this fleet's own): a Lease is untrusted input,
    /// and one written with a day-long `leaseDurationSeconds` must not keep its shard, or a
    /// ring it names, standing for a day once nobody renews it.
    pub(super) fn duration(&self, ceiling: Duration) -> Duration {
        let secs = self.lease.spec.as_ref().and_then(|s| s.lease_duration_seconds).unwrap_or(0);
        Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(ceiling)
    }

    /// Whether nobody renewed the Lease within its duration (at most `ceiling`).
    pub(super) fn expired(&self, now: Instant, ceiling: Duration) -> bool {
        now.saturating_duration_since(self.changed_at) >= self.duration(ceiling)
    }

    pub(super) fn resource_version(&self) -> Option<String> {
        self.lease.metadata.resource_version.clone()
    }

    /// The writer's ring; empty for Leases written before rings were recorded.
    pub(super) fn ring(&self) -> &str {
        self.lease.metadata.annotations.as_ref().and_then(|a| a.get(RING_ANNOTATION)).map_or("", String::as_str)
    }
}

/// What a round starts from.
pub(super) enum Look {
    /// LIST the fleet's Leases (every tick, and when a Lease was deleted).
    List,
    /// What was observed already: this replica's own change (leaving, loaded, let go) needs no
    /// fresh look, and its own Leases are as its writes returned them.
    Local,
    /// What was observed already, plus the Leases a watch just saw.
    Seen(Vec<Lease>),
    /// What was observed already, merged with the answer of a LIST sent while rounds went on.
    Listed(Result<ObjectList<Lease>, kube::Error>),
}

/// The LIST of a look, answered while rounds go on: under load it takes 0.1-0.4 s, and a
/// round that waited for it held up a handoff's next step (an heir reporting a shard loaded,
/// a leaver withdrawing it) by as much.
pub(super) type Listing = BoxFuture<'static, Result<ObjectList<Lease>, kube::Error>>;

impl Look {
    /// What started the round, for the debug log of a handoff's timeline.
    pub(super) fn cause(&self) -> &'static str {
        match self {
            Look::List => "look",
            Look::Listed(_) => "listed",
            Look::Local => "local change",
            Look::Seen(_) => "watched lease",
        }
    }

    pub(super) fn seen(sightings: Vec<Sighting>) -> Self {
        let mut leases = Vec::with_capacity(sightings.len());
        for sighting in sightings {
            match sighting {
                Sighting::Changed(lease) => leases.push(*lease),
                Sighting::Deleted => return Look::List,
            }
        }
        Look::Seen(leases)
    }
}

impl Manager {
    /// Note Leases a watch saw, unless this replica holds a newer state of them (its own
    /// writes). `false` when a resourceVersion does not parse: the round LISTs instead.
    pub(super) fn take_in(&mut self, leases: Vec<Lease>, now: Instant) -> bool {
        for lease in leases {
            let Some(name) = lease.metadata.name.clone() else { continue };
            match supersedes(&lease, self.observed.get(&name).map(|o| &o.lease)) {
                Some(true) => {
                    self.observed.insert(name, Observed { lease, changed_at: now });
                }
                Some(false) => {}
                None => return false,
            }
        }
        true
    }

    /// The LIST of the fleet's Leases, to await now or alongside the rounds.
    pub(super) fn list_leases(&self) -> Listing {
        let api = self.api.clone();
        let params = ListParams::default().labels(&format!("{FLEET_LABEL}={}", self.config.prefix));
        async move {
            match tokio::time::timeout(API_TIMEOUT, api.list(&params)).await {
                Ok(result) => result,
                Err(_) => Err(kube::Error::Service("listing leases timed out".into())),
            }
        }
        .boxed()
    }

    /// LIST the fleet's Leases and note which changed since the last look.
    pub(super) async fn observe(&mut self, now: Instant) -> Result<(), kube::Error> {
        let list = self.list_leases().await?;
        self.take_listing(list, now).await;
        Ok(())
    }

    /// Take in a LIST of the fleet's Leases (see [`merge_listing`]), and refresh the Leases
    /// adopted from outside the fleet's labels.
    pub(super) async fn take_listing(&mut self, list: ObjectList<Lease>, now: Instant) {
        let adopted = &self.adopted;
        let mut seen = merge_listing(&self.observed, list, now, |name| !adopted.contains_key(name));
        // Unlabelled Leases are refreshed by GET until one of our writes labels them.
        for (name, old) in std::mem::take(&mut self.adopted) {
            if seen.contains_key(&name) {
                continue;
            }
            match tokio::time::timeout(API_TIMEOUT, self.api.get_opt(&name)).await {
                Ok(Ok(Some(lease))) => {
                    let changed_at = if old.lease.metadata.resource_version == lease.metadata.resource_version {
                        old.changed_at
                    } else {
                        now
                    };
                    let observed = Observed { lease, changed_at };
                    self.adopted.insert(name.clone(), observed.clone());
                    seen.insert(name, observed);
                }
                Ok(Ok(None)) => {}
                _ => {
                    self.adopted.insert(name, old);
                }
            }
        }
        self.observed = seen;
    }

    /// The ring this replica must give way to: that of a live Lease held by another replica
    /// whose ring differs from ours and sorts first. Unlabelled Leases (Reloader's own lock)
    /// are not fleet members and are waited for by expiry instead.
    pub(super) fn ring_to_yield_to(&self, now: Instant) -> Option<String> {
        let ceiling = self.config.lease_duration;
        self.observed
            .iter()
            .filter(|(name, _)| !self.adopted.contains_key(*name))
            .map(|(_, o)| o)
            .filter(|o| !o.holder().is_empty() && o.holder() != self.config.identity && !o.expired(now, ceiling))
            .filter(|o| self.holders.believes(o.holder()))
            .map(Observed::ring)
            // A ring annotation that is no ring (written by hand, or garbage) is not one to
            // give way to: it would stop the whole fleet.
            .filter(|ring| ring.is_empty() || is_fingerprint(ring))
            .filter(|ring| *ring < self.config.ring.as_str())
            .min()
            .map(str::to_string)
    }

    /// Members whose membership Lease changed within its duration, plus this replica.
    pub(super) fn live_members(&self, now: Instant) -> Vec<String> {
        let ceiling = self.config.lease_duration;
        let mut members: BTreeSet<String> = self
            .observed
            .values()
            .filter(|o| is_role(&o.lease, "member") && !o.holder().is_empty() && !o.expired(now, ceiling))
            .filter(|o| self.holders.believes(o.holder()))
            .filter(|o| o.ring() == self.config.ring)
            .map(|o| o.holder().to_string())
            .collect();
        members.insert(self.config.identity.clone());
        members.into_iter().collect()
    }
}

/// The Leases observed after a LIST, noting which changed since the last look. A LIST
/// answered while rounds went on may be older than what they wrote or watched meanwhile: a
/// Lease known at a newer resourceVersion stays as known (a release of ours must never come
/// back as held), and so does one missing from the LIST but written after its snapshot (of
/// those `labelled`: the others are never listed).
fn merge_listing(
    observed: &HashMap<String, Observed>,
    list: ObjectList<Lease>,
    now: Instant,
    labelled: impl Fn(&str) -> bool,
) -> HashMap<String, Observed> {
    let snapshot = revision(list.metadata.resource_version.as_deref());
    let mut seen = HashMap::new();
    for lease in list.items {
        let Some(name) = lease.metadata.name.clone() else { continue };
        let known = observed.get(&name);
        if let Some(known) = known.filter(|k| supersedes(&k.lease, Some(&lease)) == Some(true)) {
            seen.insert(name, known.clone());
            continue;
        }
        let changed_at = match known {
            Some(old) if old.lease.metadata.resource_version == lease.metadata.resource_version => old.changed_at,
            _ => now,
        };
        seen.insert(name, Observed { lease, changed_at });
    }
    for (name, known) in observed {
        let written_since = snapshot.zip(revision(known.lease.metadata.resource_version.as_deref()));
        if labelled(name) && !seen.contains_key(name) && written_since.is_some_and(|(listed, known)| known > listed) {
            seen.insert(name.clone(), known.clone());
        }
    }
    seen
}

/// Whether `seen` is a newer state of a Lease than `known`; `None` when their
/// resourceVersions do not tell.
fn supersedes(seen: &Lease, known: Option<&Lease>) -> Option<bool> {
    let seen = revision(seen.metadata.resource_version.as_deref())?;
    match known {
        None => Some(true),
        Some(known) => Some(seen > revision(known.metadata.resource_version.as_deref())?),
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn at(resource_version: &str) -> Lease {
        Lease {
            metadata: ObjectMeta { resource_version: Some(resource_version.into()), ..ObjectMeta::default() },
            ..Lease::default()
        }
    }

    fn named(name: &str, resource_version: &str) -> Lease {
        let mut lease = at(resource_version);
        lease.metadata.name = Some(name.into());
        lease
    }

    fn listing(resource_version: &str, items: Vec<Lease>) -> ObjectList<Lease> {
        ObjectList {
            types: Default::default(),
            metadata: kube::api::ListMeta { resource_version: Some(resource_version.into()), ..Default::default() },
            items,
        }
    }

    #[test]
    fn a_listing_answered_late_never_undoes_what_was_written_meanwhile() {
        let then = Instant::now();
        let known = |name: &str, rv: &str| (name.to_string(), Observed { lease: named(name, rv), changed_at: then });
        let observed = HashMap::from([
            known("released-by-us", "20"),
            known("unchanged", "5"),
            known("renewed-by-them", "6"),
            known("created-since", "21"),
            known("deleted", "7"),
        ]);
        let list =
            listing("15", vec![named("released-by-us", "12"), named("unchanged", "5"), named("renewed-by-them", "14")]);
        let later = then + Duration::from_secs(1);
        let merged = merge_listing(&observed, list, later, |_| true);
        let rv = |name: &str| merged.get(name).and_then(|o| o.lease.metadata.resource_version.clone());
        assert_eq!(rv("released-by-us").as_deref(), Some("20"), "our newer write stays");
        assert_eq!(rv("renewed-by-them").as_deref(), Some("14"), "their newer write is taken in");
        assert_eq!(merged["renewed-by-them"].changed_at, later, "and noted as changed now");
        assert_eq!(merged["unchanged"].changed_at, then, "an unchanged Lease keeps when it last changed");
        assert_eq!(rv("created-since").as_deref(), Some("21"), "created after the snapshot: kept");
        assert!(!merged.contains_key("deleted"), "gone before the snapshot: dropped");
        let unlabelled = merge_listing(&observed, listing("15", vec![]), later, |name| name != "created-since");
        assert!(!unlabelled.contains_key("created-since"), "a Lease never listed is not kept by the listing");
    }

    #[test]
    fn a_watched_lease_never_undoes_a_newer_write_of_our_own() {
        assert_eq!(supersedes(&at("12"), Some(&at("11"))), Some(true));
        assert_eq!(supersedes(&at("12"), None), Some(true));
        assert_eq!(supersedes(&at("11"), Some(&at("12"))), Some(false), "an event older than our write");
        assert_eq!(supersedes(&at("12"), Some(&at("12"))), Some(false), "our own write, seen again");
        assert_eq!(supersedes(&at("opaque"), Some(&at("12"))), None);
        assert_eq!(supersedes(&at("12"), Some(&at("opaque"))), None);
    }
}
