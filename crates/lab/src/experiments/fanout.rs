//! One message to many peers: meshwire's encode-once `send_many` against a sender that serialises
//! the message again for every destination (the Safe Network's "before", `docs/lessons.md`).
//!
//! A `sender` host connects to `peers` receiver hosts, then sends one `payload_bytes` message to
//! all of them. Receivers hash what they get (SHA-256) so delivery is checked byte for byte. Every
//! link (sender to each receiver and back) follows the case's `link`, each rated on its own; with
//! `sender_uplink_mbit_per_s`, every datagram the sender sends also passes one shared uplink of
//! that rate first (the lab's host uplink: its own serializer and drop-tail queue, no latency), as
//! a node's one network interface would.
//!
//! `sender_heap_peak_bytes` is the high-water mark of the sender's live heap from just before the
//! payload is built until every peer holds it, above what the sender held before. It is counted
//! by [`meshwire_alloc_count`] (which must be the global allocator): every allocation made while
//! the sender host's tokio runtime is the current one counts, whichever task makes it — the node,
//! quinn, the application. The payload itself is built inside that span and held to its end, so
//! it counts once; a naive sender's per-destination copies count too. Receivers' memory and the
//! emulated network's queues (the lab's `LabSocket` runs untracked) do not count.
//!
//! # Floors
//!
//! * `heap_floor_bytes` = `payload_bytes`: whatever the policy, the sender holds the message until
//!   the last peer has it, and nothing else is necessary (headers and per-peer state are smaller
//!   than any payload worth measuring, and not counted). `sender_heap_peak_bytes` ≥ it always.
//! * `completion_floor_ms` ([`completion_floor_s`]): the link's one-way latency plus the longer of
//!   one payload through one link and every peer's payload through the shared uplink (absent an
//!   uplink, the links are independent and only the first term binds), for `completion_ms` (the
//!   send call to the last byte-identical arrival).
//!
//! # What the heap above the payload is
//!
//! Bookkeeping of data in flight, which grows with each connection's window, not with the peers'
//! count. The payload's bytes are shared (quinn's send buffers hold references to them), but quinn
//! keeps a record per packet sent and not yet acknowledged (its sent-packet map, the stream
//! ranges each packet carried): about 14–16% of the bytes in flight. Measured on the fan-out
//! sweep's case 4 at seed 1 (4.58 MB to 22 peers, 54 ms, 497 Mbit/s links behind a 1 Gbit/s
//! uplink) with quinn's per-connection send window capped by a temporary override: the heap above
//! the payload was 6.93 MB with the default window (50 MB), 6.06 MB at 4 MB per connection,
//! 3.15 MB at 1 MB (14.3% of 22 × 1 MB) and 1.05 MB at 300 KB (15.9% of 22 × 300 KB), while
//! completion went from 1,375 ms to 1,470, 2,020 and 2,481 ms (floor 860 ms). Keeping the uplink
//! busy takes its bandwidth-delay product in flight (about 13.5 MB there), and its bookkeeping,
//! about 1.9 MB or 86 KB per peer, is already above issue 15's "one payload + 16 KiB per peer"
//! in the large-payload cases, so that target cannot be met by bounding buffers alone: it needs
//! leaner per-packet state than quinn keeps. The sweep's cases over it (11 of 24 at seeds 1–3)
//! are the ones whose payloads are large enough for windows of hundreds of KB.
use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::FANOUT;

use serde::Deserialize;

use super::Trial;
use crate::lab::{clock, Lab, LAB_MTU};
use crate::link::{LinkSpec, Rate};
use crate::scenario::ScenarioError;
use crate::stats::{round_metric, Metrics};

static SENDER_RUNTIME: AtomicU64 = AtomicU64::new(0);

/// A receiver's SHA-256 of what arrived, and when.
type Arrival = ([u8; 32], Duration);

fn runtime_key(id: tokio::runtime::Id) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish() | 1
}

/// The allocation hook: true while the sender's runtime is the current one. Allocates nothing.
fn in_sender_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .map(|handle| runtime_key(handle.id()) == SENDER_RUNTIME.load(Ordering::Relaxed))
        .unwrap_or(false)
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    meshwire::proto::hash::sha256(&[bytes])
}

/// `fanout` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Receivers.
    pub peers: u64,
    /// Size of the one message.
    pub payload_bytes: u64,
    /// Rate of the sender's one uplink, which all its datagrams pass before their link; absent:
    /// no shared uplink, every link rated on its own.
    pub sender_uplink_mbit_per_s: Option<f64>,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            peers: 100,
            payload_bytes: 1 << 20,
            sender_uplink_mbit_per_s: None,
        }
    }
}

/// Payload bytes per second `rate` carries at most: a bit rate counts every byte as payload
/// (headers only lower the true figure); a packet rate carries at most one full datagram of
/// [`LAB_MTU`] bytes each.
fn payload_bytes_per_s(rate: Rate) -> f64 {
    match rate {
        Rate::Unlimited => f64::INFINITY,
        Rate::BitsPerSec(bits) => bits as f64 / 8.0,
        Rate::PacketsPerSec(packets) => packets as f64 * f64::from(LAB_MTU),
    }
}

