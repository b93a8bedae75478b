//! Writes that do not go out at once: coalesced (a window collects the changes of several
//! resources of one workload into one write) or held to the rollout budget (at most so many
//! writes a second, served round-robin across namespaces).
//!
//! ```text
//!  change of R, workload W ─▶ pending[W] += R, holds[R] += W
//!        window > 0: W waits in `windows` until first change + window
//!        then W is ready ─▶ round-robin by namespace ─▶ one write for all of W's resources
//!  written ─▶ holds[R] -= W; R's change is handled (checkpoint) once holds[R] is empty
//! ```
//! A change is marked handled only when every write it caused is done, so a restart or a
//! handoff with writes still pending acts on the change again (writes are idempotent).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::DelayQueue;

use super::damping::Damping;
use crate::watch::{DataHash, ResourceKey, Store, WorkloadKey};

/// What a resource waits for: the hash of its last processed change (what the checkpoint
/// records once every workload is written) and the workloads still to write.
struct Hold {
    hash: Option<DataHash>,
    workloads: BTreeSet<WorkloadKey>,
}

#[derive(Default)]
pub(super) struct Deferred {
    /// Per workload, the resources its next write records.
    pending: HashMap<WorkloadKey, BTreeSet<ResourceKey>>,
    holds: HashMap<ResourceKey, Hold>,
    /// Workloads whose window is open (or whose failed write waits for its retry).
    pub(super) windows: DelayQueue<WorkloadKey>,
    waiting: HashMap<WorkloadKey, tokio_util::time::delay_queue::Key>,
    /// Workloads due while a write of theirs was in flight.
    parked: HashSet<WorkloadKey>,
    /// Workloads whose write may go, per namespace.
    ready: BTreeMap<Arc<str>, VecDeque<WorkloadKey>>,
    /// The namespace served last (round-robin continues after it).
    last_namespace: Option<Arc<str>>,
    /// With a budget, the time between two writes, and the earliest next one.
    spacing: Option<Duration>,
    next_write: Option<Instant>,
    /// `--max-concurrent-rollouts`: workloads written whose rollout is not complete yet, at
    /// most this many.
    max_in_flight: Option<usize>,
    /// Those workloads and how their rollout goes.
    in_flight: HashMap<WorkloadKey, Rolling>,
    /// Resources changing too often: their writes wait here for the damping window.
    pub(super) damping: Damping,
}

/// A rollout counted against `--max-concurrent-rollouts`.
struct Rolling {
    /// The generation written (`i64::MAX` while the write is out).
    generation: i64,
    since: Instant,
    /// The workload's resourceVersion when last seen, and when it last changed: a rollout
    /// going on changes its status as pods are replaced.
    seen: String,
    progressed: Instant,
}

/// A rollout whose workload has not changed for this long (no pod replaced, no status
/// written) gives its place in the concurrency budget back: a workload that never becomes
/// ready must not hold a place every other namespace waits for.
pub(super) const ROLLOUT_STALL: Duration = Duration::from_secs(120);
/// A rollout that has not completed after this long gives its place back even while it moves.
pub(super) const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(600);

/// A place given back by a rollout that did not complete.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct GivenBack {
    pub workload: WorkloadKey,
    /// Why: it stalled (no change for [`ROLLOUT_STALL`]) or ran past [`ROLLOUT_TIMEOUT`].
    pub stalled: bool,
}
/// The longest a write waits in the timer queue: the longest coalesce window. (The queue panics
/// on a deadline about two years out; windows are refused past this when parsed, and this
/// keeps any other caller from reaching that.)
const LONGEST_DELAY: Duration = crate::reload::duration::COALESCE_WINDOW_MAX;
/// The longest time between two budgeted writes (a rate of one a minute).
const MAX_SPACING: Duration = Duration::from_secs(60);
/// How often a full concurrency budget is looked at again.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(250);

impl Deferred {
    /// `per_second`: the rollout budget; `concurrent`: rollouts at once (`None`: no limit).
    pub(super) fn new(per_second: Option<f64>, concurrent: Option<usize>) -> Self {
        // Checked: a rate near zero is refused at start, and must not panic if it gets here.
        let spacing =
            per_second.filter(|r| *r > 0.0).map(|r| Duration::try_from_secs_f64(1.0 / r).unwrap_or(MAX_SPACING));
        Deferred { spacing, max_in_flight: concurrent.filter(|n| *n > 0), ..Deferred::default() }
    }

