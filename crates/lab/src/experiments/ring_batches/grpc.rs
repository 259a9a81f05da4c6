//! The ring on real gRPC: the baselines `grpc-unary-64k` and `grpc-stream` of the xx-team
//! scenario (`docs/lessons.md`).
//!
//! Every host runs a tonic server over turmoil TCP and a tonic client to its successor in the
//! ring. There is no code generation: [`BytesCodec`] passes message bytes through and
//! `TeamService` routes paths to `tonic::server::Grpc` by hand, as generated code does, so the
//! wire is ordinary gRPC over HTTP/2 (length-prefixed messages, HEADERS/DATA frames, trailers,
//! HTTP/2 flow control).
//! - `grpc-unary-64k`: one unary call per batch and hop carrying the whole batch; HTTP/2 stream and
//!   connection windows pinned at 65 535 bytes on client and server (what the xx network ran
//!   first). The node computes once it has the whole batch, then forwards it.
//! - `grpc-stream`: one client-streaming call per batch and hop, one message per payload, tonic and
//!   hyper defaults for everything. A node computes at the first message and then forwards each
//!   message as it arrives, as meshwire's pipeline does.
//!
//! Batches go round the ring one at a time; each node holds its one "CPU" for `compute_ms` per
//! batch and adds one to every byte, so `n0` checks that every byte came back `+N`.
//! The ring ping is a tiny unary call forwarded round the ring, like the xx network's
//! "Round Trip Ping". turmoil's TCP has latency but no bandwidth, so every connection goes through
//! [`crate::tcp_link::PacedTcp`]: each direction of each host pair serializes its bytes at the
//! case's link rate (4 ms per 4 Mbit at 1 Gbit/s), as meshwire's UDP links do, and the baselines
//! pay serialization and the HTTP/2 window round trips. The links' jitter delays TCP's segments as
//! it delays datagrams, and each connection sends by TCP's rules (window, slow start, CUBIC, the
//! link's loss and its drop-tail queue, the restart after idle: [`crate::tcp_link::TcpFlow`]),
//! which turmoil's TCP lacks.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

use super::workload::{team_batch, team_metrics, Params, Workload};
use crate::lab::{clock, Lab, TICK};
use crate::scenario::{CaseFile, ScenarioError};
use crate::stats::Metrics;
use crate::tcp_link::{PacedTcp, TcpLinks};

/// TCP port of every host's gRPC server.
const GRPC_PORT: u16 = 50051;
/// HTTP/2's default initial window (RFC 9113 §6.9.2), which `grpc-unary-64k` keeps.
const WINDOW_64K: u32 = 65_535;
/// The request metadata key carrying a batch's round.
const ROUND_KEY: &str = "x-round";

const BATCH: &str = "/xx.Team/Batch";
const BATCH_STREAM: &str = "/xx.Team/BatchStream";
const HOP: &str = "/xx.Team/Hop";
const HOP_STREAM: &str = "/xx.Team/HopStream";
const PING: &str = "/xx.Team/Ping";

/// Which baseline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// One unary call per batch and hop, HTTP/2 windows at 64 KiB on both sides.
    Unary64k,
    /// One client-streaming call per batch and hop, tonic defaults.
    Stream,
}

impl Baseline {
    /// The baseline a policy name selects.
    pub fn from_policy(policy: &str) -> Option<Self> {
        match policy {
            "grpc-unary-64k" => Some(Self::Unary64k),
            "grpc-stream" => Some(Self::Stream),
            _ => None,
        }
    }

    /// The HTTP/2 stream and connection window both sides set (`None`: the library default).
    fn window(self) -> Option<u32> {
        match self {
            Self::Unary64k => Some(WINDOW_64K),
            Self::Stream => None,
        }
    }
}

/// Passes message bytes through unchanged: gRPC framing without protobuf.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        *self
    }

    fn decoder(&mut self) -> Self {
        *self
    }
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// A paced turmoil TCP stream the tonic server can accept.
#[derive(Debug)]
struct LabTcp(PacedTcp<turmoil::net::TcpStream>);

