//! resourceVersions as the integers KEP-5504 makes them (stable in Kubernetes 1.35): they
//! grow with every write to one etcd, so two of them tell which state is newer. The Lease
//! task uses this to keep a watch event from undoing a newer write of its own; the watches use
//! it for the baseline of unselected namespaces. Callers fall back to their behaviour without
//! an order when one does not parse.

/// A resourceVersion as an integer: positive, no leading zero; `None` otherwise.
pub(crate) fn revision(resource_version: Option<&str>) -> Option<u64> {
    let rv = resource_version?;
    if rv.starts_with('0') {
        return None;
    }
    rv.parse().ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::revision;

    #[test]
    fn only_positive_integers_without_leading_zeros_are_revisions() {
        for rv in [None, Some(""), Some("0"), Some("012"), Some("-5"), Some("1e3"), Some("opaque")] {
            assert_eq!(revision(rv), None, "{rv:?}");
        }
        assert_eq!(revision(Some("7")), Some(7));
        assert_eq!(revision(Some("18446744073709551615")), Some(u64::MAX));
    }
}
