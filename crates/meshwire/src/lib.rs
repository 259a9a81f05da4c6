//! Communicate with authenticated peers over QUIC: messages, fan-out and requests with bounded queues and metrics.
//!
//! A [`Node`] owns one QUIC endpoint. Every peer is named by its ed25519 public key ([`PeerId`]) and
//! proves it in the TLS 1.3 handshake; there are no certificate authorities. Messages to a peer
//! travel in order over one stream and queue in a bounded per-peer queue; [`Node::send_many`]
//! encodes a message once for any number of peers; [`Node::request`] runs a request/response
//! exchange under one deadline, and [`Node::request_streamed`] / [`Node::handle_streamed`] carry
//! a large request body piece by piece so that neither end holds it whole. The wire format and the protocol policies live in the sans-IO
//! crate [`meshwire_proto`]; this crate is the tokio driver around them.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use meshwire::{Keypair, Node, NodeConfig, ProtocolId};
//! let node = Node::bind(NodeConfig::new(Keypair::generate()), "127.0.0.1:0".parse()?)?;
//! let mut inbox = node.subscribe(ProtocolId(1))?;
//! while let Some(message) = inbox.recv().await {
//!     println!("{} sent {} bytes", message.from, message.payload.len());
//! }
//! # Ok(()) }
//! ```

/// The README's example, compiled and run as a doc test so it stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod config;
pub mod congestion;
mod datagram;
mod framing;
mod identity;
mod metrics;
mod node;
pub mod pipeline;
pub mod protocols;
pub mod tls;
mod udp;

pub use config::{
    ConfigError, Congestion, NodeConfig, QueueLimits, TransportSettings, ACK_ELICITING_THRESHOLD,
    MAX_ACK_DELAY,
};
pub use datagram::{DatagramError, InboundDatagram};
pub use identity::{warn_if_readable_by_others, IdentityError, Keypair, IDENTITY_FILE};
pub use meshwire_proto::backoff::Backoff;
pub use meshwire_proto::batch::{BatchHeader, BatchLimits, Chunk};
pub use meshwire_proto::wire::{Limits, ProtocolId};
pub use meshwire_proto::{self as proto, PeerId};
pub use metrics::Metrics;
pub use node::{
    split_into_chunks, AnswerBody, BatchError, BatchSender, BodyError, BodySource, ConnectionEvent,
    DatagramBacklog, DialError, Direction, HandlerError, InboundBatch, InboundMessage, Inbox, Node,
    NodeError, PeerChange, PeerEvents, PeerStatus, RequestBody, RequestError, SendError,
    SendManyReport, ServiceError, StreamedAnswer, SubscribeError, CLOSE_DUPLICATE,
    CLOSE_PROTOCOL_VIOLATION, CLOSE_SHUTDOWN, RESET_BATCH_ABANDONED, STOP_BATCH_DISCARDED,
    STOP_BATCH_MALFORMED, STOP_BATCH_NO_SUBSCRIBER, STOP_BATCH_REPAIRED, STOP_STREAM_TIMEOUT,
    STREAMED_PIECE_BYTES,
};
pub use udp::SocketBuffers;
