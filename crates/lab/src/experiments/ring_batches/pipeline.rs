//! The ring on meshwire pipelines: the `meshwire` (one batch at a time) and
//! `meshwire-pipelined` (K batches in flight) policies.
//!
//! Hosts `n0` (the first node, a client) to `n{N-1}` form a ring; every node configures its
//! successor as a peer (so it redials with backoff after an outage) and runs a
//! [`meshwire::pipeline::Pipeline`] whose transform models the node's work:
//! - compute: before forwarding a batch's first chunk, the node holds its one "CPU" for
//!   `compute_ms` (a batch-wide step, as a mix is); other batches wait for the CPU;
//! - content: every byte is incremented by one, so after the ring each byte is `+N` and tests can
//!   check every node worked on every chunk.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::pipeline::{BatchInput, Pipeline, PipelineConfig, Transform};
use meshwire::protocols::HOP;
use meshwire::{BatchHeader, Chunk, Congestion, Node, NodeConfig, PeerId};

use super::workload::{team_batch, team_metrics, Params, Workload};
use crate::experiments::Trial;
use crate::lab::{clock, HostContext, Lab};
use crate::placement::SharedLog;
use crate::scenario::ScenarioError;
use crate::stats::Metrics;

/// How a lab ring is built.
#[derive(Debug, Clone)]
pub struct Team {
    /// Nodes in the ring, the first included.
    pub nodes: usize,
    /// Batches in flight (K).
    pub in_flight: usize,
    /// Each node's compute per batch.
    pub compute_per_batch: Duration,
    /// How long a batch may take round the ring.
    pub batch_deadline: Duration,
    /// Ring ping interval.
    pub ping_interval: Duration,
    /// Every node's initial congestion window (`None`: the standard start).
    pub initial_window_bytes: Option<u64>,
    /// Every node's congestion controller.
    pub congestion: Congestion,
    /// Adjusts every node's config (timeouts, backoff).
    pub tune: fn(&mut NodeConfig),
}

impl Team {
    /// Host names: `n0` (first) to `n{nodes-1}`.
    pub fn names(&self) -> Vec<String> {
        (0..self.nodes).map(|index| format!("n{index}")).collect()
    }

    fn pipeline_config(&self, ring: Vec<PeerId>) -> PipelineConfig {
        let mut config = PipelineConfig::new(ring);
        config.in_flight = self.in_flight;
        config.batch_deadline = self.batch_deadline;
        config.ping_interval = Some(self.ping_interval);
        config
    }

    /// Adds the relays `n1..` to `lab`, each running its pipeline until the run ends. Returns the
    /// ring and a table of addresses filled in once every host exists ([`Team::fill_addresses`]).
    pub fn add_relays(&self, lab: &mut Lab, on_hop: Option<HopLog>) -> (Vec<PeerId>, Addresses) {
        let names = self.names();
        let ring: Vec<PeerId> = names.iter().map(|name| lab.peer_id(name)).collect();
        let addresses: Addresses = Rc::default();
        for (index, name) in names.iter().enumerate().skip(1) {
            let team = self.clone();
            let ring = ring.clone();
            let addresses = addresses.clone();
            let on_hop = if index == 1 { on_hop.clone() } else { None };
            lab.host(name, move |context| {
                let (team, ring, addresses, on_hop) = (
                    team.clone(),
                    ring.clone(),
                    addresses.clone(),
                    on_hop.clone(),
                );
                async move {
                    let (node, _pipeline) = team
                        .start_member(&context, &ring, index, &addresses)
                        .await?;
                    if let Some(log) = on_hop {
                        let mut inbox = node.subscribe_batches(HOP)?;
                        while let Some(batch) = inbox.recv().await {
                            if batch.collect().await.is_ok() {
                                log.push(clock());
                            }
                        }
                    }
                    std::future::pending::<()>().await;
                    Ok(())
                }
            });
        }
        (ring, addresses)
    }

    /// Records every host's node address (call after all hosts exist, before the run).
    pub fn fill_addresses(&self, lab: &Lab, addresses: &Addresses) -> Result<(), ScenarioError> {
        for name in self.names() {
            let address = lab
                .node_address(&name)
                .map_err(|error| ScenarioError::Invalid {
                    path: name.clone(),
                    reason: error.to_string(),
                })?;
            addresses.borrow_mut().insert(name, address);
        }
        Ok(())
    }

    /// Starts member `index`'s node, configures its successor and joins the pipeline.
    async fn start_member(
        &self,
        context: &HostContext,
        ring: &[PeerId],
        index: usize,
        addresses: &Addresses,
    ) -> Result<(Node, Pipeline), Box<dyn std::error::Error>> {
        let mut config = context.node_config();
        config.transport.initial_window_bytes = self.initial_window_bytes;
        config.transport.congestion = self.congestion;
        (self.tune)(&mut config);
        let (node, _) = context.start_node(config).await?;
        let next = (index + 1) % self.nodes;
        let address = addresses
            .borrow()
            .get(&format!("n{next}"))
            .copied()
            .ok_or("successor address unknown")?;
        node.add_peer(address, ring[next])?;
        let pipeline = Pipeline::start(
            &node,
            self.pipeline_config(ring.to_vec()),
            team_transform(self.compute_per_batch),
        )?;
        Ok((node, pipeline))
    }

