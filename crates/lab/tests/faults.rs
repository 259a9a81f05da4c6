//! Crashes and restarts in the lab: peers reconnect and traffic resumes.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use meshwire::protocols::DATA;
use meshwire_lab::lab::wan_link;
use meshwire_lab::{Lab, LabEvent};

#[test]
fn a_crashed_and_restarted_host_is_reconnected_by_its_peers() {
    let link = wan_link(Duration::from_millis(20), 100_000_000);
    let mut lab = Lab::new(5, link, Duration::from_secs(30));
    // b counts what it receives, per incarnation.
    let received: Rc<RefCell<Vec<u64>>> = Rc::default();
    {
        let received = received.clone();
        lab.host("b", move |context| {
            let received = received.clone();
            async move {
                received.borrow_mut().push(0);
                let (node, _) = context.start_node(context.node_config()).await?;
                let mut inbox = node.subscribe(DATA)?;
                while inbox.recv().await.is_some() {
                    *received.borrow_mut().last_mut().unwrap() += 1;
                }
                Ok(())
            }
        });
    }
    let b = lab.node_address("b").unwrap();
    let b_id = lab.peer_id("b");
    let reconnects = Rc::new(RefCell::new(0));
    {
        let reconnects = reconnects.clone();
        lab.client("a", move |context| async move {
            let (node, _) = context.start_node(context.node_config()).await?;
            node.add_peer(b, b_id)?;
            let start = tokio::time::Instant::now();
            while start.elapsed() < Duration::from_secs(8) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = node.try_send(b_id, DATA, Bytes::from_static(b"tick"));
            }
            *reconnects.borrow_mut() = node.metrics().reconnect_count();
            Ok(())
        });
    }
    lab.at(Duration::from_secs(2), LabEvent::Crash("b".into()));
    lab.at(Duration::from_secs(3), LabEvent::Restart("b".into()));
    assert!(lab.run(Duration::from_secs(20), |_| {}).unwrap());
    let received = received.borrow();
    assert_eq!(received.len(), 2, "b ran twice: {received:?}");
    assert!(received[0] > 100, "before the crash: {received:?}");
    // After the restart, a redialed b and messages flowed again for most of the remaining 5 s.
    assert!(received[1] > 100, "after the restart: {received:?}");
    assert!(*reconnects.borrow() >= 1);
    // The lab collects every node's metrics: a counted its reconnect.
    let metrics = lab.node_metrics();
    assert_eq!(metrics.len(), 2);
    assert!(metrics["a"].reconnect_count() >= 1);
}
