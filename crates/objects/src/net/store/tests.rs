//! The store's tests: reads, writes, conditional writes, corruption, reopening and compaction.

use super::*;
use crate::proto::object::content_hash;

fn stamp(version: u64, content: &[u8]) -> Stamp {
    Stamp {
        version,
        hash: content_hash(content),
    }
}

#[test]
fn newer_versions_replace_older_ones_only() {
    let store = Store::in_memory(1 << 20).unwrap();
    assert_eq!(store.get("k").unwrap(), None);
    let v2 = stamp(2, b"two");
    assert_eq!(store.put("k", v2, Bytes::from_static(b"two")).unwrap(), v2);
    let v1 = stamp(1, b"one");
    assert_eq!(store.put("k", v1, Bytes::from_static(b"one")).unwrap(), v2);
    assert_eq!(store.get("k").unwrap().unwrap().content, "two");
    let v3 = stamp(3, b"three!");
    store.put("k", v3, Bytes::from_static(b"three!")).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().stamp, v3);
    assert_eq!(
        store.size().unwrap(),
        StoreSize {
            objects: 1,
            content_bytes: 6,
            file_bytes: 0,
        }
    );
}

#[test]
fn compaction_shrinks_the_file_and_keeps_every_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    // Content in redb's pieces, not in content files: this is redb's file shrinking.
    let store = Store::open_with(&path, 1 << 20, usize::MAX).unwrap();
    let content = |key: u32, len: usize| {
        Bytes::from(
            (0..len)
                .map(|i| (i as u32).wrapping_mul(key + 7) as u8)
                .collect::<Vec<u8>>(),
        )
    };
    for key in 0..24 {
        let big = content(key, 1 << 20);
        store.put(&format!("k{key}"), stamp(1, &big), big).unwrap();
    }
    for key in 0..24 {
        let small = content(key + 100, 16 << 10);
        store
            .put(&format!("k{key}"), stamp(2, &small), small)
            .unwrap();
    }
    // 24 MiB written, then replaced by 384 KiB (a smaller slack than the default's 32 MiB
    // keeps the test small).
    let done = store
        .compact_above(COMPACT_SLACK_RATIO, 1 << 20)
        .unwrap()
        .expect("compacted");
    assert!(done.after_bytes < done.before_bytes / 2, "{done:?}");
    assert_eq!(done.content_bytes, 24 * (16 << 10));
    assert_eq!(disk_bytes(&path).unwrap(), done.after_bytes);
    // Once compact, there is nothing left to do.
    assert_eq!(store.compact().unwrap(), None);
    drop(store);
    let store = Store::open_with(&path, 1 << 20, usize::MAX).unwrap();
    for key in 0..24 {
        let object = store.get(&format!("k{key}")).unwrap().unwrap();
        assert_eq!(object.content, content(key + 100, 16 << 10));
    }
    // A store in memory has no file to shrink.
    let memory = Store::in_memory(1 << 20).unwrap();
    assert_eq!(memory.compact_above(0.0, 0).unwrap(), None);
}

