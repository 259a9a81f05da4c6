//! The task that runs one session: it sends what the sans-IO endpoint emits (keeping quinn's
//! queue short and, with `claim_window`, claiming the session's windows on its connections),
//! feeds it arrivals and timers, and ends once the session is dropped and done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshwire::congestion::DatagramAllowance;
use meshwire::{protocols, DatagramError, Node};
use meshwire_proto::PeerId;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::backlog::{backlog_room, BUFFER_FULL_BACKOFF};
use super::{lock, Arrival, HostInner, Shared, Via};
use crate::proto::codec;
use crate::proto::route::{Route, RouteHeader, RELAYED_HEADER_LEN};
use crate::proto::{Handled, PathId, Transmit};

/// Runs one session: sends what the endpoint emits, feeds it arrivals and timers.
pub(super) async fn drive(
    host: Arc<HostInner>,
    peer: PeerId,
    id: u64,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    mut arrivals: mpsc::Receiver<Arrival>,
) {
    let mut dropped_at: Option<Instant> = None;
    loop {
        // One clock reading per turn of the loop: what is sent, the linger and the retry.
        let now = Instant::now();
        let (deadline, blocked) = {
            let mut guard = lock(&shared);
            let blocked = flush(
                &host.node,
                peer,
                id,
                &mut guard,
                now.into_std(),
                host.settings.claim_window,
            );
            guard.wake_all();
            if guard.dropped {
                let since = *dropped_at.get_or_insert(now);
                if guard.endpoint.sender.is_idle()
                    || now.saturating_duration_since(since) >= host.settings.linger
                {
                    break;
                }
            }
            // Claims an idle session still holds are looked at again when their grace ends
            // (`claim_windows`); one with data to send keeps them.
            let claims_end = (guard.endpoint.sender.is_idle()
                && guard.claims.values().any(|claim| claim.bytes() > 0))
            .then_some(guard.last_activity)
            .flatten()
            .map(|at| at + CLAIM_IDLE_GRACE);
            let timeout = match (guard.endpoint.poll_timeout(), claims_end) {
                (Some(at), Some(end)) => Some(at.min(end)),
                (at, end) => at.or(end),
            };
            (timeout, blocked)
        };
        let deadline = match (deadline.map(Instant::from_std), blocked) {
            (deadline, true) => {
                let retry = now + BUFFER_FULL_BACKOFF;
                Some(deadline.map_or(retry, |at| at.min(retry)))
            }
            (deadline, false) => deadline,
        };
        let timer = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            arrival = arrivals.recv() => {
                let Some(arrival) = arrival else { break };
                let mut guard = lock(&shared);
                let now = Instant::now().into_std();
                handle_arrival(&mut guard, arrival, now);
                while let Ok(arrival) = arrivals.try_recv() {
                    handle_arrival(&mut guard, arrival, now);
                }
            }
            () = wake.notified() => {}
            () = timer => {
                lock(&shared).endpoint.handle_timeout(Instant::now().into_std());
            }
        }
    }
    lock(&shared).claims.clear();
    let mut sessions = lock(&host.sessions);
    sessions.remove(&(peer, id));
}

fn handle_arrival(shared: &mut Shared, arrival: Arrival, now: std::time::Instant) {
    shared.stats.datagrams_received += 1;
    shared.last_activity = Some(now);
    match shared.paths.get(&arrival.path) {
        Some(via) if *via == arrival.via => {}
        Some(_) => {
            // The same path id over a different route: the other end re-added it elsewhere.
            shared.paths.insert(arrival.path, arrival.via);
        }
        // A close never teaches a path: it is for one this end has, or it is refused.
        None if shared.learns_paths && !codec::is_close(&arrival.packet) => {
            shared.paths.insert(arrival.path, arrival.via);
            shared.endpoint.add_path(arrival.path);
        }
        None => {
            shared.stats.unknown_path += 1;
            return;
        }
    }
    match shared
        .endpoint
        .handle_datagram(arrival.path, arrival.packet, now)
    {
        Ok(Handled::Packet) => {}
        Ok(Handled::PathClosed(path)) => {
            shared.paths.remove(&path);
            shared.stats.paths_closed_by_peer += 1;
        }
        Err(error) => {
            shared.stats.rejected += 1;
            tracing::debug!(%error, "session packet rejected");
        }
    }
}

