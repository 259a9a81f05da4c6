//! Count what the node does, where it happens, in a prometheus-client registry the node owns.
//!
//! Every counter is updated by the code path that causes it (no reporter task samples shared
//! state), so a scrape never races an update into a wrong value (the xx network's metrics race,
//! `docs/lessons.md`).
//!
//! Names follow Prometheus conventions: the unit last before `_total` (`meshwire_sent_bytes_total`,
//! registered with [`Unit::Bytes`] so OpenMetrics carries a `# UNIT` line), seconds for durations.
//! The registry is encoded as OpenMetrics 1.0 ([`Metrics::encode_text`]) or as Prometheus text
//! 0.0.4 ([`Metrics::encode_prometheus_text`]); the HTTP API picks one by the `Accept` header.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

use crate::udp::SocketBuffers;

use meshwire_proto::PeerId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Label naming why something happened.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason, a short snake_case word.
    pub reason: &'static str,
}

/// Label naming a peer (its short id).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    /// The first ten characters of the peer id.
    pub peer: String,
}

/// Label naming a request outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `ok`, `timeout`, `remote_error`, ...
    pub outcome: &'static str,
}

/// One peer's byte and drop counters (handles into the node's per-peer families).
#[derive(Debug, Clone)]
pub(crate) struct PeerCounters {
    sent: Counter,
    received: Counter,
    dropped: Counter,
}

/// The node's metrics. Handles are cheap to clone; all share the node's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub(crate) bytes_sent: Counter,
    pub(crate) bytes_received: Counter,
    pub(crate) frames_sent: Counter,
    pub(crate) frames_received: Counter,
    pub(crate) dropped: Family<ReasonLabel, Counter>,
    pub(crate) frame_errors: Family<ReasonLabel, Counter>,
    pub(crate) handshakes_refused: Counter,
    pub(crate) reconnects: Counter,
    pub(crate) path_estimates_ignored: Family<ReasonLabel, Counter>,
    pub(crate) connections: Gauge,
    pub(crate) requests: Family<OutcomeLabel, Counter>,
    pub(crate) request_seconds: Histogram,
    pub(crate) peer_rtt_seconds: Family<PeerLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) peer_bytes_sent: Family<PeerLabel, Counter>,
    pub(crate) peer_bytes_received: Family<PeerLabel, Counter>,
    pub(crate) peer_dropped: Family<PeerLabel, Counter>,
    /// Each peer's handles into the per-peer families, by peer id: a request or message then
    /// finds its peer's series with one map lookup, without formatting the peer's label and
    /// hashing it into four families each time (label formatting and hashing took about 2% of
    /// the samples in a profile of a 3-node quorum read). Holds exactly the peers whose series
    /// exist; [`Metrics::forget_peer`] removes both.
    peer_handles: RwLock<HashMap<PeerId, PeerHandles>>,
}

