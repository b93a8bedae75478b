//! Reloader's annotation keys, each overridable by the flag Reloader offers for it.

/// Every annotation key the engine reads or writes. Defaults are Reloader's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub auto: String,
    pub configmap_auto: String,
    pub secret_auto: String,
    pub secret_provider_class_auto: String,
    pub configmap_reload: String,
    pub secret_reload: String,
    pub secret_provider_class_reload: String,
    pub configmap_exclude: String,
    pub secret_exclude: String,
    pub secret_provider_class_exclude: String,
    pub search: String,
    pub search_match: String,
    pub ignore: String,
    pub pause_period: String,
    pub paused_at: String,
}

/// The keys that apply to one resource kind.
#[derive(Clone, Copy, Debug)]
pub struct TypedKeys<'a> {
    pub explicit: &'a str,
    pub auto: &'a str,
    pub exclude: &'a str,
}

/// Written by the annotations strategy on the pod template; fixed in Reloader (no flag).
pub const LAST_RELOADED_FROM: &str = "reloader.stakater.com/last-reloaded-from";

/// On an Argo Rollout's metadata: `restart` restarts it (`spec.restartAt`) instead of a plain
/// template rollout. Fixed in Reloader (no flag).
pub const ROLLOUT_STRATEGY: &str = "reloader.stakater.com/rollout-strategy";

/// On a CronJob's metadata: `patch` writes a reload into the CronJob's job template, so that its
/// next scheduled Job runs with the new data, instead of creating a Job at once (Reloader's way,
/// kept when the annotation is absent or says anything else). Reloader PR #1100, issue #822.
pub const CRONJOB_RELOAD_STRATEGY: &str = "reloader.stakater.com/cronjob-reload-strategy";

/// Written on workload metadata next to every reload: the hash acted on per resource, so that
/// replaying a change is a no-op in the annotations strategy too (its pod-template annotation
/// only remembers the latest resource). Metadata, not the template: writing it rolls nothing.
pub const RELOADED_HASHES: &str = "reloader-fleet.stakater.com/reloaded-hashes";

/// On a workload's metadata: its own coalesce window (a Go duration; `0` turns coalescing off
/// for it), over `--coalesce-window`. This project's key; Reloader has none.
pub const COALESCE_WINDOW: &str = "reloader-fleet.stakater.com/coalesce-window";

impl Default for Keys {
    fn default() -> Self {
        Keys {
            auto: "reloader.stakater.com/auto".into(),
            configmap_auto: "configmap.reloader.stakater.com/auto".into(),
            secret_auto: "secret.reloader.stakater.com/auto".into(),
            secret_provider_class_auto: "secretproviderclass.reloader.stakater.com/auto".into(),
            configmap_reload: "configmap.reloader.stakater.com/reload".into(),
            secret_reload: "secret.reloader.stakater.com/reload".into(),
            secret_provider_class_reload: "secretproviderclass.reloader.stakater.com/reload".into(),
            configmap_exclude: "configmaps.exclude.reloader.stakater.com/reload".into(),
            secret_exclude: "secrets.exclude.reloader.stakater.com/reload".into(),
            secret_provider_class_exclude: "secretproviderclasses.exclude.reloader.stakater.com/reload".into(),
            search: "reloader.stakater.com/search".into(),
            search_match: "reloader.stakater.com/match".into(),
            ignore: "reloader.stakater.com/ignore".into(),
            pause_period: "deployment.reloader.stakater.com/pause-period".into(),
            paused_at: "deployment.reloader.stakater.com/paused-at".into(),
        }
    }
}

impl Keys {
    pub fn for_kind(&self, kind: crate::watch::ResourceKind) -> TypedKeys<'_> {
        use crate::watch::ResourceKind::*;
        match kind {
            ConfigMap => TypedKeys {
                explicit: &self.configmap_reload,
                auto: &self.configmap_auto,
                exclude: &self.configmap_exclude,
            },
            Secret => {
                TypedKeys { explicit: &self.secret_reload, auto: &self.secret_auto, exclude: &self.secret_exclude }
            }
            SecretProviderClass => TypedKeys {
                explicit: &self.secret_provider_class_reload,
                auto: &self.secret_provider_class_auto,
                exclude: &self.secret_provider_class_exclude,
            },
        }
    }

    /// Whether `workload` names resources of `kind` by annotation (a reload list, `search`):
    /// then every change of their data counts, also for a workload reading only some keys.
    pub fn names_resources(&self, kind: crate::watch::ResourceKind, workload: &crate::watch::Workload) -> bool {
        [self.for_kind(kind).explicit, &self.search]
            .iter()
            .any(|k| workload.annotations.contains_key(k) || workload.template.annotations.contains_key(k))
    }

    /// Whether `workload` names resources of any kind by annotation: then no variable it
    /// records is known to be orphaned (a name in a list, or a pattern, needs no reference).
    pub fn names_any_resource(&self, workload: &crate::watch::Workload) -> bool {
        use crate::watch::ResourceKind;
        [ResourceKind::ConfigMap, ResourceKind::Secret, ResourceKind::SecretProviderClass]
            .into_iter()
            .any(|kind| self.names_resources(kind, workload))
    }

    /// Workload annotation keys the stores keep; every other annotation is dropped on arrival.
    pub fn workload_keys(&self) -> Vec<String> {
        let mut keys = self.reloading_keys();
        keys.extend([
            self.configmap_exclude.clone(),
            self.secret_exclude.clone(),
            self.secret_provider_class_exclude.clone(),
            self.pause_period.clone(),
            self.paused_at.clone(),
            LAST_RELOADED_FROM.to_string(),
            RELOADED_HASHES.to_string(),
            ROLLOUT_STRATEGY.to_string(),
            CRONJOB_RELOAD_STRATEGY.to_string(),
            COALESCE_WINDOW.to_string(),
            crate::watch::used_keys::ANNOTATION.to_string(),
        ]);
        keys
    }

    /// The workload annotation keys that can make a workload reload.
    fn reloading_keys(&self) -> Vec<String> {
        vec![
            self.auto.clone(),
            self.configmap_auto.clone(),
            self.secret_auto.clone(),
            self.secret_provider_class_auto.clone(),
            self.configmap_reload.clone(),
            self.secret_reload.clone(),
            self.secret_provider_class_reload.clone(),
            self.search.clone(),
        ]
    }

    /// The annotations the watches keep, and which of them can make a workload reload.
    pub fn annotation_keys(&self) -> crate::watch::AnnotationKeys {
        crate::watch::AnnotationKeys {
            workload: self.workload_keys(),
            reloading: self.reloading_keys(),
            ignore: self.ignore.clone(),
            search_match: self.search_match.clone(),
        }
    }

    /// Keys whose presence puts a workload in its namespace's "explicit list" index: such
    /// workloads are candidates for every change of that kind, referenced or not.
    pub fn explicit_keys(&self) -> Vec<String> {
        vec![self.configmap_reload.clone(), self.secret_reload.clone(), self.secret_provider_class_reload.clone()]
    }
}
