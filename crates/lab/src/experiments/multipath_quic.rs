//! The real `meshwire_session::net::Session` over QUIC datagrams in the lab: a direct path and any
//! number of paths each through its own relay node, with paths removed and added back
//! mid-transfer.
//!
//! Hosts: `a` (sender), `b` (receiver), `r0`, `r1`, ... (one relay per relay path). The direct
//! path's spec is on the `a -> b` link, relay path `i`'s on `a -> r<i>`; `r<i> -> b` is
//! instantaneous ([`onward`]), and every reverse link (ACKs) has its forward link's latency without
//! rate limit or loss. `a` connects to `b` and every relay, each relay to `b`. `b` hashes what it
//! reads (SHA-256) so delivery is checked byte for byte. Path ids: [`DIRECT`] is 0, relay path `i`
//! is [`relayed`]`(i)` = `i + 1`.
//!
//! # Floor
//!
//! The case reports `ideal_transfer_s`, the latency-aware ideal of
//! [`super::multipath_raw::ideal_transfer_s`] over the direct path (one hop, `a -> b`) and every
//! relay path (`a -> r<i>`, then `r<i> -> b`), counting session payload (1024 B a datagram) as
//! `transfer_s` does (first byte written to the end of the stream read at `b`). A packet-rate link
//! carries one session datagram per QUIC packet (a full one is 13 or 45 B of route header + 18 B of
//! session header + 1024 B, and two do not fit the lab's 1472-byte MTU); a bit-rate link also
//! carries each datagram's headers and at least [`QUIC_MIN_OVERHEAD`] bytes of QUIC, which the floor
//! counts; QUIC's acknowledgements, handshakes and retransmissions it does not. `efficiency` =
//! `ideal_transfer_s` / `transfer_s`; `sigma_rate_efficiency` = goodput / `ideal_mb_per_s` (the
//! Σ-rate ideal, which ignores latency).
//!
//! A relay forwards a path's datagrams only within its per-path token bucket
//! ([`RelayLimits`]: 12.5 MB/s after a 1 MiB burst by default, both directions together, counting
//! each datagram's relayed header and session header). The floor of a relay path counts that
//! bucket as the relay enforces it, for the session's data only ([`RelayBudget`]): by `T` a relay
//! path has delivered at most min(link rate × (T − latency), burst + bucket rate × (T − latency)).
//! The session's acknowledgements spend the same bucket; the floor leaves them out, so what they
//! cost shows as inefficiency. Before this the floor ignored the bucket, and the sweep's cases
//! with relay links faster than it (up to 20,000 packets/s, 21.7 MB/s of relayed data) measured
//! the relay's configured limit, not the session: case 6 of seed 1 (a 19,196 packets/s relay
//! link) read 3.317 × a floor it could not reach; the relay counted the drops
//! (`relay_rate_limited`, a metric of every case).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::SESSION_DATAGRAM;
use meshwire::Node;
use meshwire_session::net::{
    RelayLimits, SessionHost, SessionHostError, SessionSettings, SessionStats,
};
use meshwire_session::proto::codec::DATA_HEADER_LEN;
use meshwire_session::proto::route::{DIRECT_HEADER_LEN, RELAYED_HEADER_LEN};
use meshwire_session::proto::{PathId, Policy, SessionConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use serde::Deserialize;

use super::multipath_raw::{ideal_transfer_s, Hop, PathFloor};
use super::{CongestionParam, Trial};
use crate::lab::{clock, Lab};
use crate::link::{LinkSpec, Rate};
use crate::scenario::{CaseFile, LinkFile, ScenarioError};
use crate::stats::{round_metric, Metrics};
use crate::LabError;

/// The direct path's id.
pub const DIRECT: PathId = PathId(0);
/// The first relay path's id (`relayed(0)`).
pub const RELAYED: PathId = PathId(1);

/// The id of relay path `index` (through host `r<index>`).
pub fn relayed(index: usize) -> PathId {
    PathId(index as u32 + 1)
}

/// The index of the relay path `path`, if it is one.
fn relay_index(path: PathId) -> Option<usize> {
    (path.0 as usize).checked_sub(1)
}

/// Least bytes of QUIC around one session datagram in a 1-RTT packet: a 1-byte short header, the
/// 8-byte connection id meshwire's endpoints issue, a 1-byte packet number, a 1-byte DATAGRAM
/// frame type and the 16-byte AEAD tag.
pub const QUIC_MIN_OVERHEAD: usize = 1 + 8 + 1 + 1 + 16;

/// The `r<i> -> b` hop of every relay path, and every link not set otherwise: instantaneous.
pub fn onward() -> LinkSpec {
    LinkSpec {
        latency: Duration::ZERO,
        ..LinkSpec::default()
    }
}

/// One transfer.
#[derive(Debug, Clone)]
pub struct TransferPlan {
    /// Bytes to send.
    pub bytes: usize,
    /// The `a -> b` link.
    pub direct: LinkSpec,
    /// The `a -> r<i>` link of each relay path; empty: the direct path only.
    pub relays: Vec<LinkSpec>,
    /// Remove this path this long after the first byte is written and add it back after the
    /// second duration.
    pub outage: Option<(PathId, Duration, Duration)>,
    /// Send `b` a datagram with a malformed route header and one with a malformed session packet.
    pub inject_malformed: bool,
    /// Window policy.
    pub policy: Policy,
    /// QUIC congestion controller of every node.
    pub congestion: meshwire::Congestion,
    /// Whether the sessions claim their windows on their connections
    /// (`SessionSettings::claim_window`).
    pub claim_window: bool,
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
    /// The sending side's packet counters (retransmissions, copies).
    pub sent: meshwire_session::proto::SenderStats,
    /// Receiver's session counters.
    pub receiver: SessionStats,
    /// Datagrams the relays forwarded, together.
    pub relayed_datagrams: u64,
    /// Datagrams the relays dropped because a path was over its token bucket, together.
    pub relay_rate_limited: u64,
    /// Datagrams `b`'s host refused for a malformed route header.
    pub receiver_malformed: u64,
    /// The error `b`'s host returned for the injected malformed header.
    pub malformed_error: Option<String>,
}

#[derive(Default)]
struct Board {
    outcome: TransferOutcome,
    relays: Vec<SessionHost>,
    receiver: Option<SessionHost>,
    done: bool,
}

fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    meshwire::proto::hash::sha256(&[bytes])
}

