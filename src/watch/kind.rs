//! Workload kinds as data: one table says, per kind, its API resource, where its pod template
//! and annotations live, and how a reload is written. Rules and strategies are the same
//! functions for every kind; only the write differs, and the writer reads it from here.
//!
//! ```text
//!  kind             API                         pod template (under spec)   write
//!  Deployment       apps/v1 deployments         template                    strategic-merge patch
//!  DaemonSet        apps/v1 daemonsets          template                    strategic-merge patch
//!  StatefulSet      apps/v1 statefulsets        template                    strategic-merge patch
//!  CronJob          batch/v1 cronjobs           jobTemplate.spec.template   create a Job from the template
//!  Job              batch/v1 jobs               template                    delete and create again
//!  Rollout          argoproj.io/v1alpha1        template                    merge patch (+ restartAt)
//!  DeploymentConfig apps.openshift.io/v1        template                    merge patch
//!  (declared)       --custom-kinds-file         a path, or metadata + spec  merge patch (+ a restart field)
//! ```
//! Metadata annotations are read from each object's own `metadata` (for a CronJob: the
//! CronJob's, not the job template's), as Reloader does. Rows past the seventh are declared
//! by the operator at start-up ([`custom`]): any custom resource with a pod template.

use std::sync::OnceLock;

use kube::discovery::ApiResource;
use serde_json::Value;

pub mod custom;

/// The workload kinds the engine can roll. Shown (`{:?}`) by its Kubernetes kind, a declared
/// one too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Deployment,
    DaemonSet,
    StatefulSet,
    CronJob,
    Job,
    Rollout,
    DeploymentConfig,
    /// A kind declared in `--custom-kinds-file`: its row is the n-th declared one.
    Custom(u8),
}

/// How a reload is written for a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMethod {
    /// A strategic-merge patch of the pod template, as Reloader writes it.
    StrategicPatch,
    /// A JSON merge patch carrying the resourceVersion as precondition: custom resources take
    /// no strategic merge, and a list (containers) is replaced whole, so it must not be stale.
    MergePatch,
    /// Create a Job from the job template; the CronJob's spec is left alone and its metadata
    /// records the hash.
    CreateJob,
    /// Delete and create again under the same name: a Job's template cannot change.
    Recreate,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindSpec {
    /// The Kubernetes kind, as in metric labels, Events and `last-reloaded-from`.
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// Where the pod's metadata and spec live.
    pub pod: PodPlace,
    pub write: WriteMethod,
    /// What a reload writes on the object's own metadata besides the template: only the
    /// CronJob, whose template is never changed, records the hash there alone.
    pub records_in_metadata: bool,
    /// A field under `spec` set to the time of each reload, for operators that restart their
    /// pods on it (as Argo's `restartAt`); declared kinds only.
    pub restart_field: Option<&'static [&'static str]>,
}

impl KindSpec {
    /// The place of the declared restart field in a patch's `spec`, made on the way.
    pub fn restart_field_mut<'a>(&self, spec: &'a mut Value) -> Option<&'a mut Value> {
        self.restart_field.map(|path| at_mut(spec, path))
    }
}

/// Paths under an object's `spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPlace {
    /// A pod template: `metadata` and `spec` below this path.
    Template(&'static [&'static str]),
    /// An operator's own layout (VictoriaMetrics' `podMetadata` beside `containers` and
    /// `volumes`): the pod's metadata at one path, its spec (containers, volumes) at another.
    Split { metadata: &'static [&'static str], spec: &'static [&'static str] },
}

impl PodPlace {
    /// The pod's metadata in an object's `spec` (Null when absent).
    pub fn metadata<'a>(&self, spec: &'a Value) -> &'a Value {
        match self {
            PodPlace::Template(path) => &at(spec, path)["metadata"],
            PodPlace::Split { metadata, .. } => at(spec, metadata),
        }
    }

    /// The pod's spec in an object's `spec` (Null when absent).
    pub fn spec<'a>(&self, spec: &'a Value) -> &'a Value {
        match self {
            PodPlace::Template(path) => &at(spec, path)["spec"],
            PodPlace::Split { spec: path, .. } => at(spec, path),
        }
    }

    /// Where the pod is, as written in `--custom-kinds-file` (`spec.template`).
    pub fn describe(&self) -> String {
        let dotted = |path: &[&str]| std::iter::once("spec").chain(path.iter().copied()).collect::<Vec<_>>().join(".");
        match self {
            PodPlace::Template(path) => dotted(path),
            PodPlace::Split { metadata, spec } => format!("{} and {}", dotted(metadata), dotted(spec)),
        }
    }

    /// The place of the pod's metadata in a patch's `spec`, made on the way.
    pub fn metadata_mut<'a>(&self, spec: &'a mut Value) -> &'a mut Value {
        match self {
            PodPlace::Template(path) => &mut at_mut(spec, path)["metadata"],
            PodPlace::Split { metadata, .. } => at_mut(spec, metadata),
        }
    }

    /// The place of the pod's spec in a patch's `spec`, made on the way.
    pub fn spec_mut<'a>(&self, spec: &'a mut Value) -> &'a mut Value {
        match self {
            PodPlace::Template(path) => &mut at_mut(spec, path)["spec"],
            PodPlace::Split { spec: path, .. } => at_mut(spec, path),
        }
    }
}

/// The value at `path` below `value`; Null when a step is missing or not an object.
fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, step| &v[*step])
}

/// The place at `path` below `value`, objects made on the way; a step that is not an object
/// (never in a patch built from `{}`) is replaced by one rather than panic.
fn at_mut<'a>(value: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(value, |v, step| {
        if !v.is_object() {
            *v = Value::Object(Default::default());
        }
        &mut v[*step]
    })
}

