use super::*;
use crate::proto::object::content_hash;
use proptest::prelude::*;

fn stamp(version: u64, content: &[u8]) -> Stamp {
    Stamp {
        version,
        hash: content_hash(content),
    }
}

type Model = BTreeMap<String, Stamp>;

fn summary(store: &Model, buckets: usize) -> Summary {
    let mut summary = Summary::new(buckets).unwrap();
    for (key, stamp) in store {
        summary.add(key, stamp);
    }
    summary
}

/// The lister's side, as the driver does it: a window of each chosen bucket from `offset`.
fn listing(
    store: &Model,
    chosen: &[usize],
    buckets: usize,
    offset: usize,
    limits: ExchangeLimits,
) -> Vec<BucketEntries> {
    chosen
        .iter()
        .map(|&bucket| {
            let all: Vec<Entry> = store
                .iter()
                .filter(|(key, _)| bucket_of(key, buckets) == bucket)
                .map(|(key, stamp)| Entry {
                    key: key.clone(),
                    stamp: *stamp,
                    len: 1,
                })
                .collect();
            let count = all.len();
            let window = limits.window();
            BucketEntries {
                bucket,
                complete: count <= window,
                entries: all
                    .into_iter()
                    .enumerate()
                    .filter(|(index, _)| in_window(*index, count, offset, window))
                    .map(|(_, entry)| entry)
                    .collect(),
            }
        })
        .collect()
}

/// Applies a copy as the store does; checks that no copy is ever replaced by one it beats.
fn apply(store: &mut Model, key: &str, stamp: Stamp) {
    match store.get(key) {
        Some(old) if !wins(&stamp, old) => {}
        _ => {
            if let Some(old) = store.get(key) {
                assert!(wins(&stamp, old), "a copy was replaced by one that loses");
            }
            store.insert(key.to_string(), stamp);
        }
    }
}

/// One exchange initiated by `a` with `b`, through the encoded messages, as the driver runs
/// it: `buckets` is the pair's bucket count, doubled after an answer with a bucket cut short.
/// Returns whether anything differed.
fn exchange(
    a: &mut Model,
    b: &mut Model,
    buckets: &mut usize,
    start: usize,
    limits: ExchangeLimits,
) -> bool {
    let placement = placement_id(&[[1; 32], [2; 32]], 2);
    let count = (*buckets).max(buckets_for(a.len()));
    let request = encode_digests(7, &placement, summary(a, count).digests());
    let request = decode_digests(&request).unwrap();
    assert_eq!(request.placement, placement);
    let theirs = summary(b, count);
    let (chosen, _more) = select_buckets(&theirs, &request.digests, start, limits).unwrap();
    let answer = encode_entries(8, &listing(b, &chosen, count, start, limits), limits);
    let listed = decode_entries(&answer, count, limits)
        .unwrap()
        .answer
        .unwrap();
    if listed.iter().any(|bucket| !bucket.complete) {
        *buckets = (count * 2).min(MAX_BUCKETS);
    }
    let mut mine: BTreeMap<usize, Vec<(String, Stamp)>> = BTreeMap::new();
    for (key, stamp) in a.iter() {
        mine.entry(bucket_of(key, count))
            .or_default()
            .push((key.clone(), *stamp));
    }
    let repairs = reconcile(&listed, &mine);
    for entry in &repairs.pull {
        let held = b[&entry.key];
        apply(a, &entry.key, held);
    }
    for (key, stamp) in &repairs.push {
        apply(b, key, *stamp);
    }
    !chosen.is_empty()
}

#[test]
fn digests_agree_whatever_the_order_and_differ_on_any_change() {
    let mut one = Summary::new(16).unwrap();
    let mut two = Summary::new(16).unwrap();
    let entries: Vec<(String, Stamp)> =
        (0..50).map(|i| (format!("k{i}"), stamp(i, b"x"))).collect();
    for (key, s) in &entries {
        one.add(key, s);
    }
    for (key, s) in entries.iter().rev() {
        two.add(key, s);
    }
    assert_eq!(one, two);
    let mut wide = Summary::new(MAX_BUCKETS).unwrap();
    for (key, s) in &entries {
        wide.add(key, s);
    }
    assert_eq!(
        wide.fold(16).unwrap(),
        one,
        "folding equals summarising in fewer buckets"
    );
    assert_eq!(wide.total(), 50);
    two.add("k50", &stamp(1, b"y"));
    assert_ne!(one.digests(), two.digests());
    let (chosen, more) = select_buckets(&two, one.digests(), 0, ExchangeLimits::default()).unwrap();
    assert_eq!(chosen, vec![bucket_of("k50", 16)]);
    assert!(!more);
}

#[test]
fn bad_digest_messages_are_typed_errors() {
    let placement = [9u8; DIGEST_LEN];
    let good = encode_digests(1, &placement, Summary::new(8).unwrap().digests());
    assert_eq!(decode_digests(&good).unwrap().digests.len(), 8);
    for (buckets, _) in [(0u16, ()), (3, ()), (8192, ()), (u16::MAX, ())] {
        let mut bad = good.clone();
        bad[24..26].copy_from_slice(&buckets.to_le_bytes());
        assert_eq!(
            decode_digests(&bad),
            Err(EntropyError::BucketCount(usize::from(buckets)))
        );
    }
    let mut long = good.clone();
    long.push(0);
    assert_eq!(
        decode_digests(&long).map_err(|e| e.reason()),
        Err("trailing")
    );
    // Claims 16 buckets, carries 8.
    let mut short = good.clone();
    short[24..26].copy_from_slice(&16u16.to_le_bytes());
    assert_eq!(
        decode_digests(&short).map_err(|e| e.reason()),
        Err("truncated")
    );
    assert_eq!(
        decode_digests(&good[..10]).map_err(|e| e.reason()),
        Err("truncated")
    );
}

