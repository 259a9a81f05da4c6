//! Configure a node: identity, transport windows, limits, queues and reconnect policy.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use meshwire_proto::backoff::Backoff;
use meshwire_proto::wire::Limits;
use meshwire_proto::PeerId;

use crate::congestion::resume::PathEstimate;
use crate::congestion::PathSlot;
use crate::identity::Keypair;

/// Which congestion controller QUIC runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Congestion {
    /// CUBIC (RFC 9438), quinn's default. Shares a bottleneck fairly, but reads every loss as
    /// congestion: at 1% random loss on an 80 ms path a 4 Mbit batch took 4.5 s in the lab (floor
    /// 84 ms). See `docs/node.md`, Congestion controller.
    Cubic,
    /// BBR (quinn's experimental BBRv1-like implementation): holds its rate through random loss,
    /// but in the lab it overflows drop-tail queues continuously and starves a CUBIC flow sharing
    /// the bottleneck (under 1% of an equal share). For dedicated, lossy paths only.
    Bbr,
    /// NewReno (RFC 9002).
    NewReno,
    /// meshwire's: CUBIC that backs off only for losses that are congestion (a queue in the RTT,
    /// heavy loss, ECN), and keeps slow start through application-limited bursts while the path
    /// shows no queue ([`crate::congestion`]). The default: as fair as CUBIC beside CUBIC, and
    /// near BBR's speed on lossy paths and for bursts.
    #[default]
    Meshwire,
}

/// QUIC transport settings. Windows come from a bandwidth-delay product, never from quinn's
/// 1.25 MB stream default that bound the xx network's transfers (`docs/lessons.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct TransportSettings {
    /// The fastest path the node should fill, in bits per second.
    pub bandwidth_bits_per_sec: u64,
    /// The longest round trip the node should fill a path across.
    pub max_rtt: Duration,
    /// Interval of keep-alive packets on idle connections.
    pub keep_alive: Duration,
    /// A connection silent this long is closed. Must be at least three keep-alive intervals, so
    /// two lost keep-alives do not drop a healthy connection.
    pub idle_timeout: Duration,
    /// Congestion controller.
    pub congestion: Congestion,
    /// The congestion window a new connection starts with, in bytes. `None` keeps RFC 9002's
    /// (quinn's) standard of about ten packets, which is safe on any path. `Some` is for links whose
    /// capacity is known and provisioned (a team of servers on dedicated links): set it to the
    /// path's bandwidth-delay product and the first flight, and every later burst smaller than
    /// it, go out at the path's rate. quinn paces at 1.25 × window / RTT; under CUBIC an
    /// application that sends in bursts (batches) never grows its window past the burst, so with
    /// the standard start a 0.5 MB batch on a 1 Gbit/s, 90 ms path is paced over about one RTT
    /// instead of 4 ms ([`Congestion::Meshwire`] grows it through bursts, × 4 per burst, and gets
    /// there after a few batches). On a
    /// path slower than the window assumes, the first flight overflows its queue and the
    /// controller backs off from losses. At least two packets of `initial_mtu`, at most
    /// [`TransportSettings::bdp_bytes`]. `Some` also turns off careful resume
    /// ([`crate::congestion::resume`]). See `docs/node.md`.
    pub initial_window_bytes: Option<u64>,
    /// Initial (and, when `mtu_discovery` is off, fixed) UDP payload size.
    pub initial_mtu: u16,
    /// Whether to probe for larger MTUs.
    pub mtu_discovery: bool,
    /// Concurrent requests a peer may have open against this node.
    pub max_concurrent_requests: u32,
    /// Concurrent one-way streams a peer may have open against this node.
    pub max_concurrent_uni_streams: u32,
    /// Bytes of QUIC datagrams buffered per connection in each direction (sent and waiting for
    /// the congestion controller; received and not yet read).
    pub datagram_buffer_bytes: usize,
    /// Whether a batch sent on a path that has lost packets carries recovery shards for its tail,
    /// so that losses in its last round trip are rebuilt by the receiver instead of costing a
    /// retransmission round trip ([`meshwire_proto::batch::repair`]). A path that has lost
    /// nothing gets none. Receiving nodes always use shards that arrive.
    pub batch_repair: bool,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            bandwidth_bits_per_sec: 1_000_000_000,
            max_rtt: Duration::from_millis(200),
            keep_alive: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(20),
            congestion: Congestion::Meshwire,
            initial_window_bytes: None,
            initial_mtu: 1200,
            mtu_discovery: true,
            max_concurrent_requests: 256,
            max_concurrent_uni_streams: 32,
            datagram_buffer_bytes: 1 << 20,
            batch_repair: true,
        }
    }
}

