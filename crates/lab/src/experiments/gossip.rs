//! Gossip under an Internet Computer subnet's load: ingress at random nodes, blocks and shares every round.
//!
//! `nodes` hosts in a full mesh run [`meshwire_gossip::GossipService`] with one of three policies:
//!
//! * `flood`: every class relayed by every receiver, advertised only (the IC before,
//!   `docs/lessons.md`);
//! * `ic-origin`: ingress advertised by its origin only, consensus artifacts relayed by all;
//! * `meshwire`: as `ic-origin`, and artifacts of at most `push_whole_max_bytes` (ingress, shares)
//!   are pushed whole instead of advertised, and consensus artifacts are relayed on the gossip
//!   crate's relay trees (default `eager_fanout` and `lazy_fanout`); `flood` and `ic-origin` relay
//!   to every peer (`relay_to_all`), as the IC does.
//!
//! Workload: ingress enters at `ingress_per_s` in total, each node publishing its share on a fixed
//! interval with a random phase, from `warmup_ms` until the last round starts (none enters during
//! the drain); an ingress is `ingress_bytes` long and carries its entry time.
//! From `warmup_ms` on, a round starts every `1000 / blocks_per_s` ms: the round's block maker
//! (node `round mod nodes`) publishes a block that references (by id) every ingress it holds that
//! no block it knows has included yet, and every node publishes `shares_per_round` shares of
//! `share_bytes`. A node that receives a block stops offering the ingress in it.
//!
//! Metrics, over the window from round 1 to round `rounds + 1` (blocks 2..=`rounds + 1`):
//! `adverts_per_node_per_s` (adverts received, all classes, mean over nodes), `bytes_per_node_per_s`
//! (gossip item bytes sent), `ingress_latency_ms_p50`/`_p99` (entry to the block maker holding it,
//! over ingress included in measured blocks), `achieved_rps` (ingress included in measured blocks
//! per second of their rounds), `consensus_delivery_ratio` (share of measured blocks and shares
//! held by every node `drain_ms` after the last round).
//! Per class (`ingress_`, `block_`, `share_` prefixes, see [`class_metrics`]): the byte floor
//! below restricted to the class, duplicate payloads per artifact, adverts received and bytes
//! sent per node per second, and publish-to-delivery latency p50/p99.
//!
//! # CPU model
//!
//! With any `cpu_*_ns` cost set, every node's gossip service charges the [`meshwire_gossip::Work`] of each
//! inbound batch to its host's CPU ([`crate::cpu`]) at those per-item costs: adverts, requests,
//! artifact copies (plus their payload hashing per KiB) and validations. The driver handles one
//! batch at a time and waits for the CPU, so batches queue in the node's inbox while it is busy
//! and its replies, relays and deliveries leave late. Publishing, sending and the workload's own
//! tasks (block making) cost nothing. `cpu_busy_ratio_mean`/`_max`: CPU time charged in the
//! window over the window's length, mean and largest over nodes (1 is a saturated CPU).
//! Without costs the CPU model is off and these are 0.
//!
//! # Floor
//!
//! Over the whole run (every artifact is published between `warmup_ms` and the last round and the
//! counters are read at the end of the drain), per node, mean over nodes:
//!
//! * `distinct_bytes_per_node`: the payload bytes of every artifact another node published —
//!   ingress, blocks and shares, each once — which the node had to hold (every node holds every
//!   ingress for its turn as block maker, and every block and share). It is the floor of
//! * `received_bytes_per_node`: the gossip item bytes the node received, as the gossip layer
//!   counts them (`ClassStats::bytes_received`, every class): every advert (38 B), every request
//!   for an artifact it held (33 B) and every artifact copy, pushed or pulled, duplicates included
//!   (6 B + payload), plus the neighbours announcements it received (`neighbour_bytes_per_node`,
//!   11 B + 32 B per listed peer; meshwire only, in no class). Not counted: the 3-byte header of each batch, requests for artifacts it no
//!   longer held, and the transport under gossip (meshwire frames, QUIC, UDP).
//! * `duplicate_byte_ratio` = received ÷ distinct: 1 would be every artifact arriving exactly once
//!   with no item header and no advert; it is below 1 only if a node missed artifacts it had to
//!   hold.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use meshwire_gossip::proto::{ArtifactId, ClassId, ClassPolicy, ClassStats, GossipConfig, Relay};
use meshwire_gossip::{GossipService, GossipSettings};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use serde::Deserialize;

