//! The real `meshwire_session::net::Session` over QUIC datagrams in the lab: a direct path and
//! optionally a path through a relay node, with paths removed and added back mid-transfer.
//!
//! Hosts: `a` (sender), `b` (receiver), `r` (relay). The direct path's spec is on the `a -> b`
//! link, the relay path's on `a -> r`; `r -> b` is instantaneous, and every reverse link (ACKs)
//! has its forward link's latency without rate limit or loss. `a` connects to `b` and `r`, `r` to
//! `b`. `b` hashes what it reads (SHA-256) so delivery is checked byte for byte.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::SESSION_DATAGRAM;
use meshwire::Node;
use meshwire_session::net::{SessionHost, SessionHostError, SessionSettings, SessionStats};
use meshwire_session::proto::{PathId, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use serde::Deserialize;

use super::{CongestionParam, Trial};
use crate::lab::{clock, Lab};
use crate::link::{LinkSpec, Rate};
use crate::scenario::{CaseFile, LinkFile, ScenarioError};
use crate::stats::{round_metric, Metrics};
use crate::LabError;

/// The direct path's id.
pub const DIRECT: PathId = PathId(0);
/// The relay path's id.
pub const RELAYED: PathId = PathId(1);

/// One transfer.
#[derive(Debug, Clone)]
pub struct TransferPlan {
    /// Bytes to send.
    pub bytes: usize,
    /// The `a -> b` link.
    pub direct: LinkSpec,
    /// The `a -> r` link; `None`: no relay path.
    pub relay: Option<LinkSpec>,
    /// Remove this path this long after the first byte is written and add it back after the
    /// second duration.
    pub outage: Option<(PathId, Duration, Duration)>,
    /// Send `b` a datagram with a malformed route header and one with a malformed session packet.
    pub inject_malformed: bool,
    /// Window policy.
    pub policy: Policy,
    /// QUIC congestion controller of every node.
    pub congestion: meshwire::Congestion,
    /// Virtual time limit.
    pub limit: Duration,
}

/// What a transfer did.
#[derive(Debug, Clone, Default)]
pub struct TransferOutcome {
    /// `b` read exactly the bytes written, in order, and the end of the stream.
    pub complete: bool,
    /// Bytes `b` read.
    pub received: usize,
    /// From the first byte written to the end of the stream read, in seconds.
    pub transfer_s: f64,
    /// Sender's session counters.
    pub sender: SessionStats,
    /// Receiver's session counters.
    pub receiver: SessionStats,
    /// Datagrams the relay forwarded.
    pub relayed_datagrams: u64,
    /// Datagrams `b`'s host refused for a malformed route header.
    pub receiver_malformed: u64,
    /// The error `b`'s host returned for the injected malformed header.
    pub malformed_error: Option<String>,
}

#[derive(Default)]
struct Board {
    outcome: TransferOutcome,
    relay: Option<SessionHost>,
    receiver: Option<SessionHost>,
    done: bool,
}

fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    meshwire::proto::hash::sha256(&[bytes])
}

fn settings(policy: Policy) -> SessionSettings {
    let mut settings = SessionSettings::default();
    settings.session.policy = policy;
    settings
}

fn node_config(
    context: &crate::HostContext,
    congestion: meshwire::Congestion,
) -> meshwire::NodeConfig {
    let mut config = context.node_config();
    config.transport.congestion = congestion;
    config
}