/// How long a meshwire receiver may hold back the acknowledgement of a flight's last packet.
///
/// A sender arms its probe timeout (RFC 9002 §6.2) at the smoothed RTT, four RTT deviations and
/// the peer's `max_ack_delay`, 25 ms by default, since the peer may sit that long on the last
/// packet of a flight before acknowledging it. When the last packets of a batch are lost, that
/// timeout is what finds them, so on short paths the 25 ms dominated: on a 1 ms, 354 Mbit/s lab
/// path with 4 ms of jitter a 108 KB batch whose tail overflowed the queue took 49 ms against a
/// 7 ms floor (ring sweep seed 7, case 9; 33 ms with this delay). Each meshwire connection asks
/// its peer, by the ACK frequency extension (draft-ietf-quic-ack-frequency, which quinn
/// implements and advertises), to acknowledge within this delay instead (and at the latest every
/// [`ACK_ELICITING_THRESHOLD`]` + 1` packets); a packet out of order is still acknowledged at
/// once. A peer without the extension keeps its own delay and threshold.
///
/// Why 5 ms: the shorter the delay, the sooner a lost tail is probed, but a packet that arrives
/// more than the delay after the one before it is then acknowledged alone, and below 5 ms the
/// multipath session lost ground. Measured with `meshwire lab sweep` and `meshwire lab run`
/// (meshwire policy only; ring: `scenarios/sweeps/ring.toml`, seeds 1–12, worst hop p50 / worst
/// p99 over floor of any seed, mean of the seeds' p50 medians; session sweep:
/// `scenarios/sweeps/session.toml`, seeds 1–6, mean of the seeds' medians; `session-quic`'s
/// `direct+slow-relay` efficiency, the same at seeds 1–6):
///
/// | delay | ring worst p50 | ring worst p99 | ring mean median | session mean median | slow relay |
/// |---|---|---|---|---|---|
/// | 25 ms (quinn, no request) | 6.96 | 26.5 | 1.127 | 2.175 | 0.939 |
/// | 1 ms | 4.49 | 7.8 | 1.133 | 2.306 | 0.921 |
/// | 2 ms | 4.42 | 8.6 | 1.104 | 2.171 | 0.901 |
/// | 3 ms | 4.61 | 9.3 | 1.107 | 2.172 | 0.901 |
/// | 5 ms | 5.59 | 10.9 | 1.107 | 2.170 | 0.942 |
///
/// Why the session loses below 5 ms is not traced. With the request at any delay (25 ms
/// included), `session-quic`'s `losses-0.01+0.1` row comes out near 0.92 at most seeds but at
/// 0.77–0.87 at two or three of seeds 1–6 (0.905–0.923 at all six without it). A request for
/// 25 ms changes nothing but the one ACK_FREQUENCY frame itself (quinn's defaults are 25 ms and
/// the same thresholds, and two quinn peers already mark probes for an immediate ACK), so that
/// spread is the row's sensitivity to where packet boundaries fall, which `meshwire-session`'s
/// docs describe as a knife edge, not an effect of the delay.
pub const MAX_ACK_DELAY: Duration = Duration::from_millis(5);

