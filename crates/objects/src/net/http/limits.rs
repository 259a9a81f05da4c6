//! Bound what one HTTP client can hold: time to send headers and body, connections, requests.
//!
//! # Design
//!
//! A client that sends a request slowly, or never finishes it, holds a connection (a file
//! descriptor) and, for a PUT, a growing body buffer. The limits below close such a client out,
//! each for a counted reason (`meshwire_http_refused_total{reason}`):
//!
//! - `header_timeout`: the request head (line and headers) must arrive within
//!   [`HttpLimits::header_read_timeout`]. The same timer runs while a keep-alive connection waits
//!   for its next request, so idle connections are closed after it too.
//! - `body_idle`: no body bytes for [`HttpLimits::body_idle_timeout`] (an unfinished chunked
//!   body, a `Content-Length` larger than what is sent).
//! - `body_too_slow`: after [`HttpLimits::min_body_rate_grace`], the body must have arrived at
//!   [`HttpLimits::min_body_bytes_per_sec`] on average since the request began.
//! - `connection_limit`, `client_connection_limit`, `request_limit`, `body_budget`: over
//!   [`HttpLimits::max_connections`], [`HttpLimits::max_connections_per_client`],
//!   [`HttpLimits::max_concurrent_requests`] or [`HttpLimits::max_body_bytes_in_flight`], the
//!   request gets `503 busy` with `Retry-After`.
//!
//! Memory held by request bodies is at most [`HttpLimits::max_body_bytes_in_flight`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::serve::HttpMetrics;

/// Limits of the HTTP API. The defaults suit a node serving a few hundred clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time a client has to send a request's line and headers, and that an idle keep-alive
    /// connection is kept (default 10 s).
    pub header_read_timeout: Duration,
    /// Longest pause between two pieces of a request body (default 10 s).
    pub body_idle_timeout: Duration,
    /// Slowest average rate a request body may arrive at, once the grace period is over
    /// (default 64 KiB/s; 0 turns the check off).
    pub min_body_bytes_per_sec: u64,
    /// Time a request body may take before its rate is checked (default 5 s).
    pub min_body_rate_grace: Duration,
    /// Open connections in total (default 256); past it, a connection gets one `503` and is closed.
    /// Lowered at start, with a warning, when the open-files limit could not hold them together
    /// with the node's own descriptors.
    pub max_connections: usize,
    /// Open connections from one client IP address (default 32).
    pub max_connections_per_client: usize,
    /// Requests handled at once (default 64); past it, a request gets `503`.
    pub max_concurrent_requests: usize,
    /// Bytes of request bodies held at once (default 64 MiB, at least `max_object_bytes`). A
    /// request whose body is held whole (a PUT under 64 KiB, a topic message)
    /// reserves its `Content-Length` (the route's limit when chunked) before reading its body and
    /// keeps it until it is done; a PUT streamed into a content file reserves one 256 KiB piece.
    /// A request that does not fit gets `503 busy`.
    pub max_body_bytes_in_flight: usize,
    /// The `Retry-After` a `503 busy` carries (default 1 s, rounded up to whole seconds).
    pub retry_after: Duration,
    /// How long a shutdown lets requests in flight finish before cutting them (default 5 s).
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(10),
            min_body_bytes_per_sec: 64 * 1024,
            min_body_rate_grace: Duration::from_secs(5),
            max_connections: 256,
            max_connections_per_client: 32,
            max_concurrent_requests: 64,
            max_body_bytes_in_flight: 64 * 1024 * 1024,
            retry_after: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Limits that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// The named setting must be positive.
    #[error("invalid HTTP limits: {0} must be positive")]
    Zero(&'static str),
    /// The named setting is larger than a semaphore can count.
    #[error("invalid HTTP limits: {0} is too large")]
    TooLarge(&'static str),
    /// The body budget cannot hold one largest object.
    #[error(
        "invalid HTTP limits: max_body_bytes_in_flight ({budget}) must be at least \
         max_object_bytes ({max_object_bytes}), or the largest PUT could never be accepted"
    )]
    BodyBudget {
        /// `max_body_bytes_in_flight`.
        budget: usize,
        /// `max_object_bytes`.
        max_object_bytes: usize,
    },
}

impl HttpLimits {
    /// Checks that every bound lets at least something through, and that the body budget holds
    /// one object of `max_object_bytes`.
    pub fn validate_for(&self, max_object_bytes: usize) -> Result<(), LimitsError> {
        self.validate()?;
        if self.max_body_bytes_in_flight < max_object_bytes {
            return Err(LimitsError::BodyBudget {
                budget: self.max_body_bytes_in_flight,
                max_object_bytes,
            });
        }
        Ok(())
    }

