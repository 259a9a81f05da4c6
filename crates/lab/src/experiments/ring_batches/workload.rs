//! What every policy of the ring experiment shares: its parameters, its batches and its metrics.

use std::time::Duration;

use bytes::Bytes;
use meshwire::pipeline::BatchInput;
use meshwire::Chunk;
use serde::Deserialize;

use crate::experiments::CongestionParam;
use crate::lab::LAB_MTU;
use crate::link::LinkSpec;
use crate::scenario::{CaseFile, ScenarioError};
use crate::stats::{percentile_f64, round_metric, Metrics};

/// `ring` parameters (defaults: the xx network's team of five, 1000 x 500 B payloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Nodes in the ring, the first included.
    pub nodes: u64,
    /// Payloads per batch.
    pub slots: u32,
    /// Bytes per payload.
    pub payload_bytes: u64,
    /// Each node's compute per batch.
    pub compute_ms: u64,
    /// Batches sent round the ring by the meshwire policies.
    pub batches: u64,
    /// Batches sent round the ring by the gRPC baselines; absent: `batches`.
    pub baseline_batches: Option<u64>,
    /// Batches in flight under `meshwire-pipelined`.
    pub pipelined_k: u64,
    /// Hop-transfer samples after the warm-up batch.
    pub hop_samples: u64,
    /// How long a batch may take round the ring.
    pub batch_deadline_s: u64,
    /// Ring ping interval of the meshwire policies.
    pub ping_interval_ms: u64,
    /// Every meshwire node's initial congestion window; 0: quinn's standard start.
    pub initial_window_bytes: u64,
    /// Every meshwire node's QUIC congestion controller.
    pub congestion: CongestionParam,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            nodes: 5,
            slots: 1000,
            payload_bytes: 500,
            compute_ms: 0,
            batches: 20,
            baseline_batches: None,
            pipelined_k: 5,
            hop_samples: 10,
            batch_deadline_s: 30,
            ping_interval_ms: 500,
            initial_window_bytes: 0,
            congestion: CongestionParam::Meshwire,
        }
    }
}

/// A batch of `slots` payloads of `payload_bytes`, byte `i` of the batch being `(i * 7 + seed) % 251`.
pub fn team_batch(round: u64, slots: u32, payload_bytes: usize) -> BatchInput {
    let chunks = (0..slots)
        .map(|slot| {
            let start = slot as usize * payload_bytes;
            Chunk {
                slots: 1,
                data: (start..start + payload_bytes)
                    .map(|i| ((i * 7 + round as usize) % 251) as u8)
                    .collect(),
            }
        })
        .collect();
    BatchInput {
        round,
        phase: 0,
        metadata: Bytes::copy_from_slice(&round.to_le_bytes()),
        chunks,
    }
}

/// The workload of an xx-team case, shared by every policy.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Nodes in the ring, the first included.
    pub nodes: usize,
    /// Payloads per batch.
    pub slots: u32,
    /// Bytes per payload.
    pub payload_bytes: usize,
    /// Batches sent round the ring by the meshwire policies.
    pub batches: u64,
    /// Batches sent round the ring by the gRPC baselines. They send one batch at a time, so their
    /// rate does not depend on the count, and fewer keep a run's wall time small.
    pub baseline_batches: u64,
    /// Hop-transfer samples after the warm-up batch.
    pub hop_samples: usize,
    /// Each node's compute per batch.
    pub compute_per_batch: Duration,
    /// How long a batch may take round the ring.
    pub batch_deadline: Duration,
}

impl Workload {
    /// The workload `params` describe.
    pub fn new(case: &CaseFile, params: &Params) -> Result<Self, ScenarioError> {
        let workload = Self {
            nodes: params.nodes as usize,
            slots: params.slots,
            payload_bytes: params.payload_bytes as usize,
            batches: params.batches,
            baseline_batches: params.baseline_batches.unwrap_or(params.batches),
            hop_samples: params.hop_samples as usize,
            compute_per_batch: Duration::from_millis(params.compute_ms),
            batch_deadline: Duration::from_secs(params.batch_deadline_s),
        };
        if workload.nodes < 2
            || workload.slots == 0
            || workload.batches == 0
            || workload.baseline_batches == 0
        {
            return Err(ScenarioError::failed(
                case,
                "an xx-team ring needs at least 2 nodes, 1 slot and 1 batch",
            ));
        }
        Ok(workload)
    }
}

