//! Carry one reliable, ordered byte stream over several paths at once, each path loaded in
//! proportion to what it delivers.
//!
//! # Design
//!
//! NKN's NCP (`seeds/001`) stripes a session over many connections. Each connection's window grows
//! by one per ACK and halves per timed-out packet; NKP-0024 removed the per-connection cap of 256 and
//! rescales all windows after every change so they sum to the session window (4 MiB / 1024 B = 4096
//! packets), so that each connection's share follows its throughput. It took about 10 s to converge,
//! found loss only by timeout (RTO starting at 5 s), and slept 1 s after a send error.
//!
//! This module is the sans-IO core: a [`Sender`] and a [`Receiver`] (and an [`Endpoint`] holding
//! one of each for a two-way session). The driver hands in datagrams with the [`PathId`] they came
//! on and `now`, drains [`Transmit`]s, and calls `handle_timeout` at `poll_timeout`.
//!
//! Messages ([`codec`]): `Data` (packet number, segment sequence number, FIN, ≤ MTU payload),
//! `Ack` (cumulative point, up to 32 selective ranges, the receiver's window end, the echoed packet
//! number) and `Probe`. Packet numbers are never reused, so every ACK names one transmission and RTT
//! samples are unambiguous (Karn's problem does not arise).
//!
//! Three window policies share the segmentation, SACK handling and receive window:
//!
//! * [`Policy::Classic`] — NCP before NKP-0024: window 16, +1 per ACK of a packet not resent,
//!   halved per timed-out packet, between 1 and 256 packets.
//! * [`Policy::Nkp24`] — NKP-0024: windows start at 4096 / n, have no cap, and are normalised to
//!   the session window after every change.
//!
//!   Both baselines keep NCP's own loss recovery: per-connection RTO starting at 5 s and moved by
//!   `tanh((3·rtt − rto) / 1 s) · 100 ms` per ACK, loss found only when a packet's RTO passes
//!   (checked every 50 ms), a session-wide resend queue that any connection drains first and
//!   without window, timed-out packets still counted in their connection's window until
//!   acknowledged, receiver ACKs batched per connection every 50 ms, and a 1 s pause after a send
//!   error.
//! * [`Policy::Meshwire`] — per-path delivery rate (ACK arrivals over the last 16 ACKs, windowed
//!   maximum over 2 s) and minimum RTT; window = 1.25 × rate × min RTT (one bandwidth-delay
//!   product in flight, a quarter of headroom); until an RTT sample shows a queue (1.25 × the
//!   minimum) or a loss, the window also grows by one per packet acknowledged from a first burst
//!   of 128 (startup), and before its own RTT is measured a path uses the shortest delay from
//!   sending to any ACK covering its packets (often a faster path's). Segments go to the path
//!   with the earliest expected arrival (a departure clock advanced by 1/rate per packet, or set
//!   by [`Sender::block_path_until`] when the transport says when the path frees up, plus half
//!   the min RTT); near the end of the
//!   data a slow path is left idle when the others would deliver the rest sooner. Loss is detected
//!   from ACKs (3 later packets on the same path acknowledged, or 9/8 RTT older than an
//!   acknowledged one) and retransmitted where it is expected first, each path's loss estimate
//!   (ACK evidence, a moving average over about 64 packets) counting against it; once no new data is
//!   left, idle paths carry copies of the unacknowledged segments most likely lost (tail copies, at
//!   most 3 transmissions of a segment in flight); RTO per RFC 6298 with a
//!   configurable floor. A path whose RTO fires is failed: its packets are retransmitted
//!   elsewhere and it carries only probes (at most every `max_probe_interval`) until one is
//!   answered, then it is re-admitted with its rate estimate.
//!
//! Limits: the receiver accepts segments only below `next unread + window`, so buffered bytes
//! never exceed `receive_window_bytes`; the sender holds at most `send_buffer_bytes` of written
//! and unacknowledged data; at most 32 ranges per ACK; payloads above the MTU are rejected.
//!
//! # Layout
//!
//! [`proto`] is the sans-IO session (sender, receiver, codec, route headers; always built: no
//! tokio, quinn, sockets or clock reads); [`net`] (default feature `net`) carries it in QUIC
//! datagrams of a [`meshwire::Node`], directly or through relay peers.

pub mod proto;

#[cfg(feature = "net")]
pub mod net;
