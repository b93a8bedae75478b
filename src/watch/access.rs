//! What this ServiceAccount may watch: a kind it may not list and watch is left out with a
//! warning, not watched into an unready controller (a forbidden watch never lists, so the
//! whole controller would stay unready and reload nothing, without saying why).
//!
//! ```text
//!  cluster-wide:    SelfSubjectAccessReview (list, watch) per kind, in every namespace
//!  --namespaces:    SelfSubjectRulesReview per namespace (one call each), read here
//!  denied  ─▶ not watched; a warning in the log and on /readyz; reloader_watch_kinds_forbidden{kind} = 1
//!  unknown ─▶ (the review failed: a 500, a timeout) not watched yet, said so
//!  both    ─▶ asked again with backoff, and watched once allowed (a later grant is noticed
//!             without a restart)
//! ```
//! A rules review the server marks incomplete counts as allowed: the watch then says what is
//! wrong, as before.

use futures::{StreamExt, stream};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SelfSubjectRulesReview,
    SelfSubjectRulesReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::warn;

/// Reviews sent at once.
const CONCURRENT_REVIEWS: usize = 16;
/// How long one review may take before it counts as failed (and is asked again later).
const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The verbs a watch needs.
const WATCH_VERBS: [&str; 2] = ["list", "watch"];

/// A collection to watch, as the access check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collection {
    /// What people call it in messages and the metric label (`CronJob`, `Secret`).
    pub kind: &'static str,
    pub group: &'static str,
    pub plural: &'static str,
}

/// What an access review answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Review {
    Allowed,
    Denied,
    /// The review itself failed (its error): nothing is known, and asking again may help.
    Unknown(String),
}

/// A collection this ServiceAccount may not list and watch, and where; or one whose review
/// could not be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forbidden {
    pub collection: Collection,
    /// The namespaces refused; empty: cluster-wide.
    pub namespaces: Vec<String>,
    /// `Some`: not denied, but the review failed with this error.
    pub unknown: Option<String>,
}

impl Forbidden {
    /// The warning for the log and `/readyz`.
    pub fn message(&self) -> String {
        let Collection { kind, group, plural } = &self.collection;
        let group = if group.is_empty() { "core" } else { group };
        if let Some(error) = &self.unknown {
            return format!(
                "whether this ServiceAccount may list and watch {plural} ({group}) could not be checked ({error}): \
                 {kind}s are not watched yet; asked again with backoff"
            );
        }
        let place = if self.namespaces.is_empty() {
            "in every namespace".to_string()
        } else {
            let shown: Vec<&str> = self.namespaces.iter().take(5).map(String::as_str).collect();
            let more = self.namespaces.len().saturating_sub(shown.len());
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("in namespace(s) {}{more}", shown.join(", "))
        };
        format!(
            "this ServiceAccount may not list and watch {plural} ({group}) {place}: {kind}s are not watched and \
             their reloads are off; grant list and watch on {plural} to turn them on"
        )
    }
}

/// The collections of `wanted` this client may not list and watch, cluster-wide or, with
/// `namespaces`, in any of them.
pub async fn forbidden(client: &Client, wanted: &[Collection], namespaces: Option<&[String]>) -> Vec<Forbidden> {
    match namespaces {
        None => {
            // Owned, so that the checks can run in a spawned task.
            let checks = wanted.iter().cloned().map(|c| async move {
                let mut unknown = None;
                for verb in WATCH_VERBS {
                    match review(client, (c.group, c.plural), verb, None, None).await {
                        Review::Allowed => {}
                        Review::Denied => {
                            return Some(Forbidden { collection: c.clone(), namespaces: Vec::new(), unknown: None });
                        }
                        Review::Unknown(error) => unknown = Some(error),
                    }
                }
                unknown.map(|error| Forbidden { collection: c.clone(), namespaces: Vec::new(), unknown: Some(error) })
            });
            let found: Vec<Option<Forbidden>> = stream::iter(checks).buffered(CONCURRENT_REVIEWS).collect().await;
            found.into_iter().flatten().collect()
        }
        Some(namespaces) => {
            let reviews = namespaces.iter().cloned().map(|ns| async move {
                let answer = rules(client, &ns).await;
                (ns, answer)
            });
            let answers: Vec<(String, RulesAnswer)> =
                stream::iter(reviews).buffered(CONCURRENT_REVIEWS).collect().await;
            let failed = answers.iter().find_map(|(_, a)| a.as_ref().err().cloned());
            wanted
                .iter()
                .filter_map(|c| {
                    let refused: Vec<String> = answers
                        .iter()
                        .filter(|(_, rules)| {
                            rules
                                .as_ref()
                                .ok()
                                .and_then(Option::as_ref)
                                .is_some_and(|r| !WATCH_VERBS.iter().all(|v| grants(r, c.group, c.plural, v)))
                        })
                        .map(|(ns, _)| ns.clone())
                        .collect();
                    if !refused.is_empty() {
                        return Some(Forbidden { collection: c.clone(), namespaces: refused, unknown: None });
                    }
                    // A namespace whose review failed: unknown for every collection.
                    let unknown: Vec<String> =
                        answers.iter().filter(|(_, a)| a.is_err()).map(|(ns, _)| ns.clone()).collect();
                    (!unknown.is_empty()).then(|| Forbidden {
                        collection: c.clone(),
                        namespaces: unknown,
                        unknown: failed.clone(),
                    })
                })
                .collect()
        }
    }
}