impl AsyncRead for LabTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for LabTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connected for LabTcp {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// What `n0`'s server tells its client loop.
#[derive(Debug)]
enum Arrival {
    /// Batch `round` came back round the ring with these bytes.
    Batch(u64, Bytes),
    /// Ring ping `sequence` came back.
    Ping(u64),
}

/// One ring member's gRPC side.
#[derive(Debug)]
struct Member {
    /// Position in the ring; 0 is the first node.
    index: usize,
    baseline: Baseline,
    compute_per_batch: Duration,
    /// The node's one CPU.
    cpu: tokio::sync::Mutex<()>,
    /// A lazily connected channel to the successor.
    next: Channel,
    /// `n0` only: batches and pings back from the ring.
    arrivals: Option<mpsc::UnboundedSender<Arrival>>,
    /// `n1` only: when each hop-measurement batch was whole.
    hops: Option<Arc<Mutex<Vec<Duration>>>>,
}

impl Member {
    fn client(&self) -> tonic::client::Grpc<Channel> {
        tonic::client::Grpc::new(self.next.clone())
    }

    /// Holds the CPU for one batch's compute.
    async fn compute(&self) {
        if !self.compute_per_batch.is_zero() {
            let _busy = self.cpu.lock().await;
            tokio::time::sleep(self.compute_per_batch).await;
        }
    }

    fn record_hop(&self) {
        if let Some(hops) = &self.hops {
            hops.lock().unwrap_or_else(|e| e.into_inner()).push(clock());
        }
    }

    fn arrive(&self, arrival: Arrival) {
        if let Some(arrivals) = &self.arrivals {
            // The client loop may have finished; late arrivals are then of no interest.
            let _ = arrivals.send(arrival);
        }
    }

    /// A whole batch arrived in one unary call: `n0` has it back, a relay computes and forwards.
    async fn on_batch(self: Arc<Self>, request: Request<Bytes>) -> Result<Bytes, Status> {
        let round = round_of(&request)?;
        let data = request.into_inner();
        if self.index == 0 {
            self.arrive(Arrival::Batch(round, data));
        } else {
            tokio::spawn(async move {
                self.compute().await;
                let mut client = self.client();
                if let Err(status) = send_unary(&mut client, BATCH, round, transform(&data)).await {
                    tracing::warn!(%status, round, "forwarding a batch failed");
                }
            });
        }
        Ok(Bytes::new())
    }

    /// A batch arrives message by message: `n0` collects it, a relay computes at the first
    /// message and forwards every message as it arrives.
    async fn on_batch_stream(
        self: Arc<Self>,
        request: Request<Streaming<Bytes>>,
    ) -> Result<Bytes, Status> {
        let round = round_of(&request)?;
        let mut inbound = request.into_inner();
        if self.index == 0 {
            let mut data = BytesMut::new();
            while let Some(message) = inbound.message().await? {
                data.extend_from_slice(&message);
            }
            self.arrive(Arrival::Batch(round, data.freeze()));
            return Ok(Bytes::new());
        }
        let Some(first) = inbound.message().await? else {
            return Err(Status::invalid_argument("empty batch"));
        };
        self.compute().await;
        let (sender, receiver) = mpsc::channel(64);
        let mut client = self.client();
        // The forward call lives on after this call has answered its sender.
        tokio::spawn(async move {
            let messages = ReceiverStream::new(receiver);
            if let Err(status) = send_stream(&mut client, BATCH_STREAM, round, messages).await {
                tracing::warn!(%status, round, "forwarding a batch failed");
            }
        });
        let mut message = Some(first);
        while let Some(chunk) = message {
            if sender.send(transform(&chunk)).await.is_err() {
                return Err(Status::unavailable("the forward call ended early"));
            }
            message = inbound.message().await?;
        }
        Ok(Bytes::new())
    }

