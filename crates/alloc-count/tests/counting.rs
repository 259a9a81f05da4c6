//! The allocator counts what a thread allocates and what a tracked context holds.

use std::hint::black_box;

use meshwire_alloc_count::{
    clear_tracker, set_tracker, thread_counts, tracked_counts, tracked_live_and_peak,
    CountingAllocator,
};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

thread_local! {
    static TRACKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn tracking() -> bool {
    TRACKING.with(|flag| flag.get())
}

#[test]
fn counts_thread_allocations_and_tracked_peaks() {
    let before = thread_counts();
    let buffer = black_box(vec![0u8; 4096]);
    let counted = thread_counts().since(&before);
    assert_eq!(counted.allocations, 1);
    assert_eq!(counted.bytes, 4096);
    drop(buffer);

    set_tracker(tracking);
    TRACKING.with(|flag| flag.set(true));
    let a = black_box(vec![1u8; 1000]);
    let b = black_box(vec![2u8; 3000]);
    drop(a);
    let c = black_box(vec![3u8; 500]);
    // Suspended attribution: neither this allocation nor its free counts.
    meshwire_alloc_count::untracked(|| drop(black_box(vec![5u8; 50_000])));
    TRACKING.with(|flag| flag.set(false));
    let untracked = black_box(vec![4u8; 100_000]);
    TRACKING.with(|flag| flag.set(true));
    drop(b);
    drop(c);
    TRACKING.with(|flag| flag.set(false));
    clear_tracker();
    drop(untracked);

    assert_eq!(tracked_counts().allocations, 3);
    assert_eq!(tracked_counts().bytes, 4500);
    // Peak: 1000 + 3000 live at once; then 3000 + 500; nothing left at the end.
    assert_eq!(tracked_live_and_peak(), (0, 4000));
    assert!(meshwire_alloc_count::is_installed());
}
