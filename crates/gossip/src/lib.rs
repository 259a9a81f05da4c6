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
//! * [`Relay::All`](proto::Relay::All): every receiver relays the artifact after validating it, on a relay tree
//!   (below) rather than to every peer (consensus); [`Relay::Origin`](proto::Relay::Origin): only the node that
//!   published it sends it (ingress). A receiver never relays an `Origin` artifact.
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
//! arrived `request_timeout` later, the next advertiser is asked, each about twice in all (below);
//! when none is left the entry is dropped and a later advert starts over.
//!
//! Bounds: every (pending artifact, advertiser) pair takes one slot and the advertised size from
//! that advertiser's budget (`max_pending_per_peer`, `max_pending_bytes_per_peer`); adverts beyond
//! the budget are refused and counted, so a peer that floods adverts only fills its own budget.
//! Responses queued for a peer are bounded the same way. The pool is bounded in artifacts and bytes;
//! removed ids (expired, purged, rejected) are remembered as tombstones, bounded in number, so late
//! adverts do not fetch them again.
//!
//! Relay trees (Plumtree, [Leitão et al. 2007], as in iroh-gossip, with bounded fanouts): the
//! publisher sends every artifact to every peer, so in a full mesh everyone has it after one hop.
//! A receiver relays a `Relay::All` artifact that came from peer `U` eagerly to its eager set for
//! `U` and lazily (an ihave, 38 B) to `lazy_fanout` peers: those after it on the artifact's ring
//! (node ids ordered by a hash of the artifact id and the node id, the same order at every node,
//! so in a full mesh each node is the lazy target of exactly `lazy_fanout` relays). An eager set
//! starts as `eager_fanout` *tentative* peers, which get an eager advert rather than the payload;
//! a peer that requests an artifact from `U`'s tree (it lacked it) joins the set *confirmed* (a
//! graft) and gets small artifacts pushed whole from then on; a peer that gets an eager copy or
//! eager advert of something it already held answers with a prune and leaves the set. In a full
//! mesh the eager sets empty after each upstream's first artifact, and each node then receives
//! each relayed artifact once as a payload plus `lazy_fanout` ihaves; elsewhere the tree keeps
//! the edges that deliver first. Every node announces its peers to its peers (a neighbours
//! item, at the first flush after its peer set changes); a relay also sends an ihave to every
//! peer that the artifact's upstream does not reach itself (the two do not list each other),
//! so on a sparse network no node is left out: following upstreams back from any node that
//! lacks an artifact ends at its publisher, which sends to every peer. In a full mesh every
//! peer is the upstream's peer too and this adds nothing. Repair: an ihave of a missing id is
//! requested like an advert (with the fallbacks below), a reconnected peer gets ihaves of
//! everything relayable, and every `repair_interval` (1 s) a node sends one peer, a different
//! one each time, ihaves of the `Relay::All` artifacts it stored in the last `repair_window`
//! (2 s): about two ihaves per artifact per node, for a batch lost whole.
//!
//! [Leitão et al. 2007]: https://asc.di.fct.unl.pt/~jleitao/pdf/srds07-leitao.pdf
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
//! - `Relay::All`: every node that receives and validates the artifact relays it on its relay tree
//!   (eager set plus `lazy_fanout` ihaves, see *Relay trees* below).
//! - `Relay::Origin`: only the publisher sends it; a receiver never re-advertises or re-pushes it.
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
//! | ihave (class, id, size) | lazy advert: "request it from me if you lack it"; no answer if held |
//! | prune (id) | "your eager copy of `id` was a duplicate: stop relaying eagerly to me what reaches you by the peer `id` came from" |
//! | neighbours (sequence, peer ids) | "these are my peers now"; the newest sequence counts, at most `max_neighbours` kept |
//!
//! Ids are SHA-256 of the class byte and the payload, so a peer cannot pass bytes off under another
//! artifact's id. Items queue until the next flush (`flush_interval`, default 20 ms; at once for
//! latency-sensitive artifacts). Items for every peer and per-peer items (requests, responses,
//! catch-up adverts) share a batch; peers that get the same batch share one encoding, and the driver
//! sends it with `Node::send_many`. Adverts and pushes are counted once per peer they reach.
//!
//! ## Relay trees: the choice and its alternatives
//!
//! The problem (`docs/lessons.md`, issue 17): with every receiver re-sending each `Relay::All`
//! artifact to all N − 1 peers, bytes or adverts grow as N². At 56 nodes in
//! `scenarios/ic-gossip.toml` the 256-byte shares arrived 55 times each: `duplicate_byte_ratio`
//! 3.56 (flood 3.35, ic-origin 1.46), 1.16 MB sent per node per second.
//!
//! Alternatives weighed (costs by analysis, not measured; only the chosen one is built):
//!
//! | option | received per node per relayed artifact, full mesh of N | why not (or why) |
//! |---|---|---|
//! | every receiver pushes to all (before) | N − 1 payloads | the N² bytes above |
//! | every receiver advertises to all (ic-origin's consensus) | 1 payload + N − 1 adverts of 38 B | a 256-B share costs ~8× its size in adverts at 56 nodes |
//! | gossipsub v1.2 IDONTWANT (cancel copies in flight) | fewer than N − 1 payloads | cancels only copies still queued when the receiver's first copy arrives; in a full mesh every receiver gets its copy in the same hop, so most relayed copies are already sent (Ethereum mainnet: 3 → 2 duplicates per block) |
//! | gossipsub v2 proposal, lazy mesh (IANNOUNCE/INEED) | 1 payload + D adverts | one more round trip on every hop |
//! | classic Plumtree (eager tree, ihave to *all* others) | 1 payload + N − 2 ihaves | the advert N² again |
//! | **relay trees with bounded fanouts (chosen)** | 1 payload + `lazy_fanout` ihaves (+ prunes while trees settle) | publisher's copy is one hop; repair by ihave + graft and catch-up |
//!
//! Measured with the lab (`meshwire lab run scenarios/ic-gossip.toml`, release build; the
//! `flood` and `ic-origin` rows are unchanged, they relay to every peer), policy `meshwire`:
//!
//! | nodes | `duplicate_byte_ratio` before → after | bytes sent /node/s before → after (ic-origin) | adverts /node/s | ingress p99 | shares: ratio, duplicate payloads, delivery p50/p99 |
//! |---|---|---|---|---|---|
//! | 56 | 3.562 → 1.024 | 1,163,920 → 337,082 (474,773) | 19.3 → 139.6 | 40 ms | 1.413, 0, 40.4/40.7 ms |
//! | 28 | → 1.015 | → 319,209 (367,197) | → 69.1 | 40 ms | 1.413, 0, 40.3/40.7 ms |
//! | 14 | → 1.011 | → 301,678 (327,381) | → 33.7 | 40 ms | 1.413, 0, 40.1/40.7 ms |
//!
//! `consensus_delivery_ratio` is 1 in every row. The shares' ratio is the same at every size: one
//! payload (6 + 256 B), two 38-B ihaves and, in the first round, the eager adverts and prunes that
//! empty the trees, over 256 B. Under ic-origin (every receiver advertises to all) it is 9.465 at
//! 56 nodes; before relay trees meshwire's receivers pushed each share to all 55 peers (55
//! payloads of 262 B per share; no per-class metric existed then). Blocks (advertised by their maker to all): ratio 1.006, delivery
//! p50 107 ms (advert, request, response, with their flushes). The gossip sweep
//! (`meshwire lab sweep scenarios/sweeps/gossip.toml --cases 6`): meshwire's bytes ratio median
//! 1.043, p90 1.067 (before: 1.252, 6.369), no failed case (delivery 1 everywhere); with
//! `--cases 24`: median 1.048, p90 1.099, max 1.102, no failed case (flood median/p90
//! 1.624/3.523, ic-origin 1.167/1.663).
//!
//! With the neighbours announcements (counted in the received bytes) and periodic repair, both
//! added after that table (same command, `docs/RESULTS.md`):
//!
//! | nodes | `duplicate_byte_ratio` | bytes sent /node/s (ic-origin) | adverts /node/s | announcement bytes received /node | ingress p99 | shares: ratio, duplicate payloads, delivery p99 |
//! |---|---|---|---|---|---|---|
//! | 56 | 1.061 | 341,474 (474,773) | 255.2 | 128,528 | 40 ms | 1.708, 0, 40.7 ms |
//! | 28 | 1.028 | 321,368 (367,197) | 125.8 | 30,850 | 40 ms | 1.707, 0, 40.7 ms |
//! | 14 | 1.016 | 302,715 (327,381) | 61.0 | 7,098 | 40 ms | 1.704, 0, 40.7 ms |
//!
//! Repair adds about two ihaves (76 B) per relayed artifact per node, which is most of the rise
//! in the shares' ratio (256-B shares); each node receives each peer's list about once (55 × 32
//! B at 56 nodes) as the mesh comes up. The gossip sweep (`--cases 6`): median 1.051, p90 1.125
//! (before both: 1.043, 1.067), no failed case.
//!
//! `relay_to_all` (default false) restores the relay to every peer, without prunes; the lab's
//! `flood` and `ic-origin` policies use it to stay the Internet Computer's gossip.
//!
//! Defaults: `eager_fanout` 2 (a tree exists from the first artifact on sparse networks; in a
//! full mesh it costs two adverts per upstream once), `lazy_fanout` 2 (each node is the lazy
//! target of two relays per artifact, so a missed copy is repaired unless both ihaves are lost
//! too). With 0 lazy the repair rests on catch-up adverts alone.
//!
//! ## Pulls, fallbacks, catch-up
//!
//! The first advert of an unknown id triggers a request to that advertiser; up to `max_advertisers`
//! later advertisers are remembered. If the artifact has not arrived after `request_timeout`, the next
//! advertiser is asked (the one that timed out goes to the back of the list); once the entry has
//! sent twice as many requests as it has advertisers, each further timeout forgets its advertiser,
//! and when none is left the entry is dropped and a later advert starts over. So a lone
//! advertiser is asked twice: a request or answer lost once (a refused send) costs one
//! `request_timeout`, not the artifact. An
//! ihave is handled the same way when the id is missing. When a connection comes up (first time or
//! after a reconnect), the node sends that peer an ihave of every `Relay::All` artifact it holds and
//! every artifact it published, so a peer that was partitioned away catches up.
//!
//! ## Bounds
//!
//! | bound | default | what it limits |
//! |---|---|---|
//! | `max_pending_per_peer` | 4096 | pending (artifact, advertiser) pairs plus queued responses per peer |
//! | `max_pending_bytes_per_peer` | 64 MiB | advertised bytes pending per peer |
//! | `max_advertisers` | 4 | fallbacks remembered per pending artifact |
//! | `max_pending_per_peer` | 4096 | relayed items (eager copies, ihaves, prunes) queued per peer until the next flush; beyond it they are dropped and counted (`relays_dropped`) |
//! | peers × peers | (the peer count) | eager sets: one per upstream peer, each at most every peer; a peer's set and entries go when it disconnects |
//! | `max_pool_artifacts`, `max_pool_bytes` | 65 536, 256 MiB | the artifact pool |
//! | `max_tombstones` | 65 536 | ids remembered after expiry, purge or rejection |
//! | `max_batch_items`, `max_artifact_bytes` | 4096, 4 MiB | decoder limits, checked before allocation |
//! | `max_batch_bytes` | 8 MiB | bytes per batch sent: a burst of large artifacts is split over several batches, each within a node frame |
//! | `max_neighbours` | 1024 | peers kept of each peer's neighbours announcement (a longer list is cut, which costs ihaves, never a miss; one over `max_batch_items` refuses the batch) |
//! | `max_pool_artifacts` | 65 536 | recent ids remembered for periodic repair (those of the last `repair_window`) |
//!
//! An advert beyond its sender's budget is refused and counted (`adverts_refused`): a peer that floods
//! adverts fills only its own budget (`a_peer_flooding_a_million_adverts_stays_within_the_memory_bound`
//! in `crates/gossip/src/proto/tests.rs` sends one million). A prune only removes an entry, a
//! request adds its sender to at most one eager set per upstream, and an ihave is charged like an
//! advert (`a_peer_flooding_a_million_ihaves_prunes_or_grafts_stays_within_the_memory_bound` sends
//! a million of each). `Gossip::memory_bytes` accounts the state's entries and payloads and never
//! exceeds `GossipConfig::memory_bound_bytes(peers)`.
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
//! Metrics (node registry): `meshwire_gossip_{adverts,requests,pushes,pulls,duplicates,prunes,rejected,bytes}_total{class, direction}`
//! (adverts include ihaves).
//!
//! ## Limits of this version
//!
//! - A batch refused by a full per-peer send queue is counted by the node (`send_refused`) and
//!   not retried as such; the driver tells the state machine (`Gossip::handle_send_refused`),
//!   and that peer gets the next periodic repair: ihaves of the `Relay::All` artifacts of the
//!   last `repair_window`. Older ones, and `Origin` artifacts, reach it only through another
//!   peer or the catch-up adverts after a reconnect.
//! - Validation is synchronous, inside the driver.
//! - Prunes and grafts key a tree by the peer an artifact came from, not by its publisher (the
//!   wire carries no origin): on a sparse network, artifacts of several publishers that enter
//!   through the same neighbour share one tree.
//! - Repair after a lost batch rests on `lazy_fanout` ihaves, request fallbacks and periodic
//!   repair, which reaches back `repair_window` (2 s): a node whose copy, every ihave and every
//!   repair ihave within that window were lost gets the artifact only at its next reconnect.
//!   The transport (QUIC streams) retransmits lost packets, so in the lab and in production a
//!   batch is lost only when a send queue refuses it or a connection drops. The state machine
//!   tests drop whole batches at 10% on a 32-node mesh with a partition: with the defaults no
//!   node missed an artifact in 20 seeds (2 of 20 with repair off). On random sparse networks
//!   with 5% whole-batch loss the any-network property test still finds a node that misses
//!   a relayed artifact within a few cases (not traced yet).
//! - The neighbours announcements go out at the first flush after a change. Until a node has
//!   its peers' lists it sends an ihave to every peer a relay does not otherwise reach (one
//!   flush after a connection comes up). A link that went down after its ends announced it,
//!   and before they announced its loss, can make a relay skip a peer it should not; repair and
//!   the next reconnect's catch-up cover that window.
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
pub use net::{
    Delivered, GossipService, GossipServiceError, GossipSettings, GossipValidator, Processor, Work,
};
