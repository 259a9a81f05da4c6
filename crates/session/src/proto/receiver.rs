//! Reassemble the stream from segments arriving on any path, acknowledge them, bound memory.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use bytes::Bytes;

use super::ack::{AckSchedule, Owed};
use super::codec::{AckPacket, DataPacket, Packet, MAX_ACK_RANGES};
use super::{PathId, SessionConfig, SessionError, Transmit};

/// The receiving half of a session.
///
/// Segments are accepted only below `next_read_seq + window_segments`, so the bytes held (received
/// and not yet read by the application) never exceed the receive window.
///
/// The window starts at [`SessionConfig::receive_window_bytes`] and doubles, up to
/// [`SessionConfig::max_receive_window_bytes`], when a segment flagged window-limited (the sender
/// has more data and this window stops it within a round trip) arrives while the application
/// keeps up: the segments that arrived in order and wait to be read fill at most half the
/// window. A window that stops a sender whose receiver reads promptly is smaller than the paths'
/// bandwidth-delay product (plus the reordering between paths); one that stops a sender because
/// the application does not read stays as it is. A flag counts only on a segment the sender sent after it saw the last growth
/// (at or past the window end before it: the end only moves forward, so nothing there was
/// allowed before), so the window doubles at most once per round trip. It never shrinks:
/// segments sent into it stay acceptable. A sender that flags every segment gets the largest
/// window, no more.
#[derive(Debug)]
pub struct Receiver {
    window_segments: u64,
    max_window_segments: u64,
    /// The window end right before the last growth; a window-limited flag below it is stale.
    grown_from: u64,
    /// Times the window doubled.
    window_growths: u64,
    /// Every segment below this was read by the application.
    next_read_seq: u64,
    /// Bytes of the first unread segment already read.
    read_offset: usize,
    /// Received, unread segments.
    buffered: BTreeMap<u64, Bytes>,
    buffered_bytes: usize,
    /// Every segment below this arrived.
    contiguous_end: u64,
    /// Received ranges above `contiguous_end`: start to exclusive end.
    above: BTreeMap<u64, u64>,
    fin_seq: Option<u64>,
    /// ACKs owed now: echoes of arrivals and probes, window updates.
    owed: Vec<Owed>,
    /// When data segments are acknowledged.
    acks: Box<dyn AckSchedule>,
    /// The window end last advertised, to decide when reading deserves a window update.
    advertised_window_end: u64,
    paths: BTreeSet<PathId>,
    duplicates: u64,
}

impl Receiver {
    /// A receiver expecting segment 0.
    pub fn new(config: SessionConfig) -> Self {
        let window_segments = config.window_segments();
        Self {
            window_segments,
            max_window_segments: config.max_window_segments(),
            grown_from: 0,
            window_growths: 0,
            next_read_seq: 0,
            read_offset: 0,
            buffered: BTreeMap::new(),
            buffered_bytes: 0,
            contiguous_end: 0,
            above: BTreeMap::new(),
            fin_seq: None,
            owed: Vec::new(),
            acks: config.policy.ack_schedule(),
            advertised_window_end: window_segments,
            paths: BTreeSet::new(),
            duplicates: 0,
        }
    }

    fn window_end(&self) -> u64 {
        self.next_read_seq + self.window_segments
    }

    /// Handles a decoded data segment or probe that arrived on `path`.
    pub fn handle_packet(
        &mut self,
        path: PathId,
        packet: Packet,
        now: Instant,
    ) -> Result<(), SessionError> {
        self.paths.insert(path);
        match packet {
            Packet::Probe { packet_number } => {
                self.owed.push((path, Some(packet_number)));
                Ok(())
            }
            Packet::Data(data) => self.handle_data(path, data, now),
            Packet::Ack(_) | Packet::Close { .. } => Err(SessionError::UnexpectedPacket),
        }
    }

    fn handle_data(
        &mut self,
        path: PathId,
        data: DataPacket,
        now: Instant,
    ) -> Result<(), SessionError> {
        let seq = data.seq;
        if seq >= self.window_end() {
            return Err(SessionError::BeyondWindow {
                seq,
                window_end: self.window_end(),
            });
        }
        if let Some(fin) = self.fin_seq {
            if seq > fin || (data.fin && seq != fin) {
                return Err(SessionError::BeyondFin { seq, fin });
            }
        }
        if data.fin {
            self.fin_seq = Some(seq);
        }
        if data.window_limited {
            self.grow_window(seq);
        }
        let fresh = seq >= self.contiguous_end && !self.in_above(seq);
        if fresh {
            self.buffered_bytes += data.payload.len();
            self.buffered.insert(seq, data.payload);
            self.mark_received(seq);
        } else {
            self.duplicates += 1;
        }
        self.acks
            .on_segment(&mut self.owed, path, seq, data.packet_number, now);
        Ok(())
    }

    /// Doubles the window (up to the largest) for a window-limited segment `seq`, if the sender
    /// sent it after seeing the last growth and the application keeps up, and announces it at
    /// once.
    fn grow_window(&mut self, seq: u64) {
        let waiting_in_order = self.contiguous_end.saturating_sub(self.next_read_seq);
        if seq < self.grown_from
            || self.window_segments >= self.max_window_segments
            || waiting_in_order > self.window_segments / 2
        {
            return;
        }
        self.grown_from = self.window_end();
        self.window_segments = (2 * self.window_segments).min(self.max_window_segments);
        self.window_growths += 1;
        self.announce_window();
    }

