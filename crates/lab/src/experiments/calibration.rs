//! Prove the emulator against theory: round trip, bulk goodput with and without BDP windows,
//! packet rate, loss, and a partition.
//!
//! Every case runs two hosts, `a` and `b`, joined by the case's link in both directions. The `rtt`,
//! `bulk` and `partition` workloads run real meshwire nodes; `pps` and `loss` send raw datagrams
//! through the emulated socket, so they measure the emulator alone.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::{DATA, ECHO};
use meshwire::{Congestion, NodeConfig};
use tokio::time::Instant;

use serde::Deserialize;

use super::{CongestionParam, Trial};
use crate::lab::{clock, Lab, LabEvent};
use crate::placement::SharedLog;
use crate::scenario::{CaseFile, ScenarioError};
use crate::stats::{round_metric, Metrics};

const RAW_PORT: u16 = 9000;

type Shared<T> = Rc<RefCell<T>>;

/// `rtt` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RttParams {
    /// Round trips measured (after three warm-up round trips).
    pub requests: u64,
}

impl Default for RttParams {
    fn default() -> Self {
        Self { requests: 21 }
    }
}

/// `bulk` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BulkParams {
    /// MiB measured.
    pub mebibytes: u64,
    /// MiB sent (and received) before the measurement starts.
    pub warmup_mebibytes: u64,
    /// A fixed stream window in bytes; 0: the node's bandwidth-delay windows.
    pub stream_window_bytes: u64,
    /// Initial congestion window in bytes; 0: the standard start.
    pub initial_window_bytes: u64,
    /// QUIC congestion controller of both nodes.
    pub congestion: CongestionParam,
}

impl Default for BulkParams {
    fn default() -> Self {
        Self {
            mebibytes: 200,
            warmup_mebibytes: 0,
            stream_window_bytes: 0,
            initial_window_bytes: 0,
            congestion: CongestionParam::Meshwire,
        }
    }
}

/// `pps` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpsParams {
    /// How long datagrams are offered, in seconds.
    pub seconds: u64,
    /// Offered rate.
    pub offered_packets_per_s: u64,
}

impl Default for PpsParams {
    fn default() -> Self {
        Self {
            seconds: 10,
            offered_packets_per_s: 2048,
        }
    }
}

/// `loss` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossParams {
    /// Datagrams sent.
    pub datagrams: u64,
    /// Datagrams sent per millisecond.
    pub datagrams_per_ms: u64,
}

impl Default for LossParams {
    fn default() -> Self {
        Self {
            datagrams: 100_000,
            datagrams_per_ms: 100,
        }
    }
}

/// `partition` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PartitionParams {
    /// When the link is cut.
    pub partition_at_ms: u64,
    /// How long it stays cut.
    pub partition_ms: u64,
    /// How long messages are sent.
    pub run_ms: u64,
}

impl Default for PartitionParams {
    fn default() -> Self {
        Self {
            partition_at_ms: 2000,
            partition_ms: 2000,
            run_ms: 8000,
        }
    }
}

/// Every case's hosts: `a` measures, `b` serves.
pub fn hosts(_case: &CaseFile) -> Vec<String> {
    vec!["a".into(), "b".into()]
}

/// Runs one calibration case and returns its metrics.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let case = trial.case;
    let spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let mut lab = trial.lab(spec);
    let metrics: Shared<Metrics> = Rc::default();
    match case.workload.as_str() {
        "rtt" => rtt(&mut lab, case, trial.params()?, metrics.clone())?,
        "bulk" => bulk(&mut lab, case, trial.params()?, metrics.clone())?,
        "pps" => packet_rate(&mut lab, case, trial.params()?, metrics.clone())?,
        "loss" => loss(&mut lab, case, trial.params()?, metrics.clone())?,
        "partition" => partition(&mut lab, case, trial.params()?, metrics.clone())?,
        other => {
            return Err(ScenarioError::failed(
                case,
                format!("unknown calibration workload {other:?}"),
            ))
        }
    }
    lab.link_both("a", "b", spec)
        .map_err(|error| ScenarioError::lab(case, error))?;
    crate::scenario::run_case_to_end(&mut lab, case, progress)?;
    let metrics = metrics
        .borrow()
        .iter()
        .map(|(k, v)| (k.clone(), round_metric(*v)))
        .collect();
    Ok(metrics)
}

fn serve_forever(lab: &mut Lab, configure: impl Fn(&mut NodeConfig) + 'static) {
    let configure = Rc::new(configure);
    lab.host("b", move |context| {
        let configure = configure.clone();
        async move {
            let mut config = context.node_config();
            configure(&mut config);
            let (node, _) = context.start_node(config).await?;
            node.handle(ECHO, |_, body: Bytes| async move { Ok(body) })?;
            std::future::pending::<()>().await;
            Ok(())
        }
    });
}

/// The address and identity of host `b`'s node.
fn node_b(lab: &Lab, case: &CaseFile) -> Result<(SocketAddr, meshwire::PeerId), ScenarioError> {
    let address = lab
        .node_address("b")
        .map_err(|error| ScenarioError::lab(case, error))?;
    Ok((address, lab.peer_id("b")))
}

