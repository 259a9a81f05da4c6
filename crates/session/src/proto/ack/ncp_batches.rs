//! NCP's ACK schedule: each connection's segments are acknowledged in one batch every 50 ms, without echo.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::super::PathId;
use super::{AckSchedule, Batch, Owed};

/// NCP's receiver acknowledges each connection's segments in a batch every 50 ms (`SendAckInterval`).
const ACK_INTERVAL: Duration = Duration::from_millis(50);

/// Per path, the segments not yet acknowledged and when the next batch goes.
#[derive(Debug, Default)]
pub(super) struct NcpBatches {
    batches: BTreeMap<PathId, Batch>,
}

impl AckSchedule for NcpBatches {
    fn on_segment(&mut self, _: &mut Vec<Owed>, path: PathId, seq: u64, _: u64, now: Instant) {
        let (pending, due) = self.batches.entry(path).or_default();
        pending.insert(seq);
        due.get_or_insert(now + ACK_INTERVAL);
    }

    fn take_due(&mut self, now: Instant) -> Option<(PathId, Batch)> {
        let path = self
            .batches
            .iter()
            .find(|(_, (_, due))| due.is_some_and(|due| due <= now))
            .map(|(&path, _)| path)?;
        let batch = self.batches.remove(&path)?;
        Some((path, batch))
    }

    /// NCP sends at most MaxAckSeqListSize ranges per batch; the rest waits for the next, one
    /// interval after the batch that could not name them was due.
    fn put_back(&mut self, path: PathId, (rest, due): Batch) {
        if !rest.is_empty() {
            let next = due.map(|due| due + ACK_INTERVAL);
            self.batches.insert(path, (rest, next));
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.batches.values().filter_map(|(_, due)| *due).min()
    }

    fn remove_path(&mut self, path: PathId) {
        self.batches.remove(&path);
    }
}
