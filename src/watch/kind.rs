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
//! ```
//! Metadata annotations are read from each object's own `metadata` (for a CronJob: the
//! CronJob's, not the job template's), as Reloader does.

use kube::discovery::ApiResource;

/// The workload kinds the engine can roll.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Deployment,
    DaemonSet,
    StatefulSet,
    CronJob,
    Job,
    Rollout,
    DeploymentConfig,
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
#[derive(Debug)]
pub struct KindSpec {
    /// The Kubernetes kind, as in metric labels, Events and `last-reloaded-from`.
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// Path of the pod template under `spec`.
    pub template: &'static [&'static str],
    pub write: WriteMethod,
    /// What a reload writes on the object's own metadata besides the template: only the
    /// CronJob, whose template is never changed, records the hash there alone.
    pub records_in_metadata: bool,
}

const TABLE: [KindSpec; 7] = [
    KindSpec {
        kind: "Deployment",
        group: "apps",
        version: "v1",
        plural: "deployments",
        template: &["template"],
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
    },
    KindSpec {
        kind: "DaemonSet",
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        template: &["template"],
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
    },
    KindSpec {
        kind: "StatefulSet",
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        template: &["template"],
        write: WriteMethod::StrategicPatch,
        records_in_metadata: false,
    },
    KindSpec {
        kind: "CronJob",
        group: "batch",
        version: "v1",
        plural: "cronjobs",
        template: &["jobTemplate", "spec", "template"],
        write: WriteMethod::CreateJob,
        records_in_metadata: true,
    },
    KindSpec {
        kind: "Job",
        group: "batch",
        version: "v1",
        plural: "jobs",
        template: &["template"],
        write: WriteMethod::Recreate,
        records_in_metadata: false,
    },
    KindSpec {
        kind: "Rollout",
        group: "argoproj.io",
        version: "v1alpha1",
        plural: "rollouts",
        template: &["template"],
        write: WriteMethod::MergePatch,
        records_in_metadata: false,
    },
    KindSpec {
        kind: "DeploymentConfig",
        group: "apps.openshift.io",
        version: "v1",
        plural: "deploymentconfigs",
        template: &["template"],
        write: WriteMethod::MergePatch,
        records_in_metadata: false,
    },
];

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
        &TABLE[self as usize]
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

    /// The kind named by an `--ignored-workload-types` entry (`jobs`, `CronJob`, ...).
    pub fn from_type_name(name: &str) -> Option<WorkloadKind> {
        let singular = name.trim().to_ascii_lowercase();
        let singular = singular.strip_suffix('s').unwrap_or(&singular);
        WorkloadKind::ALL.into_iter().find(|k| k.kind().eq_ignore_ascii_case(singular))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_enum_order() {
        for kind in WorkloadKind::ALL {
            assert_eq!(kind.spec().kind, format!("{kind:?}"), "row {} is out of order", kind as usize);
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
