//! Keep a node's ed25519 identity on disk: created on first start, never silently replaced.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::SigningKey;
use meshwire_proto::PeerId;
use rand::{RngCore, SeedableRng};

/// Name of the identity file inside a node's data directory (PKCS#8 PEM, readable by `openssl pkey`).
pub const IDENTITY_FILE: &str = "identity.pem";

/// Why an identity could not be loaded or stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Reading or writing the key file failed.
    #[error("identity file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The key file exists but does not hold an ed25519 PKCS#8 key. It is left untouched: a node
    /// never replaces a corrupt identity with a new one behind its operator's back.
    #[error("identity file {path} {reason}; expected a PKCS#8 PEM \"PRIVATE KEY\" block holding an Ed25519 key (as `meshwire id` writes); restore it from a backup or delete it to create a new identity")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// Encoding the key failed.
    #[error("cannot encode the identity key: {0}")]
    Encode(String),
}

/// A node's ed25519 key pair. Its public key is the node's [`PeerId`].
#[derive(Clone)]
pub struct Keypair {
    signing: SigningKey,
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keypair")
            .field("peer_id", &self.peer_id())
            .finish_non_exhaustive()
    }
}

impl Keypair {
    /// A fresh key pair from the operating system's random number generator.
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        rand::rngs::StdRng::from_os_rng().fill_bytes(&mut seed);
        Self::from_seed(seed)
    }

    /// The key pair whose secret is `seed` (for tests and the lab, where identities are derived
    /// from a scenario seed).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// This key's identity.
    pub fn peer_id(&self) -> PeerId {
        PeerId::from_bytes(self.signing.verifying_key().to_bytes())
    }

    /// A 32-byte secret for `purpose`, derived from the identity key (HMAC-SHA256 keyed by the
    /// secret key), so that it survives restarts without being stored.
    pub(crate) fn derive_secret(&self, purpose: &[u8]) -> [u8; 32] {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.signing.as_bytes());
        let tag = ring::hmac::sign(&key, purpose);
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// The secret key as PKCS#8 DER, for TLS.
    pub(crate) fn pkcs8_der(&self) -> Result<Vec<u8>, IdentityError> {
        self.signing
            .to_pkcs8_der()
            .map(|document| document.as_bytes().to_vec())
            .map_err(|error| IdentityError::Encode(error.to_string()))
    }

    /// Loads the identity from `data_dir/identity.pem`, creating the directory and a new identity
    /// (file mode 0600) if there is none. A file that exists but does not parse is an error.
    /// A key file that other users can read is used, with a warning.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, IdentityError> {
        match Self::load(data_dir)? {
            Some(keypair) => Ok(keypair),
            None => {
                let keypair = Self::generate();
                keypair.save(&data_dir.join(IDENTITY_FILE))?;
                Ok(keypair)
            }
        }
    }

    /// Loads the identity from `data_dir/identity.pem` as [`Keypair::load_or_create`] does, but
    /// creates nothing: `None` when there is no such file.
    pub fn load(data_dir: &Path) -> Result<Option<Self>, IdentityError> {
        let path = data_dir.join(IDENTITY_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => {
                warn_if_readable_by_others(&path, "identity key");
                Self::from_pem(&text)
                    .map(Some)
                    .map_err(|reason| IdentityError::Corrupt {
                        path: path.clone(),
                        reason,
                    })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) if error.kind() == std::io::ErrorKind::InvalidData => {
                Err(IdentityError::Corrupt {
                    path,
                    reason: "holds binary data, not PEM text (a DER key? \
                             `openssl pkey -inform DER -outform PEM` converts one)"
                        .to_string(),
                })
            }
            Err(source) => Err(IdentityError::Io { path, source }),
        }
    }

    /// Parses a PKCS#8 PEM Ed25519 key; the error says what the text holds instead.
    fn from_pem(text: &str) -> Result<Self, String> {
        if !text.contains("-----BEGIN ") {
            return Err(if text.trim().is_empty() {
                "is empty".to_string()
            } else {
                "is not PEM text (no -----BEGIN line)".to_string()
            });
        }
        let (label, der) = ed25519_dalek::pkcs8::spki::der::pem::decode_vec(text.as_bytes())
            .map_err(|error| format!("holds a damaged PEM block ({error})"))?;
        if label != "PRIVATE KEY" {
            let kind = match label {
                "RSA PRIVATE KEY" => " (an RSA key)",
                "EC PRIVATE KEY" => " (an elliptic-curve key)",
                "OPENSSH PRIVATE KEY" => " (an OpenSSH key)",
                "ENCRYPTED PRIVATE KEY" => " (a password-protected key)",
                "CERTIFICATE" => " (a certificate, not a key)",
                _ => "",
            };
            return Err(format!("holds a PEM \"{label}\" block{kind}"));
        }
        let info =
            ed25519_dalek::pkcs8::PrivateKeyInfo::try_from(der.as_slice()).map_err(|error| {
                format!("holds a \"PRIVATE KEY\" block that is not PKCS#8 ({error})")
            })?;
        let oid = info.algorithm.oid.to_string();
        if oid != ED25519_OID {
            let name = match oid.as_str() {
                "1.2.840.113549.1.1.1" => "an RSA",
                "1.2.840.10045.2.1" => "an elliptic-curve (ECDSA)",
                "1.3.101.113" => "an Ed448",
                "1.3.101.110" => "an X25519",
                "1.3.101.111" => "an X448",
                _ => "a non-Ed25519",
            };
            return Err(format!(
                "holds {name} key (algorithm OID {oid}, Ed25519 is {ED25519_OID})"
            ));
        }
        SigningKey::try_from(info)
            .map(|signing| Self { signing })
            .map_err(|error| format!("holds a damaged Ed25519 key ({error})"))
    }

    /// Writes the identity to `path` with mode 0600, atomically (temporary file, then rename), and
    /// refuses to overwrite an existing file.
    pub fn save(&self, path: &Path) -> Result<(), IdentityError> {
        let io = |source| IdentityError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io)?;
        }
        let pem = self
            .signing
            .to_pkcs8_pem(Default::default())
            .map_err(|error| IdentityError::Encode(error.to_string()))?;
        let temporary = path.with_extension("pem.tmp");
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let _ = fs::remove_file(&temporary);
        let mut file = options.open(&temporary).map_err(io)?;
        file.write_all(pem.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        if path.exists() {
            let _ = fs::remove_file(&temporary);
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "refusing to overwrite an existing identity",
            )));
        }
        fs::rename(&temporary, path).map_err(io)
    }
}