/// Whether this client may `verb` `plural` of `group` (in `namespace`, or everywhere; the object
/// `name`, or every object): a SelfSubjectAccessReview, which any authenticated user may
/// create.
pub async fn review(
    client: &Client,
    (group, plural): (&str, &str),
    verb: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Review {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(plural.to_string()),
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                name: name.map(str::to_string),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    match within_timeout(api.create(&PostParams::default(), &review)).await {
        Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Review::Allowed,
        Ok(_) => Review::Denied,
        Err(err) => {
            warn!(group, resource = plural, verb, error = %err, "an access review failed; asking again later");
            Review::Unknown(err)
        }
    }
}

/// A rules review's answer: the rules (`None`: incomplete), or the review's error.
type RulesAnswer = Result<Option<Vec<ResourceRule>>, String>;

/// The resource rules that apply to this client in `namespace`; `None` when the server marks its
/// answer incomplete; the error when the review failed.
async fn rules(client: &Client, namespace: &str) -> RulesAnswer {
    let api: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec { namespace: Some(namespace.to_string()) },
        ..SelfSubjectRulesReview::default()
    };
    match within_timeout(api.create(&PostParams::default(), &review)).await {
        Ok(answer) => Ok(answer.status.filter(|s| !s.incomplete).map(|s| s.resource_rules)),
        Err(err) => {
            warn!(namespace, error = %err, "a rules review failed; asking again later");
            Err(err)
        }
    }
}

async fn within_timeout<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, String> {
    match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
        Ok(answer) => answer.map_err(|err| err.to_string()),
        Err(_) => Err(format!("no answer within {REVIEW_TIMEOUT:?}")),
    }
}

/// Whether `rules` let `verb` act on every object of `plural` in `group` (a rule limited to
/// named objects does not: a list or watch needs them all).
fn grants(rules: &[ResourceRule], group: &str, plural: &str, verb: &str) -> bool {
    let has = |list: &Option<Vec<String>>, want: &str| list.iter().flatten().any(|v| v == "*" || v == want);
    rules.iter().any(|rule| {
        rule.verbs.iter().any(|v| v == "*" || v == verb)
            && has(&rule.api_groups, group)
            && has(&rule.resources, plural)
            && rule.resource_names.as_ref().is_none_or(Vec::is_empty)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> ResourceRule {
        let list = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
        ResourceRule {
            api_groups: list(groups),
            resources: list(resources),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: if names.is_empty() { None } else { list(names) },
        }
    }

    #[test]
    fn rules_grant_by_group_resource_and_verb_with_wildcards() {
        let rules = [rule(&["batch"], &["jobs"], &["list", "watch"], &[]), rule(&[""], &["*"], &["get"], &[])];
        assert!(grants(&rules, "batch", "jobs", "watch"));
        assert!(!grants(&rules, "batch", "cronjobs", "watch"));
        assert!(grants(&rules, "", "secrets", "get"));
        assert!(!grants(&rules, "", "secrets", "list"));
        assert!(grants(&[rule(&["*"], &["*"], &["*"], &[])], "apps", "deployments", "list"));
        let named = [rule(&[""], &["configmaps"], &["list", "watch"], &["only-this"])];
        assert!(!grants(&named, "", "configmaps", "list"), "a named rule cannot list everything");
    }

    #[test]
    fn the_warning_says_what_is_off_and_what_to_grant() {
        let cronjobs = Collection { kind: "CronJob", group: "batch", plural: "cronjobs" };
        let everywhere = Forbidden { collection: cronjobs.clone(), namespaces: vec![], unknown: None }.message();
        assert!(everywhere.contains("cronjobs (batch) in every namespace"), "{everywhere}");
        assert!(everywhere.contains("grant list and watch on cronjobs"), "{everywhere}");
        let many = (0..8).map(|i| format!("ns-{i}")).collect();
        let some = Forbidden { collection: cronjobs.clone(), namespaces: many, unknown: None }.message();
        assert!(some.contains("ns-0, ns-1, ns-2, ns-3, ns-4 and 3 more"), "{some}");
        let failed = Forbidden { collection: cronjobs, namespaces: vec![], unknown: Some("503".into()) }.message();
        assert!(failed.contains("could not be checked (503)") && failed.contains("asked again"), "{failed}");
    }
}