/// Median round trip of echo requests on a warm connection.
fn rtt(
    lab: &mut Lab,
    case: &CaseFile,
    params: RttParams,
    metrics: Shared<Metrics>,
) -> Result<(), ScenarioError> {
    let samples = params.requests as usize;
    serve_forever(lab, |_| {});
    let (b, b_id) = node_b(lab, case)?;
    lab.client("a", move |context| async move {
        let (node, _) = context.start_node(context.node_config()).await?;
        node.connect(b, b_id).await?;
        // The first three round trips warm the connection and are not counted.
        let mut rtts = Vec::with_capacity(samples + 3);
        for _ in 0..samples + 3 {
            let started = Instant::now();
            let body = Bytes::from_static(b"ping");
            node.request(b_id, ECHO, body, Duration::from_secs(5))
                .await?;
            rtts.push(started.elapsed().as_secs_f64() * 1e3);
        }
        rtts.drain(..3);
        rtts.sort_by(f64::total_cmp);
        metrics
            .borrow_mut()
            .insert("rtt_ms".into(), rtts[rtts.len() / 2]);
        Ok(())
    });
    Ok(())
}

/// Goodput of a bulk stream of 1 MiB messages from a to b, first byte sent to last byte received.
fn bulk(
    lab: &mut Lab,
    case: &CaseFile,
    params: BulkParams,
    metrics: Shared<Metrics>,
) -> Result<(), ScenarioError> {
    let total_mib = params.mebibytes;
    let window_bytes = params.stream_window_bytes;
    let warmup_mib = params.warmup_mebibytes;
    let initial_window = match params.initial_window_bytes {
        0 => None,
        bytes => Some(bytes),
    };
    // Windows: the node's bandwidth-delay setting, or a fixed stream window (quinn's default is
    // 1.25 MB).
    let congestion = Congestion::from(params.congestion);
    let configure = move |config: &mut NodeConfig| {
        config.transport.congestion = congestion;
        config.transport.initial_window_bytes = initial_window;
        if window_bytes > 0 {
            config.transport.bandwidth_bits_per_sec = window_bytes * 8;
            config.transport.max_rtt = Duration::from_secs(1);
        }
    };
    // What b received: each message's bytes and when.
    let received: SharedLog<(u64, Duration)> = lab.shared_log("received");
    let received_bytes = {
        let received = received.clone();
        move || -> u64 { received.entries().iter().map(|(bytes, _)| bytes).sum() }
    };
    let expected = (total_mib + warmup_mib) << 20;
    {
        let received = received.clone();
        lab.host("b", move |context| {
            let received = received.clone();
            async move {
                let mut config = context.node_config();
                configure(&mut config);
                let (node, _) = context.start_node(config).await?;
                let mut inbox = node.subscribe(DATA)?;
                while let Some(message) = inbox.recv().await {
                    received.push((message.payload.len() as u64, clock()));
                }
                Ok(())
            }
        });
    }
    let (b, b_id) = node_b(lab, case)?;
    lab.client("a", move |context| async move {
        let mut config = context.node_config();
        configure(&mut config);
        let (node, stats) = context.start_node(config).await?;
        node.connect(b, b_id).await?;
        let chunk = Bytes::from(vec![0x5a; 1 << 20]);
        for _ in 0..warmup_mib {
            node.send(b_id, DATA, chunk.clone()).await?;
        }
        while received_bytes() < warmup_mib << 20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let started = clock();
        for _ in 0..total_mib {
            node.send(b_id, DATA, chunk.clone()).await?;
        }
        while received_bytes() < expected {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let finished = received.entries().last().map_or(started, |(_, at)| *at);
        let seconds = (finished - started).as_secs_f64();
        let bits = (total_mib << 20) as f64 * 8.0;
        let mut metrics = metrics.borrow_mut();
        metrics.insert("goodput_mbit_per_s".into(), bits / seconds / 1e6);
        metrics.insert(
            "sender_queue_drops".into(),
            crate::socket::SocketStats::get(&stats.queue_drops) as f64,
        );

        Ok(())
    });
    Ok(())
}

/// Host `b` reads raw datagrams on [`RAW_PORT`] and calls `on_datagram` for each.
fn raw_receiver(lab: &mut Lab, on_datagram: impl Fn() + 'static) {
    let on_datagram = Rc::new(on_datagram);
    lab.host("b", move |context| {
        let on_datagram = on_datagram.clone();
        async move {
            let socket = context.bind(RAW_PORT).await?;
            while socket.recv_datagram().await.is_some() {
                on_datagram();
            }
            Ok(())
        }
    });
}

/// Raw datagrams offered faster than a packets-per-second link: the delivered rate.
fn packet_rate(
    lab: &mut Lab,
    case: &CaseFile,
    params: PpsParams,
    metrics: Shared<Metrics>,
) -> Result<(), ScenarioError> {
    let PpsParams {
        seconds,
        offered_packets_per_s: offered,
    } = params;
    let arrivals: SharedLog<Duration> = lab.shared_log("arrivals");
    {
        let arrivals = arrivals.clone();
        raw_receiver(lab, move || arrivals.push(clock()));
    }
    let b = std::net::SocketAddr::new(
        lab.ip("b")
            .map_err(|error| ScenarioError::lab(case, error))?,
        RAW_PORT,
    );
    lab.client("a", move |context| async move {
        let socket = context.bind(RAW_PORT).await?;
        let payload = vec![0u8; 1024];
        let interval = Duration::from_secs(1) / offered as u32;
        let started = clock();
        let mut ticker = tokio::time::interval(Duration::from_millis(1));
        let mut sent = 0u64;
        while clock() - started < Duration::from_secs(seconds) {
            ticker.tick().await;
            let due = ((clock() - started).as_nanos() / interval.as_nanos().max(1)) as u64;
            while sent < due {
                socket.send_datagram(b, &payload, None);
                sent += 1;
            }
        }
        // Let the queue drain, then measure the steady middle: skip the first and last second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let arrivals = arrivals.entries();
        let from = started + Duration::from_secs(1);
        let to = started + Duration::from_secs(seconds.saturating_sub(1).max(2));
        let counted = arrivals
            .iter()
            .filter(|at| **at >= from && **at < to)
            .count();
        let window = (to - from).as_secs_f64();
        metrics
            .borrow_mut()
            .insert("goodput_packets_per_s".into(), counted as f64 / window);
        Ok(())
    });
    Ok(())
}

/// Raw datagrams over a lossy link: the share that never arrived.
fn loss(
    lab: &mut Lab,
    case: &CaseFile,
    params: LossParams,
    metrics: Shared<Metrics>,
) -> Result<(), ScenarioError> {
    let LossParams {
        datagrams,
        datagrams_per_ms: per_ms,
    } = params;
    let received: SharedLog<()> = lab.shared_log("received");
    {
        let received = received.clone();
        raw_receiver(lab, move || received.push(()));
    }
    let b = std::net::SocketAddr::new(
        lab.ip("b")
            .map_err(|error| ScenarioError::lab(case, error))?,
        RAW_PORT,
    );
    lab.client("a", move |context| async move {
        let socket = context.bind(RAW_PORT).await?;
        let payload = [1u8; 64];
        let mut sent = 0;
        while sent < datagrams {
            for _ in 0..per_ms.min(datagrams - sent) {
                socket.send_datagram(b, &payload, None);
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let arrived = received.len();
        metrics
            .borrow_mut()
            .insert("loss_ratio".into(), 1.0 - arrived as f64 / sent as f64);
        metrics
            .borrow_mut()
            .insert("datagrams_sent".into(), sent as f64);
        Ok(())
    });
    Ok(())
}

/// Messages every 10 ms across a link cut for a while: none may arrive during the cut, and how long
/// after the repair they flow again.
fn partition(
    lab: &mut Lab,
    case: &CaseFile,
    params: PartitionParams,
    metrics: Shared<Metrics>,
) -> Result<(), ScenarioError> {
    let cut_at = Duration::from_millis(params.partition_at_ms);
    let cut_for = Duration::from_millis(params.partition_ms);
    let run_for = Duration::from_millis(params.run_ms);
    let latency = Duration::from_millis(case.link.latency_ms);
    let arrivals: SharedLog<Duration> = lab.shared_log("arrivals");
    {
        let arrivals = arrivals.clone();
        lab.host("b", move |context| {
            let arrivals = arrivals.clone();
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                let mut inbox = node.subscribe(DATA)?;
                while inbox.recv().await.is_some() {
                    arrivals.push(clock());
                }
                Ok(())
            }
        });
    }
    let (b, b_id) = node_b(lab, case)?;
    lab.client("a", move |context| async move {
        let (node, _) = context.start_node(context.node_config()).await?;
        node.add_peer(b, b_id)?;
        let mut ticker = tokio::time::interval(Duration::from_millis(10));
        while clock() < run_for {
            ticker.tick().await;
            // A full queue is fine here: the partition is supposed to stop delivery.
            let _ = node.try_send(b_id, DATA, Bytes::from_static(b"tick"));
        }
        // Events are scheduled on the same simulation clock.
        let cut = cut_at;
        let repair = cut + cut_for;
        let arrivals = arrivals.entries();
        let during = arrivals
            .iter()
            .filter(|at| **at >= cut + latency && **at < repair)
            .count();
        let first_after = arrivals.iter().find(|at| **at >= repair);
        let mut metrics = metrics.borrow_mut();
        metrics.insert("delivered_during_partition".into(), during as f64);
        metrics.insert(
            "reconnect_ms".into(),
            first_after.map_or(f64::NAN, |at| (*at - repair).as_secs_f64() * 1e3),
        );
        Ok(())
    });
    lab.at(cut_at, LabEvent::Partition("a".into(), "b".into()));
    lab.at(cut_at + cut_for, LabEvent::Repair("a".into(), "b".into()));
    Ok(())
}
