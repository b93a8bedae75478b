//! What the engine tells people besides writing: Events on workloads (bad annotations) and
//! alerts after reloads. Neither is ever waited on.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use tracing::{debug, warn};

use super::Engine;
use crate::reload::alert::Alert;
use crate::watch::{ResourceKey, Workload, WorkloadKey};

/// Reported bad annotations remembered at most (then reported again once).
const REPORTED_LIMIT: usize = 10_000;

impl Engine {
    pub(super) fn report_problems(&mut self, workload: &Workload, problems: &[crate::reload::Problem]) {
        if self.reported.len() > REPORTED_LIMIT {
            self.reported.clear();
        }
        for problem in problems {
            let first = (workload.key.clone(), workload.resource_version.clone(), problem.annotation.clone());
            if !self.reported.insert(first) {
                continue;
            }
            self.metrics.invalid_annotations.inc();
            warn!(
                workload = %workload.key,
                annotation = %problem.annotation,
                value = %problem.value,
                reason = %problem.reason,
                "ignoring invalid annotation value"
            );
            let note = format!(
                "Annotation {} has an unusable value {:?}: {}; the value is ignored",
                problem.annotation, problem.value, problem.reason
            );
            self.publish(workload, EventType::Warning, "InvalidAnnotation", note);
        }
    }

    /// Queue an alert for a successful reload; a full queue drops it (counted), never waits.
    pub(super) fn alert(&self, resource: &ResourceKey, workload: &WorkloadKey) {
        let Some((queue, sink)) = &self.alerts else { return };
        let alert = Alert { resource: resource.clone(), workload: workload.clone(), at: jiff::Timestamp::now() };
        if queue.try_send(alert).is_err() {
            self.metrics.alerts.with_label_values(&[sink.to_string().as_str(), "dropped"]).inc();
            debug!(workload = %workload, "the alert queue is full; dropping the alert");
        }
    }

    /// Publish an Event on the workload in the background: the next change does not wait for it.
    pub(super) fn publish(&self, workload: &Workload, type_: EventType, reason: &str, note: String) {
        self.events.post(workload_reference(workload), type_, reason, "Reload", note);
    }
}

/// The object reference of an Event on a workload.
pub(crate) fn workload_reference(workload: &Workload) -> ObjectReference {
    ObjectReference {
        api_version: Some(workload.key.kind.api_version()),
        kind: Some(workload.key.kind.kind().to_string()),
        name: Some(workload.key.name.to_string()),
        namespace: Some(workload.key.namespace.to_string()),
        uid: Some(workload.uid.clone()),
        ..ObjectReference::default()
    }
}
