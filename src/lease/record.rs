//! What a fleet Lease records beyond client-go's LeaseLock: its labels and ring annotation,
//! and who holds it.

use k8s_openapi::api::coordination::v1::Lease;

/// Label on every Lease of a fleet; the value is the fleet's lease name prefix.
pub const FLEET_LABEL: &str = "reloader-fleet.stakater.com/fleet";
/// Label telling shard Leases (`shard`) from membership Leases (`member`).
pub const ROLE_LABEL: &str = "reloader-fleet.stakater.com/role";
/// Annotation on every Lease of a fleet: the writer's ring fingerprint.
pub const RING_ANNOTATION: &str = "reloader-fleet.stakater.com/ring";

/// Who holds a Lease; empty when nobody does.
pub(super) fn holder_of(lease: &Lease) -> &str {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).unwrap_or("")
}

/// Whether the Lease carries `role` (`shard` or `member`).
pub(super) fn is_role(lease: &Lease, role: &str) -> bool {
    lease.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL)).is_some_and(|r| r == role)
}