use super::Trial;
use crate::cpu::{Cpu, CpuStats, GossipCpu, ItemCosts};
use crate::lab::{clock, derive_seed, Lab, TICK};
use crate::scenario::ScenarioError;
use crate::stats::{percentile_f64, round_metric, Metrics};

const INGRESS: ClassId = ClassId(1);
const BLOCK: ClassId = ClassId(2);
const SHARE: ClassId = ClassId(3);

/// The workload's parameters.
#[derive(Debug, Clone, Copy)]
struct Workload {
    nodes: usize,
    ingress_per_s: u64,
    ingress_bytes: usize,
    round: Duration,
    rounds: u64,
    shares_per_round: u64,
    share_bytes: usize,
    warmup: Duration,
    drain: Duration,
}

impl Workload {
    fn round_start(&self, round: u64) -> Duration {
        self.warmup + self.round * round as u32
    }

    /// The measured window runs from round 1 to round `rounds + 1`: blocks 2..=rounds+1 are
    /// measured, so ingress still in flight is counted the same way at both ends.
    fn window_start(&self) -> Duration {
        self.round_start(1)
    }

    fn window_end(&self) -> Duration {
        self.round_start(self.rounds + 1)
    }

    fn measured(&self, round: u64) -> bool {
        (2..=self.rounds + 1).contains(&round)
    }

    /// The run's end: the drain after the last round.
    fn end(&self) -> Duration {
        self.window_end() + self.drain
    }
}

/// The class policies of `policy`.
fn gossip_config(policy: &str, flush: Duration, push_max: u32) -> Option<GossipConfig> {
    let (ingress_relay, push) = match policy {
        "flood" => (Relay::All, 0),
        "ic-origin" => (Relay::Origin, 0),
        "meshwire" => (Relay::Origin, push_max),
        _ => return None,
    };
    let class = |relay, push_whole_max_bytes, expiry_s| ClassPolicy {
        relay,
        push_whole_max_bytes,
        latency_sensitive: false,
        expiry: Duration::from_secs(expiry_s),
    };
    let mut config = GossipConfig {
        flush_interval: flush,
        // The IC's policies relay consensus artifacts to every peer; meshwire's use relay trees.
        relay_to_all: policy != "meshwire",
        ..GossipConfig::default()
    };
    config
        .classes
        .insert(INGRESS, class(ingress_relay, push, 10));
    config.classes.insert(BLOCK, class(Relay::All, push, 30));
    config.classes.insert(SHARE, class(Relay::All, push, 30));
    Some(config)
}

#[derive(Debug, Default)]
struct Tally {
    /// Blocks and shares of measured rounds: how many nodes hold each.
    consensus: HashMap<ArtifactId, usize>,
    latency_ms: Vec<f64>,
    included: u64,
    stats_at_start: BTreeMap<usize, BTreeMap<ClassId, ClassStats>>,
    stats_at_end: BTreeMap<usize, BTreeMap<ClassId, ClassStats>>,
    /// Each node's counters at the end of the drain (they start at zero with the node).
    stats_final: BTreeMap<usize, BTreeMap<ClassId, ClassStats>>,
    /// Neighbours announcement bytes each node received over the whole run.
    neighbour_bytes_final: BTreeMap<usize, u64>,
    /// Each node's CPU counters at the window's start and end.
    cpu_at_start: BTreeMap<usize, CpuStats>,
    cpu_at_end: BTreeMap<usize, CpuStats>,
    /// Payload bytes each node published, per class, over the whole run.
    published_bytes: BTreeMap<(usize, ClassId), u64>,
    /// Per class, publish-to-delivery times (ms) of every delivery at every node, for
    /// ingress entered in the measured window and blocks and shares of measured rounds.
    delivery_ms: BTreeMap<ClassId, Vec<f64>>,
}

impl Tally {
    fn published(&mut self, node: usize, class: ClassId, bytes: usize) {
        *self.published_bytes.entry((node, class)).or_default() += bytes as u64;
    }
}

/// What one node knows: ingress it holds (entry time, when it got it) and ingress already included.
#[derive(Debug, Default)]
struct NodeView {
    ingress: HashMap<ArtifactId, (Duration, Duration)>,
    included: HashSet<ArtifactId>,
}