/// How many ack-eliciting packets a meshwire peer may receive before it must acknowledge them
/// at once: it acknowledges every 8th packet, within [`MAX_ACK_DELAY`] of the first one it holds,
/// and sooner whenever it has a packet of its own to carry the ACK. quinn's default is 1 (every
/// second packet).
///
/// Why: the threshold is what makes an ACK leave alone. A multipath session's receiver answers
/// every data datagram with a session ACK, itself a DATAGRAM and so ack-eliciting; at a threshold
/// of 1 the sender's QUIC acknowledged every second one at once, in a packet of its own, before
/// the session had queued the data that would have carried it. Traced in the session sweep
/// (`scenarios/sweeps/session.toml`, seed 1, case 2: a 104 packets/s direct path and a
/// 405 packets/s relay path, loss-free): of the 402 packets/s the sender put on the relay link,
/// 27% carried only an ACK, so the session got 0.77 of the paths (transfer 1.305 × floor). With
/// this threshold more of those ACKs ride on the data packets that follow: 22% ACK-only, 1.241 ×
/// floor. The rest is [`MAX_ACK_DELAY`] expiring between quinn's paced bursts: with a 10 ms
/// delay and this threshold under 1% of those packets carry only an ACK and the case reaches
/// 1.015 × floor, but the 5 ms delay is kept for the ring's lost tails (below).
///
/// Measured with the meshwire policies only (`meshwire lab sweep`; session: seeds 1–6, 72 cases;
/// ring: `scenarios/sweeps/ring.toml` seeds 1–4, 40 cases; quorum: `scenarios/sweeps/quorum.toml`
/// with the hedged policy, seeds 1–4; `session-quic` rows at seed 1), medians / p90 / max of the
/// ratio to the floor:
///
/// | threshold, delay | session | ring hop p50 | ring hop p99 | quorum p99 | 3 relays | 3 relays, no claims | slow relay |
/// |---|---|---|---|---|---|---|---|
/// | 1, 5 ms (before) | 1.449 / 2.770 / 4.698 | 1.069 / 1.243 / 1.323 | 1.204 / 1.659 / 3.316 | 1.000 / 1.227 / 1.548 | 0.916 | 0.800 | 0.838 |
/// | 7, 5 ms | 1.449 / 2.670 / 4.918 | 1.075 / 1.243 / 1.323 | 1.205 / 1.665 / 3.337 | 1.000 / 1.227 / 1.577 | 0.945 | 0.884 | 0.843 |
/// | 3, 10 ms | 1.499 / 2.687 / 4.641 | 1.074 / 1.243 / 1.499 | 1.205 / 1.741 / 3.321 | 1.012 / 1.237 / 1.708 | 0.949 | 0.881 | 0.889 |
/// | 7, 10 ms | 1.449 / 2.534 / 4.641 | 1.063 / 1.243 / 1.514 | 1.191 / 1.732 / 3.321 | 1.012 / 1.227 / 1.607 | 0.954 | 0.891 | 0.887 |
/// | 7, 25 ms | 1.449 / 2.361 / 4.598 | 1.063 / 1.243 / 1.514 | 1.228 / 1.741 / 5.286 | 1.048 / 1.234 / 1.643 | 0.948 | 0.887 | 0.915 |
///
/// (The last three columns are `session-quic` efficiencies, higher is better.) At 10 and 25 ms
/// the session gains more, but the ring's worst hops and the quorum reads lose, and at 10 ms
/// `losses-0.01+0.1-noclaims` fell from 0.909 to 0.766; at 7 and 5 ms nothing moved by more
/// than a few thousandths except those gains and the sweeps' worst cases above. In
/// `scenarios/fairness.toml` shares moved by up to a quarter of an equal share either way (most:
/// `bbr-bbr-1bdp-stagger` 1.008 → 1.254, `meshwire-cubic-1bdp-stagger` 1.198 → 1.267,
/// `session-noclaims-cubic-0.25bdp` 1.252 → 1.120) and none left 0.6–1.6 (the rows outside it
/// were outside before: quinn's BBR beside CUBIC, `meshwire-cubic-0.05bdp` at 1.61, the
/// no-claims session at 1 BDP). `bench/transport.sh` on loopback measured meshwire at 0.85×
/// plain quinn against 0.86× (3 rounds of 1 GiB each).
pub const ACK_ELICITING_THRESHOLD: u32 = 7;