/// The default settings with `policy`'s own session settings (its first burst, windows and
/// send buffer: NCP's for the baselines) at the default settings' MTU.
fn settings(policy: Policy, claim_window: bool) -> SessionSettings {
    let defaults = SessionSettings::default();
    let session = SessionConfig {
        mtu_bytes: defaults.session.mtu_bytes,
        ..SessionConfig::new(policy)
    };
    SessionSettings {
        session,
        claim_window,
        ..defaults
    }
}

fn node_config(
    context: &crate::HostContext,
    congestion: meshwire::Congestion,
) -> meshwire::NodeConfig {
    let mut config = context.node_config();
    config.transport.congestion = congestion;
    config
}

/// Adds relay path `path` through `relay`, waiting while the relay has not reached the other end
/// yet.
async fn add_relay(
    session: &meshwire_session::net::Session,
    path: PathId,
    relay: meshwire::PeerId,
) -> Result<(), SessionHostError> {
    let mut attempts = 0;
    loop {
        match session.add_relay_path(path, relay).await {
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
    let mut lab = Lab::new(seed, onward(), plan.limit + Duration::from_secs(1));
    let board: Rc<RefCell<Board>> = Rc::default();
    let expected = sha256(&pattern(plan.bytes));
    {
        let board = board.clone();
        let (policy, congestion, claim) = (plan.policy, plan.congestion, plan.claim_window);
        lab.host("b", move |context| {
            let board = board.clone();
            async move {
                let (node, _) = context
                    .start_node(node_config(&context, congestion))
                    .await?;
                let host = SessionHost::new(&node, settings(policy, claim))?;
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
    let names: Vec<String> = (0..plan.relays.len()).map(|i| format!("r{i}")).collect();
    for name in &names {
        let board = board.clone();
        let (policy, congestion, claim) = (plan.policy, plan.congestion, plan.claim_window);
        lab.host(name, move |context| {
            let board = board.clone();
            async move {
                let (node, _) = context
                    .start_node(node_config(&context, congestion))
                    .await?;
                let host = SessionHost::new(&node, settings(policy, claim))?;
                board.borrow_mut().relays.push(host);
                node.connect(b_address, b).await?;
                std::future::pending::<()>().await;
                drop(node);
                Ok(())
            }
        });
    }
    let relays: Vec<(meshwire::PeerId, std::net::SocketAddr)> = names
        .iter()
        .map(|name| Ok::<_, LabError>((lab.peer_id(name), lab.node_address(name)?)))
        .collect::<Result<_, _>>()?;
    {
        let board = board.clone();
        let plan = plan.clone();
        let congestion = plan.congestion;
        lab.client("a", move |context| async move {
            let (node, _) = context
                .start_node(node_config(&context, congestion))
                .await?;
            node.connect(b_address, b).await?;
            for (r, address) in &relays {
                node.connect(*address, *r).await?;
            }
            let host = SessionHost::new(&node, settings(plan.policy, plan.claim_window))?;
            let session = host.open(b)?;
            session.add_direct_path(DIRECT)?;
            for (index, (r, _)) in relays.iter().enumerate() {
                add_relay(&session, relayed(index), *r).await?;
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
                    match relay_index(path).and_then(|index| relays.get(index)) {
                        Some((r, _)) => add_relay(&session, path, *r).await?,
                        None => session.add_direct_path(path)?,
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
            board.outcome.sent = session.sender_stats();
            let relayed = |count: fn(&meshwire_session::net::HostStats) -> u64| {
                board
                    .relays
                    .iter()
                    .map(|relay| count(relay.stats()))
                    .sum::<u64>()
            };
            let (relayed_datagrams, relay_rate_limited) = (
                relayed(|stats| stats.relayed_datagrams.load(Ordering::Relaxed)),
                relayed(|stats| stats.relay_rate_limited.load(Ordering::Relaxed)),
            );
            board.outcome.relayed_datagrams = relayed_datagrams;
            board.outcome.relay_rate_limited = relay_rate_limited;
            if let Some(receiver) = &board.receiver {
                board.outcome.receiver_malformed =
                    receiver.stats().malformed.load(Ordering::Relaxed);
            }
            Ok(())
        });
    }
    lab.link("a", "b", plan.direct)?;
    lab.link("b", "a", back(&plan.direct))?;
    for (name, spec) in names.iter().zip(&plan.relays) {
        lab.link("a", name, *spec)?;
        lab.link(name, "a", back(spec))?;
    }
    let finished = lab.run(plan.limit, |_| {})?;
    let mut outcome = board.borrow().outcome.clone();
    if !finished || !board.borrow().done {
        outcome.complete = false;
    }
    Ok(outcome)
}

/// Sends `b` a datagram whose session packet is malformed (the session counts it as rejected and
/// the connection stays), and hands `b`'s host a datagram whose route header is malformed, as if
/// from a peer `b` is not connected to, to record the typed error it returns (it is counted; from
/// a connected peer it would also close that connection, which `crates/session/tests/relay_flood.rs`
/// tests).
fn inject_malformed(
    node: &Node,
    board: &Rc<RefCell<Board>>,
    b: meshwire::PeerId,
    session: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let garbage = Bytes::from_static(&[0xee, 1, 2, 3]);
    let header = meshwire_session::proto::route::RouteHeader {
        session,
        path: DIRECT.0,
        route: meshwire_session::proto::route::Route::Direct,
    };
    node.send_datagram(b, SESSION_DATAGRAM, header.encode_with(&[0x7f, 0, 0]))?;
    let mut board = board.borrow_mut();
    if let Some(receiver) = &board.receiver {
        let stranger = meshwire::Keypair::from_seed([0xee; 32]).peer_id();
        let error = receiver.handle_datagram(stranger, garbage);
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
    /// One link per relay path, relay path `i` on `a -> r<i>`; empty: the direct path only.
    #[serde(default)]
    pub relays: Vec<LinkFile>,
    /// QUIC congestion controller of every node.
    #[serde(default)]
    pub congestion: CongestionParam,
    /// The path removed mid-transfer (0 direct, `i + 1` relay path `i`); absent: none.
    pub outage_path: Option<u32>,
    /// When the path is removed, after the first byte is written.
    #[serde(default = "outage_start_default")]
    pub outage_start_ms: u64,
    /// When it is added back, after the first byte is written.
    #[serde(default = "outage_end_default")]
    pub outage_end_ms: u64,
    /// Whether the sessions claim their windows on their connections
    /// (`SessionSettings::claim_window`, on by default as there).
    #[serde(default = "claim_window_default")]
    pub claim_window: bool,
}

fn claim_window_default() -> bool {
    SessionSettings::default().claim_window
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

/// Every path's floor (see the module's `# Floor`), the direct path first: `a -> b`, then each
/// relay's `a -> r<i>` and `r<i> -> b`, datagrams of `payload` session bytes.
pub fn path_floors(direct: &LinkSpec, relays: &[LinkSpec], payload: usize) -> Vec<PathFloor> {
    let direct_overhead = DIRECT_HEADER_LEN + DATA_HEADER_LEN + QUIC_MIN_OVERHEAD;
    let relayed_overhead = RELAYED_HEADER_LEN + DATA_HEADER_LEN + QUIC_MIN_OVERHEAD;
    std::iter::once(PathFloor::through(&[Hop::of(
        direct,
        payload,
        direct_overhead,
    )]))
    .chain(relays.iter().map(|spec| {
        PathFloor::through(&[
            Hop::of(spec, payload, relayed_overhead),
            Hop::of(&onward(), payload, relayed_overhead),
        ])
    }))
    .collect()
}

/// What a relay's per-path token bucket ([`RelayLimits`]) lets through, in session payload: the
/// bucket charges each data datagram's relayed route header and session header beside its
/// `payload` bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelayBudget {
    /// Session payload bytes per second once the burst is spent.
    pub payload_bytes_per_s: f64,
    /// Session payload bytes the full bucket passes at once.
    pub burst_payload_bytes: f64,
}

impl RelayBudget {
    /// The budget of a relay with `limits`, for datagrams of `payload` session bytes.
    pub fn of(limits: &RelayLimits, payload: usize) -> Self {
        let share = payload as f64 / (RELAYED_HEADER_LEN + DATA_HEADER_LEN + payload) as f64;
        Self {
            payload_bytes_per_s: limits.bytes_per_sec as f64 * share,
            burst_payload_bytes: limits.burst_bytes as f64 * share,
        }
    }
}

/// Session payload `path` has delivered by `t` at best; through a relay with `budget`, also no
/// more than the bucket passed since the path's first datagram reached it (the relay's onward
/// hop is instantaneous in this runner).
fn delivered_by(path: &PathFloor, budget: Option<&RelayBudget>, t: f64) -> f64 {
    let since = (t - path.latency_s).max(0.0);
    if since == 0.0 {
        return 0.0;
    }
    let by_link = path.bytes_per_s * since;
    match budget {
        Some(budget) => {
            by_link.min(budget.burst_payload_bytes + budget.payload_bytes_per_s * since)
        }
        None => by_link,
    }
}

/// The rate `path` sustains once a relay's bucket (`budget`, if it passes one) has spent its burst.
fn sustained_rate(path: &PathFloor, budget: Option<&RelayBudget>) -> f64 {
    budget.map_or(path.bytes_per_s, |budget| {
        path.bytes_per_s.min(budget.payload_bytes_per_s)
    })
}

/// The latency-aware ideal ([`ideal_transfer_s`]) when some paths pass a relay's token bucket
/// (`budgets[i]` for `paths[i]`, one per path): the smallest `T` with Σ delivered by `T` ≥
/// `bytes`. Without a bucket it is [`ideal_transfer_s`]; with one it lies between that (buckets
/// ignored) and the same ideal over paths slowed to their bucket's rate (bursts ignored), and is
/// found by bisection between the two.
pub fn ideal_transfer_through_relays(
    paths: &[PathFloor],
    budgets: &[Option<RelayBudget>],
    bytes: f64,
) -> f64 {
    assert_eq!(paths.len(), budgets.len(), "one budget (or none) per path");
    let unlimited = ideal_transfer_s(paths, bytes);
    if budgets.iter().all(Option::is_none) || !unlimited.is_finite() {
        return unlimited;
    }
    let slowed: Vec<PathFloor> = paths
        .iter()
        .zip(budgets)
        .map(|(path, budget)| PathFloor {
            bytes_per_s: sustained_rate(path, budget.as_ref()),
            ..*path
        })
        .collect();
    let delivered = |t: f64| -> f64 {
        paths
            .iter()
            .zip(budgets)
            .map(|(path, budget)| delivered_by(path, budget.as_ref(), t))
            .sum()
    };
    let (mut low, mut high) = (unlimited, ideal_transfer_s(&slowed, bytes));
    if !high.is_finite() {
        return high;
    }
    // 60 halvings of at most a few hundred seconds: far below a microsecond.
    for _ in 0..60 {
        let middle = (low + high) / 2.0;
        if delivered(middle) >= bytes {
            high = middle;
        } else {
            low = middle;
        }
    }
    high
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
    let relays = params
        .relays
        .iter()
        .map(|file| link(case, file))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = params.outage_path {
        if path as usize > relays.len() {
            return Err(trial.failed(format!(
                "outage_path {path}: the paths are 0 (direct) to {} (relays)",
                relays.len()
            )));
        }
    }
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
        relays,
        outage,
        inject_malformed: false,
        policy,
        congestion,
        claim_window: params.claim_window,
        limit: case.duration(),
    };
    let outcome = run_transfer(seed, &plan).map_err(|error| ScenarioError::lab(case, error))?;
    // Session payload per datagram: the session MTU (every datagram but the last is full).
    let host = settings(policy, params.claim_window);
    let payload = host.session.mtu_bytes;
    let floors = path_floors(&plan.direct, &plan.relays, payload);
    // The direct path passes no relay; every relay runs the same settings as this runner's hosts.
    let budget = RelayBudget::of(&host.relay, payload);
    let budgets: Vec<Option<RelayBudget>> = std::iter::once(None)
        .chain(plan.relays.iter().map(|_| Some(budget)))
        .collect();
    let ideal_transfer = ideal_transfer_through_relays(&floors, &budgets, plan.bytes as f64);
    let ideal: f64 = floors
        .iter()
        .zip(&budgets)
        .map(|(path, budget)| sustained_rate(path, budget.as_ref()))
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
        "sigma_rate_efficiency",
        if ideal > 0.0 { goodput / ideal } else { 0.0 },
    );
    put("ideal_transfer_s", ideal_transfer);
    put(
        "efficiency",
        if goodput > 0.0 {
            ideal_transfer / outcome.transfer_s
        } else {
            0.0
        },
    );
    put("transfer_s", outcome.transfer_s);
    put("datagrams_sent", outcome.sender.datagrams_sent as f64);
    put("send_buffer_full", outcome.sender.send_buffer_full as f64);
    put("retransmissions", outcome.sent.retransmissions as f64);
    // Copies sent while another copy of the same segment was in flight, as a share of every data
    // packet sent (as in the raw multipath runner; retransmissions of lost packets are not
    // redundant).
    let copies = (outcome.sent.tail_copies + outcome.sent.late_copies) as f64;
    put(
        "redundant_share",
        copies / outcome.sent.packets_sent.max(1) as f64,
    );
    put("relayed_datagrams", outcome.relayed_datagrams as f64);
    put("relay_rate_limited", outcome.relay_rate_limited as f64);
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_paths_add_their_onward_hop_and_bit_rates_pay_every_header() {
        let direct = LinkSpec {
            latency: Duration::from_millis(10),
            rate: Rate::BitsPerSec(8_000_000),
            ..LinkSpec::default()
        };
        let relay = LinkSpec {
            latency: Duration::from_millis(50),
            rate: Rate::PacketsPerSec(1000),
            loss: 0.1,
            ..LinkSpec::default()
        };
        let floors = path_floors(&direct, &[relay, relay], 1024);
        assert_eq!(floors.len(), 3);
        // 1 MB/s of UDP payload; a direct datagram is 13 + 18 + 1024 B in at least 27 B of QUIC.
        assert!((floors[0].bytes_per_s - 1e6 * 1024.0 / 1082.0).abs() < 1e-6);
        assert!((floors[0].latency_s - 0.01).abs() < 1e-12);
        // A packet a datagram, 10 % of them lost; the onward hop adds nothing.
        assert!((floors[1].bytes_per_s - 921_600.0).abs() < 1e-6);
        assert!((floors[1].latency_s - 0.05).abs() < 1e-12);
        assert_eq!(floors[1], floors[2]);
        // 2 MiB over the three: the direct path alone until 50 ms (≈ 47 KB), then all three.
        let bytes = (2 << 20) as f64;
        let t = ideal_transfer_s(&floors, bytes);
        let delivered: f64 = floors
            .iter()
            .map(|path| path.bytes_per_s * (t - path.latency_s).max(0.0))
            .sum();
        assert!((delivered - bytes).abs() < 1e-3, "{t}: {delivered}");
        assert!(t > 0.05);
    }

    #[test]
    fn a_relay_path_faster_than_its_bucket_is_held_to_the_bucket_after_the_burst() {
        let budget = RelayBudget {
            payload_bytes_per_s: 1_000_000.0,
            burst_payload_bytes: 100_000.0,
        };
        // A 10 MB/s relay link, 10 ms, behind a 1 MB/s bucket with a 100 KB burst.
        let fast = PathFloor {
            latency_s: 0.01,
            bytes_per_s: 10_000_000.0,
        };
        // 1.1 MB: the burst, then 1 MB at the bucket's rate: 1 s after the latency.
        let t = ideal_transfer_through_relays(&[fast], &[Some(budget)], 1_100_000.0);
        assert!((t - 1.01).abs() < 1e-6, "{t}");
        // Without the bucket the link alone: 0.11 s after the latency.
        let t = ideal_transfer_through_relays(&[fast], &[None], 1_100_000.0);
        assert!((t - 0.12).abs() < 1e-9, "{t}");
        // Within the burst the link is the limit (50 KB at 10 MB/s: 5 ms).
        let t = ideal_transfer_through_relays(&[fast], &[Some(budget)], 50_000.0);
        assert!((t - 0.015).abs() < 1e-6, "{t}");
        // A bucket above the link changes nothing; beside a direct path the two add up: by
        // T = 0.61 the direct path (0.5 MB/s, 10 ms) delivered 300 KB and the relay path 700 KB.
        let slow = PathFloor {
            latency_s: 0.01,
            bytes_per_s: 500_000.0,
        };
        let t = ideal_transfer_through_relays(&[slow], &[Some(budget)], 100_000.0);
        assert!((t - 0.21).abs() < 1e-6, "{t}");
        let t = ideal_transfer_through_relays(&[slow, fast], &[None, Some(budget)], 1_000_000.0);
        let expected = 0.01 + 900_000.0 / 1_500_000.0;
        assert!((t - expected).abs() < 1e-6, "{t} {expected}");
    }

    #[test]
    fn the_default_relay_budget_counts_the_headers_the_relay_charges() {
        let budget = RelayBudget::of(&RelayLimits::default(), 1024);
        let share = 1024.0 / (1024 + RELAYED_HEADER_LEN + DATA_HEADER_LEN) as f64;
        assert!((budget.payload_bytes_per_s - 12_500_000.0 * share).abs() < 1e-6);
        assert!((budget.burst_payload_bytes - f64::from(1 << 20) * share).abs() < 1e-6);
    }

    #[test]
    fn path_ids_count_relays_from_one() {
        assert_eq!(relayed(0), RELAYED);
        assert_eq!(relayed(4), PathId(5));
        assert_eq!(relay_index(DIRECT), None);
        assert_eq!(relay_index(PathId(3)), Some(2));
    }
}