#[test]
fn objects_survive_reopening_and_corruption_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let big = Bytes::from(
        (0..3_000_000u32)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    {
        let store = Store::open_with(&path, 1 << 20, usize::MAX).unwrap();
        for key in ["good", "bad", "missing", "short"] {
            store.put(key, stamp(1, &big), big.clone()).unwrap();
        }
    }
    {
        // Damage objects behind the store's back, as a disk fault would.
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut chunks = txn.open_table(CHUNKS).unwrap();
            let mut piece = chunks.get(("bad", 1)).unwrap().unwrap().value().to_vec();
            piece[7] ^= 0xff;
            chunks.insert(("bad", 1), piece.as_slice()).unwrap();
            chunks.remove(("missing", 2)).unwrap();
            let mut headers = txn.open_table(HEADERS).unwrap();
            headers.insert("short", [1u8, 2, 3].as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let store = Store::open(&path, 1 << 20).unwrap();
    assert_eq!(store.get("good").unwrap().unwrap().content, big);
    for key in ["bad", "missing", "short"] {
        assert!(
            matches!(store.get(key), Err(StoreError::Corrupt { key: k, .. }) if k == key),
            "{key}"
        );
    }
}

#[test]
fn content_is_cut_into_pieces_that_fill_page_runs() {
    for len in [0, 1, 4095, 4096, 1 << 20, 8 << 20, 3_000_001] {
        let sizes: Vec<usize> = chunk_sizes(len, 20).collect();
        assert_eq!(sizes.iter().sum::<usize>(), len, "{len}");
        for (i, size) in sizes.iter().enumerate() {
            let run = size + CHUNK_SLACK + 20;
            // Every piece but the last fills a power-of-two run of pages exactly.
            if i + 1 < sizes.len() {
                assert!(run.is_power_of_two() && run >= PAGE, "{len}: {size}");
            }
            assert!(run <= MAX_CHUNK_PAGES * PAGE, "{len}: {size}");
        }
    }
    assert_eq!(chunk_sizes(8 << 20, 20).count(), 9);
    // An absurd key still cuts content into a bounded number of pieces.
    assert!(chunk_sizes(1 << 20, 1 << 21).count() == 1);
}

#[test]
fn shrinking_an_object_removes_its_old_pieces() {
    let store = Store::in_memory(0).unwrap();
    let big = Bytes::from(vec![1u8; 5 << 20]);
    store.put("k", stamp(1, &big), big).unwrap();
    let small = Bytes::from_static(b"small");
    store.put("k", stamp(2, &small), small.clone()).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().content, small);
    let db = store.db();
    let txn = db.begin_read().unwrap();
    let pieces = txn.open_table(CHUNKS).unwrap().len().unwrap();
    assert_eq!(pieces, 1);
    assert_eq!(store.size().unwrap().content_bytes, 5);
}

#[test]
fn a_store_in_the_old_layout_is_converted_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let contents: Vec<(String, Bytes)> = (0..50u8)
        .map(|i| {
            (
                format!("k{i}"),
                Bytes::from(vec![i; 40_000 * usize::from(i)]),
            )
        })
        .collect();
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut legacy = txn.open_table(LEGACY).unwrap();
            for (key, content) in &contents {
                let s = stamp(3, content);
                let mut record = s.version.to_le_bytes().to_vec();
                record.extend_from_slice(&s.hash);
                record.extend_from_slice(content);
                legacy.insert(key.as_str(), record.as_slice()).unwrap();
            }
            legacy.insert("unreadable", [9u8; 5].as_slice()).unwrap();
            let mut totals = txn.open_table(TOTALS).unwrap();
            let total = contents.iter().map(|(_, c)| c.len() as u64).sum::<u64>();
            totals.insert(CONTENT_BYTES, total).unwrap();
        }
        txn.commit().unwrap();
    }
    let store = Store::open(&path, 1 << 20).unwrap();
    for (key, content) in &contents {
        let object = store.get(key).unwrap().unwrap();
        assert_eq!(object.stamp, stamp(3, content));
        assert_eq!(&object.content, content);
    }
    assert_eq!(store.get("unreadable").unwrap(), None);
    assert_eq!(store.size().unwrap().objects, 50);
    let db = store.db();
    let txn = db.begin_read().unwrap();
    assert!(!txn.list_tables().unwrap().any(|t| t.name() == "objects"));
}

#[test]
fn conditional_writes_apply_only_when_the_precondition_holds() {
    let store = Store::in_memory(1 << 20).unwrap();
    let one = stamp(1, b"one");
    let put = |s: Stamp, content: &'static [u8], p| {
        store
            .put_if("k", s, Bytes::from_static(content), p)
            .unwrap()
    };
    assert_eq!(put(one, b"one", Precondition::Matches(one)), Err(None));
    assert_eq!(put(one, b"one", Precondition::Absent), Ok(one));
    assert_eq!(
        put(stamp(2, b"two"), b"two", Precondition::Absent),
        Err(Some(one))
    );
    let two = stamp(2, b"two");
    assert_eq!(put(two, b"two", Precondition::Matches(one)), Ok(two));
    // A stale precondition fails even with a newer version.
    assert_eq!(
        put(stamp(3, b"three"), b"three", Precondition::Matches(one)),
        Err(Some(two))
    );
    assert_eq!(store.get("k").unwrap().unwrap().content, "two");
}

#[test]
fn a_batch_applies_the_same_rule_in_one_transaction() {
    let store = Store::in_memory(1 << 20).unwrap();
    let two = stamp(2, b"two");
    store.put("b", two, Bytes::from_static(b"two")).unwrap();
    let copies = vec![
        ("a".to_string(), stamp(1, b"a"), Bytes::from_static(b"a")),
        (
            "b".to_string(),
            stamp(1, b"old"),
            Bytes::from_static(b"old"),
        ),
        ("c".to_string(), stamp(3, b"c"), Bytes::from_static(b"c")),
    ];
    let held = store.put_batch(&copies).unwrap();
    assert_eq!(held, vec![stamp(1, b"a"), two, stamp(3, b"c")]);
    assert_eq!(store.get("b").unwrap().unwrap().content, "two");
    assert_eq!(
        store.size().unwrap(),
        StoreSize {
            objects: 3,
            content_bytes: 5,
            file_bytes: 0,
        }
    );
}