const TABLE: [KindSpec; 7] = [
    KindSpec {
        kind: "Deployment",
        group: "apps",
        version: "v1",
        plural: "deployments",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
        restart_field: None,
    },
    KindSpec {
        kind: "DaemonSet",
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
        restart_field: None,
    },
    KindSpec {
        kind: "StatefulSet",
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
        restart_field: None,
    },
    KindSpec {
        kind: "CronJob",
        group: "batch",
        version: "v1",
        plural: "cronjobs",
        pod: PodPlace::Template(&["jobTemplate", "spec", "template"]),
        write: WriteMethod::CreateJob,
        records_in_metadata: true,
        restart_field: None,
    },
    KindSpec {
        kind: "Job",
        group: "batch",
        version: "v1",
        plural: "jobs",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::Recreate,
        records_in_metadata: false,
        restart_field: None,
    },
    KindSpec {
        kind: "Rollout",
        group: "argoproj.io",
        version: "v1alpha1",
        plural: "rollouts",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::MergePatch,
        records_in_metadata: false,
        restart_field: None,
    },
    KindSpec {
        kind: "DeploymentConfig",
        group: "apps.openshift.io",
        version: "v1",
        plural: "deploymentconfigs",
        pod: PodPlace::Template(&["template"]),
        write: WriteMethod::MergePatch,
        records_in_metadata: false,
        restart_field: None,
    },
];

impl std::fmt::Debug for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 7] = [
        WorkloadKind::Deployment,
        WorkloadKind::DaemonSet,
        WorkloadKind::StatefulSet,
        WorkloadKind::CronJob,
        WorkloadKind::Job,
        WorkloadKind::Rollout,
        WorkloadKind::DeploymentConfig,
    ];

    /// This kind's row of the table.
    pub fn spec(self) -> &'static KindSpec {
        let builtin = |row: usize| &TABLE[row];
        match self {
            WorkloadKind::Deployment => builtin(0),
            WorkloadKind::DaemonSet => builtin(1),
            WorkloadKind::StatefulSet => builtin(2),
            WorkloadKind::CronJob => builtin(3),
            WorkloadKind::Job => builtin(4),
            WorkloadKind::Rollout => builtin(5),
            WorkloadKind::DeploymentConfig => builtin(6),
            // Only `custom::declare` makes a `Custom(n)`, for a row it has stored.
            WorkloadKind::Custom(n) => &declared()[usize::from(n)],
        }
    }

    /// Every kind: the built-in ones, then those declared in `--custom-kinds-file`.
    pub fn all() -> impl Iterator<Item = WorkloadKind> {
        let declared = declared().len().min(usize::from(u8::MAX));
        WorkloadKind::ALL.into_iter().chain((0..declared).map(|n| WorkloadKind::Custom(n as u8)))
    }

    /// Whether the operator declared this kind (not one Reloader knows).
    pub fn is_declared(self) -> bool {
        matches!(self, WorkloadKind::Custom(_))
    }

    /// The Kubernetes kind, as in metric labels (`reloader_action_total{workload_kind}`).
    pub fn kind(self) -> &'static str {
        self.spec().kind
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(self) -> String {
        let spec = self.spec();
        if spec.group.is_empty() { spec.version.to_string() } else { format!("{}/{}", spec.group, spec.version) }
    }

    /// The dynamic API resource, for kinds read and written without a typed struct.
    pub fn api_resource(self) -> ApiResource {
        let spec = self.spec();
        ApiResource {
            group: spec.group.to_string(),
            version: spec.version.to_string(),
            api_version: self.api_version(),
            kind: spec.kind.to_string(),
            plural: spec.plural.to_string(),
        }
    }

    /// The kind named by an `--ignored-workload-types` entry (`jobs`, `CronJob`, ...); a
    /// declared kind also by its plural and as `plural.group` (`vmagents.operator.victoriametrics.com`).
    pub fn from_type_name(name: &str) -> Option<WorkloadKind> {
        let lower = name.trim().to_ascii_lowercase();
        let singular = lower.strip_suffix('s').unwrap_or(&lower);
        WorkloadKind::all().find(|k| {
            let spec = k.spec();
            k.kind().eq_ignore_ascii_case(singular)
                || (k.is_declared()
                    && (spec.plural == lower
                        || format!("{}.{}", spec.plural, spec.group) == lower
                        || format!("{}.{}", spec.kind.to_ascii_lowercase(), spec.group) == lower))
        })
    }
}

/// The declared rows (none until `custom::declare` stores them).
fn declared() -> &'static [KindSpec] {
    DECLARED.get().map(Vec::as_slice).unwrap_or(&[])
}

/// Set once at start-up from `--custom-kinds-file`; a process declares one set of kinds.
static DECLARED: OnceLock<Vec<KindSpec>> = OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_enum_order() {
        for kind in WorkloadKind::ALL {
            assert_eq!(kind.spec().kind, format!("{kind:?}"), "a row is out of order");
        }
    }

    #[test]
    fn type_names_take_reloader_spellings() {
        assert_eq!(WorkloadKind::from_type_name("jobs"), Some(WorkloadKind::Job));
        assert_eq!(WorkloadKind::from_type_name("CronJobs"), Some(WorkloadKind::CronJob));
        assert_eq!(WorkloadKind::from_type_name("deploymentconfig"), Some(WorkloadKind::DeploymentConfig));
        assert_eq!(WorkloadKind::from_type_name("rollouts"), Some(WorkloadKind::Rollout));
        assert_eq!(WorkloadKind::from_type_name("pods"), None);
        assert_eq!(WorkloadKind::api_version(WorkloadKind::Rollout), "argoproj.io/v1alpha1");
    }
}