    /// With flap damping (built once, with the engine).
    pub(super) fn with_damping(self, damping: Damping) -> Self {
        Deferred { damping, ..self }
    }

    /// Whether every write goes through here (a budget is set).
    pub(super) fn has_budget(&self) -> bool {
        self.spacing.is_some() || self.max_in_flight.is_some()
    }

    /// A write of `workload` (now at `generation`) started a rollout that counts against
    /// `--max-concurrent-rollouts` until it completes.
    pub(super) fn started(&mut self, workload: &WorkloadKey, generation: i64, now: Instant) {
        if self.max_in_flight.is_none() {
            return;
        }
        match self.in_flight.get_mut(workload) {
            // Written again while its place is held: the place is still the first write's (a
            // workload rewritten every few seconds must not hold its place for good).
            Some(rolling) if rolling.generation != i64::MAX => rolling.generation = generation,
            Some(rolling) => {
                let since = rolling.since;
                *rolling = Rolling { generation, since, seen: String::new(), progressed: now };
            }
            None => {
                let rolling = Rolling { generation, since: now, seen: String::new(), progressed: now };
                self.in_flight.insert(workload.clone(), rolling);
            }
        }
    }

    /// A write of `workload` is going out: until it lands it counts against
    /// `--max-concurrent-rollouts` as the rollout it may start.
    pub(super) fn sending(&mut self, workload: &WorkloadKey, now: Instant) {
        if self.max_in_flight.is_some() {
            let since = self.in_flight.get(workload).map_or(now, |rolling| rolling.since);
            let rolling = Rolling { generation: i64::MAX, since, seen: String::new(), progressed: now };
            self.in_flight.insert(workload.clone(), rolling);
        }
    }

    /// The write of `workload` landed: it started a rollout to `generation`, or none (`None`:
    /// not written).
    pub(super) fn sent(&mut self, workload: &WorkloadKey, generation: Option<i64>, now: Instant) {
        match generation {
            Some(generation) => self.started(workload, generation, now),
            None => {
                self.in_flight.remove(workload);
            }
        }
    }

    /// Forget the rollouts that completed (per the store) or whose workload is gone or paused;
    /// give back the places of those that stalled or ran too long, and return them.
    pub(super) fn settle(&mut self, store: &Store, now: Instant) -> Vec<GivenBack> {
        let mut given_back = Vec::new();
        self.in_flight.retain(|key, rolling| {
            let Some(w) = store.workload(key) else { return false };
            if w.generation >= rolling.generation && (w.rolled_out || w.paused) {
                return false;
            }
            if rolling.generation == i64::MAX {
                return true; // the write is still out
            }
            if rolling.seen != w.resource_version {
                rolling.seen.clone_from(&w.resource_version);
                rolling.progressed = now;
            }
            let stalled = now.duration_since(rolling.progressed) >= ROLLOUT_STALL;
            if stalled || now.duration_since(rolling.since) >= ROLLOUT_TIMEOUT {
                given_back.push(GivenBack { workload: key.clone(), stalled });
                return false;
            }
            true
        });
        given_back
    }

    /// Rollouts counted against the concurrency budget now.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether every place is taken. A namespace holding more than its share (the places over
    /// the namespaces rolling or waiting) while another waits below its share has only its
    /// share counted: a tenant whose rollouts never end holds its share, not every place (at
    /// worst twice the places roll at once, never a namespace starved).
    fn full(&self) -> bool {
        let Some(max) = self.max_in_flight else { return false };
        if self.in_flight.len() < max {
            return false;
        }
        let rolling = self.rolling_by_namespace();
        let share = self.share(&rolling, max);
        let below_share_waits = self.ready.keys().any(|ns| rolling.get(&**ns).copied().unwrap_or(0) < share);
        let counted: usize = rolling.values().map(|held| (*held).min(share)).sum();
        !below_share_waits || counted >= max
    }