    /// A ring ping: `n0` has it back, a relay forwards it at once.
    async fn on_ping(self: Arc<Self>, request: Request<Bytes>) -> Result<Bytes, Status> {
        let sequence = round_of(&request)?;
        if self.index == 0 {
            self.arrive(Arrival::Ping(sequence));
        } else {
            tokio::spawn(async move {
                let mut client = self.client();
                if let Err(status) = send_unary(&mut client, PING, sequence, Bytes::new()).await {
                    tracing::debug!(%status, sequence, "forwarding a ring ping failed");
                }
            });
        }
        Ok(Bytes::new())
    }
}

fn round_of<T>(request: &Request<T>) -> Result<u64, Status> {
    request
        .metadata()
        .get(ROUND_KEY)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .ok_or_else(|| Status::invalid_argument("missing or malformed round"))
}

/// A node's work on a chunk: every byte plus one (as the meshwire team's transform).
fn transform(data: &[u8]) -> Bytes {
    data.iter().map(|byte| byte.wrapping_add(1)).collect()
}

async fn send_unary(
    client: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    round: u64,
    message: Bytes,
) -> Result<(), Status> {
    client
        .ready()
        .await
        .map_err(|error| Status::unavailable(error.to_string()))?;
    let mut request = Request::new(message);
    request.metadata_mut().insert(ROUND_KEY, round.into());
    client
        .unary(request, PathAndQuery::from_static(path), BytesCodec)
        .await
        .map(|_| ())
}

async fn send_stream(
    client: &mut tonic::client::Grpc<Channel>,
    path: &'static str,
    round: u64,
    messages: impl tokio_stream::Stream<Item = Bytes> + Send + 'static,
) -> Result<(), Status> {
    client
        .ready()
        .await
        .map_err(|error| Status::unavailable(error.to_string()))?;
    let mut request = Request::new(messages);
    request.metadata_mut().insert(ROUND_KEY, round.into());
    client
        .client_streaming(request, PathAndQuery::from_static(path), BytesCodec)
        .await
        .map(|_| ())
}

/// Routes the team's methods to `tonic::server::Grpc`, as generated server code does.
#[derive(Debug, Clone)]
struct TeamService(Arc<Member>);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type UnaryHandler = fn(Arc<Member>, Request<Bytes>) -> BoxFuture<Result<Bytes, Status>>;

impl tower::Service<http::Request<tonic::body::Body>> for TeamService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let member = self.0.clone();
        Box::pin(async move {
            // A unary call carries a whole batch, larger than tonic's 4 MiB default limit for
            // sweeps' 20 MB batches: a team running unary calls would raise it, so the baseline does.
            let mut grpc =
                tonic::server::Grpc::new(BytesCodec).max_decoding_message_size(usize::MAX);
            let path = request.uri().path().to_string();
            let unary = |handler: UnaryHandler| {
                let member = member.clone();
                tower::service_fn(move |request| {
                    let reply = handler(member.clone(), request);
                    async move { reply.await.map(Response::new) }
                })
            };
            let response = match path.as_str() {
                BATCH => {
                    grpc.unary(unary(|m, r| Box::pin(m.on_batch(r))), request)
                        .await
                }
                PING => {
                    grpc.unary(unary(|m, r| Box::pin(m.on_ping(r))), request)
                        .await
                }
                HOP => {
                    let handler = unary(|m, _r| {
                        Box::pin(async move {
                            m.record_hop();
                            Ok(Bytes::new())
                        })
                    });
                    grpc.unary(handler, request).await
                }
                BATCH_STREAM => {
                    let handler = tower::service_fn(move |request| {
                        let member = member.clone();
                        async move { member.on_batch_stream(request).await.map(Response::new) }
                    });
                    grpc.client_streaming(handler, request).await
                }
                HOP_STREAM => {
                    let handler = tower::service_fn(move |request: Request<Streaming<Bytes>>| {
                        let member = member.clone();
                        async move {
                            let mut inbound = request.into_inner();
                            while inbound.message().await?.is_some() {}
                            member.record_hop();
                            Ok(Response::new(Bytes::new()))
                        }
                    });
                    grpc.client_streaming(handler, request).await
                }
                _ => Status::unimplemented(path).into_http(),
            };
            Ok(response)
        })
    }
}

/// How a member is set up: its place, the baseline, and the links its connections pace on.
struct MemberSetup {
    index: usize,
    baseline: Baseline,
    compute_per_batch: Duration,
    links: Arc<TcpLinks>,
}

