//! Serve versioned objects from a meshwire node: quorum reads and writes, an embedded store, an
//! HTTP API.

pub mod http;
pub mod objects;
pub mod store;
