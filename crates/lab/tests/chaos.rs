//! Objects under chaos: five members (R = 3, W = 2, read quorum 2, the defaults) take writes,
//! reads and compare-and-set writes through every node while a seeded schedule cuts one node
//! off, crashes and restarts nodes (their stores kept on disk), puts 10% loss on every link and
//! splits the cluster 2 | 3; then everything heals, anti-entropy runs, and the history checker
//! (`meshwire_lab::history`) looks for lost acknowledged writes, torn or foreign content, replicas
//! that did not converge, and reads older than a write acknowledged before they began.
//!
//! Timeline (virtual time, each fault's start jittered by the seed): connect until 2 s; node A
//! cut off from everyone at ~3 s for 3 s; node B crashed at ~5.5 s, restarted 2 s later; 10% loss
//! on every link from 9 s to 17 s; a split {C, D} | {A, B, E} from ~12 s to ~21 s; node E crashed
//! at ~13 s, restarted 2.5 s later; the clients stop starting operations at 20 s, before the split
//! heals, so what C and D missed reaches them only by anti-entropy. Each replica's local copies
//! are taken at 37 s (the 5 s write deadline plus at least two anti-entropy rounds after the
//! last operation and the heal, with no reads in between), then every node reads every key at
//! quorum at 38 s.
//!
//! The nodes run their store calls inline (`Daemon::builder(..).inline_store(true)`), so a seed
//! repeats its run and its history exactly; a crash stops the host's tasks at a tick boundary,
//! between store transactions, never inside one (redb's commits are atomic in any case).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meshwire::PeerId;
use meshwire_lab::history::{check, write_content, Healed, History, Seen, WriteId, WriteResult};
use meshwire_lab::lab::{clock, derive_seed};
use meshwire_lab::{Lab, LabEvent, LinkSpec};
use meshwire_objects::net::{
    Daemon, ObjectConfig, ObjectService, ObjectServiceError, PhysicalClock,
};
use meshwire_objects::proto::cas::Precondition;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const NODES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];
const KEYS: usize = 8;
/// Client loops per node.
const CLIENTS: usize = 2;
const STOP: Duration = Duration::from_secs(20);
const SNAPSHOT: Duration = Duration::from_secs(37);
const FINAL_READS: Duration = Duration::from_secs(38);
const LIMIT: Duration = Duration::from_secs(60);

fn key(index: usize) -> String {
    format!("chaos-{index}")
}

/// Milliseconds since 2026-01-01 plus the run's virtual time: every node's physical clock is the
/// same, as the hybrid clock's skew check expects of a healthy cluster. The store's calls run on
/// tokio's blocking pool, off the simulation's thread, where only the last time seen is known.
#[derive(Debug, Default)]
struct VirtualClock(AtomicU64);

const EPOCH_MS: u64 = 1_767_225_600_000;

