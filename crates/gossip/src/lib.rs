//! Spread artifacts to every peer without N² adverts: advertise-then-pull with a relay policy per artifact class.
//!
//! # Design
//!
//! The Internet Computer gossiped every artifact the same way: the node that got it advertised it to
//! all peers, every peer pulled it, validated it and advertised it again to all its peers. With 56
//! replicas under 300 requests/s that made ~18K adverts per node per second and the subnet achieved
//! 250 of 300 requests/s. Letting only the first receiver advertise ingress cut adverts to ~1.5K/s
//! and achieved 295/300, while consensus artifacts kept full relay (`docs/lessons.md`).
//!
//! Here every artifact belongs to a class with a [`ClassPolicy`](proto::ClassPolicy):
//!
//! * [`Relay::All`](proto::Relay::All): every receiver re-disseminates the artifact after validating it (consensus);
//!   [`Relay::Origin`](proto::Relay::Origin): only the node that published it does (ingress). A receiver never relays
//!   an `Origin` artifact.
//! * `push_whole_max_bytes` and `latency_sensitive`: small or urgent artifacts are pushed whole
//!   instead of advertised, which saves a round trip and an advert per peer.
//! * `expiry`: how long the pool keeps the artifact.
//!
//! Artifact ids are the SHA-256 of the class byte and the payload ([`ArtifactId::of`](proto::ArtifactId::of)): a receiver
//! recomputes the id of whatever it receives, so dedup needs no trust in the sender.
//!
//! Messages ([`codec`](proto::codec)) travel in batches: adverts, requests, artifacts and purges queue until the
//! next flush (`flush_interval`, or at once for latency-sensitive artifacts), then go out as one
//! batch per group of peers; peers that get the same items share one encoding ([`Transmit`](proto::Transmit) lists
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
//! Validation: the application's [`Validator`](proto::Validator) sees every artifact received from a peer before it
//! is stored. A rejected artifact is tombstoned, never delivered or relayed, and its sender's
//! rejection count goes up.
//!
//! The state machine reads no clock: every input takes `now`. Drain [`Gossip::poll_transmit`](proto::Gossip::poll_transmit) and
//! [`Gossip::poll_event`](proto::Gossip::poll_event) after each input and call [`Gossip::handle_timeout`](proto::Gossip::handle_timeout) at
//! [`Gossip::poll_timeout`](proto::Gossip::poll_timeout).
//!
//! meshwire spreads artifacts (ingress messages, blocks, signature shares, anything an application
//! publishes) to every peer with advertise-then-pull gossip and a relay policy per artifact class.
//! The protocol is the sans-IO state machine [`proto::Gossip`]; [`GossipService`] (feature `net`)
//! runs it on a [`meshwire::Node`].
//!
//! ## Classes and policies
//!
//! ```rust
//! use std::time::Duration;
//! use meshwire_gossip::proto::{ClassId, ClassPolicy, GossipConfig, Relay};
//!
//! let mut config = GossipConfig::default();
//! config.classes.insert(ClassId(1), ClassPolicy {      // ingress
//!     relay: Relay::Origin,            // only the node it entered advertises or pushes it
//!     push_whole_max_bytes: 1024,      // <= 1 KiB: pushed whole, no advert, no request round trip
//!     latency_sensitive: false,        // true: always pushed whole, and flushed at once
//!     expiry: Duration::from_secs(10), // how long pools keep it
//! });
//! config.classes.insert(ClassId(2), ClassPolicy::advertise(Relay::All, Duration::from_secs(60))); // blocks
//! ```
//!
//! - `Relay::All`: every node that receives and validates the artifact disseminates it again.
//! - `Relay::Origin`: only the publisher does; a receiver never re-advertises or re-pushes it.
//!
//! ## Messages
//!
//! Batches of items on one protocol id (`meshwire::protocols::GOSSIP`), format in
//! [`proto::codec`] (frozen by a golden vector):
//!
//! | item | meaning |
//! |---|---|
//! | advert (class, id, size) | "I hold this; request it from me" |
//! | request (id) | "send me this" |
//! | artifact (class, payload) | a response or a push; the receiver derives the id from the content |
//! | purge (id) | "I no longer hold it; do not request it from me" |
//!
//! Ids are SHA-256 of the class byte and the payload, so a peer cannot pass bytes off under another
//! artifact's id. Items queue until the next flush (`flush_interval`, default 20 ms; at once for
//! latency-sensitive artifacts). Items for every peer and per-peer items (requests, responses,
//! catch-up adverts) share a batch; peers that get the same batch share one encoding, and the driver
//! sends it with `Node::send_many`. Adverts and pushes are counted once per peer they reach.
//!
//! ## Pulls, fallbacks, catch-up
//!
//! The first advert of an unknown id triggers a request to that advertiser; up to `max_advertisers`
//! later advertisers are remembered. If the artifact has not arrived after `request_timeout`, the next
//! advertiser is asked; when none is left the entry is dropped and a later advert starts over. When a
//! connection comes up (first time or after a reconnect), the node advertises to that peer every
//! `Relay::All` artifact it holds and every artifact it published, so a peer that was partitioned away
//! catches up.
//!
//! ## Bounds
//!
//! | bound | default | what it limits |
//! |---|---|---|
//! | `max_pending_per_peer` | 4096 | pending (artifact, advertiser) pairs plus queued responses per peer |
//! | `max_pending_bytes_per_peer` | 64 MiB | advertised bytes pending per peer |
//! | `max_advertisers` | 4 | fallbacks remembered per pending artifact |
//! | `max_pool_artifacts`, `max_pool_bytes` | 65 536, 256 MiB | the artifact pool |
//! | `max_tombstones` | 65 536 | ids remembered after expiry, purge or rejection |
//! | `max_batch_items`, `max_artifact_bytes` | 4096, 4 MiB | decoder limits, checked before allocation |
//!
//! An advert beyond its sender's budget is refused and counted (`adverts_refused`): a peer that floods
//! adverts fills only its own budget (`a_peer_flooding_a_million_adverts_stays_within_the_memory_bound`
//! in `crates/gossip/src/proto/tests.rs` sends one million). `Gossip::memory_bytes` accounts the
//! state's entries and payloads and never exceeds `GossipConfig::memory_bound_bytes(peers)`.
//!
//! ## Validation
//!
//! `GossipService::spawn` takes a validator `FnMut(ClassId, &Bytes) -> bool`. An artifact it rejects
//! is tombstoned, never delivered and never relayed, and its sender's rejection count goes up
//! (`GossipService::rejected_from`, `meshwire_gossip_rejected_total`).
//!
//! A batch that does not decode closes the sender's connection (`Node::close_for_violation`, counted
//! as `meshwire_frame_errors_total{reason="malformed_gossip"}`); a configured peer is redialed with
//! backoff.
//!
//! ## Using it
//!
//! ```rust,ignore
//! let (gossip, mut delivered) = GossipService::spawn(&node, GossipSettings::new(config), Box::new(|_, _| true))?;
//! let id = gossip.publish(ClassId(1), payload)?;
//! while let Some(artifact) = delivered.recv().await { /* artifact.id, .class, .payload, .from */ }
//! gossip.purge(id);
//! ```
//!
//! Metrics (node registry): `meshwire_gossip_{adverts,requests,pushes,pulls,duplicates,rejected,bytes}_total{class, direction}`.
//!
//! ## Limits of this version
//!
//! - A batch refused by a full per-peer send queue is counted by the node (`send_refused`) but not
//!   retried; `All` artifacts reach such a peer again only through another peer's relay or the
//!   catch-up adverts after a reconnect.
//! - Validation is synchronous, inside the driver.
//!
//! ## Measured
//!
//! `scenarios/ic-gossip.toml` (kind `gossip`, see `docs/scenarios.md`) runs the seed's experiment with
//! `flood`, `ic-origin` and `meshwire` at 14, 28 and 56 nodes. Numbers are in `docs/RESULTS.md`.
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