fn ingress_payload(entry: Duration, node: usize, seq: u64, len: usize) -> Bytes {
    let mut out = BytesMut::with_capacity(len.max(18));
    out.put_u64_le(entry.as_micros() as u64);
    out.put_u16_le(node as u16);
    out.put_u64_le(seq);
    out.resize(len.max(18), 0xab);
    out.freeze()
}

/// When a delivered artifact was published, if it is measured: an ingress's entry time inside
/// the window; a block's or share's round start (its first eight bytes are the round), for
/// measured rounds.
fn published_at(payload: &[u8], class: ClassId, workload: &Workload) -> Option<Duration> {
    if class == INGRESS {
        let entry = entry_time(payload)?;
        let window = workload.window_start()..workload.window_end();
        return window.contains(&entry).then_some(entry);
    }
    let bytes: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    let round = u64::from_le_bytes(bytes);
    workload
        .measured(round)
        .then(|| workload.round_start(round))
}

fn entry_time(payload: &[u8]) -> Option<Duration> {
    let bytes: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    Some(Duration::from_micros(u64::from_le_bytes(bytes)))
}

fn block_ids(payload: &Bytes) -> impl Iterator<Item = ArtifactId> + '_ {
    payload
        .get(8..)
        .unwrap_or_default()
        .chunks_exact(32)
        .map(|chunk| {
            let mut id = [0u8; 32];
            id.copy_from_slice(chunk);
            ArtifactId(id)
        })
}

/// `ic-subnet` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Nodes in the full mesh.
    pub nodes: u64,
    /// Ingress messages per second, all nodes together.
    pub ingress_per_s: u64,
    /// Size of one ingress message.
    pub ingress_bytes: u64,
    /// Blocks per 1000 s (a round every `1000 / blocks_per_s_milli` s).
    pub blocks_per_s_milli: u64,
    /// Measured rounds.
    pub rounds: u64,
    /// Shares every node publishes per round.
    pub shares_per_round: u64,
    /// Size of one share.
    pub share_bytes: u64,
    /// Time before ingress starts (connections come up).
    pub warmup_ms: u64,
    /// Time after the last round before delivery is counted.
    pub drain_ms: u64,
    /// Gossip batch flush interval.
    pub flush_ms: u64,
    /// Largest artifact the `meshwire` policy pushes whole instead of advertising.
    pub push_whole_max_bytes: u32,
    /// CPU time of one advert received (module `# CPU model`; all costs 0: no CPU model).
    pub cpu_advert_ns: u64,
    /// CPU time of one request received.
    pub cpu_request_ns: u64,
    /// CPU time of one artifact copy received, apart from hashing its payload.
    pub cpu_artifact_ns: u64,
    /// CPU time of hashing an artifact copy's payload, per KiB.
    pub cpu_artifact_ns_per_kib: u64,
    /// CPU time of validating a new artifact.
    pub cpu_validate_ns: u64,
}

impl Params {
    fn item_costs(&self) -> ItemCosts {
        ItemCosts {
            advert_ns: self.cpu_advert_ns,
            request_ns: self.cpu_request_ns,
            artifact_ns: self.cpu_artifact_ns,
            artifact_ns_per_kib: self.cpu_artifact_ns_per_kib,
            validate_ns: self.cpu_validate_ns,
        }
    }
}

impl Default for Params {
    fn default() -> Self {
        Self {
            nodes: 56,
            ingress_per_s: 300,
            ingress_bytes: 1024,
            blocks_per_s_milli: 350,
            rounds: 5,
            shares_per_round: 3,
            share_bytes: 256,
            warmup_ms: 3000,
            drain_ms: 2000,
            flush_ms: 20,
            push_whole_max_bytes: 1024,
            cpu_advert_ns: 0,
            cpu_request_ns: 0,
            cpu_artifact_ns: 0,
            cpu_artifact_ns_per_kib: 0,
            cpu_validate_ns: 0,
        }
    }
}

