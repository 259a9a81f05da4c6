//! Reproduce NKN's NCP experiments: one session striped over paths with different rates, latencies
//! and losses, under the classic, NKP-0024 and meshwire window policies.
//!
//! Topology: sender `a`, receiver `b`, and one relay host `r<i>` per path (the lab's link table is
//! per host pair, so paths with different specs need different hosts). Path `i` is
//! `a -> r<i> -> b`; the hop `a -> r<i>` carries the path's spec (packets/s, latency, loss, queue),
//! `r<i> -> b` and `b -> r<i>` follow the case's `link` (instantaneous and lossless in the NCP
//! scenarios), and `r<i> -> a` has the path's
//! latency without rate limit or loss, so ACKs come back over the same path's latency. As in
//! NKN's emulator, the sender's writer blocks on a path for 1/rate after each datagram
//! (`Sender::block_path_until`), unless the case sets `writer_blocks = false`.
//!
//! The sans-IO session (`meshwire_session::proto`) is driven directly over raw lab UDP sockets,
//! one datagram per packet, so the windows under test govern alone (no QUIC congestion control
//! underneath). Workloads: `transfer` (send `mib` MiB, measure goodput) and `converge` (send
//! without end, sample every path's in-flight packets every 10 ms, measure when the shares settle).
//!
//! # Floor
//!
//! `transfer` reports its physical floor `ideal_transfer_s` ([`ideal_transfer_s`], the
//! latency-aware ideal: the smallest T with Σᵢ rateᵢ(1 − lossᵢ)·max(0, T − latencyᵢ) ≥ size) and
//! `efficiency` = `ideal_transfer_s` / `transfer_s` (at most 1 but for the lab's 1 ms tick and the
//! luck of i.i.d. loss; see [`ideal_transfer_s`]). `sigma_rate_efficiency` = goodput / Σ-rate ideal
//! (`ideal_mb_per_s`) is the older ratio, which ignores that nothing crosses a path before its
//! latency. `converge` has no transfer floor.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use meshwire_session::proto::codec::DATA_HEADER_LEN;
use meshwire_session::proto::{Packet, PathId, Policy, Receiver, Sender, SessionConfig};

use serde::Deserialize;

use super::Trial;
use crate::lab::{clock, Lab, LabEvent, TICK};
use crate::link::{LinkSpec, Rate};
use crate::scenario::{CaseFile, LinkFile, ScenarioError};
use crate::stats::{round_metric, Metrics};

const PORT: u16 = 7100;
/// NCP's packets carry 1024 bytes; "MB" in their table is 2^20 bytes.
const MIB: f64 = (1 << 20) as f64;
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// In-flight shares are averaged over bins this long before they are compared.
const BIN: Duration = Duration::from_millis(100);
/// A share within this fraction of its target counts as converged.
const TOLERANCE: f64 = 0.10;

#[derive(Debug, Default)]
struct Outcome {
    first_write: Option<Duration>,
    last_delivery: Option<Duration>,
    delivered: usize,
    /// (time, in-flight packets per path).
    samples: Vec<(Duration, Vec<u32>)>,
    retransmissions: u64,
    tail_copies: u64,
    late_copies: u64,
    packets_sent: u64,
    timeouts: u64,
    /// The receiver's window: times it doubled, and its size at the end in bytes.
    window_growths: u64,
    window_bytes: usize,
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// `transfer` and `converge` parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// The paths, NKN-style links (`rate_packets_per_s` required).
    pub paths: Vec<LinkFile>,
    /// `transfer` only: MiB to send (default 8).
    pub mib: Option<u64>,
    /// Whether the sender's writer blocks on a path for 1/rate after each datagram (NKN's
    /// emulator); `false` lets packets wait in the lab link's queue instead.
    #[serde(default = "writer_blocks_default")]
    pub writer_blocks: bool,
    /// Initial window per path, in packets; absent: the policy's own.
    pub initial_windows: Option<Vec<f64>>,
    /// The path cut (both ways) for `outage_ms` from `outage_at_ms`; absent: no outage.
    pub outage_path: Option<u64>,
    /// When the outage starts.
    #[serde(default)]
    pub outage_at_ms: u64,
    /// How long it lasts.
    #[serde(default)]
    pub outage_ms: u64,
}

