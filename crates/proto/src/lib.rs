//! Run meshwire's protocols as pure state machines: wire and batch codecs, pipeline windows,
//! identities, reconnect policy, gossip, object placement and merging, quorum planning and
//! multipath sessions with their route headers.
//!
//! Nothing in this crate touches a socket, reads a clock or draws from a global random number
//! generator. Time arrives as `now` arguments and randomness as an injected [`rand::RngCore`], so the
//! same code is driven by the async driver in `meshwire`, by unit tests and by the lab in virtual time.

pub mod backoff;
pub mod batch;
pub mod gossip;
pub mod hash;
pub mod object;
pub mod peer_id;
pub mod pipeline;
pub mod quorum;
pub mod route;
pub mod session;
pub mod wire;

pub use peer_id::PeerId;
