//! Measure what the lab itself costs: many nodes in a full mesh exchanging small requests.
//!
//! Every host runs a node that dials every host listed before it (so each pair has one
//! connection), answers echo requests, and sends its share of the request load to peers drawn
//! from its own seeded RNG. The metrics count completed and failed requests and the wall-clock
//! seconds the run took on this machine (the only metric of any scenario that varies between runs).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::ECHO;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use serde::Deserialize;

use super::Trial;
use crate::lab::{clock, derive_seed, Lab};
use crate::scenario::ScenarioError;
use crate::stats::{percentile_f64, round_metric, Metrics};

#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    failed: u64,
    connected_pairs: u64,
    latency_ms: Vec<f64>,
}

/// `mesh-requests` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Nodes in the full mesh.
    pub nodes: u64,
    /// Requests per second, all nodes together.
    pub requests_per_s: u64,
    /// Time before requests start (connections come up).
    pub warmup_ms: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            nodes: 56,
            requests_per_s: 300,
            warmup_ms: 2000,
        }
    }
}

/// Runs one scale case: `nodes` hosts, `requests_per_s` in total, for the case's duration.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let (case, seed) = (trial.case, trial.seed);
    let params: Params = trial.params()?;
    let nodes = params.nodes as usize;
    let rate = params.requests_per_s;
    let warmup = Duration::from_millis(params.warmup_ms);
    let duration = case.duration();
    if nodes < 2 || rate == 0 {
        return Err(ScenarioError::failed(
            case,
            "needs at least 2 nodes and a positive request rate",
        ));
    }
    let spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let wall = std::time::Instant::now();
    let mut lab = Lab::new(seed, spec, warmup + duration + Duration::from_secs(5));
    let names: Vec<String> = (0..nodes).map(|index| format!("n{index:03}")).collect();
    let ids: Vec<_> = names.iter().map(|name| lab.peer_id(name)).collect();
    let tally: Rc<RefCell<Tally>> = Rc::default();
    // Addresses are known only once hosts exist: register them all first, then hand the list over.
    let directory: Rc<RefCell<Vec<std::net::SocketAddr>>> = Rc::default();
    let per_node_interval = Duration::from_secs_f64(nodes as f64 / rate as f64);
    for (index, name) in names.iter().enumerate() {
        let tally = tally.clone();
        let directory = directory.clone();
        let ids = ids.clone();
        let stop_at = warmup + duration;
        lab.host(name, move |context| {
            let tally = tally.clone();
            let directory = directory.clone();
            let ids = ids.clone();
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                node.handle(ECHO, |_, body: Bytes| async move { Ok(body) })?;
                let addresses = directory.borrow().clone();
                for (peer, address) in ids.iter().zip(&addresses).take(index) {
                    node.add_peer(*address, *peer)?;
                }
                let mut rng = SmallRng::seed_from_u64(derive_seed(context.seed, &context.name, 7));
                // Spread the nodes' request clocks over one interval.
                let offset = per_node_interval.mul_f64(rng.random::<f64>());
                tokio::time::sleep(warmup.saturating_sub(clock()) + offset).await;
                tally.borrow_mut().connected_pairs += node.connected_peers().len() as u64;
                let mut ticker = tokio::time::interval(per_node_interval);
                while clock() < stop_at {
                    ticker.tick().await;
                    let mut target = rng.random_range(0..ids.len() - 1);
                    if target >= index {
                        target += 1;
                    }
                    let node = node.clone();
                    let tally = tally.clone();
                    let peer = ids[target];
                    tokio::task::spawn_local(async move {
                        let started = clock();
                        let body = Bytes::from_static(&[0u8; 64]);
                        match node.request(peer, ECHO, body, Duration::from_secs(2)).await {
                            Ok(_) => {
                                let mut tally = tally.borrow_mut();
                                tally.ok += 1;
                                tally
                                    .latency_ms
                                    .push((clock() - started).as_secs_f64() * 1e3);
                            }
                            Err(_) => tally.borrow_mut().failed += 1,
                        }
                    });
                }
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    *directory.borrow_mut() = names
        .iter()
        .map(|name| lab.node_address(name))
        .collect::<Result<_, _>>()
        .map_err(|error| ScenarioError::lab(case, error))?;
    lab.run(warmup + duration + Duration::from_secs(3), progress)
        .map_err(|error| ScenarioError::lab(case, error))?;
    let wall_seconds = wall.elapsed().as_secs_f64();
    let tally = tally.borrow();
    let mut latencies = tally.latency_ms.clone();
    latencies.sort_by(f64::total_cmp);
    let p99 = percentile_f64(&latencies, 0.99);
    let mut metrics = BTreeMap::new();
    metrics.insert("nodes".into(), nodes as f64);
    metrics.insert("requests_ok".into(), tally.ok as f64);
    metrics.insert("requests_failed".into(), tally.failed as f64);
    metrics.insert("request_ms_p99".into(), round_metric(p99));
    metrics.insert(
        "mesh_completeness".into(),
        round_metric(tally.connected_pairs as f64 / (nodes * (nodes - 1)) as f64),
    );
    metrics.insert(
        "virtual_s".into(),
        round_metric((warmup + duration).as_secs_f64()),
    );
    metrics.insert("wall_clock_s".into(), round_metric(wall_seconds));
    Ok(metrics)
}
