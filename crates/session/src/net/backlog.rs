//! How much a session keeps queued in quinn's datagram buffer per connection.

use std::time::Duration;

/// How long the driver waits after a datagram was refused (quinn's buffer full, no connection).
pub(super) const BUFFER_FULL_BACKOFF: Duration = Duration::from_millis(1);

/// The queue a session keeps in quinn's datagram buffer on one connection is at most this
/// fraction of the connection's congestion window (about an eighth of an RTT of sending, half
/// of the queue that ends the session's startup, an RTT sample 1.25 × the minimum), and at
/// least [`MIN_BACKLOG_TIME`] of sending and [`MIN_BACKLOG_BYTES`]. Enough that quinn finds the
/// next packets queued whenever its window opens: a queue quinn empties makes it
/// application-limited, and its controller then stops growing the window (measured: with only
/// two packets or 2 ms queued, `session-quic`'s 1%-loss direct path fell from 0.947 to 0.770 of
/// the ideal). Short enough that the session's RTT samples and its timers see the path: at
/// quinn's 1 MiB buffer the queue was seconds long, the session resent its packets elsewhere
/// and `direct+3-relays` sent 4 datagrams per one needed.
const BACKLOG_WINDOW_DIVISOR: u64 = 8;
/// See [`BACKLOG_WINDOW_DIVISOR`]: the driver's timer granularity, with a margin.
const MIN_BACKLOG_TIME: Duration = Duration::from_millis(2);
/// See [`BACKLOG_WINDOW_DIVISOR`]: two full-size packets.
const MIN_BACKLOG_BYTES: u64 = 2 * 1200;

/// How many more bytes a path may queue in quinn now (`<= 0`: none), and how long quinn needs
/// at its current rate (window over RTT) to send the excess (at least [`BUFFER_FULL_BACKOFF`],
/// at most one RTT).
pub(super) fn backlog_room(backlog: &meshwire::DatagramBacklog) -> (isize, Duration) {
    let rtt = backlog.rtt.as_secs_f64().max(1e-6);
    let rate = backlog.window_bytes.max(1) as f64 / rtt;
    let limit = (backlog.window_bytes / BACKLOG_WINDOW_DIVISOR)
        .max((rate * MIN_BACKLOG_TIME.as_secs_f64()) as u64)
        .max(MIN_BACKLOG_BYTES);
    let queued = backlog.queued_bytes as u64;
    let left = limit as isize - queued as isize;
    let excess = queued.saturating_sub(limit) + MIN_BACKLOG_BYTES;
    let wait = Duration::from_secs_f64(excess as f64 / rate)
        .clamp(BUFFER_FULL_BACKOFF, backlog.rtt.max(BUFFER_FULL_BACKOFF));
    (left, wait)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{backlog_room, BUFFER_FULL_BACKOFF, MIN_BACKLOG_BYTES};

    fn backlog(queued_bytes: usize, window_bytes: u64, rtt_ms: u64) -> meshwire::DatagramBacklog {
        meshwire::DatagramBacklog {
            queued_bytes,
            window_bytes,
            rtt: Duration::from_millis(rtt_ms),
        }
    }

    #[test]
    fn quinn_queue_is_kept_to_an_eighth_of_its_window() {
        // 800 KB window over 100 ms: 100 KB may wait in quinn.
        assert_eq!(backlog_room(&backlog(0, 800_000, 100)).0, 100_000);
        assert_eq!(backlog_room(&backlog(60_000, 800_000, 100)).0, 40_000);
        // Over the limit: none, and the wait is the time quinn takes to send the excess and
        // two more packets at 8 MB/s.
        let (left, wait) = backlog_room(&backlog(150_000, 800_000, 100));
        assert!(left < 0);
        let expected = (50_000 + MIN_BACKLOG_BYTES) as f64 / 8_000_000.0;
        assert!((wait.as_secs_f64() - expected).abs() < 1e-6, "{wait:?}");
    }

    #[test]
    fn a_small_window_still_keeps_two_packets_and_the_wait_is_bounded() {
        // 12 KB over 10 ms: an eighth is 1.5 KB, 2 ms is 2.4 KB, two packets 2.4 KB.
        assert_eq!(
            backlog_room(&backlog(0, 12_000, 10)).0,
            MIN_BACKLOG_BYTES as isize
        );
        // A full 1 MiB buffer behind a tiny window waits at most one RTT, at least the backoff.
        let (_, wait) = backlog_room(&backlog(1 << 20, 1, 50));
        assert_eq!(wait, Duration::from_millis(50));
        let (_, wait) = backlog_room(&backlog(MIN_BACKLOG_BYTES as usize + 1, 1 << 30, 1));
        assert_eq!(wait, BUFFER_FULL_BACKOFF);
    }
}
