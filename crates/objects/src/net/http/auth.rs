//! Require a bearer token on the HTTP API: kept in the data directory, checked in constant time.
//!
//! # Design
//!
//! The token is 32 random bytes in hex, in `http-token` in the data directory (mode 0600),
//! generated on the first start that serves HTTP and kept afterwards. A request proves it with
//! `Authorization: Bearer TOKEN`.
//!
//! - Off loopback the token is required on every request. Serving a non-loopback address without
//!   it is refused at start unless [`HttpAuth::danger_allow_unauthenticated`] is set, which logs
//!   a warning at every start.
//! - On loopback it is optional unless [`HttpAuth::require_token`] says otherwise. A request that
//!   sends a token must send the right one, on loopback too.
//! - [`HttpAuth::metrics_open`] leaves `GET /metrics` open for scrapers.
//! - `GET /dashboard`, a static page without data, is always open; the data it polls
//!   (`GET /dashboard/data`) needs the token like every other route (see [`super::dashboard`]).
//!
//! A missing or wrong token is `401 unauthorized` (JSON, with `WWW-Authenticate: Bearer`),
//! counted as `meshwire_http_refused_total{reason="unauthorized"}`.

use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use rand::TryRngCore;
use serde_json::json;

use super::errors::error;
use super::serve::HttpMetrics;
use crate::proto::headers::bearer_matches;

/// Name of the token file inside a node's data directory.
pub const TOKEN_FILE: &str = "http-token";

/// Who may use the HTTP API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpAuth {
    /// Whether every request needs the token. `None` (default): required off loopback, optional
    /// on loopback. `Some(false)` off loopback is refused unless
    /// [`HttpAuth::danger_allow_unauthenticated`] is set.
    pub require_token: Option<bool>,
    /// Serve a non-loopback address without requiring the token. Anyone who reaches the port
    /// can then write objects; a warning is logged at every start.
    pub danger_allow_unauthenticated: bool,
    /// Leave `GET /metrics` open without the token (for Prometheus scrapers).
    pub metrics_open: bool,
}

/// Why the HTTP API's authentication could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A non-loopback address without a required token.
    #[error(
        "refusing to serve HTTP on {address} without a token: it is not a loopback address, so \
         anyone who reaches it could write; drop `require_token = false`, or set \
         `danger_allow_unauthenticated` (flag --danger-http-without-token) to serve it anyway"
    )]
    Unauthenticated {
        /// The HTTP address.
        address: SocketAddr,
    },
    /// The token file could not be read or written.
    #[error("HTTP token file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The token file does not hold a token.
    #[error(
        "HTTP token file {} does not hold a token (expected one line of 16 to 256 visible ASCII \
         characters); delete it to generate a new one",
        path.display()
    )]
    BadToken {
        /// The file.
        path: PathBuf,
    },
}

/// The token and the policy that applies to one running HTTP API.
#[derive(Clone)]
pub(crate) struct Gate {
    token: Arc<[u8]>,
    required: bool,
    metrics_open: bool,
    metrics: HttpMetrics,
}

/// A token loaded or created in a data directory, or generated for this run only. Its `Debug`
/// output leaves the secret out.
#[derive(Clone)]
pub struct Token {
    /// The secret.
    pub secret: String,
    /// Where it is kept (`None`: in memory only, for a daemon without a data directory).
    pub path: Option<PathBuf>,
    /// Whether this start created it.
    pub created: bool,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("path", &self.path)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("required", &self.required)
            .field("metrics_open", &self.metrics_open)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// Loads `data_dir/http-token`, or creates it (mode 0600) with a fresh random token.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, AuthError> {
        let path = data_dir.join(TOKEN_FILE);
        let io = |source| AuthError::Io {
            path: path.clone(),
            source,
        };
        match fs::read(&path) {
            Ok(bytes) => {
                let secret = std::str::from_utf8(&bytes)
                    .ok()
                    .map(str::trim)
                    .filter(|text| {
                        (16..=256).contains(&text.len())
                            && text.bytes().all(|b| b.is_ascii_graphic())
                    })
                    .ok_or_else(|| AuthError::BadToken { path: path.clone() })?;
                meshwire::warn_if_readable_by_others(&path, "HTTP token");
                Ok(Self {
                    secret: secret.to_string(),
                    path: Some(path),
                    created: false,
                })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let secret = random_secret().map_err(io)?;
                let mut options = fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                fs::create_dir_all(data_dir).map_err(io)?;
                let mut file = options.open(&path).map_err(io)?;
                file.write_all(format!("{secret}\n").as_bytes())
                    .map_err(io)?;
                file.sync_all().map_err(io)?;
                Ok(Self {
                    secret,
                    path: Some(path),
                    created: true,
                })
            }
            Err(source) => Err(io(source)),
        }
    }

    /// A fresh token kept in memory only.
    pub fn ephemeral() -> Result<Self, AuthError> {
        Ok(Self {
            secret: random_secret().map_err(|source| AuthError::Io {
                path: PathBuf::from("(memory)"),
                source,
            })?,
            path: None,
            created: true,
        })
    }
}

