//! Reloader's `pause-period` for Deployments: pause the rollout right after a reload, so that
//! further changes within the period accumulate into one rollout, then resume.
//!
//! Restart-safe: the pause is recorded on the Deployment (`spec.paused` plus the `paused-at`
//! annotation, in the same patch as the reload), and resuming is decided from the store by a
//! sweep, so a restart or another replica resumes on time. Only pauses this controller made
//! (both annotations present) are ever resumed.

use jiff::{Timestamp, Unit};
use serde_json::{Value, json};

use crate::reload::duration::{PAUSE_PERIOD_MAX, parse_go_duration};
use crate::reload::{Keys, Problem};
use crate::watch::{Workload, WorkloadKind};

/// What to add to a reload patch to start a pause, `Ok(None)` when no pause applies, or the
/// problem with the annotation (the reload then goes ahead unpaused).
pub fn pause_patch(keys: &Keys, workload: &Workload, now: Timestamp) -> Result<Option<Value>, Problem> {
    if workload.key.kind != WorkloadKind::Deployment {
        return Ok(None);
    }
    let Some(period) = workload.annotations.get(&keys.pause_period) else { return Ok(None) };
    parse_go_duration(period, PAUSE_PERIOD_MAX)
        .map_err(|err| Problem::new(&keys.pause_period, period, err.to_string()))?;
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
    // An unreadable record (or a period past the ceiling) must not leave the Deployment paused
    // forever: resume at once.
    let due = match (paused_at.parse::<Timestamp>(), period.map(|p| parse_go_duration(p, PAUSE_PERIOD_MAX))) {
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

/// Merge the patch `extra` into the patch `patch`, so that one write does what both would:
/// objects merge key by key, lists of named items (containers, env) by name (an item of
/// `extra` merges into the same-named one, and a `$patch: delete` directive on either side
/// replaces it: a directive is kept, never applied), anything else is replaced.
pub fn merge_patch(patch: &mut Value, extra: Value) {
    let named = |items: &[Value]| items.iter().all(|i| i.get("name").is_some());
    let directive = |item: &Value| item.get("$patch").is_some();
    match (patch, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                merge_patch(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (Value::Array(list), Value::Array(items)) if named(list) && named(&items) => {
            for item in items {
                match list.iter().position(|e| e.get("name") == item.get("name")) {
                    Some(i) if directive(&item) || directive(&list[i]) => list[i] = item,
                    Some(i) => merge_patch(&mut list[i], item),
                    None => list.push(item),
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::Annotations;

    fn deployment(annotations: &[(&str, &str)], paused: bool) -> Workload {
        Workload {
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Annotations>(),
            paused,
            ..Workload::test(WorkloadKind::Deployment, "ns", "web")
        }
    }

    const PERIOD: &str = "deployment.reloader.stakater.com/pause-period";
    const AT: &str = "deployment.reloader.stakater.com/paused-at";

    fn now() -> Timestamp {
        "2026-11-29T10:00:00Z".parse().expect("valid timestamp")
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
    fn a_period_of_years_is_a_problem_and_its_pause_ends_at_once() {
        // Regression: `Duration::from_secs_f64` panicked on this, at every start, in the engine.
        let keys = Keys::default();
        let years = "99999999999999999999999h";
        let problem = pause_patch(&keys, &deployment(&[(PERIOD, years)], false), now()).expect_err("refused");
        assert!(problem.reason.contains("longer than"), "{problem:?}");
        let paused = deployment(&[(PERIOD, years), (AT, "2026-11-29T09:59:59Z")], true);
        assert!(resume_patch(&keys, &paused, now()).is_some(), "an unusable period must not pause forever");
        let too_long = deployment(&[(PERIOD, "25h"), (AT, "2026-11-29T09:59:59Z")], true);
        assert!(resume_patch(&keys, &too_long, now()).is_some());
    }

    #[test]
    fn merging_keeps_both_patches() {
        let mut patch = json!({ "spec": { "template": { "x": 1 } } });
        merge_patch(&mut patch, json!({ "spec": { "paused": true }, "metadata": { "a": 1 } }));
        assert_eq!(patch, json!({ "spec": { "template": { "x": 1 }, "paused": true }, "metadata": { "a": 1 } }));
    }
}
