//! Writing a reload, the way the kind table says for each kind. The strategy's patch is the
//! same for every kind (rooted at `spec.template`, plus workload metadata); only how it
//! reaches the cluster differs.
//!
//! ```text
//!  strategic patch ─▶ StrategicPatch: PATCH it (Deployment, DaemonSet, StatefulSet)
//!                  ─▶ MergePatch:     apply it to the stored containers, merge-PATCH with the
//!                                     resourceVersion as precondition (+ restartAt) (Rollout, DC,
//!                                     declared kinds, at their own paths)
//!                  ─▶ CreateJob:      apply it to the job template, POST a Job named after the
//!                                     change, then record the hash on the CronJob's metadata;
//!                                     with `cronjob-reload-strategy: patch`, PATCH it into the
//!                                     CronJob's job template instead (no Job)
//!                  ─▶ Recreate:       apply it to the Job's spec, DELETE (uid precondition), POST
//! ```
//! Every write is a no-op or a conflict when replayed: a CronJob's Job is named after the
//! change (a second POST is `AlreadyExists`), and the other kinds record the hash in the object
//! itself, which the strategy checks before planning a write.

use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::{Api, Client};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use crate::reload::api::{API_TIMEOUT, FIELD_MANAGER, retry_delay, timed};
use crate::reload::events::WritesOut;
use crate::reload::{RELOADED_HASHES, ROLLOUT_STRATEGY, apply_strategic};
use crate::watch::{
    Compactor, JOB_UID_LABELS, SlimDaemonSet, SlimDeployment, SlimRaw, SlimStatefulSet, SlimWorkload, Workload,
    WorkloadKey, WorkloadKind, WriteMethod,
};

/// Annotation Kubernetes puts on Jobs created by hand from a CronJob; Reloader sets it too.
const INSTANTIATE: &str = "cronjob.kubernetes.io/instantiate";
/// How long a Job created again waits for the deleted one's name to be free.
const RECREATE_PATIENCE: Duration = Duration::from_secs(10);
/// The longest CronJob name that leaves room for `-` and the change's 10 hex characters in a
/// Job name (at most 63, because the job controller puts the name in a label).
const JOB_NAME_PREFIX_MAX: usize = 52;

/// The writes of reloads: one client, the compactor that turns what the API server answers
/// back into the stored form (so the engine sees its own write at once), and the count of
/// writes out that Events yield to.
#[derive(Clone)]
pub(crate) struct Writes {
    pub client: Client,
    pub compactor: Compactor,
    pub out: WritesOut,
}

/// The outcome of one write: the workload as written (`None` when it no longer exists), or
/// why it failed (retried by the engine).
pub(crate) type WriteOutcome = Result<Option<Workload>, WriteError>;

/// Why a write failed; its text goes into the log, the `ReloadFail` Event and the alert.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
    #[error("{0} takes no strategic-merge patch")]
    NoStrategicPatch(&'static str),
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("building the Job: {0}")]
    BuildingJob(serde_json::Error),
    #[error("reading the created Job: {0}")]
    ReadingCreatedJob(serde_json::Error),
    #[error("the Job was deleted but creating it again failed: {0}")]
    JobNotCreatedAgain(kube::Error),
    #[error("reading {key} to write it: {source}")]
    Reading { key: WorkloadKey, source: kube::Error },
    #[error("{0} has no template to write")]
    NoTemplate(WorkloadKey),
    #[error("the template of {key} is unreadable: {source}")]
    Unreadable { key: WorkloadKey, source: serde_json::Error },
    /// A change's POST to the webhook (`--webhook-url`), sent in place of writes.
    #[error(transparent)]
    Post(#[from] crate::reload::alert::PostError),
    /// Never sent: the write (or POST) ended without an answer.
    #[error("not sent")]
    NotSent,
}

impl Writes {
    /// Write `patch` (from [`crate::reload::plan`]) onto `workload` the way its kind is written.
    pub async fn write(&self, workload: &Workload, patch: &Value, now: jiff::Timestamp) -> WriteOutcome {
        let _out = self.out.enter();
        let call = async {
            match workload.key.kind.spec().write {
                WriteMethod::StrategicPatch => self.strategic_patch(&workload.key, patch).await,
                WriteMethod::MergePatch => self.merge_patch(workload, patch, now).await,
                WriteMethod::CreateJob if crate::reload::strategy::patches_its_template(workload) => {
                    self.patch_job_template(workload, patch).await
                }
                WriteMethod::CreateJob => self.create_job(workload, patch).await,
                WriteMethod::Recreate => self.recreate(workload, patch).await,
            }
        };
        match tokio::time::timeout(API_TIMEOUT + RECREATE_PATIENCE, call).await {
            Err(_) => Err(WriteError::TimedOut(API_TIMEOUT + RECREATE_PATIENCE)),
            Ok(result) => result,
        }
    }

