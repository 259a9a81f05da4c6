//! Attach one subscriber or handler per protocol id, refusing a second while the first lives.

use std::collections::HashMap;
use std::sync::RwLock;

use meshwire_proto::wire::ProtocolId;
use tokio::sync::mpsc;

use super::{read, write};

/// A second subscription to the same protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The protocol already has a live subscriber or handler.
    #[error("protocol {0:?} already has a subscriber")]
    AlreadySubscribed(ProtocolId),
}

/// Something attached to a protocol: alive until its owner lets go of it.
pub(crate) trait Attachment: Clone {
    /// Whether the owner still holds the other end.
    fn is_attached(&self) -> bool;
}

impl<T> Attachment for mpsc::Sender<T> {
    fn is_attached(&self) -> bool {
        !self.is_closed()
    }
}

/// One attachment per protocol id.
pub(crate) struct Registry<T> {
    entries: RwLock<HashMap<ProtocolId, T>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self {
            entries: RwLock::new(HashMap::new()),
        }
    }
}

impl<T: Attachment> Registry<T> {
    /// Attaches `entry` to `protocol`, unless a live one is attached already.
    pub(crate) fn attach(&self, protocol: ProtocolId, entry: T) -> Result<(), SubscribeError> {
        let mut entries = write(&self.entries);
        if entries.get(&protocol).is_some_and(T::is_attached) {
            return Err(SubscribeError::AlreadySubscribed(protocol));
        }
        entries.insert(protocol, entry);
        Ok(())
    }

    /// What is attached to `protocol`.
    pub(crate) fn get(&self, protocol: ProtocolId) -> Option<T> {
        read(&self.entries).get(&protocol).cloned()
    }

    /// Detaches whatever is attached to `protocol`; returns whether something was.
    pub(crate) fn detach(&self, protocol: ProtocolId) -> bool {
        write(&self.entries).remove(&protocol).is_some()
    }
}