/// One peer's handles, cached by [`Metrics`].
#[derive(Debug, Clone)]
struct PeerHandles {
    counters: PeerCounters,
    rtt: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry under the `meshwire` prefix with every node metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("meshwire");
        let metrics = Self {
            registry: Mutex::new(Registry::default()),
            bytes_sent: Counter::default(),
            bytes_received: Counter::default(),
            frames_sent: Counter::default(),
            frames_received: Counter::default(),
            dropped: Family::default(),
            frame_errors: Family::default(),
            handshakes_refused: Counter::default(),
            reconnects: Counter::default(),
            path_estimates_ignored: Family::default(),
            connections: Gauge::default(),
            requests: Family::default(),
            request_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            peer_rtt_seconds: Family::default(),
            peer_bytes_sent: Family::default(),
            peer_bytes_received: Family::default(),
            peer_dropped: Family::default(),
            peer_handles: RwLock::new(HashMap::new()),
        };
        registry.register_with_unit(
            "sent",
            "Frame bytes written to peers",
            Unit::Bytes,
            metrics.bytes_sent.clone(),
        );
        registry.register_with_unit(
            "received",
            "Frame bytes read from peers",
            Unit::Bytes,
            metrics.bytes_received.clone(),
        );
        registry.register(
            "frames_sent",
            "Frames written to peers",
            metrics.frames_sent.clone(),
        );
        registry.register(
            "frames_received",
            "Frames read from peers",
            metrics.frames_received.clone(),
        );
        registry.register(
            "dropped",
            "Messages not delivered, by reason",
            metrics.dropped.clone(),
        );
        registry.register(
            "frame_errors",
            "Malformed frames from peers (each closes the connection) and streams reset or stopped for arriving too slowly (request_timeout, stream_timeout), by reason",
            metrics.frame_errors.clone(),
        );
        registry.register(
            "handshakes_refused",
            "Dialing peers refused during the TLS handshake",
            metrics.handshakes_refused.clone(),
        );
        registry.register(
            "reconnects",
            "Connections re-established to configured peers",
            metrics.reconnects.clone(),
        );
        registry.register(
            "path_estimates_ignored",
            "Remembered path estimates not used for careful resume because no real path gives them, by reason",
            metrics.path_estimates_ignored.clone(),
        );
        registry.register(
            "connections",
            "Open peer connections",
            metrics.connections.clone(),
        );
        registry.register(
            "requests",
            "Requests made, by outcome",
            metrics.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Whole-exchange latency of successful requests",
            metrics.request_seconds.clone(),
        );
        registry.register(
            "peer_rtt_seconds",
            "Smoothed round-trip time per peer, from QUIC path statistics",
            metrics.peer_rtt_seconds.clone(),
        );
        registry.register_with_unit(
            "peer_sent",
            "Frame bytes written to each peer (the same writes as meshwire_sent_bytes_total)",
            Unit::Bytes,
            metrics.peer_bytes_sent.clone(),
        );
        registry.register_with_unit(
            "peer_received",
            "Frame bytes read from each peer (the same reads as meshwire_received_bytes_total)",
            Unit::Bytes,
            metrics.peer_bytes_received.clone(),
        );
        registry.register(
            "peer_dropped",
            "Messages for each peer not delivered (counted in meshwire_dropped_total by reason too)",
            metrics.peer_dropped.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|e| e.into_inner()) = registry;
        metrics
    }

    /// Runs `register` on the registry, so services can add their own metrics.
    pub fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The registry in the OpenMetrics 1.0 text format (ends with `# EOF`).
    pub fn encode_text(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// The registry in the Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), for
    /// scrapers and tools that do not speak OpenMetrics.
    pub fn encode_prometheus_text(&self) -> String {
        openmetrics_to_prometheus(&self.encode_text())
    }

    pub(crate) fn drop_message(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(crate) fn frame_error(&self, reason: &'static str) {
        self.frame_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(crate) fn request_outcome(&self, outcome: &'static str) {
        self.requests.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    pub(crate) fn observe_rtt(&self, peer: &PeerId, rtt: std::time::Duration) {
        self.peer_handles(peer).rtt.set(rtt.as_secs_f64());
    }

    /// Removes `peer`'s series (RTT, bytes, drops), once the node has forgotten the peer.
    pub(crate) fn forget_peer(&self, peer: &PeerId) {
        let mut handles = self.peer_handles.write().unwrap_or_else(|e| e.into_inner());
        handles.remove(peer);
        let label = PeerLabel { peer: peer.short() };
        self.peer_rtt_seconds.remove(&label);
        self.peer_bytes_sent.remove(&label);
        self.peer_bytes_received.remove(&label);
        self.peer_dropped.remove(&label);
    }

    /// `peer`'s handles, created (with its series) on first use.
    fn peer_handles(&self, peer: &PeerId) -> PeerHandles {
        // Every message of every peer looks here: a shared lock, exclusive only to create.
        if let Some(found) = self
            .peer_handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(peer)
        {
            return found.clone();
        }
        // Held while the series are created, so a concurrent `forget_peer` cannot remove them
        // between their creation and their caching.
        let mut handles = self.peer_handles.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = handles.get(peer) {
            return found.clone();
        }
        let label = PeerLabel { peer: peer.short() };
        let created = PeerHandles {
            counters: PeerCounters {
                sent: self.peer_bytes_sent.get_or_create(&label).clone(),
                received: self.peer_bytes_received.get_or_create(&label).clone(),
                dropped: self.peer_dropped.get_or_create(&label).clone(),
            },
            rtt: self.peer_rtt_seconds.get_or_create(&label).clone(),
        };
        handles.insert(*peer, created.clone());
        created
    }

    /// `peer`'s counters of bytes sent, bytes received and dropped messages, for a caller that
    /// updates them often.
    pub(crate) fn peer_counters(&self, peer: &PeerId) -> PeerCounters {
        self.peer_handles(peer).counters
    }

    /// Counts `bytes` of frames written to a peer, in the node's total and the peer's.
    pub(crate) fn count_sent(&self, peer: &PeerCounters, bytes: u64) {
        self.frames_sent.inc();
        self.bytes_sent.inc_by(bytes);
        peer.sent.inc_by(bytes);
    }

    /// Counts `bytes` of a frame read from a peer, in the node's total and the peer's.
    pub(crate) fn count_received(&self, peer: &PeerCounters, bytes: u64) {
        self.frames_received.inc();
        self.bytes_received.inc_by(bytes);
        peer.received.inc_by(bytes);
    }

    /// Counts a message for a peer not delivered, by `reason` and for the peer.
    pub(crate) fn drop_peer_message(&self, peer: &PeerCounters, reason: &'static str) {
        self.drop_message(reason);
        peer.dropped.inc();
    }

    /// The RTT gauge of `peer`, for a caller that updates it often.
    pub(crate) fn peer_rtt_gauge(&self, peer: &PeerId) -> Gauge<f64, std::sync::atomic::AtomicU64> {
        self.peer_handles(peer).rtt
    }

    /// Registers the real UDP socket bound at `local`: the kernel buffers it was granted
    /// (`meshwire_udp_receive_buffer_bytes`, `meshwire_udp_send_buffer_bytes`, and what was asked,
    /// `meshwire_udp_requested_buffer_bytes`) and, where the platform reports them, the datagrams
    /// its kernel dropped on receive (`meshwire_udp_receive_drops_total`, read at each scrape).
    pub(crate) fn register_udp(&self, local: std::net::SocketAddr, buffers: SocketBuffers) {
        let gauge = |bytes: usize| {
            let gauge: Gauge = Gauge::default();
            gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            gauge
        };
        self.register_with(|registry| {
            registry.register(
                "udp_requested_buffer_bytes",
                "Kernel UDP buffer asked for in each direction (from the bandwidth-delay product)",
                gauge(buffers.requested),
            );
            registry.register(
                "udp_receive_buffer_bytes",
                "Kernel UDP receive buffer granted (capped by net.core.rmem_max)",
                gauge(buffers.receive),
            );
            registry.register(
                "udp_send_buffer_bytes",
                "Kernel UDP send buffer granted (capped by net.core.wmem_max)",
                gauge(buffers.send),
            );
            registry.register_collector(Box::new(KernelDrops { local }));
        });
    }

    /// Current value of `meshwire_dropped_total{reason}` (for tests and status pages).
    pub fn dropped_count(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&ReasonLabel { reason }).get()
    }

    /// Current value of `meshwire_frame_errors_total{reason}`.
    pub fn frame_error_count(&self, reason: &'static str) -> u64 {
        self.frame_errors
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    /// Current value of `meshwire_path_estimates_ignored_total{reason}` (`zero_rtt`, `zero_rate`,
    /// `rate_above_cap`).
    pub fn path_estimates_ignored_count(&self, reason: &'static str) -> u64 {
        self.path_estimates_ignored
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    /// Current value of `meshwire_reconnects_total`.
    pub fn reconnect_count(&self) -> u64 {
        self.reconnects.get()
    }

    /// Current value of `meshwire_handshakes_refused_total`.
    pub fn handshakes_refused_count(&self) -> u64 {
        self.handshakes_refused.get()
    }
}

/// The kernel's receive drops of the node's UDP socket, read from the kernel at each scrape (the
/// kernel is the only writer, so the figure cannot race).
#[derive(Debug)]
struct KernelDrops {
    local: std::net::SocketAddr,
}

impl Collector for KernelDrops {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(drops) = crate::udp::kernel_receive_drops(self.local) {
            let counter = ConstCounter::new(drops);
            let metric = encoder.encode_descriptor(
                "udp_receive_drops",
                "Datagrams the kernel dropped on receive for the node's socket (a full buffer)",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

/// Rewrites OpenMetrics text as Prometheus text 0.0.4: a counter family is named with its
/// `_total` suffix in `# HELP` and `# TYPE`, `unknown` becomes `untyped`, `# UNIT` and `# EOF`
/// lines and exemplars go (0.0.4 has none of them).
pub fn openmetrics_to_prometheus(openmetrics: &str) -> String {
    use std::collections::HashMap;
    let mut types = HashMap::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                types.insert(name, kind);
            }
        }
    }
    let rename = |name: &str| -> String {
        match types.get(name) {
            Some(&"counter") => format!("{name}_total"),
            Some(&"info") => format!("{name}_info"),
            _ => name.to_string(),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", rename(name)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                "info" | "stateset" => "gauge",
                _ => "untyped",
            };
            out.push_str(&format!("# TYPE {} {kind}\n", rename(name)));
        } else {
            // An exemplar follows the value after " # ".
            let sample = line.split_once(" # ").map_or(line, |(sample, _)| sample);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_end_in_their_unit_and_total() {
        let metrics = Metrics::new();
        metrics.bytes_sent.inc_by(7);
        let openmetrics = metrics.encode_text();
        assert!(
            openmetrics.contains("# UNIT meshwire_sent_bytes bytes"),
            "{openmetrics}"
        );
        assert!(
            openmetrics.contains("\nmeshwire_sent_bytes_total 7\n"),
            "{openmetrics}"
        );
        assert!(openmetrics.ends_with("# EOF\n"));
        let text = metrics.encode_prometheus_text();
        assert!(
            text.contains("# TYPE meshwire_sent_bytes_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP meshwire_sent_bytes_total Frame bytes"),
            "{text}"
        );
        assert!(text.contains("\nmeshwire_sent_bytes_total 7\n"), "{text}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(text.contains("# TYPE meshwire_request_duration_seconds histogram"));
    }

    #[test]
    fn a_forgotten_peer_leaves_no_series() {
        let metrics = Metrics::new();
        let peer = PeerId::from_bytes([3; 32]);
        metrics.observe_rtt(&peer, std::time::Duration::from_millis(5));
        let counters = metrics.peer_counters(&peer);
        metrics.count_sent(&counters, 10);
        metrics.count_received(&counters, 20);
        metrics.drop_peer_message(&counters, "connection_lost");
        let text = metrics.encode_text();
        let label = format!("{{peer=\"{}\"}}", peer.short());
        assert!(
            text.contains(&format!("meshwire_peer_sent_bytes_total{label} 10")),
            "{text}"
        );
        assert!(
            text.contains(&format!("meshwire_peer_received_bytes_total{label} 20")),
            "{text}"
        );
        assert!(
            text.contains(&format!("meshwire_peer_dropped_total{label} 1")),
            "{text}"
        );
        assert!(text.contains("meshwire_sent_bytes_total 10"), "{text}");
        assert_eq!(metrics.dropped_count("connection_lost"), 1);
        metrics.forget_peer(&peer);
        assert!(!metrics.encode_text().contains(&peer.short()));
        // A peer that comes back starts new series, not the forgotten ones.
        metrics.count_sent(&metrics.peer_counters(&peer), 5);
        let text = metrics.encode_text();
        assert!(
            text.contains(&format!("meshwire_peer_sent_bytes_total{label} 5")),
            "{text}"
        );
    }
}
