//! Bind TLS 1.3 to node identities: self-signed ed25519 certificates and verifiers that check them.
//!
//! # Design
//!
//! Each node presents one self-signed certificate whose key is its ed25519 identity key. No
//! certificate authority is involved: a certificate is accepted only if
//!
//! 1. it parses as X.509 with an ed25519 subject public key,
//! 2. its signature verifies under that same key (validly self-signed), and
//! 3. on the dialing side, that key is the [`PeerId`] the dialer asked for; on the accepting side,
//!    that key is in the allowlist, when one is configured.
//!
//! TLS 1.3's `CertificateVerify` then proves the peer holds the private key. The dialer learns which
//! key it actually saw even when the handshake fails, so a wrong identity is reported as
//! [`crate::DialError::UnexpectedPeer`] rather than an opaque handshake failure. Only ed25519
//! signatures and TLS 1.3 are offered. Nothing here skips verification.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use meshwire_proto::PeerId;
use prometheus_client::metrics::counter::Counter;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::identity::{IdentityError, Keypair};

/// ALPN protocol name; the suffix is the protocol version.
pub const ALPN: &[u8] = b"meshwire/1";

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The identity key could not be encoded.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Generating the self-signed certificate failed.
    #[error("cannot generate the node certificate: {0}")]
    Certificate(#[source] rcgen::Error),
    /// rustls refused the configuration.
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// quinn refused the TLS configuration.
    #[error("TLS configuration unusable for QUIC: {0}")]
    Quic(#[source] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// Why a peer's certificate was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerCertificateError {
    /// Not parseable X.509.
    #[error("certificate does not parse: {0}")]
    Malformed(#[source] x509_parser::error::X509Error),
    /// The subject key is not ed25519.
    #[error("certificate key is not ed25519")]
    NotEd25519,
    /// The certificate is not signed by its own key.
    #[error("certificate is not validly self-signed")]
    BadSelfSignature,
    /// The key is not the identity the dialer expected.
    #[error("expected peer {expected}, certificate is for {actual}")]
    UnexpectedPeer {
        /// The identity dialed.
        expected: PeerId,
        /// The identity presented.
        actual: PeerId,
    },
    /// The key is not in the allowlist.
    #[error("peer {0} is not in the allowlist")]
    NotAllowed(PeerId),
}

/// A node's certificate and private key, made once per node.
#[derive(Clone)]
pub struct TlsIdentity {
    certificate: CertificateDer<'static>,
    key_pkcs8: Arc<Vec<u8>>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// A self-signed certificate for `keypair`.
    pub fn new(keypair: &Keypair) -> Result<Self, TlsError> {
        let der = keypair.pkcs8_der()?;
        let signer = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(der.as_slice()),
            &rcgen::PKCS_ED25519,
        )
        .map_err(TlsError::Certificate)?;
        let params = rcgen::CertificateParams::new(vec![keypair.peer_id().to_string()])
            .map_err(TlsError::Certificate)?;
        let certificate = params.self_signed(&signer).map_err(TlsError::Certificate)?;
        Ok(Self {
            certificate: certificate.der().clone(),
            key_pkcs8: Arc::new(der),
        })
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.as_ref().clone()))
    }
}

/// Extracts the [`PeerId`] from a peer's certificate after checking it is a validly self-signed
/// ed25519 certificate.
pub fn peer_id_from_certificate(der: &[u8]) -> Result<PeerId, PeerCertificateError> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).map_err(|error| {
        PeerCertificateError::Malformed(match error {
            x509_parser::nom::Err::Error(error) | x509_parser::nom::Err::Failure(error) => error,
            x509_parser::nom::Err::Incomplete(_) => {
                x509_parser::error::X509Error::InvalidCertificate
            }
        })
    })?;
    let key = certificate.public_key();
    if key.algorithm.algorithm != x509_parser::oid_registry::OID_SIG_ED25519 {
        return Err(PeerCertificateError::NotEd25519);
    }
    let bytes: [u8; 32] = key
        .subject_public_key
        .data
        .as_ref()
        .try_into()
        .map_err(|_| PeerCertificateError::NotEd25519)?;
    certificate
        .verify_signature(None)
        .map_err(|_| PeerCertificateError::BadSelfSignature)?;
    Ok(PeerId::from_bytes(bytes))
}

