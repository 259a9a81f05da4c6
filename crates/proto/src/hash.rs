//! SHA-256, the one content hash meshwire uses (artifact ids, object hashes, rendezvous weights).
//!
//! `ring` computes it: the transport already depends on `ring` through rustls, so hashing adds no
//! crate to the tree.

/// SHA-256 of the concatenation of `parts`, without copying them together.
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finish()
}

/// SHA-256 over bytes that arrive piece by piece (a stream read into a reused buffer).
#[derive(Clone)]
pub struct Sha256(ring::digest::Context);

impl std::fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sha256")
    }
}

impl Sha256 {
    /// An empty hash state.
    pub fn new() -> Self {
        Self(ring::digest::Context::new(&ring::digest::SHA256))
    }

    /// Adds `bytes` to what has been hashed.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything added.
    pub fn finish(self) -> [u8; 32] {
        let mut digest = [0u8; 32];
        digest.copy_from_slice(self.0.finish().as_ref());
        digest
    }
}

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::sha256;

    #[test]
    fn matches_the_fips_180_vector_and_ignores_how_input_is_split() {
        let abc = sha256(&[b"abc"]);
        assert_eq!(
            abc[..8],
            [0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea],
            "SHA-256(\"abc\") starts ba7816bf8f01cfea"
        );
        assert_eq!(sha256(&[b"a", b"", b"bc"]), abc);
    }
}
