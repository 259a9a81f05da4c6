//! Route session datagrams between nodes, directly or through a relay peer.
//!
//! Every QUIC datagram that carries a session packet ([`crate::proto`]) starts with a route header that
//! names the session and the path; the session packet follows unchanged. All integers are
//! little-endian.
//!
//! | kind            | layout after the kind byte                               | sent by        |
//! |-----------------|----------------------------------------------------------|----------------|
//! | 1 `Direct`      | session (8), path (4)                                     | an end, to the other end |
//! | 2 `ToRelay`     | session (8), path (4), destination peer (32)              | an end, to a relay |
//! | 3 `FromRelay`   | session (8), path (4), source peer (32)                   | a relay, to an end |
//!
//! A relay forwards a `ToRelay` datagram only for a (session, path) it agreed to relay and only
//! between the two ends named in that agreement; it rewrites the header to `FromRelay` naming the
//! sender, so the receiving end knows which peer the session belongs to and that its answers go
//! back through the same relay.
//!
//! The agreement is a request ([`RelayRequest`], fixed 45 bytes) answered by one byte
//! ([`RelayReply`]). Every decoder checks lengths before reading and never panics.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use meshwire_proto::peer_id::{PeerId, PEER_ID_LEN};

const KIND_DIRECT: u8 = 1;
const KIND_TO_RELAY: u8 = 2;
const KIND_FROM_RELAY: u8 = 3;
/// Bytes of a `Direct` header.
pub const DIRECT_HEADER_LEN: usize = 13;
/// Bytes of a relayed header (`ToRelay` or `FromRelay`).
pub const RELAYED_HEADER_LEN: usize = DIRECT_HEADER_LEN + PEER_ID_LEN;
/// Bytes of a [`RelayRequest`].
pub const RELAY_REQUEST_LEN: usize = 1 + 8 + 4 + PEER_ID_LEN;

const OP_OPEN: u8 = 1;
const OP_CLOSE: u8 = 2;

/// Why bytes are not a valid route header, relay request or relay reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The input ends before its fixed fields do.
    #[error("truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes the fixed fields need.
        needed: usize,
    },
    /// The kind (or operation, or reply code) byte is not one this version knows.
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    /// Bytes follow a fixed-size message.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
}

impl RouteError {
    /// Whether a peer that sent this broke the protocol: an unknown kind may come from a newer
    /// version, anything else was sent malformed.
    pub fn breaks_protocol(&self) -> bool {
        !matches!(self, Self::UnknownKind(_))
    }
}

/// Where a session datagram goes, and through whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// End to end, on a direct connection.
    Direct,
    /// From an end to a relay, to be forwarded to `destination`.
    ToRelay {
        /// The other end.
        destination: PeerId,
    },
    /// From a relay to an end, forwarded from `source`.
    FromRelay {
        /// The end that sent it.
        source: PeerId,
    },
}

/// The header in front of every session datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteHeader {
    /// The session, chosen at random by the end that opened it.
    pub session: u64,
    /// The path, named by the end that opened the session.
    pub path: u32,
    /// How the datagram travels.
    pub route: Route,
}

impl RouteHeader {
    /// Encoded length.
    pub fn len(&self) -> usize {
        match self.route {
            Route::Direct => DIRECT_HEADER_LEN,
            Route::ToRelay { .. } | Route::FromRelay { .. } => RELAYED_HEADER_LEN,
        }
    }

    /// Never empty; present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The header followed by `packet`, as one datagram.
    pub fn encode_with(&self, packet: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(self.len() + packet.len());
        let (kind, peer) = match self.route {
            Route::Direct => (KIND_DIRECT, None),
            Route::ToRelay { destination } => (KIND_TO_RELAY, Some(destination)),
            Route::FromRelay { source } => (KIND_FROM_RELAY, Some(source)),
        };
        out.put_u8(kind);
        out.put_u64_le(self.session);
        out.put_u32_le(self.path);
        if let Some(peer) = peer {
            out.put_slice(peer.as_bytes());
        }
        out.put_slice(packet);
        out.freeze()
    }