/// The PKCS#8 algorithm identifier of Ed25519 (RFC 8410).
const ED25519_OID: &str = "1.3.101.112";

/// Logs a warning when the secret file at `path` (`what` names it: "identity key", "HTTP
/// token") can be read by its group or by everyone.
pub fn warn_if_readable_by_others(path: &Path, what: &str) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(metadata) = fs::metadata(path) {
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "{what} is readable by other users; chmod 600 it"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let first = Keypair::load_or_create(dir.path()).unwrap();
        let second = Keypair::load_or_create(dir.path()).unwrap();
        assert_eq!(first.peer_id(), second.peer_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        fs::write(&path, "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
        let error = Keypair::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(error, IdentityError::Corrupt { .. }), "{error}");
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "-----BEGIN PRIVATE KEY-----\ngarbage\n"
        );
        fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(matches!(
            Keypair::load_or_create(dir.path()),
            Err(IdentityError::Corrupt { .. })
        ));
    }

    #[test]
    fn errors_say_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        let message = |content: &[u8]| {
            fs::write(&path, content).unwrap();
            Keypair::load_or_create(dir.path()).unwrap_err().to_string()
        };
        let garbage = message(b"-----BEGIN PRIVATE KEY-----\ngarbage\n");
        assert!(garbage.contains("damaged PEM block"), "{garbage}");
        assert!(garbage.contains("Ed25519"), "{garbage}");
        assert!(!garbage.contains("NUL"), "{garbage}");
        let text = message(b"hello\n");
        assert!(text.contains("is not PEM text"), "{text}");
        let rsa =
            message(b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n");
        assert!(rsa.contains("an RSA key"), "{rsa}");
        // A PKCS#8 RSA key (the algorithm identifier of an RSA key, then a dummy key octet string).
        let der: &[u8] = &[
            0x30, 0x1a, 0x02, 0x01, 0x00, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7,
            0x0d, 0x01, 0x01, 0x01, 0x05, 0x00, 0x04, 0x06, 0x30, 0x04, 0x02, 0x02, 0x01, 0x01,
        ];
        let pem = ed25519_dalek::pkcs8::spki::der::pem::encode_string(
            "PRIVATE KEY",
            ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF,
            der,
        )
        .unwrap();
        let pkcs8_rsa = message(pem.as_bytes());
        assert!(pkcs8_rsa.contains("holds an RSA key"), "{pkcs8_rsa}");
        assert!(pkcs8_rsa.contains("1.2.840.113549.1.1.1"), "{pkcs8_rsa}");
        let binary = message(&[0xff, 0xfe, 0x00]);
        assert!(binary.contains("binary data"), "{binary}");
    }

    #[test]
    fn seeded_keys_are_stable() {
        assert_eq!(
            Keypair::from_seed([1; 32]).peer_id(),
            Keypair::from_seed([1; 32]).peer_id()
        );
        assert_ne!(
            Keypair::from_seed([1; 32]).peer_id(),
            Keypair::from_seed([2; 32]).peer_id()
        );
    }
}