    /// A strategic-merge PATCH (also the pause and resume of Deployments).
    pub async fn strategic_patch(&self, key: &WorkloadKey, patch: &Value) -> WriteOutcome {
        let result = match key.kind {
            WorkloadKind::Deployment => self.patch_as::<SlimDeployment>(key, patch).await,
            WorkloadKind::DaemonSet => self.patch_as::<SlimDaemonSet>(key, patch).await,
            WorkloadKind::StatefulSet => self.patch_as::<SlimStatefulSet>(key, patch).await,
            other => return Err(WriteError::NoStrategicPatch(other.kind())),
        };
        gone_is_none(result)
    }

    async fn patch_as<K: SlimWorkload>(
        &self,
        key: &WorkloadKey,
        patch: &Value,
    ) -> Result<Option<Workload>, kube::Error> {
        let api: Api<K> = Api::namespaced(self.client.clone(), &key.namespace);
        let updated = timed(api.patch(&key.name, &params(), &Patch::Strategic(patch))).await?;
        Ok(self.compactor.compact(&updated))
    }

    /// Custom resources: a merge patch of exactly the fields the strategy writes. The
    /// containers list is replaced whole, so the patch carries the resourceVersion it was
    /// computed from; a 409 means someone else wrote first and the engine decides again.
    /// A Rollout annotated `rollout-strategy: restart` also gets `spec.restartAt` in the same
    /// patch (Reloader v2's choice: the template keeps the record, so a replay writes nothing).
    ///
    /// A Rollout running a Deployment's template (`workloadRef`) has no template to write: it is
    /// restarted, and the record goes on its metadata (Reloader #1090).
    async fn merge_patch(&self, workload: &Workload, patch: &Value, now: jiff::Timestamp) -> WriteOutcome {
        let mut body = json!({ "metadata": { "resourceVersion": workload.resource_version } });
        if let Some(annotations) = patch.pointer("/metadata/annotations") {
            body["metadata"]["annotations"] = annotations.clone();
        }
        if workload.workload_ref.is_some() {
            body["spec"]["restartAt"] = json!(next_restart(workload.raw.as_deref(), now).to_string());
            let api = self.raw_api(&workload.key);
            let result = timed(api.patch(&workload.key.name, &params(), &Patch::Merge(&body))).await;
            return gone_is_none(result.map(|updated| self.compactor.compact_raw(workload.key.kind, &updated)));
        }
        // The strategy writes a Deployment's places; the kind's row says where they are here.
        let spec = workload.key.kind.spec();
        if let Some(annotations) = patch.pointer("/spec/template/metadata/annotations") {
            spec.pod.metadata_mut(&mut body["spec"])["annotations"] = annotations.clone();
        }
        if let Some(containers) = patch.pointer("/spec/template/spec/containers") {
            let mut current = self.raw_of(workload).await?;
            apply_strategic(&mut current, containers);
            spec.pod.spec_mut(&mut body["spec"])["containers"] = current;
        }
        if workload.key.kind == WorkloadKind::Rollout
            && workload.annotations.get(ROLLOUT_STRATEGY).is_some_and(|s| s == "restart")
        {
            body["spec"]["restartAt"] = json!(next_restart(None, now).to_string());
        }
        if let Some(field) = spec.restart_field_mut(&mut body["spec"]) {
            *field = json!(next_restart(None, now).to_string());
        }
        let api = self.raw_api(&workload.key);
        let result = timed(api.patch(&workload.key.name, &params(), &Patch::Merge(&body))).await;
        gone_is_none(result.map(|updated| self.compactor.compact_raw(workload.key.kind, &updated)))
    }

