//! Careful resume on the lab's deterministic network: a connection redialed after the path changed
//! (RTT doubled, rate quartered) overflows the bottleneck queue no more than a cold start does,
//! whether the batch's sender dialed it or accepted it.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use meshwire::{BatchHeader, Chunk, ProtocolId};
use meshwire_lab::lab::{clock, Lab, LabEvent};
use meshwire_lab::link::{LinkSpec, Rate};

const DATA: ProtocolId = ProtocolId(77);
/// When the path changes: after the first batch, before the redial.
const PATH_CHANGE: Duration = Duration::from_secs(5);

/// A path `latency_ms` one way at `mbit` Mbit/s, its queue one round trip at that rate.
fn path(latency_ms: u64, mbit: u64) -> LinkSpec {
    let latency = Duration::from_millis(latency_ms);
    LinkSpec {
        latency,
        rate: Rate::BitsPerSec(mbit * 1_000_000),
        queue_bytes: (mbit * 1_000_000 / 8 * 2 * latency_ms / 1000) as usize,
        ..LinkSpec::default()
    }
}

fn batch(id: u64, bytes: usize) -> (BatchHeader, Vec<Chunk>) {
    let chunks: Vec<Chunk> = (0..bytes / 1000)
        .map(|_| Chunk {
            slots: 1,
            data: Bytes::from(vec![id as u8; 1000]),
        })
        .collect();
    let header = BatchHeader {
        protocol: DATA.0,
        batch_id: id,
        round: 0,
        phase: 0,
        slot_count: chunks.len() as u32,
        total_bytes: bytes as u64,
        metadata: Bytes::new(),
    };
    (header, chunks)
}

/// Which end of the connection sends the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    /// `a`, which dials.
    Dialer,
    /// `b`, which accepts.
    Acceptor,
}

