//! Reloader's `pause-period` for Deployments: pause the rollout right after a reload, so that
//! further changes within the period accumulate into one rollout, then resume.
//!
//! Restart-safe: the pause is recorded on the Deployment (`spec.paused` plus the `paused-at`
//! annotation, in the same patch as the reload), and resuming is decided from the store by a
//! sweep, so a restart or another replica resumes on time. Only pauses this controller made
//! (both annotations present) are ever resumed.

use std::time::Duration;

use jiff::{Timestamp, Unit};
use serde_json::{Value, json};

use crate::reload::{Keys, Problem};
use crate::watch::{Workload, WorkloadKind};

/// A Go-style duration: whole numbers with units h, m, s, ms (e.g. `15s`, `1m30s`).
pub fn parse_go_duration(value: &str) -> Result<Duration, String> {
    let invalid = || format!("{value:?} is not a duration (examples: 15s, 500ms, 1m30s)");
    let mut total = Duration::ZERO;
    let mut rest = value.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    // Go accepts a bare zero, and only zero, without a unit.
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or_else(invalid)?;
        let number: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return Err(invalid()),
        };
        total += Duration::from_secs_f64(number * seconds);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// What to add to a reload patch to start a pause, `Ok(None)` when no pause applies, or the
/// problem with the annotation (the reload then goes ahead unpaused).
pub fn pause_patch(keys: &Keys, workload: &Workload, now: Timestamp) -> Result<Option<Value>, Problem> {
    if workload.key.kind != WorkloadKind::Deployment {
        return Ok(None);
    }
    let Some(period) = workload.annotations.get(&keys.pause_period) else { return Ok(None) };
    parse_go_duration(period).map_err(|reason| Problem {
        annotation: keys.pause_period.clone(),
        value: period.clone(),
        reason,
    })?;
    if workload.paused {
        // Already paused: by us (the pending resume stands) or by someone else (left alone).
        return Ok(None);
    }
    let at = now.round(Unit::Second).unwrap_or(now).to_string();
    Ok(Some(json!({ "spec": { "paused": true }, "metadata": { "annotations": { keys.paused_at.clone(): at } } })))
}

/// The patch that ends a pause this controller started, once its period is over.
pub fn resume_patch(keys: &Keys, workload: &Workload, now: Timestamp) -> Option<Value> {
    let paused_at = workload.annotations.get(&keys.paused_at)?;
    let period = workload.annotations.get(&keys.pause_period);
    // An unreadable record must not leave the Deployment paused forever: resume at once.
    let due = match (paused_at.parse::<Timestamp>(), period.map(|p| parse_go_duration(p))) {
        (Ok(at), Some(Ok(period))) => {
            let period = jiff::SignedDuration::try_from(period).unwrap_or(jiff::SignedDuration::ZERO);
            at.checked_add(period).unwrap_or(at)
        }
        _ => now,
    };
    (now >= due).then(
        || json!({ "spec": { "paused": false }, "metadata": { "annotations": { keys.paused_at.clone(): null } } }),
    )
}

/// Merge `extra` into `patch` (objects merged key by key, anything else replaced).
pub fn merge_patch(patch: &mut Value, extra: Value) {
    match (patch, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                merge_patch(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (slot, value) => *slot = value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{Annotations, PodTemplate, WorkloadKey};

    fn deployment(annotations: &[(&str, &str)], paused: bool) -> Workload {
        Workload {
            key: WorkloadKey { kind: WorkloadKind::Deployment, namespace: "ns".into(), name: "web".into() },
            uid: String::new(),
            resource_version: "1".into(),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Annotations>(),
            template: PodTemplate::default(),
            paused,
            generation: 1,
            rolled_out: true,
            raw: None,
        }
    }

    const PERIOD: &str = "deployment.reloader.stakater.com/pause-period";
    const AT: &str = "deployment.reloader.stakater.com/paused-at";

    fn now() -> Timestamp {
        "2026-11-29T10:00:00Z".parse().expect("valid timestamp")
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_go_duration("15").is_err());
        assert!(parse_go_duration("5 minutes").is_err());
        assert!(parse_go_duration("").is_err());
    }

    #[test]
    fn a_reload_pauses_an_unpaused_deployment_with_a_period() {
        let keys = Keys::default();
        let patch = pause_patch(&keys, &deployment(&[(PERIOD, "5m")], false), now()).expect("valid");
        assert_eq!(
            patch,
            Some(json!({ "spec": { "paused": true }, "metadata": { "annotations": { AT: "2026-11-29T10:00:00Z" } } }))
        );
        assert_eq!(pause_patch(&keys, &deployment(&[(PERIOD, "5m")], true), now()), Ok(None));
        assert_eq!(pause_patch(&keys, &deployment(&[], false), now()), Ok(None));
    }

    #[test]
    fn a_bad_period_is_a_problem_not_a_pause() {
        let problem = pause_patch(&Keys::default(), &deployment(&[(PERIOD, "soon")], false), now()).expect_err("bad");
        assert_eq!(problem.value, "soon");
    }

    #[test]
    fn resume_waits_for_the_period_and_only_for_our_pauses() {
        let keys = Keys::default();
        let ours = deployment(&[(PERIOD, "5m"), (AT, "2026-11-29T09:58:00Z")], true);
        assert_eq!(resume_patch(&keys, &ours, now()), None, "2 of 5 minutes passed");
        let later: Timestamp = "2026-11-29T10:03:00Z".parse().expect("valid");
        assert!(resume_patch(&keys, &ours, later).is_some());
        let someone_elses = deployment(&[(PERIOD, "5m")], true);
        assert_eq!(resume_patch(&keys, &someone_elses, later), None);
        let v1_local_time = deployment(&[(PERIOD, "1m"), (AT, "2026-11-29T11:58:00+02:00")], true);
        assert!(resume_patch(&keys, &v1_local_time, now()).is_some(), "offsets are honoured");
    }

    #[test]
    fn merging_keeps_both_patches() {
        let mut patch = json!({ "spec": { "template": { "x": 1 } } });
        merge_patch(&mut patch, json!({ "spec": { "paused": true }, "metadata": { "a": 1 } }));
        assert_eq!(patch, json!({ "spec": { "template": { "x": 1 }, "paused": true }, "metadata": { "a": 1 } }));
    }
}