/// 32 bytes from the operating system's generator, in hex.
fn random_secret() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(std::io::Error::other)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl HttpAuth {
    /// Refuses a non-loopback `address` that would be served without a token, unless the
    /// danger setting allows it.
    pub fn check(&self, address: SocketAddr) -> Result<(), AuthError> {
        let unauthenticated = !address.ip().is_loopback()
            && self.require_token == Some(false)
            && !self.danger_allow_unauthenticated;
        if unauthenticated {
            return Err(AuthError::Unauthenticated { address });
        }
        Ok(())
    }

    /// Resolves the policy for `address`: whether the token is required, or an error when a
    /// non-loopback address would be served without one.
    pub(crate) fn gate(
        &self,
        address: SocketAddr,
        token: &Token,
        metrics: HttpMetrics,
    ) -> Result<Gate, AuthError> {
        let loopback = address.ip().is_loopback();
        let required = match (self.require_token, loopback) {
            (Some(required), true) => required,
            (None, true) => false,
            (Some(false), false) | (None, false) if self.danger_allow_unauthenticated => {
                tracing::warn!(
                    %address,
                    "DANGER: serving the HTTP API on a non-loopback address WITHOUT a token; \
                     anyone who reaches this port can read and write objects"
                );
                false
            }
            (Some(false), false) => return Err(AuthError::Unauthenticated { address }),
            (_, false) => true,
        };
        Ok(Gate {
            token: token.secret.as_bytes().into(),
            required,
            metrics_open: self.metrics_open,
            metrics,
        })
    }
}

impl Gate {
    /// Whether every request needs the token.
    pub(crate) fn required(&self) -> bool {
        self.required
    }

    /// The HTTP API's metrics.
    pub(crate) fn metrics(&self) -> &HttpMetrics {
        &self.metrics
    }

    fn admits(&self, request: &Request) -> bool {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes());
        match presented {
            None => {
                let path = request.uri().path();
                !self.required
                    || (self.metrics_open && path == "/metrics")
                    || (request.method() == axum::http::Method::GET
                        && path == super::dashboard::PAGE_PATH)
            }
            Some(value) => bearer_matches(value, &self.token),
        }
    }
}

/// Middleware: passes requests the gate admits, answers the others `401 unauthorized`.
pub(crate) async fn check(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    if gate.admits(&request) {
        return next.run(request).await;
    }
    gate.metrics.refuse("unauthorized");
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "this request needs the node's token: Authorization: Bearer <contents of http-token in \
         the node's data directory>"
            .into(),
        json!({}),
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(auth: HttpAuth, address: &str) -> Result<Gate, AuthError> {
        let token = Token {
            secret: "0123456789abcdef0123".into(),
            path: None,
            created: true,
        };
        auth.gate(address.parse().unwrap(), &token, HttpMetrics::default())
    }

    fn request(path: &str, authorization: Option<&str>) -> Request {
        let mut builder = axum::http::Request::builder().uri(path);
        if let Some(value) = authorization {
            builder = builder.header(header::AUTHORIZATION, value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn required_off_loopback_and_optional_on_it() {
        let open = gate(HttpAuth::default(), "127.0.0.1:1").unwrap();
        assert!(!open.required());
        assert!(open.admits(&request("/status", None)));
        assert!(!open.admits(&request("/status", Some("Bearer wrong"))));
        let closed = gate(HttpAuth::default(), "0.0.0.0:1").unwrap();
        assert!(closed.required());
        assert!(!closed.admits(&request("/status", None)));
        assert!(!closed.admits(&request("/status", Some("Bearer 0123456789abcdef012"))));
        assert!(!closed.admits(&request("/status", Some("0123456789abcdef0123"))));
        assert!(closed.admits(&request("/status", Some("Bearer 0123456789abcdef0123"))));
        assert!(!closed.admits(&request("/metrics", None)));
    }

    #[test]
    fn unauthenticated_non_loopback_needs_the_danger_setting() {
        let off = HttpAuth {
            require_token: Some(false),
            ..HttpAuth::default()
        };
        assert!(matches!(
            gate(off.clone(), "0.0.0.0:1"),
            Err(AuthError::Unauthenticated { .. })
        ));
        let danger = HttpAuth {
            danger_allow_unauthenticated: true,
            ..off
        };
        assert!(!gate(danger, "0.0.0.0:1").unwrap().required());
    }

    #[test]
    fn metrics_may_stay_open() {
        let auth = HttpAuth {
            require_token: Some(true),
            metrics_open: true,
            ..HttpAuth::default()
        };
        let gate = gate(auth, "127.0.0.1:1").unwrap();
        assert!(gate.admits(&request("/metrics", None)));
        assert!(!gate.admits(&request("/status", None)));
    }

    #[test]
    fn the_dashboard_page_is_open_and_its_data_is_not() {
        let gate = gate(HttpAuth::default(), "0.0.0.0:1").unwrap();
        assert!(gate.admits(&request("/dashboard", None)));
        assert!(!gate.admits(&request("/dashboard/data", None)));
        assert!(!gate.admits(&request("/dashboard/", None)));
        assert!(gate.admits(&request(
            "/dashboard/data",
            Some("Bearer 0123456789abcdef0123")
        )));
        let put = axum::http::Request::builder()
            .method("PUT")
            .uri("/dashboard")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(!gate.admits(&put));
    }

    #[test]
    fn debug_output_leaves_the_secret_out() {
        let token = Token::ephemeral().unwrap();
        assert!(!format!("{token:?}").contains(&token.secret));
        let gate = HttpAuth::default()
            .gate("0.0.0.0:1".parse().unwrap(), &token, HttpMetrics::default())
            .unwrap();
        assert!(!format!("{gate:?}").contains(&token.secret));
    }

    #[test]
    fn token_file_is_created_private_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let first = Token::load_or_create(dir.path()).unwrap();
        assert!(first.created);
        assert_eq!(first.secret.len(), 64);
        let second = Token::load_or_create(dir.path()).unwrap();
        assert!(!second.created);
        assert_eq!(first.secret, second.secret);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(TOKEN_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        fs::write(dir.path().join(TOKEN_FILE), "short\n").unwrap();
        assert!(matches!(
            Token::load_or_create(dir.path()),
            Err(AuthError::BadToken { .. })
        ));
    }
}