#[test]
fn the_cache_stays_within_its_bound() {
    let store = Store::in_memory(4096).unwrap();
    for i in 0..100u64 {
        let content = Bytes::from(vec![i as u8; 500]);
        store
            .put(&format!("k{i}"), stamp(1, &content), content)
            .unwrap();
    }
    assert!(store.cache().bytes <= 2048);
    assert_eq!(store.get("k0").unwrap().unwrap().content.len(), 500);
    assert_eq!(store.size().unwrap().objects, 100);
}

/// The content files in the store's directory, by name.
fn content_files(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path.with_extension("content"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The content file the header of `key` names.
fn file_of(store: &Store, path: &Path, key: &str) -> PathBuf {
    let db = store.db();
    let txn = db.begin_read().unwrap();
    let headers = txn.open_table(HEADERS).unwrap();
    let id = read_header(&headers, key).unwrap().unwrap().file().unwrap();
    path.with_extension("content").join(format!("{id:016x}"))
}

fn filled(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(seed | 1))
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn large_content_lives_in_one_file_per_object_and_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let store = Store::open(&path, 1 << 20).unwrap();
    let one = filled(FILE_MIN_BYTES, 1);
    store.put("k", stamp(1, &one), one.clone()).unwrap();
    assert_eq!(content_files(&path).len(), 1);
    assert_eq!(std::fs::read(file_of(&store, &path, "k")).unwrap(), one);
    // A newer large version replaces the file; a losing one writes none.
    let two = filled(3 * FILE_MIN_BYTES, 2);
    store.put("k", stamp(2, &two), two.clone()).unwrap();
    assert_eq!(
        store.put("k", stamp(1, &one), one.clone()).unwrap(),
        stamp(2, &two)
    );
    assert_eq!(content_files(&path).len(), 1);
    assert_eq!(
        store.size().unwrap(),
        StoreSize {
            objects: 1,
            content_bytes: two.len() as u64,
            file_bytes: two.len() as u64,
        }
    );
    drop(store);
    let store = Store::open(&path, 1 << 20).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().content, two);
    // A small version moves the content back into redb and removes the file.
    let small = filled(FILE_MIN_BYTES - 1, 3);
    store.put("k", stamp(3, &small), small.clone()).unwrap();
    assert!(content_files(&path).is_empty());
    assert_eq!(store.size().unwrap().file_bytes, 0);
    drop(store);
    let store = Store::open(&path, 1 << 20).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().content, small);
    // A store in memory keeps everything in redb.
    let memory = Store::in_memory(1 << 20).unwrap();
    memory.put("k", stamp(1, &two), two.clone()).unwrap();
    assert_eq!(memory.get("k").unwrap().unwrap().content, two);
    assert_eq!(memory.size().unwrap().file_bytes, 0);
}

#[test]
fn a_batch_keeps_the_files_of_winners_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let store = Store::open(&path, 1 << 20).unwrap();
    let held = filled(FILE_MIN_BYTES, 9);
    store.put("b", stamp(5, &held), held.clone()).unwrap();
    let copies: Vec<(String, Stamp, Bytes)> = [("a", 1, 1), ("b", 4, 2), ("c", 1, 3), ("a", 2, 4)]
        .into_iter()
        .map(|(key, version, seed)| {
            let content = filled(FILE_MIN_BYTES + usize::from(seed), seed);
            (key.to_string(), stamp(version, &content), content)
        })
        .collect();
    let stamps = store.put_batch(&copies).unwrap();
    assert_eq!(
        stamps,
        vec![copies[0].1, stamp(5, &held), copies[2].1, copies[3].1]
    );
    // a (its second copy), b (held) and c: three files, none of the loser or the replaced.
    assert_eq!(content_files(&path).len(), 3);
    assert_eq!(store.get("a").unwrap().unwrap().content, copies[3].2);
    assert_eq!(store.get("b").unwrap().unwrap().content, held);
}

