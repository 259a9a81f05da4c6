//! Serve versioned objects from untrusted, sometimes slow replicas: quorum reads and writes, an embedded store, an HTTP API.
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