    /// Splits a datagram into its header and the session packet behind it (not copied).
    pub fn decode(datagram: Bytes) -> Result<(RouteHeader, Bytes), RouteError> {
        let Some(&kind) = datagram.first() else {
            return Err(RouteError::Truncated {
                len: 0,
                needed: DIRECT_HEADER_LEN,
            });
        };
        let needed = match kind {
            KIND_DIRECT => DIRECT_HEADER_LEN,
            KIND_TO_RELAY | KIND_FROM_RELAY => RELAYED_HEADER_LEN,
            other => return Err(RouteError::UnknownKind(other)),
        };
        if datagram.len() < needed {
            return Err(RouteError::Truncated {
                len: datagram.len(),
                needed,
            });
        }
        let mut head = &datagram[1..needed];
        let session = head.get_u64_le();
        let path = head.get_u32_le();
        let peer = || {
            let mut bytes = [0u8; PEER_ID_LEN];
            bytes.copy_from_slice(head);
            PeerId::from_bytes(bytes)
        };
        let route = match kind {
            KIND_DIRECT => Route::Direct,
            KIND_TO_RELAY => Route::ToRelay {
                destination: peer(),
            },
            _ => Route::FromRelay { source: peer() },
        };
        let header = RouteHeader {
            session,
            path,
            route,
        };
        Ok((header, datagram.slice(needed..)))
    }
}

/// What an end asks a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelayOp {
    /// Start forwarding the path's datagrams between the asker and the peer.
    Open,
    /// Stop forwarding them.
    Close,
}

/// An end's request to a relay about one path of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RelayRequest {
    /// Open or close.
    pub op: RelayOp,
    /// The session.
    pub session: u64,
    /// The path.
    pub path: u32,
    /// The other end.
    pub peer: PeerId,
}

impl RelayRequest {
    /// The request's fixed 45 bytes.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(RELAY_REQUEST_LEN);
        out.put_u8(match self.op {
            RelayOp::Open => OP_OPEN,
            RelayOp::Close => OP_CLOSE,
        });
        out.put_u64_le(self.session);
        out.put_u32_le(self.path);
        out.put_slice(self.peer.as_bytes());
        out.freeze()
    }

    /// Decodes a request; anything but exactly 45 well-formed bytes is an error.
    pub fn decode(mut bytes: &[u8]) -> Result<RelayRequest, RouteError> {
        if bytes.len() < RELAY_REQUEST_LEN {
            return Err(RouteError::Truncated {
                len: bytes.len(),
                needed: RELAY_REQUEST_LEN,
            });
        }
        if bytes.len() > RELAY_REQUEST_LEN {
            return Err(RouteError::TrailingBytes(bytes.len() - RELAY_REQUEST_LEN));
        }
        let op = match bytes.get_u8() {
            OP_OPEN => RelayOp::Open,
            OP_CLOSE => RelayOp::Close,
            other => return Err(RouteError::UnknownKind(other)),
        };
        let session = bytes.get_u64_le();
        let path = bytes.get_u32_le();
        let mut peer = [0u8; PEER_ID_LEN];
        peer.copy_from_slice(bytes);
        Ok(RelayRequest {
            op,
            session,
            path,
            peer: PeerId::from_bytes(peer),
        })
    }
}

/// A relay's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelayReply {
    /// Done.
    Accepted,
    /// The relay already forwards as many paths as it allows.
    Full,
    /// The relay has no connection to the other end (it never dials on anyone's behalf).
    PeerUnreachable,
    /// The path is already relayed for a different pair of ends.
    Conflict,
}

