//! Start five nodes on loopback and show them working: mesh, messages, requests, fan-out, bulk,
//! and the HTTP object API (PUT through one node, GET through another).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use meshwire::protocols::{BULK, BULK_STREAM, DATA as CHAT, ECHO};
use meshwire::{Node, PeerId};
use meshwire_lab::stats::percentile;
use meshwire_objects::net::{Daemon, ObjectConfig};

const NODES: usize = 5;
const MESSAGES_PER_PAIR: u32 = 200;
const MESSAGE_BYTES: usize = 1024;
const PINGS_PER_PAIR: usize = 20;
const FANOUT_BYTES: usize = 1024 * 1024;
const BULK_MESSAGES: usize = 128;
const BULK_MESSAGE_BYTES: usize = 1024 * 1024;
const PATIENCE: Duration = Duration::from_secs(30);

/// Runs the demo; with `serve`, keeps the nodes and their HTTP APIs up until ctrl-c or SIGTERM.
pub async fn run(serve: bool) -> anyhow::Result<()> {
    let daemons = tokio::time::timeout(Duration::from_secs(60), demo())
        .await
        .context("the demo did not finish within 60 s")??;
    if serve {
        // Installed only now: during the demo itself ctrl-c keeps its default (exit at once).
        let mut stop = crate::signals::Stop::install()?;
        println!("\nlive dashboards (open in a browser):");
        for (index, daemon) in daemons.iter().enumerate() {
            if let Some(url) = dashboard_url(daemon) {
                println!("n{index:<4} {url}");
            }
        }
        println!(
            "\nserving until ctrl-c or SIGTERM (try: curl -T FILE URL/objects/KEY, curl URL/status)"
        );
        stop.next().await;
    }
    for daemon in daemons {
        daemon.shutdown().await?;
    }
    Ok(())
}

/// The dashboard's URL on `daemon`, with the token in the fragment when the node requires it
/// (a fragment never reaches a server; the page sends it as a bearer header).
fn dashboard_url(daemon: &Daemon) -> Option<String> {
    let address = daemon.http_address()?;
    let page = meshwire_objects::net::http::dashboard::PAGE_PATH;
    Some(match daemon.http_token() {
        Some(token) if daemon.http_token_required() => {
            format!("http://{address}{page}#token={}", token.secret)
        }
        _ => format!("http://{address}{page}"),
    })
}

/// Starts a node with its object service (in-memory store) and HTTP API on loopback.
async fn start_daemon() -> anyhow::Result<Daemon> {
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("valid literal");
    let daemon = Daemon::builder(ObjectConfig::default())
        .http(loopback)
        .bind(loopback, |_| {})
        .await?;
    daemon
        .node()
        .handle(ECHO, |_, body: Bytes| async move { Ok(body) })?;
    Ok(daemon)
}