/// `a` dials `b` and `sender` sends: with `warm`, a 4 MB batch on a 20 ms, 100 Mbit/s path first
/// (the estimate, remembered under the other end's address) and the connection closed; then, on
/// the `changed` path, `a` redials and the sender sends 1 MB. Returns the datagrams the sender's
/// link queue dropped while that batch crossed, whether every batch arrived whole, and how long
/// the sender took to send it.
fn second_batch(sender: Sender, warm: bool, changed: LinkSpec) -> (u64, bool, Duration) {
    let mut lab = Lab::new(1, path(20, 100), Duration::from_secs(60));
    for (from, to) in [("a", "b"), ("b", "a")] {
        lab.at(
            PATH_CHANGE,
            LabEvent::SetLink(from.into(), to.into(), changed),
        );
    }
    let sizes: &'static [usize] = if warm {
        &[4_000_000, 1_000_000]
    } else {
        &[1_000_000]
    };
    let received = lab.shared_log::<u64>("received");
    let measured = lab.shared_log::<(u64, u64)>("measured");
    let a_id = lab.peer_id("a");
    let b_id = lab.peer_id("b");
    // The sender's part of round `round`: send, and once the batch arrived, count the drops.
    let send = {
        let (received, measured) = (received.clone(), measured.clone());
        move |node: meshwire::Node,
              stats: std::sync::Arc<meshwire_lab::socket::SocketStats>,
              to: meshwire::PeerId,
              round: usize| {
            let (received, measured) = (received.clone(), measured.clone());
            async move {
                let before = stats.queue_drops.load(Ordering::Relaxed);
                let started = clock();
                let (header, chunks) = batch(round as u64 + 1, sizes[round]);
                node.send_batch(to, header, chunks).await?;
                let took = clock() - started;
                while received.len() <= round {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let drops = stats.queue_drops.load(Ordering::Relaxed) - before;
                measured.push((drops, took.as_micros() as u64));
                Ok::<(), Box<dyn std::error::Error>>(())
            }
        }
    };
    {
        let (received, send) = (received.clone(), send.clone());
        lab.host("b", move |context| {
            let (received, send) = (received.clone(), send.clone());
            async move {
                let (node, stats) = context.start_node(context.node_config()).await?;
                if sender == Sender::Dialer {
                    let mut inbox = node.subscribe_batches(DATA)?;
                    while let Some(batch) = inbox.recv().await {
                        let id = batch.header().batch_id;
                        if batch.collect().await.is_ok() {
                            received.push(id);
                        }
                    }
                    return Ok(());
                }
                for round in 0..sizes.len() {
                    while !node.connected_peers().contains(&a_id) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    send(node.clone(), stats.clone(), a_id, round).await?;
                    while node.connected_peers().contains(&a_id) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                Ok(())
            }
        });
    }
    let b = lab.node_address("b").unwrap();
    let whole = Rc::new(Cell::new(false));
    {
        let (whole, received, measured) = (whole.clone(), received.clone(), measured.clone());
        lab.client("a", move |context| async move {
            let (node, stats) = context.start_node(context.node_config()).await?;
            let mut inbox = match sender {
                Sender::Acceptor => Some(node.subscribe_batches(DATA)?),
                Sender::Dialer => None,
            };
            for round in 0..sizes.len() {
                if round + 1 == sizes.len() {
                    tokio::time::sleep(
                        PATH_CHANGE.saturating_sub(clock()) + Duration::from_millis(100),
                    )
                    .await;
                }
                node.connect(b, b_id).await?;
                match inbox.as_mut() {
                    None => send(node.clone(), stats.clone(), b_id, round).await?,
                    Some(inbox) => {
                        let batch = inbox.recv().await.ok_or("no batch")?;
                        let id = batch.header().batch_id;
                        batch.collect().await?;
                        received.push(id);
                    }
                }
                // The sender has measured its batch before the connection goes.
                while measured.len() <= round {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                node.close_for_violation(b_id, "test_redial");
                while node.connected_peers().contains(&b_id) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            whole.set(received.len() == sizes.len());
            Ok(())
        });
    }
    let finished = lab.run(Duration::from_secs(60), |_| {}).unwrap();
    assert!(finished, "the run did not finish");
    let (drops, micros) = measured
        .entries()
        .last()
        .copied()
        .expect("no batch was sent");
    (drops, whole.get(), Duration::from_micros(micros))
}

/// Runs the last batch cold and resumed on the `changed` path, `sender` sending; prints both
/// (a measurement, not asserted) and checks that both arrived whole and that the resumed one
/// overflowed the queue no more than the cold one.
fn resumed_overflows_no_more_than_cold(sender: Sender, what: &str, changed: LinkSpec) {
    let (cold, cold_whole, cold_time) = second_batch(sender, false, changed);
    let (resumed, resumed_whole, resumed_time) = second_batch(sender, true, changed);
    eprintln!(
        "{sender:?} sends, path {what}: 1 MB sent in {resumed_time:?} resumed ({resumed} drops) \
         against {cold_time:?} cold ({cold} drops)"
    );
    assert!(cold_whole && resumed_whole, "{what}");
    assert!(
        resumed <= cold,
        "{what}: resumed {resumed} drops, cold {cold}"
    );
}

/// The path change: the RTT doubled, so the estimate is dropped and the redial starts
/// as a cold start does.
#[test]
fn a_redial_after_the_rtt_doubled_overflows_no_more_than_a_cold_start() {
    resumed_overflows_no_more_than_cold(Sender::Dialer, "rtt doubled", path(40, 25));
}

/// The rate quartered at the same RTT: the estimate is used (half the old rate is twice the new
/// one), and the first flight fits the new path and its one-BDP queue.
#[test]
fn a_redial_after_the_rate_quartered_overflows_no_more_than_a_cold_start() {
    resumed_overflows_no_more_than_cold(Sender::Dialer, "rate quartered", path(20, 25));
}

/// A connection the sender accepted resumes as a dialed one does: after the rate quartered it
/// overflows the queue no more than a cold start, and after the RTT doubled the estimate is
/// dropped.
#[test]
fn an_accepted_connection_resumes_no_less_safely_than_a_cold_start() {
    for (what, changed) in [
        ("unchanged", path(20, 100)),
        ("rate quartered", path(20, 25)),
        ("rtt doubled", path(40, 25)),
    ] {
        resumed_overflows_no_more_than_cold(Sender::Acceptor, what, changed);
    }
}