fn refuse(error: PeerCertificateError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(error))))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn verification_algorithms(provider: &CryptoProvider) -> WebPkiSupportedAlgorithms {
    provider.signature_verification_algorithms
}

/// The handshake-signature methods both verifiers share: TLS 1.2 refused, TLS 1.3 checked with the
/// provider's algorithms, and only ed25519 offered.
macro_rules! ed25519_tls13_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            _message: &[u8],
            _cert: &CertificateDer<'_>,
            _dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::PeerIncompatible(
                rustls::PeerIncompatible::Tls12NotOffered,
            ))
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            vec![SignatureScheme::ED25519]
        }
    };
}

/// Verifies the accepting node's certificate on the dialing side, against the expected identity.
#[derive(Debug)]
struct ExpectedPeerVerifier {
    expected: PeerId,
    seen: Arc<Mutex<Option<PeerId>>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ExpectedPeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let actual = peer_id_from_certificate(end_entity).map_err(refuse)?;
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(actual);
        }
        if actual != self.expected {
            return Err(refuse(PeerCertificateError::UnexpectedPeer {
                expected: self.expected,
                actual,
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    ed25519_tls13_signatures!();
}

/// Verifies dialing nodes' certificates on the accepting side, against the optional allowlist.
#[derive(Debug)]
struct AllowlistVerifier {
    allowlist: Option<Arc<HashSet<PeerId>>>,
    algorithms: WebPkiSupportedAlgorithms,
    refused: Counter,
}

impl ClientCertVerifier for AllowlistVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let result = peer_id_from_certificate(end_entity).and_then(|peer| match &self.allowlist {
            Some(allowed) if !allowed.contains(&peer) => {
                Err(PeerCertificateError::NotAllowed(peer))
            }
            _ => Ok(peer),
        });
        match result {
            Ok(_) => Ok(ClientCertVerified::assertion()),
            Err(error) => {
                self.refused.inc();
                tracing::info!(%error, "refused a dialing peer");
                Err(refuse(error))
            }
        }
    }

    ed25519_tls13_signatures!();
}

/// The accepting side's QUIC crypto: our certificate, mandatory client certificates checked against
/// `allowlist`, ALPN [`ALPN`]. Refusals increment `refused`.
pub fn server_crypto(
    identity: &TlsIdentity,
    allowlist: Option<Arc<HashSet<PeerId>>>,
    refused: Counter,
) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, TlsError> {
    let provider = provider();
    let verifier = AllowlistVerifier {
        allowlist,
        algorithms: verification_algorithms(&provider),
        refused,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_single_cert(vec![identity.certificate.clone()], identity.key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicServerConfig::try_from(config)
        .map(Arc::new)
        .map_err(TlsError::Quic)
}

/// Where the dialing side records the identity the remote presented.
pub type SeenPeer = Arc<Mutex<Option<PeerId>>>;

/// The dialing side's QUIC crypto for one dial: accepts only `expected`'s certificate and records
/// the identity actually presented in the returned slot.
pub fn client_crypto(
    identity: &TlsIdentity,
    expected: PeerId,
) -> Result<(Arc<quinn::crypto::rustls::QuicClientConfig>, SeenPeer), TlsError> {
    let provider = provider();
    let seen = Arc::new(Mutex::new(None));
    let verifier = ExpectedPeerVerifier {
        expected,
        seen: seen.clone(),
        algorithms: verification_algorithms(&provider),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(vec![identity.certificate.clone()], identity.key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(config).map_err(TlsError::Quic)?;
    Ok((Arc::new(quic), seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_certificate_yields_own_peer_id() {
        let keypair = Keypair::from_seed([9; 32]);
        let identity = TlsIdentity::new(&keypair).unwrap();
        assert_eq!(
            peer_id_from_certificate(&identity.certificate).unwrap(),
            keypair.peer_id()
        );
    }

    #[test]
    fn tampered_certificate_is_refused() {
        let identity = TlsIdentity::new(&Keypair::from_seed([9; 32])).unwrap();
        let mut der = identity.certificate.to_vec();
        // Flip a bit inside the signature at the end: still parses, no longer self-signed.
        let last = der.len() - 1;
        der[last] ^= 1;
        assert_eq!(
            peer_id_from_certificate(&der),
            Err(PeerCertificateError::BadSelfSignature)
        );
        assert!(matches!(
            peer_id_from_certificate(b"not a certificate"),
            Err(PeerCertificateError::Malformed(_))
        ));
    }
}