fn writer_blocks_default() -> bool {
    true
}

/// MiB a `transfer` sends unless `mib` says otherwise.
const DEFAULT_MIB: u64 = 8;

impl Params {
    /// Bytes the workload sends: `mib` for `transfer`, without end for `converge`.
    fn total_bytes(&self, workload: &str) -> Result<usize, String> {
        match (workload, self.mib) {
            ("transfer", mib) => Ok((mib.unwrap_or(DEFAULT_MIB) as usize) << 20),
            ("converge", None) => Ok(usize::MAX),
            ("converge", Some(_)) => Err("mib applies to workload transfer only".into()),
            (other, _) => Err(format!("unknown workload {other:?}")),
        }
    }
}

/// Checks a case's params for its workload (`mib` only where it is used).
pub fn check(case: &CaseFile) -> Result<(), toml::de::Error> {
    let params: Params = case.params()?;
    params
        .total_bytes(&case.workload)
        .map(drop)
        .map_err(serde::de::Error::custom)
}

/// Runs one case under the trial's policy.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let (case, seed) = (trial.case, trial.seed);
    let fail = |reason: String| ScenarioError::failed(case, reason);
    let policy: Policy = trial.policy()?;
    let params: Params = trial.params()?;
    let paths = &params.paths;
    if paths.is_empty() {
        return Err(fail("params.paths lists the paths".into()));
    }
    let specs: Vec<LinkSpec> = paths
        .iter()
        .map(LinkFile::spec)
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    let nominal: Vec<f64> = specs
        .iter()
        .map(|spec| match spec.rate {
            Rate::PacketsPerSec(packets) => Ok(packets as f64),
            _ => Err(fail("paths need rate_packets_per_s".into())),
        })
        .collect::<Result<_, _>>()?;
    let rates: Vec<f64> = nominal
        .iter()
        .zip(&specs)
        .map(|(packets, spec)| packets * (1.0 - spec.loss))
        .collect();
    // NKN's emulator hands a packet to its rate limiter through an unbuffered channel: the
    // writer blocks until the path takes the packet (one per 1/rate), so nothing queues in front
    // of the bottleneck and a packet's send time excludes the wait. `writer_blocks = false` keeps
    // the lab link's own queue instead (a packet is stamped, then waits).
    let writer_blocks = params.writer_blocks;
    let initial_windows = params.initial_windows.clone();
    let workload = case.workload.as_str();
    let total_bytes = params.total_bytes(workload).map_err(fail)?;
    let outage_path = params.outage_path;
    let outage_at = Duration::from_millis(params.outage_at_ms);
    let outage_length = Duration::from_millis(params.outage_ms);

    // The case's own link is every other hop: relay to receiver, and the default.
    let instant = case.link.spec().map_err(fail)?;
    let mut lab = Lab::new(seed, instant, case.duration() + Duration::from_secs(1));
    let relays: Vec<String> = (0..specs.len()).map(|index| format!("r{index}")).collect();
    let outcome: Rc<RefCell<Outcome>> = Rc::default();
    let directory: Rc<RefCell<BTreeMap<String, SocketAddr>>> = Rc::default();

    for relay in &relays {
        let directory = directory.clone();
        lab.host(relay, move |context| {
            let directory = directory.clone();
            async move {
                let socket = context.bind(PORT).await?;
                let (a, b) = {
                    let directory = directory.borrow();
                    (directory["a"], directory["b"])
                };
                while let Some((datagram, from)) = socket.recv_datagram().await {
                    let to = if from.ip() == a.ip() { b } else { a };
                    socket.send_datagram(to, &datagram[1..], None);
                }
                Ok(())
            }
        });
    }

    let config = SessionConfig::new(policy);
    {
        let outcome = outcome.clone();
        let directory = directory.clone();
        let relays = relays.clone();
        lab.host("b", move |context| {
            let outcome = outcome.clone();
            let directory = directory.clone();
            let relays = relays.clone();
            async move {
                let socket = context.bind(PORT).await?;
                let paths: Vec<SocketAddr> = relays.iter().map(|r| directory.borrow()[r]).collect();
                let mut receiver = Receiver::new(config);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let deadline = receiver.poll_timeout();
                    tokio::select! {
                        received = socket.recv_datagram() => {
                            let Some((datagram, from)) = received else { return Ok(()) };
                            let Some(index) = paths.iter().position(|p| p.ip() == from.ip()) else {
                                continue;
                            };
                            let packet = Packet::decode(datagram.slice(1..), config.mtu_bytes)?;
                            receiver.handle_packet(PathId(index as u32), packet, now())?;
                        }
                        _ = sleep_until(deadline) => {}
                    }
                    let mut read = 0;
                    loop {
                        let n = receiver.read(&mut buf);
                        if n == 0 {
                            break;
                        }
                        read += n;
                    }
                    if read > 0 {
                        let mut outcome = outcome.borrow_mut();
                        outcome.window_growths = receiver.window_growths();
                        outcome.window_bytes =
                            receiver.window_segments() as usize * config.mtu_bytes;
                        outcome.delivered += read;
                        outcome.last_delivery = Some(clock());
                    }
                    while let Some(transmit) = receiver.poll_transmit(now()) {
                        socket.send_datagram(
                            paths[transmit.path.0 as usize],
                            &transmit.payload,
                            None,
                        );
                    }
                }
            }
        });
    }
    {
        let outcome = outcome.clone();
        let directory = directory.clone();
        let relays = relays.clone();
        let initial_windows = initial_windows.clone();
        let nominal = nominal.clone();
        let limit = case.duration();
        lab.client("a", move |context| async move {
            let socket = context.bind(PORT).await?;
            let paths: Vec<SocketAddr> = relays.iter().map(|r| directory.borrow()[r]).collect();
            let mut sender = Sender::new(config);
            for index in 0..paths.len() {
                let window = initial_windows.as_ref().and_then(|w| w.get(index).copied());
                sender.add_path(PathId(index as u32), window);
            }
            let mut free_at = vec![now(); paths.len()];
            let chunk = vec![0x6e_u8; 64 * 1024];
            let mut written = 0usize;
            let mut next_sample = clock();
            loop {
                while written < total_bytes {
                    let n = sender.write(&chunk[..chunk.len().min(total_bytes - written)]);
                    if n == 0 {
                        break;
                    }
                    if written == 0 {
                        outcome.borrow_mut().first_write = Some(clock());
                    }
                    written += n;
                }
                if written == total_bytes {
                    sender.finish();
                }
                while let Some(transmit) = sender.poll_transmit(now()) {
                    let index = transmit.path.0 as usize;
                    socket.send_datagram(paths[index], &transmit.payload, None);
                    if writer_blocks {
                        // Granted one packet per 1/rate on the path's own schedule: a wake-up that
                        // comes late by less than one timer tick (1 ms) does not slow the path
                        // down. A grant may lie as many whole intervals before now as fit in a tick
                        // (at least one: a 1024 packets/s interval is 0.98 ms), so above 2000
                        // packets/s one wake-up sends every packet granted since the last.
                        let interval = Duration::from_secs_f64(1.0 / nominal[index]);
                        let per_tick = TICK.as_nanos() / interval.as_nanos().max(1);
                        let late = interval * u32::try_from(per_tick.max(1)).unwrap_or(u32::MAX);
                        let granted = free_at[index].max(now().checked_sub(late).unwrap_or(now()));
                        free_at[index] = granted + interval;
                        sender.block_path_until(transmit.path, free_at[index]);
                    }
                }
                if outcome.borrow().delivered >= total_bytes || clock() >= limit {
                    break;
                }
                if clock() >= next_sample {
                    let in_flight = sender.paths().map(|(_, s)| s.in_flight_packets).collect();
                    outcome.borrow_mut().samples.push((clock(), in_flight));
                    next_sample += SAMPLE_EVERY;
                }
                let sample_at = tokio::time::Instant::now() + (next_sample.saturating_sub(clock()));
                let deadline = match sender.poll_timeout() {
                    Some(at) => tokio::time::Instant::from_std(at).min(sample_at),
                    None => sample_at,
                };
                tokio::select! {
                    received = socket.recv_datagram() => {
                        let Some((datagram, from)) = received else { break };
                        let Some(index) = paths.iter().position(|p| p.ip() == from.ip()) else {
                            continue;
                        };
                        if let Packet::Ack(ack) = Packet::decode(datagram.slice(1..), config.mtu_bytes)? {
                            sender.handle_ack(PathId(index as u32), ack, now())?;
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => {}
                }
                sender.handle_timeout(now());
            }
            let stats = sender.stats();
            let mut outcome = outcome.borrow_mut();
            outcome.retransmissions = stats.retransmissions;
            outcome.tail_copies = stats.tail_copies;
            outcome.late_copies = stats.late_copies;
            outcome.packets_sent = stats.packets_sent;
            outcome.timeouts = stats.timeouts;
            Ok(())
        });
    }
    {
        let mut directory = directory.borrow_mut();
        for name in relays.iter().map(String::as_str).chain(["a", "b"]) {
            let ip = lab
                .ip(name)
                .map_err(|error| ScenarioError::lab(case, error))?;
            directory.insert(name.to_string(), SocketAddr::new(ip, PORT));
        }
    }
    for (relay, spec) in relays.iter().zip(&specs) {
        let back = LinkSpec {
            latency: spec.latency,
            ..instant
        };
        lab.link("a", relay, *spec)
            .map_err(|error| ScenarioError::lab(case, error))?;
        lab.link(relay, "a", back)
            .map_err(|error| ScenarioError::lab(case, error))?;
    }
    if let Some(relay) = outage_path.and_then(|path| relays.get(usize::try_from(path).ok()?)) {
        lab.at(outage_at, LabEvent::Partition("a".into(), relay.clone()));
        lab.at(
            outage_at + outage_length,
            LabEvent::Repair("a".into(), relay.clone()),
        );
    }
    lab.run(case.duration() + Duration::from_secs(1), progress)
        .map_err(|error| ScenarioError::lab(case, error))?;

    let outcome = outcome.borrow();
    let mut metrics = BTreeMap::new();
    let ideal = rates.iter().sum::<f64>() * config.mtu_bytes as f64 / MIB;
    metrics.insert("ideal_mb_per_s".into(), round_metric(ideal));
    metrics.insert("retransmissions".into(), outcome.retransmissions as f64);
    metrics.insert("tail_copies".into(), outcome.tail_copies as f64);
    metrics.insert("late_copies".into(), outcome.late_copies as f64);
    // Copies sent while another copy of the same segment was in flight, as a share of every
    // data packet sent (retransmissions of lost packets are not redundant).
    let copies = (outcome.tail_copies + outcome.late_copies) as f64;
    metrics.insert(
        "redundant_share".into(),
        copies / (outcome.packets_sent.max(1) as f64),
    );
    metrics.insert("timeouts".into(), outcome.timeouts as f64);
    metrics.insert("window_growths".into(), outcome.window_growths as f64);
    metrics.insert(
        "receive_window_mib".into(),
        round_metric(outcome.window_bytes as f64 / MIB),
    );
    if workload == "transfer" {
        let floor = ideal_transfer_s(
            &path_floors(&specs, &instant, config.mtu_bytes),
            total_bytes as f64,
        );
        metrics.insert("ideal_transfer_s".into(), round_metric(floor));
        let complete = outcome.delivered >= total_bytes;
        metrics.insert("complete".into(), f64::from(u8::from(complete)));
        if let (true, Some(first), Some(last)) =
            (complete, outcome.first_write, outcome.last_delivery)
        {
            let transfer_s = (last - first).as_secs_f64();
            let goodput = total_bytes as f64 / MIB / transfer_s;
            metrics.insert("goodput_mb_per_s".into(), round_metric(goodput));
            metrics.insert(
                "sigma_rate_efficiency".into(),
                round_metric(goodput / ideal),
            );
            metrics.insert("efficiency".into(), round_metric(floor / transfer_s));
            metrics.insert("transfer_s".into(), round_metric(transfer_s));
        }
    } else {
        let from = if outage_length.is_zero() {
            Duration::ZERO
        } else {
            outage_at + outage_length
        };
        let (converge_s, converged) = convergence(&outcome.samples, &rates, from, case.duration());
        metrics.insert("converge_s".into(), round_metric(converge_s));
        metrics.insert("converged".into(), f64::from(u8::from(converged)));
    }
    Ok(metrics)
}

/// One hop of a path as the transfer floor counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hop {
    /// One-way propagation delay in seconds.
    pub latency_s: f64,
    /// Session payload bytes per second the hop serializes at most (infinite: no rate limit).
    pub payload_bytes_per_s: f64,
    /// Probability that a datagram the hop has serialized is lost.
    pub loss: f64,
}

