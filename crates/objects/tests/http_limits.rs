//! The HTTP API under hostile clients: slow or lying requests are cut off, floods get `503`,
//! the token is checked, every error is JSON, `/metrics` speaks both text formats.
#![cfg(feature = "net")]

use std::net::SocketAddr;
use std::time::Duration;

use meshwire_objects::net::{
    AuthError, Daemon, DaemonError, HttpAuth, HttpLimits, ObjectConfig, ObjectServiceError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Longest a test waits for the server to act on a (short, test-configured) timeout.
const PATIENCE: Duration = Duration::from_secs(10);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// One node that holds every object itself (R = W = 1), so writes succeed alone.
fn single() -> ObjectConfig {
    ObjectConfig {
        replication: 1,
        write_quorum: 1,
        read_quorum: 1,
        ..ObjectConfig::default()
    }
}

async fn start(limits: HttpLimits, auth: HttpAuth) -> Daemon {
    Daemon::builder(single())
        .http(loopback())
        .http_limits(limits)
        .http_auth(auth)
        .bind(loopback(), |_| {})
        .await
        .expect("the daemon starts")
}

fn short_limits() -> HttpLimits {
    HttpLimits {
        header_read_timeout: Duration::from_millis(300),
        body_idle_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }

    fn json(&self) -> serde_json::Value {
        assert!(
            self.header("content-type")
                .is_some_and(|v| v.starts_with("application/json")),
            "not JSON: {}",
            self.head
        );
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn error_code(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Reads until the server closes the connection; `None` if it sent nothing before closing.
async fn read_until_closed(stream: &mut TcpStream) -> Option<Answer> {
    let mut raw = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept the connection open");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Some(Answer { status, head, body })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap_or("0"), 16).unwrap_or(0);
        if size == 0 || raw.len() < end + 2 + size {
            break;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[(end + 4 + size).min(raw.len())..];
    }
    out
}

/// Sends `request` whole on a new connection and reads the answer.
async fn exchange(address: SocketAddr, request: &str) -> Answer {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until_closed(&mut stream).await.expect("an answer")
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n{extra}\r\n")
}

fn refused(daemon: &Daemon, reason: &'static str) -> u64 {
    daemon.http_metrics().unwrap().refused_count(reason)
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed() {
    let daemon = start(short_limits(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    // Half a request head, then nothing.
    let mut slow = TcpStream::connect(address).await.unwrap();
    slow.write_all(b"GET /status HTTP/1.1\r\nHost: node\r\n")
        .await
        .unwrap();
    // A connection that never sends anything.
    let mut idle = TcpStream::connect(address).await.unwrap();
    assert!(read_until_closed(&mut slow).await.is_none());
    assert!(read_until_closed(&mut idle).await.is_none());
    assert!(refused(&daemon, "header_timeout") >= 2);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn lying_content_length_and_unfinished_chunks_get_408() {
    let daemon = start(short_limits(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    for (request, body) in [
        (
            "PUT /objects/liar HTTP/1.1\r\nHost: node\r\nContent-Length: 100\r\n\r\n",
            &b"0123456789"[..],
        ),
        (
            "PUT /objects/chunks HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\r\n",
            &b"5\r\nhello\r\n"[..],
        ),
    ] {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let answer = read_until_closed(&mut stream).await.expect("an answer");
        assert_eq!(answer.status, 408, "{}", answer.head);
        assert_eq!(answer.error_code(), "body_timeout");
        assert_eq!(answer.json()["reason"], "body_idle");
    }
    assert_eq!(refused(&daemon, "body_idle"), 2);
    // Nothing was stored.
    let missing = exchange(address, &get("/objects/liar?local=true", "")).await;
    assert_eq!(missing.status, 404);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_body_slower_than_the_minimum_rate_is_cut_off() {
    let limits = HttpLimits {
        body_idle_timeout: Duration::from_secs(5),
        min_body_bytes_per_sec: 1000,
        min_body_rate_grace: Duration::from_millis(300),
        ..HttpLimits::default()
    };
    let daemon = start(limits, HttpAuth::default()).await;
    let mut stream = TcpStream::connect(daemon.http_address().unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"PUT /objects/trickle HTTP/1.1\r\nHost: node\r\nContent-Length: 10000\r\n\r\n")
        .await
        .unwrap();
    // About 20 bytes/s: never idle for long, far below 1000 bytes/s.
    let trickle = async {
        for _ in 0..100 {
            if stream.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(700), trickle).await;
    let answer = read_until_closed(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 408, "{}", answer.head);
    assert_eq!(answer.json()["reason"], "body_too_slow");
    assert_eq!(refused(&daemon, "body_too_slow"), 1);
    daemon.shutdown().await.unwrap();
}

/// A connection from another loopback address (Linux routes all of 127.0.0.0/8 to lo).
async fn connect_from(source: &str, address: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(address).await.unwrap()
}

#[tokio::test]
async fn a_connection_flood_gets_503_and_others_still_get_answers() {
    let limits = HttpLimits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 8,
        max_connections_per_client: 4,
        retry_after: Duration::from_secs(2),
        ..HttpLimits::default()
    };
    let daemon = start(limits, HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    // One client holds its four connections open without sending a request.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(address).await.unwrap());
    }
    // Give the accept loop time to admit them before the fifth arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let over = exchange(address, &get("/status", "")).await;
    assert_eq!(over.status, 503, "{}", over.head);
    assert_eq!(over.error_code(), "busy");
    assert_eq!(over.header("retry-after").as_deref(), Some("2"));
    // A connection over the cap that sends nothing is answered too, and closed.
    let mut silent = TcpStream::connect(address).await.unwrap();
    let answer = read_until_closed(&mut silent).await.expect("an answer");
    assert_eq!(answer.status, 503);
    assert_eq!(refused(&daemon, "client_connection_limit"), 2);
    // Another client is still served.
    let mut other = connect_from("127.0.0.2", address).await;
    other
        .write_all(get("/status", "").as_bytes())
        .await
        .unwrap();
    let status = read_until_closed(&mut other).await.expect("an answer");
    assert_eq!(status.status, 200, "{}", status.head);
    // Fill the total cap from other addresses: the next connection is refused as well.
    for index in 0..4 {
        held.push(connect_from(&format!("127.0.0.{}", 3 + index), address).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut late = connect_from("127.0.0.9", address).await;
    late.write_all(get("/status", "").as_bytes()).await.unwrap();
    let full = read_until_closed(&mut late).await.expect("an answer");
    assert_eq!(full.status, 503);
    assert_eq!(refused(&daemon, "connection_limit"), 1);
    // Once the flood lets go, everyone is served again.
    drop(held);
    let mut served = false;
    for _ in 0..50 {
        if exchange(address, &get("/status", "")).await.status == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served);
    daemon.shutdown().await.unwrap();
}

/// Silent connections over the cap, more than there are places for busy answers, do not leave
/// the next client closed unanswered: the answers already sent stop lingering and it gets its
/// `503 busy` (`bench/http-flood.sh` found 20 of 20 probes unanswered before).
#[tokio::test]
async fn silent_connections_over_the_cap_leave_the_next_client_its_answer() {
    let limits = HttpLimits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 2,
        max_connections_per_client: 2,
        ..HttpLimits::default()
    };
    let daemon = start(limits, HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let mut held = Vec::new();
    for _ in 0..2 + 2 * serve_places() {
        held.push(TcpStream::connect(address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = exchange(address, &get("/status", "")).await;
    assert_eq!(answer.status, 503, "{}", answer.head);
    assert_eq!(answer.error_code(), "busy");
    assert_eq!(refused(&daemon, "overflow"), 0);
    drop(held);
    daemon.shutdown().await.unwrap();
}

/// Busy answers the node sends at once.
fn serve_places() -> usize {
    meshwire_objects::net::http::serve::OVERFLOW_ANSWERS
}

#[tokio::test]
async fn requests_over_the_concurrency_cap_get_503() {
    let limits = HttpLimits {
        body_idle_timeout: Duration::from_secs(5),
        min_body_bytes_per_sec: 0,
        max_concurrent_requests: 1,
        ..HttpLimits::default()
    };
    let daemon = start(limits, HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    // A PUT whose body is still coming holds the only request slot.
    let mut holder = TcpStream::connect(address).await.unwrap();
    holder
        .write_all(b"PUT /objects/held HTTP/1.1\r\nHost: node\r\nContent-Length: 4\r\n\r\nab")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = exchange(address, &get("/status", "")).await;
    assert_eq!(busy.status, 503);
    assert_eq!(busy.error_code(), "busy");
    assert_eq!(busy.header("retry-after").as_deref(), Some("1"));
    assert_eq!(refused(&daemon, "request_limit"), 1);
    // The held request completes, and the slot is free again.
    holder.write_all(b"cd").await.unwrap();
    let mut raw = [0u8; 12];
    holder.read_exact(&mut raw).await.unwrap();
    assert_eq!(&raw, b"HTTP/1.1 201");
    assert_eq!(exchange(address, &get("/status", "")).await.status, 200);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bodies_over_the_byte_budget_get_503() {
    let limits = HttpLimits {
        body_idle_timeout: Duration::from_secs(5),
        min_body_bytes_per_sec: 0,
        max_body_bytes_in_flight: 1024 * 1024,
        ..HttpLimits::default()
    };
    let objects = ObjectConfig {
        max_object_bytes: 1024 * 1024,
        ..single()
    };
    let daemon = Daemon::builder(objects)
        .http(loopback())
        .http_limits(limits.clone())
        .bind(loopback(), |_| {})
        .await
        .unwrap();
    let address = daemon.http_address().unwrap();
    // A PUT of the whole budget, its body still coming.
    let mut holder = TcpStream::connect(address).await.unwrap();
    holder
        .write_all(b"PUT /objects/big HTTP/1.1\r\nHost: node\r\nContent-Length: 1048576\r\n\r\nab")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let small = "PUT /objects/small HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\
                 Content-Length: 1\r\n\r\nx";
    let busy = exchange(address, small).await;
    assert_eq!(busy.status, 503);
    assert_eq!(busy.error_code(), "busy");
    assert_eq!(refused(&daemon, "body_budget"), 1);
    // Reads hold no budget.
    assert_eq!(exchange(address, &get("/status", "")).await.status, 200);
    drop(holder);
    let mut stored = false;
    for _ in 0..50 {
        if exchange(address, small).await.status == 201 {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stored, "the budget came back when the held PUT ended");
    daemon.shutdown().await.unwrap();

    // A budget below one largest object is refused at start.
    let refused = Daemon::builder(ObjectConfig {
        max_object_bytes: 2 * 1024 * 1024,
        ..single()
    })
    .http(loopback())
    .http_limits(limits)
    .bind(loopback(), |_| {})
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("max_body_bytes_in_flight"),
        "{refused}"
    );
}

#[tokio::test]
async fn the_token_is_required_when_configured() {
    let auth = HttpAuth {
        require_token: Some(true),
        metrics_open: true,
        ..HttpAuth::default()
    };
    let daemon = start(HttpLimits::default(), auth).await;
    let address = daemon.http_address().unwrap();
    assert!(daemon.http_token_required());
    let secret = daemon.http_token().unwrap().secret.clone();
    let missing = exchange(address, &get("/status", "")).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.error_code(), "unauthorized");
    assert_eq!(
        missing.header("www-authenticate").as_deref(),
        Some("Bearer")
    );
    let wrong = exchange(address, &get("/status", "Authorization: Bearer nope\r\n")).await;
    assert_eq!(wrong.status, 401);
    let put =
        "PUT /objects/k HTTP/1.1\r\nHost: node\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx";
    assert_eq!(exchange(address, put).await.status, 401);
    let right = exchange(
        address,
        &get("/status", &format!("Authorization: Bearer {secret}\r\n")),
    )
    .await;
    assert_eq!(right.status, 200);
    // /metrics is left open for scrapers by this configuration.
    assert_eq!(exchange(address, &get("/metrics", "")).await.status, 200);
    assert_eq!(refused(&daemon, "unauthorized"), 3);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_and_stops_accepting() {
    let limits = HttpLimits {
        body_idle_timeout: Duration::from_secs(5),
        min_body_bytes_per_sec: 0,
        shutdown_grace: Duration::from_secs(5),
        ..HttpLimits::default()
    };
    let daemon = start(limits, HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let mut in_flight = TcpStream::connect(address).await.unwrap();
    in_flight
        .write_all(b"PUT /objects/late HTTP/1.1\r\nHost: node\r\nContent-Length: 4\r\n\r\nab")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(daemon.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // No new connection is accepted while the old request finishes.
    assert!(TcpStream::connect(address).await.is_err());
    in_flight.write_all(b"cd").await.unwrap();
    let answer = read_until_closed(&mut in_flight).await.expect("an answer");
    assert_eq!(answer.status, 201, "{}", answer.head);
    tokio::time::timeout(PATIENCE, stopping)
        .await
        .expect("shutdown ends once the request is done")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_non_loopback_address_without_a_token_is_refused_at_start() {
    let auth = HttpAuth {
        require_token: Some(false),
        ..HttpAuth::default()
    };
    let refused = Daemon::builder(single())
        .http("0.0.0.0:0".parse().unwrap())
        .http_auth(auth)
        .bind(loopback(), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            DaemonError::HttpAuth(AuthError::Unauthenticated { .. })
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("not a loopback address"));
}

#[tokio::test]
async fn an_object_limit_over_the_frame_limit_is_refused_at_start() {
    let objects = ObjectConfig {
        max_object_bytes: 16 * 1024 * 1024,
        ..single()
    };
    let refused = Daemon::builder(objects)
        .bind(loopback(), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            DaemonError::Service(ObjectServiceError::ObjectLimit { .. })
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("frame limit"), "{refused}");
}

#[tokio::test]
async fn errors_before_a_handler_are_json_too() {
    let daemon = start(HttpLimits::default(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let not_utf8 = exchange(address, &get("/objects/%FF%FE", "")).await;
    assert_eq!(not_utf8.status, 400);
    assert_eq!(not_utf8.error_code(), "invalid_path");
    let bad_query = exchange(address, &get("/objects/k?local=maybe", "")).await;
    assert_eq!(bad_query.status, 400);
    assert_eq!(bad_query.error_code(), "bad_request");
    let method = exchange(
        address,
        "DELETE /status HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(method.status, 405);
    assert_eq!(method.error_code(), "method_not_allowed");
    assert!(method.header("allow").is_some_and(|v| v.contains("GET")));
    let nowhere = exchange(address, &get("/nowhere", "")).await;
    assert_eq!(nowhere.error_code(), "no_route");
    // Each is counted by its status and code.
    let metrics = daemon.http_metrics().unwrap();
    for (status, code) in [
        (400, "invalid_path"),
        (400, "bad_request"),
        (405, "method_not_allowed"),
        (404, "no_route"),
    ] {
        assert_eq!(metrics.error_count(status, code), 1, "{status} {code}");
    }
    // A chunked body with a chunk that is not hex breaks off: 400 bad_body, not 413, counted.
    let bad_chunk = exchange(
        address,
        "PUT /objects/chunks HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n5\r\nhello\r\nzz\r\n",
    )
    .await;
    assert_eq!(bad_chunk.status, 400);
    assert_eq!(bad_chunk.error_code(), "bad_body");
    assert_eq!(metrics.error_count(400, "bad_body"), 1);
    assert_eq!(metrics.error_count(413, "too_large"), 0);
    daemon.shutdown().await.unwrap();
}

/// Requests hyper cannot parse at all: answered in JSON instead of hyper's empty 400/431, and
/// counted; a keep-alive connection's earlier answers are unchanged.
#[tokio::test]
async fn requests_hyper_cannot_parse_get_json_too() {
    let daemon = start(HttpLimits::default(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let garbage = exchange(address, "\x16\x03\x01 not http at all\r\n\r\n").await;
    assert_eq!(garbage.status, 400);
    assert_eq!(garbage.error_code(), "bad_request");
    let mut raw_path = b"GET /objects/\xff\xfe HTTP/1.1\r\nHost: node\r\n\r\n".to_vec();
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(&raw_path).await.unwrap();
    let answer = read_until_closed(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 400);
    assert_eq!(answer.error_code(), "bad_request");
    // More header lines than hyper reads (100).
    let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
    let too_large = exchange(address, &get("/status", &many)).await;
    assert_eq!(too_large.status, 431);
    assert_eq!(too_large.error_code(), "headers_too_large");
    // A good request, then a bad one on the same connection: the first answer arrives whole.
    raw_path.splice(
        0..0,
        b"GET /status HTTP/1.1\r\nHost: node\r\n\r\n"
            .iter()
            .copied(),
    );
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(&raw_path).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("\"peer_id\""), "{text}");
    assert!(text.contains("HTTP/1.1 400 Bad Request"), "{text}");
    assert!(text.ends_with("}"), "{text}");
    assert!(text.contains("\"error\":\"bad_request\""), "{text}");
    // The 431 is counted under the same reason as the three 400s.
    assert_eq!(refused(&daemon, "bad_request"), 4);
    daemon.shutdown().await.unwrap();
}

/// Content that ends like hyper's empty answer is served unchanged, and the connection goes on.
#[tokio::test]
async fn content_that_looks_like_an_answer_is_served_unchanged() {
    let daemon = start(HttpLimits::default(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let content = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
    let put = format!(
        "PUT /objects/mimic HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{content}",
        content.len()
    );
    assert_eq!(exchange(address, &put).await.status, 201);
    let mut stream = TcpStream::connect(address).await.unwrap();
    let keep = "GET /objects/mimic HTTP/1.1\r\nHost: node\r\n\r\n";
    stream.write_all(keep.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    while !raw.ends_with(content.as_bytes()) {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .expect("the whole first answer")
            .unwrap();
        assert!(read > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buffer[..read]);
    }
    stream
        .write_all(get("/objects/mimic", "").as_bytes())
        .await
        .unwrap();
    let second = read_until_closed(&mut stream)
        .await
        .expect("a second answer");
    assert_eq!(second.status, 200);
    assert_eq!(second.body, content.as_bytes());
    assert_eq!(refused(&daemon, "bad_request"), 0);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn metrics_speak_prometheus_text_and_openmetrics() {
    let daemon = start(HttpLimits::default(), HttpAuth::default()).await;
    let address = daemon.http_address().unwrap();
    let text = exchange(
        address,
        &get("/metrics", "Accept: text/plain; version=0.0.4\r\n"),
    )
    .await;
    assert_eq!(text.status, 200);
    assert_eq!(
        text.header("content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let body = String::from_utf8(text.body).unwrap();
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text 0.0.4 parses");
    let families: std::collections::HashSet<&str> =
        scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    for family in [
        "meshwire_sent_bytes_total",
        "meshwire_received_bytes_total",
        "meshwire_http_connections",
        "meshwire_object_read_requests_total",
        "meshwire_batch_received_bytes_total",
    ] {
        assert!(families.contains(family), "{family} missing: {families:?}");
    }
    assert!(!body.contains("meshwire_bytes_sent"));
    assert!(!body.contains("# EOF"));
    assert!(body.contains("# TYPE meshwire_sent_bytes_total counter"));
    // prometheus-parse reads counters by their TYPE line: the 0.0.4 names must match it.
    let sent = scrape
        .samples
        .iter()
        .find(|s| s.metric == "meshwire_sent_bytes_total")
        .unwrap();
    assert!(matches!(sent.value, prometheus_parse::Value::Counter(_)));

    let open = exchange(
        address,
        &get(
            "/metrics",
            "Accept: application/openmetrics-text; version=1.0.0\r\n",
        ),
    )
    .await;
    assert!(open
        .header("content-type")
        .is_some_and(|v| v.starts_with("application/openmetrics-text")));
    let body = String::from_utf8(open.body).unwrap();
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("# TYPE meshwire_sent_bytes counter"));
    assert!(body.contains("# UNIT meshwire_sent_bytes bytes"));
    assert!(body.contains("# TYPE meshwire_http_refused counter"));
    // Every sample line belongs to a family declared before it.
    let mut declared = std::collections::HashSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            declared.insert(rest.split(' ').next().unwrap().to_string());
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                declared
                    .iter()
                    .any(|family| name.starts_with(family.as_str())),
                "undeclared sample {line}"
            );
        }
    }
    // A real OpenMetrics parser, where one is installed (`.ci/run` installs
    // python3-prometheus-client and then requires it):
    // the reference client's parser rejects any line the format does not allow.
    match openmetrics_families(&body) {
        Some(families) => {
            for family in [
                "meshwire_sent_bytes",
                "meshwire_received_bytes",
                "meshwire_http_connections",
                "meshwire_http_refused",
            ] {
                assert!(families.contains(family), "{family} missing: {families:?}");
            }
        }
        // `.ci/run` sets this once it has installed the parser: then a missing one fails.
        None if std::env::var_os("MESHWIRE_REQUIRE_OPENMETRICS_PARSER").is_some() => panic!(
            "MESHWIRE_REQUIRE_OPENMETRICS_PARSER is set but no python3 with prometheus_client \
             runs here (apt-get install python3-prometheus-client, or pip install \
             prometheus_client)"
        ),
        None => println!(
            "skipped: the OpenMetrics parser check needs python3 with prometheus_client \
             (apt-get install python3-prometheus-client, or pip install prometheus_client)"
        ),
    }
    daemon.shutdown().await.unwrap();
}

/// The metric family names Python's `prometheus_client` OpenMetrics parser reads from `body`, or
/// `None` when no Python with that module is installed. A parse error fails the test.
fn openmetrics_families(body: &str) -> Option<std::collections::HashSet<String>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    const SCRIPT: &str = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n    print(family.name)\n";
    let python = ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import prometheus_client.openmetrics.parser"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })?;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "OpenMetrics parser refused the body: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
    )
}