/// Runs one gossip case under the trial's policy.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let (case, seed, policy) = (trial.case, trial.seed, trial.policy);
    let params: Params = trial.params()?;
    let workload = Workload {
        nodes: params.nodes as usize,
        ingress_per_s: params.ingress_per_s,
        ingress_bytes: params.ingress_bytes as usize,
        round: Duration::from_secs_f64(1000.0 / params.blocks_per_s_milli.max(1) as f64),
        rounds: params.rounds,
        shares_per_round: params.shares_per_round,
        share_bytes: params.share_bytes as usize,
        warmup: Duration::from_millis(params.warmup_ms),
        drain: Duration::from_millis(params.drain_ms),
    };
    let flush = Duration::from_millis(params.flush_ms);
    let push_max = params.push_whole_max_bytes;
    let costs = params.item_costs();
    let config = gossip_config(policy, flush, push_max)
        .ok_or_else(|| ScenarioError::failed(case, format!("unknown policy {policy:?}")))?;
    if workload.nodes < 2 || workload.ingress_per_s == 0 || workload.rounds == 0 {
        return Err(ScenarioError::failed(
            case,
            "needs at least 2 nodes, some ingress and at least one round",
        ));
    }
    let spec = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let end = workload.end();
    let mut lab = Lab::new(seed, spec, end + Duration::from_secs(1));
    let names: Vec<String> = (0..workload.nodes).map(|i| format!("n{i:03}")).collect();
    let ids: Vec<_> = names.iter().map(|name| lab.peer_id(name)).collect();
    let tally: Rc<RefCell<Tally>> = Rc::default();
    let directory: Rc<RefCell<Vec<std::net::SocketAddr>>> = Rc::default();
    for (index, name) in names.iter().enumerate() {
        let (tally, directory, ids, config) = (
            tally.clone(),
            directory.clone(),
            ids.clone(),
            config.clone(),
        );
        lab.host(name, move |context| {
            let (tally, directory, ids, config) = (
                tally.clone(),
                directory.clone(),
                ids.clone(),
                config.clone(),
            );
            async move {
                let (node, _) = context.start_node(context.node_config()).await?;
                let cpu = context.cpu().clone();
                let processor = (!costs.is_free()).then(|| {
                    Arc::new(GossipCpu {
                        cpu: cpu.clone(),
                        costs,
                    }) as Arc<dyn meshwire_gossip::Processor>
                });
                let settings = GossipSettings {
                    delivered_queue: 16 * 1024,
                    processor,
                    ..GossipSettings::new(config)
                };
                let (gossip, mut delivered) =
                    GossipService::spawn(&node, settings, Box::new(|_, _| true))?;
                let addresses = directory.borrow().clone();
                for (peer, address) in ids.iter().zip(&addresses).take(index) {
                    node.add_peer(*address, *peer)?;
                }
                let view: Rc<RefCell<NodeView>> = Rc::default();
                let rng = SmallRng::seed_from_u64(derive_seed(context.seed, &context.name, 9));
                tokio::task::spawn_local(publish_ingress(
                    gossip.clone(),
                    view.clone(),
                    tally.clone(),
                    workload,
                    index,
                    rng,
                ));
                tokio::task::spawn_local(run_rounds(
                    gossip.clone(),
                    cpu,
                    view.clone(),
                    tally.clone(),
                    workload,
                    index,
                ));
                while let Some(artifact) = delivered.recv().await {
                    let now = clock();
                    if let Some(sent) = published_at(&artifact.payload, artifact.class, &workload) {
                        tally
                            .borrow_mut()
                            .delivery_ms
                            .entry(artifact.class)
                            .or_default()
                            .push(now.saturating_sub(sent).as_secs_f64() * 1e3);
                    }
                    match artifact.class {
                        INGRESS => {
                            let mut view = view.borrow_mut();
                            if !view.included.contains(&artifact.id) {
                                if let Some(entry) = entry_time(&artifact.payload) {
                                    view.ingress.insert(artifact.id, (entry, now));
                                }
                            }
                        }
                        class => {
                            if class == BLOCK {
                                let mut view = view.borrow_mut();
                                for id in block_ids(&artifact.payload) {
                                    view.ingress.remove(&id);
                                    view.included.insert(id);
                                }
                            }
                            if let Some(count) = tally.borrow_mut().consensus.get_mut(&artifact.id)
                            {
                                *count += 1;
                            }
                        }
                    }
                }
                Ok(())
            }
        });
    }
    *directory.borrow_mut() = names
        .iter()
        .map(|name| lab.node_address(name))
        .collect::<Result<_, _>>()
        .map_err(|error| ScenarioError::lab(case, error))?;
    lab.run(end, progress)
        .map_err(|error| ScenarioError::lab(case, error))?;
    let tally = tally.borrow();
    Ok(metrics(&tally, &workload))
}

