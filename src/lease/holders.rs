//! Who may hold the fleet's Leases: the pods of this replica's ServiceAccount in its namespace.
//!
//! ```text
//!  start:   LIST pods name=<identity>                    -> our ServiceAccount (none: not a pod,
//!                                                           holders are not checked)
//!  a holder not seen before:
//!           LIST pods spec.serviceAccountName=<ours>     -> the fleet's replicas
//!           in it: believed       not in it: not believed (its Leases count as free, it is no member)
//! ```
//! Anyone who may write Leases in the controller's namespace (a tenant's operator granted
//! Leases cluster-wide is common) could otherwise hold a shard forever by renewing a Lease
//! in a made-up name, or be given shards as a made-up member. Creating a pod there under the
//! controller's ServiceAccount is what such a writer cannot do. A holder is believed until
//! the first list taken after it was first seen says otherwise, so a replica that has just
//! started is never taken for a forger (taking its shards would make two replicas act).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;
use tracing::{info, warn};

/// How often the replicas are listed at most (a writer making up a new holder each second
/// costs one LIST a second, not one a round).
const MIN_RELIST: Duration = Duration::from_secs(1);
/// How long after a failed first look the ServiceAccount is looked up again.
const RETRY_LOOKUP: Duration = Duration::from_secs(10);
/// Short: the list is awaited in a lease round, whose renewals must not wait for it (a holder
/// is believed while the list is late).
const API_TIMEOUT: Duration = Duration::from_secs(2);

enum State {
    /// Not known yet (the first look failed): everybody is believed meanwhile.
    Unknown {
        retry_at: Option<Instant>,
    },
    /// Not running in a pod (a process started by hand, the tests): nobody is checked.
    Off,
    On {
        service_account: String,
    },
}

pub(super) struct Holders {
    pods: Api<Pod>,
    identity: String,
    state: State,
    /// The fleet's replicas as last listed, and when.
    replicas: HashSet<String>,
    listed_at: Option<Instant>,
    /// When each holder was first seen.
    first_seen: HashMap<String, Instant>,
    /// Holders said not to be believed (said once each).
    refused: BTreeSet<String>,
}

impl Holders {
    pub(super) fn new(pods: Api<Pod>, identity: String) -> Self {
        Holders {
            pods,
            identity,
            state: State::Unknown { retry_at: None },
            replicas: HashSet::new(),
            listed_at: None,
            first_seen: HashMap::new(),
            refused: BTreeSet::new(),
        }
    }

    /// Whether `holder` is believed to be a replica of this fleet.
    pub(super) fn believes(&self, holder: &str) -> bool {
        if holder == self.identity || !matches!(self.state, State::On { .. }) {
            return true;
        }
        match (self.listed_at, self.first_seen.get(holder)) {
            (Some(listed), Some(seen)) if listed >= *seen => self.replicas.contains(holder),
            _ => true, // not looked at since it appeared
        }
    }

    /// Holders not believed now.
    pub(super) fn refused(&self) -> usize {
        self.refused.len()
    }

    /// Look at the holders of this round: list the replicas again when one appeared since the
    /// last list.
    pub(super) async fn look<'a>(&mut self, holders: impl IntoIterator<Item = &'a str>, now: Instant) {
        self.find_service_account(now).await;
        let State::On { service_account } = &self.state else { return };
        let mut unseen = false;
        for holder in holders {
            if holder.is_empty() || holder == self.identity {
                continue;
            }
            let seen = *self.first_seen.entry(holder.to_string()).or_insert(now);
            unseen |= self.listed_at.is_none_or(|listed| listed < seen);
        }
        if !unseen || self.listed_at.is_some_and(|at| now.duration_since(at) < MIN_RELIST) {
            return;
        }
        let params = ListParams::default().fields(&format!("spec.serviceAccountName={service_account}"));
        match tokio::time::timeout(API_TIMEOUT, self.pods.list(&params)).await {
            Ok(Ok(list)) => {
                self.replicas = list.items.into_iter().filter_map(|p| p.metadata.name).collect();
                self.listed_at = Some(Instant::now());
                self.say_refused();
            }
            Ok(Err(err)) => {
                warn!(error = %err, "listing the fleet's pods failed; Lease holders are believed meanwhile")
            }
            Err(_) => warn!("listing the fleet's pods timed out; Lease holders are believed meanwhile"),
        }
    }

    /// Say which holders are not believed, once each, and forget holders long gone.
    fn say_refused(&mut self) {
        let Some(listed) = self.listed_at else { return };
        let now_refused: BTreeSet<String> = self
            .first_seen
            .iter()
            .filter(|(holder, seen)| **seen <= listed && !self.replicas.contains(*holder))
            .map(|(holder, _)| holder.clone())
            .collect();
        for holder in now_refused.difference(&self.refused) {
            warn!(holder = %holder, "a Lease names a holder that is no pod of this controller's ServiceAccount; \
                its Leases count as free and it is no member (someone else writes the fleet's Leases)");
        }
        self.refused = now_refused;
        // Bounded: a writer making up names must not grow this without end.
        if self.first_seen.len() > 4096 {
            self.first_seen.retain(|holder, _| self.replicas.contains(holder));
        }
    }

    /// Find this replica's ServiceAccount from its own pod, once.
    async fn find_service_account(&mut self, now: Instant) {
        let State::Unknown { retry_at } = self.state else { return };
        if retry_at.is_some_and(|at| now < at) {
            return;
        }
        let params = ListParams::default().fields(&format!("metadata.name={}", self.identity));
        match tokio::time::timeout(API_TIMEOUT, self.pods.list(&params)).await {
            Ok(Ok(list)) => match list.items.into_iter().next().and_then(|p| p.spec?.service_account_name) {
                Some(service_account) => {
                    info!(service_account = %service_account, "Lease holders are believed when they are pods of this ServiceAccount");
                    self.state = State::On { service_account };
                }
                None => {
                    info!(pod = %self.identity, "not running as a pod of this namespace: Lease holders are not checked");
                    self.state = State::Off;
                }
            },
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                warn!(error = %status.message, "may not list pods in the controller's namespace: Lease holders are not checked \
                    (whoever may write Leases there can hold shards)");
                self.state = State::Off;
            }
            Ok(Err(err)) => {
                warn!(error = %err, "looking up this replica's pod failed; retrying");
                self.state = State::Unknown { retry_at: Some(now + RETRY_LOOKUP) };
            }
            Err(_) => {
                warn!("looking up this replica's pod timed out; retrying");
                self.state = State::Unknown { retry_at: Some(now + RETRY_LOOKUP) };
            }
        }
    }
}
