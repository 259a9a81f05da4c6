//! The window policy: how large each path's window is, how segments are scheduled over the paths and how losses and timeouts change that, one implementation per policy.
//!
//! The [`super::Sender`] keeps what every policy shares (segmentation, the packets in flight,
//! ACK and selective-range processing, RTT estimation, loss detection by ACK evidence) in its
//! [`Core`] and hands the policy the events it decides on, in the manner of quinn-proto's
//! `congestion::Controller`. [`Policy`] names a policy and builds it.

mod classic;
mod meshwire;
mod ncp;
mod nkp24;

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use super::rtt::RttEstimator;
use super::sender::{Core, InFlight};
use super::{PathId, Policy, SessionConfig, Transmit};

/// Sizes windows and schedules segments for a [`super::Sender`]; owns its per-path state, which
/// holds an entry for exactly the sender's paths.
pub(super) trait WindowPolicy: fmt::Debug + Send {
    /// A path's RTO before its first RTT sample.
    fn initial_rto(&self) -> Duration;

    /// A path was added (or re-added, which starts it afresh), with the window it should start
    /// at if the caller chose one.
    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>);

    /// A path was removed; what it carried is declared lost next.
    fn remove_path(&mut self, path: PathId);

    /// The path's window in packets.
    fn window_packets(&self, core: &Core, path: PathId) -> f64;

    /// The path's retransmission timeout in force.
    fn rto(&self, core: &Core, path: PathId) -> Duration;

    /// The path's delivery-rate estimate, if the policy keeps one.
    fn delivery_rate_packets_per_sec(&self, path: PathId) -> Option<f64>;

    /// The policy's estimate of the fraction of the path's packets lost (0 if it keeps none).
    fn loss_rate(&self, path: PathId) -> f64;

    /// The transport takes nothing on `path` before `until`.
    fn block_path_until(&mut self, path: PathId, until: Instant);

    /// Whether an ACK credits every transmission of a segment in flight as delivered (else only
    /// the one that arrived).
    fn credits_every_copy(&self) -> bool;

    /// An ACK that arrived on `path` echoes transmission `echo` (still in flight or not).
    fn on_echo(&mut self, core: &mut Core, path: PathId, echo: u64, now: Instant);

    /// Transmission `pn` left flight without its own ACK (another copy, or a range, covered it).
    fn on_left_flight(&mut self, pn: u64, info: &InFlight);

    /// Transmission `info`, on a path that still exists, was credited as delivered by an ACK
    /// that arrived on `ack_path`; `rtt` is its path's estimator.
    fn on_acked(&mut self, rtt: &mut RttEstimator, info: &InFlight, ack_path: PathId, now: Instant);

    /// One ACK was processed; `progressed` are the paths with packets credited.
    fn on_acks_end(&mut self, core: &mut Core, progressed: &BTreeSet<PathId>, now: Instant);

    /// Transmission `pn` was declared lost; `by_evidence`: ACKs showed its path lost it (a refused
    /// send, a removed path or an RTO says nothing about the loss rate).
    fn on_lost(&mut self, pn: u64, info: &InFlight, by_evidence: bool);

    /// The transport refused a datagram on `path` (the packet was declared lost already).
    fn on_send_error(&mut self, core: &mut Core, path: PathId, now: Instant);

    /// The next datagram to send, if any may go now.
    fn poll_transmit(&mut self, core: &mut Core, now: Instant) -> Option<Transmit>;

    /// The policy's next timer.
    fn poll_timeout(&self, core: &Core) -> Option<Instant>;

    /// Runs the policy's timers due at `now`.
    fn handle_timeout(&mut self, core: &mut Core, now: Instant);
}

impl Policy {
    /// Builds the policy this names, for a sender with `config`.
    pub(super) fn build(self, config: &SessionConfig) -> Box<dyn WindowPolicy> {
        match self {
            Policy::Classic => Box::new(ncp::Ncp::new(config, classic::Classic::new(config))),
            Policy::Nkp24 => Box::new(ncp::Ncp::new(config, nkp24::Nkp24::new(config))),
            Policy::Meshwire => Box::new(meshwire::Meshwire::new(config)),
        }
    }
}