#[test]
fn stray_files_are_removed_on_open_and_damaged_ones_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let big = filled(2 * FILE_MIN_BYTES, 5);
    let files = {
        let store = Store::open(&path, 1 << 20).unwrap();
        for key in ["good", "bad", "missing", "short"] {
            store.put(key, stamp(1, &big), big.clone()).unwrap();
        }
        ["bad", "missing", "short"].map(|key| file_of(&store, &path, key))
    };
    // Damage files behind the store's back, and leave what a crash leaves: a file no header
    // names (its write never committed). A name that is no content file is not touched.
    let [bad, missing, short] = files;
    let mut damaged = std::fs::read(&bad).unwrap();
    damaged[7] ^= 0xff;
    std::fs::write(&bad, damaged).unwrap();
    std::fs::remove_file(&missing).unwrap();
    std::fs::write(&short, &big[..100]).unwrap();
    let content = path.with_extension("content");
    std::fs::write(content.join("00000000000000ff"), b"uncommitted").unwrap();
    std::fs::write(content.join("notes.txt"), b"not ours").unwrap();
    let store = Store::open(&path, 1 << 20).unwrap();
    assert_eq!(content_files(&path).len(), 3 + 1);
    assert!(content.join("notes.txt").exists());
    assert_eq!(store.get("good").unwrap().unwrap().content, big);
    for key in ["bad", "missing", "short"] {
        assert!(
            matches!(store.get(key), Err(StoreError::Corrupt { key: k, .. }) if k == key),
            "{key}"
        );
    }
    // New files are numbered above every file seen.
    let next = filled(FILE_MIN_BYTES, 6);
    store.put("next", stamp(1, &next), next).unwrap();
    assert!(file_of(&store, &path, "next").ends_with("0000000000000100"));
}

#[test]
fn readers_of_an_object_rewritten_under_them_read_whole_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    // No object cache: every read goes to the content file.
    let store = std::sync::Arc::new(Store::open(&path, 0).unwrap());
    let versions: Vec<Bytes> = (0..40u8).map(|v| filled(FILE_MIN_BYTES + 1, v)).collect();
    store
        .put("k", stamp(0, &versions[0]), versions[0].clone())
        .unwrap();
    let writer = {
        let store = store.clone();
        let versions = versions.clone();
        std::thread::spawn(move || {
            for (version, content) in versions.iter().enumerate().skip(1) {
                store
                    .put("k", stamp(version as u64, content), content.clone())
                    .unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let object = store.get("k").unwrap().unwrap();
        assert_eq!(object.content, versions[object.stamp.version as usize]);
        reads += 1;
    }
    writer.join().unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().stamp.version, 39);
    assert_eq!(content_files(&path).len(), 1);
}

/// Writes `content` through a content writer in pieces of `piece` bytes.
fn written(store: &Store, content: &[u8], piece: usize) -> WrittenContent {
    let mut writer = store.content_writer().unwrap().unwrap();
    for part in content.chunks(piece) {
        writer.write(part).unwrap();
    }
    assert_eq!(writer.len(), content.len() as u64);
    writer.finish()
}

#[test]
fn content_written_in_pieces_becomes_the_objects_file_without_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("objects.redb");
    let store = Store::open(&path, 1 << 20).unwrap();
    let two = filled(3 * FILE_MIN_BYTES + 7, 2);
    let file = written(&store, &two, 10_000);
    assert_eq!(file.hash(), content_hash(&two));
    let file_path = file.path().to_path_buf();
    assert_eq!(
        store.put_written("k", stamp(2, &two), file).unwrap(),
        stamp(2, &two)
    );
    // The written file is the object's file; content too large for the cache (over a quarter of
    // its 512 KiB) is not held there, content that fits is.
    assert_eq!(file_of(&store, &path, "k"), file_path);
    assert!(store.cached("k").is_none());
    assert_eq!(store.get("k").unwrap().unwrap().content, two);
    assert_eq!(
        store.size().unwrap(),
        StoreSize {
            objects: 1,
            content_bytes: two.len() as u64,
            file_bytes: two.len() as u64,
        }
    );
    let fits = filled(FILE_MIN_BYTES, 5);
    let file = written(&store, &fits, 4096);
    store.put_written("fits", stamp(1, &fits), file).unwrap();
    assert_eq!(store.cached("fits").unwrap().content, fits);
    assert_eq!(content_files(&path).len(), 2);
    // A losing write's file is removed; so is the file of one whose hash is not its stamp's,
    // and the file of a writer dropped unfinished.
    let one = filled(FILE_MIN_BYTES, 1);
    let losing = written(&store, &one, 4096);
    assert_eq!(
        store.put_written("k", stamp(1, &one), losing).unwrap(),
        stamp(2, &two)
    );
    let lying = written(&store, &one, 4096);
    assert!(matches!(
        store.put_written("k", stamp(3, &two), lying),
        Err(StoreError::HashMismatch { .. })
    ));
    let mut dropped = store.content_writer().unwrap().unwrap();
    dropped.write(&one).unwrap();
    assert_eq!(content_files(&path).len(), 3);
    drop(dropped);
    let unfinished = written(&store, &one, 4096);
    drop(unfinished);
    assert_eq!(content_files(&path).len(), 2);
    drop(store);
    let store = Store::open(&path, 1 << 20).unwrap();
    assert_eq!(store.get("k").unwrap().unwrap().content, two);
    // A store in memory has no content files to write into.
    assert!(Store::in_memory(1 << 20)
        .unwrap()
        .content_writer()
        .unwrap()
        .is_none());
}
