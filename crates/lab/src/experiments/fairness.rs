//! Two meshwire flows through one bottleneck: does each get its share, and does a flow under one
//! congestion controller starve a flow under another (issue 15)?
//!
//! Hosts `a1` and `a2` each run a meshwire node with its own QUIC congestion controller
//! (`congestion_1`, `congestion_2`) and send 1 MiB messages to host `c`'s node, back to back (a
//! sender always has messages queued), from a common start, the second flow `stagger_ms` later,
//! each for `seconds` of lab time. `c` is each sender's configured peer, redialled if the
//! connection drops (a connection waiting for a staggered start beside a BBR flow can lose enough
//! to time out); a send refused between a drop and the redial is retried. Every link between the hosts (both directions) follows the
//! case's `link`: its latency, and its rate if it gives one (the scenarios leave it unlimited).
//! The bottleneck is `c`'s downlink ([`crate::Lab::downlink`]): every datagram to `c` passes one
//! serializer of `bottleneck_mbit_per_s` with one drop-tail queue of `queue_bytes` (or
//! `queue_bdp` round-trip bandwidth-delay products at the case's latency), after its sender's
//! link and before propagation. The lab admits datagrams to that queue in send order, which is
//! exact here because both senders have the same latency to `c`; turmoil runs the hosts in a
//! random order every tick ([`crate::Lab::new_random_order`]) so neither sender is always first
//! to the queue's free space.
//!
//! With `session_1`, flow 1 is a multipath session instead (`meshwire_session::net`, meshwire's
//! window policy, one direct path to `c`, writing 1 MiB buffers without pause); `c` reads it and
//! logs each 1 MiB read as a completion of flow 1. `claim_window_1` says whether the session
//! claims its window on its connection (`SessionSettings::claim_window`, on by default as there).
//!
//! This is its own kind rather than a `calibration` workload: it has three hosts instead of
//! calibration's `a` and `b`, a downlink, and runs in virtual time only (the downlink is not
//! emulated across the processes of `scripts/netns-lab.sh`, which runs calibration).
//!
//! # Metrics
//!
//! The flows start at `START` plus two round trips (both senders have connected by then). The
//! common interval runs from the second flow's start plus `warmup_ms` (slow start and its exit are
//! not the steady state asked about) to the first flow's end. Each flow's goodput over it counts
//! message payload bytes at `c`: `c` logs each message's completion, and a flow's bytes delivered
//! by time t are interpolated linearly between the completions around t (its start counts as 0
//! bytes), so the 1 MiB message granularity does not quantise short intervals. Bytes arrive before
//! their message completes (and under heavy loss behind retransmissions), so a flow's figure can be
//! off by up to about one message at each end of the interval: about 2% of 50 Mbit/s over 20 s,
//! enough for `utilization` to read slightly above what QUIC's framing allows. A sender keeps
//! going after its end until `c` has completed one of its messages past the interval (or 10 s
//! have passed), so the interpolation has a point on each side.
//!
//! * `goodput_1_mbit_per_s`, `goodput_2_mbit_per_s`: each flow's goodput over the interval;
//! * `share_1`, `share_2`: goodput ÷ (sum ÷ 2), an equal share being 1 (they sum to 2; issue 15
//!   asks for each in 0.6–1.6);
//! * `jain_index`: (x₁ + x₂)² ÷ (2 (x₁² + x₂²)), 1 when equal, 0.5 when one flow has everything;
//! * `utilization`: the sum ÷ the bottleneck rate (payload only, so QUIC's framing keeps it under
//!   about 0.97);
//! * `downlink_drops`: datagrams the bottleneck's queue dropped over the whole run;
//! * `measured_s`: the interval's length.

use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::DATA;
use meshwire::Congestion;
use meshwire_session::net::{SessionHost, SessionSettings};
use meshwire_session::proto::PathId;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{CongestionParam, Trial};
use crate::lab::{clock, Lab};
use crate::link::{LinkSpec, Rate};
use crate::placement::SharedLog;
use crate::scenario::ScenarioError;
use crate::stats::{round_metric, Metrics};
use crate::Mode;