impl RelayReply {
    /// One byte.
    pub fn encode(self) -> Bytes {
        Bytes::from_static(match self {
            RelayReply::Accepted => &[0],
            RelayReply::Full => &[1],
            RelayReply::PeerUnreachable => &[2],
            RelayReply::Conflict => &[3],
        })
    }

    /// Decodes exactly one known byte.
    pub fn decode(bytes: &[u8]) -> Result<RelayReply, RouteError> {
        match bytes {
            [] => Err(RouteError::Truncated { len: 0, needed: 1 }),
            [0] => Ok(RelayReply::Accepted),
            [1] => Ok(RelayReply::Full),
            [2] => Ok(RelayReply::PeerUnreachable),
            [3] => Ok(RelayReply::Conflict),
            [other] => Err(RouteError::UnknownKind(*other)),
            [_, rest @ ..] => Err(RouteError::TrailingBytes(rest.len())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer() -> impl Strategy<Value = PeerId> {
        any::<[u8; 32]>().prop_map(PeerId::from_bytes)
    }

    fn route() -> impl Strategy<Value = Route> {
        prop_oneof![
            Just(Route::Direct),
            peer().prop_map(|destination| Route::ToRelay { destination }),
            peer().prop_map(|source| Route::FromRelay { source }),
        ]
    }

    #[test]
    fn golden_direct_header() {
        let header = RouteHeader {
            session: 0x0102_0304_0506_0708,
            path: 9,
            route: Route::Direct,
        };
        assert_eq!(
            header.encode_with(&[0xaa]).as_ref(),
            &[1, 8, 7, 6, 5, 4, 3, 2, 1, 9, 0, 0, 0, 0xaa]
        );
    }

    #[test]
    fn malformed_inputs_are_typed_errors() {
        assert_eq!(
            RouteHeader::decode(Bytes::new()),
            Err(RouteError::Truncated {
                len: 0,
                needed: DIRECT_HEADER_LEN
            })
        );
        assert_eq!(
            RouteHeader::decode(Bytes::from_static(&[9, 0, 0])),
            Err(RouteError::UnknownKind(9))
        );
        assert_eq!(
            RouteHeader::decode(Bytes::from_static(&[2; 20])),
            Err(RouteError::Truncated {
                len: 20,
                needed: RELAYED_HEADER_LEN
            })
        );
        assert_eq!(
            RelayReply::decode(&[0, 0]),
            Err(RouteError::TrailingBytes(1))
        );
    }

    proptest! {
        #[test]
        fn header_round_trips(session: u64, path: u32, route in route(), packet: Vec<u8>) {
            let header = RouteHeader { session, path, route };
            let datagram = header.encode_with(&packet);
            prop_assert_eq!(datagram.len(), header.len() + packet.len());
            let (decoded, rest) = RouteHeader::decode(datagram).unwrap();
            prop_assert_eq!(decoded, header);
            prop_assert_eq!(rest.to_vec(), packet);
        }

        #[test]
        fn header_decode_never_panics(bytes: Vec<u8>) {
            if let Ok((header, rest)) = RouteHeader::decode(Bytes::from(bytes.clone())) {
                prop_assert_eq!(header.encode_with(&rest).to_vec(), bytes.clone());
            }
        }

        #[test]
        fn relay_request_round_trips(open: bool, session: u64, path: u32, peer in peer()) {
            let op = if open { RelayOp::Open } else { RelayOp::Close };
            let request = RelayRequest { op, session, path, peer };
            prop_assert_eq!(RelayRequest::decode(&request.encode()), Ok(request));
        }

        #[test]
        fn relay_messages_decode_never_panics(bytes: Vec<u8>) {
            if let Ok(request) = RelayRequest::decode(&bytes) {
                prop_assert_eq!(request.encode().to_vec(), bytes.clone());
            }
            if let Ok(reply) = RelayReply::decode(&bytes) {
                prop_assert_eq!(reply.encode().to_vec(), bytes.clone());
            }
        }
    }
}
