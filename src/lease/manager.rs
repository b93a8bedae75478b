//! The lease task: one Lease per shard and one membership Lease per replica, in client-go's
//! LeaseLock format, acquired and renewed with resourceVersion preconditions.
//!
//! ```text
//!  every 0.5 s:  LIST fleet Leases ─▶ live members ─▶ assign() ─▶ my desired shards
//!                renew held+desired (each retry period) │ release held+undesired │ acquire desired+free
//!                publish: held shards renewed within the renew deadline, and what to warm
//!  at once, on a watched handoff Lease or a change here (leaving, loaded, let go): the same
//!                round from what is observed already, without the LIST
//! ```
//! A round's writes go out together (`writes`), so a handoff costs round trips, not the sum of
//! them.
//!
//! # Guarantees
//! - Another holder's Lease counts as expired only after its `leaseDurationSeconds` has passed
//!   since *this replica observed* its last change (its resourceVersion), never by comparing
//!   wall clocks.
//! - A shard is published as held only while the last successful acquire or renew was *sent*
//!   less than `renew_deadline` ago on the monotonic clock, so a replica cut off from the API
//!   server stops acting before any other replica may take the shard
//!   (`renew_deadline < lease_duration`).
//! - Every write carries the resourceVersion last observed; a conflict means someone else
//!   wrote first, and the next round decides again from a fresh LIST. A watched Lease is
//!   taken in only when its resourceVersion is newer than the one observed, so an event
//!   never undoes a later write of this replica's.
//!
//! - Replicas that place namespaces differently (another shard count or ring version, as during
//!   a rolling update that changes `--shards`) never act at once: each Lease records its
//!   writer's ring, and while a live Lease of a ring that sorts first exists, a replica of
//!   another ring gives its shards back and takes none (Leases written before rings were
//!   recorded sort first, so an upgraded fleet waits for the old replicas to go).
//!
//! # Assumptions
//! Clocks may be skewed but advance at similar rates; a write that hangs past the API timeout
//! is abandoned (and counts as failed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::assignment::{assign, standby};
use crate::lease::fence::{fence, lock};
use crate::lease::handoff::{
    LEAVING_ANNOTATION, Leaving, WARM_ANNOTATION, changed, format_shards, is_leaving, is_open, lease_events, warm_of,
};
use crate::lease::holders::Holders;
use crate::lease::metrics::Metrics;
use crate::lease::ownership::{Ownership, Publisher, ShardState, ShardStatus, Shards};
use observe::{Listing, Look, Observed};
use writes::Action;

mod observe;
mod writes;

const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the fleet's Leases are looked at (renewals still wait for the retry period).
const OBSERVE_PERIOD: Duration = Duration::from_millis(500);

/// Lease timings and names.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace of the Leases (`POD_NAMESPACE`).
    pub namespace: String,
    /// This replica's identity (`POD_NAME`), written as `holderIdentity`.
    pub identity: String,
    /// The namespace of the fleet's pods (`POD_NAMESPACE`): a holder is believed when it is a
    /// pod there running as this replica's ServiceAccount.
    pub pod_namespace: String,
    /// Lease name prefix (`--leader-election-id`). With one shard the shard Lease is named
    /// exactly this, like Reloader's lock; otherwise `<prefix>-shard-<n>`.
    pub prefix: String,
    pub shards: u32,
    /// This replica's Lease duration, and the longest any other Lease is believed to last
    /// (Leases are untrusted input: a longer `leaseDurationSeconds` is cut to this).
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// The ring's fingerprint (`Ring::fingerprint`): replicas share shards only with replicas
    /// of the same ring.
    pub ring: String,
    /// `--leader-election-release-on-cancel`: give the Leases back at shutdown (default), or
    /// leave them to expire as client-go does when it is off.
    pub release_on_cancel: bool,
    /// `--hot-standby`: with warm handoffs, also load the shards this replica would be given
    /// if any one other replica left ([`Ownership::standby`]).
    pub hot_standby: bool,
}

