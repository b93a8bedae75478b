//! Kubernetes name rules, for names that come from people (flags, admin URLs): a name that
//! breaks them is refused where it enters, never sent to the API server or used as a key.

/// Longest DNS-1123 subdomain (a ConfigMap, Secret or Deployment name).
const SUBDOMAIN_MAX: usize = 253;
/// Longest DNS-1123 label (a namespace name).
const LABEL_MAX: usize = 63;

/// A DNS-1123 label, as a namespace name must be: lowercase letters, digits and `-`, at most
/// 63, starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= LABEL_MAX
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric)
        && name.chars().all(|c| alphanumeric(c) || c == '-')
}

/// A DNS-1123 subdomain, as an object's name must be: dot-separated labels, at most 253.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= SUBDOMAIN_MAX && name.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns_1123() {
        assert!(is_dns_label("team-a") && is_dns_label("a") && is_dns_label(&"a".repeat(63)));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64), "../x", "a%2f"] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        assert!(is_dns_subdomain("my.app.config") && is_dns_subdomain("web"));
        for bad in ["", ".", "a..b", "a.", &"a.".repeat(127), "a/b", "Web"] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }
}
