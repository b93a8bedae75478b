//! The Lease writes of a round, sent at once. Each write names one Lease and carries the
//! resourceVersion last observed, so they are independent: a round costs the slowest write,
//! not the sum of them (under load, five sequential writes took 0.2-0.4 s of a handoff).
//!
//! ```text
//!  round: decide ─▶ [Action] ─▶ publish (withdrawals, warming) ─▶ perform all at once ─▶ apply
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{API_TIMEOUT, Manager, Observed, is_conflict};
use crate::lease::fence::lock;
use crate::lease::record::{FLEET_LABEL, RING_ANNOTATION, ROLE_LABEL};

/// One Lease write a round decided on.
pub(super) enum Action {
    /// Renew a shard held here (`true`) or acquire a free one (`false`).
    Shard { shard: u32, observed: Option<Observed>, renewing: bool },
    /// Give a drained shard back.
    Release { shard: u32, observed: Observed },
    /// Renew the membership Lease with these handoff annotations.
    Member { lease: Lease, exists: bool, annotations: BTreeMap<String, String> },
}

/// What a write changed in this replica's view, applied once all writes of the round are back.
pub(super) enum Applied {
    /// A Lease as written (or released).
    Observed(String, Observed),
    /// A Lease our label selector does not see: observed by GET until it is free or expired.
    Adopted(String, Observed),
    /// The membership Lease as written, and the annotations it carries.
    Member {
        name: String,
        observed: Observed,
        annotations: BTreeMap<String, String>,
    },
    /// Someone else wrote the Lease first: the next round decides from a fresh LIST.
    Conflict,
    Nothing,
}

