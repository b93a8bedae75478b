//! The lint task: checks what the watches stored and reports each finding once per object
//! (a Warning Event, a log line, a metric), never once per event. A finding that goes away and
//! comes back is reported again.
//!
//! A workload is checked [`GRACE`] after it was stored, from the store, so that a ConfigMap
//! applied together with it (or just after) is there when its `.../reload` list is checked;
//! workloads whose list names a missing resource are checked again every [`GRACE`] until it
//! appears.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{EventType, Recorder, Reporter};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;
use tracing::{info, warn};

use crate::metrics::{int_counter, int_counter_vec, int_gauge};
use crate::reload::engine::workload_reference;
use crate::reload::events::{Events, WritesOut};
use crate::reload::lint::{self, Finding};
use crate::reload::{Keys, Patterns};
use crate::watch::{ResourceKey, ResourceKind, Store, Stored, WorkloadKey};

/// How long after a workload is stored it is checked, and how often a missing listed resource
/// is looked for again.
const GRACE: Duration = Duration::from_secs(5);
/// Objects with findings remembered at most (then each is reported again once).
const REMEMBERED: usize = 10_000;
/// The Event reason of every finding.
pub const REASON: &str = "AnnotationLint";

/// The lint's series. `received` and `pending` tell when it is idle: every message the
/// watches queued (`reloader_annotation_lint_queued_total{result="sent"}`) received, and no
/// workload waiting for its check.
#[derive(Clone)]
pub struct Metrics {
    /// `reloader_annotation_lint_findings_total{finding}`: findings reported (each also an Event).
    findings: IntCounterVec,
    /// `reloader_annotation_lint_received_total`.
    received: IntCounter,
    /// `reloader_annotation_lint_pending`: workloads waiting for their check.
    pending: IntGauge,
    /// `reloader_annotation_lint_events_dropped_total`: findings whose Event was dropped
    /// because too many waited to be posted.
    events_dropped: IntCounter,
    /// `reloader_annotation_lint_events_pending`: findings' Events made and not yet posted.
    events_pending: IntGauge,
}

impl Metrics {
    /// # Errors
    /// When a series of the same name is already registered.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let findings = int_counter_vec(
            registry,
            "reloader_annotation_lint_findings_total",
            "Annotation mistakes found, by finding",
            &["finding"],
        )?;
        let received =
            int_counter(registry, "reloader_annotation_lint_received_total", "Stored objects the lint received")?;
        let pending =
            int_gauge(registry, "reloader_annotation_lint_pending", "Workloads waiting for their lint check")?;
        let events_dropped = int_counter(
            registry,
            "reloader_annotation_lint_events_dropped_total",
            "Lint Events dropped because too many waited to be posted",
        )?;
        let events_pending =
            int_gauge(registry, "reloader_annotation_lint_events_pending", "Lint Events made and not yet posted")?;
        Ok(Metrics { findings, received, pending, events_dropped, events_pending })
    }
}

/// What the lint reads besides the watches' messages.
pub struct Inputs {
    pub store: Store,
    /// Objects as the watches stored them; the watch task owns the sending side.
    pub stored: mpsc::Receiver<Stored>,
    /// The watches' first list: workloads are checked only once the store is complete.
    pub synced: watch::Receiver<Option<BTreeSet<u32>>>,
    /// Resource kinds watched: a listed resource of a kind not watched is never "absent".
    pub watched: Vec<ResourceKind>,
}

/// Run until `shutdown` or until the watches stop.
pub async fn run(
    client: Client,
    reporter: Reporter,
    keys: Keys,
    inputs: Inputs,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let Inputs { store, mut stored, synced, watched } = inputs;
    let mut lint = Lint {
        keys,
        store,
        watched,
        events: Events::new(
            Recorder::new(client, reporter),
            WritesOut::new(),
            metrics.events_dropped.clone(),
            metrics.events_pending.clone(),
        ),
        metrics,
        reported: HashMap::new(),
        missing: HashSet::new(),
        patterns: Patterns::default(),
    };
    let mut due: DelayQueue<WorkloadKey> = DelayQueue::new();
    let mut queued: HashSet<WorkloadKey> = HashSet::new();
    let mut recheck = tokio::time::interval(GRACE);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            message = stored.recv() => match message {
                None => return,
                Some(message) => lint.receive(message, &mut due, &mut queued),
            },
            Some(expired) = due.next(), if !due.is_empty() => {
                let key = expired.into_inner();
                if synced.borrow().is_none() {
                    due.insert(key, GRACE);
                } else {
                    queued.remove(&key);
                    lint.metrics.pending.set(queued.len() as i64);
                    lint.check_workload(&key);
                    if due.is_empty() {
                        // The start queues every annotated workload: give back what that took
                        // (the queue keeps its slots, a few hundred bytes a workload).
                        due = DelayQueue::new();
                        queued.shrink_to_fit();
                    }
                }
            }
            _ = recheck.tick() => {
                let missing: Vec<WorkloadKey> = lint.missing.iter().cloned().collect();
                for key in missing {
                    lint.check_workload(&key);
                }
            }
        }
    }
}