fn ack_frequency() -> quinn::AckFrequencyConfig {
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.max_ack_delay(Some(MAX_ACK_DELAY))
        .ack_eliciting_threshold(quinn::VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .reordering_threshold(quinn::VarInt::from_u32(1));
    ack
}

impl TransportSettings {
    /// The bandwidth-delay product in bytes: the stream receive window.
    pub fn bdp_bytes(&self) -> u64 {
        let bytes = u128::from(self.bandwidth_bits_per_sec) * self.max_rtt.as_micros() / 8_000_000;
        bytes.clamp(64 * 1024, u128::from(u32::MAX)) as u64
    }

    /// Kernel UDP buffer a real socket asks for in each direction: the bandwidth-delay product,
    /// at least 1 MiB and at most 256 MiB. The kernel may grant less (`net.core.rmem_max` /
    /// `wmem_max`); the node then warns and runs with what it got (see [`crate::SocketBuffers`]).
    pub fn socket_buffer_bytes(&self) -> usize {
        let bdp = usize::try_from(self.bdp_bytes()).unwrap_or(usize::MAX);
        bdp.clamp(1 << 20, 256 << 20)
    }

    pub(crate) fn to_quinn(&self) -> Result<quinn::TransportConfig, ConfigError> {
        self.to_quinn_resuming(None, None)
    }

    /// The quinn transport of a connection to one peer: under [`Congestion::Meshwire`] its
    /// controller publishes its path estimate to the peer's slot and starts from `estimate` by
    /// careful resume ([`crate::congestion::resume`]).
    pub(crate) fn to_quinn_resuming(
        &self,
        resume: Option<(Option<PathEstimate>, PathSlot)>,
        allowance: Option<crate::congestion::AllowanceCell>,
    ) -> Result<quinn::TransportConfig, ConfigError> {
        let bdp = self.bdp_bytes();
        let varint = |value: u64| {
            quinn::VarInt::from_u64(value).map_err(|_| ConfigError::Invalid("window too large"))
        };
        let mut config = quinn::TransportConfig::default();
        config
            .stream_receive_window(varint(bdp)?)
            .receive_window(varint(2 * bdp)?)
            .send_window(2 * bdp)
            .keep_alive_interval(Some(self.keep_alive))
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(self.idle_timeout)
                    .map_err(|_| ConfigError::Invalid("idle timeout too large"))?,
            ))
            .initial_rtt(crate::congestion::INITIAL_RTT)
            .initial_mtu(self.initial_mtu)
            .min_mtu(self.initial_mtu.min(1200))
            .max_concurrent_bidi_streams(self.max_concurrent_requests.into())
            .max_concurrent_uni_streams(self.max_concurrent_uni_streams.into())
            .datagram_receive_buffer_size(Some(self.datagram_buffer_bytes))
            .datagram_send_buffer_size(self.datagram_buffer_bytes);
        config.ack_frequency_config(Some(ack_frequency()));
        if !self.mtu_discovery {
            config.mtu_discovery_config(None);
        }
        if let Some(window) = self.initial_window_bytes {
            let smallest = 2 * u64::from(self.initial_mtu);
            if window < smallest {
                return Err(ConfigError::Invalid(
                    "the initial window must hold at least two packets",
                ));
            }
            if window > bdp {
                return Err(ConfigError::Invalid(
                    "the initial window may not exceed the bandwidth-delay product",
                ));
            }
        }
        let initial_window = self.initial_window_bytes;
        match self.congestion {
            Congestion::Cubic => {
                let mut cubic = quinn::congestion::CubicConfig::default();
                if let Some(window) = initial_window {
                    cubic.initial_window(window);
                }
                config.congestion_controller_factory(Arc::new(cubic))
            }
            Congestion::Bbr => {
                let mut bbr = quinn::congestion::BbrConfig::default();
                if let Some(window) = initial_window {
                    bbr.initial_window(window);
                }
                config.congestion_controller_factory(Arc::new(bbr))
            }
            Congestion::NewReno => {
                let mut new_reno = quinn::congestion::NewRenoConfig::default();
                if let Some(window) = initial_window {
                    new_reno.initial_window(window);
                }
                config.congestion_controller_factory(Arc::new(new_reno))
            }
            Congestion::Meshwire => {
                let mut factory = crate::congestion::MeshwireConfig::new(
                    self.bandwidth_bits_per_sec,
                    initial_window,
                );
                if let Some((estimate, slot)) = resume {
                    factory = factory.resuming(estimate, slot);
                }
                if let Some(cell) = allowance {
                    factory = factory.with_allowance(cell);
                }
                config.congestion_controller_factory(Arc::new(factory))
            }
        };
        Ok(config)
    }
}