/// Sends everything the endpoint has to send; returns whether a datagram was refused.
fn flush(
    node: &Node,
    peer: PeerId,
    id: u64,
    shared: &mut Shared,
    now: std::time::Instant,
    claim_window: bool,
) -> bool {
    if claim_window {
        claim_windows(node, peer, id, shared, now);
    }
    // What each path may still hand quinn before its queue there is long enough (see
    // `backlog_room`); a path with no room is blocked until quinn has sent the excess.
    let mut room: HashMap<PathId, isize> = HashMap::new();
    for (&path, &via) in &shared.paths {
        let (to, _) = route_header(peer, id, path, via);
        if let Some(backlog) = node.datagram_backlog(to) {
            let (left, wait) = backlog_room(&backlog);
            if left <= 0 {
                shared.endpoint.sender.block_path_until(path, now + wait);
            }
            room.insert(path, left);
        }
    }
    while let Some(transmit) = shared.endpoint.poll_transmit(now) {
        let Some(&via) = shared.paths.get(&transmit.path) else {
            shared.stats.send_failed += 1;
            continue;
        };
        let (to, header) = route_header(peer, id, transmit.path, via);
        let datagram = header.encode_with(&transmit.payload);
        let len = datagram.len();
        match node.send_datagram(to, protocols::SESSION_DATAGRAM, datagram) {
            Ok(()) => {
                shared.stats.datagrams_sent += 1;
                shared.last_activity = Some(now);
                if let Some(left) = room.get_mut(&transmit.path) {
                    *left -= len as isize;
                    if *left <= 0 {
                        let wait = node
                            .datagram_backlog(to)
                            .map_or(BUFFER_FULL_BACKOFF, |backlog| backlog_room(&backlog).1);
                        shared
                            .endpoint
                            .sender
                            .block_path_until(transmit.path, now + wait);
                    }
                }
            }
            Err(error) => {
                shared
                    .endpoint
                    .sender
                    .handle_send_error(transmit.path, &transmit, now);
                if error == DatagramError::BufferFull {
                    shared.stats.send_buffer_full += 1;
                } else {
                    shared.stats.send_failed += 1;
                }
                // The scheduler could pick the same path again at once: retry after a pause.
                return true;
            }
        }
    }
    false
}

/// Sends the close of a path this end removed, on the route the path took, at once: a relayed
/// path's relay forgets the path when asked next, and a close handed to quinn first leaves in the
/// same packet as that request or an earlier one (quinn writes datagrams before stream data). A
/// close is sent once, best effort: if it is lost, the other end's probes of the path go
/// unanswered and it fails the path by its RTO, as before closes existed.
pub(super) fn send_close(
    node: &Node,
    peer: PeerId,
    id: u64,
    shared: &mut Shared,
    close: &Transmit,
    via: Via,
) {
    let (to, header) = route_header(peer, id, close.path, via);
    match node.send_datagram(
        to,
        protocols::SESSION_DATAGRAM,
        header.encode_with(&close.payload),
    ) {
        Ok(()) => shared.stats.datagrams_sent += 1,
        Err(_) => shared.stats.send_failed += 1,
    }
}

/// Bytes a full session packet takes in a QUIC packet beyond its payload: the route header (at
/// most), the data header, and QUIC's short header, datagram frame and AEAD tag (about 30 B).
const PACKET_OVERHEAD_BYTES: u64 = (RELAYED_HEADER_LEN + codec::DATA_HEADER_LEN + 30) as u64;

/// How long a session with nothing to send keeps its claims after its last datagram, sent or
/// received. The receiving end claims too: its acknowledgements (one datagram per data packet)
/// cross the connection back, and held to quinn's starting window they delayed the sender's
/// samples (`session-quic`'s `direct+3-relays` with claims: 0.926 of the ideal at seeds 1–3,
/// 0.691–0.799 when only a sending session claimed).
const CLAIM_IDLE_GRACE: Duration = Duration::from_secs(1);

/// Claims, on each path's connection, the session's window on that path, so that the
/// connection's congestion window (meshwire's controller) does not hold back what the
/// session's own window lets out, nor the other end's acknowledgements. A session claims while
/// it has data to send and for [`CLAIM_IDLE_GRACE`] after its last datagram either way; then
/// nothing. A claim on a connection that has been replaced is dropped and made again on the
/// new one; a removed path's claim is dropped.
fn claim_windows(node: &Node, peer: PeerId, id: u64, shared: &mut Shared, now: std::time::Instant) {
    let packet_bytes = shared.endpoint.mtu_bytes() as u64 + PACKET_OVERHEAD_BYTES;
    let active = !shared.endpoint.sender.is_idle()
        || shared
            .last_activity
            .is_some_and(|at| now.saturating_duration_since(at) < CLAIM_IDLE_GRACE);
    let windows: HashMap<PathId, f64> = shared
        .endpoint
        .sender
        .paths()
        .filter(|_| active)
        .map(|(path, stats)| (path, stats.window_packets))
        .collect();
    let Shared { paths, claims, .. } = shared;
    claims.retain(|path, _| paths.contains_key(path));
    for (&path, &via) in paths.iter() {
        let (to, _) = route_header(peer, id, path, via);
        let Some(cell) = node.datagram_allowance(to) else {
            claims.remove(&path);
            continue;
        };
        let claim = match claims.get_mut(&path) {
            Some(claim) if cell.holds(claim) => claim,
            _ => {
                claims.insert(path, DatagramAllowance::new(cell));
                claims.get_mut(&path).expect("just inserted")
            }
        };
        let window = windows.get(&path).copied().unwrap_or(0.0).max(0.0);
        claim.set((window * packet_bytes as f64) as u64);
    }
}

/// Where a datagram of session `id` on `path` goes, and its route header.
fn route_header(peer: PeerId, id: u64, path: PathId, via: Via) -> (PeerId, RouteHeader) {
    let (to, route) = match via {
        Via::Direct => (peer, Route::Direct),
        Via::Relay(relay) => (relay, Route::ToRelay { destination: peer }),
    };
    let header = RouteHeader {
        session: id,
        path: path.0,
        route,
    };
    (to, header)
}