impl Manager {
    /// The membership write due: every retry period, and at once when what it tells the
    /// others about a handoff changed.
    pub(super) fn membership_action(&self) -> Option<Action> {
        let annotations = self.handoff_annotations();
        let news = self.member.written.as_ref() != Some(&annotations);
        if !news && self.member.renewed.is_some_and(|at| at.elapsed() < self.config.retry_period) {
            return None;
        }
        let name = self.config.member_lease_name(&self.config.identity);
        let observed = self.observed.get(&name);
        let mut lease = self.lease_record(&name, "member", observed, &self.config.identity, false);
        lease.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations.clone());
        Some(Action::Member { lease, exists: observed.is_some(), annotations })
    }

    /// Send one write. Times are taken just before sending, so a renewal counts from no
    /// later than the moment the API server could have seen it.
    pub(super) async fn perform(&self, action: Action) -> Applied {
        match action {
            Action::Shard { shard, observed, renewing } => self.write(shard, observed.as_ref(), renewing).await,
            Action::Release { shard, observed } => match self.put_release(shard, &observed).await {
                // Not ours on record any more: a leaving replica stops when it holds nothing.
                Some(released) => Applied::Observed(
                    self.config.shard_lease_name(shard),
                    Observed { lease: released, changed_at: Instant::now() },
                ),
                // Maybe lost a race: decide again from a fresh LIST.
                None => Applied::Conflict,
            },
            Action::Member { lease, exists, annotations } => {
                let name = self.config.member_lease_name(&self.config.identity);
                let sent = Instant::now();
                match self.put(&name, lease, exists).await {
                    Ok(written) => {
                        debug!(annotations = ?annotations, took = ?sent.elapsed(), "membership lease written");
                        Applied::Member { name, observed: Observed { lease: written, changed_at: sent }, annotations }
                    }
                    Err(err) => {
                        debug!(error = %err, "renewing the membership lease failed");
                        if is_conflict(&err) { Applied::Conflict } else { Applied::Nothing }
                    }
                }
            }
        }
    }

    pub(super) fn apply(&mut self, applied: Applied) {
        match applied {
            Applied::Observed(name, observed) => {
                self.observed.insert(name, observed);
            }
            Applied::Adopted(name, observed) => {
                self.adopted.insert(name, observed);
            }
            Applied::Member { name, observed, annotations } => {
                self.member.renewed = Some(observed.changed_at);
                self.member.written = Some(annotations);
                self.observed.insert(name, observed);
            }
            Applied::Conflict => self.must_list = true,
            Applied::Nothing => {}
        }
    }

    /// Acquire (or renew, when `renewing`) a shard's Lease.
    async fn write(&self, shard: u32, observed: Option<&Observed>, renewing: bool) -> Applied {
        let name = self.config.shard_lease_name(shard);
        let lease = self.lease_record(&name, "shard", observed, &self.config.identity, renewing);
        let sent = Instant::now();
        match self.put(&name, lease, observed.is_some()).await {
            Ok(written) => {
                if !renewing {
                    info!(shard, lease = %name, "shard lease acquired");
                    self.metrics.acquisitions.inc();
                    if let Some(previous) = observed {
                        // From the moment this replica saw the Lease's last change to holding it.
                        self.metrics.handoff.observe(sent.saturating_duration_since(previous.changed_at).as_secs_f64());
                    }
                }
                lock(&self.last_ok_send).insert(shard, sent);
                Applied::Observed(name, Observed { lease: written, changed_at: sent })
            }
            Err(err) if is_conflict(&err) && observed.is_none() => {
                // A Lease our label selector does not see: Reloader's own lock, written before
                // the swap. Observe it like any other; it is adopted once free or expired.
                match tokio::time::timeout(API_TIMEOUT, self.api.get_opt(&name)).await {
                    Ok(Ok(Some(existing))) => {
                        debug!(shard, lease = %name, "found an unlabelled lease; waiting for it to be free or expire");
                        Applied::Adopted(name, Observed { lease: existing, changed_at: Instant::now() })
                    }
                    _ => Applied::Nothing,
                }
            }
            Err(err) if is_conflict(&err) => {
                debug!(shard, "lease write lost a race; deciding again next round");
                Applied::Conflict
            }
            Err(err) => {
                warn!(shard, error = %err, "lease write failed");
                Applied::Nothing
            }
        }
    }

    /// Write the Lease as free, as client-go does on release: no holder, 1 s duration.
    pub(super) async fn put_release(&self, shard: u32, observed: &Observed) -> Option<Lease> {
        let name = self.config.shard_lease_name(shard);
        let mut lease = observed.lease.clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        match self.put(&name, lease, true).await {
            Ok(released) => {
                info!(shard, lease = %name, "shard lease released");
                Some(released)
            }
            Err(err) => {
                warn!(shard, error = %err, "releasing a shard lease failed; it will expire instead");
                None
            }
        }
    }

    /// The Lease to write: client-go LeaseLock fields, with the observed resourceVersion.
    fn lease_record(&self, name: &str, role: &str, observed: Option<&Observed>, holder: &str, renewing: bool) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let previous = observed.and_then(|o| o.lease.spec.clone()).unwrap_or_default();
        let same_holder = previous.holder_identity.as_deref() == Some(holder);
        let transitions = previous.lease_transitions.unwrap_or(0) + i32::from(!same_holder && observed.is_some());
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.config.namespace.clone()),
                resource_version: observed.and_then(Observed::resource_version),
                annotations: Some(BTreeMap::from([(RING_ANNOTATION.to_string(), self.config.ring.clone())])),
                labels: Some(BTreeMap::from([
                    (FLEET_LABEL.to_string(), self.config.prefix.clone()),
                    (ROLE_LABEL.to_string(), role.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(
                    i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
                ),
                acquire_time: if renewing && same_holder { previous.acquire_time } else { Some(now.clone()) },
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn put(&self, name: &str, lease: Lease, exists: bool) -> Result<Lease, kube::Error> {
        let call = async {
            if exists {
                self.api.replace(name, &PostParams::default(), &lease).await
            } else {
                self.api.create(&PostParams::default(), &lease).await
            }
        };
        match tokio::time::timeout(API_TIMEOUT, call).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service("lease write timed out".into())),
        }
    }
}
