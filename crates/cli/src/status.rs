//! Ask a running node how it is: its peers, gossip and object health, and one line of verdict.
//!
//! # Design
//!
//! `meshwire status` makes one `GET /dashboard/data` (the `/status` body and the metrics registry
//! in one answer, see `meshwire_objects::net::http::dashboard`) with the node's token, prints a
//! table and a verdict, and exits
//!
//! - `0` when the verdict is `healthy` (possibly with warnings on the same line),
//! - `1` when it is `unhealthy: ...` (the rules are in [`verdict`] and docs/node.md),
//! - `2` when the node could not be asked: nothing listens, the connection or the answer timed
//!   out, the token is missing or wrong (`401`), the node is busy (`503`), or what answered is
//!   not a meshwire node. One line on stderr says which.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the whole exchange may take once connected.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read (a node with thousands of peers stays far below it).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// The `meshwire status` arguments.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The node's HTTP address (what `meshwire node --http` serves).
    #[arg(long, default_value = "127.0.0.1:7780")]
    http: String,
    /// File holding the node's HTTP token (default: `http-token` in `meshwire node`'s default
    /// data directory, used only if it exists).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// The token file `meshwire node` writes with its default data directory.
fn default_token_file() -> PathBuf {
    PathBuf::from("meshwire-data").join(meshwire_objects::net::http::auth::TOKEN_FILE)
}

/// Why the node could not be asked (exit 2).
#[derive(Debug, thiserror::Error)]
enum CannotAsk {
    #[error("cannot read the token file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach {address}: {reason}")]
    Unreachable { address: String, reason: String },
    #[error("{address} did not answer within {} s", ANSWER_TIMEOUT.as_secs())]
    Timeout { address: String },
    #[error("{address} refused the token (401 unauthorized); {token}")]
    Unauthorized { address: String, token: String },
    #[error("{address} is busy (503); retry later")]
    Busy { address: String },
    #[error("{address} is not a meshwire node: {reason}")]
    NotMeshwire { address: String, reason: String },
}

/// Runs `meshwire status`; the exit code is the verdict.
pub async fn run(args: StatusArgs) -> ExitCode {
    match ask(&args).await {
        Ok(Answer::Data(data)) => {
            print!("{}", table(&data));
            let verdict = verdict(&data);
            println!("{}", verdict.line());
            if verdict.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Ok(Answer::Failing { status, message }) => {
            println!("unhealthy: the node answered {status}: {message}");
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("meshwire status: {error}");
            ExitCode::from(2)
        }
    }
}

/// What a meshwire node answered.
#[derive(Debug)]
enum Answer {
    /// The dashboard data.
    Data(Value),
    /// A meshwire error answer that says the node itself is failing (a `5xx` but `503 busy`).
    Failing { status: u16, message: String },
}

async fn ask(args: &StatusArgs) -> Result<Answer, CannotAsk> {
    let address = args
        .http
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let (token, token_note) = token(args)?;
    let (status, body) = exchange(&address, token.as_deref()).await?;
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let meshwire_error = json
        .as_ref()
        .and_then(|json| Some((json["error"].as_str()?, json["message"].as_str()?)));
    match (status, meshwire_error) {
        (200, _) => {
            let data = json.ok_or_else(|| CannotAsk::NotMeshwire {
                address: address.clone(),
                reason: format!("GET /dashboard/data answered 200 with {}", describe(&body)),
            })?;
            let looks_right = data["status"]["peer_id"].is_string()
                && data["status"]["peers"].is_array()
                && data["metrics"].is_array()
                && data["now_unix_seconds"].is_number();
            if !looks_right {
                return Err(CannotAsk::NotMeshwire {
                    address,
                    reason: "GET /dashboard/data answered JSON without a node's status and metrics"
                        .into(),
                });
            }
            Ok(Answer::Data(data))
        }
        (401, Some(_)) => Err(CannotAsk::Unauthorized {
            address,
            token: token_note,
        }),
        (503, Some(("busy", _))) => Err(CannotAsk::Busy { address }),
        (500..=599, Some((code, message))) => Ok(Answer::Failing {
            status,
            message: format!("{code}: {message}"),
        }),
        (404, Some(("no_route", _))) => Err(CannotAsk::NotMeshwire {
            address,
            reason: "it has no /dashboard/data (a meshwire node older than this client?)".into(),
        }),
        _ => Err(CannotAsk::NotMeshwire {
            address,
            reason: format!(
                "GET /dashboard/data answered {status} with {}",
                describe(&body)
            ),
        }),
    }
}

/// A short description of a body that is not what a node sends.
fn describe(body: &[u8]) -> String {
    if body.is_empty() {
        return "an empty body".into();
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(60)]);
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("a body that is not a node's JSON ({:?})", text.trim())
}