#[test]
fn bad_answers_are_typed_errors() {
    let limits = ExchangeLimits::default();
    let key = "k1";
    let bucket = bucket_of(key, 4);
    let listed = |bucket: usize| {
        vec![BucketEntries {
            bucket,
            complete: true,
            entries: vec![Entry {
                key: key.into(),
                stamp: stamp(1, b"a"),
                len: 1,
            }],
        }]
    };
    let good = encode_entries(3, &listed(bucket), limits);
    assert_eq!(
        decode_entries(&good, 4, limits).unwrap().answer.unwrap(),
        listed(bucket)
    );
    // The key is listed in a bucket it does not hash to.
    let wrong = encode_entries(3, &listed((bucket + 1) % 4), limits);
    assert_eq!(
        decode_entries(&wrong, 4, limits).map_err(|e| e.reason()),
        Err("bucket_range")
    );
    // A bucket beyond the range.
    let beyond = encode_entries(
        3,
        &[BucketEntries {
            bucket: 7,
            complete: true,
            entries: Vec::new(),
        }],
        limits,
    );
    assert_eq!(
        decode_entries(&beyond, 4, limits),
        Err(EntropyError::BucketRange {
            bucket: 7,
            buckets: 4
        })
    );
    // An absurd entry count is refused before anything is allocated.
    let mut absurd = good.clone();
    absurd[14..16].copy_from_slice(&u16::MAX.to_le_bytes());
    assert_eq!(
        decode_entries(&absurd, 4, limits).map_err(|e| e.reason()),
        Err("too_large")
    );
    let small = ExchangeLimits {
        max_entries: 100_000,
        max_bytes: 1 << 20,
    };
    assert_eq!(
        decode_entries(&absurd, 4, small).map_err(|e| e.reason()),
        Err("truncated")
    );
    // The same bucket twice.
    let mut twice = listed(bucket);
    twice.extend(listed(bucket));
    let twice = encode_entries(3, &twice, limits);
    assert_eq!(
        decode_entries(&twice, 4, limits).map_err(|e| e.reason()),
        Err("bucket_range")
    );
    let refused = encode_entries_refusal(5, Refusal::NotMember);
    assert_eq!(
        decode_entries(&refused, 4, limits).unwrap().answer,
        Err(Refusal::NotMember)
    );
}

#[test]
fn a_bucket_over_the_limit_is_listed_incomplete_and_pushes_nothing_it_lacks() {
    let limits = ExchangeLimits {
        max_entries: 2,
        max_bytes: 1 << 20,
    };
    let entries = (0..5)
        .map(|i| Entry {
            key: format!("k{i}"),
            stamp: stamp(1, b"a"),
            len: 1,
        })
        .collect();
    let answer = encode_entries(
        1,
        &[BucketEntries {
            bucket: 0,
            complete: true,
            entries,
        }],
        limits,
    );
    let listed = decode_entries(&answer, 1, limits).unwrap().answer.unwrap();
    assert_eq!(listed[0].entries.len(), 2);
    assert!(!listed[0].complete);
    let mine = BTreeMap::from([(0, vec![("k4".to_string(), stamp(1, b"a"))])]);
    let repairs = reconcile(&listed, &mine);
    assert!(repairs.push.is_empty(), "{repairs:?}");
    assert_eq!(repairs.pull.len(), 2);
}

#[test]
fn equal_versions_with_different_hashes_settle_on_the_smaller_hash() {
    let (x, y) = (stamp(5, b"x"), stamp(5, b"y"));
    let small = if x.hash < y.hash { x } else { y };
    let large = if x.hash < y.hash { y } else { x };
    let mut a = Model::from([("k".to_string(), large)]);
    let mut b = Model::from([("k".to_string(), small)]);
    exchange(&mut a, &mut b, &mut 1, 0, ExchangeLimits::default());
    assert_eq!((a["k"], b["k"]), (small, small));
}

fn models() -> impl Strategy<Value = Model> {
    proptest::collection::btree_map("[a-e][0-9]", (0u64..6, 0u8..3), 0..40).prop_map(|map| {
        map.into_iter()
            .map(|(key, (version, content))| (key, stamp(version, &[content])))
            .collect()
    })
}

proptest! {
    #[test]
    fn two_random_stores_converge_to_the_winning_copies(
        a in models(), b in models(), seed in any::<u64>(), max_entries in 1usize..8,
    ) {
        use rand::{Rng, SeedableRng};
        let limits = ExchangeLimits { max_entries, max_bytes: 1 << 20 };
        let mut expected = a.clone();
        for (key, s) in &b {
            apply(&mut expected, key, *s);
        }
        let (mut a, mut b) = (a, b);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (mut ab, mut ba) = (1, 1);
        // Each exchange repairs at most `max_entries` keys a way: 80 keys need 80 rounds.
        let mut converged = false;
        for round in 0..400 {
            let start = rng.random_range(0..4096);
            let differed = if round % 2 == 0 {
                exchange(&mut a, &mut b, &mut ab, start, limits)
            } else {
                exchange(&mut b, &mut a, &mut ba, start, limits)
            };
            if !differed && a == b {
                converged = true;
                break;
            }
        }
        prop_assert!(converged, "no convergence in 400 exchanges");
        prop_assert_eq!(&a, &expected);
        prop_assert_eq!(&b, &expected);
    }

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600),
                            buckets in 0usize..5000) {
        let _ = decode_digests(&bytes);
        let _ = decode_entries(&bytes, buckets, ExchangeLimits::default());
    }
}