    /// A namespace's share of `max` places among the namespaces rolling or waiting.
    fn share(&self, rolling: &HashMap<&str, usize>, max: usize) -> usize {
        let competing = rolling.len() + self.ready.keys().filter(|ns| !rolling.contains_key(&***ns)).count();
        max.div_ceil(competing.max(1))
    }

    /// Workload `workload` is to record `resource` (whose processed change has `hash`; `None`
    /// for a deletion), in one write after `window` (zero: as soon as the budget allows).
    /// A window already open for the workload is not extended.
    pub(super) fn add(
        &mut self,
        workload: &WorkloadKey,
        resource: &ResourceKey,
        hash: Option<DataHash>,
        window: Duration,
    ) {
        let hold = self.holds.entry(resource.clone()).or_insert(Hold { hash, workloads: BTreeSet::new() });
        hold.hash = hash;
        hold.workloads.insert(workload.clone());
        let items = self.pending.entry(workload.clone()).or_default();
        let new = items.is_empty();
        items.insert(resource.clone());
        if !new {
            return;
        }
        if window.is_zero() {
            self.make_ready(workload.clone());
        } else {
            let key = self.windows.insert(workload.clone(), window.min(LONGEST_DELAY));
            self.waiting.insert(workload.clone(), key);
        }
    }

    /// Whether a workload is still to write the resource's last processed change.
    pub(super) fn is_held(&self, resource: &ResourceKey) -> bool {
        self.holds.get(resource).is_some_and(|h| !h.workloads.is_empty())
    }

    /// The window (or retry delay) of `workload` is over.
    pub(super) fn window_over(&mut self, workload: WorkloadKey) {
        self.waiting.remove(&workload);
        if self.pending.contains_key(&workload) {
            self.make_ready(workload);
        }
    }

    fn make_ready(&mut self, workload: WorkloadKey) {
        let queue = self.ready.entry(workload.namespace.clone()).or_default();
        if !queue.contains(&workload) {
            queue.push_back(workload);
        }
    }

    /// When the next ready write may go (now, or when the budget allows); `None`: none ready.
    pub(super) fn wake_at(&self, now: Instant) -> Option<Instant> {
        if self.ready.is_empty() {
            return None;
        }
        if self.full() {
            return Some(now + IN_FLIGHT_POLL);
        }
        Some(self.next_write.map_or(now, |at| at.max(now)))
    }

    /// The next workload to write now, round-robin across namespaces; takes its resources.
    /// `None` when none is ready or the budget says wait. With `--max-concurrent-rollouts`,
    /// a namespace holding its share of the places (the places over the namespaces rolling or
    /// waiting) lets the others go first; it takes a free place only when none of them may.
    pub(super) fn next(&mut self, now: Instant) -> Option<(WorkloadKey, BTreeSet<ResourceKey>)> {
        if self.next_write.is_some_and(|at| at > now) || self.full() {
            return None;
        }
        let namespace = self.next_namespace(true).or_else(|| self.next_namespace(false))?;
        let queue = self.ready.get_mut(&namespace)?;
        let workload = queue.pop_front()?;
        if queue.is_empty() {
            self.ready.remove(&namespace);
        }
        self.last_namespace = Some(namespace);
        if let Some(spacing) = self.spacing {
            let from = self.next_write.map_or(now, |at| at.max(now));
            self.next_write = Some(from.checked_add(spacing).unwrap_or(from));
        }
        let items = self.pending.remove(&workload).unwrap_or_default();
        Some((workload, items))
    }

    /// The namespace whose turn it is after the last one served; `within_share`: only one
    /// holding fewer places than its share.
    fn next_namespace(&self, within_share: bool) -> Option<Arc<str>> {
        let rolling = self.rolling_by_namespace();
        let share = self.max_in_flight.map(|max| self.share(&rolling, max));
        let may =
            |ns: &Arc<str>| !within_share || share.is_none_or(|share| rolling.get(&**ns).copied().unwrap_or(0) < share);
        let after = match &self.last_namespace {
            Some(last) => {
                self.ready.range::<Arc<str>, _>((std::ops::Bound::Excluded(last.clone()), std::ops::Bound::Unbounded))
            }
            None => self.ready.range::<Arc<str>, _>(..),
        };
        after.chain(self.ready.iter()).map(|(ns, _)| ns).find(|ns| may(ns)).cloned()
    }

