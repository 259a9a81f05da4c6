//! Give every lab host one CPU: a serial work queue whose jobs take (virtual) time.
//!
//! # Design
//!
//! A [`Cpu`] runs one job at a time, in the order the jobs were submitted. A job of cost `c`
//! submitted at `t` starts when the CPU is free, at `max(t, busy_until)`, and finishes `c`
//! later; [`Cpu::run`] resolves at its finish. The CPU keeps `busy_until` exactly. tokio's timer
//! and turmoil's step fire on whole milliseconds ([`crate::lab::TICK`]), so a job that finishes
//! less than [`TIMER_RESOLUTION`] from now resolves at once, and a later one sleeps until its
//! finish and may wake up to a millisecond late. Either error is under a millisecond and is not
//! carried over: the next job starts at the exact finish of the one before, so busy time, order
//! and backlog are exact and a CPU with work queued beyond a millisecond makes its callers wait.
//! (Sleeping for every job instead would make each sub-millisecond job cost a whole
//! millisecond of the caller's time: a 20 µs batch would block the gossip driver for 1 ms.)
//!
//! Every host gets its own CPU when its software starts ([`crate::HostContext::cpu`]); whatever
//! runs on the host and submits work to it shares it. Gossip submits through
//! [`GossipCpu`], which prices the [`Work`] of each inbound batch with [`ItemCosts`] (measured
//! on this machine: `cargo bench -p meshwire-gossip --bench item_costs`; the scenario states
//! the numbers). Work the model does not price (sending, encrypting, the application's own
//! tasks) takes no time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshwire_gossip::{Processor, Work};
use tokio::time::Instant;

/// The granularity of the timer jobs sleep on.
pub const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// What a CPU has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Jobs submitted.
    pub jobs: u64,
    /// Jobs finished.
    pub finished: u64,
    /// Total cost of the jobs submitted (the CPU's busy time once they finish).
    pub busy: Duration,
    /// Most jobs submitted and not yet finished at once, the new one included.
    pub max_queued: u64,
    /// Longest wait of a job between its submission and its start.
    pub max_wait: Duration,
    /// Waits of all jobs between submission and start, summed.
    pub total_wait: Duration,
}

#[derive(Debug, Default)]
struct State {
    busy_until: Option<Instant>,
    stats: CpuStats,
}

/// One host's CPU: jobs run one at a time, first come first served.
#[derive(Debug, Default)]
pub struct Cpu {
    state: Mutex<State>,
}

/// Counts a job finished when its future resolves or is dropped.
struct Finish<'a>(&'a Cpu);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.lock().stats.finished += 1;
    }
}

impl Cpu {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain counters; a panic elsewhere does not invalidate it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a job of `cost` and resolves when it is done.
    pub async fn run(&self, cost: Duration) {
        let finish = {
            let mut state = self.lock();
            let now = Instant::now();
            let start = state.busy_until.map_or(now, |busy| busy.max(now));
            let finish = start + cost;
            state.busy_until = Some(finish);
            let stats = &mut state.stats;
            stats.jobs += 1;
            stats.busy += cost;
            stats.max_queued = stats.max_queued.max(stats.jobs - stats.finished);
            let wait = start - now;
            stats.max_wait = stats.max_wait.max(wait);
            stats.total_wait += wait;
            finish
        };
        let _finish = Finish(self);
        if finish >= Instant::now() + TIMER_RESOLUTION {
            tokio::time::sleep_until(finish).await;
        }
    }

    /// What the CPU has done so far.
    pub fn stats(&self) -> CpuStats {
        self.lock().stats
    }

    /// Work queued and not yet done: how long a job submitted now would wait to start.
    pub fn backlog(&self) -> Duration {
        let busy_until = self.lock().busy_until;
        busy_until.map_or(Duration::ZERO, |busy| {
            busy.saturating_duration_since(Instant::now())
        })
    }
}

/// What each gossip item costs the CPU, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemCosts {
    /// Handling one advert or lazy advert.
    pub advert_ns: u64,
    /// Handling one request for an artifact held.
    pub request_ns: u64,
    /// Handling one artifact copy, apart from hashing its payload.
    pub artifact_ns: u64,
    /// Hashing an artifact copy's payload into its id, per KiB.
    pub artifact_ns_per_kib: u64,
    /// Validating a new artifact (the application's check) and storing it.
    pub validate_ns: u64,
}

impl ItemCosts {
    /// The CPU time `work` takes.
    pub fn cost(&self, work: &Work) -> Duration {
        let nanos = work.adverts * self.advert_ns
            + work.requests * self.request_ns
            + work.artifacts * self.artifact_ns
            + work.artifact_bytes * self.artifact_ns_per_kib / 1024
            + work.validations * self.validate_ns;
        Duration::from_nanos(nanos)
    }

    /// Whether every item is free (no CPU model).
    pub fn is_free(&self) -> bool {
        *self == ItemCosts::default()
    }
}

/// A host's CPU as a gossip service's [`Processor`]: each inbound batch's work, priced by
/// `costs`, is one job.
#[derive(Debug, Clone)]
pub struct GossipCpu {
    /// The host's CPU.
    pub cpu: Arc<Cpu>,
    /// The price of each item.
    pub costs: ItemCosts,
}

impl Processor for GossipCpu {
    fn process(&self, work: Work) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let cpu = self.cpu.clone();
        let cost = self.costs.cost(&work);
        Box::pin(async move { cpu.run(cost).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_priced_per_item_and_per_kib() {
        let costs = ItemCosts {
            advert_ns: 1,
            request_ns: 10,
            artifact_ns: 100,
            artifact_ns_per_kib: 1000,
            validate_ns: 10_000,
        };
        let work = Work {
            adverts: 3,
            requests: 2,
            artifacts: 2,
            artifact_bytes: 3 * 1024,
            validations: 1,
        };
        assert_eq!(
            costs.cost(&work),
            Duration::from_nanos(3 + 20 + 200 + 3000 + 10_000)
        );
        assert!(ItemCosts::default().is_free());
        assert_eq!(ItemCosts::default().cost(&work), Duration::ZERO);
    }
}
