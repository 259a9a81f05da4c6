//! Accept HTTP connections under caps (total, per client address) and serve each with hyper.
//!
//! A connection over a cap is not simply dropped: it is answered `503 busy` with `Retry-After`
//! at once and closed, so the client learns to back off. Those answers are themselves
//! bounded ([`OVERFLOW_ANSWERS`] at once). An answered connection lingers up to a second,
//! reading what the client still sends, so that closing does not reset the answer away; when
//! every place is taken the lingering ones are told to close now and the new connection gets
//! the first place freed (waiting at most 10 ms). Only if none frees is it closed unanswered
//! (counted as `overflow`). Accept errors (such as running out of file descriptors) are counted as
//! `accept_error` and retried after a pause instead of spinning.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

use super::limits::{HttpLimits, TimedBody};
use super::parse_errors::ParseErrorIo;

/// Connections over a cap that are answered `503` at once; past it they are closed unanswered.
pub const OVERFLOW_ANSWERS: usize = 32;

/// How long a connection answered `503 busy` is read from (and its bytes dropped) before closing.
const BUSY_LINGER: Duration = Duration::from_secs(1);

/// How long the accept loop waits for a busy answer's place once all are taken, after asking
/// the lingering ones to end (they end at once; the wait only covers their wake-up).
const BUSY_PLACE_WAIT: Duration = Duration::from_millis(10);

/// Most bytes read and dropped from a connection answered `503 busy`.
const BUSY_DRAIN_BYTES: usize = 64 * 1024;

/// How long the accept loop pauses after an accept error (for example, no file descriptors left).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// File descriptors kept for everything but HTTP connections (store, sockets, logs, the runtime).
const RESERVED_DESCRIPTORS: u64 = 64;

/// The process's soft limit of open files, where the OS tells it without `unsafe` (Linux).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// `max_connections`, lowered so that admitted connections, the busy answers and the node's own
/// descriptors fit under the open-files limit: past it, accept fails and nobody is answered.
pub(crate) fn connection_cap(max_connections: usize) -> usize {
    let Some(limit) = open_files_limit() else {
        return max_connections;
    };
    let room = limit.saturating_sub(RESERVED_DESCRIPTORS + OVERFLOW_ANSWERS as u64);
    let room = usize::try_from(room).unwrap_or(usize::MAX).max(1);
    if room < max_connections {
        tracing::warn!(
            max_connections,
            open_files_limit = limit,
            effective = room,
            "HTTP max_connections lowered to fit the open-files limit (raise it with ulimit -n)"
        );
    }
    max_connections.min(room)
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    status: u16,
    error: &'static str,
}

/// The HTTP API's own metrics: refusals by reason, error answers by code, open connections.
#[derive(Debug, Clone, Default)]
pub struct HttpMetrics {
    refused: Family<ReasonLabel, Counter>,
    errors: Family<ErrorLabel, Counter>,
    connections: Gauge,
}

impl HttpMetrics {
    /// Registers `meshwire_http_refused_total{reason}`, `meshwire_http_errors_total{status,
    /// error}` and `meshwire_http_connections` on the node's registry.
    pub fn register(node: &meshwire::Node) -> Self {
        let metrics = Self::default();
        node.metrics().register_with(|registry| {
            registry.register(
                "http_refused",
                "HTTP connections and requests refused or cut off, by reason",
                metrics.refused.clone(),
            );
            registry.register(
                "http_errors",
                "HTTP error answers (4xx and 5xx), by status and error code",
                metrics.errors.clone(),
            );
            registry.register(
                "http_connections",
                "Open HTTP connections",
                metrics.connections.clone(),
            );
        });
        metrics
    }

    /// Counts one refusal for `reason`.
    pub fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts one error answer of `status` with code `error`.
    pub fn count_error(&self, status: u16, error: &'static str) {
        self.errors
            .get_or_create(&ErrorLabel { status, error })
            .inc();
    }

    /// Current value of `meshwire_http_errors_total{status, error}`.
    pub fn error_count(&self, status: u16, error: &'static str) -> u64 {
        self.errors
            .get_or_create(&ErrorLabel { status, error })
            .get()
    }

    /// Current value of `meshwire_http_refused_total{reason}`.
    pub fn refused_count(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&ReasonLabel { reason }).get()
    }
}

/// A request extension: notifying it closes the connection the request came on (the topic
/// routes cut a subscriber that stopped reading, whose bytes would otherwise sit in its socket).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionCut(pub Arc<Notify>);

/// Open connections per client address; a slot is given back when its guard drops.
#[derive(Debug, Default)]
struct ClientSlots {
    open: Mutex<HashMap<IpAddr, usize>>,
}

#[derive(Debug)]
struct ClientSlot {
    slots: Arc<ClientSlots>,
    address: IpAddr,
}