/// Publishes this node's share of the ingress, from the warm-up's end until the last round starts.
async fn publish_ingress(
    gossip: GossipService,
    view: Rc<RefCell<NodeView>>,
    tally: Rc<RefCell<Tally>>,
    workload: Workload,
    index: usize,
    mut rng: SmallRng,
) {
    let interval = Duration::from_secs_f64(workload.nodes as f64 / workload.ingress_per_s as f64);
    let phase = interval.mul_f64(rng.random::<f64>());
    tokio::time::sleep(workload.warmup.saturating_sub(clock()) + phase).await;
    let mut ticker = tokio::time::interval(interval);
    let mut seq = 0u64;
    loop {
        ticker.tick().await;
        let now = clock();
        if now > workload.window_end() {
            // The last measured block is made; what enters now would only load the drain.
            return;
        }
        let payload = ingress_payload(now, index, seq, workload.ingress_bytes);
        let len = payload.len();
        seq += 1;
        match gossip.publish(INGRESS, payload) {
            Ok(id) => {
                view.borrow_mut().ingress.insert(id, (now, now));
                tally.borrow_mut().published(index, INGRESS, len);
            }
            Err(error) => tracing::debug!(%error, "ingress refused"),
        }
    }
}

/// Plays the consensus rounds: block making on this node's turns, shares every round.
async fn run_rounds(
    gossip: GossipService,
    cpu: Arc<Cpu>,
    view: Rc<RefCell<NodeView>>,
    tally: Rc<RefCell<Tally>>,
    workload: Workload,
    index: usize,
) {
    for round in 1..=workload.rounds + 1 {
        tokio::time::sleep(workload.round_start(round).saturating_sub(clock())).await;
        if round == 1 {
            let mut tally = tally.borrow_mut();
            tally.stats_at_start.insert(index, gossip.stats());
            tally.cpu_at_start.insert(index, cpu.stats());
        }
        let measured = workload.measured(round);
        let mut published = Vec::new();
        if round as usize % workload.nodes == index {
            let mut view = view.borrow_mut();
            let mut candidates: Vec<(ArtifactId, Duration, Duration)> = view
                .ingress
                .iter()
                .filter(|(id, _)| !view.included.contains(*id))
                .map(|(id, (entry, held))| (*id, *entry, *held))
                .collect();
            candidates.sort_by_key(|(id, entry, _)| (*entry, *id));
            let mut block = BytesMut::with_capacity(8 + 32 * candidates.len());
            block.put_u64_le(round);
            let mut counts = tally.borrow_mut();
            for (id, entry, held) in &candidates {
                block.put_slice(&id.0);
                if measured {
                    counts
                        .latency_ms
                        .push(held.saturating_sub(*entry).as_secs_f64() * 1e3);
                }
                view.included.insert(*id);
                view.ingress.remove(id);
            }
            if measured {
                counts.included += candidates.len() as u64;
            }
            drop(counts);
            let len = block.len();
            if let Ok(id) = gossip.publish(BLOCK, block.freeze()) {
                tally.borrow_mut().published(index, BLOCK, len);
                published.push(id);
            }
        }
        for share in 0..workload.shares_per_round {
            let mut payload = BytesMut::with_capacity(workload.share_bytes.max(24));
            payload.put_u64_le(round);
            payload.put_u64_le(index as u64);
            payload.put_u64_le(share);
            payload.resize(workload.share_bytes.max(24), 0x5a);
            let len = payload.len();
            if let Ok(id) = gossip.publish(SHARE, payload.freeze()) {
                tally.borrow_mut().published(index, SHARE, len);
                published.push(id);
            }
        }
        if measured {
            let mut tally = tally.borrow_mut();
            for id in published {
                tally.consensus.insert(id, 1);
            }
        }
    }
    {
        let mut tally = tally.borrow_mut();
        tally.stats_at_end.insert(index, gossip.stats());
        tally.cpu_at_end.insert(index, cpu.stats());
    }
    // The lab's last step runs one tick before the run's end.
    tokio::time::sleep(workload.end().saturating_sub(TICK).saturating_sub(clock())).await;
    let mut tally = tally.borrow_mut();
    tally.stats_final.insert(index, gossip.stats());
    let neighbours = gossip.neighbour_stats().bytes_received;
    tally.neighbour_bytes_final.insert(index, neighbours);
}