/// Starts member `index`'s gRPC server on [`GRPC_PORT`] and its lazy channel to `next`; both
/// sides' connections read through the member's [`TcpLinks`].
async fn start_member(
    setup: MemberSetup,
    next: SocketAddr,
    arrivals: Option<mpsc::UnboundedSender<Arrival>>,
    hops: Option<Arc<Mutex<Vec<Duration>>>>,
) -> Result<Arc<Member>, Box<dyn std::error::Error>> {
    let MemberSetup {
        index,
        baseline,
        compute_per_batch,
        links,
    } = setup;
    let window = baseline.window();
    let endpoint = Endpoint::from_shared(format!("http://{next}"))?
        .initial_stream_window_size(window)
        .initial_connection_window_size(window);
    let connect_links = links.clone();
    let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
        let links = connect_links.clone();
        async move {
            let stream = turmoil::net::TcpStream::connect(next).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(links.wrap_turmoil(stream)?))
        }
    }));
    let member = Arc::new(Member {
        index,
        baseline,
        compute_per_batch,
        cpu: tokio::sync::Mutex::new(()),
        next: channel,
        arrivals,
        hops,
    });
    let listener = turmoil::net::TcpListener::bind((IpAddr::from([0, 0, 0, 0]), GRPC_PORT)).await?;
    let (accepted, incoming) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let result = listener
                .accept()
                .await
                .and_then(|(stream, _)| links.wrap_turmoil(stream).map(LabTcp));
            if accepted.send(result).await.is_err() {
                break;
            }
        }
    });
    let server = Server::builder()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .serve_with_incoming(TeamService(member.clone()), ReceiverStream::new(incoming));
    tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::warn!(%error, "gRPC server stopped");
        }
    });
    Ok(member)
}

