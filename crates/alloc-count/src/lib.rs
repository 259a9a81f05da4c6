//! Count heap allocations, bytes and the live-bytes high-water mark, per thread or for a tracked context.
//!
//! Install [`CountingAllocator`] as the global allocator of a benchmark or test binary:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: meshwire_alloc_count::CountingAllocator = meshwire_alloc_count::CountingAllocator;
//! ```
//!
//! Then [`thread_counts`] measures what code on the current thread allocated between two
//! snapshots, and a *tracked context* ([`set_tracker`]) attributes allocations to one part of a
//! process (the lab uses it to count only the sending host's heap while every host runs on one
//! thread). Frees are attributed to whichever context is current when they happen, so a tracked
//! context's live bytes are exact when it frees its own memory, as a sending node does.

#![allow(unsafe_code)] // A global allocator can only be written with `unsafe impl GlobalAlloc`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering};
use std::task::{Context, Poll};

/// Makes the C allocator give blocks of at least `bytes` their own memory mappings, returned to
/// the system when freed. glibc otherwise raises that threshold after the first large free (up to
/// 32 MiB), so the buffers of a few 8 MiB requests stay in its heaps and the process's RSS stays
/// high after the work is done (`bench/store.sh`: 279 MB RSS after 100 PUTs of 8 MiB, 115 MB with
/// a fixed 1 MiB threshold). Returns whether the setting applied: it does on glibc only. Call it
/// once, first thing in `main`.
pub fn map_large_allocations(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let Ok(bytes) = libc::c_int::try_from(bytes) else {
            return false;
        };
        // SAFETY: mallopt only changes a tuning parameter of glibc's allocator; it is safe to call
        // at any time, and M_MMAP_THRESHOLD accepts any value up to 32 MiB (larger ones fail).
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = bytes;
        false
    }
}

/// Allocations and bytes counted over some span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls to `alloc` (and `realloc`, which may move memory).
    pub allocations: u64,
    /// Bytes requested by those calls.
    pub bytes: u64,
}

impl Counts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            allocations: self.allocations - earlier.allocations,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

thread_local! {
    static THREAD: Cell<Counts> = const { Cell::new(Counts { allocations: 0, bytes: 0 }) };
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    static SUSPENDED: Cell<bool> = const { Cell::new(false) };
}

static TRACKER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
static TRACKED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static TRACKED_BYTES: AtomicU64 = AtomicU64::new(0);
static TRACKED_LIVE: AtomicI64 = AtomicI64::new(0);
static TRACKED_PEAK: AtomicI64 = AtomicI64::new(0);

/// The global allocator that counts. Forwards to the system allocator.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

fn in_tracked_context() -> bool {
    let tracker = TRACKER.load(Ordering::Relaxed);
    if tracker.is_null() || SUSPENDED.try_with(Cell::get).unwrap_or(true) {
        return false;
    }
    // The hook must not allocate; if it does anyway, the nested call is not attributed.
    IN_HOOK
        .try_with(|in_hook| {
            if in_hook.get() {
                return false;
            }
            in_hook.set(true);
            // SAFETY: TRACKER only ever holds a `fn() -> bool` stored by `set_tracker`.
            let hook: fn() -> bool = unsafe { std::mem::transmute(tracker) };
            let tracked = hook();
            in_hook.set(false);
            tracked
        })
        .unwrap_or(false)
}

fn record_alloc(size: usize) {
    let _ = THREAD.try_with(|counts| {
        let mut current = counts.get();
        current.allocations += 1;
        current.bytes += size as u64;
        counts.set(current);
    });
    if in_tracked_context() {
        TRACKED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        TRACKED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let live = TRACKED_LIVE.fetch_add(size as i64, Ordering::Relaxed) + size as i64;
        TRACKED_PEAK.fetch_max(live, Ordering::Relaxed);
    }
}

