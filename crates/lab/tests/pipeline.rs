//! Pipelines over a lab ring of five nodes: K batches in flight complete in order with every
//! node's transform applied, and a link that flaps fails the batch in flight with a typed error
//! while later batches go through once the link is back.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use meshwire::pipeline::{BatchResult, PipelineError};
use meshwire::{Backoff, NodeConfig};
use meshwire_lab::experiments::ring_batches::{team_batch, Team};
use meshwire_lab::lab::{clock, wan_link};
use meshwire_lab::{Lab, LabEvent};

const NODES: usize = 5;

fn team(in_flight: usize, tune: fn(&mut NodeConfig)) -> Team {
    Team {
        nodes: NODES,
        in_flight,
        compute_per_batch: Duration::from_millis(5),
        batch_deadline: Duration::from_secs(1),
        ping_interval: Duration::from_millis(100),
        initial_window_bytes: None,
        congestion: meshwire::Congestion::default(),
        tune,
    }
}

#[test]
fn a_five_node_ring_with_k_3_completes_20_batches_in_order_with_every_transform() {
    let team = team(3, |_| {});
    let mut lab = Lab::new(
        11,
        wan_link(Duration::from_millis(10), 1_000_000_000),
        Duration::from_secs(30),
    );
    let (ring, addresses) = team.add_relays(&mut lab, None);
    let results: Rc<RefCell<Vec<BatchResult>>> = Rc::default();
    let peak_in_flight = Rc::new(RefCell::new(0));
    {
        let (team, ring, addresses, results, peak) = (
            team.clone(),
            ring.clone(),
            addresses.clone(),
            results.clone(),
            peak_in_flight.clone(),
        );
        lab.client("n0", move |context| async move {
            let (_node, pipeline) = team.start_first(&context, &ring, &addresses).await?;
            let submitter = {
                let pipeline = pipeline.clone();
                tokio::task::spawn_local(async move {
                    for round in 0..20 {
                        pipeline.submit(team_batch(round, 20, 100)).await?;
                    }
                    Ok::<_, PipelineError>(())
                })
            };
            for _ in 0..20 {
                let in_flight = pipeline.status().in_flight;
                let highest = (*peak.borrow()).max(in_flight);
                *peak.borrow_mut() = highest;
                let result = pipeline.next_result().await.ok_or("pipeline closed")?;
                results.borrow_mut().push(result);
            }
            submitter.await??;
            Ok(())
        });
    }
    team.fill_addresses(&lab, &addresses).unwrap();
    assert!(lab.run(Duration::from_secs(30), |_| {}).unwrap());

    let results = results.borrow();
    assert_eq!(
        results.iter().map(|r| r.batch_id).collect::<Vec<_>>(),
        (0..20).collect::<Vec<u64>>()
    );
    for (round, result) in results.iter().enumerate() {
        let chunks = result.outcome.as_ref().expect("batch failed");
        let expected = team_batch(round as u64, 20, 100);
        assert_eq!(chunks.len(), expected.chunks.len());
        for (got, sent) in chunks.iter().zip(&expected.chunks) {
            // Each of the five nodes added one to every byte.
            let want: Vec<u8> = sent
                .data
                .iter()
                .map(|b| b.wrapping_add(NODES as u8))
                .collect();
            assert_eq!(&got.data[..], &want[..], "round {round}");
        }
    }
    // K bounds the batches in flight, and the ring did use the room.
    let peak = *peak_in_flight.borrow();
    assert!((2..=3).contains(&peak), "peak in flight {peak}");
}

/// Short keep-alive and idle timeout, so a 2 s partition drops the connection, and a backoff
/// capped at 1 s.
fn flappy(config: &mut NodeConfig) {
    config.transport.keep_alive = Duration::from_millis(200);
    config.transport.idle_timeout = Duration::from_secs(1);
    config.backoff = Backoff {
        floor: Duration::from_millis(100),
        cap: Duration::from_secs(1),
    };
}