/// The physical floor of `completion_ms`, in seconds: every receiver holds the payload no sooner
/// than the link's one-way latency plus the longer of
///
/// * one payload through one link: `payload ÷ (link rate × (1 − loss))`, and
/// * every peer's payload through the sender's shared uplink:
///   `peers × payload ÷ (uplink rate × (1 − loss))` (absent an uplink, nothing is shared),
///
/// where a rate counts payload bytes only (`payload_bytes_per_s`: framing, QUIC and handshakes
/// are free) and loss is the link's i.i.d. loss at its expected value (the lab draws loss after a
/// datagram has passed the uplink and its link, so a lost datagram has used both). Jitter, queues,
/// congestion control and the serialization of the first datagram at every hop are left out, which
/// only lowers the floor.
pub fn completion_floor_s(
    peers: u64,
    payload_bytes: u64,
    link: &LinkSpec,
    uplink: Option<Rate>,
) -> f64 {
    let payload = payload_bytes as f64;
    let delivered = 1.0 - link.loss;
    let per_link = payload / (payload_bytes_per_s(link.rate) * delivered);
    let shared = uplink.map_or(0.0, |rate| {
        peers as f64 * payload / (payload_bytes_per_s(rate) * delivered)
    });
    link.latency.as_secs_f64() + per_link.max(shared)
}

/// The sender's uplink for `mbit_per_s`: no latency of its own (the links have it), a drop-tail
/// queue of one round trip of the link at the uplink's rate, at least 64 KiB.
fn uplink_spec(mbit_per_s: f64, link: &LinkSpec) -> Result<LinkSpec, String> {
    if mbit_per_s.is_nan() || mbit_per_s <= 0.0 {
        return Err(format!(
            "sender_uplink_mbit_per_s {mbit_per_s} is not positive"
        ));
    }
    let bits = (mbit_per_s * 1e6) as u64;
    let round_trip = (u128::from(bits) * link.latency.as_micros() * 2 / 8_000_000) as usize;
    Ok(LinkSpec {
        latency: Duration::ZERO,
        rate: Rate::BitsPerSec(bits),
        queue_bytes: round_trip.max(64 * 1024),
        loss: 0.0,
        jitter: Duration::ZERO,
    })
}