    /// Owes a window update on every path that carried data (one of them is bound to work).
    fn announce_window(&mut self) {
        self.advertised_window_end = self.window_end();
        for &path in &self.paths {
            self.owed.push((path, None));
        }
    }

    fn in_above(&self, seq: u64) -> bool {
        self.above
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &end)| seq < end)
    }

    fn mark_received(&mut self, seq: u64) {
        let mut start = seq;
        let mut end = seq + 1;
        if let Some((&before, &before_end)) = self.above.range(..seq).next_back() {
            if before_end == seq {
                start = before;
                self.above.remove(&before);
            }
        }
        if let Some(after_end) = self.above.remove(&end) {
            end = after_end;
        }
        if start == self.contiguous_end {
            self.contiguous_end = end;
        } else {
            self.above.insert(start, end);
        }
    }

    fn ack(&self, echo: Option<u64>, pending: Option<&BTreeSet<u64>>) -> AckPacket {
        let ranges: Vec<(u64, u64)> = match pending {
            // NCP acknowledges the segments this connection carried, coalesced into ranges.
            Some(pending) => {
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                for &seq in pending.range(self.contiguous_end + 1..) {
                    if let Some(last) = ranges.last_mut().filter(|last| last.1 == seq) {
                        last.1 += 1;
                    } else if ranges.len() == MAX_ACK_RANGES {
                        break;
                    } else {
                        ranges.push((seq, seq + 1));
                    }
                }
                ranges
            }
            // The lowest holes matter for retransmission, the highest ranges for progress.
            None if self.above.len() <= MAX_ACK_RANGES => {
                self.above.iter().map(|(&s, &e)| (s, e)).collect()
            }
            None => {
                let half = MAX_ACK_RANGES / 2;
                let low = self.above.iter().take(half);
                let high = self.above.iter().skip(self.above.len() - half);
                low.chain(high).map(|(&s, &e)| (s, e)).collect()
            }
        };
        AckPacket {
            echo,
            cumulative: self.contiguous_end,
            window_end: self.window_end(),
            ranges,
        }
    }

    /// The next ACK to send, if one is owed now.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some((path, echo)) = self.owed.pop() {
            self.advertised_window_end = self.window_end();
            return Some(Transmit {
                path,
                payload: Packet::Ack(self.ack(echo, None)).encode(),
            });
        }
        let (path, (pending, due)) = self.acks.take_due(now)?;
        let ack = self.ack(None, Some(&pending));
        // At most MAX_ACK_RANGES ranges per ACK; the rest waits for the next.
        let rest: BTreeSet<u64> = pending
            .into_iter()
            .filter(|&seq| {
                seq > self.contiguous_end
                    && !ack
                        .ranges
                        .iter()
                        .any(|&(start, end)| (start..end).contains(&seq))
            })
            .collect();
        self.acks.put_back(path, (rest, due));
        self.advertised_window_end = self.window_end();
        Some(Transmit {
            path,
            payload: Packet::Ack(ack).encode(),
        })
    }

    /// When the receiver next needs [`Receiver::poll_transmit`] called without new input.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.acks.poll_timeout()
    }

    /// Copies in-order bytes into `out`; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let mut written = 0;
        while written < out.len() {
            let Some(chunk) = self.read_chunk(out.len() - written) else {
                break;
            };
            out[written..written + chunk.len()].copy_from_slice(&chunk);
            written += chunk.len();
        }
        written
    }

    /// The next in-order bytes, at most `max` of them, without copying.
    pub fn read_chunk(&mut self, max: usize) -> Option<Bytes> {
        loop {
            let segment = self.buffered.get(&self.next_read_seq)?;
            let rest = segment.slice(self.read_offset..);
            if rest.is_empty() {
                self.advance_read();
                continue;
            }
            let taken = rest.slice(..rest.len().min(max));
            self.read_offset += taken.len();
            self.buffered_bytes -= taken.len();
            if self.read_offset == segment.len() {
                self.advance_read();
            }
            return Some(taken);
        }
    }

    fn advance_read(&mut self) {
        self.buffered.remove(&self.next_read_seq);
        self.next_read_seq += 1;
        self.read_offset = 0;
        // Tell the sender about the space once a quarter of the window has opened.
        if self.window_end() >= self.advertised_window_end + self.window_segments / 4 {
            self.announce_window();
        }
    }

    /// The stream ended and every byte was read.
    pub fn is_finished(&self) -> bool {
        self.fin_seq
            .is_some_and(|fin| self.next_read_seq > fin && self.buffered.is_empty())
    }

    /// Bytes received and not yet read: never more than the window, and so never more than
    /// [`SessionConfig::max_receive_window_bytes`].
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// The receive window now, in segments.
    pub fn window_segments(&self) -> u64 {
        self.window_segments
    }

    /// Times the receive window doubled.
    pub fn window_growths(&self) -> u64 {
        self.window_growths
    }

    /// Segments that arrived more than once.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Forgets a path: no further window updates go to it.
    pub fn remove_path(&mut self, path: PathId) {
        self.paths.remove(&path);
        self.acks.remove_path(path);
        self.owed.retain(|&(owed, _)| owed != path);
    }
}