    /// Starts the first node (`n0`) inside its client software and waits until a ring ping has
    /// come back, i.e. every link of the ring is up.
    pub async fn start_first(
        &self,
        context: &HostContext,
        ring: &[PeerId],
        addresses: &Addresses,
    ) -> Result<(Node, Pipeline), Box<dyn std::error::Error>> {
        let (node, pipeline) = self.start_member(context, ring, 0, addresses).await?;
        while pipeline.status().last_ring_ping.is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok((node, pipeline))
    }
}

/// Node addresses by host name.
pub type Addresses = Rc<RefCell<HashMap<String, SocketAddr>>>;
/// When `n1` received each hop-measurement batch whole.
pub type HopLog = SharedLog<Duration>;

/// The team's transform: one batch-wide compute step per node, then every byte plus one.
pub fn team_transform(compute_per_batch: Duration) -> Transform {
    let cpu = Arc::new(tokio::sync::Mutex::new(()));
    // Slots seen per batch still arriving, so the compute is charged at a batch's first chunk.
    let seen: Arc<std::sync::Mutex<HashMap<u64, u64>>> = Arc::default();
    Arc::new(move |header: &BatchHeader, chunk: Chunk| {
        let (cpu, seen) = (cpu.clone(), seen.clone());
        let (batch_id, slot_count) = (header.batch_id, u64::from(header.slot_count));
        Box::pin(async move {
            let first = {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let count = seen.entry(batch_id).or_insert(0);
                let first = *count == 0;
                *count += u64::from(chunk.slots);
                if *count >= slot_count {
                    seen.remove(&batch_id);
                }
                first
            };
            if first && !compute_per_batch.is_zero() {
                let _busy = cpu.lock().await;
                tokio::time::sleep(compute_per_batch).await;
            }
            let data: Bytes = chunk.data.iter().map(|b| b.wrapping_add(1)).collect();
            Chunk {
                slots: chunk.slots,
                data,
            }
        })
    })
}

/// Runs one case on meshwire pipelines with `in_flight` batches in flight.
pub fn run(
    trial: &Trial<'_>,
    params: &Params,
    in_flight: usize,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let case = trial.case;
    let Workload {
        nodes,
        slots,
        payload_bytes,
        batches,
        hop_samples,
        compute_per_batch,
        batch_deadline,
        ..
    } = Workload::new(case, params)?;
    let team = Team {
        nodes,
        in_flight,
        compute_per_batch,
        batch_deadline,
        ping_interval: Duration::from_millis(params.ping_interval_ms),
        initial_window_bytes: match params.initial_window_bytes {
            0 => None,
            bytes => Some(bytes),
        },
        congestion: Congestion::from(params.congestion),
        tune: |_| {},
    };
    let spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let mut lab = trial.lab(spec);
    let hops: HopLog = lab.shared_log("hops");
    let (ring, addresses) = team.add_relays(&mut lab, Some(hops.clone()));
    let metrics: Rc<RefCell<Metrics>> = Rc::default();
    {
        let (team, metrics, hops, ring, addresses) = (
            team.clone(),
            metrics.clone(),
            hops.clone(),
            ring.clone(),
            addresses.clone(),
        );
        lab.client("n0", move |context| async move {
            let (node, pipeline) = team.start_first(&context, &ring, &addresses).await?;
            // Hop transfer n0 -> n1 on the warm connection; the first batch is the warm-up.
            let mut hop_ms = Vec::new();
            for sample in 0..=hop_samples {
                let input = team_batch(sample as u64, slots, payload_bytes);
                let header = BatchHeader {
                    protocol: HOP.0,
                    batch_id: sample as u64,
                    round: 0,
                    phase: 0,
                    slot_count: slots,
                    total_bytes: (slots as usize * payload_bytes) as u64,
                    metadata: Bytes::new(),
                };
                let before = hops.len();
                let started = clock();
                node.send_batch(ring[1], header, input.chunks).await?;
                while hops.len() == before {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let arrived = hops.entries()[before];
                if sample > 0 {
                    hop_ms.push((arrived - started).as_secs_f64() * 1e3);
                }
            }
            hop_ms.sort_by(f64::total_cmp);
            // The ring ping on the idle ring: wait for one sent after the hop measurement.
            tokio::time::sleep(team.ping_interval * 2).await;
            let ring_ping = pipeline.status().last_ring_ping.ok_or("no ring ping")?;

            let inputs: Vec<BatchInput> = (0..batches)
                .map(|round| team_batch(round, slots, payload_bytes))
                .collect();
            let started = clock();
            let submitter = {
                let pipeline = pipeline.clone();
                tokio::task::spawn_local(async move {
                    for input in inputs {
                        pipeline.submit(input).await?;
                    }
                    Ok::<_, meshwire::pipeline::PipelineError>(())
                })
            };
            let mut failed = 0u64;
            for _ in 0..batches {
                let result = pipeline.next_result().await.ok_or("pipeline closed")?;
                if result.outcome.is_err() {
                    failed += 1;
                }
            }
            submitter.await??;
            let elapsed = (clock() - started).as_secs_f64();
            *metrics.borrow_mut() = team_metrics(&hop_ms, ring_ping, batches, elapsed, failed);
            Ok(())
        });
    }
    team.fill_addresses(&lab, &addresses)?;
    crate::scenario::run_case_to_end(&mut lab, case, progress)?;
    let metrics = metrics.borrow().clone();
    Ok(metrics)
}
