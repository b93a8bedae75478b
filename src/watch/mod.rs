//! Scoped watchers, compact stores and the index from a resource to the workloads using it.
//!
//! ConfigMaps and Secrets are kept as a [`DataHash`], never as their data: the hash is all
//! the engine needs, and it keeps memory flat however large the objects are.

pub mod access;
mod csi;
mod hash;
mod kind;
mod metrics;
mod object;
mod pod_wire;
mod resource_map;
mod server_shards;
mod snapshot;
mod store;
pub mod used_keys;
mod watcher;
mod wire;

pub use hash::{DataHash, HashForm, Hashes, WideHash};
pub use kind::{KindSpec, PodPlace, WorkloadKind, WriteMethod, custom as custom_kinds};
pub use metrics::Metrics;
pub use object::{
    Annotations, Cause, Change, Container, PodTemplate, Reference, ResourceKey, ResourceKind, ResourceState, Stored,
    Volume, Workload, WorkloadKey,
};
pub use resource_map::ResourceMap;
pub use server_shards::ServerShards;
pub use snapshot::{ListError, Snapshot};
pub use store::{Store, Writer};
pub use watcher::{Config, Error, Kinds, Links, run, streaming_lists_served};
pub use wire::{
    AnnotationKeys, Compactor, INTERNAL_LABEL, JOB_UID_LABELS, RAW_LIMIT, SlimConfigMap, SlimDaemonSet, SlimDeployment,
    SlimRaw, SlimSecret, SlimSecretProviderClass, SlimSpcPodStatus, SlimStatefulSet, SlimWorkload, looks_like_reloader,
};