    /// A Job from the CronJob's job template, as Reloader creates it, named after the change
    /// so that a replay finds it there (`AlreadyExists`) instead of creating a second one.
    /// Then the CronJob's metadata records the hash; its spec is never touched.
    async fn create_job(&self, cronjob: &Workload, patch: &Value) -> WriteOutcome {
        let job_template = self.raw_of(cronjob).await?;
        let mut spec = job_template["spec"].clone();
        if let Some(template) = patch.pointer("/spec/template") {
            apply_strategic(&mut spec["template"], template);
        }
        let mut annotations = json!({ INSTANTIATE: "manual" });
        apply_strategic(&mut annotations, &job_template["metadata"]["annotations"]);
        let name = &cronjob.key.name;
        let job = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name(cronjob, patch),
                "generateName": format!("{name}-"),
                "namespace": cronjob.key.namespace.as_ref(),
                "labels": job_template["metadata"]["labels"],
                "annotations": annotations,
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "CronJob", "name": name.as_ref(), "uid": cronjob.uid,
                    "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": spec
        });
        let job: DynamicObject = serde_json::from_value(job).map_err(WriteError::BuildingJob)?;
        let jobs: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &cronjob.key.namespace, &WorkloadKind::Job.api_resource());
        match timed(jobs.create(&post_params(), &job)).await {
            Ok(_) => {}
            // Created by an earlier attempt at this same change: only the record is missing.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err.into()),
        }
        let record = json!({ "metadata": { "annotations": patch.pointer("/metadata/annotations") } });
        let api = self.raw_api(&cronjob.key);
        let result = timed(api.patch(name, &params(), &Patch::Merge(&record))).await;
        gone_is_none(result.map(|updated| self.compactor.compact_raw(WorkloadKind::CronJob, &updated)))
    }

    /// `cronjob-reload-strategy: patch`: the reload goes into the CronJob's job template (the
    /// strategy's template patch, moved under `jobTemplate.spec`), with the metadata record in
    /// the same strategic-merge PATCH; no Job is created, the next scheduled one uses the data.
    async fn patch_job_template(&self, cronjob: &Workload, patch: &Value) -> WriteOutcome {
        let mut body = json!({ "metadata": patch.get("metadata").cloned().unwrap_or(Value::Null) });
        if let Some(template) = patch.pointer("/spec/template") {
            body["spec"] = json!({ "jobTemplate": { "spec": { "template": template } } });
        }
        let api = self.raw_api(&cronjob.key);
        let result = timed(api.patch(&cronjob.key.name, &params(), &Patch::Strategic(&body))).await;
        gone_is_none(result.map(|updated| self.compactor.compact_raw(WorkloadKind::CronJob, &updated)))
    }

    /// A Job's template cannot change: delete it (only this very Job, by UID; its pods go in
    /// the background) and create it again under the same name with the new template, without
    /// what the API server fills in for one Job (uid, selector, the controller-uid labels).
    async fn recreate(&self, job: &Workload, patch: &Value) -> WriteOutcome {
        let stored = self.raw_of(job).await?;
        let mut spec = stored["spec"].clone();
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("selector");
            spec.remove("manualSelector");
        }
        if let Some(template) = patch.pointer("/spec/template") {
            apply_strategic(&mut spec["template"], template);
        }
        let mut labels = stored["metadata"]["labels"].clone();
        for label in JOB_UID_LABELS {
            for map in [&mut labels, &mut spec["template"]["metadata"]["labels"]] {
                if let Some(map) = map.as_object_mut() {
                    map.remove(label);
                }
            }
        }
        let mut annotations = stored["metadata"]["annotations"].clone();
        if let Some(record) = patch.pointer("/metadata/annotations") {
            apply_strategic(&mut annotations, record);
        }
        let copy = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job.key.name.as_ref(),
                "namespace": job.key.namespace.as_ref(),
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": stored["metadata"]["ownerReferences"]
            },
            "spec": spec
        });
        let copy: DynamicObject = serde_json::from_value(copy).map_err(WriteError::BuildingJob)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &job.key.namespace, &WorkloadKind::Job.api_resource());
        let delete = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions { uid: Some(job.uid.clone()), resource_version: None }),
            ..DeleteParams::default()
        };
        match timed(api.delete(&job.key.name, &delete)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(err) => return Err(err.into()),
        }
        // Deleted: from here on only a created copy keeps the Job, so creating it is retried
        // here while the old one's name is still taken, not left to a later change.
        let deadline = tokio::time::Instant::now() + RECREATE_PATIENCE;
        let mut attempt = 0;
        loop {
            match timed(api.create(&post_params(), &copy)).await {
                Ok(created) => {
                    let raw: SlimRaw = serde_json::to_value(created)
                        .and_then(serde_json::from_value)
                        .map_err(WriteError::ReadingCreatedJob)?;
                    return Ok(self.compactor.compact_raw(WorkloadKind::Job, &raw));
                }
                Err(kube::Error::Api(status)) if status.code == 409 && tokio::time::Instant::now() < deadline => {
                    attempt += 1;
                    tokio::time::sleep(retry_delay(attempt).min(Duration::from_secs(1))).await;
                }
                Err(err) => return Err(WriteError::JobNotCreatedAgain(err)),
            }
        }
    }

    /// What the write of `workload` needs beyond the slim view: as stored, or, for an object
    /// too large to keep ([`crate::watch::RAW_LIMIT`]), read now (one GET for such a write).
    async fn raw_of(&self, workload: &Workload) -> Result<Value, WriteError> {
        let raw = match &workload.raw {
            Some(raw) => raw.to_string(),
            None => {
                let object = timed(self.raw_api(&workload.key).get(&workload.key.name))
                    .await
                    .map_err(|source| WriteError::Reading { key: workload.key.clone(), source })?;
                Compactor::raw_of(workload.key.kind, &object)
                    .ok_or_else(|| WriteError::NoTemplate(workload.key.clone()))?
            }
        };
        serde_json::from_str(&raw).map_err(|source| WriteError::Unreadable { key: workload.key.clone(), source })
    }

    fn raw_api(&self, key: &WorkloadKey) -> Api<SlimRaw> {
        Api::namespaced_with(self.client.clone(), &key.namespace, &key.kind.api_resource())
    }
}

