//! Registering Prometheus series: one expression a series, for every room's metrics.

use prometheus::Registry;
use prometheus::core::Collector;

/// `metric`, registered in `registry`. prometheus' `register_*_with_registry!` macros do the
/// same but unwrap the construction's error; here a bad name or label is an error like a name
/// registered twice.
///
/// # Errors
/// The construction's error, or the registry's (a series of that name is already registered).
pub fn registered<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<M, prometheus::Error>,
) -> Result<M, prometheus::Error> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_registered_once_and_a_bad_name_is_an_error() {
        let registry = Registry::new();
        let counter = registered(&registry, prometheus::IntCounter::new("a_total", "help")).expect("registered");
        counter.inc();
        assert_eq!(registry.gather().len(), 1);
        assert!(registered(&registry, prometheus::IntCounter::new("a_total", "help")).is_err(), "twice");
        assert!(registered(&registry, prometheus::IntCounter::new("a-b", "help")).is_err(), "a bad name");
    }
}