/// The token to send, and a note on where it came from for a 401 message.
fn token(args: &StatusArgs) -> Result<(Option<String>, String), CannotAsk> {
    let (path, explicit) = match &args.token_file {
        Some(path) => (path.clone(), true),
        None => (default_token_file(), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok((
            Some(text.trim().to_string()),
            format!("the token in {} is not this node's", path.display()),
        )),
        Err(error) if !explicit && error.kind() == std::io::ErrorKind::NotFound => Ok((
            None,
            format!(
                "no token was sent ({} does not exist); pass --token-file",
                path.display()
            ),
        )),
        Err(source) => Err(CannotAsk::TokenFile { path, source }),
    }
}

/// One `GET /dashboard/data` over HTTP/1.1: the status and the body (at most
/// [`MAX_ANSWER_BYTES`]).
async fn exchange(address: &str, token: Option<&str>) -> Result<(u16, Bytes), CannotAsk> {
    let unreachable = |reason: String| CannotAsk::Unreachable {
        address: address.to_string(),
        reason,
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| {
            unreachable(format!(
                "no connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|error| unreachable(error.to_string()))?;
    let not_meshwire = |reason: String| CannotAsk::NotMeshwire {
        address: address.to_string(),
        reason,
    };
    let exchange = async {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| not_meshwire(format!("HTTP handshake failed: {error}")))?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::get("/dashboard/data")
            .header(header::HOST, address)
            .header(header::ACCEPT, "application/json");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|error| unreachable(format!("cannot build the request: {error}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| not_meshwire(format!("no HTTP answer: {error}")))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|error| not_meshwire(format!("cannot read the answer: {error}")))?
            .to_bytes();
        driver.abort();
        Ok((status, body))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| CannotAsk::Timeout {
            address: address.to_string(),
        })?
}

/// The registry samples named `name` whose labels include `labels`.
fn samples<'a>(
    data: &'a Value,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = &'a Value> + 'a {
    data["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |sample| {
            sample["name"] == name
                && labels
                    .iter()
                    .all(|(key, value)| sample["labels"][*key] == *value)
        })
}

/// The sum of the samples named `name` whose labels include `labels`.
fn total(data: &Value, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(data, name, labels)
        .filter_map(|sample| sample["value"].as_f64())
        // A fold from +0.0: `sum` starts at -0.0, which would print as "-0".
        .fold(0.0, |sum, value| sum + value)
}

fn peers(data: &Value) -> &[Value] {
    data["status"]["peers"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// The node's health, by the rules of docs/node.md.
#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    /// What makes the node unhealthy (exit 1).
    pub problems: Vec<String>,
    /// What is wrong but leaves it serving (exit 0).
    pub warnings: Vec<String>,
}

impl Verdict {
    /// The verdict line: `healthy`, `healthy (warning: ...)` or `unhealthy: ...`.
    pub fn line(&self) -> String {
        if !self.problems.is_empty() {
            format!("unhealthy: {}", self.problems.join("; "))
        } else if !self.warnings.is_empty() {
            format!("healthy (warning: {})", self.warnings.join("; "))
        } else {
            "healthy".into()
        }
    }
}

/// Judges a node from its dashboard data.
///
/// Unhealthy:
/// - it has configured peers (`--peer`, `[[peers]]`) and is connected to none of them: it is cut
///   off from its cluster;
/// - fewer object members are reachable (itself and the members it is connected to) than a
///   quorum read or write needs: its object API can only answer `503 quorum_not_reached`.
///
/// Warnings (still healthy): some configured peers are down; quorum reads or writes failed since
/// the node started.
pub fn verdict(data: &Value) -> Verdict {
    let mut verdict = Verdict::default();
    let status = &data["status"];
    let peers = peers(data);
    let configured = peers.iter().filter(|peer| peer["configured"] == true);
    let configured_count = configured.clone().count();
    let configured_up = configured.filter(|peer| peer["connected"] == true).count();
    if configured_count > 0 && configured_up == 0 {
        verdict.problems.push(format!(
            "0 of {configured_count} configured peers connected"
        ));
    } else if configured_up < configured_count {
        verdict.warnings.push(format!(
            "{configured_up} of {configured_count} configured peers connected"
        ));
    }
    let members: Vec<&str> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let me = status["peer_id"].as_str().unwrap_or_default();
    let reachable = members
        .iter()
        .filter(|member| {
            **member == me
                || peers
                    .iter()
                    .any(|peer| peer["peer"] == **member && peer["connected"] == true)
        })
        .count();
    let replication = status["replication"].as_u64().unwrap_or(1) as usize;
    let placed = replication.min(members.len()).max(1);
    let needed = [&status["write_quorum"], &status["read_quorum"]]
        .iter()
        .filter_map(|quorum| quorum.as_u64())
        .map(|quorum| (quorum as usize).min(placed))
        .max()
        .unwrap_or(1);
    if !members.is_empty() && reachable < needed {
        verdict.problems.push(format!(
            "{reachable} of {} object members reachable, a quorum needs {needed}",
            members.len()
        ));
    }
    for (kind, metric) in [
        ("reads", "meshwire_object_reads_total"),
        ("writes", "meshwire_object_writes_total"),
    ] {
        let failed = total(data, metric, &[("outcome", "quorum_not_reached")]);
        if failed > 0.0 {
            verdict
                .warnings
                .push(format!("{failed} quorum {kind} failed since the start"));
        }
    }
    verdict
}

/// The table printed above the verdict.
pub fn table(data: &Value) -> String {
    let status = &data["status"];
    let mut out = String::new();
    let now = data["now_unix_seconds"].as_f64().unwrap_or_default();
    let started = total(data, "meshwire_start_time_seconds", &[]);
    let uptime = if started > 0.0 {
        format!(", up {}", duration(now - started))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "node {} at {}{uptime}",
        status["peer_id"].as_str().unwrap_or("?"),
        status["address"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        out,
        "\n{:<18} {:<22} {:<10} {:>9} {:>7} {:>12} {:>8}",
        "peer", "address", "state", "rtt", "queued", "queued bytes", "dropped"
    );
    for peer in peers(data) {
        let id = peer["peer"].as_str().unwrap_or("?");
        let state = match (peer["connected"] == true, peer["configured"] == true) {
            (true, _) => "connected",
            (false, true) => "redialing",
            (false, false) => "down",
        };
        let rtt = peer["rtt_ms"]
            .as_f64()
            .map_or_else(|| "-".to_string(), |rtt| format!("{rtt:.2} ms"));
        // Per-peer series are labelled with the peer id's first ten characters.
        let dropped = total(
            data,
            "meshwire_peer_dropped_total",
            &[("peer", id.get(..10).unwrap_or(id))],
        );
        let _ = writeln!(
            out,
            "{:<18} {:<22} {:<10} {:>9} {:>7} {:>12} {:>8}",
            id.get(..16).unwrap_or(id),
            peer["address"].as_str().unwrap_or("-"),
            state,
            rtt,
            peer["queued_messages"].as_u64().unwrap_or(0),
            peer["queued_bytes"].as_u64().unwrap_or(0),
            dropped,
        );
    }
    if peers(data).is_empty() {
        let _ = writeln!(out, "(no peers)");
    }
    let _ = writeln!(
        out,
        "\ntraffic  sent {} B, received {} B, dropped {} messages, {} reconnects",
        total(data, "meshwire_sent_bytes_total", &[]),
        total(data, "meshwire_received_bytes_total", &[]),
        total(data, "meshwire_dropped_total", &[]),
        total(data, "meshwire_reconnects_total", &[]),
    );
    let mut classes: Vec<&str> = data["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|sample| {
            sample["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("meshwire_gossip_"))
        })
        .filter_map(|sample| sample["labels"]["class"].as_str())
        .collect();
    classes.sort_unstable();
    classes.dedup();
    let topics_run = samples(data, "meshwire_topic_subscribers", &[])
        .next()
        .is_some();
    if classes.is_empty() {
        let line = if topics_run {
            "gossip   running (topics), nothing carried yet"
        } else {
            "gossip   not running on this node"
        };
        let _ = writeln!(out, "{line}");
    }
    if topics_run {
        let _ = writeln!(
            out,
            "topics   {} subscribers, {} published here, {} received, {} subscribers dropped \
             (lagged), {} refused",
            total(data, "meshwire_topic_subscribers", &[]),
            total(data, "meshwire_topic_published_total", &[]),
            total(data, "meshwire_topic_received_total", &[]),
            total(
                data,
                "meshwire_topic_subscribers_dropped_total",
                &[("reason", "lagged")]
            ),
            total(data, "meshwire_topic_refused_total", &[]),
        );
    }
    for class in classes {
        let count = |kind: &str, direction: &str| {
            total(
                data,
                &format!("meshwire_gossip_{kind}_total"),
                &[("class", class), ("direction", direction)],
            )
        };
        let _ = writeln!(
            out,
            "gossip   class {class}: adverts in {} out {}, pushes in {} out {}, pulls in {} out \
             {}, duplicates {}",
            count("adverts", "received"),
            count("adverts", "sent"),
            count("pushes", "received"),
            count("pushes", "sent"),
            count("pulls", "received"),
            count("pulls", "sent"),
            count("duplicates", "received"),
        );
    }
    let store = &status["store"];
    let _ = writeln!(
        out,
        "objects  {} stored ({} content bytes); R={} W={} read quorum {}; {} members",
        store["objects"].as_u64().unwrap_or(0),
        store["content_bytes"].as_u64().unwrap_or(0),
        status["replication"],
        status["write_quorum"],
        status["read_quorum"],
        status["members"].as_array().map_or(0, Vec::len),
    );
    for (kind, metric) in [
        ("reads ", "meshwire_object_reads_total"),
        ("writes", "meshwire_object_writes_total"),
    ] {
        let all = total(data, metric, &[]);
        let ok = total(data, metric, &[("outcome", "ok")]);
        let quorum = total(data, metric, &[("outcome", "quorum_not_reached")]);
        let _ = writeln!(
            out,
            "         {kind} ok {ok}, quorum failures {quorum}, other {}",
            all - ok - quorum
        );
    }
    out
}

fn duration(seconds: f64) -> String {
    let seconds = seconds.max(0.0) as u64;
    let (days, hours, minutes) = (seconds / 86400, seconds % 86400 / 3600, seconds % 3600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m {}s", seconds % 60),
        (0, _, _) => format!("{hours}h {minutes}m"),
        _ => format!("{days}d {hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn data(peers: Value, members: &[&str], reads_failed: u64) -> Value {
        json!({
            "now_unix_seconds": 100.0,
            "status": {
                "peer_id": "me", "address": "127.0.0.1:1", "peers": peers,
                "members": members, "replication": 3, "write_quorum": 2, "read_quorum": 2,
                "store": {"objects": 0, "content_bytes": 0},
            },
            "metrics": [
                {"name": "meshwire_object_reads_total", "labels": {"outcome": "quorum_not_reached"},
                 "value": reads_failed},
                {"name": "meshwire_start_time_seconds", "labels": {}, "value": 40.0},
            ],
        })
    }

    fn peer(id: &str, connected: bool) -> Value {
        json!({"peer": id, "connected": connected, "configured": true, "rtt_ms": 0.3,
               "queued_messages": 0, "queued_bytes": 0})
    }

    #[test]
    fn a_connected_cluster_is_healthy() {
        let verdict = verdict(&data(
            json!([peer("a", true), peer("b", true)]),
            &["me", "a", "b"],
            0,
        ));
        assert_eq!(verdict.line(), "healthy");
    }

    #[test]
    fn a_cut_off_node_is_unhealthy() {
        let verdict = verdict(&data(
            json!([peer("a", false), peer("b", false)]),
            &["me", "a", "b"],
            0,
        ));
        assert_eq!(
            verdict.line(),
            "unhealthy: 0 of 2 configured peers connected; 1 of 3 object members reachable, a \
             quorum needs 2"
        );
    }

    #[test]
    fn a_missing_peer_or_failed_quorums_only_warn() {
        let verdict = verdict(&data(
            json!([peer("a", true), peer("b", false)]),
            &["me", "a", "b"],
            3,
        ));
        assert!(verdict.problems.is_empty());
        assert_eq!(
            verdict.line(),
            "healthy (warning: 1 of 2 configured peers connected; 3 quorum reads failed since \
             the start)"
        );
    }

    #[test]
    fn a_cluster_of_one_is_healthy_alone() {
        assert_eq!(verdict(&data(json!([]), &["me"], 0)).line(), "healthy");
    }

    #[test]
    fn the_table_lists_peers_and_uptime() {
        let table = table(&data(json!([peer("a", true)]), &["me", "a"], 0));
        assert!(
            table.starts_with("node me at 127.0.0.1:1, up 1m 0s\n"),
            "{table}"
        );
        assert!(table.contains("connected"), "{table}");
        assert!(table.contains("gossip   not running"), "{table}");
        assert!(!table.contains("topics"), "{table}");
    }

    #[test]
    fn the_table_shows_topics_when_the_node_runs_them() {
        let mut data = data(json!([peer("a", true)]), &["me", "a"], 0);
        let metrics = data["metrics"].as_array_mut().unwrap();
        for (name, labels, value) in [
            ("meshwire_topic_subscribers", json!({}), 2.0),
            (
                "meshwire_topic_published_total",
                json!({"topic": "news"}),
                5.0,
            ),
            (
                "meshwire_topic_received_total",
                json!({"topic": "news"}),
                7.0,
            ),
            (
                "meshwire_topic_subscribers_dropped_total",
                json!({"reason": "lagged"}),
                1.0,
            ),
        ] {
            metrics.push(json!({"name": name, "labels": labels, "value": value}));
        }
        let table = table(&data);
        assert!(
            table.contains("gossip   running (topics), nothing carried yet"),
            "{table}"
        );
        assert!(
            table.contains(
                "topics   2 subscribers, 5 published here, 7 received, 1 subscribers dropped \
                 (lagged), 0 refused"
            ),
            "{table}"
        );
    }
}