async fn demo() -> anyhow::Result<Vec<Daemon>> {
    let mut daemons = Vec::with_capacity(NODES);
    for _ in 0..NODES {
        daemons.push(start_daemon().await?);
    }
    let nodes: Vec<Node> = daemons.iter().map(|daemon| daemon.node().clone()).collect();
    let ids: Vec<PeerId> = nodes.iter().map(Node::peer_id).collect();
    // The five nodes form one object cluster: objects are placed on and served by members only.
    for daemon in &daemons {
        daemon.service().set_members(ids.iter().copied());
    }
    println!("meshwire demo: {NODES} nodes on loopback\n");
    println!("node  peer id      address");
    for (index, node) in nodes.iter().enumerate() {
        println!(
            "n{index:<4} {:<12} {}",
            node.peer_id().short(),
            node.local_addr()?
        );
    }
    println!();
    let mut rows: Vec<(&str, String)> = Vec::new();

    // Mesh: every pair connected once, authenticated both ways.
    let started = Instant::now();
    for (i, node) in nodes.iter().enumerate() {
        for other in &nodes[i + 1..] {
            node.connect(other.local_addr()?, other.peer_id()).await?;
        }
    }
    for node in &nodes {
        let deadline = Instant::now() + PATIENCE;
        while node.connected_peers().len() < NODES - 1 {
            ensure!(Instant::now() < deadline, "mesh did not form");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let pairs = NODES * (NODES - 1) / 2;
    rows.push((
        "mesh",
        format!(
            "{pairs}/{pairs} connections up in {:.1} ms",
            ms(started.elapsed())
        ),
    ));

    rows.push(("messages", messages(&nodes, &ids).await?));
    rows.push(("requests", requests(&nodes, &ids).await?));
    rows.push(("fan-out", fanout(&nodes, &ids).await?));
    rows.push(("throughput", bulk(&nodes[0], &nodes[1]).await?));
    let urls = daemons
        .iter()
        .map(|daemon| {
            daemon
                .http_address()
                .map(|address| format!("http://{address}"))
                .context("a demo node has no HTTP API")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    rows.push(("objects", objects(&urls).await?));

    println!("{:<12} result", "step");
    for (step, result) in rows {
        println!("{step:<12} {result}");
    }
    println!("\nHTTP API (objects, /status, /peers, /metrics):");
    for (index, url) in urls.iter().enumerate() {
        println!("n{index:<4} {url}");
    }
    Ok(daemons)
}

/// PUTs a 4 KiB object through n0 and GETs it through n3 with a quorum read.
async fn objects(urls: &[String]) -> anyhow::Result<String> {
    let content: Vec<u8> = (0..4096).map(|i| (i % 253) as u8).collect();
    let started = Instant::now();
    let (status, _) = http_exchange(&urls[0], "PUT", "/objects/demo-wallet", &content).await?;
    ensure!(status == 201, "PUT answered {status}");
    let put_ms = ms(started.elapsed());
    let started = Instant::now();
    let (status, body) = http_exchange(&urls[3], "GET", "/objects/demo-wallet", b"").await?;
    ensure!(status == 200, "GET answered {status}");
    ensure!(body == content, "GET returned other bytes");
    Ok(format!(
        "4 KiB PUT via n0 in {put_ms:.1} ms (W=2 of R=3), quorum GET via n3 identical in {:.1} ms",
        ms(started.elapsed())
    ))
}

/// One HTTP/1.1 exchange with `Connection: close`: the status and the body.
async fn http_exchange(
    base: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("HTTP response without a header end")?;
    let status = std::str::from_utf8(&raw[..split])?
        .split_whitespace()
        .nth(1)
        .context("HTTP response without a status")?
        .parse()?;
    Ok((status, raw[split + 4..].to_vec()))
}

async fn messages(nodes: &[Node], ids: &[PeerId]) -> anyhow::Result<String> {
    let mut inboxes = nodes
        .iter()
        .map(|node| node.subscribe(CHAT))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    for (from, node) in nodes.iter().enumerate() {
        for (to, id) in ids.iter().enumerate() {
            if from == to {
                continue;
            }
            for sequence in 0..MESSAGES_PER_PAIR {
                let mut payload = vec![from as u8; MESSAGE_BYTES];
                payload[..4].copy_from_slice(&sequence.to_le_bytes());
                node.send(*id, CHAT, Bytes::from(payload)).await?;
            }
        }
    }
    let expected_per_node = (NODES - 1) * MESSAGES_PER_PAIR as usize;
    let mut delivered = 0;
    for (index, inbox) in inboxes.iter_mut().enumerate() {
        let mut next = [0u32; NODES];
        for _ in 0..expected_per_node {
            let message = tokio::time::timeout(PATIENCE, inbox.recv())
                .await
                .with_context(|| format!("n{index} is missing messages"))?
                .context("inbox closed")?;
            let from = ids
                .iter()
                .position(|id| *id == message.from)
                .context("message from a stranger")?;
            let sequence = u32::from_le_bytes(message.payload[..4].try_into()?);
            ensure!(
                sequence == next[from],
                "n{index}: message from n{from} out of order"
            );
            ensure!(
                message.payload[4..].iter().all(|&b| b == from as u8),
                "corrupt payload"
            );
            next[from] += 1;
            delivered += 1;
        }
    }
    let total = NODES * expected_per_node;
    ensure!(delivered == total, "delivered {delivered} of {total}");
    Ok(format!(
        "{delivered}/{total} delivered in order ({MESSAGE_BYTES} B each, every pair) in {:.1} ms",
        ms(started.elapsed())
    ))
}

async fn requests(nodes: &[Node], ids: &[PeerId]) -> anyhow::Result<String> {
    let mut rtts = Vec::new();
    for (from, node) in nodes.iter().enumerate() {
        for (to, id) in ids.iter().enumerate() {
            if from == to {
                continue;
            }
            for ping in 0..PINGS_PER_PAIR {
                let body = Bytes::from(format!("ping {from}->{to} #{ping}"));
                let started = Instant::now();
                let answer = node
                    .request(*id, ECHO, body.clone(), Duration::from_secs(5))
                    .await?;
                rtts.push(started.elapsed());
                ensure!(answer == body, "echo mismatch");
            }
        }
    }
    rtts.sort();
    let total = NODES * (NODES - 1) * PINGS_PER_PAIR;
    Ok(format!(
        "{}/{total} echoed, round trip p50 {:.2} ms, p99 {:.2} ms",
        rtts.len(),
        ms(percentile(&rtts, 0.50).unwrap_or_default()),
        ms(percentile(&rtts, 0.99).unwrap_or_default()),
    ))
}

async fn fanout(nodes: &[Node], ids: &[PeerId]) -> anyhow::Result<String> {
    let mut inboxes = nodes[1..]
        .iter()
        .map(|node| node.subscribe(BULK))
        .collect::<Result<Vec<_>, _>>()?;
    let payload: Bytes = (0..FANOUT_BYTES).map(|i| (i % 251) as u8).collect();
    let started = Instant::now();
    let report = nodes[0].send_many(&ids[1..], BULK, payload.clone())?;
    ensure!(
        report.failed.is_empty(),
        "fan-out refused: {:?}",
        report.failed
    );
    let mut identical = 0;
    for inbox in &mut inboxes {
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .context("fan-out message missing")?
            .context("inbox closed")?;
        if message.payload == payload {
            identical += 1;
        }
    }
    let peers = ids.len() - 1;
    ensure!(
        identical == peers,
        "only {identical} of {peers} copies identical"
    );
    Ok(format!(
        "1 MiB from n0 to {peers} peers, encoded once: {identical}/{peers} identical in {:.1} ms",
        ms(started.elapsed())
    ))
}

async fn bulk(from: &Node, to: &Node) -> anyhow::Result<String> {
    // The fan-out step subscribed BULK on `to` already; use a protocol of its own.
    let protocol = BULK_STREAM;
    let mut inbox = to.subscribe(protocol)?;
    let payload = Bytes::from(vec![7u8; BULK_MESSAGE_BYTES]);
    let destination = to.peer_id();
    let sender = from.clone();
    let started = Instant::now();
    let sending = tokio::spawn(async move {
        for _ in 0..BULK_MESSAGES {
            sender.send(destination, protocol, payload.clone()).await?;
        }
        Ok::<_, meshwire::SendError>(())
    });
    let mut bytes = 0usize;
    for _ in 0..BULK_MESSAGES {
        let message = tokio::time::timeout(PATIENCE, inbox.recv())
            .await
            .context("bulk message missing")?
            .context("inbox closed")?;
        bytes += message.payload.len();
    }
    sending.await??;
    let elapsed = started.elapsed();
    if bytes != BULK_MESSAGES * BULK_MESSAGE_BYTES {
        bail!("bulk transfer incomplete: {bytes} bytes");
    }
    Ok(format!(
        "n0 -> n1: {} MiB in {:.0} ms = {:.0} Mbit/s (one connection, loopback)",
        bytes >> 20,
        ms(elapsed),
        bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e6
    ))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
