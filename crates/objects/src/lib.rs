//! Serve versioned objects from untrusted, sometimes slow replicas: quorum reads and writes, an embedded store, an HTTP API.
//!
//! # Design
//!
//! `meshwire node` stores versioned objects, replicates them over its peers and serves them over HTTP.
//! Code: the sans-IO part is [`proto::object`] (placement, node-to-node messages, merge) and
//! [`proto::quorum`]: `quorum/scores.rs` ranks peers; `quorum/plan.rs` runs one request and keeps the
//! driver's bookkeeping (`on_answer`, `on_failure` and `cancel_pending` update the peer scores with
//! the injected `now`); `quorum/policy/{sequential,parallel_all,hedged}.rs` hold one policy each,
//! behind a `Spread` trait. Behind the `net` feature: `net/service.rs` (replication, read repair)
//! with its driver `net/service/drive.rs`, which only sends, awaits and reads the clock;
//! `net/store.rs` (redb); `net/http.rs` (axum); and `net/daemon.rs`: `Daemon::builder(config)`
//! assembles the identity, node, store (`objects.redb` in the data directory, or in memory),
//! object service and optional HTTP API once, and has one `shutdown()`. `meshwire node`,
//! `meshwire demo` and the lab's quorum-reads experiment all use it.
//!
//! ## Model
//!
//! - An object is `(key, version, SHA-256 of content, content)`. Keys: 1-256 bytes of `[A-Za-z0-9._-]`.
//! - Replicas: the R heaviest of the node and its known peers under rendezvous hashing
//!   (`SHA-256(key ‖ peer id)`), so every node computes the same set.
//! - Write (`PUT`): version = `max(held version + 1, Unix time in ms)`; sent to all R replicas at once,
//!   returns at W acks; the remaining replicas finish in the background.
//! - Read (`GET`): a quorum plan asks replicas for version and hash, returns at the read quorum, merges
//!   (highest version, then summed trust = 1 − error rate, then most holders, then smallest hash), takes
//!   the content from the local store or a holder of the winner (hash checked), and repairs replicas that
//!   answered with an older copy or none, in the background.
//! - Quorum plans (`proto::quorum`): `sequential` (Zold: one replica after another), `parallel-all`
//!   (everyone, wait for all or the deadline), `hedged` (default: the best `quorum` replicas by an EWMA
//!   of latency and errors, a hedge to the next-best when one is later than its tail estimate
//!   `srtt + 4·rttvar`, failures replaced at once, an occasional extra random replica to re-measure peers
//!   that may have recovered). One deadline covers the whole request.
//! - Store: redb file `objects.redb` in the data directory. Each write is one durable transaction (a
//!   crash leaves the old or the new record, never a torn one); reads verify the SHA-256 and report a
//!   damaged record as corrupt. A bounded in-memory cache (64 MiB, objects up to 16 MiB) lets many
//!   readers of one object share one buffer.
//!
//! ## HTTP API
//!
//! | request | answer |
//! |---|---|
//! | `PUT /objects/{key}` (body = content) | `201` `{"key","version","hash","acks","replicas"}` |
//! | `GET /objects/{key}` | `200` content, streamed in 64 KiB chunks; headers `ETag` (hash), `x-meshwire-version`, `x-meshwire-answers` |
//! | `GET /objects/{key}?local=true` or header `x-meshwire-read: local` | this node's copy only |
//! | `GET /status` | peer id, peers (connected, RTT, queued messages/bytes, latency estimate, error rate), store size, quorum settings |
//! | `GET /peers` | the peers list of `/status` |
//! | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics 1.0 when `Accept` prefers `application/openmetrics-text` (node metrics plus `meshwire_object_reads_total{outcome}`, `meshwire_object_writes_total{outcome}`, `meshwire_object_read_repairs_total`, `meshwire_object_read_requests_total`, `meshwire_http_refused_total{reason}`, `meshwire_http_connections`) |
//!
//! Errors are JSON `{"error": CODE, "message": TEXT, ...}`:
//!
//! | status | `error` | when | extra fields |
//! |---|---|---|---|
//! | 400 | `invalid_key` | key empty, too long, bad characters, `.` or `..` | |
//! | 400 | `invalid_path` | the key is not UTF-8 (`/objects/%FF`) | |
//! | 400 | `bad_request` | another malformed request (such as `?local=maybe`) | |
//! | 401 | `unauthorized` | the token is required and missing, or a wrong one was sent | |
//! | 404 | `not_found` | no replica (or, local read, this node) holds the key | |
//! | 404 | `no_route` | any other path | |
//! | 405 | `method_not_allowed` | a method the route does not serve (header `Allow`) | |
//! | 408 | `body_timeout` | the body paused too long or arrived too slowly; the connection closes | `reason` |
//! | 413 | `too_large` | body over `max_object_bytes` | `max_bytes` |
//! | 503 | `quorum_not_reached` | fewer replicas answered or acked than the quorum before the deadline | `needed`, `reached`, `asked` |
//! | 503 | `busy` | over a connection or request cap (header `Retry-After`) | `retry_after_secs` |
//! | 502 | `content_unavailable` | the quorum agreed on a copy but no holder delivered its content | |
//! | 500 | `store_error` | the local store failed or holds a corrupt record | |
//!
//! Only a request hyper cannot parse at all (a malformed request line, raw
//! non-UTF-8 bytes in the path rather than `%FF`, a head over hyper's buffer)
//! gets hyper's own empty `400`/`431` before the connection closes.
//!
//! Connections are HTTP/1.1 keep-alive, under a header read timeout, a body idle timeout and
//! minimum rate, caps on connections (total and per client address) and concurrent requests
//! ([`net::HttpLimits`]), and a bearer token required off loopback ([`net::HttpAuth`]); see the
//! `# Design` of [`net::http::limits`] and [`net::http::auth`].
//!
//! ## Settings
//!
//! Flag `--http ADDR` (default `127.0.0.1:7780`) or `http_listen` in the config file, the `[http]`
//! table of limits and token policy (`docs/node.md`), and:
//!
//! ```toml
//! [objects]
//! replication = 3         # R
//! write_quorum = 2        # W
//! read_quorum = 2
//! read_policy = "hedged"  # sequential | parallel-all | hedged
//! max_object_bytes = 8388608  # at most the node's frame limit less 298 bytes (refused at start otherwise)
//! deadline_ms = 5000      # whole read or write
//! ```
//!
//! ## Measured
//!
//! - Lab: `scenarios/zold-fetch.toml` (see `docs/scenarios.md`).
//! - HTTP: `bench/http.sh` (wrk against a release node; see the script's header for targets).
//!
//! # Layout
//!
//! [`proto`] is sans-IO (always built: no tokio, quinn, sockets or clock reads): the object
//! messages, placement and merging ([`proto::object`]) and quorum planning with peer scores
//! ([`proto::quorum`]). [`net`] (default feature `net`) runs them over a [`meshwire::Node`]: the
//! object service, the redb store ([`net::store`]) and the axum HTTP API ([`net::http`]).

pub mod proto;

#[cfg(feature = "net")]
pub mod net;