impl ClientSlots {
    fn take(self: &Arc<Self>, address: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(address).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            slots: self.clone(),
            address,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// What an admitted connection holds until it closes.
#[derive(Debug)]
struct Admission {
    _total: OwnedSemaphorePermit,
    _client: ClientSlot,
    connections: Gauge,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.connections.dec();
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// lets requests in flight finish for `limits.shutdown_grace` and cuts what is left.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Arc<HttpLimits>,
    metrics: HttpMetrics,
    shutdown: impl Future<Output = ()> + Send,
) {
    let total = Arc::new(Semaphore::new(connection_cap(limits.max_connections)));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    // Rings when every busy answer's place is taken: the answers already sent stop lingering.
    let preempt = Arc::new(Notify::new());
    let clients = Arc::new(ClientSlots::default());
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    metrics.refuse("accept_error");
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            () = &mut shutdown => break,
        };
        let admission = admit(&total, &clients, &limits, &metrics, remote);
        let admission = match admission {
            Ok(admission) => admission,
            Err(reason) => {
                metrics.refuse(reason);
                // Connections over a cap that send nothing would otherwise hold every place for
                // the whole linger, and the next client (an operator's /status) would be closed
                // unanswered: measured with bench/http-flood.sh, 20 of 20 such probes got no
                // answer once 96 silent connections were over the total cap.
                let permit = match overflow.clone().try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(_) => {
                        preempt.notify_waiters();
                        tokio::time::timeout(BUSY_PLACE_WAIT, overflow.clone().acquire_owned())
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                };
                match permit {
                    Some(permit) => {
                        tasks.spawn(answer_busy(stream, limits.clone(), preempt.clone(), permit));
                    }
                    None => metrics.refuse("overflow"),
                }
                continue;
            }
        };
        let cut = Arc::new(Notify::new());
        let service = {
            let router = router.clone();
            let limits = limits.clone();
            let metrics = metrics.clone();
            let cut = cut.clone();
            hyper::service::service_fn(move |request: Request<Incoming>| {
                let mut request =
                    request.map(|body| Body::new(TimedBody::new(body, &limits, metrics.clone())));
                request.extensions_mut().insert(ConnectionCut(cut.clone()));
                let router = router.clone();
                async move {
                    let response = router.oneshot(request).await;
                    Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
                }
            })
        };
        let (io, parse_errors) = ParseErrorIo::new(stream);
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        let metrics = metrics.clone();
        tasks.spawn(async move {
            let ended = tokio::select! {
                ended = connection => ended,
                () = cut.notified() => {
                    metrics.refuse("subscriber_cut");
                    tracing::debug!(%remote, "HTTP connection of a lagging subscriber cut");
                    Ok(())
                }
            };
            let parse_error = ended.as_ref().is_err_and(hyper::Error::is_parse);
            if let Err(error) = ended {
                if error.is_timeout() {
                    metrics.refuse("header_timeout");
                } else if parse_error {
                    metrics.refuse("bad_request");
                }
                tracing::debug!(%remote, %error, "HTTP connection ended");
            }
            parse_errors.answer(parse_error).await;
            drop(admission);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(
                grace = ?limits.shutdown_grace,
                "HTTP requests still running after the shutdown grace period are cut"
            );
        }
    }
    tasks.shutdown().await;
}

fn admit(
    total: &Arc<Semaphore>,
    clients: &Arc<ClientSlots>,
    limits: &HttpLimits,
    metrics: &HttpMetrics,
    remote: SocketAddr,
) -> Result<Admission, &'static str> {
    let permit = total
        .clone()
        .try_acquire_owned()
        .map_err(|_| "connection_limit")?;
    let client = clients
        .take(remote.ip(), limits.max_connections_per_client)
        .ok_or("client_connection_limit")?;
    metrics.connections.inc();
    Ok(Admission {
        _total: permit,
        _client: client,
        connections: metrics.connections.clone(),
    })
}

/// Answers `503 busy` on `stream` at once, without waiting for a request (a flood of idle
/// connections learns of the cap as fast as one that sends), then closes it. What the client
/// still sends is read and dropped for up to [`BUSY_LINGER`], so that closing does not reset the
/// connection before the client has read the answer.
async fn answer_busy(
    mut stream: TcpStream,
    limits: Arc<HttpLimits>,
    preempt: Arc<Notify>,
    _permit: OwnedSemaphorePermit,
) {
    let retry_after = limits.retry_after_secs();
    let body = super::errors::busy_json(retry_after).to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {retry_after}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let answer = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < BUSY_DRAIN_BYTES {
            let read = tokio::select! {
                read = stream.read(&mut sink) => read?,
                // Another connection needs this place: the answer is out, stop lingering.
                () = preempt.notified() => break,
            };
            if read == 0 {
                break;
            }
            drained += read;
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(BUSY_LINGER, answer).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_fits_under_the_open_files_limit() {
        assert_eq!(connection_cap(8), 8);
        if let Some(limit) = open_files_limit() {
            let cap = connection_cap(usize::MAX) as u64;
            let reserved = RESERVED_DESCRIPTORS + OVERFLOW_ANSWERS as u64;
            // A limit below the reserve still admits one connection.
            assert!(
                cap == 1 || cap + reserved <= limit,
                "cap {cap}, limit {limit}"
            );
        }
    }
}