/// Runs one xx-team case under a gRPC baseline; the metrics are those of the meshwire policies.
pub fn run(
    case: &CaseFile,
    seed: u64,
    params: &Params,
    baseline: Baseline,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let workload = Workload::new(case, params)?;
    let mut spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    // The lab sets turmoil's latency one tick short because turmoil hands a datagram over one tick
    // late; its TCP segments arrive on time, so the TCP-only baselines get the tick back (without
    // it every hop took 44 ms on a 45 ms link and the ring ping 220 ms).
    spec.latency += TICK;
    let mut lab = Lab::new(seed, spec, case.duration() + Duration::from_secs(1));
    // turmoil's TCP has no bandwidth, no jitter and no loss: every connection's bytes are
    // serialized at the rate of the lab's link in their direction, jittered as its datagrams
    // would be, and sent by TCP's rules (window, slow start, CUBIC, the link's loss), on the
    // round trip TCP takes: the links' latencies without the tick added above.
    let links = TcpLinks::new(lab.network().clone(), TICK, seed, TICK);
    let names: Vec<String> = (0..workload.nodes).map(|i| format!("n{i}")).collect();
    let hops: Arc<Mutex<Vec<Duration>>> = Arc::default();
    // Hosts exist before their addresses are known: relays read the table when they start.
    let addresses: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    for (index, name) in names.iter().enumerate().skip(1) {
        let (addresses, hops, links) = (addresses.clone(), hops.clone(), links.clone());
        let compute_per_batch = workload.compute_per_batch;
        lab.host(name, move |_context| {
            let addresses = addresses.clone();
            let hops = (index == 1).then(|| hops.clone());
            let setup = MemberSetup {
                index,
                baseline,
                compute_per_batch,
                links: links.clone(),
            };
            async move {
                let next = successor(&addresses, index)?;
                let _member = start_member(setup, next, None, hops).await?;
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let metrics: Arc<Mutex<Metrics>> = Arc::default();
    {
        let (addresses, hops, metrics) = (addresses.clone(), hops.clone(), metrics.clone());
        lab.client(&names[0], move |_context| async move {
            let (arrivals, mut arrived) = mpsc::unbounded_channel();
            let next = successor(&addresses, 0)?;
            let setup = MemberSetup {
                index: 0,
                baseline,
                compute_per_batch: workload.compute_per_batch,
                links,
            };
            let member = start_member(setup, next, Some(arrivals), None).await?;
            let results = first_node(&member, &mut arrived, &workload, &hops).await?;
            *metrics.lock().unwrap_or_else(|e| e.into_inner()) = results;
            Ok(())
        });
    }
    {
        let mut table = addresses.lock().unwrap_or_else(|e| e.into_inner());
        for name in &names {
            let ip = lab.ip(name).map_err(|error| ScenarioError::Invalid {
                path: name.clone(),
                reason: error.to_string(),
            })?;
            table.push(SocketAddr::new(ip, GRPC_PORT));
        }
    }
    crate::scenario::run_case_to_end(&mut lab, case, progress)?;
    let metrics = metrics.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(metrics)
}

fn successor(
    addresses: &Mutex<Vec<SocketAddr>>,
    index: usize,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let table = addresses.lock().unwrap_or_else(|e| e.into_inner());
    Ok(*table
        .get((index + 1) % table.len().max(1))
        .ok_or("successor address unknown")?)
}

/// `n0`'s client software: warm the ring, measure the hop, the ring ping, then the batches.
async fn first_node(
    member: &Arc<Member>,
    arrived: &mut mpsc::UnboundedReceiver<Arrival>,
    workload: &Workload,
    hops: &Mutex<Vec<Duration>>,
) -> Result<Metrics, Box<dyn std::error::Error>> {
    // Every link is up once a ring ping comes back; relays' servers may still be starting, so
    // ping until one does.
    let mut sequence = 0;
    'warm: loop {
        sequence += 1;
        let _ = send_unary(&mut member.client(), PING, sequence, Bytes::new()).await;
        let deadline = tokio::time::sleep(Duration::from_millis(500));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                arrival = arrived.recv() => {
                    if matches!(arrival.ok_or("server gone")?, Arrival::Ping(s) if s == sequence) {
                        break 'warm;
                    }
                }
                _ = &mut deadline => continue 'warm,
            }
        }
    }

    // Hop transfer n0 -> n1 on the warm connection; the first batch is the warm-up.
    let mut hop_ms = Vec::new();
    for sample in 0..=workload.hop_samples {
        let chunks = batch_chunks(sample as u64, workload);
        let started = clock();
        let mut client = member.client();
        match member.baseline {
            Baseline::Unary64k => send_unary(&mut client, HOP, 0, concat(&chunks)).await?,
            Baseline::Stream => {
                send_stream(&mut client, HOP_STREAM, 0, tokio_stream::iter(chunks)).await?
            }
        }
        let arrived_at = *hops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .ok_or("n1 did not record the hop")?;
        if sample > 0 {
            hop_ms.push((arrived_at - started).as_secs_f64() * 1e3);
        }
    }
    hop_ms.sort_by(f64::total_cmp);

    // The ring ping on the idle, warm ring.
    sequence += 1;
    let started = clock();
    send_unary(&mut member.client(), PING, sequence, Bytes::new()).await?;
    loop {
        if let Arrival::Ping(s) = arrived.recv().await.ok_or("server gone")? {
            if s == sequence {
                break;
            }
        }
    }
    let ring_ping = clock() - started;

    // Batches round the ring one at a time; each comes back with every byte plus N.
    let mut failed = 0u64;
    let started = clock();
    for round in 0..workload.baseline_batches {
        let chunks = batch_chunks(round, workload);
        let expected: Bytes = concat(&chunks)
            .iter()
            .map(|byte| byte.wrapping_add(workload.nodes as u8))
            .collect();
        member.compute().await;
        let chunks: Vec<Bytes> = chunks.iter().map(|chunk| transform(chunk)).collect();
        // The call runs on its own: the batch is done when it is back at n0, whatever the
        // call's answer from n1 is doing meanwhile.
        let mut client = member.client();
        let baseline = member.baseline;
        let send = tokio::spawn(async move {
            match baseline {
                Baseline::Unary64k => send_unary(&mut client, BATCH, round, concat(&chunks)).await,
                Baseline::Stream => {
                    let messages = tokio_stream::iter(chunks);
                    send_stream(&mut client, BATCH_STREAM, round, messages).await
                }
            }
        });
        let wait = tokio::time::timeout(workload.batch_deadline, async {
            loop {
                match arrived.recv().await {
                    Some(Arrival::Batch(r, data)) if r == round => return Some(data),
                    Some(_) => {}
                    None => return None,
                }
            }
        });
        let back = wait.await.ok().flatten();
        if !matches!(send.await, Ok(Ok(()))) {
            failed += 1;
            continue;
        }
        if back.as_ref() != Some(&expected) {
            failed += 1;
        }
    }
    let elapsed = (clock() - started).as_secs_f64();
    Ok(team_metrics(
        &hop_ms,
        ring_ping,
        workload.baseline_batches,
        elapsed,
        failed,
    ))
}

/// Batch `round`'s payloads, one message each.
fn batch_chunks(round: u64, workload: &Workload) -> Vec<Bytes> {
    team_batch(round, workload.slots, workload.payload_bytes)
        .chunks
        .into_iter()
        .map(|chunk| chunk.data)
        .collect()
}

fn concat(chunks: &[Bytes]) -> Bytes {
    let mut data = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for chunk in chunks {
        data.extend_from_slice(chunk);
    }
    data.freeze()
}
