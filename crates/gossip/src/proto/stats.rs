//! Per-class counters of what a gossip instance sent and received.

/// Counters of one class. "Sent" counts each recipient: an advert to 55 peers is 55 adverts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Adverts sent, eager and lazy (ihave).
    pub adverts_sent: u64,
    /// Adverts received, eager and lazy (ihave).
    pub adverts_received: u64,
    /// Lazy adverts (ihave) sent; included in `adverts_sent`.
    pub ihaves_sent: u64,
    /// Lazy adverts (ihave) sent to peers outside the ring successors because the artifact's
    /// upstream does not reach them itself; included in `ihaves_sent`.
    pub cover_ihaves_sent: u64,
    /// Lazy adverts (ihave) sent by periodic repair; included in `ihaves_sent`.
    pub repair_ihaves_sent: u64,
    /// Lazy adverts (ihave) received; included in `adverts_received`.
    pub ihaves_received: u64,
    /// Adverts (and requests) refused because the peer's budget was spent.
    pub adverts_refused: u64,
    /// Requests sent.
    pub requests_sent: u64,
    /// Requests received.
    pub requests_received: u64,
    /// Artifacts pushed whole (unrequested), sent.
    pub pushes_sent: u64,
    /// Artifacts pushed whole, received.
    pub pushes_received: u64,
    /// Requested artifacts sent.
    pub pulls_sent: u64,
    /// Requested artifacts received.
    pub pulls_received: u64,
    /// Adverts and artifacts received for ids already held or tombstoned.
    pub duplicates: u64,
    /// Artifact copies (payloads) received for ids already held or tombstoned; included in
    /// `duplicates`.
    pub duplicate_artifacts: u64,
    /// Artifacts received from peers, validated and stored (each id once).
    pub delivered: u64,
    /// Prunes sent: answers to an eager copy of an artifact already held.
    pub prunes_sent: u64,
    /// Prunes received for an artifact of this class.
    pub prunes_received: u64,
    /// Requests that added their sender to an eager set (grafts).
    pub grafts: u64,
    /// Relayed items (eager copies, lazy adverts, prunes) not queued because the peer's relay
    /// queue was full.
    pub relays_dropped: u64,
    /// Artifacts the validator rejected.
    pub rejected: u64,
    /// Artifacts dropped because the pool was full.
    pub pool_full: u64,
    /// Item bytes sent (batch headers excluded).
    pub bytes_sent: u64,
    /// Item bytes received (batch headers excluded).
    pub bytes_received: u64,
    /// Payload bytes of the artifact copies received (pushes and pulls, duplicates included);
    /// included in `bytes_received`. What hashing the copies into ids reads.
    pub payload_bytes_received: u64,
}
