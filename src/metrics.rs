//! Registering Prometheus series: one call a series, for every room's metrics.

use prometheus::core::Collector;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

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

/// A counter named `name`, registered.
///
/// # Errors
/// See [`registered`].
pub fn int_counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    registered(registry, IntCounter::new(name, help))
}

/// A counter with `labels`, registered.
///
/// # Errors
/// See [`registered`].
pub fn int_counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A gauge, registered.
///
/// # Errors
/// See [`registered`].
pub fn int_gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    registered(registry, IntGauge::new(name, help))
}

/// A gauge with `labels`, registered.
///
/// # Errors
/// See [`registered`].
pub fn int_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    registered(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// A gauge of fractions with `labels`, registered.
///
/// # Errors
/// See [`registered`].
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, prometheus::Error> {
    registered(registry, GaugeVec::new(Opts::new(name, help), labels))
}

/// A histogram with `buckets`, registered.
///
/// # Errors
/// See [`registered`].
pub fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<Histogram, prometheus::Error> {
    registered(registry, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)))
}

/// A histogram with `labels` and `buckets`, registered.
///
/// # Errors
/// See [`registered`].
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> Result<HistogramVec, prometheus::Error> {
    registered(registry, HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_registered_once_and_a_bad_name_is_an_error() {
        let registry = Registry::new();
        int_counter(&registry, "a_total", "help").expect("registered").inc();
        let waits = histogram_vec(&registry, "b_seconds", "help", &["kind"], vec![0.1, 1.0]).expect("registered");
        waits.with_label_values(&["x"]).observe(0.5);
        assert_eq!(registry.gather().len(), 2);
        assert!(int_counter(&registry, "a_total", "help").is_err(), "twice");
        assert!(int_counter(&registry, "a-b", "help").is_err(), "a bad name");
        assert!(int_counter_vec(&registry, "c_total", "help", &["a-b"]).is_err(), "a bad label");
    }
}