impl Hop {
    /// A lab link carrying datagrams of `payload` session bytes behind `overhead` bytes of headers:
    /// a packet rate carries `payload` per datagram whatever its size; a bit rate counts the whole
    /// UDP payload, so only `payload / (payload + overhead)` of it is session payload.
    pub fn of(spec: &LinkSpec, payload: usize, overhead: usize) -> Self {
        let payload_bytes_per_s = match spec.rate {
            Rate::Unlimited => f64::INFINITY,
            Rate::PacketsPerSec(packets) => packets as f64 * payload as f64,
            Rate::BitsPerSec(bits) => {
                bits as f64 / 8.0 * payload as f64 / (payload + overhead) as f64
            }
        };
        Self {
            latency_s: spec.latency.as_secs_f64(),
            payload_bytes_per_s,
            loss: spec.loss,
        }
    }
}

/// What one path can do at best: nothing arrives before its latency, then at most its rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathFloor {
    /// One-way latency in seconds: the sum of the path's hops' latencies.
    pub latency_s: f64,
    /// Session payload bytes per second delivered at most (infinite: no rate limit).
    pub bytes_per_s: f64,
}

impl PathFloor {
    /// A path through `hops`, in order. Its latency is the sum of theirs. Its rate is the least,
    /// over hops, of what a hop serializes times the share that survives that hop's loss and every
    /// later hop's: minₕ rateₕ·Πⱼ≥ₕ(1 − lossⱼ) (the lab draws a datagram's loss after the datagram
    /// has taken its place on the link, so a lost datagram costs its hop the time it took). One
    /// hop: rate × (1 − loss); lossless hops: the least rate.
    pub fn through(hops: &[Hop]) -> Self {
        let latency_s = hops.iter().map(|hop| hop.latency_s).sum();
        let mut bytes_per_s = f64::INFINITY;
        let mut surviving = 1.0;
        for hop in hops.iter().rev() {
            surviving *= 1.0 - hop.loss;
            bytes_per_s = bytes_per_s.min(hop.payload_bytes_per_s * surviving);
        }
        Self {
            latency_s,
            bytes_per_s,
        }
    }
}