/// When the first flow starts, before the two round trips added for the connections.
const START: Duration = Duration::from_millis(200);
/// How long a sender waits after its end for a completion past the interval.
const TAIL_LIMIT: Duration = Duration::from_secs(10);
/// The smallest queue: one full datagram.
const MIN_QUEUE_BYTES: u64 = 1500;

/// `fairness` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Congestion controller of flow 1 (host `a1`).
    pub congestion_1: CongestionParam,
    /// Congestion controller of flow 2 (host `a2`).
    pub congestion_2: CongestionParam,
    /// Rate of the bottleneck, `c`'s downlink, in Mbit/s.
    pub bottleneck_mbit_per_s: f64,
    /// The bottleneck's queue in round-trip bandwidth-delay products at the case's latency;
    /// neither this nor `queue_bytes`: one.
    pub queue_bdp: Option<f64>,
    /// The bottleneck's queue in bytes, instead of `queue_bdp`.
    pub queue_bytes: Option<u64>,
    /// How long each flow sends, in seconds of lab time.
    pub seconds: f64,
    /// How long after the first flow the second starts, in milliseconds.
    pub stagger_ms: u64,
    /// Time after the second flow's start that the measurement leaves out, in milliseconds.
    pub warmup_ms: u64,
    /// Whether flow 1 is a multipath session (`meshwire_session::net`, meshwire's window policy,
    /// one direct path) writing without pause instead of 1 MiB messages; its node still runs
    /// `congestion_1`.
    pub session_1: bool,
    /// With `session_1`: whether the session claims its window on its connection
    /// (`SessionSettings::claim_window`, on by default as there).
    pub claim_window_1: bool,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            congestion_1: CongestionParam::Cubic,
            congestion_2: CongestionParam::Cubic,
            bottleneck_mbit_per_s: 100.0,
            queue_bdp: None,
            queue_bytes: None,
            seconds: 30.0,
            stagger_ms: 0,
            warmup_ms: 5000,
            session_1: false,
            claim_window_1: SessionSettings::default().claim_window,
        }
    }
}

/// What a case's parameters come to, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The bottleneck: `c`'s downlink.
    pub downlink: LinkSpec,
    /// Each flow's start, from the start of the run.
    pub starts: [Duration; 2],
    /// How long each flow sends.
    pub sending: Duration,
    /// The common interval measured.
    pub measure: (Duration, Duration),
}

/// Checks `params` against `link` and lays out the run. Errors name the parameter.
pub fn plan(params: &Params, link: &LinkSpec) -> Result<Plan, String> {
    let mbit = params.bottleneck_mbit_per_s;
    if !(mbit.is_finite() && mbit > 0.0) {
        return Err(format!(
            "bottleneck_mbit_per_s {mbit} is not a positive rate"
        ));
    }
    let bits = (mbit * 1e6) as u64;
    if bits == 0 {
        return Err(format!("bottleneck_mbit_per_s {mbit} is under 1 bit/s"));
    }
    let round_trip = 2 * link.latency;
    let queue_bytes = match (params.queue_bytes, params.queue_bdp) {
        (Some(_), Some(_)) => return Err("give queue_bytes or queue_bdp, not both".into()),
        (Some(bytes), None) => bytes,
        (None, bdp) => {
            let bdp = bdp.unwrap_or(1.0);
            if !(bdp.is_finite() && bdp > 0.0) {
                return Err(format!("queue_bdp {bdp} is not positive"));
            }
            (bits as f64 / 8.0 * round_trip.as_secs_f64() * bdp) as u64
        }
    };
    if queue_bytes < MIN_QUEUE_BYTES {
        let field = if params.queue_bytes.is_some() {
            "queue_bytes"
        } else {
            "queue_bdp"
        };
        return Err(format!(
            "{field}: a queue of {queue_bytes} bytes does not hold one {MIN_QUEUE_BYTES}-byte datagram"
        ));
    }
    let seconds = params.seconds;
    if !(seconds.is_finite() && seconds > 0.0 && seconds < 86_400.0) {
        return Err(format!(
            "seconds {seconds} is not a positive duration under a day"
        ));
    }
    let sending = Duration::from_secs_f64(seconds);
    let stagger = Duration::from_millis(params.stagger_ms);
    let warmup = Duration::from_millis(params.warmup_ms);
    if stagger + warmup >= sending {
        return Err(format!(
            "seconds {seconds} leaves nothing to measure after stagger_ms {} and warmup_ms {}",
            params.stagger_ms, params.warmup_ms
        ));
    }
    let first = START + 2 * round_trip;
    let second = first + stagger;
    Ok(Plan {
        downlink: LinkSpec {
            latency: Duration::ZERO,
            rate: Rate::BitsPerSec(bits),
            queue_bytes: usize::try_from(queue_bytes).unwrap_or(usize::MAX),
            loss: 0.0,
            jitter: Duration::ZERO,
        },
        starts: [first, second],
        sending,
        measure: (second + warmup, first + sending),
    })
}

