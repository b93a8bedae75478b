//! Kubernetes label selectors in their string form, plus Reloader's legacy spellings.
//!
//! Grammar (as `kubectl -l`): requirements joined by `,` (AND), each one of `key`, `!key`,
//! `key=value`, `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`. Reloader v1 also
//! accepts `key:value` for `key=value`, and `key:*` / `key=*` for "key exists".

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed label selector. Displays in the canonical form the API server accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSelector(Selector);

/// Why a selector string was rejected; the message names the bad requirement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector requirement {requirement:?}: {reason}")]
pub struct ParseError {
    pub requirement: String,
    pub reason: String,
}

impl LabelSelector {
    /// Whether a set of labels satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.matches(labels)
    }

    /// Parse several selector strings (a repeated flag) as one selector: all must hold.
    ///
    /// # Errors
    /// The first requirement that does not parse.
    pub fn parse_all<S: AsRef<str>>(parts: &[S]) -> Result<Option<LabelSelector>, ParseError> {
        let joined: Vec<&str> = parts.iter().map(|p| p.as_ref().trim()).filter(|p| !p.is_empty()).collect();
        if joined.is_empty() {
            return Ok(None);
        }
        joined.join(",").parse().map(Some)
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for LabelSelector {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, ParseError> {
        // Reloader's chart renders the value quoted (`--namespace-selector="a=b"`).
        let text = text.trim().trim_matches('"');
        let mut expressions = Vec::new();
        for requirement in split_top_level(text) {
            let requirement = requirement.trim();
            if requirement.is_empty() {
                continue;
            }
            expressions.push(parse_requirement(requirement)?);
        }
        Ok(LabelSelector(Selector::from_iter(expressions)))
    }
}

/// Split on commas that are not inside `( )`.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(requirement: &str) -> Result<Expression, ParseError> {
    let fail = |reason: &str| ParseError { requirement: requirement.to_string(), reason: reason.to_string() };

    if let Some(key) = requirement.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(valid_key(key.trim()).map_err(|r| fail(&r))?));
    }
    for (op, negated) in [("!=", true), ("==", false), ("=", false), (":", false)] {
        if let Some((key, value)) = requirement.split_once(op) {
            let key = valid_key(key.trim()).map_err(|r| fail(&r))?;
            let value = value.trim();
            if !negated && value == "*" {
                return Ok(Expression::Exists(key));
            }
            let value = valid_value(value).map_err(|r| fail(&r))?;
            return Ok(if negated { Expression::NotEqual(key, value) } else { Expression::Equal(key, value) });
        }
    }
    let words: Vec<&str> = requirement.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let key = valid_key(words[0]).map_err(|r| fail(&r))?;
        let rest = words[1].trim_start();
        for (op, negated) in [("notin", true), ("in", false)] {
            if let Some(set) = rest.strip_prefix(op) {
                let set = set.trim();
                let inner = set
                    .strip_prefix('(')
                    .and_then(|s| s.strip_suffix(')'))
                    .ok_or_else(|| fail("expected a parenthesised list of values after in/notin"))?;
                let values =
                    inner.split(',').map(|v| valid_value(v.trim())).collect::<Result<_, _>>().map_err(|r| fail(&r))?;
                return Ok(if negated { Expression::NotIn(key, values) } else { Expression::In(key, values) });
            }
        }
        return Err(fail("expected =, ==, !=, in or notin after the key"));
    }
    Ok(Expression::Exists(valid_key(requirement).map_err(|r| fail(&r))?))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn valid_key(key: &str) -> Result<String, String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty()
            || prefix.len() > 253
            || !prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return Err(format!("key prefix {prefix:?} is not a DNS subdomain"));
    }
    if name.is_empty() || name.len() > 63 || !is_label_text(name) {
        return Err(format!(
            "key {key:?} must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(key.to_string())
}

/// A label value: empty, or at most 63 characters shaped like a key name.
fn valid_value(value: &str) -> Result<String, String> {
    if value.is_empty() || (value.len() <= 63 && is_label_text(value)) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "value {value:?} must be at most 63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

fn is_label_text(text: &str) -> bool {
    let edge = |c: char| c.is_ascii_alphanumeric();
    text.starts_with(edge)
        && text.ends_with(edge)
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn sel(text: &str) -> LabelSelector {
        text.parse().unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn equality_forms() {
        let l = labels(&[("team", "a"), ("env", "prod")]);
        assert!(sel("team=a").matches(&l));
        assert!(sel("team==a").matches(&l));
        assert!(!sel("team!=a").matches(&l));
        assert!(sel("team=a,env=prod").matches(&l));
        assert!(!sel("team=a,env=dev").matches(&l));
    }

    #[test]
    fn set_forms_keep_commas_inside_parentheses() {
        let l = labels(&[("env", "prod")]);
        assert!(sel("env in (dev, prod)").matches(&l));
        assert!(!sel("env notin (dev,prod)").matches(&l));
        assert!(sel("env notin (dev),team notin (x)").matches(&l));
    }

    #[test]
    fn existence_forms() {
        let l = labels(&[("team", "a")]);
        assert!(sel("team").matches(&l));
        assert!(!sel("!team").matches(&l));
        assert!(sel("!other").matches(&l));
    }

    #[test]
    fn reloader_legacy_spellings() {
        let l = labels(&[("team", "a")]);
        assert!(sel("team:a").matches(&l));
        assert!(!sel("team:b").matches(&l));
        assert!(sel("team:*").matches(&l));
        assert!(sel("team=*").matches(&l));
        assert!(!sel("other:*").matches(&l));
        assert!(sel("\"team=a\"").matches(&l), "the chart renders the value quoted");
    }

    #[test]
    fn repeated_flags_are_anded() {
        let s = LabelSelector::parse_all(&["team=a", "env in (prod)"]).expect("valid").expect("non-empty");
        assert!(s.matches(&labels(&[("team", "a"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("team", "a")])));
        assert_eq!(LabelSelector::parse_all::<&str>(&[]), Ok(None));
    }

    #[test]
    fn canonical_form_round_trips_for_the_api_server() {
        let s = sel("team==a, env notin (dev,qa), !legacy, tier");
        let again: LabelSelector = s.to_string().parse().expect("canonical form parses");
        assert_eq!(s, again);
    }

    #[test]
    fn bad_selectors_name_the_requirement() {
        for bad in ["team=a b", "env in dev", "=a", "env ~ x", "-bad=1"] {
            let err = bad.parse::<LabelSelector>().expect_err(bad);
            assert!(err.to_string().contains("invalid label selector"), "{err}");
        }
    }

    #[test]
    fn an_empty_value_selects_empty_labels() {
        assert!(sel("team=").matches(&labels(&[("team", "")])));
    }
}
