//! NCP's loss recovery and scheduling, shared by the classic and NKP-0024 window rules: per-connection RTOs moved per ACK, timeouts checked every 50 ms, a session-wide resend queue, round-robin connections and a pause after a send error.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use super::super::rtt::RttEstimator;
use super::super::sender::{Core, InFlight, PathState};
use super::super::{PathId, SessionConfig, Transmit};
use super::WindowPolicy;

/// NCP checks for timed-out packets every 50 ms (`CheckTimeoutInterval`).
const TIMEOUT_CHECK: Duration = Duration::from_millis(50);
/// NCP's largest retransmission timeout (`MaxRetransmissionTimeout`).
const MAX_RTO: Duration = Duration::from_secs(10);
/// NCP's smallest connection window (`MinConnectionWindowSize`).
pub(super) const MIN_WINDOW_PACKETS: f64 = 1.0;
/// How long an NCP connection whose window is full waits before it looks at the resend queue
/// again (ncp-go `maxWait`, used by `Connection.waitForSendWindow`).
const MAX_WAIT: Duration = Duration::from_secs(1);

/// How an NCP variant sizes its connections' windows; owns the windows.
pub(super) trait NcpWindows: fmt::Debug + Send {
    /// A path was added (or re-added), starting at `initial_window_packets` if given.
    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>);

    /// A path was removed.
    fn remove_path(&mut self, path: PathId);

    /// The path's window in packets.
    fn window_packets(&self, path: PathId) -> f64;

    /// A packet of `path` that was not resent was acknowledged.
    fn on_acked(&mut self, path: PathId);

    /// An ACK credited packets on at least one path.
    fn on_progress(&mut self);

    /// A packet of `path` timed out.
    fn on_timed_out(&mut self, path: PathId);

    /// The transport refused a datagram on `path`.
    fn on_send_error(&mut self, path: PathId);
}

/// Halves a window, down to NCP's smallest.
pub(super) fn halve(window_packets: f64) -> f64 {
    (window_packets / 2.0).max(MIN_WINDOW_PACKETS)
}

/// NCP's state of one connection beyond its window.
#[derive(Debug)]
struct Connection {
    /// NCP's own timeout, adjusted per ACK.
    rto: Duration,
    /// The connection's send loop is parked waiting for window (ncp-go
    /// `Connection.waitForSendWindow`) and looks at the resend queue again only then (its
    /// `maxWait`), unless an ACK frees window first. `None`: at the top of the loop.
    parked_until: Option<Instant>,
}

/// NCP with the window rules `W`.
#[derive(Debug)]
pub(super) struct Ncp<W> {
    windows: W,
    connections: BTreeMap<PathId, Connection>,
    initial_rto: Duration,
    send_error_pause: Duration,
    next_timeout_check: Option<Instant>,
    round_robin: usize,
}

impl<W: NcpWindows> Ncp<W> {
    pub(super) fn new(config: &SessionConfig, windows: W) -> Self {
        Self {
            windows,
            connections: BTreeMap::new(),
            initial_rto: config.ncp_initial_rto,
            send_error_pause: config.ncp_send_error_pause,
            next_timeout_check: None,
            round_robin: 0,
        }
    }

    /// Marks packets whose connection's RTO passed as timed out and queues them for resending;
    /// they stay in their connection's window until acknowledged.
    fn check_timeouts(&mut self, core: &mut Core, now: Instant) {
        let mut timed_out = Vec::new();
        for (&pn, info) in &core.in_flight {
            if info.timed_out {
                continue;
            }
            if let Some(connection) = self.connections.get(&info.path) {
                if info.sent_at + connection.rto <= now {
                    timed_out.push(pn);
                }
            }
        }
        timed_out.sort_unstable();
        for pn in timed_out {
            let Some(info) = core.in_flight.get_mut(&pn) else {
                continue;
            };
            info.timed_out = true;
            let (seq, id) = (info.seq, info.path);
            core.stats.timeouts += 1;
            core.retransmit.entry(seq).or_insert(None);
            self.windows.on_timed_out(id);
        }
    }
}

impl<W: NcpWindows> WindowPolicy for Ncp<W> {
    fn initial_rto(&self) -> Duration {
        self.initial_rto
    }

    fn add_path(&mut self, path: PathId, initial_window_packets: Option<f64>) {
        self.windows.add_path(path, initial_window_packets);
        self.connections.insert(
            path,
            Connection {
                rto: self.initial_rto,
                parked_until: None,
            },
        );
    }

    fn remove_path(&mut self, path: PathId) {
        self.connections.remove(&path);
        self.windows.remove_path(path);
    }

    fn window_packets(&self, _: &Core, path: PathId) -> f64 {
        self.windows.window_packets(path)
    }