    /// Checks that every bound lets at least something through.
    pub fn validate(&self) -> Result<(), LimitsError> {
        for (name, zero) in [
            ("header_read_timeout", self.header_read_timeout.is_zero()),
            ("body_idle_timeout", self.body_idle_timeout.is_zero()),
            ("max_connections", self.max_connections == 0),
            (
                "max_connections_per_client",
                self.max_connections_per_client == 0,
            ),
            ("max_concurrent_requests", self.max_concurrent_requests == 0),
            (
                "max_body_bytes_in_flight",
                self.max_body_bytes_in_flight == 0,
            ),
        ] {
            if zero {
                return Err(LimitsError::Zero(name));
            }
        }
        let most = tokio::sync::Semaphore::MAX_PERMITS;
        for (name, permits) in [
            ("max_connections", self.max_connections),
            ("max_concurrent_requests", self.max_concurrent_requests),
            (
                "max_body_bytes_in_flight",
                self.max_body_bytes_in_flight.div_ceil(1024),
            ),
        ] {
            if permits > most {
                return Err(LimitsError::TooLarge(name));
            }
        }
        Ok(())
    }

    /// `Retry-After` in whole seconds, at least 1.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        let millis = u64::try_from(self.retry_after.as_millis()).unwrap_or(u64::MAX);
        millis.div_ceil(1000).max(1)
    }
}

/// Why a request body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyTimeout {
    /// No body bytes arrived for the idle timeout.
    #[error("no request body bytes for {0:?}")]
    Idle(Duration),
    /// The body arrived slower than the minimum rate.
    #[error("request body slower than {0} bytes/s")]
    TooSlow(u64),
}

impl BodyTimeout {
    /// The reason counted in `meshwire_http_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Idle(_) => "body_idle",
            Self::TooSlow(_) => "body_too_slow",
        }
    }
}

/// A request body that fails with [`BodyTimeout`] when it pauses too long or arrives too slowly.
#[derive(Debug)]
pub(crate) struct TimedBody<B> {
    inner: B,
    idle_timeout: Duration,
    min_bytes_per_sec: u64,
    grace: Duration,
    started: Instant,
    last_progress: Instant,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    metrics: HttpMetrics,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(inner: B, limits: &HttpLimits, metrics: HttpMetrics) -> Self {
        let now = Instant::now();
        Self {
            inner,
            idle_timeout: limits.body_idle_timeout,
            min_bytes_per_sec: limits.min_body_bytes_per_sec,
            grace: limits.min_body_rate_grace,
            started: now,
            last_progress: now,
            received: 0,
            timer: None,
            metrics,
        }
    }

    /// When the body times out if nothing more arrives: idle, or behind the minimum rate.
    fn deadline(&self) -> Instant {
        let idle = self.last_progress + self.idle_timeout;
        if self.min_bytes_per_sec == 0 {
            return idle;
        }
        // The moment the average rate since the start falls below the minimum.
        let behind = Duration::from_secs_f64(self.received as f64 / self.min_bytes_per_sec as f64);
        idle.min(self.started + self.grace.max(behind))
    }

    fn expired(&self, now: Instant) -> BodyTimeout {
        if now >= self.last_progress + self.idle_timeout {
            BodyTimeout::Idle(self.idle_timeout)
        } else {
            BodyTimeout::TooSlow(self.min_bytes_per_sec)
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    this.last_progress = Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline();
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let timeout = this.expired(Instant::now());
                this.metrics.refuse(timeout.reason());
                Poll::Ready(Some(Err(Box::new(timeout))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The [`BodyTimeout`] somewhere in `error`'s source chain, if the body was cut off by one.
pub(crate) fn body_timeout(error: &(dyn std::error::Error + 'static)) -> Option<BodyTimeout> {
    wrapped::<BodyTimeout>(error).copied()
}

/// Whether `error`, or an error it wraps, is a body over the size limit it was read under.
pub(crate) fn over_length_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    wrapped::<http_body_util::LengthLimitError>(error).is_some()
}

/// The first `T` along `error`'s chain of sources, `error` itself included.
fn wrapped<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    std::iter::successors(Some(error), |error| error.source()).find_map(|e| e.downcast_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zero_bounds_are_not() {
        assert_eq!(HttpLimits::default().validate(), Ok(()));
        let limits = HttpLimits {
            max_connections: 0,
            ..HttpLimits::default()
        };
        assert_eq!(limits.validate(), Err(LimitsError::Zero("max_connections")));
        let limits = HttpLimits {
            max_concurrent_requests: usize::MAX,
            ..HttpLimits::default()
        };
        assert_eq!(
            limits.validate(),
            Err(LimitsError::TooLarge("max_concurrent_requests"))
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        for (millis, secs) in [(0, 1), (1, 1), (1000, 1), (1500, 2), (3000, 3)] {
            let limits = HttpLimits {
                retry_after: Duration::from_millis(millis),
                ..HttpLimits::default()
            };
            assert_eq!(limits.retry_after_secs(), secs, "{millis} ms");
        }
    }
}
