//! When the receiver acknowledges what arrived: one implementation per policy of the ACK schedule, which owes an ACK per arrival or batches a path's segments.

mod ncp_batches;
mod per_arrival;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Instant;

use super::{PathId, Policy};

/// An ACK owed on a path, with the transmission it echoes if any.
pub(super) type Owed = (PathId, Option<u64>);

/// A path's segments awaiting acknowledgement, and when their ACK is due.
pub(super) type Batch = (BTreeSet<u64>, Option<Instant>);

/// Decides when a [`super::Receiver`] acknowledges data segments.
pub(super) trait AckSchedule: fmt::Debug + Send {
    /// Segment `seq`, sent as transmission `packet_number`, arrived on `path`; an ACK owed at
    /// once goes on `owed`.
    fn on_segment(
        &mut self,
        owed: &mut Vec<Owed>,
        path: PathId,
        seq: u64,
        packet_number: u64,
        now: Instant,
    );

    /// Takes a batch whose ACK is due at `now`, if any.
    fn take_due(&mut self, now: Instant) -> Option<(PathId, Batch)>;

    /// Keeps the segments of a batch that one ACK could not name, for the next ACK on `path`.
    fn put_back(&mut self, path: PathId, batch: Batch);

    /// When the next batch is due.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Forgets a path's batch.
    fn remove_path(&mut self, path: PathId);
}

impl Policy {
    /// The ACK schedule this policy's receiver follows.
    pub(super) fn ack_schedule(self) -> Box<dyn AckSchedule> {
        match self {
            Policy::Classic | Policy::Nkp24 => Box::new(ncp_batches::NcpBatches::default()),
            Policy::Meshwire => Box::new(per_arrival::PerArrival),
        }
    }
}