/// Runs one fan-out case under the trial's policy (`meshwire` or `naive`).
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let (case, seed, policy) = (trial.case, trial.seed, trial.policy);
    if !meshwire_alloc_count::is_installed() {
        return Err(ScenarioError::failed(
            case,
            "the counting allocator is not this binary's global allocator, so the sender's heap \
             cannot be measured",
        ));
    }
    let naive = match policy {
        "meshwire" => false,
        "naive" => true,
        other => {
            return Err(ScenarioError::failed(
                case,
                format!("unknown policy {other:?}"),
            ))
        }
    };
    let params: Params = trial.params()?;
    let peers = params.peers as usize;
    let payload_bytes = params.payload_bytes as usize;
    let spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let uplink = params
        .sender_uplink_mbit_per_s
        .map(|mbit| uplink_spec(mbit, &spec))
        .transpose()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let mut floors = Metrics::new();
    floors.insert("heap_floor_bytes".into(), payload_bytes as f64);
    floors.insert(
        "completion_floor_ms".into(),
        round_metric(
            completion_floor_s(
                params.peers,
                params.payload_bytes,
                &spec,
                uplink.map(|uplink| uplink.rate),
            ) * 1e3,
        ),
    );
    let mut lab = Lab::new(seed, spec, case.duration() + Duration::from_secs(1));
    let arrivals: Rc<RefCell<Vec<Arrival>>> = Rc::default();
    let names: Vec<String> = (0..peers).map(|index| format!("r{index:03}")).collect();
    for name in &names {
        let arrivals = arrivals.clone();
        lab.host(name, move |context| {
            let arrivals = arrivals.clone();
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                let mut inbox = node.subscribe(FANOUT)?;
                while let Some(message) = inbox.recv().await {
                    arrivals
                        .borrow_mut()
                        .push((digest(&message.payload), clock()));
                }
                Ok(())
            }
        });
    }
    let targets: Vec<_> = names
        .iter()
        .map(|name| Ok((lab.node_address(name)?, lab.peer_id(name))))
        .collect::<Result<_, crate::LabError>>()
        .map_err(|error| ScenarioError::lab(case, error))?;
    let metrics: Rc<RefCell<Metrics>> = Rc::new(RefCell::new(floors));
    {
        let metrics = metrics.clone();
        let arrivals = arrivals.clone();
        lab.client("sender", move |context| async move {
            let (node, _) = context.start_node(context.node_config()).await?;
            let mut dials = Vec::new();
            for (address, peer) in targets.iter().copied() {
                let node = node.clone();
                dials.push(tokio::task::spawn_local(async move {
                    node.connect(address, peer).await
                }));
            }
            for dial in dials {
                dial.await??;
            }
            let ids: Vec<_> = targets.iter().map(|(_, peer)| *peer).collect();

            SENDER_RUNTIME.store(
                runtime_key(tokio::runtime::Handle::current().id()),
                Ordering::SeqCst,
            );
            meshwire_alloc_count::set_tracker(in_sender_runtime);
            // Built inside the measured span and held to its end: the one payload every policy
            // must hold counts once.
            let payload: Bytes = (0..payload_bytes).map(|i| (i * 7 % 251) as u8).collect();
            let expected = digest(&payload);
            let started = clock();
            if naive {
                for peer in &ids {
                    // The whole message serialised again for this destination.
                    let copy = Bytes::copy_from_slice(&payload);
                    node.send(*peer, FANOUT, copy).await?;
                }
            } else {
                let report = node.send_many(&ids, FANOUT, payload.clone())?;
                if !report.failed.is_empty() {
                    return Err(format!("send_many refused {} peers", report.failed.len()).into());
                }
            }
            while arrivals.borrow().len() < ids.len() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let (_, peak) = meshwire_alloc_count::tracked_live_and_peak();
            meshwire_alloc_count::clear_tracker();
            let arrivals = arrivals.borrow();
            let identical = arrivals
                .iter()
                .filter(|(hash, _)| *hash == expected)
                .count();
            let last = arrivals.iter().map(|(_, at)| *at).max().unwrap_or(started);
            let mut metrics = metrics.borrow_mut();
            metrics.insert(
                "delivered_ratio".into(),
                round_metric(identical as f64 / ids.len() as f64),
            );
            metrics.insert(
                "completion_ms".into(),
                round_metric((last - started).as_secs_f64() * 1e3),
            );
            metrics.insert("sender_heap_peak_bytes".into(), peak.max(0) as f64);
            Ok(())
        });
    }
    if let Some(uplink) = uplink {
        lab.uplink("sender", uplink)
            .map_err(|error| ScenarioError::lab(case, error))?;
    }
    let finished = lab
        .run(case.duration(), progress)
        .map_err(|error| ScenarioError::lab(case, error))?;
    meshwire_alloc_count::clear_tracker();
    if !finished {
        return Err(ScenarioError::failed(
            case,
            format!(
                "not every peer received the message within {} s of virtual time",
                case.duration_s
            ),
        ));
    }
    let metrics = metrics.borrow().clone();
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(latency_ms: u64, rate: Rate, loss: f64) -> LinkSpec {
        LinkSpec {
            latency: Duration::from_millis(latency_ms),
            rate,
            loss,
            ..LinkSpec::default()
        }
    }

    #[test]
    fn the_completion_floor_is_latency_plus_the_busier_of_link_and_uplink() {
        let gigabit = link(20, Rate::BitsPerSec(1_000_000_000), 0.0);
        // Independent links: 20 ms + 1 MiB at 125 MB/s = 28.389 ms, whatever the peer count.
        let alone = completion_floor_s(100, 1 << 20, &gigabit, None);
        assert!(
            (alone - (0.02 + 1_048_576.0 / 125e6)).abs() < 1e-12,
            "{alone}"
        );
        // A shared 1 Gbit/s uplink: 100 MiB through it, 20 ms + 838.9 ms.
        let shared = completion_floor_s(100, 1 << 20, &gigabit, Some(gigabit.rate));
        assert!(
            (shared - (0.02 + 104_857_600.0 / 125e6)).abs() < 1e-12,
            "{shared}"
        );
        // A fast uplink leaves the link as the bottleneck.
        let fast = completion_floor_s(2, 1 << 20, &gigabit, Some(Rate::BitsPerSec(10_000_000_000)));
        assert!((fast - alone).abs() < 1e-12);
        // 10 % loss costs a tenth of every datagram's place; no rate at all leaves the latency.
        let lossy = link(20, Rate::BitsPerSec(1_000_000_000), 0.1);
        let lost = completion_floor_s(1, 1 << 20, &lossy, None);
        assert!(
            (lost - (0.02 + 1_048_576.0 / 112.5e6)).abs() < 1e-12,
            "{lost}"
        );
        let unlimited = link(5, Rate::Unlimited, 0.0);
        assert_eq!(completion_floor_s(300, 8 << 20, &unlimited, None), 0.005);
    }

    #[test]
    fn the_uplink_queues_one_round_trip() {
        let gigabit = link(20, Rate::BitsPerSec(1_000_000_000), 0.0);
        let uplink = uplink_spec(1000.0, &gigabit).unwrap();
        assert_eq!(uplink.rate, Rate::BitsPerSec(1_000_000_000));
        assert_eq!(uplink.queue_bytes, 5_000_000);
        assert_eq!(uplink.latency, Duration::ZERO);
        assert!(uplink_spec(0.0, &gigabit).is_err());
    }
}