fn record_free(size: usize) {
    if in_tracked_context() {
        TRACKED_LIVE.fetch_sub(size as i64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counting
// around it touches only atomics and thread-locals, never the heap.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record_alloc(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record_alloc(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record_free(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record_free(layout.size());
        record_alloc(new_size);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` with tracked-context attribution suspended on this thread: what `f` allocates and
/// frees never counts for the tracked context (for memory that belongs to a test harness, such
/// as the lab's emulated network, rather than to the code under measurement).
pub fn untracked<T>(f: impl FnOnce() -> T) -> T {
    let previous = SUSPENDED
        .try_with(|flag| flag.replace(true))
        .unwrap_or(false);
    let result = f();
    let _ = SUSPENDED.try_with(|flag| flag.set(previous));
    result
}

/// A future whose every poll runs with tracked-context attribution suspended (see [`untracked`]).
pub struct Untracked<F> {
    inner: Pin<Box<F>>,
}

impl<F> std::fmt::Debug for Untracked<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Untracked")
    }
}

impl<F: Future> Untracked<F> {
    /// Wraps `future`.
    pub fn new(future: F) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<F: Future> Future for Untracked<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let inner = self.inner.as_mut();
        untracked(|| inner.poll(cx))
    }
}

/// Whether [`CountingAllocator`] is this process's global allocator (counts move when it is).
pub fn is_installed() -> bool {
    let before = thread_counts();
    drop(std::hint::black_box(Box::new(0u64)));
    thread_counts().allocations > before.allocations
}

/// Allocations made on the current thread so far (only counts while [`CountingAllocator`] is
/// the global allocator).
pub fn thread_counts() -> Counts {
    THREAD.try_with(Cell::get).unwrap_or_default()
}

/// Attributes allocations to the tracked context whenever `hook` returns true on the allocating
/// thread. `hook` must not allocate. Resets the tracked counters.
pub fn set_tracker(hook: fn() -> bool) {
    reset_tracked();
    TRACKER.store(hook as *mut (), Ordering::SeqCst);
}

thread_local! {
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

fn on_marked_thread() -> bool {
    MARKED.try_with(Cell::get).unwrap_or(false)
}

/// Marks the current thread as one whose allocations [`track_marked_threads`] counts: a flood
/// test's victim thread, or each worker of the victim's runtime (from `on_thread_start`).
pub fn mark_thread(marked: bool) {
    MARKED.with(|flag| flag.set(marked));
}

/// Attributes the allocations of threads marked with [`mark_thread`] to the tracked context
/// ([`set_tracker`] with a hook that reads the mark). Resets the tracked counters.
pub fn track_marked_threads() {
    set_tracker(on_marked_thread);
}

/// Stops attributing allocations to a tracked context.
pub fn clear_tracker() {
    TRACKER.store(std::ptr::null_mut(), Ordering::SeqCst);
}

/// Zeroes the tracked context's counters and high-water mark.
pub fn reset_tracked() {
    TRACKED_ALLOCATIONS.store(0, Ordering::SeqCst);
    TRACKED_BYTES.store(0, Ordering::SeqCst);
    TRACKED_LIVE.store(0, Ordering::SeqCst);
    TRACKED_PEAK.store(0, Ordering::SeqCst);
}

/// The tracked context's counts since the last reset.
pub fn tracked_counts() -> Counts {
    Counts {
        allocations: TRACKED_ALLOCATIONS.load(Ordering::SeqCst),
        bytes: TRACKED_BYTES.load(Ordering::SeqCst),
    }
}

/// Bytes the tracked context holds now, and the most it held since the last reset (allocated
/// minus freed while tracked; can be negative if it freed memory allocated before tracking).
pub fn tracked_live_and_peak() -> (i64, i64) {
    (
        TRACKED_LIVE.load(Ordering::SeqCst),
        TRACKED_PEAK.load(Ordering::SeqCst),
    )
}

/// Starts the high-water mark again from the current live bytes.
pub fn reset_tracked_peak() {
    TRACKED_PEAK.store(TRACKED_LIVE.load(Ordering::SeqCst), Ordering::SeqCst);
}