    /// Places held, per namespace.
    fn rolling_by_namespace(&self) -> HashMap<&str, usize> {
        let mut held = HashMap::new();
        for workload in self.in_flight.keys() {
            *held.entry(&*workload.namespace).or_default() += 1;
        }
        held
    }

    /// `workload` needs a write with nothing to record (orphaned variables to remove): ready
    /// now, unless a write of it is pending anyway (that one removes them).
    pub(super) fn clean(&mut self, workload: WorkloadKey) {
        if self.pending.contains_key(&workload) {
            return;
        }
        self.pending.insert(workload.clone(), BTreeSet::new());
        self.make_ready(workload);
    }

    /// `workload` was due while a write of it is in flight: it waits for [`Self::unpark`].
    pub(super) fn park(&mut self, workload: WorkloadKey, items: BTreeSet<ResourceKey>) {
        self.pending.entry(workload.clone()).or_default().extend(items);
        self.parked.insert(workload);
    }

    /// No write of `workload` is in flight any more: if it was parked, it is ready again.
    pub(super) fn unpark(&mut self, workload: &WorkloadKey) {
        if self.parked.remove(workload) && self.pending.contains_key(workload) {
            self.make_ready(workload.clone());
        }
    }

    /// The write of `workload` failed: its resources wait for `delay`, then go again.
    pub(super) fn retry(&mut self, workload: WorkloadKey, items: BTreeSet<ResourceKey>, delay: Duration) {
        self.pending.entry(workload.clone()).or_default().extend(items);
        if !self.waiting.contains_key(&workload) {
            let key = self.windows.insert(workload.clone(), delay.min(LONGEST_DELAY));
            self.waiting.insert(workload, key);
        }
    }

    /// `workload` records these resources now (or never will: it is gone). Returns the
    /// resources no workload is left to write for, with the hash their change had.
    pub(super) fn done(
        &mut self,
        workload: &WorkloadKey,
        items: &BTreeSet<ResourceKey>,
    ) -> Vec<(ResourceKey, Option<DataHash>)> {
        let mut released = Vec::new();
        for resource in items {
            let Some(hold) = self.holds.get_mut(resource) else { continue };
            hold.workloads.remove(workload);
            // Pending again (a later change of it came in meanwhile): still held.
            if hold.workloads.is_empty()
                && let Some(hold) = self.holds.remove(resource)
            {
                released.push((resource.clone(), hold.hash));
            }
        }
        released
    }

    /// Drop everything of the namespaces `lost` says (a shard let go): the next owner acts on
    /// those changes again, as the checkpoint never marked them handled.
    pub(super) fn forget(&mut self, lost: impl Fn(&str) -> bool) {
        self.pending.retain(|w, _| !lost(&w.namespace));
        self.holds.retain(|r, _| !lost(&r.namespace));
        self.ready.retain(|ns, _| !lost(ns));
        self.in_flight.retain(|w, _| !lost(&w.namespace));
        self.parked.retain(|w| !lost(&w.namespace));
        self.damping.forget(&lost);
        let gone: Vec<WorkloadKey> = self.waiting.keys().filter(|w| lost(&w.namespace)).cloned().collect();
        for workload in gone {
            if let Some(key) = self.waiting.remove(&workload) {
                self.windows.remove(&key);
            }
        }
    }

    /// Workloads with a write pending.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{ResourceKind, WorkloadKind};

    fn w(ns: &str, name: &str) -> WorkloadKey {
        WorkloadKey { kind: WorkloadKind::Deployment, namespace: ns.into(), name: name.into() }
    }

