//! Spread artifacts to every peer without N² adverts: advertise-then-pull with a relay policy per artifact class.
//!
//! # Design
//!
//! The Internet Computer gossiped every artifact the same way: the node that got it advertised it to
//! all peers, every peer pulled it, validated it and advertised it again to all its peers. With 56
//! replicas under 300 requests/s that made ~18K adverts per node per second and the subnet achieved
//! 250 of 300 requests/s. Letting only the first receiver advertise ingress cut adverts to ~1.5K/s
//! and achieved 295/300, while consensus artifacts kept full relay (`seeds/003`).
//!
//! Here every artifact belongs to a class with a [`ClassPolicy`]:
//!
//! * [`Relay::All`]: every receiver re-disseminates the artifact after validating it (consensus);
//!   [`Relay::Origin`]: only the node that published it does (ingress). A receiver never relays
//!   an `Origin` artifact.
//! * `push_whole_max_bytes` and `latency_sensitive`: small or urgent artifacts are pushed whole
//!   instead of advertised, which saves a round trip and an advert per peer.
//! * `expiry`: how long the pool keeps the artifact.
//!
//! Artifact ids are the SHA-256 of the class byte and the payload ([`ArtifactId::of`]): a receiver
//! recomputes the id of whatever it receives, so dedup needs no trust in the sender.
//!
//! Messages ([`codec`]) travel in batches: adverts, requests, artifacts and purges queue until the
//! next flush (`flush_interval`, or at once for latency-sensitive artifacts), then go out as one
//! batch per group of peers; peers that get the same items share one encoding ([`Transmit`] lists
//! all of them, for the driver's `send_many`). Adverts and pushes are counted per peer they reach.
//!
//! Pull: the first advert of an unknown id creates a pending entry and a request to that
//! advertiser; later advertisers are remembered (at most `max_advertisers`). If the artifact has not
//! arrived `request_timeout` later, the next advertiser is asked; when none is left the entry is
//! dropped and a later advert starts over.
//!
//! Bounds: every (pending artifact, advertiser) pair takes one slot and the advertised size from
//! that advertiser's budget (`max_pending_per_peer`, `max_pending_bytes_per_peer`); adverts beyond
//! the budget are refused and counted, so a peer that floods adverts only fills its own budget.
//! Responses queued for a peer are bounded the same way. The pool is bounded in artifacts and bytes;
//! removed ids (expired, purged, rejected) are remembered as tombstones, bounded in number, so late
//! adverts do not fetch them again.
//!
//! Validation: the application's [`Validator`] sees every artifact received from a peer before it
//! is stored. A rejected artifact is tombstoned, never delivered or relayed, and its sender's
//! rejection count goes up.
//!
//! The state machine reads no clock: every input takes `now`. Drain [`Gossip::poll_transmit`] and
//! [`Gossip::poll_event`] after each input and call [`Gossip::handle_timeout`] at
//! [`Gossip::poll_timeout`].
//!
//! # Layout
//!
//! [`proto`] is the sans-IO state machine (always built: no tokio, quinn, sockets or clock reads);
//! [`net`] (default feature `net`) drives it over a [`meshwire::Node`].

pub mod proto;

#[cfg(feature = "net")]
pub mod net;

#[cfg(feature = "net")]
pub use net::{Delivered, GossipService, GossipServiceError, GossipSettings, GossipValidator};
