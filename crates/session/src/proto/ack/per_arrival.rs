//! meshwire's ACK schedule: every arrival is acknowledged at once on its own path, echoing its packet number.

use std::time::Instant;

use super::super::PathId;
use super::{AckSchedule, Batch, Owed};

/// One ACK per arrival.
#[derive(Debug)]
pub(super) struct PerArrival;

impl AckSchedule for PerArrival {
    fn on_segment(
        &mut self,
        owed: &mut Vec<Owed>,
        path: PathId,
        _: u64,
        packet_number: u64,
        _: Instant,
    ) {
        owed.push((path, Some(packet_number)));
    }

    fn take_due(&mut self, _: Instant) -> Option<(PathId, Batch)> {
        None
    }

    fn put_back(&mut self, _: PathId, _: Batch) {}

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn remove_path(&mut self, _: PathId) {}
}