    fn r(ns: &str, name: &str) -> ResourceKey {
        ResourceKey { kind: ResourceKind::ConfigMap, namespace: ns.into(), name: name.into() }
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_collects_the_resources_of_one_workload_into_one_write() {
        let mut d = Deferred::new(None, None);
        let hash = Some(DataHash::of_bytes(b"1"));
        d.add(&w("a", "web"), &r("a", "config"), hash, Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(100)).await;
        d.add(&w("a", "web"), &r("a", "secret"), hash, Duration::from_secs(2));
        assert!(d.wake_at(Instant::now()).is_none(), "nothing ready inside the window");
        let opened = Instant::now();
        let expired = futures::StreamExt::next(&mut d.windows).await.expect("the window ends");
        assert_eq!(Instant::now().duration_since(opened), Duration::from_millis(1900), "the first change opened it");
        d.window_over(expired.into_inner());
        let (workload, items) = d.next(Instant::now()).expect("ready");
        assert_eq!((workload, items.len()), (w("a", "web"), 2), "one write records both");
        assert!(d.is_held(&r("a", "config")), "handled only once written");
        let released = d.done(&w("a", "web"), &items);
        assert_eq!(released.len(), 2);
        assert!(!d.is_held(&r("a", "config")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_removal_alone_takes_the_budget_and_never_doubles_a_pending_write() {
        let mut d = Deferred::new(Some(1.0), None);
        d.clean(w("a", "web"));
        d.clean(w("a", "web"));
        let (workload, items) = d.next(Instant::now()).expect("ready at once");
        assert_eq!((workload, items.len()), (w("a", "web"), 0), "one write, recording nothing");
        assert!(d.next(Instant::now()).is_none(), "asked twice, written once");
        d.add(&w("a", "api"), &r("a", "config"), None, Duration::from_secs(5));
        d.clean(w("a", "api"));
        assert!(d.wake_at(Instant::now()).is_none(), "the coalesced write pending carries the removal");
        d.clean(w("a", "db"));
        assert_eq!(d.wake_at(Instant::now()), Some(Instant::now() + Duration::from_secs(1)), "within the budget");
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_spaces_writes_and_serves_namespaces_in_turn() {
        let mut d = Deferred::new(Some(10.0), None);
        for name in ["a1", "a2", "a3"] {
            d.add(&w("a", name), &r("a", "shared"), None, Duration::ZERO);
        }
        d.add(&w("b", "b1"), &r("b", "shared"), None, Duration::ZERO);
        let start = Instant::now();
        let mut order = Vec::new();
        while let Some(at) = d.wake_at(Instant::now()) {
            tokio::time::sleep_until(at).await;
            let (workload, items) = d.next(Instant::now()).expect("due");
            order.push((workload.name.to_string(), Instant::now().duration_since(start)));
            d.done(&workload, &items);
        }
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a1", "b1", "a2", "a3"], "namespaces take turns");
        let times: Vec<u128> = order.iter().map(|(_, t)| t.as_millis()).collect();
        assert_eq!(times, [0, 100, 200, 300], "one write per 100 ms at 10/s");
    }

    #[test]
    fn at_most_so_many_rollouts_run_at_once() {
        let (store, writer) = Store::new(Vec::new());
        let mut d = Deferred::new(None, Some(1));
        d.add(&w("a", "one"), &r("a", "cm"), None, Duration::ZERO);
        d.add(&w("a", "two"), &r("a", "cm"), None, Duration::ZERO);
        let now = Instant::now();
        let (first, _) = d.next(now).expect("the first may go");
        d.started(&first, 2, now);
        assert!(d.next(now).is_none(), "the second waits for the first rollout");
        assert_eq!(d.wake_at(now), Some(now + IN_FLIGHT_POLL));
        writer.apply_workload(rolling(&first, "2", false));
        d.settle(&store, now);
        assert!(d.next(now).is_none(), "still rolling");
        writer.apply_workload(rolling(&first, "2", true));
        d.settle(&store, now);
        assert_eq!(d.next(now).map(|(w, _)| w), Some(w("a", "two")), "the first rolled out");
    }

    fn rolling(key: &WorkloadKey, version: &str, rolled_out: bool) -> crate::watch::Workload {
        crate::watch::Workload {
            resource_version: version.into(),
            generation: 2,
            rolled_out,
            ..crate::watch::Workload::test(key.kind, &key.namespace, &key.name)
        }
    }

    #[test]
    fn a_namespace_holding_its_share_of_rollout_places_lets_the_others_go_first() {
        let (store, writer) = Store::new(Vec::new());
        let mut d = Deferred::new(None, Some(4));
        let now = Instant::now();
        for i in 0..10 {
            d.add(&w("noisy", &format!("w{i}")), &r("noisy", "cm"), None, Duration::ZERO);
        }
        let take = |d: &mut Deferred| {
            let (workload, _) = d.next(now)?;
            writer.apply_workload(rolling(&workload, "1", false));
            d.started(&workload, 2, now);
            Some(workload)
        };
        for _ in 0..2 {
            take(&mut d).expect("alone, a free place");
        }
        d.add(&w("a-quiet", "web"), &r("a-quiet", "cm"), None, Duration::ZERO);
        assert_eq!(take(&mut d).map(|w| w.namespace), Some("a-quiet".into()), "in turn after noisy");
        // One place is free. In turn after a-quiet comes noisy, but noisy holds two places of
        // four among three namespaces, its share: the place goes to z-quiet.
        d.add(&w("z-quiet", "web"), &r("z-quiet", "cm"), None, Duration::ZERO);
        let z = take(&mut d).expect("the fourth place");
        assert_eq!(&*z.namespace, "z-quiet");
        assert!(d.next(now).is_none(), "every namespace holds its share: full");
        // With nobody else waiting, the noisy namespace uses a free place.
        writer.apply_workload(rolling(&z, "2", true));
        assert!(d.settle(&store, now).is_empty());
        assert_eq!(take(&mut d).map(|w| w.namespace), Some("noisy".into()), "no place left idle");
    }

    #[test]
    fn a_namespace_whose_rollouts_never_end_holds_its_share_not_every_place() {
        let (store, writer) = Store::new(Vec::new());
        let mut d = Deferred::new(None, Some(4));
        let now = Instant::now();
        for i in 0..4 {
            d.add(&w("hostile", &format!("w{i}")), &r("hostile", "cm"), None, Duration::ZERO);
        }
        while let Some((workload, _)) = d.next(now) {
            writer.apply_workload(rolling(&workload, "1", false));
            d.started(&workload, 2, now);
        }
        assert_eq!(d.in_flight(), 4, "alone, it took every place");
        // Three quiet namespaces arrive while those four never complete: each gets a place.
        for (n, ns) in ["quiet-a", "quiet-b", "quiet-c"].into_iter().enumerate() {
            d.add(&w(ns, "web"), &r(ns, "cm"), None, Duration::ZERO);
            d.settle(&store, now);
            let (workload, _) = d.next(now).unwrap_or_else(|| panic!("{ns} starved behind the hostile rollouts"));
            assert_eq!(&*workload.namespace, ns);
            writer.apply_workload(rolling(&workload, "1", false));
            d.started(&workload, 2, now);
            assert_eq!(d.in_flight(), 5 + n);
        }
        // Now every namespace holds its share (one of four places each): the next waits.
        d.add(&w("hostile", "w9"), &r("hostile", "cm"), None, Duration::ZERO);
        d.add(&w("quiet-a", "api"), &r("quiet-a", "cm"), None, Duration::ZERO);
        assert!(d.next(now).is_none(), "full: each namespace holds its share");
    }

    #[tokio::test(start_paused = true)]
    async fn a_workload_written_again_keeps_the_place_of_its_first_write() {
        let (store, writer) = Store::new(Vec::new());
        let mut d = Deferred::new(None, Some(1));
        let web = w("a", "web");
        d.add(&web, &r("a", "cm"), None, Duration::ZERO);
        let (first, _) = d.next(Instant::now()).expect("a place");
        d.started(&first, 2, Instant::now());
        // Written again every 30 s (each write is a new rollout, and its status moves), never
        // complete: the place goes back at the timeout from the first write.
        for round in 1..=ROLLOUT_TIMEOUT.as_secs() / 30 {
            tokio::time::advance(Duration::from_secs(30)).await;
            d.sending(&web, Instant::now());
            d.started(&web, 2 + round as i64, Instant::now());
            writer.apply_workload(rolling(&web, &round.to_string(), false));
            let given = d.settle(&store, Instant::now());
            if !given.is_empty() {
                assert_eq!(given, vec![GivenBack { workload: web.clone(), stalled: false }]);
                assert_eq!(round * 30, ROLLOUT_TIMEOUT.as_secs(), "at the timeout from the first write");
                return;
            }
        }
        panic!("a workload written again and again kept its place");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rollout_that_does_not_progress_gives_its_place_back() {
        let (store, writer) = Store::new(Vec::new());
        let mut d = Deferred::new(None, Some(1));
        let (stuck, moving) = (w("a", "stuck"), w("b", "moving"));
        d.add(&stuck, &r("a", "cm"), None, Duration::ZERO);
        d.add(&moving, &r("b", "cm"), None, Duration::ZERO);
        let (first, _) = d.next(Instant::now()).expect("a place");
        assert_eq!(first, stuck);
        writer.apply_workload(rolling(&stuck, "1", false));
        d.started(&stuck, 2, Instant::now());
        // It progresses for a while (its status changes), then stops.
        for version in ["2", "3"] {
            tokio::time::advance(ROLLOUT_STALL / 2).await;
            writer.apply_workload(rolling(&stuck, version, false));
            assert!(d.settle(&store, Instant::now()).is_empty(), "still progressing");
            assert!(d.next(Instant::now()).is_none());
        }
        tokio::time::advance(ROLLOUT_STALL - Duration::from_secs(1)).await;
        assert!(d.settle(&store, Instant::now()).is_empty(), "not stalled yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(d.settle(&store, Instant::now()), vec![GivenBack { workload: stuck.clone(), stalled: true }]);
        assert_eq!(d.next(Instant::now()).map(|(w, _)| w), Some(moving.clone()), "the place went on");
        // One that keeps moving but never completes gives its place back at the timeout.
        writer.apply_workload(rolling(&moving, "1", false));
        d.started(&moving, 2, Instant::now());
        for i in 0..ROLLOUT_TIMEOUT.as_secs() / 60 {
            tokio::time::advance(Duration::from_secs(60)).await;
            writer.apply_workload(rolling(&moving, &format!("v{i}"), false));
            let given = d.settle(&store, Instant::now());
            if !given.is_empty() {
                assert_eq!(given, vec![GivenBack { workload: moving.clone(), stalled: false }]);
                assert_eq!(i + 1, ROLLOUT_TIMEOUT.as_secs() / 60, "at the timeout, not before");
                return;
            }
        }
        panic!("a rollout running past the timeout kept its place");
    }

    #[test]
    fn a_write_going_out_holds_a_rollout_place_until_it_lands() {
        let mut d = Deferred::new(None, Some(1));
        d.add(&w("a", "one"), &r("a", "cm"), None, Duration::ZERO);
        d.add(&w("a", "two"), &r("a", "cm"), None, Duration::ZERO);
        let now = Instant::now();
        let (first, _) = d.next(now).expect("the first may go");
        d.sending(&first, now);
        assert!(d.next(now).is_none(), "the second waits while the first is out");
        d.sent(&first, None, now);
        assert_eq!(d.next(now).map(|(w, _)| w), Some(w("a", "two")), "the first wrote nothing");
    }

    #[test]
    fn a_workload_due_while_its_write_is_out_goes_once_that_lands() {
        let mut d = Deferred::new(None, None);
        let (web, one, two) = (w("a", "web"), r("a", "one"), r("a", "two"));
        d.add(&web, &one, None, Duration::ZERO);
        let (_, items) = d.next(Instant::now()).expect("ready");
        d.park(web.clone(), items);
        d.add(&web, &two, None, Duration::ZERO);
        assert!(d.next(Instant::now()).is_none(), "parked until its write lands");
        d.unpark(&web);
        let (_, items) = d.next(Instant::now()).expect("ready again");
        assert_eq!(items, BTreeSet::from([one, two]), "one write records both");
    }

    #[test]
    fn a_resource_held_by_two_workloads_is_released_by_the_last() {
        let mut d = Deferred::new(None, None);
        let (one, two, res) = (w("a", "one"), w("a", "two"), r("a", "cm"));
        d.add(&one, &res, None, Duration::ZERO);
        d.add(&two, &res, None, Duration::ZERO);
        let (first, items) = d.next(Instant::now()).expect("ready");
        assert!(d.done(&first, &items).is_empty());
        let (second, items) = d.next(Instant::now()).expect("ready");
        assert_eq!(d.done(&second, &items).len(), 1);
        d.add(&one, &res, None, Duration::ZERO);
        d.forget(|ns| ns == "a");
        assert_eq!((d.len(), d.is_held(&res), d.wake_at(Instant::now())), (0, false, None));
    }
}