/// The physical floor of one hop of a batch, in milliseconds: the link's one-way latency plus the
/// batch's bytes serialized at the link's rate, `latency + slots × payload_bytes × 8 / bit rate`,
/// plus what the link's jitter adds. No transport can deliver a batch's last byte sooner after its
/// first was sent, so `hop_transfer_ms` of any policy should not come in under it (beyond the
/// lab's 1 ms ticks). Only payload bytes count: no meshwire, QUIC, HTTP/2 or gRPC overhead is
/// added, the floor is the physics, not any protocol. A packet rate counts 1500 bytes per packet
/// ([`crate::link::Rate::bit_rate`]); since lab datagrams carry at most 1472 bytes, the floor is
/// then a little under what any protocol could reach. An unlimited rate leaves the latency.
///
/// Jitter: the lab delays each datagram by a further uniform draw from `[0, jitter]` and never lets
/// it overtake an earlier one, so the last byte arrives no sooner than the latest of
/// `finishᵢ + jitterᵢ` over the batch's datagrams, sent back to back at the link's rate. The floor
/// takes that latest arrival's median (the hop percentiles are taken over samples) over the fewest
/// datagrams the payload fits in ([`LAB_MTU`] bytes each): fewer draws, an earlier maximum. Without
/// it, a 10 KB batch on a 1 ms link with 8 ms of jitter had a floor of 2.2 ms that no run could
/// come near (meshwire took 9 ms, the floor with jitter is 8.9 ms; ring sweep, seed 5, case 0).
pub fn hop_floor_ms(link: &LinkSpec, params: &Params) -> f64 {
    let latency_ms = link.latency.as_secs_f64() * 1e3;
    let batch_bytes = u64::from(params.slots) as f64 * params.payload_bytes as f64;
    let bits_per_sec = link.rate.bit_rate().map(|bits| bits as f64);
    let serialized_ms = bits_per_sec.map_or(0.0, |bits| batch_bytes * 8.0 / bits * 1e3);
    let jitter_ms = link.jitter.as_secs_f64() * 1e3;
    if jitter_ms <= 0.0 || batch_bytes <= 0.0 {
        return latency_ms + serialized_ms;
    }
    // When each datagram has crossed the link's serializer, the last at `serialized_ms`.
    let datagrams = (batch_bytes / f64::from(LAB_MTU)).ceil() as u64;
    let per_datagram_ms = serialized_ms / datagrams as f64;
    let finish = |index: u64| (index + 1) as f64 * per_datagram_ms;
    // P(every datagram has arrived by `at`), jitter aside from the latency.
    let all_arrived = |at: f64| {
        let mut probability = 1.0;
        for index in (0..datagrams).rev() {
            let left = at - finish(index);
            if left >= jitter_ms {
                break;
            }
            probability *= (left / jitter_ms).max(0.0);
        }
        probability
    };
    let (mut low, mut high) = (serialized_ms, serialized_ms + jitter_ms);
    for _ in 0..60 {
        let middle = (low + high) / 2.0;
        if all_arrived(middle) >= 0.5 {
            high = middle;
        } else {
            low = middle;
        }
    }
    latency_ms + high
}

/// The metrics every xx-team policy reports: hop transfer percentiles over sorted `hop_ms`, the
/// ring ping, and `batches` round the ring in `elapsed_s` with `failed` of them failed.
pub fn team_metrics(
    hop_ms: &[f64],
    ring_ping: Duration,
    batches: u64,
    elapsed_s: f64,
    failed: u64,
) -> Metrics {
    Metrics::from([
        (
            "hop_transfer_ms_p50".into(),
            round_metric(percentile_f64(hop_ms, 0.5)),
        ),
        (
            "hop_transfer_ms_p99".into(),
            round_metric(percentile_f64(hop_ms, 0.99)),
        ),
        (
            "ring_ping_ms".into(),
            round_metric(ring_ping.as_secs_f64() * 1e3),
        ),
        (
            "batches_per_s".into(),
            round_metric(batches as f64 / elapsed_s),
        ),
        ("batches_failed".into(), failed as f64),
    ])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::link::Rate;

    #[test]
    fn the_hop_floor_is_latency_plus_payload_bytes_at_the_link_rate() {
        let params = Params::default(); // 1000 x 500 B: 4 Mbit
        let link = |rate| LinkSpec {
            latency: Duration::from_millis(45),
            rate,
            ..LinkSpec::default()
        };
        assert_eq!(
            hop_floor_ms(&link(Rate::BitsPerSec(1_000_000_000)), &params),
            49.0
        );
        // 1000 packets/s of 1500 B: 12 Mbit/s.
        let packets = hop_floor_ms(&link(Rate::PacketsPerSec(1000)), &params);
        assert!(
            (packets - (45.0 + 4e6 / 12e6 * 1e3)).abs() < 1e-9,
            "{packets}"
        );
        assert_eq!(hop_floor_ms(&link(Rate::Unlimited), &params), 45.0);
    }

    #[test]
    fn jitter_adds_the_median_of_the_latest_datagrams_delay() {
        let params = |slots| Params {
            slots,
            payload_bytes: 500,
            ..Params::default()
        };
        let link = |rate, jitter_ms| LinkSpec {
            latency: Duration::from_millis(1),
            rate,
            jitter: Duration::from_millis(jitter_ms),
            ..LinkSpec::default()
        };
        // One datagram, no serialization: the median of one draw, half the jitter.
        let one = hop_floor_ms(&link(Rate::Unlimited, 8), &params(1));
        assert!((one - 5.0).abs() < 1e-6, "{one}");
        // Seven datagrams at once: the median of the largest of seven draws, 8 x 0.5^(1/7).
        let seven = hop_floor_ms(&link(Rate::Unlimited, 8), &params(20));
        let expected = 1.0 + 8.0 * 0.5f64.powf(1.0 / 7.0);
        assert!((seven - expected).abs() < 1e-6, "{seven} {expected}");
        // A batch far longer than the jitter: its last datagrams' draws, about one jitter on top
        // of the serialization, never less than without jitter nor more than a whole jitter.
        let rate = Rate::BitsPerSec(100_000_000);
        let without = hop_floor_ms(&link(rate, 0), &params(100_000));
        let with = hop_floor_ms(&link(rate, 8), &params(100_000));
        assert!(
            with > without + 6.5 && with <= without + 8.0,
            "{without} {with}"
        );
    }
}
