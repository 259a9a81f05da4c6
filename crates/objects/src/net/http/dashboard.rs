//! Serve the live dashboard: one static page, and the JSON it polls, read from the `/metrics` registry.
//!
//! # Design
//!
//! - `GET /dashboard` is one hand-written HTML file (inline CSS and JavaScript) compiled into the
//!   binary. It holds no data and no secret, so it is served without the token; its
//!   `Content-Security-Policy` lets it talk to this node only (`connect-src 'self'`, nothing
//!   else may load).
//! - `GET /dashboard/data` is an API route like any other: the token is required where the node
//!   requires it (`401` JSON otherwise). The page takes the token from its URL fragment
//!   (`/dashboard#token=...`, never sent to a server, then removed from the address bar and kept
//!   in the tab's `sessionStorage`) and sends it as `Authorization: Bearer`.
//! - The data is `/status` plus every sample of the node's metrics registry, encoded in one pass
//!   by the same encoder `/metrics` uses: one source of truth, no second reporter that could race
//!   an update. Rates (bytes/s, reads/s), quantiles (from histogram buckets) and charts are
//!   computed by the page from the deltas between two polls (one per second).

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::net::service::{ObjectService, ObjectServiceError};

/// The page, served at [`PAGE_PATH`].
pub const PAGE: &str = include_str!("dashboard/index.html");

/// Where the page is served (without the token).
pub const PAGE_PATH: &str = "/dashboard";

/// What the page may load and talk to: this node, nothing else.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /dashboard`: the page.
pub(crate) async fn page() -> Response {
    let mut response = axum::response::Html(PAGE).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /dashboard/data`: `{now_unix_seconds, status, metrics: [{name, labels, value}]}`.
pub(crate) async fn data(
    State(service): State<ObjectService>,
) -> Result<Response, ObjectServiceError> {
    let status = super::status_json(&service).await?;
    let text = service.node().metrics().encode_prometheus_text();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let mut response = Json(json!({
        "now_unix_seconds": now,
        "status": status,
        "metrics": samples(&text),
    }))
    .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// One sample of the registry: a series' full name (with `_total`, `_bucket`, ...), its labels
/// and its value (`None` for a value JSON cannot hold: NaN or an infinity).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The series name, as `/metrics` prints it.
    pub name: String,
    /// Its labels.
    pub labels: Map<String, Value>,
    /// Its value.
    pub value: Option<f64>,
}

/// The samples of Prometheus text 0.0.4 as produced by
/// [`meshwire::Metrics::encode_prometheus_text`]; comment lines and lines it cannot read are
/// skipped (the text comes from this process's own encoder, not from a peer).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(sample)
        .collect()
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Map::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once("=\"")?;
            let (value, after) = quoted(after)?;
            labels.insert(key.to_string(), Value::String(value));
            rest = after;
        }
    }
    let value: f64 = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        number => number.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value: value.is_finite().then_some(value),
    })
}

/// The label value at the start of `text` (after its opening quote), unescaped, and what
/// follows its closing quote.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[index + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_names_labels_and_values() {
        let text = "# HELP meshwire_sent_bytes_total Frame bytes\n\
                    # TYPE meshwire_sent_bytes_total counter\n\
                    meshwire_sent_bytes_total 1234\n\
                    meshwire_dropped_total{reason=\"queue_full\"} 2\n\
                    meshwire_x_bucket{le=\"0.5\",peer=\"a\\\"b\\\\c\\nd\"} 7\n\
                    meshwire_x_bucket{le=\"+Inf\"} 9\n\
                    meshwire_gauge -1.5e-3\n\
                    meshwire_inf +Inf\n\
                    broken{le=\"1\" 3\n";
        let samples = samples(text);
        assert_eq!(samples.len(), 6, "{samples:?}");
        assert_eq!(samples[0].name, "meshwire_sent_bytes_total");
        assert_eq!(samples[0].value, Some(1234.0));
        assert!(samples[0].labels.is_empty());
        assert_eq!(samples[1].labels["reason"], "queue_full");
        assert_eq!(samples[2].labels["le"], "0.5");
        assert_eq!(samples[2].labels["peer"], "a\"b\\c\nd");
        assert_eq!(samples[3].labels["le"], "+Inf");
        assert_eq!(samples[4].value, Some(-0.0015));
        assert_eq!(samples[5].value, None);
    }

    #[test]
    fn the_registry_reads_back_whole() {
        let metrics = meshwire::Metrics::new();
        let text = metrics.encode_prometheus_text();
        let series = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .count();
        let samples = samples(&text);
        assert_eq!(samples.len(), series);
        assert!(samples
            .iter()
            .any(|sample| sample.name == "meshwire_sent_bytes_total"));
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for external in ["http://", "https://", "//cdn", "@import", "<link", "src="] {
            assert!(!PAGE.contains(external), "the page mentions {external}");
        }
    }
}