/// Adds a relay path, waiting while the relay has not reached the other end yet.
async fn add_relay(
    session: &meshwire_session::net::Session,
    relay: meshwire::PeerId,
) -> Result<(), SessionHostError> {
    let mut attempts = 0;
    loop {
        match session.add_relay_path(RELAYED, relay).await {
            Err(SessionHostError::RelayRefused(_)) if attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// Runs `plan` in virtual time.
pub fn run_transfer(seed: u64, plan: &TransferPlan) -> Result<TransferOutcome, LabError> {
    let back = |spec: &LinkSpec| LinkSpec {
        latency: spec.latency,
        rate: Rate::Unlimited,
        loss: 0.0,
        ..LinkSpec::default()
    };
    let instant = LinkSpec {
        latency: Duration::ZERO,
        ..LinkSpec::default()
    };
    let mut lab = Lab::new(seed, instant, plan.limit + Duration::from_secs(1));
    let board: Rc<RefCell<Board>> = Rc::default();
    let expected = sha256(&pattern(plan.bytes));
    {
        let board = board.clone();
        let (policy, congestion) = (plan.policy, plan.congestion);
        lab.host("b", move |context| {
            let board = board.clone();
            async move {
                let (node, _) = context
                    .start_node(node_config(&context, congestion))
                    .await?;
                let host = SessionHost::new(&node, settings(policy))?;
                board.borrow_mut().receiver = Some(host.clone());
                let mut incoming = host.incoming();
                let mut session = incoming.recv().await.ok_or("no session")?;
                let mut digest = meshwire::proto::hash::Sha256::new();
                let mut buf = vec![0u8; 64 * 1024];
                let mut received = 0;
                loop {
                    let read = session.read(&mut buf).await?;
                    if read == 0 {
                        break;
                    }
                    digest.update(&buf[..read]);
                    received += read;
                }
                {
                    let mut board = board.borrow_mut();
                    board.outcome.received = received;
                    board.outcome.complete = digest.finish() == expected;
                    board.outcome.transfer_s = clock().as_secs_f64() - board.outcome.transfer_s;
                    board.outcome.receiver = session.stats();
                    board.done = true;
                }
                // Keep the node (and the session's acknowledgements) alive until the run ends.
                std::future::pending::<()>().await;
                drop((session, node));
                Ok(())
            }
        });
    }
    let b = lab.peer_id("b");
    let b_address = lab.node_address("b")?;
    if plan.relay.is_some() {
        let board = board.clone();
        let (policy, congestion) = (plan.policy, plan.congestion);
        lab.host("r", move |context| {
            let board = board.clone();
            async move {
                let (node, _) = context
                    .start_node(node_config(&context, congestion))
                    .await?;
                let host = SessionHost::new(&node, settings(policy))?;
                board.borrow_mut().relay = Some(host);
                node.connect(b_address, b).await?;
                std::future::pending::<()>().await;
                drop(node);
                Ok(())
            }
        });
    }
    let relay = plan
        .relay
        .map(|_| Ok::<_, LabError>((lab.peer_id("r"), lab.node_address("r")?)))
        .transpose()?;
    {
        let board = board.clone();
        let plan = plan.clone();
        let congestion = plan.congestion;
        lab.client("a", move |context| async move {
            let (node, _) = context
                .start_node(node_config(&context, congestion))
                .await?;
            node.connect(b_address, b).await?;
            if let Some((r, address)) = relay {
                node.connect(address, r).await?;
            }
            let host = SessionHost::new(&node, settings(plan.policy))?;
            let session = host.open(b)?;
            session.add_direct_path(DIRECT)?;
            if let Some((r, _)) = relay {
                add_relay(&session, r).await?;
            }
            if plan.inject_malformed {
                inject_malformed(&node, &board, b, session.id())?;
            }
            let payload = pattern(plan.bytes);
            let started = clock();
            board.borrow_mut().outcome.transfer_s = started.as_secs_f64();
            let writer = async {
                let mut writer = &session;
                writer.write_all(&payload).await?;
                writer.shutdown().await
            };
            let events = async {
                if let Some((path, down, up)) = plan.outage {
                    tokio::time::sleep(down).await;
                    session.remove_path(path).await?;
                    tokio::time::sleep(up.saturating_sub(down)).await;
                    match (path, relay) {
                        (RELAYED, Some((r, _))) => add_relay(&session, r).await?,
                        _ => session.add_direct_path(path)?,
                    }
                }
                Ok::<_, SessionHostError>(())
            };
            let (written, changed) = tokio::join!(writer, events);
            written?;
            changed?;
            while !board.borrow().done {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut board = board.borrow_mut();
            board.outcome.sender = session.stats();
            if let Some(relay) = &board.relay {
                board.outcome.relayed_datagrams = relay
                    .stats()
                    .relayed_datagrams
                    .load(std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(receiver) = &board.receiver {
                board.outcome.receiver_malformed = receiver
                    .stats()
                    .malformed
                    .load(std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        });
    }
    lab.link("a", "b", plan.direct)?;
    lab.link("b", "a", back(&plan.direct))?;
    if let Some(spec) = plan.relay {
        lab.link("a", "r", spec)?;
        lab.link("r", "a", back(&spec))?;
    }
    let finished = lab.run(plan.limit, |_| {})?;
    let mut outcome = board.borrow().outcome.clone();
    if !finished || !board.borrow().done {
        outcome.complete = false;
    }
    Ok(outcome)
}

/// Sends `b` a datagram whose route header is malformed (it is counted there) and one whose
/// session packet is (the session counts it as rejected); also asks `b`'s host directly, to
/// record the typed error it returns.
fn inject_malformed(
    node: &Node,
    board: &Rc<RefCell<Board>>,
    b: meshwire::PeerId,
    session: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let garbage = Bytes::from_static(&[0xee, 1, 2, 3]);
    node.send_datagram(b, SESSION_DATAGRAM, garbage.clone())?;
    let header = meshwire_session::proto::route::RouteHeader {
        session,
        path: DIRECT.0,
        route: meshwire_session::proto::route::Route::Direct,
    };
    node.send_datagram(b, SESSION_DATAGRAM, header.encode_with(&[0x7f, 0, 0]))?;
    let mut board = board.borrow_mut();
    if let Some(receiver) = &board.receiver {
        let error = receiver.handle_datagram(node.peer_id(), garbage);
        board.outcome.malformed_error = error.err().map(|error| error.to_string());
    }
    Ok(())
}

fn link(case: &CaseFile, file: &LinkFile) -> Result<LinkSpec, ScenarioError> {
    file.spec()
        .map_err(|reason| ScenarioError::failed(case, reason))
}

/// `transfer` parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// MiB to send.
    #[serde(default = "mib_default")]
    pub mib: u64,
    /// The direct path's link, on `a -> b`.
    pub direct: LinkFile,
    /// The relay path's link, on `a -> r`; absent: no relay path.
    pub relay: Option<LinkFile>,
    /// QUIC congestion controller of every node.
    #[serde(default)]
    pub congestion: CongestionParam,
    /// The path removed mid-transfer (0 direct, 1 relayed); absent: none.
    pub outage_path: Option<u32>,
    /// When the path is removed, after the first byte is written.
    #[serde(default = "outage_start_default")]
    pub outage_start_ms: u64,
    /// When it is added back, after the first byte is written.
    #[serde(default = "outage_end_default")]
    pub outage_end_ms: u64,
}

fn mib_default() -> u64 {
    8
}

fn outage_start_default() -> u64 {
    1000
}

fn outage_end_default() -> u64 {
    2000
}

fn ideal_bytes_per_sec(spec: &LinkSpec, datagram_payload: f64) -> f64 {
    let per_sec = match spec.rate {
        Rate::PacketsPerSec(packets) => packets as f64 * datagram_payload,
        Rate::BitsPerSec(bits) => bits as f64 / 8.0,
        Rate::Unlimited => f64::INFINITY,
    };
    per_sec * (1.0 - spec.loss)
}

/// Runs one case of a `session` scenario.
pub fn run(
    trial: &Trial<'_>,
    _progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let (case, seed) = (trial.case, trial.seed);
    let policy: Policy = trial.policy()?;
    let params: Params = trial.params()?;
    let direct = link(case, &params.direct)?;
    let relay = params
        .relay
        .as_ref()
        .map(|file| link(case, file))
        .transpose()?;
    let congestion = meshwire::Congestion::from(params.congestion);
    let outage = params.outage_path.map(|path| {
        (
            PathId(path),
            Duration::from_millis(params.outage_start_ms),
            Duration::from_millis(params.outage_end_ms),
        )
    });
    let plan = TransferPlan {
        bytes: params.mib as usize * (1 << 20),
        direct,
        relay,
        outage,
        inject_malformed: false,
        policy,
        congestion,
        limit: case.duration(),
    };
    let outcome = run_transfer(seed, &plan).map_err(|error| ScenarioError::lab(case, error))?;
    // Session payload per datagram: the session MTU (every datagram but the last is full).
    let payload = settings(policy).session.mtu_bytes as f64;
    let ideal: f64 = [Some(direct), relay]
        .iter()
        .flatten()
        .map(|spec| ideal_bytes_per_sec(spec, payload))
        .sum::<f64>()
        / f64::from(1 << 20);
    let goodput = if outcome.complete && outcome.transfer_s > 0.0 {
        plan.bytes as f64 / f64::from(1 << 20) / outcome.transfer_s
    } else {
        0.0
    };
    let mut metrics = BTreeMap::new();
    let mut put = |name: &str, value: f64| {
        metrics.insert(name.to_string(), round_metric(value));
    };
    put("complete", f64::from(u8::from(outcome.complete)));
    put("goodput_mb_per_s", goodput);
    put("ideal_mb_per_s", ideal);
    put(
        "efficiency",
        if ideal > 0.0 { goodput / ideal } else { 0.0 },
    );
    put("transfer_s", outcome.transfer_s);
    put("datagrams_sent", outcome.sender.datagrams_sent as f64);
    put("send_buffer_full", outcome.sender.send_buffer_full as f64);
    put("relayed_datagrams", outcome.relayed_datagrams as f64);
    Ok(metrics)
}