struct Lint {
    keys: Keys,
    store: Store,
    watched: Vec<ResourceKind>,
    events: Events,
    metrics: Metrics,
    /// Per object UID, the findings reported and still present.
    reported: HashMap<String, BTreeSet<Finding>>,
    /// Workloads whose `.../reload` list names a resource the namespace lacks.
    missing: HashSet<WorkloadKey>,
    /// The lists' patterns, compiled under the engine's limits and budget.
    patterns: Patterns,
}

impl Lint {
    fn receive(&mut self, message: Stored, due: &mut DelayQueue<WorkloadKey>, queued: &mut HashSet<WorkloadKey>) {
        match message {
            Stored::Workload(key) => {
                if queued.insert(key.clone()) {
                    due.insert(key, GRACE);
                }
                self.metrics.pending.set(queued.len() as i64);
            }
            Stored::Resource { key, uid, annotations } => {
                let findings = lint::resource(&self.keys, key.kind, &annotations);
                self.report(&uid, &resource_reference(&key, &uid), &key.to_string(), findings);
            }
        }
        // Counted after the workload is queued, so that "received all, none pending" is idle.
        self.metrics.received.inc();
    }

    fn check_workload(&mut self, key: &WorkloadKey) {
        let Some(workload) = self.store.workload(key) else {
            self.missing.remove(key);
            return;
        };
        let mut findings = lint::workload(&self.keys, &workload, &mut self.patterns);
        let mut absent = false;
        for (kind, name, annotation) in lint::listed_names(&self.keys, &workload) {
            let resource = ResourceKey { kind, namespace: key.namespace.clone(), name: name.as_str().into() };
            if self.watched.contains(&kind) && self.store.resource(&resource).is_none() {
                findings.push(lint::absent(&annotation, kind, &name, &key.namespace));
                absent = true;
            }
        }
        if absent {
            self.missing.insert(key.clone());
        } else {
            self.missing.remove(key);
        }
        self.report(&workload.uid, &workload_reference(&workload), &key.to_string(), findings);
    }

    /// Report the findings not reported yet for this object; forget those that are gone.
    fn report(&mut self, uid: &str, regarding: &ObjectReference, object: &str, findings: Vec<Finding>) {
        if self.reported.len() > REMEMBERED {
            self.reported.clear();
        }
        let before = self.reported.remove(uid).unwrap_or_default();
        let now: BTreeSet<Finding> = findings.into_iter().collect();
        for finding in now.difference(&before) {
            self.metrics.findings.with_label_values(&[finding.code]).inc();
            warn!(object, annotation = %finding.annotation, finding = finding.code, "annotation lint: {}", finding.message);
            self.events.post(regarding.clone(), EventType::Warning, REASON, "Lint", finding.message.clone());
        }
        for finding in before.difference(&now) {
            info!(object, annotation = %finding.annotation, finding = finding.code, "annotation lint: fixed");
        }
        if !now.is_empty() {
            self.reported.insert(uid.to_string(), now);
        }
    }
}

fn resource_reference(key: &ResourceKey, uid: &str) -> ObjectReference {
    let api_version = match key.kind {
        ResourceKind::ConfigMap | ResourceKind::Secret => "v1",
        ResourceKind::SecretProviderClass => "secrets-store.csi.x-k8s.io/v1",
    };
    ObjectReference {
        api_version: Some(api_version.to_string()),
        kind: Some(key.kind.kind().to_string()),
        name: Some(key.name.to_string()),
        namespace: Some(key.namespace.to_string()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}