/// The name of the Job a change makes of a CronJob: the CronJob's name and 10 hex characters
/// of the CronJob's UID, its record before the change and the record the change writes. The
/// same change gives the same name; a later change back to an earlier hash gives a new one.
fn job_name(cronjob: &Workload, patch: &Value) -> String {
    let mut hasher = Sha1::new();
    hasher.update(cronjob.uid.as_bytes());
    hasher.update(cronjob.annotations.get(RELOADED_HASHES).map(String::as_str).unwrap_or_default().as_bytes());
    hasher.update(patch.pointer("/metadata/annotations").map(Value::to_string).unwrap_or_default().as_bytes());
    let digest: String = hasher.finalize().iter().take(5).map(|b| format!("{b:02x}")).collect();
    let prefix: String = cronjob.key.name.chars().take(JOB_NAME_PREFIX_MAX).collect();
    format!("{}-{digest}", prefix.trim_end_matches(['-', '.']))
}

/// The `restartAt` that restarts every pod created before `now`: the next whole second (Argo
/// restarts pods created before it, and waits for it to pass), and always later than the
/// `previous` one, or two changes within a second would write one value and restart once.
fn next_restart(previous: Option<&str>, now: jiff::Timestamp) -> jiff::Timestamp {
    let second = jiff::SignedDuration::from_secs(1);
    let ceiling = now.round(jiff::TimestampRound::new().smallest(jiff::Unit::Second).mode(jiff::RoundMode::Ceil));
    let ceiling = ceiling.unwrap_or(now);
    match previous.and_then(|p| p.parse::<jiff::Timestamp>().ok()).and_then(|p| p.checked_add(second).ok()) {
        Some(after) if after > ceiling => after,
        _ => ceiling,
    }
}

fn params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PostParams::default() }
}

/// A 404 means the workload is gone: nothing to write, nothing to retry.
fn gone_is_none(result: Result<Option<Workload>, kube::Error>) -> WriteOutcome {
    match result {
        Ok(updated) => Ok(updated),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cronjob(name: &str) -> Workload {
        Workload { uid: "uid-1".into(), ..Workload::test(WorkloadKind::CronJob, "ns", name) }
    }

    #[test]
    fn a_change_names_its_job_and_the_name_fits_a_label() {
        let record = |h: &str| json!({ "metadata": { "annotations": { "r": h } } });
        let name = job_name(&cronjob("nightly"), &record("a"));
        assert_eq!(name, job_name(&cronjob("nightly"), &record("a")), "a replay gives the same name");
        assert_ne!(name, job_name(&cronjob("nightly"), &record("b")));
        assert!(name.starts_with("nightly-") && name.len() == "nightly-".len() + 10, "{name}");
        let long = job_name(&cronjob(&"x".repeat(52)), &record("a"));
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn each_restart_is_later_than_the_last_and_not_before_the_change() {
        let at = |s: &str| s.parse::<jiff::Timestamp>().expect("a timestamp");
        let now = at("2026-12-06T10:00:00.300Z");
        assert_eq!(next_restart(None, now), at("2026-12-06T10:00:01Z"), "the next whole second");
        assert_eq!(next_restart(None, at("2026-12-06T10:00:00Z")), at("2026-12-06T10:00:00Z"));
        let previous = next_restart(None, now).to_string();
        assert_eq!(next_restart(Some(&previous), now), at("2026-12-06T10:00:02Z"), "a second change in that second");
        assert_eq!(next_restart(Some("2026-12-06T09:00:00Z"), now), at("2026-12-06T10:00:01Z"));
        assert_eq!(next_restart(Some("not a time"), now), at("2026-12-06T10:00:01Z"));
    }
}
