//! The sans-IO multipath session (a sender, a receiver and an endpoint holding both, fed datagrams and `now`) and the relay decisions of the nodes it crosses.

mod ack;
pub mod codec;
mod receiver;
pub mod relay;
pub mod route;
mod rtt;
mod sender;
#[cfg(test)]
mod tests;
mod window;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use codec::{AckPacket, CodecError, DataPacket, Packet};
pub use receiver::Receiver;
pub use rtt::RttEstimator;
pub use sender::{PathState, PathStats, Sender, SenderStats};

/// A path as the driver names it (the wire does not carry it: a datagram's path is where it came
/// from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId(pub u32);

/// How windows are sized and segments scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// NCP before NKP-0024.
    Classic,
    /// NCP with NKP-0024's normalised windows.
    Nkp24,
    /// Delivery rate × min RTT windows, earliest-arrival scheduling, fast retransmit.
    Meshwire,
}

impl std::str::FromStr for Policy {
    type Err = SessionError;

    fn from_str(name: &str) -> Result<Self, SessionError> {
        match name {
            "classic" => Ok(Policy::Classic),
            "nkp24" => Ok(Policy::Nkp24),
            "meshwire" => Ok(Policy::Meshwire),
            other => Err(SessionError::UnknownPolicy(other.to_string())),
        }
    }
}

/// Session settings; both ends must agree on `mtu_bytes` and `receive_window_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Window policy.
    pub policy: Policy,
    /// Largest segment payload (NCP's default: 1024).
    pub mtu_bytes: usize,
    /// The receive window a session starts with: bytes the receiver buffers at most until it
    /// grows (NCP's session window: 4 MiB).
    pub receive_window_bytes: usize,
    /// The largest the receive window grows to, and so the most bytes a receiver ever buffers.
    /// The window doubles when a sender says the window stopped it while the application reads
    /// what arrived in order (`Receiver` has the rule). NCP's policies: `receive_window_bytes`
    /// (no growth); meshwire: 16 MiB.
    pub max_receive_window_bytes: usize,
    /// Bytes the sender holds at most, written and not yet acknowledged (NCP: 8 MiB; meshwire:
    /// 32 MiB, twice the largest window, so a grown window can fill).
    pub send_buffer_bytes: usize,
    /// Initial window of a path in packets (NCP: 16; meshwire: 128, its first burst before any
    /// rate or RTT is known).
    pub initial_window_packets: u32,
    /// NCP classic's largest connection window (256).
    pub ncp_max_window_packets: u32,
    /// meshwire's RTO before the first RTT sample (RFC 6298: 1 s).
    pub initial_rto: Duration,
    /// NCP's initial RTO (5 s).
    pub ncp_initial_rto: Duration,
    /// Floor of the RTO.
    pub min_rto: Duration,
    /// Ceiling of the RTO before backoff.
    pub max_rto: Duration,
    /// Longest wait between probes of a failed path.
    pub max_probe_interval: Duration,
    /// NCP's pause after a send error (1 s).
    pub ncp_send_error_pause: Duration,
}

impl SessionConfig {
    /// NCP's defaults (MTU 1024 B, 4 MiB windows) under `policy`.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            mtu_bytes: 1024,
            receive_window_bytes: 4 << 20,
            max_receive_window_bytes: match policy {
                Policy::Classic | Policy::Nkp24 => 4 << 20,
                // A fixed 4 MiB window caps a session at 4 MiB per round trip: over six paths
                // of 20,000 packets/s at 200 ms that is half of what the paths carry.
                Policy::Meshwire => 16 << 20,
            },
            send_buffer_bytes: match policy {
                Policy::Classic | Policy::Nkp24 => 8 << 20,
                Policy::Meshwire => 32 << 20,
            },
            initial_window_packets: match policy {
                Policy::Classic | Policy::Nkp24 => 16,
                // A first burst that keeps a path busy until its first ACK when the path's
                // bandwidth-delay product is up to 128 KiB (1024 packets/s at 100 ms, 128 at 1 s);
                // a third of what NKP-0024 gives each of three connections (4096 / n).
                Policy::Meshwire => 128,
            },
            ncp_max_window_packets: 256,
            initial_rto: Duration::from_secs(1),
            ncp_initial_rto: Duration::from_secs(5),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            max_probe_interval: Duration::from_millis(250),
            ncp_send_error_pause: Duration::from_secs(1),
        }
    }

    /// Segments the receive window holds at the start.
    pub fn window_segments(&self) -> u64 {
        (self.receive_window_bytes / self.mtu_bytes.max(1)).max(1) as u64
    }

    /// Segments the receive window holds at most, once grown (never fewer than at the start).
    pub fn max_window_segments(&self) -> u64 {
        let max = self.max_receive_window_bytes.max(self.receive_window_bytes);
        (max / self.mtu_bytes.max(1)).max(1) as u64
    }

    /// Packets the session may have in flight: NCP's `sendWindowSize / sendMtu`, the largest
    /// receive window.
    pub fn session_window_packets(&self) -> u64 {
        self.max_window_segments()
    }
}

