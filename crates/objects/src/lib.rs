//! Serve versioned objects from untrusted, sometimes slow replicas: quorum reads and writes, an embedded store, an HTTP API.
//!
//! # Design
//!
//! `meshwire node` stores versioned objects, replicates them over its peers and serves them over HTTP.
//! Code: the sans-IO part is [`proto::object`] (placement, node-to-node messages, merge),
//! [`proto::clock`] (the hybrid logical clock versions come from), [`proto::entropy`]
//! (anti-entropy: bucket digests, listings, what to pull and push) and [`proto::quorum`]: `quorum/scores.rs` ranks peers; `quorum/plan.rs` runs one request and keeps the
//! driver's bookkeeping (`on_answer`, `on_failure` and `cancel_pending` update the peer scores with
//! the injected `now`); `quorum/policy/{sequential,parallel_all,hedged}.rs` hold one policy each,
//! behind a `Spread` trait. Behind the `net` feature: `net/service.rs` (membership, writes),
//! `net/service/read.rs` (quorum reads, read repair), `net/service/serve.rs` (answering and refusing
//! other nodes' requests), `net/service/entropy.rs` (the anti-entropy loop and its exchanges),
//! with the driver `net/service/drive.rs`, which only sends, awaits and reads the clock;
//! `net/store.rs` (redb); `net/http.rs` (axum); `net/topics.rs` and `net/http/topics.rs`
//! (publish/subscribe topics over the node's gossip, with the name rules, class mapping and
//! envelope in the sans-IO [`proto::topic`]); and `net/daemon.rs`: `Daemon::builder(config)`
//! assembles the identity, node, store (`objects.redb` in the data directory, or in memory),
//! object service and optional HTTP API once, and has one `shutdown()`. `meshwire node`,
//! `meshwire demo` and the lab's quorum-reads experiment all use it.
//!
//! ## Model
//!
//! - An object is `(key, version, SHA-256 of content, content)`. Keys: 1-256 bytes of `[A-Za-z0-9._-]`.
//! - Members: the cluster is the configured `members` plus this node, which is always a member of
//!   its own cluster (listing it changes nothing). With no members a node is a cluster of one
//!   (`meshwire node` warns so at start). Objects are placed on, replicated to, fetched from and repaired from members
//!   only. A connected non-member may use every other protocol, but never enters placement, and
//!   its `STORE`, `FETCH` and conditional-write requests get a typed refusal (`not_member`), counted in
//!   `meshwire_object_refused_requests_total{reason}` and logged at warn with its PeerId (once a
//!   minute per peer and reason, with how many went unlogged since; at debug in between). A request
//!   that does not decode gets an error answer, is counted there as `malformed` (logged at
//!   debug), and then closes the sender's connection as a protocol violation (counted in
//!   `meshwire_frame_errors_total{reason="malformed_request"}`, logged at warn). Content over this
//!   node's `max_object_bytes` or more keys than one request may name (counted `too_large`), an
//!   unknown tag (a newer version's) and a request stream that ended early keep the connection.
//! - Replicas: the R heaviest members under rendezvous hashing (`SHA-256(key ‖ peer id)`), connected
//!   or not, so every member with the same list computes the same set, and placement changes only
//!   when the list does (then the keys whose heaviest members changed move).
//! - Versions: hybrid logical clock timestamps ([`proto::clock`]): Unix milliseconds << 16 plus a
//!   counter, carried (as the sender's clock) on every object message and observed on receipt. A
//!   clock or version more than `max_clock_skew` ahead of the receiver's physical clock, or equal to
//!   `u64::MAX`, is refused (`clock_skew`, `version_limit`) without moving the receiver's clock: a
//!   node whose clock runs ahead cannot plant a version that freezes a key. Replica answers pass
//!   the same check on the asking side (`meshwire_object_refused_answers_total{reason}`); a refused
//!   answer counts as that replica's failure.
//!   Upgrading: versions stored before hybrid clocks (plain Unix milliseconds) read as timestamps
//!   from 1970 and lose to any new write; nodes of the earlier message format cannot exchange
//!   objects with these (their messages do not decode and are refused as malformed).
//! - Quorums: a key has `min(R, cluster size)` replicas, and W and the read quorum are both clamped
//!   to that number (a lone node writes and reads with a quorum of 1). The settings must still
//!   satisfy `1 <= W <= R` and `1 <= read quorum <= R`, or the node refuses to start.
//! - Write (`PUT`): version = a tick of this node's hybrid clock after observing the version it
//!   holds (unless that one is beyond the skew), so a later write through any member wins and a
//!   rewrite through the same node advances. Sent to all replicas at once, the content from the
//!   body's own buffer (not copied into each message); a replica that refuses a store unread as
//!   busy (its node's request budget full) gets it again after a pause (10 ms, doubling to
//!   160 ms) within the deadline, as do compare-and-set phases and repairs. A replica **acks only
//!   when it now holds exactly this version and hash**, after a durable commit; one that holds a
//!   winning copy (newer version, or the same version with a smaller hash) answers *superseded*,
//!   which is not an ack. **`201` means durable on W replicas.** The remaining replicas finish in
//!   the background. **`503 quorum_not_reached` on a write means the outcome is unknown**: fewer than
//!   W acks arrived by the deadline, but replicas that stored the copy keep it, so it may still be
//!   read later (Dynamo's semantics: retry with the same content, or read to find out). When so
//!   many replicas answered *superseded* that W acks became impossible, a newer write of the key
//!   won and this one will not be read: **`409 superseded`**, not to be retried unchanged, since a
//!   retry would overwrite the newer write.
//! - Compare-and-set (`PUT` with `If-Match` / `If-None-Match: *`, [`proto::cas`]): two phases.
//!   Every replica is asked to *prepare* (check the precondition against its store, and hold the
//!   copy unless another conditional write is pending on the key): first the first reachable
//!   replica in placement order, the same for every coordinator, then the others at once (lock
//!   ordering: of conditional writes racing on a key, one gets through); at W prepares every replica is
//!   asked to *commit* (apply the held copy if the precondition still holds, in one store
//!   transaction), and `201` comes at W commits. Short of W prepares, every replica is told to
//!   *abort*, and nothing was written: `412` if a replica's copy did not match, `409` if only
//!   other pending writes were in the way. Since one replica holds one pending write per key and
//!   W is a majority of the replicas in the default settings, two conditional writes on the same
//!   ETag cannot both succeed: concurrent increments through three nodes end at exactly the number
//!   of `201`s (`tests/cas.rs`). A replica holds at most 64 MiB of prepared content (more is
//!   answered busy) for at most twice the deadline. Limits: safety needs `W > R / 2`; a coordinator that stalls
//!   longer than twice the deadline between prepare and commit loses its prepares (they expire);
//!   an unconditional write to the same key in between makes the commit fail on that replica.
//! - Read (`GET`): a quorum plan asks replicas for version and hash (the version requests concurrent
//!   reads send one replica while the node is busy go out as one request, `proto::stamps`), returns at the read quorum, merges
//!   (highest version, then summed trust = 1 − error rate, then most holders, then smallest hash), takes
//!   the content from the local store or a holder of the winner (hash checked), and repairs replicas that
//!   answered with an older copy or none, in the background.
//! - Quorum plans (`proto::quorum`): `sequential` (Zold: one replica after another), `parallel-all`
//!   (everyone, wait for all or the deadline), `hedged` (default: the best `quorum` replicas by an EWMA
//!   of latency and errors, a hedge to the next-best when one is later than its tail estimate
//!   `srtt + max(4·rttvar, srtt/4, 1 ms)`, failures replaced at once, an occasional extra random replica to re-measure peers
//!   that may have recovered). One deadline covers the whole request.
//! - Anti-entropy ([`proto::entropy`], `net/service/entropy.rs`): every `anti_entropy_interval`
//!   (default 5 s, jittered ±50%; 0 disables), 250 ms after a member connects, and at once after
//!   a round its bounds cut short, each member runs one exchange with every connected member over
//!   `OBJECT_SYNC`. The range two members share (the keys this node holds whose replicas include
//!   both) is split into a power-of-two number of buckets (about 32 keys each, at most 4096); a
//!   bucket's digest is the XOR of `SHA-256(key ‖ version ‖ hash)` prefixes. The initiator sends
//!   its digests (at most 64 KiB) tagged with its placement id (a digest of the member list and
//!   R); the responder lists `(key, version, hash, length)` for differing buckets (at most 4096
//!   entries and 1 MiB per answer; a larger bucket is listed a window at a time, and the
//!   initiator doubles its bucket count for that peer); the initiator pulls copies that win over
//!   its own with ordinary `FETCH` requests and pushes its winning copies with ordinary `STORE`
//!   requests (at most 64 MiB pulled and 64 MiB pushed, 32 transfers in flight per exchange; a copy is pushed only to a peer that holds an
//!   older one, by the key's heaviest other replica; a key a peer lacks, it pulls), so membership, the
//!   clock checks and the store's rule (a higher version wins; at equal versions, the smaller
//!   hash) apply as to any write: no acknowledged version is replaced by an older one. A restarted,
//!   partitioned or newly placed replica converges without any read; after `set_members` the new
//!   replicas of a key receive it from the old ones (a key none of whose new replicas holds it
//!   does not move: with R = 3 and one member added or removed at a time, some always does). A
//!   digest exchange that is malformed, from another placement (member lists differ), with a
//!   bucket count that is not a power of two up to 4096, or over the limits gets a typed error
//!   ([`proto::entropy::EntropyError`]), is counted in
//!   `meshwire_object_anti_entropy_errors_total{reason}`; one from another placement ends only
//!   its request stream, any other closes the connection after its answer (the peer broke the
//!   protocol); a non-member is refused `not_member` as for any object request. Digests come
//!   from a scan of the store's record headers per exchange, not from persisted state:
//!   `bench/anti-entropy.sh` reports the scan time.
//! - Store: redb file `objects.redb` in the data directory: a header per object and its content in
//!   pieces that fill redb's power-of-two page runs, or, from 64 KiB, in a file of its own in
//!   `objects.content/` (see [`net::store`]). Each write is one durable
//!   transaction (a crash leaves the old or the new object, never a torn one); reads verify the
//!   SHA-256 and report a damaged object as corrupt. A `GET` streams content from its content
//!   file in 256 KiB chunks (checked before the read answers, and again as it streams), so a slow
//!   reader of a large object holds a chunk, not the object. A `PUT` of 64 KiB or more (or of
//!   unknown length) is written to a new content file in 256 KiB pieces
//!   as it arrives and hashed on the way; the node then stamps it, commits that file as its own
//!   copy (no copy made) and sends it to the other replicas from the file, piece by piece, as a
//!   streamed request ([`meshwire::Node::request_streamed`]); a replica writes what arrives to a
//!   content file of its own, checks it against the stamp's hash and commits it (a mismatch is
//!   refused as malformed and leaves no file). A conditional `PUT` (`If-Match`/`If-None-Match`)
//!   goes the same way through its two phases: the prepare carries the content piece by piece,
//!   a replica answers busy or a failed precondition before it reads the content, and holds a
//!   prepared large copy in its content file (at most 1 GiB of them per node) until the commit
//!   commits that file. So no node holds such a write whole: each holds a piece per write. A `GET` through a node that does not hold the winner's content asks the
//!   quorum for content only up to 256 KiB (`FetchMode::FullIfSmall`); a larger one is then
//!   streamed from one holder's content file ([`meshwire::Node::request_streamed_answer`]) into
//!   the response and checked against its hash as it arrives (a mismatch or a broken stream cuts
//!   the response short). A replica answers any full fetch of a content file from the file,
//!   piece by piece. Read repair after a read streamed from this node's content file sends the
//!   stale replicas that file piece by piece, and
//!   anti-entropy moves copies of 64 KiB or more the same way (a pull writes what arrives to a
//!   content file and commits it, a push sends from the pusher's file). Still held whole
//!   (bounded by `max_object_bytes` and the node's request budget): reads through the service
//!   API's `ObjectService::get`, which returns the content in memory (`get_body` streams it).
//!   One memory budget (`store_memory_bytes`,
//!   128 MiB) holds redb's page cache and a cache of hot objects (half each; objects up to a
//!   quarter of the cache), so many readers of one object share one buffer. Store calls run on
//!   tokio's blocking pool (or on the calling task with `ServiceOptions::inline_store`, which the
//!   lab's chaos test sets so that a seed repeats its run exactly); a fetch answered from the
//!   object cache makes no store call.
//!
//! ## HTTP API
//!
//! | request | answer |
//! |---|---|
//! | `PUT /objects/{key}` (body = content) | `201` `{"key","version","hash","etag","acks","replicas"}` |
//! | `PUT /objects/{key}` with `If-Match: "<etag>"` or `If-None-Match: *` | compare-and-set: `201` only if the current copy is exactly that ETag (or absent); else `412`, or `409` when another conditional write on the key is in progress |
//! | `GET /objects/{key}` | `200` content, streamed in 64 KiB chunks (256 KiB chunks from the content file when this node holds the winner in one; a file found damaged mid-stream cuts the response short of its `Content-Length`); headers `ETag` (`"<version>-<SHA-256 hex>"`), `x-meshwire-version`, `x-meshwire-answers` |
//! | `GET /objects/{key}?local=true` or header `x-meshwire-read: local` | this node's copy only |
//! | `GET /status` | peer id, peers (connected, configured, RTT, queued messages/bytes, latency estimate, error rate), store size, quorum settings, `members` (the cluster, this node included), `max_clock_skew_ms` |
//! | `GET /peers` | the peers list of `/status` |
//! | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics 1.0 when `Accept` prefers `application/openmetrics-text` (node metrics plus `meshwire_object_reads_total{outcome}`, `meshwire_object_writes_total{outcome}` (`ok`, `quorum_not_reached`, `superseded`, `precondition_failed`, `conflict`, `error`), `meshwire_object_read_duration_seconds` and `meshwire_object_write_duration_seconds` (histograms of successful operations), `meshwire_start_time_seconds`, `meshwire_object_store_commits_total` and `meshwire_object_store_committed_writes_total` (durable write transactions of the local store and the objects they wrote: concurrent writes share one), `meshwire_object_store_checkpoints_total` (empty commits saving the store's allocator state once it falls idle, so a crash reopens it without a rebuild), `meshwire_object_read_repairs_total`, `meshwire_object_read_requests_total`, `meshwire_object_probe_requests_total` (one version-and-hash request to each member as its connection comes up) and `meshwire_object_probes_skipped_total` (members not probed: enough others known to answer within their round trip), `meshwire_object_stamp_requests_total` and `meshwire_object_stamp_request_keys_total` (version requests sent to replicas and the keys they asked: their ratio is the keys per gathered request), `meshwire_object_refused_requests_total{reason}`, `meshwire_object_refused_answers_total{reason}` with reasons `not_member`, `clock_skew`, `version_limit` (and `malformed`, `too_large` for requests), the anti-entropy metrics `meshwire_object_anti_entropy_rounds_total`, `..._exchanges_total{outcome}` (`in_sync`, `repaired`, `unrepaired`, `failed`), `..._repaired_keys_total{direction}` (`pulled`, `pushed`), `..._sent_bytes_total`, `..._received_bytes_total`, `..._errors_total{reason}`, `..._scan_seconds`, `meshwire_http_refused_total{reason}`, `meshwire_http_errors_total{status, error}`, `meshwire_http_connections`) |
//! | `GET /dashboard` | the live dashboard: one static HTML page, open without the token; it reads the token from `#token=` in its URL |
//! | `GET /dashboard/data` | `{now_unix_seconds, status, metrics}`: the `/status` body and every `/metrics` sample as `{name, labels, value}` (what the dashboard and `meshwire status` poll) |
//! | `GET /topics` | the node's topics: `name`, `class`, `relay`, `max_bytes`, `push_whole_max_bytes`, `latency_sensitive`, `expiry_ms`, `subscribers` (when the daemon runs topics, as `meshwire node` does) |
//! | `POST /topics/{name}` (body = message) | `202` `{"id","topic","class","sequence","bytes"}`: published to every peer over gossip and to this node's subscribers |
//! | `GET /topics/{name}/events` | `200 text/event-stream`: every message of the topic as a server-sent event (see [`net::http::topics`]); `meshwire_topic_*` metrics in [`net::topics`] |
//!
//! Errors are JSON `{"error": CODE, "message": TEXT, ...}`:
//!
//! | status | `error` | when | extra fields |
//! |---|---|---|---|
//! | 400 | `invalid_key` | key empty, too long, bad characters, `.` or `..` | |
//! | 400 | `invalid_path` | the key is not UTF-8 (`/objects/%FF`) | |
//! | 400 | `bad_request` | another malformed request (such as `?local=maybe`) | |
//! | 400 | `invalid_topic` | a topic name that is not `[A-Za-z0-9._-]{1,64}` | |
//! | 404 | `unknown_topic` | a valid name that is not one of the node's topics | |
//! | 400 | `invalid_precondition` | `If-Match` is not one ETag of this API (`*` and weak tags included), `If-None-Match` is not `*`, or both are present | |
//! | 401 | `unauthorized` | the token is required and missing, or a wrong one was sent | |
//! | 404 | `not_found` | no replica (or, local read, this node) holds the key | |
//! | 404 | `no_route` | any other path | |
//! | 405 | `method_not_allowed` | a method the route does not serve (header `Allow`) | |
//! | 400 | `bad_body` | a PUT or publish body that broke off or is badly framed (a bad chunk, a connection that ended mid-body) | |
//! | 408 | `body_timeout` | the body paused too long or arrived too slowly; the connection closes | `reason` |
//! | 409 | `conflict` | a conditional write: other conditional writes on the key held too many replicas; nothing was written, retry | `needed`, `prepared` |
//! | 409 | `superseded` | a write: a newer write of the key won on so many replicas that W acks became impossible; this write will not be read, so do not retry it unchanged (that would overwrite the newer one) | `needed`, `reached` (acks), `asked`, `superseded`, `outcome: "superseded"` |
//! | 412 | `precondition_failed` | a conditional write: a replica's current copy does not match; nothing was written | `current_etag` (newest reported, or null) |
//! | 413 | `too_large` | body over `max_object_bytes` (a topic: over its `max_bytes`) | `max_bytes` |
//! | 503 | `quorum_not_reached` | a read: fewer replicas answered than the read quorum before the deadline | `needed`, `reached`, `asked` |
//! | 503 | `quorum_not_reached` | a write: fewer than W acks (for a conditional write: commits) before the deadline; the write may still apply | `needed`, `reached` (acks), `asked`, `superseded` (replicas holding a winning copy), `outcome: "unknown"` |
//! | 503 | `quorum_not_reached` | a conditional write: fewer than W replicas prepared before the deadline; nothing was written | `needed`, `reached`, `asked`, `outcome: "not_applied"` |
//! | 503 | `busy` | over a connection or request cap (header `Retry-After`) | `retry_after_secs` |
//! | 503 | `too_many_subscribers` | every topic subscriber slot is taken (header `Retry-After`) | |
//! | 503 | `shutting_down` | a publish or subscription while the node shuts down | |
//! | 503 | `publish_refused` | gossip refused a publish (its pool is full) | |
//! | 502 | `content_unavailable` | the quorum agreed on a copy but no holder delivered its content | |
//! | 500 | `store_error` | the local store failed or holds a corrupt record | |
//! | 500 | `clock_exhausted` | this node's hybrid clock reached `u64::MAX - 1` and cannot version a write | |
//! | 415 | `unsupported_media_type` | a content type a route does not take | |
//! | 500 | `internal_error` | any other server-side failure | |
//!
//! Every error answer a request gets is counted by its code in
//! `meshwire_http_errors_total{status, error}` (those before a handler runs too: `401`, `404
//! no_route`, `405`, `503 busy`); refusals of whole connections, and requests hyper cannot parse,
//! in `meshwire_http_refused_total{reason}`.
//!
//! A request hyper cannot parse at all (a malformed request line, raw non-UTF-8 bytes in the
//! path rather than `%FF`, more than 100 header lines or a head over hyper's buffer, a URI over
//! its length) gets `400 bad_request`, `431 headers_too_large` or `414 uri_too_long` in place of
//! hyper's own empty answer, and the connection closes.
//!
//! Connections are HTTP/1.1 keep-alive, under a header read timeout, a body idle timeout and
//! minimum rate, caps on connections (total and per client address) and concurrent requests
//! ([`net::HttpLimits`]), and a bearer token required off loopback ([`net::HttpAuth`]); see the
//! `# Design` of [`net::http::limits`] and [`net::http::auth`].
//!
//! ## Settings
//!
//! Flags `--http ADDR` (default `127.0.0.1:7780`) or `http_listen` in the config file, the `[http]`
//! table of limits and token policy (`docs/node.md`), `--member PEERID` (repeatable, adds to
//! `members`), and:
//!
//! ```toml
//! [objects]
//! replication = 3         # R
//! write_quorum = 2        # W
//! read_quorum = 2
//! read_policy = "hedged"  # sequential | parallel-all | hedged
//! max_object_bytes = 8388608  # at most the node's frame limit less 348 bytes (refused at start otherwise)
//! deadline_ms = 5000      # whole read or write
//! max_clock_skew_ms = 5000  # refuse peers' clocks and versions further ahead than this
//! anti_entropy_interval_ms = 5000  # mean time between anti-entropy rounds (±50%); 0 disables
//! members = ["<peer id>", "<peer id>"]  # the object cluster besides this node; none = a cluster of one
//! ```
//!
//! ## Measured
//!
//! - Lab: `scenarios/zold-fetch.toml` (see `docs/scenarios.md`).
//! - HTTP: `bench/http.sh` (wrk against a release node; see the script's header for targets).
//! - Anti-entropy: `bench/anti-entropy.sh` (a replica of a 3-node release cluster misses 10,000
//!   writes of 4 KiB and is restarted: time and bytes to converge). Measured on a shared 2-core
//!   machine, four runs: 2.53–2.72 s from the restart (target 10 s), 1.036–1.037× the missed
//!   content in anti-entropy payload bytes, 1.063–1.065× in frame bytes; one digest scan of
//!   10,000 keys 18–28 ms (mean per run), so digests are not persisted.
//!
//! # Layout
//!
//! [`proto`] is sans-IO (always built: no tokio, quinn, sockets or clock reads): the object
//! messages, placement and merging ([`proto::object`]), anti-entropy ([`proto::entropy`]) and
//! quorum planning with peer scores ([`proto::quorum`]). [`net`] (default feature `net`) runs them over a [`meshwire::Node`]: the
//! object service, the redb store ([`net::store`]) and the axum HTTP API ([`net::http`]).

pub mod proto;

#[cfg(feature = "net")]
pub mod net;
