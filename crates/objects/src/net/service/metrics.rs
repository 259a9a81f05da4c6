//! The object service's metrics: counters and histograms with their labels.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DirectionLabel {
    pub(super) direction: &'static str,
}

#[derive(Debug)]
pub(super) struct ObjectMetrics {
    pub(super) reads: Family<OutcomeLabel, Counter>,
    pub(super) writes: Family<OutcomeLabel, Counter>,
    pub(super) read_seconds: Histogram,
    pub(super) write_seconds: Histogram,
    pub(super) repairs: Counter,
    pub(super) requests_per_read: Counter,
    pub(super) probe_requests: Counter,
    pub(super) probes_skipped: Counter,
    pub(super) stamp_requests: Counter,
    pub(super) stamp_request_keys: Counter,
    pub(super) refused_requests: Family<ReasonLabel, Counter>,
    pub(super) refused_answers: Family<ReasonLabel, Counter>,
    pub(super) entropy_rounds: Counter,
    pub(super) entropy_exchanges: Family<OutcomeLabel, Counter>,
    pub(super) entropy_repaired: Family<DirectionLabel, Counter>,
    pub(super) entropy_sent_bytes: Counter,
    pub(super) entropy_received_bytes: Counter,
    pub(super) entropy_errors: Family<ReasonLabel, Counter>,
    pub(super) entropy_scan_seconds: Histogram,
}

impl Default for ObjectMetrics {
    fn default() -> Self {
        // 0.1 ms to about 3.3 s: a loopback read to one past the default deadline; a scan of the
        // store's headers for anti-entropy too.
        let buckets = || Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        Self {
            reads: Family::default(),
            writes: Family::default(),
            read_seconds: buckets(),
            write_seconds: buckets(),
            repairs: Counter::default(),
            requests_per_read: Counter::default(),
            probe_requests: Counter::default(),
            probes_skipped: Counter::default(),
            stamp_requests: Counter::default(),
            stamp_request_keys: Counter::default(),
            refused_requests: Family::default(),
            refused_answers: Family::default(),
            entropy_rounds: Counter::default(),
            entropy_exchanges: Family::default(),
            entropy_repaired: Family::default(),
            entropy_sent_bytes: Counter::default(),
            entropy_received_bytes: Counter::default(),
            entropy_errors: Family::default(),
            entropy_scan_seconds: buckets(),
        }
    }
}
