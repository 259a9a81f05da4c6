//! Emulate one directed link's egress: serialization at a rate, a bounded drop-tail queue, loss.
//!
//! # Design
//!
//! A datagram offered to a link waits behind the datagrams already queued, is serialized at the
//! link's rate (bytes/s, or packets/s as NKN's emulator counts, `docs/lessons.md`), and only then
//! starts its propagation delay. The queue holds at most `queue_bytes`; a datagram that does not
//! fit is dropped (drop-tail), as a router would. Loss is i.i.d. per datagram from the scenario's seeded
//! RNG. Nothing here reads a clock: `admit` takes the arrival time.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// How fast a link serializes datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rate {
    /// No serialization delay.
    Unlimited,
    /// Bits per second of datagram payload (UDP payload, as QUIC sees it).
    BitsPerSec(u64),
    /// Datagrams per second, whatever their size.
    PacketsPerSec(u64),
}

/// Bytes a packet counts for when a packet rate must be read as a byte rate: one Ethernet MTU.
pub const PACKET_BYTES: usize = 1500;

impl Rate {
    /// The rate in bits per second for a model that counts bytes (TCP pacing, physical floors):
    /// a packet rate counts [`PACKET_BYTES`] per packet. `None` when unlimited.
    pub fn bit_rate(&self) -> Option<u64> {
        match *self {
            Rate::Unlimited => None,
            Rate::BitsPerSec(bits) => Some(bits),
            Rate::PacketsPerSec(packets) => Some(packets.saturating_mul(PACKET_BYTES as u64 * 8)),
        }
    }

    /// Time to serialize one datagram of `len` bytes.
    pub fn service_time(&self, len: usize) -> Duration {
        match *self {
            Rate::Unlimited => Duration::ZERO,
            Rate::BitsPerSec(bits) if bits > 0 => {
                Duration::from_nanos((len as u128 * 8 * 1_000_000_000 / u128::from(bits)) as u64)
            }
            Rate::PacketsPerSec(packets) if packets > 0 => {
                Duration::from_nanos(1_000_000_000 / packets)
            }
            // A zero rate carries nothing: every datagram waits forever, so it is dropped.
            _ => Duration::MAX,
        }
    }
}

/// Everything about one directed link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkSpec {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Serialization rate.
    pub rate: Rate,
    /// Bytes the egress queue holds before dropping.
    pub queue_bytes: usize,
    /// Probability that a datagram is lost, independently of all others.
    pub loss: f64,
    /// Extra delay drawn uniformly from `[0, jitter]` per datagram (a link keeps its order: a datagram never arrives before one sent earlier on it).
    pub jitter: Duration,
}

impl Default for LinkSpec {
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(10),
            rate: Rate::Unlimited,
            queue_bytes: 4 * 1024 * 1024,
            loss: 0.0,
            jitter: Duration::ZERO,
        }
    }
}

/// Why a datagram did not make it onto the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue was full.
    QueueFull,
}

/// The egress queue of one link: when each queued datagram finishes serializing.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    queued: VecDeque<(Instant, usize)>,
    queued_bytes: usize,
}

impl Pacer {
    /// Offers a datagram of `len` bytes at `now`. Returns when it leaves the queue (fully
    /// serialized), or why it was dropped.
    pub fn admit(&mut self, now: Instant, len: usize, spec: &LinkSpec) -> Result<Instant, Refusal> {
        while let Some(&(done, bytes)) = self.queued.front() {
            if done > now {
                break;
            }
            self.queued.pop_front();
            self.queued_bytes -= bytes;
        }
        if spec.rate == Rate::Unlimited {
            return Ok(now);
        }
        if self.queued_bytes + len > spec.queue_bytes {
            return Err(Refusal::QueueFull);
        }
        let start = self.queued.back().map_or(now, |&(done, _)| done.max(now));
        let service = spec.rate.service_time(len);
        let done = start.checked_add(service).ok_or(Refusal::QueueFull)?;
        self.queued.push_back((done, len));
        self.queued_bytes += len;
        Ok(done)
    }

    /// Bytes waiting to be serialized.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: Rate, queue_bytes: usize) -> LinkSpec {
        LinkSpec {
            rate,
            queue_bytes,
            ..LinkSpec::default()
        }
    }

    #[test]
    fn serializes_back_to_back_at_the_rate() {
        let now = Instant::now();
        let link = spec(Rate::BitsPerSec(8_000_000), 1 << 20); // 1 byte per microsecond
        let mut pacer = Pacer::default();
        let first = pacer.admit(now, 1000, &link).unwrap();
        let second = pacer.admit(now, 1000, &link).unwrap();
        assert_eq!(first - now, Duration::from_micros(1000));
        assert_eq!(second - now, Duration::from_micros(2000));
        // After the queue drains, a new datagram starts at its own arrival.
        let later = now + Duration::from_secs(1);
        assert_eq!(
            pacer.admit(later, 500, &link).unwrap() - later,
            Duration::from_micros(500)
        );
    }

    #[test]
    fn packet_rate_ignores_size() {
        let now = Instant::now();
        let link = spec(Rate::PacketsPerSec(1024), 1 << 20);
        let mut pacer = Pacer::default();
        let first = pacer.admit(now, 10, &link).unwrap();
        let second = pacer.admit(now, 1400, &link).unwrap();
        assert_eq!(first - now, Duration::from_nanos(976_562));
        assert_eq!(second - first, Duration::from_nanos(976_562));
    }

    #[test]
    fn drops_what_does_not_fit_the_queue() {
        let now = Instant::now();
        let link = spec(Rate::BitsPerSec(8_000), 2500);
        let mut pacer = Pacer::default();
        assert!(pacer.admit(now, 1000, &link).is_ok());
        assert!(pacer.admit(now, 1000, &link).is_ok());
        assert_eq!(pacer.admit(now, 1000, &link), Err(Refusal::QueueFull));
        assert_eq!(pacer.queued_bytes(), 2000);
        assert!(pacer.admit(now, 500, &link).is_ok());
    }
}