impl VirtualClock {
    fn observe(&self) -> u64 {
        let now = u64::try_from(clock().as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_max(now, Ordering::Relaxed).max(now)
    }
}

impl PhysicalClock for VirtualClock {
    fn now_ms(&self) -> u64 {
        EPOCH_MS + self.observe()
    }
}

/// What the hosts share with the test: the history, the state after healing, each host's
/// incarnation count.
#[derive(Default)]
struct Shared {
    history: RefCell<History>,
    healed: RefCell<Healed>,
    incarnations: RefCell<BTreeMap<String, u64>>,
}

fn write_result(
    result: &Result<meshwire_objects::net::WriteOutcome, ObjectServiceError>,
) -> WriteResult {
    match result {
        Ok(outcome) => WriteResult::Acked(outcome.stamp),
        Err(ObjectServiceError::PreconditionFailed { .. }) => WriteResult::NotApplied("412"),
        Err(ObjectServiceError::Conflict { .. }) => WriteResult::NotApplied("409"),
        Err(ObjectServiceError::NotApplied { .. }) => WriteResult::NotApplied("503_not_applied"),
        Err(ObjectServiceError::WriteUnconfirmed { .. }) => WriteResult::Unknown("503"),
        // Lost to a newer write: judged as unknown, the weakest claim the checker can make.
        Err(ObjectServiceError::Superseded { .. }) => WriteResult::Unknown("409_superseded"),
        Err(_) => WriteResult::Unknown("error"),
    }
}

async fn read(service: &ObjectService, key: &str) -> Seen {
    match service.get(key).await {
        Ok(outcome) => Seen::copy(key, outcome.object.stamp, &outcome.object.content),
        Err(ObjectServiceError::NotFound) => Seen::NotFound,
        Err(error) => Seen::Failed(error.to_string()),
    }
}

/// One client loop: until [`STOP`], a random operation on a random key every 50-250 ms: a write
/// (45%), a read (40%) or a read followed by a compare-and-set on what it saw (15%).
async fn client(
    service: ObjectService,
    shared: Rc<Shared>,
    node: String,
    writer: String,
    seed: u64,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seq = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..=250))).await;
        if clock() >= STOP {
            return;
        }
        let key = key(rng.random_range(0..KEYS));
        let dice = rng.random_range(0..100);
        let len = rng.random_range(64..=4096);
        if dice < 45 {
            seq += 1;
            let id = WriteId {
                key: key.clone(),
                writer: writer.clone(),
                seq,
            };
            let content = write_content(&id, len);
            let index = shared
                .history
                .borrow_mut()
                .invoke_write(&node, id, false, clock());
            let result = service.put(&key, content).await;
            shared
                .history
                .borrow_mut()
                .complete_write(index, write_result(&result), clock());
        } else {
            let index = shared
                .history
                .borrow_mut()
                .invoke_read(&node, &key, clock());
            let seen = read(&service, &key).await;
            shared
                .history
                .borrow_mut()
                .complete_read(index, seen.clone(), clock());
            if dice < 85 {
                continue;
            }
            let precondition = match seen {
                Seen::Copy { stamp, .. } => Precondition::Matches(stamp),
                Seen::NotFound => Precondition::Absent,
                Seen::Failed(_) => continue,
            };
            seq += 1;
            let id = WriteId {
                key: key.clone(),
                writer: writer.clone(),
                seq,
            };
            let content = write_content(&id, len);
            let index = shared
                .history
                .borrow_mut()
                .invoke_write(&node, id, true, clock());
            let result = service.put_if(&key, content, precondition).await;
            shared
                .history
                .borrow_mut()
                .complete_write(index, write_result(&result), clock());
        }
    }
}

