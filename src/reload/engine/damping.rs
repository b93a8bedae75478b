//! Flap damping: a resource that changes more than `changes` times within `window` (a
//! Certificate re-issued in a loop, a generator rewriting a Secret) rolls its workloads at
//! most once per window, with the latest data. Its changes go through the deferred writes
//! with the window as their coalesce window, so nothing is dropped: the window's one write
//! records whatever the resource holds when it closes, and the change counts as handled
//! (checkpoint) only once that write is done.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::watch::ResourceKey;

/// `--flap-damping-changes` and `--flap-damping-window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlapDamping {
    /// More changes than this within `window` damp the resource.
    pub changes: u32,
    pub window: Duration,
}

/// Resources damped now, and since when: what `explain` shows (shared with the admin room).
#[derive(Clone, Debug, Default)]
pub struct Damped(Arc<Mutex<HashMap<ResourceKey, DampedSince>>>);

/// When a resource's damping began and the changes seen in its last window then.
#[derive(Clone, Copy, Debug)]
pub struct DampedSince {
    pub since: std::time::SystemTime,
    pub changes: usize,
}

impl Damped {
    /// Whether `resource` is damped now, since when.
    pub fn get(&self, resource: &ResourceKey) -> Option<DampedSince> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(resource).copied()
    }

    fn set(&self, resource: &ResourceKey, since: Option<DampedSince>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match since {
            Some(since) => map.insert(resource.clone(), since),
            None => map.remove(resource),
        };
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// What one change of a resource meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Written as usual.
    Free,
    /// Damped: its workloads' writes wait for the window; `began`: this change started it.
    Damped { window: Duration, began: bool },
}

/// The recent changes of each resource, bounded to `changes + 1` instants each.
#[derive(Default)]
pub(super) struct Damping {
    config: Option<FlapDamping>,
    seen: HashMap<ResourceKey, VecDeque<Instant>>,
    pub(super) damped: Damped,
}

impl Damping {
    pub(super) fn new(config: Option<FlapDamping>, damped: Damped) -> Self {
        Damping { config: config.filter(|c| c.changes > 0 && !c.window.is_zero()), seen: HashMap::new(), damped }
    }

    /// Count a change of `resource` at `now` and say whether it is damped. A damped resource
    /// stays damped until a whole window passes without a change ([`Damping::prune`]).
    pub(super) fn change(&mut self, resource: &ResourceKey, now: Instant) -> Verdict {
        let Some(config) = self.config else { return Verdict::Free };
        let seen = self.seen.entry(resource.clone()).or_default();
        seen.push_back(now);
        while seen.front().is_some_and(|t| now.duration_since(*t) >= config.window) {
            seen.pop_front();
        }
        let bound = config.changes as usize + 1;
        while seen.len() > bound {
            seen.pop_front();
        }
        let was = self.damped.get(resource).is_some();
        if seen.len() < bound && !was {
            return Verdict::Free;
        }
        if !was {
            self.damped.set(resource, Some(DampedSince { since: std::time::SystemTime::now(), changes: seen.len() }));
        }
        Verdict::Damped { window: config.window, began: !was }
    }

    /// Whether `resource` is damped now, without counting a change.
    pub(super) fn verdict(&self, resource: &ResourceKey) -> Verdict {
        match self.config {
            Some(config) if self.damped.get(resource).is_some() => {
                Verdict::Damped { window: config.window, began: false }
            }
            _ => Verdict::Free,
        }
    }

    /// Forget resources quiet for a whole window: their damping is over. Returns how many
    /// stay damped.
    pub(super) fn prune(&mut self, now: Instant) -> usize {
        let Some(config) = self.config else { return 0 };
        let damped = &self.damped;
        self.seen.retain(|resource, seen| {
            let quiet = seen.back().is_none_or(|t| now.duration_since(*t) >= config.window);
            if quiet {
                damped.set(resource, None);
            }
            !quiet
        });
        damped.len()
    }

    /// Resources leaving this replica (a shard let go): the next owner counts afresh.
    pub(super) fn forget(&mut self, lost: impl Fn(&str) -> bool) {
        let damped = &self.damped;
        self.seen.retain(|resource, _| {
            let keep = !lost(&resource.namespace);
            if !keep {
                damped.set(resource, None);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::ResourceKind;

    fn secret() -> ResourceKey {
        ResourceKey { kind: ResourceKind::Secret, namespace: "ns".into(), name: "tls".into() }
    }

    fn damping(changes: u32, secs: u64) -> Damping {
        Damping::new(Some(FlapDamping { changes, window: Duration::from_secs(secs) }), Damped::default())
    }

    #[test]
    fn more_changes_than_the_threshold_in_a_window_damp_until_a_quiet_window() {
        let mut d = damping(3, 10);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for ms in [0, 100, 200] {
            assert_eq!(d.change(&secret(), at(ms)), Verdict::Free);
        }
        assert_eq!(d.change(&secret(), at(300)), Verdict::Damped { window: Duration::from_secs(10), began: true });
        assert!(d.damped.get(&secret()).is_some());
        assert_eq!(d.change(&secret(), at(9_000)), Verdict::Damped { window: Duration::from_secs(10), began: false });
        // Still damped while changes keep coming, even spaced out.
        assert_eq!(d.change(&secret(), at(18_000)), Verdict::Damped { window: Duration::from_secs(10), began: false });
        assert_eq!(d.prune(at(20_000)), 1);
        // A whole quiet window ends it; then the count starts again.
        assert_eq!(d.prune(at(28_000)), 0);
        assert!(d.damped.get(&secret()).is_none());
        assert_eq!(d.change(&secret(), at(29_000)), Verdict::Free);
    }

    #[test]
    fn changes_spread_wider_than_the_window_are_never_damped_and_memory_stays_bounded() {
        let mut d = damping(2, 1);
        let t0 = Instant::now();
        for i in 0..1000u64 {
            assert_eq!(d.change(&secret(), t0 + Duration::from_millis(600 * i)), Verdict::Free);
        }
        assert!(d.seen.values().all(|s| s.len() <= 3));
    }

    #[test]
    fn off_without_a_threshold() {
        let mut d = Damping::new(None, Damped::default());
        let t0 = Instant::now();
        assert!((0..100).all(|_| d.change(&secret(), t0) == Verdict::Free));
        let mut zero = damping(0, 10);
        assert_eq!(zero.change(&secret(), t0), Verdict::Free);
    }
}
