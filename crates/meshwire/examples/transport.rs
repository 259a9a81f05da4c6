//! Move bytes over one QUIC connection on loopback, either as meshwire batches between two nodes or
//! over plain quinn, so `bench/transport.sh` can compare them built with the same quinn, rustls,
//! profile and allocator.
//!
//! Run a receiver first, then a sender, each in its own process (so each process's CPU time is
//! one side's):
//!
//! ```text
//! transport receive meshwire|quinn DIR BYTES    # writes DIR/address (and DIR/cert.der), waits
//! transport send    meshwire|quinn DIR BYTES    # connects, sends BYTES, prints the result line
//! ```
//!
//! - `meshwire`: two nodes with default [`NodeConfig`]s (fixed identities, so the sender knows whom
//!   it dials); the sender sends `BYTES` as batches on [`BULK_STREAM`] (one unidirectional stream
//!   each, at most the node's batch limit of 1 GiB) in 1 MiB chunks, and the receiver pulls every
//!   chunk with [`InboundBatch::next_chunk`](meshwire::InboundBatch::next_chunk).
//! - `quinn`: what quinn's own `perf` tool does, written here: `quinn::Endpoint::server` and
//!   `Endpoint::client` with quinn's default transport config, a rustls self-signed certificate
//!   (rcgen) the client trusts as its only root, one connection, one unidirectional stream written
//!   with 1 MiB `write_chunk`s of one shared buffer and drained with `read_chunks` (32 at a time).
//!
//! Both run on a current-thread tokio runtime. The sender times from opening the first stream
//! (handshake done) until the receiver has acknowledged every byte, and prints
//! `transport <side> bytes=N seconds=S gbit_per_sec=G`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshwire::protocols::BULK_STREAM;
use meshwire::{BatchHeader, Chunk, Keypair, Node, NodeConfig, PeerChange};

type Error = Box<dyn std::error::Error>;

const CHUNK_BYTES: usize = 1 << 20;
const SENDER_SEED: [u8; 32] = [1; 32];
const RECEIVER_SEED: [u8; 32] = [2; 32];
/// How long a receiver waits for its sender, and a sender for a receiver's address.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Meshwire,
    Quinn,
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, side, dir, bytes] = args.as_slice() else {
        return Err("usage: transport receive|send meshwire|quinn DIR BYTES".into());
    };
    let side = match side.as_str() {
        "meshwire" => Side::Meshwire,
        "quinn" => Side::Quinn,
        other => return Err(format!("unknown side {other:?}: meshwire or quinn").into()),
    };
    let dir = PathBuf::from(dir);
    let bytes: u64 = bytes.parse().map_err(|_| "BYTES must be a number")?;
    if bytes == 0 {
        return Err("BYTES must be at least 1".into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match (role.as_str(), side) {
            ("receive", Side::Meshwire) => meshwire_receive(&dir, bytes).await,
            ("receive", Side::Quinn) => quinn_receive(&dir, bytes).await,
            ("send", side) => {
                let seconds = match side {
                    Side::Meshwire => meshwire_send(&dir, bytes).await?,
                    Side::Quinn => quinn_send(&dir, bytes).await?,
                };
                let name = if side == Side::Meshwire {
                    "meshwire"
                } else {
                    "quinn"
                };
                println!(
                    "transport {name} bytes={bytes} seconds={seconds:.3} gbit_per_sec={:.3}",
                    bytes as f64 * 8.0 / seconds / 1e9
                );
                Ok(())
            }
            (other, _) => Err(format!("unknown role {other:?}: receive or send").into()),
        }
    })
}

/// One shared buffer, handed out by reference: neither side's sender copies payload bytes.
fn payload() -> Bytes {
    Bytes::from(vec![42u8; CHUNK_BYTES])
}

/// Writes `content` to `dir/name` so it appears whole (written aside, then renamed).
fn publish(dir: &Path, name: &str, content: &[u8]) -> Result<(), Error> {
    let partial = dir.join(format!("{name}.partial"));
    std::fs::write(&partial, content)?;
    std::fs::rename(partial, dir.join(name))?;
    Ok(())
}

