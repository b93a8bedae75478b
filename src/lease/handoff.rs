//! Warm handoff: a shard changes hands only once its next holder has loaded it, so a rolling
//! restart or a scale-up leaves no shard unserved while the heir lists what it gains.
//!
//! ```text
//!  leaver (SIGTERM): its membership Lease says leaving=true ─▶ the others place shards without it
//!  heir:   watches the shards it is to get ("warming") ─▶ its membership Lease says warm=<loaded>
//!  holder: withdraws a shard once its heir's `warm` lists it (or after the renew deadline)
//!          ─▶ drain, checkpoint, release ─▶ the heir acquires it and acts at once
//! ```
//! With `--hot-standby` the heir has loaded the shards before any departure (those it would be
//! given if any one other member left), and reports them in `warm` already: the holder
//! withdraws at once, and only Leases move.
//!
//! A member whose Lease has no `warm` annotation does not report (an older version, or
//! cluster-wide watches that are not server-sharded: they hold every shard already) and is not
//! waited for.

use std::collections::BTreeSet;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::debug;

use super::record::{FLEET_LABEL, holder_of, is_role};

/// On a membership Lease: the replica is leaving; place shards without it.
pub const LEAVING_ANNOTATION: &str = "reloader-fleet.stakater.com/leaving";
/// On a membership Lease: the shards this replica is to get and has loaded (comma-separated,
/// maybe empty). Present when the replica reports them.
pub const WARM_ANNOTATION: &str = "reloader-fleet.stakater.com/warm";

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a membership Lease says its replica is leaving.
pub(super) fn is_leaving(lease: &Lease) -> bool {
    annotation(lease, LEAVING_ANNOTATION) == Some("true")
}

/// The shards a membership Lease reports loaded; `None` when its replica does not report.
pub(super) fn warm_of(lease: &Lease) -> Option<BTreeSet<u32>> {
    annotation(lease, WARM_ANNOTATION).map(parse_shards)
}

pub(super) fn format_shards(shards: &BTreeSet<u32>) -> String {
    shards.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Shards written by [`format_shards`]; anything else in the list, and any number past the
/// largest shard count, is ignored (an annotation is untrusted input).
pub fn parse_shards(text: &str) -> BTreeSet<u32> {
    text.split(',').filter_map(|s| s.trim().parse().ok()).filter(|s| *s < crate::shard::MAX_SHARDS).collect()
}

/// What a watch of the fleet's Leases saw that a round should act on at once.
pub(super) enum Sighting {
    /// A Lease as it is now: a shard Lease given back, or a membership Lease that leaves or
    /// reports loaded shards (a handoff in progress). The round acts on it without a LIST.
    Changed(Box<Lease>),
    /// A Lease deleted (a replica gone): the round LISTs.
    Deleted,
}

/// A [`Sighting`] each time a watch of the fleet's Leases sees what a round should act on at
/// once. The survivors' next round need not wait for the next look, up to 0.5 s away, nor for
/// a LIST. The look stays what decides; where RBAC does not allow watching Leases (an install
/// from before the fleet's RBAC had `watch`) this stream only logs at debug and the look is all
/// there is.
pub(super) fn lease_events(api: Api<Lease>, prefix: &str) -> BoxStream<'static, Sighting> {
    let config = watcher::Config::default().labels(&format!("{FLEET_LABEL}={prefix}"));
    watcher(api, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(lease)) if is_role(&lease, "member") => {
                    let news = is_leaving(&lease) || warm_of(&lease).is_some_and(|w| !w.is_empty());
                    news.then_some(Sighting::Changed(Box::new(lease)))
                }
                Ok(watcher::Event::Apply(lease)) => {
                    holder_of(&lease).is_empty().then_some(Sighting::Changed(Box::new(lease)))
                }
                Ok(watcher::Event::Delete(_)) => Some(Sighting::Deleted),
                Ok(_) => None,
                Err(err) => {
                    debug!(error = %err, "watching the fleet's Leases failed; looking every 0.5 s instead");
                    None
                }
            }
        })
        .boxed()
}

/// The next change of an optional receiver (pending forever without one, or once closed).
pub(super) async fn changed<T>(receiver: Option<&mut watch::Receiver<T>>) -> Option<()> {
    match receiver {
        Some(receiver) => receiver.changed().await.ok(),
        None => std::future::pending().await,
    }
}

/// Whether what an optional receiver listens to still runs: its sender lives (the engine's
/// active shards, the watches' loaded ones). No receiver counts as running.
pub(super) fn is_open<T>(receiver: Option<&watch::Receiver<T>>) -> bool {
    receiver.is_none_or(|r| r.has_changed().is_ok())
}

/// What a leaving replica knows when it decides whether to stop waiting for its heirs.
pub(super) struct Leaving {
    /// It still holds a shard's Lease.
    pub holding: bool,
    /// Some member it places shards on reports what it has loaded.
    pub heirs_report: bool,
    /// It has waited the renew deadline since it began to leave.
    pub waited_out: bool,
    /// Its engine and watches still run, so its shards are served while it waits.
    pub serving: bool,
}

impl Leaving {
    /// Done waiting: nothing left to hand over, nobody to wait for, waited long enough, or
    /// nothing serves the shards meanwhile (a failed engine or watch task hands them over
    /// cold at once, instead of leaving them unserved for up to the renew deadline).
    pub(super) fn done(&self) -> bool {
        !self.holding || !self.heirs_report || self.waited_out || !self.serving
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Ownership;

    #[test]
    fn a_leaver_waits_only_while_it_serves_shards_an_heir_is_loading() {
        let waiting = Leaving { holding: true, heirs_report: true, waited_out: false, serving: true };
        assert!(!waiting.done());
        assert!(Leaving { holding: false, ..waiting }.done());
        assert!(Leaving { heirs_report: false, ..waiting }.done());
        assert!(Leaving { waited_out: true, ..waiting }.done());
        assert!(Leaving { serving: false, ..waiting }.done());
    }

    #[test]
    fn a_receiver_is_open_while_its_sender_lives() {
        let (tx, rx) = watch::channel(BTreeSet::<u32>::new());
        assert!(is_open(Some(&rx)));
        assert!(is_open::<()>(None));
        drop(tx);
        assert!(!is_open(Some(&rx)), "the engine or watch task that held the sender is gone");
    }

    #[test]
    fn a_leaving_replica_keeps_watching_its_shards_until_it_holds_none() {
        let watching = BTreeSet::from([1, 2, 3]);
        let staying = Ownership { held: BTreeSet::from([1, 2]), warming: BTreeSet::from([4]), ..Default::default() };
        assert_eq!(staying.to_watch(&watching), BTreeSet::from([1, 2, 4]), "held and warming, shard 3 dropped");
        let leaving = Ownership { held: BTreeSet::from([2]), leaving: true, ..Default::default() };
        assert_eq!(leaving.to_watch(&watching), watching, "shards let go stay watched while one is held");
        let gone = Ownership { leaving: true, ..Default::default() };
        assert_eq!(gone.to_watch(&watching), BTreeSet::new(), "nothing once nothing is held");
    }

    #[test]
    fn shard_lists_round_trip_and_ignore_junk() {
        let shards = BTreeSet::from([0, 3, 15]);
        assert_eq!(format_shards(&shards), "0,3,15");
        assert_eq!(parse_shards(&format_shards(&shards)), shards);
        assert_eq!(parse_shards(""), BTreeSet::new());
        assert_eq!(parse_shards("2, x,-1,7"), BTreeSet::from([2, 7]));
    }
}