/// The seeded fault schedule; returns a description of it.
fn schedule(lab: &mut Lab, seed: u64) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(derive_seed(seed, "chaos-schedule", 0));
    let mut order: Vec<&str> = NODES.to_vec();
    order.shuffle(&mut rng);
    let mut jitter = |base_ms: u64| Duration::from_millis(base_ms + rng.random_range(0..1000));
    let seconds = |time: Duration| time.as_secs_f64();
    let mut plan = Vec::new();
    let (cut, cut_at) = (order[0], jitter(3000));
    let repair_at = cut_at + Duration::from_secs(3);
    for other in NODES.iter().filter(|node| **node != cut) {
        lab.at(cut_at, LabEvent::Partition(cut.into(), (*other).into()));
        lab.at(repair_at, LabEvent::Repair(cut.into(), (*other).into()));
    }
    plan.push(format!(
        "{cut} cut off from {:.3}s to {:.3}s",
        seconds(cut_at),
        seconds(repair_at)
    ));
    let (crashed, crash_at) = (order[1], jitter(5500));
    let restart_at = crash_at + Duration::from_secs(2);
    lab.at(crash_at, LabEvent::Crash(crashed.into()));
    lab.at(restart_at, LabEvent::Restart(crashed.into()));
    plan.push(format!(
        "{crashed} crashed at {:.3}s, restarted at {:.3}s",
        seconds(crash_at),
        seconds(restart_at)
    ));
    let lossy = LinkSpec {
        loss: 0.10,
        ..link()
    };
    let (loss_from, loss_to) = (Duration::from_secs(9), Duration::from_secs(17));
    for from in NODES {
        for to in NODES.iter().filter(|to| **to != from) {
            lab.at(
                loss_from,
                LabEvent::SetLink(from.into(), (*to).into(), lossy),
            );
            lab.at(
                loss_to,
                LabEvent::SetLink(from.into(), (*to).into(), link()),
            );
        }
    }
    plan.push(format!(
        "10% loss on every link from {:.3}s to {:.3}s",
        seconds(loss_from),
        seconds(loss_to)
    ));
    // The split heals after the clients stopped: the writes the small side's replicas missed
    // reach them only by anti-entropy, since no read repairs them before the snapshot.
    let (split_at, heal_at) = (jitter(12_000), jitter(21_000));
    let small = [order[2], order[3]];
    for a in small {
        for b in NODES.iter().filter(|node| !small.contains(node)) {
            lab.at(split_at, LabEvent::Partition(a.into(), (*b).into()));
            lab.at(heal_at, LabEvent::Repair(a.into(), (*b).into()));
        }
    }
    plan.push(format!(
        "{small:?} split from the rest from {:.3}s to {:.3}s",
        seconds(split_at),
        seconds(heal_at)
    ));
    let (crashed, crash_at) = (order[4], jitter(13_000));
    let restart_at = crash_at + Duration::from_millis(2500);
    lab.at(crash_at, LabEvent::Crash(crashed.into()));
    lab.at(restart_at, LabEvent::Restart(crashed.into()));
    plan.push(format!(
        "{crashed} crashed at {:.3}s, restarted at {:.3}s",
        seconds(crash_at),
        seconds(restart_at)
    ));
    plan
}

fn link() -> LinkSpec {
    LinkSpec {
        latency: Duration::from_millis(5),
        ..LinkSpec::default()
    }
}

fn objects() -> ObjectConfig {
    ObjectConfig {
        // Rounds every 3 s on average (±50%) so that two or more run between the last operation's
        // deadline and the snapshot; the rest are the defaults (R = 3, W = 2, read quorum 2).
        anti_entropy_interval: Duration::from_secs(3),
        ..ObjectConfig::default()
    }
}

