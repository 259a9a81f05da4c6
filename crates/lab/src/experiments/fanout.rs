//! One message to many peers: meshwire's encode-once `send_many` against a sender that serialises
//! the message again for every destination (the Safe Network's "before", `docs/lessons.md`).
//!
//! A `sender` host connects to `peers` receiver hosts, then sends one `payload_bytes` message to
//! all of them. Receivers hash what they get (SHA-256) so delivery is checked byte for byte.
//!
//! `sender_heap_peak_bytes` is the high-water mark of the sender's live heap during the fan-out,
//! above what it held just before. It is counted by [`meshwire_alloc_count`] (which must be the
//! global allocator): every allocation made while the sender host's tokio runtime is the current
//! one counts, whichever task makes it — the node, quinn, the application. Receivers' memory and
//! the emulated network's queues (the lab's `LabSocket` runs untracked) do not count. The caller's
//! payload exists before the measurement starts, so it is not counted either; a naive sender's
//! per-destination copies are.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::FANOUT;

use serde::Deserialize;

use super::Trial;
use crate::lab::{clock, Lab};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Receivers.
    pub peers: u64,
    /// Size of the one message.
    pub payload_bytes: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            peers: 100,
            payload_bytes: 1 << 20,
        }
    }
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
    let metrics: Rc<RefCell<Metrics>> = Rc::default();
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
            let payload: Bytes = (0..payload_bytes).map(|i| (i * 7 % 251) as u8).collect();
            let expected = digest(&payload);

            SENDER_RUNTIME.store(
                runtime_key(tokio::runtime::Handle::current().id()),
                Ordering::SeqCst,
            );
            meshwire_alloc_count::set_tracker(in_sender_runtime);
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