#[test]
fn a_partitioned_ring_link_fails_the_batch_in_flight_and_the_ring_resumes() {
    let team = team(2, flappy);
    let mut lab = Lab::new(
        12,
        wan_link(Duration::from_millis(10), 1_000_000_000),
        Duration::from_secs(30),
    );
    let (ring, addresses) = team.add_relays(&mut lab, None);
    // (batch id, submitted at, outcome, released at)
    type Record = (u64, Duration, Result<(), PipelineError>, Duration);
    let records: Rc<RefCell<Vec<Record>>> = Rc::default();
    // Batches leave every 100 ms from 110 ms and take about 75 ms round the ring: at 3.04 s one
    // is on its way.
    let partition_at = Duration::from_millis(3_040);
    let repair_at = Duration::from_secs(5);
    {
        let (team, ring, addresses, records) = (
            team.clone(),
            ring.clone(),
            addresses.clone(),
            records.clone(),
        );
        lab.client("n0", move |context| async move {
            let (_node, pipeline) = team.start_first(&context, &ring, &addresses).await?;
            let submitted: Rc<RefCell<Vec<(u64, Duration)>>> = Rc::default();
            let submitter = {
                let (pipeline, submitted) = (pipeline.clone(), submitted.clone());
                tokio::task::spawn_local(async move {
                    let mut round = 0;
                    while clock() < Duration::from_secs(9) {
                        let at = clock();
                        let id = pipeline.submit(team_batch(round, 10, 100)).await?;
                        submitted.borrow_mut().push((id, at));
                        round += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Ok::<_, PipelineError>(round)
                })
            };
            let mut released = 0;
            loop {
                tokio::select! {
                    result = pipeline.next_result() => {
                        let result = result.ok_or("pipeline closed")?;
                        let at = submitted
                            .borrow()
                            .iter()
                            .find(|(id, _)| *id == result.batch_id)
                            .map(|(_, at)| *at)
                            .ok_or("result for a batch never submitted")?;
                        let outcome = result.outcome.map(|_| ());
                        records.borrow_mut().push((result.batch_id, at, outcome, clock()));
                        released += 1;
                    }
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {
                        if submitter.is_finished() && released == submitted.borrow().len() {
                            break;
                        }
                    }
                }
            }
            submitter.await??;
            Ok(())
        });
    }
    lab.at(partition_at, LabEvent::Partition("n2".into(), "n3".into()));
    lab.at(repair_at, LabEvent::Repair("n2".into(), "n3".into()));
    team.fill_addresses(&lab, &addresses).unwrap();
    assert!(lab.run(Duration::from_secs(30), |_| {}).unwrap());

    let records = records.borrow();
    // Every batch has exactly one outcome, in submission order: none silently lost.
    let ids: Vec<u64> = records.iter().map(|r| r.0).collect();
    assert_eq!(ids, (0..records.len() as u64).collect::<Vec<_>>());
    assert!(records.len() > 60, "{} batches", records.len());
    // Before the partition, everything went through.
    assert!(records
        .iter()
        .filter(|r| r.3 < partition_at)
        .all(|r| r.2.is_ok()));
    // The batches in flight when the link went down failed with a typed error.
    let failed: Vec<&Record> = records.iter().filter(|r| r.2.is_err()).collect();
    assert!(!failed.is_empty());
    assert!(failed.iter().all(|r| matches!(
        r.2,
        Err(PipelineError::Timeout(_) | PipelineError::Send(_) | PipelineError::Receive(_))
    )));
    assert!(failed
        .iter()
        .any(|r| r.1 < partition_at && r.3 > partition_at));
    // The ring resumed within the backoff cap (plus a handshake and a trip round the ring).
    let backoff_cap = Duration::from_secs(1);
    let resumed = records
        .iter()
        .filter(|r| r.1 >= repair_at && r.2.is_ok())
        .map(|r| r.3)
        .min()
        .expect("no batch succeeded after the repair");
    assert!(
        resumed <= repair_at + backoff_cap + Duration::from_millis(500),
        "resumed {:?} after the repair",
        resumed - repair_at
    );
    // After that, every batch succeeded.
    assert!(records
        .iter()
        .filter(|r| r.1 >= resumed)
        .all(|r| r.2.is_ok()));
}
