//! A node's memory under large objects: the store's budget holds (issue 19, bounded memory).

mod support;

use support::{put, Cluster};

#[test]
fn rss_after_a_hundred_puts_of_8_mib_stays_within_the_store_budget_plus_100_mb() {
    let cluster = Cluster::start(1, &[]);
    let token = cluster.token(0);
    let http = cluster.members[0].http;
    let mut body: Vec<u8> = (0..8u32 << 20).map(|i| (i % 253) as u8).collect();
    for i in 0..100u32 {
        // Distinct content per key, so nothing is shared between objects.
        body[..4].copy_from_slice(&i.to_le_bytes());
        assert_eq!(put(http, &format!("/objects/big-{i}"), &token, &body), 201);
    }
    let rss = cluster.rss_bytes(0);
    let bound = meshwire_objects::net::DEFAULT_STORE_MEMORY_BYTES as u64 + 100_000_000;
    assert!(
        rss <= bound,
        "RSS {} MB after 100 PUTs of 8 MiB, bound {} MB",
        rss / 1_000_000,
        bound / 1_000_000
    );
    // Every object is still there and whole.
    let status = cluster.status(0);
    assert_eq!(status["store"]["objects"], 100);
    assert_eq!(status["store"]["content_bytes"], 100u64 * (8 << 20));
}
