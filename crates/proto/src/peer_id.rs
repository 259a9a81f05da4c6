//! Name a node by its ed25519 public key.

use std::fmt;
use std::str::FromStr;

use data_encoding::BASE32_NOPAD;

/// Length of a [`PeerId`] in bytes: an ed25519 public key.
pub const PEER_ID_LEN: usize = 32;

/// A node's identity: the 32 bytes of its ed25519 public key.
///
/// Displayed as 52 characters of lowercase, unpadded base32 (RFC 4648); [`PeerId::short`] gives the
/// first ten for logs and tables. Parsing accepts either case.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId([u8; PEER_ID_LEN]);

/// Why a string is not a [`PeerId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParsePeerIdError {
    /// The text is not unpadded base32.
    #[error("peer id is not base32: {0}")]
    NotBase32(String),
    /// The text decodes to the wrong number of bytes.
    #[error("peer id must decode to {PEER_ID_LEN} bytes, got {0}")]
    WrongLength(usize),
}

impl PeerId {
    /// Wraps the raw bytes of an ed25519 public key.
    pub const fn from_bytes(bytes: [u8; PEER_ID_LEN]) -> Self {
        Self(bytes)
    }

    /// The raw public key bytes.
    pub const fn as_bytes(&self) -> &[u8; PEER_ID_LEN] {
        &self.0
    }

    /// The first ten characters of the base32 form, for logs and tables.
    pub fn short(&self) -> String {
        let mut text = self.to_string();
        text.truncate(10);
        text
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&BASE32_NOPAD.encode(&self.0).to_ascii_lowercase())
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerId({})", self.short())
    }
}

impl FromStr for PeerId {
    type Err = ParsePeerIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let upper = text.trim().to_ascii_uppercase();
        let bytes = BASE32_NOPAD
            .decode(upper.as_bytes())
            .map_err(|error| ParsePeerIdError::NotBase32(error.to_string()))?;
        let array: [u8; PEER_ID_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| ParsePeerIdError::WrongLength(bytes.len()))?;
        Ok(Self(array))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips_in_either_case() {
        let id = PeerId::from_bytes([7; 32]);
        let text = id.to_string();
        assert_eq!(text.len(), 52);
        assert_eq!(text, text.to_ascii_lowercase());
        assert_eq!(text.parse::<PeerId>().unwrap(), id);
        assert_eq!(text.to_ascii_uppercase().parse::<PeerId>().unwrap(), id);
        assert_eq!(id.short(), text[..10]);
    }

    #[test]
    fn rejects_bad_text() {
        assert!(matches!(
            "not base32!".parse::<PeerId>(),
            Err(ParsePeerIdError::NotBase32(_))
        ));
        assert_eq!(
            "aaaa".parse::<PeerId>(),
            Err(ParsePeerIdError::WrongLength(2))
        );
        assert_eq!(
            "aaaaaaaa".parse::<PeerId>(),
            Err(ParsePeerIdError::WrongLength(5))
        );
    }
}
