//! Share what every meshwire protocol needs: peer identities, the wire and batch codecs, reconnect backoff and hashing.
//!
//! Nothing in this crate touches a socket, reads a clock or draws from a global random number
//! generator. Time arrives as `now` arguments and randomness as an injected [`rand::RngCore`], so the
//! same code is driven by the async driver in `meshwire`, by unit tests and by the lab in virtual time.

pub mod backoff;
pub mod batch;
pub mod hash;
pub mod peer_id;
#[cfg(any(test, feature = "testnet"))]
pub mod testnet;
pub mod varint;
pub mod wire;

pub use peer_id::PeerId;
