//! Pure parsers for the HTTP request headers the object API reads from clients: `Accept` for
//! `/metrics` and `Authorization` for the bearer token. Sans-IO, so the fuzz targets (which build
//! without the `net` feature) can call exactly what the server calls.

use subtle::ConstantTimeEq;

/// Whether `accept` ranks `application/openmetrics-text` above `text/plain` (and above zero).
/// Without either, the answer is Prometheus text, what scrapers and `curl` understand.
pub fn prefers_openmetrics(accept: &str) -> bool {
    let mut openmetrics = 0.0f32;
    let mut text = 0.0f32;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let quality = parts
            .filter_map(|param| param.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
            .and_then(|(_, value)| value.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" | "text/*" | "*/*" => text = text.max(quality),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics > text
}

/// Whether an `Authorization` header value is `Bearer <token>` with exactly `token`, compared in
/// constant time (the time taken does not tell how many leading bytes were right).
pub fn bearer_matches(authorization: &[u8], token: &[u8]) -> bool {
    authorization
        .strip_prefix(b"Bearer ")
        .is_some_and(|presented| bool::from(presented.ct_eq(token)))
}

#[cfg(test)]
mod tests {
    use super::{bearer_matches, prefers_openmetrics};

    #[test]
    fn accept_chooses_the_metrics_format() {
        assert!(!prefers_openmetrics(""));
        assert!(!prefers_openmetrics("text/plain; version=0.0.4"));
        assert!(!prefers_openmetrics("*/*"));
        assert!(prefers_openmetrics(
            "application/openmetrics-text; version=1.0.0"
        ));
        // What Prometheus 2.x sends: OpenMetrics first.
        assert!(prefers_openmetrics(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
             version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(!prefers_openmetrics(
            "application/openmetrics-text;q=0.2, text/plain;q=0.9"
        ));
        assert!(!prefers_openmetrics("application/openmetrics-text;q=0"));
    }

    #[test]
    fn bearer_needs_the_scheme_and_the_exact_token() {
        assert!(bearer_matches(b"Bearer s3cret", b"s3cret"));
        assert!(!bearer_matches(b"Bearer s3cre", b"s3cret"));
        assert!(!bearer_matches(b"Bearer s3crett", b"s3cret"));
        assert!(!bearer_matches(b"bearer s3cret", b"s3cret"));
        assert!(!bearer_matches(b"s3cret", b"s3cret"));
        assert!(!bearer_matches(b"Bearer ", b"s3cret"));
    }
}