/// Waits for the receiver to publish `dir/name`.
async fn read_published(dir: &Path, name: &str) -> Result<Vec<u8>, Error> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match std::fs::read(dir.join(name)) {
            Ok(content) => return Ok(content),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if Instant::now() > deadline {
                    return Err(format!("the receiver did not write {name} in time").into());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

async fn receiver_address(dir: &Path) -> Result<SocketAddr, Error> {
    let text = String::from_utf8(read_published(dir, "address").await?)?;
    Ok(text.trim().parse()?)
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

async fn meshwire_receive(dir: &Path, bytes: u64) -> Result<(), Error> {
    let node = Node::bind(
        NodeConfig::new(Keypair::from_seed(RECEIVER_SEED)),
        loopback(),
    )?;
    let mut batches = node.subscribe_batches(BULK_STREAM)?;
    let mut peers = node.peer_events();
    publish(dir, "address", node.local_addr()?.to_string().as_bytes())?;
    let mut received = 0u64;
    while received < bytes {
        let mut batch = tokio::time::timeout(PATIENCE, batches.recv())
            .await
            .map_err(|_| "no batch arrived in time")?
            .ok_or("the node stopped")?;
        while let Some(chunk) = batch.next_chunk().await? {
            received += chunk.data.len() as u64;
        }
    }
    if received != bytes {
        return Err(format!("received {received} bytes, expected {bytes}").into());
    }
    // Stay up until the sender has closed, so its last acknowledgements are sent.
    tokio::time::timeout(PATIENCE, async {
        while let Some(change) = peers.recv().await {
            if matches!(change, PeerChange::Down(_)) {
                break;
            }
        }
    })
    .await
    .map_err(|_| "the sender did not close")?;
    node.close().await;
    Ok(())
}

async fn meshwire_send(dir: &Path, bytes: u64) -> Result<f64, Error> {
    let node = Node::bind(NodeConfig::new(Keypair::from_seed(SENDER_SEED)), loopback())?;
    let receiver = Keypair::from_seed(RECEIVER_SEED).peer_id();
    node.connect(receiver_address(dir).await?, receiver).await?;
    let payload = payload();
    let max_batch_bytes = node.batch_limits().max_batch_bytes;
    let started = Instant::now();
    let mut remaining = bytes;
    let mut batch_id = 0;
    while remaining > 0 {
        let batch_bytes = remaining.min(max_batch_bytes);
        let chunks = batch_bytes.div_ceil(CHUNK_BYTES as u64);
        let mut sender = node
            .open_batch(
                receiver,
                BatchHeader {
                    protocol: BULK_STREAM.0,
                    batch_id,
                    round: 0,
                    phase: 0,
                    slot_count: u32::try_from(chunks)?,
                    total_bytes: batch_bytes,
                    metadata: Bytes::new(),
                },
            )
            .await?;
        let mut left = batch_bytes;
        while left > 0 {
            let step = left.min(CHUNK_BYTES as u64);
            sender
                .send_chunk(Chunk {
                    slots: 1,
                    data: payload.slice(..step as usize),
                })
                .await?;
            left -= step;
        }
        sender.finish().await?;
        remaining -= batch_bytes;
        batch_id += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    node.close().await;
    Ok(seconds)
}

async fn quinn_receive(dir: &Path, bytes: u64) -> Result<(), Error> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
    let cert = certified.cert.der().clone();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let config = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key.into())?;
    let endpoint = quinn::Endpoint::server(config, loopback())?;
    publish(dir, "cert.der", &cert)?;
    publish(
        dir,
        "address",
        endpoint.local_addr()?.to_string().as_bytes(),
    )?;
    let connection = tokio::time::timeout(PATIENCE, endpoint.accept())
        .await
        .map_err(|_| "no connection arrived in time")?
        .ok_or("the endpoint closed")?
        .await?;
    let mut stream = connection.accept_uni().await?;
    let mut chunks: [Bytes; 32] = std::array::from_fn(|_| Bytes::new());
    let mut received = 0u64;
    while let Some(count) = stream.read_chunks(&mut chunks).await? {
        received += chunks[..count]
            .iter()
            .map(|chunk| chunk.len() as u64)
            .sum::<u64>();
    }
    if received != bytes {
        return Err(format!("received {received} bytes, expected {bytes}").into());
    }
    // Stay up until the sender has closed, so its last acknowledgements are sent.
    tokio::time::timeout(PATIENCE, connection.closed())
        .await
        .map_err(|_| "the sender did not close")?;
    endpoint.wait_idle().await;
    Ok(())
}

async fn quinn_send(dir: &Path, bytes: u64) -> Result<f64, Error> {
    let address = receiver_address(dir).await?;
    let cert = read_published(dir, "cert.der").await?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(cert))?;
    let mut endpoint = quinn::Endpoint::client(loopback())?;
    endpoint.set_default_client_config(quinn::ClientConfig::with_root_certificates(Arc::new(
        roots,
    ))?);
    let connection = endpoint.connect(address, "localhost")?.await?;
    let payload = payload();
    let started = Instant::now();
    let mut stream = connection.open_uni().await?;
    let mut remaining = bytes;
    while remaining > 0 {
        let step = remaining.min(CHUNK_BYTES as u64);
        stream.write_chunk(payload.slice(..step as usize)).await?;
        remaining -= step;
    }
    stream.finish()?;
    // Resolves once the receiver has acknowledged every byte (or stopped the stream).
    if let Some(code) = stream.stopped().await? {
        return Err(format!("the receiver stopped the stream with code {code}").into());
    }
    let seconds = started.elapsed().as_secs_f64();
    connection.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
    Ok(seconds)
}