/// Runs the chaos scenario under `seed` and returns the checker's findings.
fn run(seed: u64) {
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut lab = Lab::new(seed, link(), LIMIT + Duration::from_secs(5));
    let shared: Rc<Shared> = Rc::default();
    let physical = Arc::new(VirtualClock::default());
    let ids: Vec<PeerId> = NODES.iter().map(|name| lab.peer_id(name)).collect();
    let addresses: Rc<RefCell<Vec<SocketAddr>>> = Rc::default();
    let settled = Rc::new(Cell::new(0usize));
    for (index, name) in NODES.iter().enumerate() {
        let dir: PathBuf = data.path().join(name);
        let (shared, physical, ids, addresses, settled) = (
            shared.clone(),
            physical.clone(),
            ids.clone(),
            addresses.clone(),
            settled.clone(),
        );
        lab.host(name, move |context| {
            let (shared, physical, ids, addresses, dir, settled) = (
                shared.clone(),
                physical.clone(),
                ids.clone(),
                addresses.clone(),
                dir.clone(),
                settled.clone(),
            );
            async move {
                let name = context.name.clone();
                let incarnation = {
                    let mut incarnations = shared.incarnations.borrow_mut();
                    let count = incarnations.entry(name.clone()).or_insert(0);
                    *count += 1;
                    *count
                };
                let (node, _) = context.start_node(context.node_config()).await?;
                let daemon = Daemon::builder(objects())
                    .data_dir(&dir)
                    .store_memory_bytes(4 << 20)
                    .members(ids.iter().copied())
                    .physical_clock(physical)
                    // Store calls on the host's own task: blocking-pool threads would make the
                    // order of events, and so the history, vary from run to run of a seed.
                    .inline_store(true)
                    .seed(derive_seed(context.seed, &name, incarnation))
                    .start(node.clone())
                    .await?;
                let service = daemon.service().clone();
                for (peer, address) in ids.iter().zip(addresses.borrow().iter()).take(index) {
                    node.add_peer(*address, *peer)?;
                }
                for client_index in 0..CLIENTS {
                    let writer = format!("{name}.{incarnation}.{client_index}");
                    let seed = derive_seed(context.seed, &writer, 0);
                    tokio::task::spawn_local(client(
                        service.clone(),
                        shared.clone(),
                        name.clone(),
                        writer,
                        seed,
                    ));
                }
                tokio::time::sleep(SNAPSHOT.saturating_sub(clock())).await;
                let me = node.peer_id();
                for index in 0..KEYS {
                    let key = key(index);
                    if !service.replicas(&key).contains(&me) {
                        continue;
                    }
                    let copy = match service.store().get(&key) {
                        Ok(Some(object)) => Some(Seen::copy(&key, object.stamp, &object.content)),
                        Ok(None) => None,
                        Err(error) => Some(Seen::Failed(error.to_string())),
                    };
                    shared
                        .healed
                        .borrow_mut()
                        .replicas
                        .entry(key)
                        .or_default()
                        .push((name.clone(), copy));
                }
                tokio::time::sleep(FINAL_READS.saturating_sub(clock())).await;
                for index in 0..KEYS {
                    let key = key(index);
                    let seen = read(&service, &key).await;
                    shared
                        .healed
                        .borrow_mut()
                        .reads
                        .insert((name.clone(), key), seen);
                }
                settled.set(settled.get() + 1);
                std::future::pending::<()>().await;
                drop(daemon);
                Ok(())
            }
        });
    }
    *addresses.borrow_mut() = NODES
        .iter()
        .map(|name| lab.node_address(name))
        .collect::<Result<_, _>>()
        .expect("every node has an address");
    {
        let (physical, settled) = (physical.clone(), settled.clone());
        lab.client("observer", move |_| async move {
            // Keeps the clock the blocking pool reads current, and ends the run once every node
            // has read every key after healing.
            while settled.get() < NODES.len() && clock() < LIMIT {
                physical.observe();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(())
        });
    }
    let plan = schedule(&mut lab, seed);
    let finished = lab
        .run(LIMIT + Duration::from_secs(5), |_| {})
        .expect("the lab runs");
    assert!(
        finished,
        "seed {seed}: the nodes did not all read after healing"
    );

    let history = shared.history.borrow();
    let healed = shared.healed.borrow();
    let report = check(&history, &healed);
    let summary = format!(
        "seed {seed}: history {:016x}, {:?}; incarnations {:?}; {} keys with acked writes, {} \
         reads checked for staleness, {} copies checked whole, {} keys compared",
        // A digest of the whole history, to see that a seed repeats its run.
        derive_seed(0, &format!("{:?}", history.ops()), 0),
        history.tally(),
        shared.incarnations.borrow(),
        report.keys_with_acked_writes,
        report.reads_checked,
        report.copies_checked,
        report.keys_compared,
    );
    println!("{summary}");
    let violations: Vec<String> = report.violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "{summary}\nschedule:\n  {}\nviolations:\n  {}",
        plan.join("\n  "),
        violations.join("\n  ")
    );
    // The run exercised what it claims to: both crashed nodes came back, every key's three
    // replicas reported, writes were acknowledged and writes were left unknown or refused.
    let incarnations = shared.incarnations.borrow();
    assert_eq!(
        incarnations.values().filter(|count| **count == 2).count(),
        2,
        "{summary}"
    );
    assert!(
        healed.replicas.values().all(|holders| holders.len() == 3),
        "{summary}"
    );
    assert_eq!(healed.reads.len(), NODES.len() * KEYS, "{summary}");
    assert_eq!(report.keys_with_acked_writes, KEYS, "{summary}");
}

#[test]
fn objects_survive_partitions_crashes_and_loss_seed_1() {
    run(1);
}

#[test]
fn objects_survive_partitions_crashes_and_loss_seed_2() {
    run(2);
}