/// The latency-aware ideal transfer time, in seconds: the smallest T with
/// Σᵢ bytes_per_sᵢ · max(0, T − latency_sᵢ) ≥ `bytes`, over `paths` (see [`PathFloor`]). It is the
/// physical floor of `transfer_s` (first byte written to last byte delivered) under these
/// assumptions:
///
/// * the sender writes everything at once and the clock starts then; on a path the k-th
///   datagram is serialized at the path's bottleneck no earlier than k/rate after that and then
///   travels the path's one-way latency, so by T a path has delivered at most
///   rate·max(0, T − latency) (the continuous bound, below the discrete one);
/// * every delivered datagram carries a full payload of new data: headers (through [`Hop::of`]),
///   retransmissions, acknowledgements, windows, handshakes and queues cost nothing;
/// * loss is its expected value: i.i.d. loss takes rate × loss of a path's datagrams, so a run
///   that happens to lose fewer can beat the floor, by about √(loss / n) of it for n datagrams
///   (0.35 % for 8 MiB at 10 % loss);
/// * jitter (which only delays) and outages (a path cut for a while) are not credited: they make
///   the floor lower than the case's true best, never higher.
///
/// A path without a rate limit delivers everything at its latency. No path with a rate: infinite.
pub fn ideal_transfer_s(paths: &[PathFloor], bytes: f64) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    let mut open: Vec<PathFloor> = paths
        .iter()
        .copied()
        .filter(|path| path.bytes_per_s > 0.0)
        .collect();
    open.sort_by(|a, b| a.latency_s.total_cmp(&b.latency_s));
    // With the first k paths (by latency) delivering, the bytes delivered by T are
    // Σ rateᵢ·T − Σ rateᵢ·latencyᵢ, until the next path's latency.
    let (mut rate, mut weighted) = (0.0, 0.0);
    for (index, path) in open.iter().enumerate() {
        if path.bytes_per_s.is_infinite() {
            return path.latency_s;
        }
        rate += path.bytes_per_s;
        weighted += path.bytes_per_s * path.latency_s;
        let done = (bytes + weighted) / rate;
        let next = open
            .get(index + 1)
            .map_or(f64::INFINITY, |next| next.latency_s);
        if done <= next {
            return done;
        }
    }
    f64::INFINITY
}