    fn rto(&self, _: &Core, path: PathId) -> Duration {
        self.connections
            .get(&path)
            .map_or(self.initial_rto, |connection| connection.rto)
    }

    fn delivery_rate_packets_per_sec(&self, _: PathId) -> Option<f64> {
        None
    }

    fn loss_rate(&self, _: PathId) -> f64 {
        0.0
    }

    fn block_path_until(&mut self, _: PathId, _: Instant) {}

    fn credits_every_copy(&self) -> bool {
        true
    }

    fn on_echo(&mut self, _: &mut Core, _: PathId, _: u64, _: Instant) {}

    fn on_left_flight(&mut self, _: u64, _: &InFlight) {}

    /// One more packet of window per ACK of a packet that was not resent, and the RTO moves
    /// toward three RTTs by at most 100 ms per ACK.
    fn on_acked(
        &mut self,
        rtt: &mut RttEstimator,
        info: &InFlight,
        ack_path: PathId,
        now: Instant,
    ) {
        if !info.timed_out {
            self.windows.on_acked(info.path);
        }
        // ncp-go `Connection.ReceiveAck` (NKP-0024 era): only the connection the ACK came back on
        // moves its RTO, by the time since it first sent the packet.
        if info.path != ack_path {
            return;
        }
        let sample = now.saturating_duration_since(info.sent_at);
        rtt.update(sample);
        let Some(connection) = self.connections.get_mut(&info.path) else {
            return;
        };
        let rto = connection.rto.as_secs_f64();
        let step = ((3.0 * sample.as_secs_f64() - rto) / 1.0).tanh() * 0.1;
        connection.rto = Duration::from_secs_f64((rto + step).max(0.001)).min(MAX_RTO);
    }

    fn on_acks_end(&mut self, _: &mut Core, progressed: &BTreeSet<PathId>, _: Instant) {
        if !progressed.is_empty() {
            self.windows.on_progress();
        }
    }

    fn on_lost(&mut self, _: u64, _: &InFlight, _: bool) {}

    /// NCP pauses the connection for its configured time (the packet is queued for resending).
    fn on_send_error(&mut self, core: &mut Core, path: PathId, now: Instant) {
        core.pause(path, now + self.send_error_pause);
        self.windows.on_send_error(path);
    }

    fn poll_transmit(&mut self, core: &mut Core, now: Instant) -> Option<Transmit> {
        if self.next_timeout_check.is_none() {
            self.next_timeout_check = Some(now + TIMEOUT_CHECK);
        }
        let ids: Vec<PathId> = core.paths.keys().copied().collect();
        for offset in 0..ids.len() {
            let id = ids[(self.round_robin + offset) % ids.len()];
            let path = core.paths.get(&id)?;
            if path.state == PathState::Paused || path.is_blocked(now) {
                continue;
            }
            let connection = self.connections.get_mut(&id)?;
            // ncp-go `Connection.tx`: at the top of its loop (after each send, or when `maxWait`
            // ends a wait for window) a connection takes from the session-wide resend queue
            // without window; otherwise it waits until its window has room
            // (`waitForSendWindow`: used < windowSize) and then takes a resend or new data.
            let has_room = f64::from(path.in_flight_packets) < self.windows.window_packets(id);
            let at_top = connection.parked_until.is_none_or(|until| until <= now);
            let seq = if (at_top || has_room) && !core.retransmit.is_empty() {
                let (&seq, _) = core.retransmit.iter().next()?;
                core.retransmit.remove(&seq);
                Some(seq)
            } else if has_room && core.may_send_new() {
                None
            } else {
                if !has_room && at_top {
                    // Parks for `maxWait`, on the schedule it started.
                    let mut until = connection.parked_until.unwrap_or(now);
                    while until <= now {
                        until += MAX_WAIT;
                    }
                    connection.parked_until = Some(until);
                }
                continue;
            };
            self.round_robin = (self.round_robin + offset + 1) % ids.len();
            if seq.is_some() {
                core.stats.retransmissions += 1;
            }
            let transmit = core.send_segment(id, seq, now)?;
            connection.parked_until = None;
            return Some(transmit);
        }
        None
    }

    fn poll_timeout(&self, core: &Core) -> Option<Instant> {
        let parked = self
            .connections
            .values()
            .filter(|_| !core.retransmit.is_empty())
            .filter_map(|connection| connection.parked_until);
        parked.chain(self.next_timeout_check).min()
    }

    fn handle_timeout(&mut self, core: &mut Core, now: Instant) {
        if self.next_timeout_check.is_some_and(|at| at <= now) {
            // Checks run every 50 ms while anything is in flight, as NCP's loop does.
            self.next_timeout_check = (!core.in_flight.is_empty()).then_some(now + TIMEOUT_CHECK);
            self.check_timeouts(core, now);
        }
    }
}