/// Why a session rejected input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The datagram is malformed.
    #[error("malformed session packet: {0}")]
    Codec(#[from] CodecError),
    /// A segment beyond the advertised receive window.
    #[error("segment {seq} is beyond the receive window ending at {window_end}")]
    BeyondWindow {
        /// The segment.
        seq: u64,
        /// The window's end.
        window_end: u64,
    },
    /// A segment after the end of the stream, or a second, different end.
    #[error("segment {seq} contradicts the end of the stream at {fin}")]
    BeyondFin {
        /// The segment.
        seq: u64,
        /// The last segment.
        fin: u64,
    },
    /// An ACK for segments never sent.
    #[error("ack up to {acked} but only {sent} segments were sent")]
    AckBeyondSent {
        /// Highest acknowledged (exclusive).
        acked: u64,
        /// Segments sent.
        sent: u64,
    },
    /// A packet of a kind this half does not take (an ACK at a receiver).
    #[error("unexpected packet kind")]
    UnexpectedPacket,
    /// A path close for a path this end does not have (closed already, or never added).
    #[error("close for unknown path {0:?}")]
    CloseUnknownPath(PathId),
    /// A path close numbered no higher than a packet that came on the path before it: a replay.
    #[error("replayed close of path {path:?}: packet {packet_number} after {seen}")]
    ReplayedClose {
        /// The path.
        path: PathId,
        /// The close's packet number.
        packet_number: u64,
        /// The highest packet number that came on the path before.
        seen: u64,
    },
    /// A policy name that does not exist.
    #[error("unknown policy {0:?} (expected classic, nkp24 or meshwire)")]
    UnknownPolicy(String),
}

/// A datagram to send on a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The path to send on.
    pub path: PathId,
    /// The datagram.
    pub payload: Bytes,
}

/// Both halves of a two-way session: datagrams are routed by kind.
#[derive(Debug)]
pub struct Endpoint {
    /// What this end sends.
    pub sender: Sender,
    /// What this end receives.
    pub receiver: Receiver,
    mtu_bytes: usize,
    /// The highest packet number that came on each path (data, probes, closes), to refuse
    /// replayed closes.
    highest_received: BTreeMap<PathId, u64>,
}

/// What [`Endpoint::handle_datagram`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// A data segment, an ACK or a probe, taken by its half.
    Packet,
    /// The peer closed the path the datagram came on; both halves forgot it.
    PathClosed(PathId),
}

impl Endpoint {
    /// An endpoint with no paths.
    pub fn new(config: SessionConfig) -> Self {
        Self {
            sender: Sender::new(config),
            receiver: Receiver::new(config),
            mtu_bytes: config.mtu_bytes,
            highest_received: BTreeMap::new(),
        }
    }

    /// The session payload a data packet carries at most (the settings' `mtu_bytes`).
    pub fn mtu_bytes(&self) -> usize {
        self.mtu_bytes
    }

    /// Handles a datagram that arrived on `path`. A close removes the path from both halves (the
    /// sender stops probing it at once); one for a path this end does not have, or numbered no
    /// higher than a packet that came on the path before it, is refused and changes nothing.
    pub fn handle_datagram(
        &mut self,
        path: PathId,
        datagram: Bytes,
        now: Instant,
    ) -> Result<Handled, SessionError> {
        let packet = Packet::decode(datagram, self.mtu_bytes)?;
        let numbered = match &packet {
            Packet::Data(data) => Some(data.packet_number),
            Packet::Probe { packet_number } | Packet::Close { packet_number } => {
                Some(*packet_number)
            }
            Packet::Ack(_) => None,
        };
        if let Packet::Close { packet_number } = packet {
            if !self.sender.has_path(path) {
                return Err(SessionError::CloseUnknownPath(path));
            }
            if let Some(&seen) = self.highest_received.get(&path) {
                if packet_number <= seen {
                    return Err(SessionError::ReplayedClose {
                        path,
                        packet_number,
                        seen,
                    });
                }
            }
            self.remove_path(path);
            // Kept past the removal: the same close replayed once the path is back is refused.
            self.highest_received.insert(path, packet_number);
            return Ok(Handled::PathClosed(path));
        }
        match packet {
            Packet::Ack(ack) => self.sender.handle_ack(path, ack, now)?,
            other => self.receiver.handle_packet(path, other, now)?,
        }
        if let Some(number) = numbered {
            let highest = self.highest_received.entry(path).or_insert(number);
            *highest = (*highest).max(number);
        }
        Ok(Handled::Packet)
    }

    /// The next datagram to send: ACKs first, then data.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.receiver
            .poll_transmit(now)
            .or_else(|| self.sender.poll_transmit(now))
    }

    /// When to call [`Endpoint::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.sender.poll_timeout(), self.receiver.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.sender.handle_timeout(now);
    }

    /// Adds a path to both halves.
    pub fn add_path(&mut self, path: PathId) {
        self.sender.add_path(path, None);
    }

    /// Removes a path from both halves.
    pub fn remove_path(&mut self, path: PathId) {
        self.sender.remove_path(path);
        self.receiver.remove_path(path);
    }

    /// Removes a path from both halves and returns the close to send on it, which tells the peer
    /// to stop sending and probing there; `None` if this end did not have the path.
    pub fn close_path(&mut self, path: PathId) -> Option<Transmit> {
        if !self.sender.has_path(path) {
            return None;
        }
        let packet_number = self.sender.take_packet_number();
        self.remove_path(path);
        Some(Transmit {
            path,
            payload: Packet::Close { packet_number }.encode(),
        })
    }
}