fn metrics(tally: &Tally, workload: &Workload) -> Metrics {
    let window_s = (workload.window_end() - workload.window_start()).as_secs_f64();
    let mut adverts = 0u64;
    let mut bytes = 0u64;
    for (node, end) in &tally.stats_at_end {
        let start = tally.stats_at_start.get(node).cloned().unwrap_or_default();
        for (class, stats) in end {
            let before = start.get(class).copied().unwrap_or_default();
            adverts += stats.adverts_received - before.adverts_received;
            bytes += stats.bytes_sent - before.bytes_sent;
        }
    }
    let nodes = workload.nodes as f64;
    let mut latencies = tally.latency_ms.clone();
    latencies.sort_by(f64::total_cmp);
    let complete = tally
        .consensus
        .values()
        .filter(|count| **count >= workload.nodes)
        .count();
    let mut metrics = BTreeMap::new();
    metrics.insert("nodes".into(), nodes);
    metrics.insert(
        "adverts_per_node_per_s".into(),
        round_metric(adverts as f64 / nodes / window_s),
    );
    metrics.insert(
        "bytes_per_node_per_s".into(),
        round_metric(bytes as f64 / nodes / window_s),
    );
    metrics.insert(
        "ingress_latency_ms_p50".into(),
        round_metric(percentile_f64(&latencies, 0.5)),
    );
    metrics.insert(
        "ingress_latency_ms_p99".into(),
        round_metric(percentile_f64(&latencies, 0.99)),
    );
    metrics.insert(
        "achieved_rps".into(),
        round_metric(tally.included as f64 / window_s),
    );
    metrics.insert(
        "consensus_delivery_ratio".into(),
        round_metric(complete as f64 / tally.consensus.len().max(1) as f64),
    );
    metrics.insert("nodes_reporting".into(), tally.stats_at_end.len() as f64);
    let busy: Vec<f64> = tally
        .cpu_at_end
        .iter()
        .map(|(node, end)| {
            let start = tally.cpu_at_start.get(node).copied().unwrap_or_default();
            (end.busy - start.busy).as_secs_f64() / window_s
        })
        .collect();
    metrics.insert(
        "cpu_busy_ratio_mean".into(),
        round_metric(busy.iter().sum::<f64>() / busy.len().max(1) as f64),
    );
    metrics.insert(
        "cpu_busy_ratio_max".into(),
        round_metric(busy.iter().copied().fold(0.0, f64::max)),
    );
    let floor = byte_floor(tally, workload.nodes);
    // Announcements of who is connected to whom (meshwire's relays use them): gossip bytes a
    // node receives, so they count in the total, though in no class.
    let neighbour_bytes: u64 = tally.neighbour_bytes_final.values().sum();
    let neighbour_bytes = neighbour_bytes as f64 / tally.neighbour_bytes_final.len().max(1) as f64;
    let received = floor.received_per_node + neighbour_bytes;
    metrics.insert(
        "distinct_bytes_per_node".into(),
        round_metric(floor.distinct_per_node),
    );
    metrics.insert("received_bytes_per_node".into(), round_metric(received));
    metrics.insert(
        "neighbour_bytes_per_node".into(),
        round_metric(neighbour_bytes),
    );
    metrics.insert(
        "duplicate_byte_ratio".into(),
        round_metric(received / floor.distinct_per_node),
    );
    for (class, name) in [(INGRESS, "ingress"), (BLOCK, "block"), (SHARE, "share")] {
        class_metrics(&mut metrics, tally, workload, class, name);
    }
    metrics
}

