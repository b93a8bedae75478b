//! Which namespaces this controller serves at all: `--namespaces`, `--namespaces-to-ignore`
//! and `--namespace-selector`, in that order.

use std::collections::{BTreeMap, BTreeSet};

use crate::shard::LabelSelector;

/// The namespace filter. Pure: the caller supplies the namespace's labels.
#[derive(Clone, Debug, Default)]
pub struct NamespaceFilter {
    /// `--namespaces` (or `KUBERNETES_NAMESPACE`): when set, only these namespaces.
    pub only: Option<BTreeSet<String>>,
    /// `--namespaces-to-ignore`: exact names never served.
    pub ignored: BTreeSet<String>,
    /// `--namespace-selector`: labels a namespace must carry.
    pub selector: Option<LabelSelector>,
}

/// The answer for one namespace, with the reason, as the admin endpoint reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    Selected,
    NotInNamespaceList,
    Ignored,
    SelectorMismatch,
}

impl Selection {
    pub fn is_selected(self) -> bool {
        self == Selection::Selected
    }

    pub fn reason(self) -> &'static str {
        match self {
            Selection::Selected => "selected",
            Selection::NotInNamespaceList => "not in --namespaces",
            Selection::Ignored => "in --namespaces-to-ignore",
            Selection::SelectorMismatch => "labels do not match --namespace-selector",
        }
    }
}

impl NamespaceFilter {
    /// Whether labels matter: without a selector a namespace's name decides alone.
    pub fn needs_labels(&self) -> bool {
        self.selector.is_some()
    }

    pub fn select(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Selection {
        if let Some(only) = &self.only
            && !only.contains(namespace)
        {
            return Selection::NotInNamespaceList;
        }
        if self.ignored.contains(namespace) {
            return Selection::Ignored;
        }
        if let Some(selector) = &self.selector
            && !selector.matches(labels)
        {
            return Selection::SelectorMismatch;
        }
        Selection::Selected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn ignore_list_and_selector_and_explicit_list_each_exclude() {
        let filter = NamespaceFilter {
            only: Some(["a".to_string(), "b".to_string(), "c".to_string()].into()),
            ignored: ["b".to_string()].into(),
            selector: Some("team=x".parse().expect("valid selector")),
        };
        let team = labels(&[("team", "x")]);
        assert_eq!(filter.select("a", &team), Selection::Selected);
        assert_eq!(filter.select("b", &team), Selection::Ignored);
        assert_eq!(filter.select("c", &labels(&[])), Selection::SelectorMismatch);
        assert_eq!(filter.select("d", &team), Selection::NotInNamespaceList);
    }

    #[test]
    fn default_filter_selects_everything() {
        assert!(NamespaceFilter::default().select("anything", &labels(&[])).is_selected());
    }
}