/// Per-peer outbound queue bounds. A slow peer fills its own queue, never the node's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Messages waiting for one peer.
    pub max_messages: usize,
    /// Frame bytes waiting for one peer (shared payloads count once per peer).
    pub max_bytes: u32,
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self {
            max_messages: 4096,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Everything a node needs to start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's identity.
    pub keypair: Keypair,
    /// If set, only these peers may connect or be dialed.
    pub allowlist: Option<HashSet<PeerId>>,
    /// QUIC settings.
    pub transport: TransportSettings,
    /// Frame size limits, enforced on send and receive.
    pub limits: Limits,
    /// Per-peer outbound queue bounds.
    pub queue: QueueLimits,
    /// Inbound messages buffered per subscribed protocol before the sender is slowed down.
    pub inbound_queue_messages: usize,
    /// Payload bytes buffered per subscribed protocol before the sender is slowed down, whatever
    /// the message count: without it a subscriber that falls behind could hold
    /// `inbound_queue_messages` largest frames (16 GiB with the defaults). Default 64 MiB; at
    /// least one largest frame.
    pub inbound_queue_bytes: u32,
    /// Reconnect backoff for configured peers.
    pub backoff: Backoff,
    /// How long one dial may take, handshake included.
    pub dial_timeout: Duration,
    /// How long a peer may take to send a whole request to this node.
    pub inbound_request_timeout: Duration,
    /// Body bytes of inbound requests this node reads and serves at once, from all peers: room for
    /// a request's body is taken once its header has arrived and before any of it is read, and
    /// given back when its answer is sent. A request that finds no room is answered with a
    /// `busy` error at once and counted in `meshwire_dropped_total{reason="request_budget"}`.
    /// Default 64 MiB; at least one largest frame.
    pub inbound_request_bytes: u32,
    /// How long a peer may leave a one-way message stream without completing a frame (counted
    /// from the stream's opening or the previous frame's delivery) before this node stops the
    /// stream and frees its place under `max_concurrent_uni_streams`. Default 30 s. A node
    /// finishes its own outbound stream once it has been idle for half of its value, so peers
    /// should use the same value (or a sender's at most twice the receiver's).
    pub inbound_stream_timeout: Duration,
    /// Seed for the reconnect jitter and QUIC's connection ids; `None` draws one from the OS. The
    /// lab sets it so runs repeat exactly.
    pub rng_seed: Option<u64>,
}