/// Per-class metrics, prefixed with the class's name:
///
/// * `_distinct_bytes_per_node`, `_received_bytes_per_node`, `_duplicate_byte_ratio`: the byte
///   floor of the module's `# Floor` restricted to the class (every item of the class counted:
///   its adverts, requests, artifact copies and prunes);
/// * `_duplicates_per_artifact`: artifact copies received for ids already held, over artifacts
///   received (whole run, every node): 0 is one payload per artifact per node;
/// * `_adverts_per_node_per_s` (received, eager and lazy) and `_bytes_per_node_per_s` (item
///   bytes sent), over the window;
/// * `_delivery_ms_p50`/`_p99`: publish (ingress: entry) to delivery at each receiving node.
fn class_metrics(
    metrics: &mut Metrics,
    tally: &Tally,
    workload: &Workload,
    class: ClassId,
    name: &str,
) {
    let window_s = (workload.window_end() - workload.window_start()).as_secs_f64();
    let nodes = workload.nodes as f64;
    let (mut adverts, mut sent) = (0u64, 0u64);
    for (node, end) in &tally.stats_at_end {
        let start = tally.stats_at_start.get(node).cloned().unwrap_or_default();
        let before = start.get(&class).copied().unwrap_or_default();
        let after = end.get(&class).copied().unwrap_or_default();
        adverts += after.adverts_received - before.adverts_received;
        sent += after.bytes_sent - before.bytes_sent;
    }
    let floor = class_floor(tally, workload.nodes, class);
    let (mut duplicates, mut delivered) = (0u64, 0u64);
    for stats in tally.stats_final.values().filter_map(|c| c.get(&class)) {
        duplicates += stats.duplicate_artifacts;
        delivered += stats.delivered;
    }
    let mut latencies = tally.delivery_ms.get(&class).cloned().unwrap_or_default();
    latencies.sort_by(f64::total_cmp);
    let values = [
        ("distinct_bytes_per_node", floor.distinct_per_node),
        ("received_bytes_per_node", floor.received_per_node),
        (
            "duplicate_byte_ratio",
            floor.received_per_node / floor.distinct_per_node.max(1.0),
        ),
        (
            "duplicates_per_artifact",
            duplicates as f64 / delivered.max(1) as f64,
        ),
        ("adverts_per_node_per_s", adverts as f64 / nodes / window_s),
        ("bytes_per_node_per_s", sent as f64 / nodes / window_s),
        ("delivery_ms_p50", percentile_f64(&latencies, 0.5)),
        ("delivery_ms_p99", percentile_f64(&latencies, 0.99)),
    ];
    for (metric, value) in values {
        metrics.insert(format!("{name}_{metric}"), round_metric(value));
    }
}

/// The byte floor of a run (see the module's `# Floor`), mean over nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ByteFloor {
    distinct_per_node: f64,
    received_per_node: f64,
}

/// Every node had to hold every artifact the others published: `published` (per node) less its
/// own, averaged over `nodes`; and what the nodes whose counters were read at the end received.
fn byte_floor(tally: &Tally, nodes: usize) -> ByteFloor {
    floor_of(tally, nodes, |_| true)
}

/// [`byte_floor`] restricted to one class.
fn class_floor(tally: &Tally, nodes: usize, class: ClassId) -> ByteFloor {
    floor_of(tally, nodes, |c| c == class)
}

fn floor_of(tally: &Tally, nodes: usize, counts: impl Fn(ClassId) -> bool) -> ByteFloor {
    let mut by_node: BTreeMap<usize, u64> = BTreeMap::new();
    for ((node, class), bytes) in &tally.published_bytes {
        if counts(*class) {
            *by_node.entry(*node).or_default() += bytes;
        }
    }
    let total: u64 = by_node.values().sum();
    let distinct: u64 = (0..nodes)
        .map(|node| total - by_node.get(&node).copied().unwrap_or(0))
        .sum();
    let received: u64 = tally
        .stats_final
        .values()
        .flat_map(|classes| classes.iter())
        .filter(|(class, _)| counts(**class))
        .map(|(_, stats)| stats.bytes_received)
        .sum();
    ByteFloor {
        distinct_per_node: distinct as f64 / nodes.max(1) as f64,
        received_per_node: received as f64 / tally.stats_final.len().max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_must_hold_what_the_others_published() {
        let mut tally = Tally::default();
        // Three nodes: 100, 200 and 0 bytes published.
        tally.published(0, INGRESS, 60);
        tally.published(0, SHARE, 40);
        tally.published(1, SHARE, 200);
        for (node, received) in [(0, 250), (1, 150), (2, 400)] {
            let stats = ClassStats {
                bytes_received: received,
                ..ClassStats::default()
            };
            tally
                .stats_final
                .insert(node, [(INGRESS, stats), (SHARE, stats)].into());
        }
        let floor = byte_floor(&tally, 3);
        // Node 0 needs 200, node 1 needs 100, node 2 needs 300: 200 on average.
        assert_eq!(floor.distinct_per_node, 200.0);
        // 2 × (250 + 150 + 400) / 3.
        assert_eq!(floor.received_per_node, 1600.0 / 3.0);
        // Shares alone: node 0 needs 200, node 1 needs 40, node 2 needs 240.
        let shares = class_floor(&tally, 3, SHARE);
        assert_eq!(shares.distinct_per_node, 160.0);
        assert_eq!(shares.received_per_node, 800.0 / 3.0);
    }
}