/// Every path's floor: the `a -> r<i>` hop (the path's spec), then `r<i> -> b` (the case's link),
/// each datagram `payload` session bytes behind the session's data header.
fn path_floors(specs: &[LinkSpec], onward: &LinkSpec, payload: usize) -> Vec<PathFloor> {
    specs
        .iter()
        .map(|spec| {
            PathFloor::through(&[
                Hop::of(spec, payload, DATA_HEADER_LEN),
                Hop::of(onward, payload, DATA_HEADER_LEN),
            ])
        })
        .collect()
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// Seconds after `from` until every path's share of in-flight packets (averaged per 100 ms bin)
/// stays within 10% of its share of the throughput, and whether it settled before the run ended.
fn convergence(
    samples: &[(Duration, Vec<u32>)],
    rates: &[f64],
    from: Duration,
    end: Duration,
) -> (f64, bool) {
    let total_rate: f64 = rates.iter().sum();
    let mut settled_at = from;
    let mut bin_start = from;
    let mut last_ok = false;
    while bin_start + BIN <= end {
        let mut sums = vec![0f64; rates.len()];
        for (_, in_flight) in samples
            .iter()
            .filter(|(at, _)| *at >= bin_start && *at < bin_start + BIN)
        {
            for (sum, &packets) in sums.iter_mut().zip(in_flight) {
                *sum += f64::from(packets);
            }
        }
        let total: f64 = sums.iter().sum();
        let ok = total > 0.0
            && sums.iter().zip(rates).all(|(&sum, &rate)| {
                let target = rate / total_rate;
                (sum / total - target).abs() <= TOLERANCE * target
            });
        if !ok {
            settled_at = bin_start + BIN;
        }
        last_ok = ok;
        bin_start += BIN;
    }
    ((settled_at - from).as_secs_f64(), last_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(latency_s: f64, bytes_per_s: f64) -> PathFloor {
        PathFloor {
            latency_s,
            bytes_per_s,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_ideal_waits_for_a_slow_path_only_when_it_helps() {
        // 1000 B/s at 0.1 s and 1000 B/s at 0.6 s. 300 B: the first path alone, done at 0.4 s,
        // before the second delivers anything.
        let paths = [path(0.1, 1000.0), path(0.6, 1000.0)];
        assert!(close(ideal_transfer_s(&paths, 300.0), 0.4));
        // 1000 B: the first alone would take until 1.1 s; with both, T = 0.85 s
        // (750 B on the first over 0.75 s, 250 B on the second over 0.25 s).
        assert!(close(ideal_transfer_s(&paths, 1000.0), 0.85));
        // Order does not matter.
        assert!(close(ideal_transfer_s(&[paths[1], paths[0]], 1000.0), 0.85));
    }

    #[test]
    fn base_plus_4_matches_the_bound_worked_out_by_hand() {
        // ncp-table's base+4: 1024 packets/s at 50 ms and four 128 packets/s paths at 500 ms,
        // 8 MiB of 1024-byte packets: 1536·T − 51.2 − 256 = 8192 packets, T = 5.5333 s, where the
        // Σ-rate ideal says 8192 / 1536 = 5.3333 s.
        let mut paths = vec![path(0.05, 1024.0 * 1024.0)];
        paths.extend([path(0.5, 128.0 * 1024.0); 4]);
        let floor = ideal_transfer_s(&paths, (8 << 20) as f64);
        assert!(close(floor, (8192.0 + 51.2 + 256.0) / 1536.0), "{floor}");
    }

    #[test]
    fn unlimited_paths_and_empty_transfers() {
        assert_eq!(ideal_transfer_s(&[path(0.2, f64::INFINITY)], 1e9), 0.2);
        // A slow short path finishes a small transfer before an unlimited long one opens.
        let paths = [path(0.01, 1000.0), path(0.5, f64::INFINITY)];
        assert!(close(ideal_transfer_s(&paths, 100.0), 0.11));
        assert_eq!(ideal_transfer_s(&paths, 1e6), 0.5);
        assert_eq!(ideal_transfer_s(&paths, 0.0), 0.0);
        assert_eq!(ideal_transfer_s(&[], 1.0), f64::INFINITY);
    }

    #[test]
    fn a_path_adds_latencies_and_keeps_its_least_surviving_rate() {
        let lossy = LinkSpec {
            latency: Duration::from_millis(50),
            rate: Rate::PacketsPerSec(1000),
            loss: 0.1,
            ..LinkSpec::default()
        };
        let onward = LinkSpec {
            latency: Duration::from_millis(20),
            rate: Rate::BitsPerSec(8_000_000),
            loss: 0.5,
            ..LinkSpec::default()
        };
        let first = Hop::of(&lossy, 1024, DATA_HEADER_LEN);
        assert!(close(first.payload_bytes_per_s, 1_024_000.0));
        // 1 MB/s of UDP payload, 1024 of every 1042 bytes session payload.
        let second = Hop::of(&onward, 1024, DATA_HEADER_LEN);
        assert!(close(second.payload_bytes_per_s, 1e6 * 1024.0 / 1042.0));
        let floor = PathFloor::through(&[first, second]);
        assert!(close(floor.latency_s, 0.07));
        // The first hop delivers 1 024 000 × 0.9 × 0.5 = 460 800 B/s at b; the second at most
        // 982 726 × 0.5 = 491 363 B/s.
        assert!(close(floor.bytes_per_s, 460_800.0), "{floor:?}");
        // One lossless hop: its rate.
        let single = PathFloor::through(&[Hop::of(&onward, 1024, 0)]);
        assert!(close(single.bytes_per_s, 1e6 * 0.5));
    }
}