/// One message's completion at `c`: the flow (0 or 1), its payload bytes, when.
type Completion = (u8, u64, Duration);

/// Runs one fairness case and returns its metrics.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let case = trial.case;
    if trial.mode != Mode::Virtual {
        return Err(trial.failed("fairness runs in virtual time only"));
    }
    let link = case.link.spec().map_err(|reason| trial.failed(reason))?;
    let params: Params = trial.params()?;
    let plan = plan(&params, &link).map_err(|reason| trial.failed(reason))?;
    let mut lab = Lab::new_random_order(trial.seed, link, case.duration() + Duration::from_secs(1));
    let completions: SharedLog<Completion> = lab.shared_log("completions");
    receiver(&mut lab, completions.clone(), params.session_1);
    let c = lab
        .node_address("c")
        .map_err(|error| ScenarioError::lab(case, error))?;
    let c_id = lab.peer_id("c");
    let controllers = [params.congestion_1, params.congestion_2];
    let session_1 = params.session_1;
    let session_settings = SessionSettings {
        claim_window: params.claim_window_1,
        ..SessionSettings::default()
    };
    for (flow, name) in ["a1", "a2"].into_iter().enumerate() {
        let congestion = Congestion::from(controllers[flow]);
        let completions = completions.clone();
        let start = plan.starts[flow];
        let end = start + plan.sending;
        let measure_end = plan.measure.1;
        lab.client(name, move |context| async move {
            let mut config = context.node_config();
            config.transport.congestion = congestion;
            let (node, _) = context.start_node(config).await?;
            // A configured peer: redialled if the connection drops (a quiet connection beside a
            // flow that fills the queue can lose enough to time out).
            node.add_peer(c, c_id)?;
            node.connect(c, c_id).await?;
            tokio::time::sleep(start.saturating_sub(clock())).await;
            let chunk = Bytes::from(vec![0x5a; 1 << 20]);
            let session_flow = flow == 0 && session_1;
            // The session writes until the flow's end, then keeps its paths until the run ends.
            let _session = if session_flow {
                let host = SessionHost::new(&node, session_settings)?;
                let session = host.open(c_id)?;
                session.add_direct_path(PathId(0))?;
                while clock() < end {
                    (&session).write_all(&chunk).await?;
                }
                Some((host, session))
            } else {
                None
            };
            while !session_flow && clock() < end {
                if node.send(c_id, DATA, chunk.clone()).await.is_err() {
                    // Between a drop and the redial: the flow keeps trying.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            let flow = flow as u8;
            let past_interval = || {
                completions
                    .entries()
                    .iter()
                    .any(|(from, _, at)| *from == flow && *at >= measure_end)
            };
            while !past_interval() && clock() < end + TAIL_LIMIT {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(())
        });
    }
    for (a, b) in [("a1", "c"), ("a2", "c")] {
        lab.link_both(a, b, link)
            .map_err(|error| ScenarioError::lab(case, error))?;
    }
    lab.downlink("c", plan.downlink)
        .map_err(|error| ScenarioError::lab(case, error))?;
    crate::scenario::run_case_to_end(&mut lab, case, progress)?;
    let drops = lab
        .downlink_stats("c")
        .map_err(|error| ScenarioError::lab(case, error))?
        .map_or(0, |stats| stats.drops);
    let completions = completions.entries();
    let metrics = measure(&completions, &plan, drops);
    Ok(metrics
        .into_iter()
        .map(|(name, value)| (name, round_metric(value)))
        .collect())
}

/// Host `c`: a node that logs every message's completion by flow, and with `session_1` every
/// 1 MiB read from flow 1's session as one completion.
fn receiver(lab: &mut Lab, completions: SharedLog<Completion>, session_1: bool) {
    let senders = [lab.peer_id("a1"), lab.peer_id("a2")];
    lab.host("c", move |context| {
        let completions = completions.clone();
        async move {
            let (node, _) = context.start_node(context.node_config()).await?;
            let mut inbox = node.subscribe(DATA)?;
            let host = if session_1 {
                Some(SessionHost::new(&node, SessionSettings::default())?)
            } else {
                None
            };
            let session = async {
                let Some(host) = &host else {
                    return std::future::pending().await;
                };
                let mut incoming = host.incoming();
                let Some(mut session) = incoming.recv().await else {
                    return std::future::pending().await;
                };
                let mut buf = vec![0u8; 1 << 20];
                while session.read_exact(&mut buf).await.is_ok() {
                    completions.push((0, buf.len() as u64, clock()));
                }
                std::future::pending::<()>().await;
            };
            let messages = async {
                while let Some(message) = inbox.recv().await {
                    if let Some(flow) = senders.iter().position(|peer| *peer == message.from) {
                        completions.push((flow as u8, message.payload.len() as u64, clock()));
                    }
                }
            };
            tokio::select! {
                () = session => {}
                () = messages => {}
            }
            Ok(())
        }
    });
}

/// The metrics of a run whose completions at `c` were `completions` (see the module docs).
pub fn measure(completions: &[Completion], plan: &Plan, downlink_drops: u64) -> Metrics {
    let (from, to) = plan.measure;
    let seconds = (to - from).as_secs_f64();
    let goodput = |flow: u8| {
        let mut points = vec![(plan.starts[usize::from(flow)], 0u64)];
        let mut total = 0;
        for (_, bytes, at) in completions.iter().filter(|(of, _, _)| *of == flow) {
            total += bytes;
            points.push((*at, total));
        }
        points.sort_unstable();
        let delivered = bytes_by(&points, to) - bytes_by(&points, from);
        delivered * 8.0 / seconds / 1e6
    };
    let (one, two) = (goodput(0), goodput(1));
    let sum = one + two;
    let share = |flow: f64| {
        if sum > 0.0 {
            flow / (sum / 2.0)
        } else {
            f64::NAN
        }
    };
    let jain = if sum > 0.0 {
        sum * sum / (2.0 * (one * one + two * two))
    } else {
        f64::NAN
    };
    let bottleneck = plan.downlink.rate.bit_rate().unwrap_or(u64::MAX) as f64 / 1e6;
    Metrics::from([
        ("goodput_1_mbit_per_s".into(), one),
        ("goodput_2_mbit_per_s".into(), two),
        ("share_1".into(), share(one)),
        ("share_2".into(), share(two)),
        ("jain_index".into(), jain),
        ("utilization".into(), sum / bottleneck),
        ("downlink_drops".into(), downlink_drops as f64),
        ("measured_s".into(), seconds),
    ])
}

/// Bytes delivered by `at` on the curve through `points` (time-ordered, cumulative bytes):
/// linear between points, flat after the last.
fn bytes_by(points: &[(Duration, u64)], at: Duration) -> f64 {
    let after = points.partition_point(|(time, _)| *time <= at);
    match (
        after.checked_sub(1).map(|i| points[i]),
        points.get(after).copied(),
    ) {
        (Some((t0, b0)), Some((t1, b1))) => {
            let span = (t1 - t0).as_secs_f64();
            let into = (at - t0).as_secs_f64();
            b0 as f64 + (b1 - b0) as f64 * if span > 0.0 { into / span } else { 1.0 }
        }
        (Some((_, bytes)), None) => bytes as f64,
        (None, _) => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(latency_ms: u64) -> LinkSpec {
        LinkSpec {
            latency: Duration::from_millis(latency_ms),
            ..LinkSpec::default()
        }
    }

    #[test]
    fn the_queue_is_a_bandwidth_delay_product_or_bytes() {
        let params = Params::default();
        // 100 Mbit/s × 100 ms round trip = 1.25 MB.
        let plan = plan(&params, &link(50)).unwrap();
        assert_eq!(plan.downlink.rate, Rate::BitsPerSec(100_000_000));
        assert_eq!(plan.downlink.queue_bytes, 1_250_000);
        let quarter = Params {
            queue_bdp: Some(0.25),
            ..params
        };
        assert_eq!(
            super::plan(&quarter, &link(50))
                .unwrap()
                .downlink
                .queue_bytes,
            312_500
        );
        let bytes = Params {
            queue_bytes: Some(50_000),
            ..params
        };
        assert_eq!(
            super::plan(&bytes, &link(50)).unwrap().downlink.queue_bytes,
            50_000
        );
    }

    #[test]
    fn bad_parameters_are_refused_naming_them() {
        let base = Params::default();
        let refused = |params: Params| plan(&params, &link(50)).unwrap_err();
        let zero_rate = refused(Params {
            bottleneck_mbit_per_s: 0.0,
            ..base
        });
        assert!(zero_rate.contains("bottleneck_mbit_per_s"), "{zero_rate}");
        let both = refused(Params {
            queue_bytes: Some(10_000),
            queue_bdp: Some(2.0),
            ..base
        });
        assert!(both.contains("queue_bytes") && both.contains("queue_bdp"));
        let tiny = refused(Params {
            queue_bytes: Some(100),
            ..base
        });
        assert!(tiny.starts_with("queue_bytes"), "{tiny}");
        let no_queue = refused(Params {
            queue_bdp: Some(0.0),
            ..base
        });
        assert!(no_queue.contains("queue_bdp"), "{no_queue}");
        let nothing_left = refused(Params {
            seconds: 5.0,
            ..base
        });
        assert!(nothing_left.contains("warmup_ms"), "{nothing_left}");
    }

    #[test]
    fn goodput_interpolates_between_completions() {
        let plan = Plan {
            downlink: LinkSpec {
                rate: Rate::BitsPerSec(16_000_000),
                ..link(0)
            },
            starts: [Duration::ZERO, Duration::ZERO],
            sending: Duration::from_secs(4),
            measure: (Duration::from_secs(1), Duration::from_secs(3)),
        };
        let mib = 1 << 20;
        let s = Duration::from_secs;
        // Flow 0: 1 MiB every second; flow 1: 1 MiB every two seconds.
        let completions: Vec<Completion> = vec![
            (0, mib, s(1)),
            (0, mib, s(2)),
            (1, mib, s(2)),
            (0, mib, s(3)),
            (1, mib, s(4)),
        ];
        let metrics = measure(&completions, &plan, 7);
        let one = metrics["goodput_1_mbit_per_s"];
        let two = metrics["goodput_2_mbit_per_s"];
        assert!((one - mib as f64 * 8.0 / 1e6).abs() < 1e-9, "{one}");
        assert!((two - one / 2.0).abs() < 1e-9, "{two}");
        assert!((metrics["share_1"] + metrics["share_2"] - 2.0).abs() < 1e-12);
        assert!((metrics["share_1"] - 4.0 / 3.0).abs() < 1e-9);
        assert!((metrics["jain_index"] - 0.9).abs() < 1e-9);
        assert_eq!(metrics["downlink_drops"], 7.0);
        assert_eq!(metrics["measured_s"], 2.0);
        assert!((metrics["utilization"] - (one + two) / 16.0).abs() < 1e-12);
    }
}