impl Config {
    pub fn shard_lease_name(&self, shard: u32) -> String {
        if self.shards == 1 { self.prefix.clone() } else { format!("{}-shard-{shard}", self.prefix) }
    }

    fn member_lease_name(&self, identity: &str) -> String {
        let safe: String = identity
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c.to_ascii_lowercase() } else { '-' })
            .collect();
        format!("{}-member-{safe}", self.prefix)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Releasing the Leases at shutdown failed; the next owner waits for them to expire.
    #[error("releasing leases at shutdown failed")]
    Release(#[source] kube::Error),
}

/// Start the lease task. It runs until `shutdown`, then stops acting, releases its Leases
/// and deletes its membership Lease.
///
/// The receiver starts with nothing held.
///
/// `working` is the set of shards the engine still acts on: a shard that is to move is first
/// withdrawn from [`Ownership::held`], kept renewed until it leaves `working` (its checkpoint
/// is saved) or the renew deadline passes, and only then released (drain -> checkpoint ->
/// release). `None` releases one round after the withdrawal.
///
/// `loaded` is the set of shards the watches have loaded. With it this replica warms what it
/// is to get ([`Ownership::warming`]) and reports it loaded in its membership Lease; its
/// holder hands it over then. At `shutdown` (with `release_on_cancel`) the replica first
/// leaves: it keeps acting on its shards until their heirs report them loaded (or the renew
/// deadline passes), releasing each once its heir has it.
pub fn spawn(
    client: Client,
    config: Config,
    working: Option<watch::Receiver<BTreeSet<u32>>>,
    loaded: Option<watch::Receiver<Option<BTreeSet<u32>>>>,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> (Shards, JoinHandle<Result<(), Error>>) {
    let (publisher, shards) = Publisher::new();
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let holders = Holders::new(Api::namespaced(client, &config.pod_namespace), config.identity.clone());
    let task = Manager {
        api,
        config,
        observed: HashMap::new(),
        last_ok_send: Arc::default(),
        draining: HashMap::new(),
        peers: Peers { working, loaded },
        metrics,
        adopted: HashMap::new(),
        member: Membership::default(),
        yielding_to: None,
        leaving: None,
        warming: BTreeSet::new(),
        standby: Standby::default(),
        heir_waits: HashMap::new(),
        must_list: false,
        holders,
    };
    (shards, tokio::spawn(task.run(publisher, shutdown)))
}

struct Manager {
    api: Api<Lease>,
    config: Config,
    observed: HashMap<String, Observed>,
    /// When the last successful acquire or renew of each shard was sent. Shared with the
    /// fence task, which withdraws shards whose renew deadline passed even while a round hangs.
    last_ok_send: Arc<Mutex<HashMap<u32, Instant>>>,
    /// Shards withdrawn from `held` and waiting for the engine to let go, since when.
    draining: HashMap<u32, Instant>,
    /// What the engine and the watches report.
    peers: Peers,
    metrics: Metrics,
    /// Leases without our labels (Reloader's lock), observed by GET until we write them.
    adopted: HashMap<String, Observed>,
    /// This replica's membership Lease.
    member: Membership,
    /// The other ring this replica currently gives way to, if any.
    yielding_to: Option<String>,
    /// Since when this replica has been leaving (shutdown, handing its shards over).
    leaving: Option<Instant>,
    /// See [`Ownership::warming`].
    warming: BTreeSet<u32>,
    /// See [`Ownership::standby`].
    standby: Standby,
    /// Shards to hand over whose heir has not reported them loaded yet, since when.
    heir_waits: HashMap<u32, Instant>,
    /// A write lost a race: the next round LISTs, whatever started it.
    must_list: bool,
    /// Which holders are replicas of this fleet.
    holders: Holders,
}

/// What the other rooms report to the lease task.
struct Peers {
    /// The shards the engine still acts on (a shard to move is released once gone from it).
    working: Option<watch::Receiver<BTreeSet<u32>>>,
    /// The shards the watches have loaded; `None`: this replica does not warm or report.
    loaded: Option<watch::Receiver<Option<BTreeSet<u32>>>>,
}

#[derive(Default)]
struct Membership {
    /// When the membership Lease was last renewed.
    renewed: Option<Instant>,
    /// The handoff annotations the membership Lease was last written with.
    written: Option<BTreeMap<String, String>>,
}

#[derive(Default)]
struct Standby {
    /// The shards loaded for the hot standby.
    shards: BTreeSet<u32>,
    /// The standby to grow towards, and the members and placement it was computed from.
    target: Option<(Vec<String>, Vec<String>, BTreeSet<u32>)>,
}

impl Manager {
    async fn run(mut self, tx: Publisher, shutdown: CancellationToken) -> Result<(), Error> {
        let tx = Arc::new(tx);
        let fence_stop = shutdown.child_token();
        let fence = tokio::spawn(fence(
            self.last_ok_send.clone(),
            tx.clone(),
            self.config.renew_deadline,
            self.metrics.clone(),
            fence_stop.clone(),
        ));
        // Look often, write at the retry period: a released Lease is taken within a tick, or
        // at once when the watch of the fleet's Leases sees it released.
        let mut tick = tokio::time::interval(self.config.retry_period.min(OBSERVE_PERIOD));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = lease_events(self.api.clone(), &self.config.prefix);
        let mut listing: Option<Listing> = None;
        loop {
            let draining = !self.draining.is_empty();
            // A change here (leaving, loaded, let go) acts on what was observed already.
            let mut look = Look::Local;
            tokio::select! {
                biased;
                () = shutdown.cancelled(), if self.leaving.is_none() => {
                    if !self.config.release_on_cancel {
                        break;
                    }
                    info!("leaving: handing each shard over once its next holder has loaded it");
                    self.leaving = Some(Instant::now());
                }
                // The look's LIST goes out, and the round renews what is due meanwhile.
                _ = tick.tick() => {
                    if self.must_list || self.observed.is_empty() {
                        look = Look::List;
                    } else if listing.is_none() {
                        listing = Some(self.list_leases());
                    }
                }
                Some(listed) = async { Some(listing.as_mut()?.await) }, if listing.is_some() => {
                    listing = None;
                    look = Look::Listed(listed);
                }
                Some(first) = events.next() => {
                    // A replica leaving gives back all its Leases at once: one round for them.
                    let mut sightings = vec![first];
                    while let Some(Some(next)) = events.next().now_or_never() {
                        sightings.push(next);
                    }
                    look = Look::seen(sightings);
                }
                Some(()) = changed(self.peers.loaded.as_mut()) => {}
                Some(()) = changed(self.peers.working.as_mut()), if draining => {}
            }
            // However long a round takes under load, the fence task withdraws shards on time.
            let (cause, started) = (look.cause(), Instant::now());
            self.round(&tx, look).await;
            debug!(cause, took = ?started.elapsed(), "lease round");
            self.publish(&tx);
            if self.has_left() {
                break;
            }
        }
        // Stop acting first, let the engine save its checkpoints, then give the Leases back so
        // the next owners take them at once.
        fence_stop.cancel();
        let _ = fence.await;
        self.leave(&tx).await
    }

    /// Whether a replica leaving is done handing over; with no heir that reports, the final
    /// stage hands everything over at once.
    fn has_left(&self) -> bool {
        let Some(since) = self.leaving else { return false };
        Leaving {
            holding: self.held_on_record().next().is_some(),
            heirs_report: self.heirs_report(),
            waited_out: since.elapsed() >= self.config.renew_deadline,
            serving: is_open(self.peers.working.as_ref()) && is_open(self.peers.loaded.as_ref()),
        }
        .done()
    }

    /// Act on nothing more, wait (a renew deadline at most) for the engine to let every shard
    /// go, then release the Leases unless told to leave them to expire.
    async fn leave(&mut self, tx: &Publisher) -> Result<(), Error> {
        tx.send_if_modified(|o| !std::mem::take(&mut o.held).is_empty());
        self.metrics.shards_held.set(0);
        if let Some(working) = self.peers.working.as_mut() {
            let drained = working.wait_for(BTreeSet::is_empty);
            let _ = tokio::time::timeout(self.config.renew_deadline, drained).await;
        }
        if !self.config.release_on_cancel {
            info!("leaving the Leases to expire (--leader-election-release-on-cancel=false)");
            return Ok(());
        }
        self.release_all().await
    }

    /// Publish what this replica may act on and what it warms, when that changed.
    fn publish(&self, tx: &Publisher) {
        let ownership = self.ownership(Instant::now());
        let lost = tx.borrow().held.difference(&ownership.held).count();
        self.metrics.losses.inc_by(lost as u64);
        self.metrics.shards_held.set(ownership.held.len() as i64);
        self.metrics.shards_standby.set(ownership.standby.len() as i64);
        tx.send_if_modified(|current| {
            let changed = current.held != ownership.held
                || current.members != ownership.members
                || current.yielding_to != ownership.yielding_to
                || current.warming != ownership.warming
                || current.standby != ownership.standby
                || current.leaving != ownership.leaving;
            *current = ownership;
            changed
        });
    }

    /// Bring the observed Leases up to date from `look`, listing them when what was seen is not
    /// enough; false when they could not be listed (the round is skipped).
    async fn refresh(&mut self, look: Look) -> bool {
        let now = Instant::now();
        let current = !self.must_list
            && !self.observed.is_empty()
            && match look {
                Look::List => false,
                Look::Local => true,
                Look::Seen(leases) => self.take_in(leases, now),
                Look::Listed(Ok(list)) => {
                    self.take_listing(list, now).await;
                    true
                }
                Look::Listed(Err(err)) => {
                    warn!(error = %err, "listing leases failed; held shards stay held only until their renew deadline");
                    true
                }
            };
        if !current {
            if let Err(err) = self.observe(now).await {
                warn!(error = %err, "listing leases failed; held shards stay held only until their renew deadline");
                return false;
            }
            self.must_list = false;
        }
        true
    }

    /// One look at the fleet's Leases and what follows from it: renew, release, acquire. What
    /// it withdraws and what it is to warm are published before the writes are sent, and the
    /// writes are sent at once.
    async fn round(&mut self, tx: &Publisher, look: Look) {
        if !self.refresh(look).await {
            return;
        }
        let seen: Vec<String> = self.observed.values().map(|o| o.holder().to_string()).collect();
        self.holders.look(seen.iter().map(String::as_str), Instant::now()).await;
        self.metrics.refused_holders.set(self.holders.refused() as i64);
        let members = self.live_members(Instant::now());
        let placing = self.placing_members(&members);
        let now = Instant::now();
        let holders: Vec<Option<String>> = (0..self.config.shards)
            .map(|shard| {
                let o = self.observed.get(&self.config.shard_lease_name(shard))?;
                (!self.is_free(o, now)).then(|| o.holder().to_string())
            })
            .collect();
        let holder_refs: Vec<Option<&str>> = holders.iter().map(Option::as_deref).collect();
        let yield_to = self.ring_to_yield_to(now);
        if yield_to != self.yielding_to {
            match &yield_to {
                Some(ring) => warn!(
                    theirs = %ring, ours = %self.config.ring,
                    "a live replica places namespaces differently; giving shards back and taking none until it is gone"
                ),
                None => info!(ring = %self.config.ring, "no replica of another ring is live; taking shards"),
            }
            self.yielding_to = yield_to.clone();
        }
        let placed: Vec<&str> = match yield_to {
            Some(_) => Vec::new(),
            None => {
                assign(self.config.shards, &placing, &holder_refs).into_iter().map(|m| placing[m].as_str()).collect()
            }
        };
        let desired: BTreeSet<u32> = (0..self.config.shards)
            .filter(|s| placed.get(*s as usize).is_some_and(|m| *m == self.config.identity))
            .collect();
        // Free shards too: between this round's publish and its acquisition, a shard the
        // previous holder just released must stay watched, or the watches drop and relist it.
        let warming: BTreeSet<u32> = match self.peers.loaded {
            Some(_) => desired
                .iter()
                .filter(|s| holder_refs[**s as usize] != Some(self.config.identity.as_str()))
                .copied()
                .collect(),
            None => BTreeSet::new(),
        };
        // Grown only when the fleet is settled (nobody leaving, nothing warming here) and one
        // shard at a time, once everything watched is loaded: the standby never competes with
        // the shards to serve (a departure's survivors listing their new standby while the
        // Leases move held updates up to 0.6 s at 2,000 namespaces).
        let settled = placing.len() == members.len() && warming.is_empty();
        if warming != self.warming {
            info!(shards = %format_shards(&warming), "warming: loading the shards to take over before their holder hands them over");
            self.warming = warming;
        }
        let standby = self.next_standby(settled, &placing, &placed, &desired);
        if standby != self.standby.shards {
            info!(shards = %format_shards(&standby), "hot standby: loading the shards this replica would be given if another left");
            self.standby.shards = standby;
        }
        let mut actions = self.shard_actions(&desired, &placed);
        actions.extend(self.membership_action());
        self.publish(tx);
        let applied = futures::future::join_all(actions.into_iter().map(|action| self.perform(action))).await;
        for applied in applied {
            self.apply(applied);
        }
    }

    /// What each shard's Lease needs this round: renewed while held and wanted (or while its
    /// next holder loads it, or the engine finishes with it), released once drained, acquired
    /// when wanted and free.
    fn shard_actions(&mut self, desired: &BTreeSet<u32>, placed: &[&str]) -> Vec<Action> {
        let mut actions = Vec::new();
        for shard in 0..self.config.shards {
            let name = self.config.shard_lease_name(shard);
            let observed = self.observed.get(&name).cloned();
            let held = observed.as_ref().is_some_and(|o| o.holder() == self.config.identity);
            let wanted = desired.contains(&shard);
            let renew =
                |observed: &Option<Observed>| Action::Shard { shard, observed: observed.clone(), renewing: true };
            match (held, wanted) {
                (true, true) => {
                    self.draining.remove(&shard);
                    self.heir_waits.remove(&shard);
                    if self.renewal_due(shard) {
                        actions.push(renew(&observed));
                    }
                }
                // Keep acting on it until the next holder has loaded it.
                (true, false)
                    if !self.draining.contains_key(&shard)
                        && !self.heir_ready(shard, placed.get(shard as usize).copied()) =>
                {
                    if self.renewal_due(shard) {
                        actions.push(renew(&observed));
                    }
                }
                (true, false) if self.drained(shard) => {
                    self.draining.remove(&shard);
                    self.heir_waits.remove(&shard);
                    lock(&self.last_ok_send).remove(&shard);
                    if let Some(observed) = observed {
                        actions.push(Action::Release { shard, observed });
                    }
                }
                // Keep the Lease while the engine finishes with the shard.
                (true, false) if self.renewal_due(shard) => actions.push(renew(&observed)),
                (true, false) => {}
                (false, true) => {
                    let free = observed.as_ref().is_none_or(|o| self.is_free(o, Instant::now()));
                    if free {
                        actions.push(Action::Shard { shard, observed, renewing: false });
                    }
                }
                (false, false) => {}
            }
        }
        actions
    }

    /// The standby after this round: none without `--hot-standby`, while leaving or giving way
    /// to another ring; kept (less what is now desired) while the fleet is not settled;
    /// otherwise grown by one shard of its target once everything watched is loaded.
    fn next_standby(
        &mut self,
        settled: bool,
        placing: &[String],
        placed: &[&str],
        desired: &BTreeSet<u32>,
    ) -> BTreeSet<u32> {
        let Some(loaded) = &self.peers.loaded else { return BTreeSet::new() };
        if !self.config.hot_standby || self.leaving.is_some() || placed.is_empty() {
            return BTreeSet::new();
        }
        if !settled {
            return self.standby.shards.difference(desired).copied().collect();
        }
        let loaded = loaded.borrow().clone().unwrap_or_default();
        let target = self.standby_target(placing, placed);
        let mut kept: BTreeSet<u32> = self.standby.shards.intersection(&target).copied().collect();
        // A shard still held on its way elsewhere is loaded for holding it, not for standing by:
        // it counts as loaded for the standby once released and still watched.
        let holding = |shard: &u32| {
            self.observed.get(&self.config.shard_lease_name(*shard)).is_some_and(|o| o.holder() == self.config.identity)
        };
        let watched_loaded = desired.iter().all(|s| loaded.contains(s))
            && kept.iter().all(|s| loaded.contains(s) && (desired.contains(s) || !holding(s)));
        if let Some(next) = target.difference(&kept).next().filter(|_| watched_loaded) {
            kept.insert(*next);
        }
        kept
    }

    /// What `--hot-standby` grows towards for this placement, computed again only when the
    /// members or the placement changed (each is a placement per other member: R x S scores).
    fn standby_target(&mut self, placing: &[String], placed: &[&str]) -> BTreeSet<u32> {
        if let Some((members, placement, target)) = &self.standby.target
            && members == placing
            && placement.iter().map(String::as_str).eq(placed.iter().copied())
        {
            return target.clone();
        }
        let target = standby(self.config.shards, placing, &self.config.identity, placed);
        let placement = placed.iter().map(|m| (*m).to_string()).collect();
        self.standby.target = Some((placing.to_vec(), placement, target.clone()));
        target
    }

    /// Whether a shard to move may be withdrawn: its next holder reported it loaded, does not
    /// report, or has been waited for the renew deadline.
    fn heir_ready(&mut self, shard: u32, heir: Option<&str>) -> bool {
        let Some(heir) = heir else { return true };
        let lease = self.observed.get(&self.config.member_lease_name(heir));
        match lease.and_then(|o| warm_of(&o.lease)) {
            None => true,
            Some(warm) if warm.contains(&shard) => true,
            Some(_) => {
                self.heir_waits.entry(shard).or_insert_with(Instant::now).elapsed() >= self.config.renew_deadline
            }
        }
    }

    /// Whether any member shards are placed on reports what it has loaded.
    fn heirs_report(&self) -> bool {
        let placing = self.placing_members(&self.live_members(Instant::now()));
        placing
            .iter()
            .any(|m| self.observed.get(&self.config.member_lease_name(m)).is_some_and(|o| warm_of(&o.lease).is_some()))
    }

    /// The members shards are placed on: the live ones that are not leaving.
    fn placing_members(&self, live: &[String]) -> Vec<String> {
        live.iter()
            .filter(|m| {
                if **m == self.config.identity {
                    return self.leaving.is_none();
                }
                let lease = self.observed.get(&self.config.member_lease_name(m));
                !lease.is_some_and(|o| is_leaving(&o.lease))
            })
            .cloned()
            .collect()
    }

    /// Shards whose Lease names this replica as holder (acting on them or not).
    fn held_on_record(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.config.shards).filter(|s| {
            self.observed.get(&self.config.shard_lease_name(*s)).is_some_and(|o| o.holder() == self.config.identity)
        })
    }

    /// The membership Lease's handoff annotations: leaving, and the warming shards loaded.
    fn handoff_annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        if self.leaving.is_some() {
            annotations.insert(LEAVING_ANNOTATION.to_string(), "true".to_string());
        }
        if let Some(loaded) = &self.peers.loaded {
            let loaded = loaded.borrow().clone().unwrap_or_default();
            let warm: BTreeSet<u32> =
                self.warming.iter().chain(&self.standby.shards).filter(|s| loaded.contains(s)).copied().collect();
            annotations.insert(WARM_ANNOTATION.to_string(), format_shards(&warm));
        }
        annotations
    }

    /// Whether the shard's last renewal was sent a retry period ago (or never).
    fn renewal_due(&self, shard: u32) -> bool {
        lock(&self.last_ok_send).get(&shard).is_none_or(|sent| sent.elapsed() >= self.config.retry_period)
    }

    /// Whether a shard to move is withdrawn and finished with: the engine let go of it, or the
    /// renew deadline passed since it was withdrawn (the engine stopped acting on it anyway).
    /// A shard first seen here is not: its withdrawal is published at the end of this round,
    /// and until then the engine may still be taking it up.
    fn drained(&mut self, shard: u32) -> bool {
        let Some(since) = self.draining.get(&shard).copied() else {
            debug!(shard, "withdrawing the shard from the engine before releasing it");
            self.draining.insert(shard, Instant::now());
            return false;
        };
        let let_go = self.peers.working.as_ref().is_none_or(|w| !w.borrow().contains(&shard));
        let_go || since.elapsed() >= self.config.renew_deadline
    }

    async fn release_all(&mut self) -> Result<(), Error> {
        let mine: Vec<(u32, Observed)> = (0..self.config.shards)
            .filter_map(|s| {
                let o = self.observed.get(&self.config.shard_lease_name(s))?;
                (o.holder() == self.config.identity).then(|| (s, o.clone()))
            })
            .collect();
        // All at once: the next owners are waiting.
        futures::future::join_all(mine.iter().map(|(shard, observed)| self.put_release(*shard, observed))).await;
        lock(&self.last_ok_send).clear();
        let member = self.config.member_lease_name(&self.config.identity);
        match tokio::time::timeout(API_TIMEOUT, self.api.delete(&member, &DeleteParams::default())).await {
            Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))) => Ok(()),
            Ok(Err(err)) => Err(Error::Release(err)),
            Err(_) => Ok(()),
        }
    }

    /// Whether a shard's Lease may be taken: nobody holds it, its holder stopped renewing it,
    /// or its holder is no replica of this fleet. Reloader's own lock (adopted, without the
    /// fleet's labels) is believed as Reloader believes it: an image swap never has two
    /// controllers acting.
    fn is_free(&self, lease: &Observed, now: Instant) -> bool {
        let reloaders = lease.lease.metadata.name.as_ref().is_some_and(|name| self.adopted.contains_key(name));
        lease.holder().is_empty()
            || lease.expired(now, self.config.lease_duration)
            || (!reloaders && !self.holders.believes(lease.holder()))
    }

    fn ownership(&self, now: Instant) -> Ownership {
        let members = self.live_members(now);
        let mut held = BTreeSet::new();
        let mut shards = Vec::with_capacity(self.config.shards as usize);
        for shard in 0..self.config.shards {
            let observed = self.observed.get(&self.config.shard_lease_name(shard));
            let holder = observed.map(|o| o.holder().to_string()).unwrap_or_default();
            let in_time = lock(&self.last_ok_send)
                .get(&shard)
                .is_some_and(|sent| now.saturating_duration_since(*sent) < self.config.renew_deadline);
            let state = if holder == self.config.identity {
                if self.draining.contains_key(&shard) {
                    ShardState::Draining
                } else if in_time {
                    ShardState::Active
                } else {
                    ShardState::Fenced
                }
            } else if observed.is_none_or(|o| self.is_free(o, now)) {
                ShardState::Free
            } else {
                ShardState::Elsewhere
            };
            if state == ShardState::Active {
                held.insert(shard);
            }
            let observed_age_secs =
                observed.map(|o| now.saturating_duration_since(o.changed_at).as_secs()).unwrap_or(0);
            shards.push(ShardStatus { shard, holder, state, observed_age_secs });
        }
        Ownership {
            held,
            shards,
            members,
            yielding_to: self.yielding_to.clone(),
            warming: self.warming.clone(),
            standby: self.standby.shards.clone(),
            leaving: self.leaving.is_some(),
        }
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}