impl NodeConfig {
    /// Defaults around `keypair`.
    pub fn new(keypair: Keypair) -> Self {
        Self {
            keypair,
            allowlist: None,
            transport: TransportSettings::default(),
            limits: Limits::default(),
            queue: QueueLimits::default(),
            inbound_queue_messages: 1024,
            inbound_queue_bytes: 64 * 1024 * 1024,
            backoff: Backoff::default(),
            dial_timeout: Duration::from_secs(5),
            inbound_request_timeout: Duration::from_secs(30),
            inbound_stream_timeout: Duration::from_secs(30),
            inbound_request_bytes: 64 * 1024 * 1024,
            rng_seed: None,
        }
    }

    /// Checks that the settings fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let transport = &self.transport;
        if transport.keep_alive.is_zero() || transport.idle_timeout < 3 * transport.keep_alive {
            return Err(ConfigError::Invalid(
                "idle timeout must be at least three keep-alive intervals",
            ));
        }
        if transport.datagram_buffer_bytes < usize::from(transport.initial_mtu) {
            return Err(ConfigError::Invalid(
                "the datagram buffers must hold at least one datagram",
            ));
        }
        if transport.initial_mtu < 1200 {
            return Err(ConfigError::Invalid("QUIC needs an MTU of at least 1200"));
        }
        if self.backoff.floor.is_zero() || self.backoff.floor > self.backoff.cap {
            return Err(ConfigError::Invalid(
                "backoff floor must be positive and at most the cap",
            ));
        }
        let largest_frame =
            u64::from(self.limits.max_payload_bytes) + meshwire_proto::wire::FRAME_OVERHEAD as u64;
        if largest_frame > u64::from(self.queue.max_bytes) {
            return Err(ConfigError::Invalid(
                "the per-peer queue must hold at least one largest frame",
            ));
        }
        if largest_frame > u64::from(self.inbound_request_bytes) {
            return Err(ConfigError::Invalid(
                "the inbound request budget must hold at least one largest frame",
            ));
        }
        if largest_frame > u64::from(self.inbound_queue_bytes) {
            return Err(ConfigError::Invalid(
                "the inbound queue must hold at least one largest frame",
            ));
        }
        if self.queue.max_messages == 0 || self.inbound_queue_messages == 0 {
            return Err(ConfigError::Invalid(
                "queues must hold at least one message",
            ));
        }
        if self.dial_timeout.is_zero()
            || self.inbound_request_timeout.is_zero()
            || self.inbound_stream_timeout.is_zero()
        {
            return Err(ConfigError::Invalid("timeouts must be positive"));
        }
        transport.to_quinn().map(|_| ())
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The named constraint is violated.
    #[error("invalid configuration: {0}")]
    Invalid(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_windows_fill_a_gigabit_over_200ms() {
        let settings = TransportSettings::default();
        assert_eq!(settings.bdp_bytes(), 25_000_000);
        assert!(NodeConfig::new(Keypair::from_seed([0; 32]))
            .validate()
            .is_ok());
    }

    #[test]
    fn inconsistent_settings_are_refused() {
        let mut config = NodeConfig::new(Keypair::from_seed([0; 32]));
        config.transport.idle_timeout = config.transport.keep_alive;
        assert!(config.validate().is_err());
        let mut config = NodeConfig::new(Keypair::from_seed([0; 32]));
        config.queue.max_bytes = 1024;
        assert!(config.validate().is_err());
    }

    #[test]
    fn initial_window_must_lie_between_two_packets_and_the_bdp() {
        let mut config = NodeConfig::new(Keypair::from_seed([0; 32]));
        let bdp = config.transport.bdp_bytes();
        for (window, valid) in [
            (2 * 1200 - 1, false),
            (2 * 1200, true),
            (bdp, true),
            (bdp + 1, false),
        ] {
            config.transport.initial_window_bytes = Some(window);
            assert_eq!(config.validate().is_ok(), valid, "window {window}");
        }
    }
}
