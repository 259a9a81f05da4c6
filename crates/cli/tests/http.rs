//! The HTTP API against a real 3-node cluster of `meshwire node` processes on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_meshwire");
const MAX_OBJECT_BYTES: usize = 1024 * 1024;

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "status {} body is not JSON ({error}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// One HTTP/1.1 exchange with `Connection: close`, so the response ends at EOF.
fn http(address: SocketAddr, method: &str, path: &str, body: &[u8]) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    // A server may answer early (413 for a body over the limit) and close before it has read the
    // whole body: the write then fails, or the read ends in a reset after the response arrived.
    // Either way the response is what counts; an error matters only when none arrived.
    let sent = stream.write_all(body);
    let mut raw = Vec::new();
    let received = stream.read_to_end(&mut raw);
    if raw.is_empty() {
        sent?;
        received?;
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Member {
    data_dir: PathBuf,
    id: String,
    udp: SocketAddr,
    http: SocketAddr,
    child: Option<Child>,
}

struct Cluster {
    _dir: tempfile::TempDir,
    config: PathBuf,
    /// The nodes; the last `outsiders` are not members of the others' cluster.
    members: Vec<Member>,
    outsiders: usize,
}

impl Cluster {
    fn start(nodes: usize) -> Self {
        Self::start_with(nodes, 0)
    }

    /// `nodes` nodes, every pair connected; the last `outsiders` of them are members of no one's
    /// cluster but their own.
    fn start_with(nodes: usize, outsiders: usize) -> Self {
        Self::start_configured(nodes, outsiders, "")
    }

    /// As [`Cluster::start_with`], with `objects` (TOML lines) added to the `[objects]` table.
    fn start_configured(nodes: usize, outsiders: usize, objects: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("node.toml");
        std::fs::write(
            &config,
            format!(
                "[objects]\nreplication = 3\nwrite_quorum = 2\nread_quorum = 2\n\
                 max_object_bytes = {MAX_OBJECT_BYTES}\ndeadline_ms = 2000\n{objects}"
            ),
        )
        .unwrap();
        let members = (0..nodes)
            .map(|index| {
                let data_dir = dir.path().join(format!("n{index}"));
                let output = Command::new(BIN)
                    .args(["id", "--data-dir"])
                    .arg(&data_dir)
                    .output()
                    .unwrap();
                assert!(output.status.success());
                Member {
                    data_dir,
                    id: String::from_utf8(output.stdout).unwrap().trim().to_string(),
                    udp: free_udp(),
                    http: free_tcp(),
                    child: None,
                }
            })
            .collect();
        let mut cluster = Self {
            _dir: dir,
            config,
            members,
            outsiders,
        };
        for index in 0..nodes {
            cluster.spawn(index);
        }
        for index in 0..nodes {
            cluster.wait_connected(index, nodes - 1);
        }
        cluster
    }

    fn spawn(&mut self, index: usize) {
        let peers: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(_, m)| format!("{}@{}", m.id, m.udp))
            .collect();
        // Members list the other members; an outsider lists everyone, and is listed by no one.
        let insiders = self.members.len() - self.outsiders;
        let listed: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index && (*other < insiders || index >= insiders))
            .map(|(_, m)| m.id.clone())
            .collect();
        let member = &self.members[index];
        let mut command = Command::new(BIN);
        command
            .arg("node")
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .arg("--listen")
            .arg(member.udp.to_string())
            .arg("--http")
            .arg(member.http.to_string())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for peer in peers {
            command.arg("--peer").arg(peer);
        }
        for id in listed {
            command.arg("--member").arg(id);
        }
        let child = command.spawn().unwrap();
        self.members[index].child = Some(child);
    }

    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn http(&self, index: usize) -> SocketAddr {
        self.members[index].http
    }

    fn wait_connected(&self, index: usize, peers: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(response) = http(self.http(index), "GET", "/status", b"") {
                if response.status == 200 {
                    let status = response.json();
                    let connected = status["peers"]
                        .as_array()
                        .map_or(0, |p| p.iter().filter(|p| p["connected"] == true).count());
                    if connected >= peers {
                        return;
                    }
                }
            }
            assert!(Instant::now() < deadline, "node {index} did not connect");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls a local read on `index` until `accept` holds for its body (or gives up after 10 s).
    fn local_body(&self, index: usize, key: &str) -> Option<Vec<u8>> {
        let response = http(
            self.http(index),
            "GET",
            &format!("/objects/{key}?local=true"),
            b"",
        )
        .ok()?;
        (response.status == 200).then_some(response.body)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

fn wallet(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn assert_error(response: &Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(
        response.status,
        status,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
    assert!(response
        .header("content-type")
        .is_some_and(|v| v.starts_with("application/json")));
    let body = response.json();
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    body
}

#[test]
fn write_read_bad_requests_and_a_stopped_replica() {
    let mut cluster = Cluster::start(3);
    let content = wallet(1, 4096);

    // Write on one node, read through another.
    let put = http(cluster.http(0), "PUT", "/objects/wallet-0001", &content).unwrap();
    assert_eq!(put.status, 201, "{:?}", String::from_utf8_lossy(&put.body));
    let written = put.json();
    assert!(written["acks"].as_u64().unwrap() >= 2, "{written}");
    assert_eq!(written["replicas"], 3);
    let got = http(cluster.http(1), "GET", "/objects/wallet-0001", b"").unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, content);
    assert_eq!(
        got.header("x-meshwire-version"),
        Some(written["version"].to_string().as_str())
    );
    // The write reaches every replica, so a local read on the third node finds it too.
    assert!(eventually(
        || cluster.local_body(2, "wallet-0001") == Some(content.clone())
    ));
    // A rewrite through another node wins over the first version.
    let newer = wallet(2, 4096);
    assert_eq!(
        http(cluster.http(2), "PUT", "/objects/wallet-0001", &newer)
            .unwrap()
            .status,
        201
    );
    assert_eq!(
        http(cluster.http(0), "GET", "/objects/wallet-0001", b"")
            .unwrap()
            .body,
        newer
    );

    // Every bad request gets its documented status and JSON body.
    let bad_key = http(cluster.http(0), "GET", "/objects/bad%20key!", b"").unwrap();
    assert_error(&bad_key, 400, "invalid_key");
    let long_key = format!("/objects/{}", "k".repeat(300));
    assert_error(
        &http(cluster.http(0), "PUT", &long_key, b"x").unwrap(),
        400,
        "invalid_key",
    );
    let too_large = http(
        cluster.http(0),
        "PUT",
        "/objects/big",
        &vec![0u8; MAX_OBJECT_BYTES + 1],
    )
    .unwrap();
    let body = assert_error(&too_large, 413, "too_large");
    assert_eq!(body["max_bytes"], MAX_OBJECT_BYTES);
    assert_error(
        &http(cluster.http(1), "GET", "/objects/missing", b"").unwrap(),
        404,
        "not_found",
    );
    assert_error(
        &http(cluster.http(1), "GET", "/objects/missing?local=true", b"").unwrap(),
        404,
        "not_found",
    );
    assert_error(
        &http(cluster.http(1), "GET", "/nowhere", b"").unwrap(),
        404,
        "no_route",
    );

    // Status, peers and metrics answer.
    let status = http(cluster.http(0), "GET", "/status", b"").unwrap().json();
    assert_eq!(status["store"]["objects"], 1);
    assert_eq!(status["peers"].as_array().unwrap().len(), 2);
    assert_eq!(
        http(cluster.http(0), "GET", "/peers", b"")
            .unwrap()
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let metrics = http(cluster.http(1), "GET", "/metrics", b"").unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("meshwire_object_reads_total"), "{text}");

    // A stopped replica does not block reads or writes at quorum.
    cluster.kill(2);
    let started = Instant::now();
    let got = http(cluster.http(0), "GET", "/objects/wallet-0001", b"").unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, newer);
    let put = http(cluster.http(1), "PUT", "/objects/wallet-0002", &content).unwrap();
    assert_eq!(put.status, 201, "{:?}", String::from_utf8_lossy(&put.body));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "reads and writes waited for the stopped replica's deadline"
    );

    // With two of three replicas gone, the quorum cannot be reached: 503 says what was reached.
    cluster.kill(1);
    let unavailable = http(cluster.http(0), "GET", "/objects/wallet-0001", b"").unwrap();
    let body = assert_error(&unavailable, 503, "quorum_not_reached");
    assert_eq!(body["needed"], 2);
    assert_eq!(body["reached"], 1);
    // A write that cannot reach W says its outcome is unknown: the one replica that stored it keeps it.
    let unconfirmed = http(cluster.http(0), "PUT", "/objects/wallet-0003", &content).unwrap();
    let body = assert_error(&unconfirmed, 503, "quorum_not_reached");
    assert_eq!(body["outcome"], "unknown");
    assert_eq!(
        (body["needed"].as_u64(), body["reached"].as_u64()),
        (Some(2), Some(1))
    );
}

#[test]
fn a_single_node_with_defaults_accepts_a_put_and_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let address = free_tcp();
    let mut child = Command::new(BIN)
        .arg("node")
        .arg("--data-dir")
        .arg(dir.path().join("alone"))
        .arg("--listen")
        .arg(free_udp().to_string())
        .arg("--http")
        .arg(address.to_string())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(
        || http(address, "GET", "/status", b"").is_ok_and(|r| r.status == 200)
    ));
    let put = http(address, "PUT", "/objects/alone", b"one node").unwrap();
    assert_eq!(put.status, 201, "{:?}", String::from_utf8_lossy(&put.body));
    let written = put.json();
    assert_eq!(
        (written["acks"].as_u64(), written["replicas"].as_u64()),
        (Some(1), Some(1))
    );
    let got = http(address, "GET", "/objects/alone", b"").unwrap();
    assert_eq!((got.status, got.body), (200, b"one node".to_vec()));
    let _ = child.kill();
    let mut log = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut log);
    }
    let _ = child.wait();
    assert!(
        log.contains("cluster of one"),
        "the node did not say so: {log}"
    );
}

#[test]
fn an_unlisted_node_cannot_change_any_members_copy() {
    let cluster = Cluster::start_with(4, 1);
    let outsider = 3;
    let owner = wallet(3, 1024);
    let put = http(cluster.http(0), "PUT", "/objects/deed", &owner).unwrap();
    assert_eq!(put.status, 201, "{:?}", String::from_utf8_lossy(&put.body));
    for index in 0..3 {
        assert!(eventually(
            || cluster.local_body(index, "deed") == Some(owner.clone())
        ));
    }
    // The outsider is connected to every member, yet its write reaches none of them.
    let forged = http(
        cluster.http(outsider),
        "PUT",
        "/objects/deed",
        &wallet(4, 1024),
    )
    .unwrap();
    let body = assert_error(&forged, 503, "quorum_not_reached");
    assert_eq!(body["outcome"], "unknown");
    for index in 0..3 {
        assert_eq!(cluster.local_body(index, "deed"), Some(owner.clone()));
        let status = http(cluster.http(index), "GET", "/status", b"")
            .unwrap()
            .json();
        assert_eq!(
            status["members"].as_array().map(Vec::len),
            Some(3),
            "{status}"
        );
        assert_eq!(
            status["peers"].as_array().map(Vec::len),
            Some(3),
            "{status}"
        );
    }
    let refused = (0..3).any(|index| {
        let metrics = http(cluster.http(index), "GET", "/metrics", b"").unwrap();
        String::from_utf8_lossy(&metrics.body)
            .contains("meshwire_object_refused_requests_total{reason=\"not_member\"}")
    });
    assert!(refused, "no member counted the refusal");
    // Reads through members never ask it.
    let got = http(cluster.http(1), "GET", "/objects/deed", b"").unwrap();
    assert_eq!((got.status, got.body), (200, owner));
}

#[test]
fn a_node_killed_mid_put_leaves_old_or_new_never_torn() {
    let mut cluster = Cluster::start(3);
    let old = wallet(7, 4096);
    assert_eq!(
        http(cluster.http(0), "PUT", "/objects/ledger", &old)
            .unwrap()
            .status,
        201
    );
    for index in 0..3 {
        assert!(eventually(
            || cluster.local_body(index, "ledger") == Some(old.clone())
        ));
    }
    // Every whole version ever written; a replica must always hold one of them.
    let mut written = vec![old.clone()];
    // Kill a replica at different moments of a large PUT coordinated by node 0, then the
    // coordinator itself.
    for (round, delay_ms) in [0u64, 5, 20, 60, 10].into_iter().enumerate() {
        let new = wallet(100 + round as u8, MAX_OBJECT_BYTES);
        written.push(new.clone());
        let target = if round == 4 { 0 } else { 1 + round % 2 };
        let address = cluster.http(0);
        let body = new.clone();
        let put = std::thread::spawn(move || http(address, "PUT", "/objects/ledger", &body));
        std::thread::sleep(Duration::from_millis(delay_ms));
        cluster.kill(target);
        let _ = put.join().unwrap();
        cluster.spawn(target);
        for index in 0..3 {
            cluster.wait_connected(index, 2);
        }
        for index in 0..3 {
            let body = cluster
                .local_body(index, "ledger")
                .expect("every replica still holds a copy");
            assert!(
                written.contains(&body),
                "round {round}: node {index} holds a torn object of {} bytes",
                body.len()
            );
        }
        // Whatever survived, a quorum read returns one whole version.
        let read = http(cluster.http(target), "GET", "/objects/ledger", b"").unwrap();
        assert_eq!(read.status, 200);
        assert!(written.contains(&read.body), "round {round}: torn read");
    }
}

/// The counter `name` (a whole line prefix, labels included) in `index`'s metrics; 0 when absent.
fn counter(cluster: &Cluster, index: usize, name: &str) -> u64 {
    let metrics = http(cluster.http(index), "GET", "/metrics", b"").unwrap();
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[test]
fn writes_acknowledged_while_replicas_are_killed_survive_and_replicas_converge_without_reads() {
    const WRITERS: usize = 2;
    const WRITES_PER_WRITER: usize = 500;
    let cluster = Cluster::start_configured(3, 0, "anti_entropy_interval_ms = 300\n");
    let http_of: Vec<SocketAddr> = (0..3).map(|index| cluster.http(index)).collect();
    let cluster = std::sync::Arc::new(std::sync::Mutex::new(cluster));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // SIGKILL one node after another while the writes run, restarting each after 400 ms.
    let chaos = {
        let cluster = cluster.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut kills = 0;
            let mut victim = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                cluster.lock().unwrap().kill(victim);
                kills += 1;
                std::thread::sleep(Duration::from_millis(400));
                cluster.lock().unwrap().spawn(victim);
                victim = (victim + 1) % 3;
            }
            kills
        })
    };
    // Each write is a distinct key through a different node; a node that is down is skipped.
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let http_of = http_of.clone();
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for i in 0..WRITES_PER_WRITER {
                    let key = format!("w{writer}-{i:04}");
                    let content = [key.as_bytes(), &wallet(i as u8, 1024)].concat();
                    for attempt in 0..3 {
                        let node = (i + writer + attempt) % 3;
                        match http(http_of[node], "PUT", &format!("/objects/{key}"), &content) {
                            Ok(put) if put.status == 201 => {
                                acknowledged.push((key.clone(), content.clone()));
                                break;
                            }
                            // Answered (503: outcome unknown), or cut mid-request: not retried.
                            Ok(_) => break,
                            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                            }
                            Err(_) => break,
                        }
                    }
                }
                acknowledged
            })
        })
        .collect();
    let acknowledged: Vec<(String, Vec<u8>)> = writers
        .into_iter()
        .flat_map(|writer| writer.join().unwrap())
        .collect();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = chaos.join().unwrap();
    let cluster = std::sync::Arc::into_inner(cluster)
        .unwrap()
        .into_inner()
        .unwrap();
    eprintln!(
        "{} of {} writes got 201 during {kills} SIGKILLs",
        acknowledged.len(),
        WRITERS * WRITES_PER_WRITER
    );
    assert!(kills >= 2, "only {kills} kills happened during the writes");
    assert!(
        acknowledged.len() >= WRITERS * WRITES_PER_WRITER / 2,
        "only {} of {} writes got 201",
        acknowledged.len(),
        WRITERS * WRITES_PER_WRITER
    );
    for index in 0..3 {
        cluster.wait_connected(index, 2);
    }
    // Anti-entropy alone brings every replica's own copy of every acknowledged write (all three
    // nodes are replicas of every key): no read has run yet.
    let deadline = Instant::now() + Duration::from_secs(40);
    for index in 0..3 {
        let mut missing: Vec<&(String, Vec<u8>)> = acknowledged.iter().collect();
        while !missing.is_empty() {
            missing
                .retain(|(key, content)| cluster.local_body(index, key).as_ref() != Some(content));
            assert!(
                Instant::now() < deadline,
                "node {index} lacks {} acknowledged writes, e.g. {:?}",
                missing.len(),
                missing.first().map(|(key, _)| key)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for index in 0..3 {
        assert_eq!(
            counter(&cluster, index, "meshwire_object_read_repairs_total"),
            0,
            "node {index}: a read repaired something, so convergence was not anti-entropy's"
        );
    }
    // And every acknowledged write reads back, with its content, through every node.
    for (key, content) in &acknowledged {
        for index in 0..3 {
            let got = http(cluster.http(index), "GET", &format!("/objects/{key}"), b"").unwrap();
            assert_eq!(got.status, 200, "node {index}, {key}");
            assert_eq!(&got.body, content, "node {index}, {key}");
        }
    }
}

/// Runs `meshwire node` with `config` on fresh loopback ports; stdout is piped.
fn node_with(config: &str, http: &str, dir: &std::path::Path) -> Child {
    let path = dir.join("node.toml");
    std::fs::write(&path, config).unwrap();
    Command::new(BIN)
        .arg("node")
        .arg("--config")
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--listen")
        .arg(free_udp().to_string())
        .arg("--http")
        .arg(http)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (at most 20 s) for `child` to exit.
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the node did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn with_header(address: SocketAddr, path: &str, header: &str) -> Response {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{header}\r\n");
    raw_exchange(address, request.as_bytes()).expect("an answer")
}

/// Sends `request` as it is on a new connection and reads until the node closes it (at most
/// 15 s): the answer, or `None` when the node closed it without one.
fn raw_exchange(address: SocketAddr, request: &[u8]) -> Option<Response> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    if raw.is_empty() {
        return None;
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    Some(Response {
        status: head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        headers: head
            .lines()
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
        body: raw[split + 4..].to_vec(),
    })
}

#[test]
fn the_token_is_printed_and_required_and_sigterm_stops_the_node_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let http_address = free_tcp();
    let mut child = node_with(
        "[http]\nrequire_token = true\n",
        &http_address.to_string(),
        dir.path(),
    );
    // The first line on stdout names the token and its file.
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let token_path = dir.path().join("data").join("http-token");
    let token = std::fs::read_to_string(&token_path).unwrap();
    let token = token.trim();
    assert!(line.contains(token), "{line}");
    assert!(line.contains(&token_path.display().to_string()), "{line}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let unauthorized = with_header(http_address, "/status", "");
    assert_error(&unauthorized, 401, "unauthorized");
    let wrong = with_header(http_address, "/status", "Authorization: Bearer wrong\r\n");
    assert_error(&wrong, 401, "unauthorized");
    let status = with_header(
        http_address,
        "/status",
        &format!("Authorization: Bearer {token}\r\n"),
    );
    assert_eq!(status.status, 200);

    stop_with(&mut child, "TERM");
}

#[test]
fn a_non_loopback_http_address_without_a_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = node_with("[http]\nrequire_token = false\n", "0.0.0.0:0", dir.path());
    let exit = wait_exit(&mut child);
    assert!(!exit.success());
    let stderr = stderr_of(&mut child);
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    assert!(stderr.contains("--danger-http-without-token"), "{stderr}");
}

/// The HTTP limits on a real node process: a half-sent head is cut off unanswered, a body that
/// stops short of its Content-Length gets `408 body_timeout`, and a connection past the
/// per-client cap gets `503 busy` with `Retry-After`; the node then serves as before.
#[test]
fn a_node_process_cuts_off_slow_clients_and_answers_busy_past_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let http_address = free_tcp();
    let config = "[http]\nheader_read_timeout_ms = 500\nbody_idle_timeout_ms = 500\n\
                  max_connections_per_client = 4\n";
    let mut child = node_with(config, &http_address.to_string(), dir.path());
    wait_serving(http_address);
    let half_head = raw_exchange(http_address, b"GET /status HTTP/1.1\r\nHost: node\r\n");
    assert!(half_head.is_none(), "a half-sent head was answered");
    let liar = raw_exchange(
        http_address,
        b"PUT /objects/liar HTTP/1.1\r\nHost: node\r\nContent-Length: 100\r\n\r\n0123456789",
    )
    .expect("an answer to a body that stopped");
    assert_error(&liar, 408, "body_timeout");
    // The connections above are gone (their slots freed a moment after they close). Then four
    // idle connections fill this address's share; the fifth is answered busy.
    std::thread::sleep(Duration::from_millis(200));
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect_timeout(&http_address, Duration::from_secs(2)).unwrap())
        .collect();
    let busy = raw_exchange(http_address, b"").expect("a busy answer");
    assert_error(&busy, 503, "busy");
    assert!(busy.header("retry-after").is_some());
    drop(held);
    assert!(eventually(|| with_header(http_address, "/status", "")
        .status
        == 200));
    stop_with(&mut child, "TERM");
}

/// With the danger setting the node serves a non-loopback address without a token, and says so
/// loudly: a warning in its log and "NOT required" where it prints the token.
#[test]
fn the_danger_setting_serves_without_a_token_and_warns() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp().port();
    let config = "[http]\nrequire_token = false\ndanger_allow_unauthenticated = true\n";
    let mut child = node_with(config, &format!("0.0.0.0:{port}"), dir.path());
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("HTTP token") {
        line.clear();
        let read = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(read > 0, "the node printed no token line");
    }
    assert!(line.contains("NOT required"), "{line}");
    // Reached over loopback only (the test's traffic stays on this machine).
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_serving(address);
    assert_eq!(with_header(address, "/status", "").status, 200);
    stop_with(&mut child, "TERM");
    let stderr = stderr_of(&mut child);
    assert!(stderr.contains("DANGER"), "{stderr}");
}

/// Opens `GET /topics/{topic}/events` and returns the connection once the stream has started.
fn subscribe(address: SocketAddr, topic: &str) -> TcpStream {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET /topics/{topic}/events HTTP/1.1\r\nHost: {address}\r\n\r\n"
    )
    .unwrap();
    let head = read_until(&mut stream, b"\r\n\r\n");
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    stream
}

/// Reads from `stream` until what was read contains `needle` (panics on EOF or a 20 s silence).
fn read_until(stream: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    while !raw.windows(needle.len()).any(|w| w == needle) {
        let read = stream.read(&mut buffer).expect("the stream goes on");
        assert!(
            read > 0,
            "the stream ended: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buffer[..read]);
    }
    raw
}

#[test]
fn a_topic_from_the_config_file_carries_a_publish_to_every_node() {
    let cluster = Cluster::start_configured(
        3,
        0,
        "[gossip]\nsubscriber_buffer = 8\n[gossip.topics.news]\nmax_bytes = 256\n",
    );
    let mut subscribers: Vec<TcpStream> = (0..3)
        .map(|index| subscribe(cluster.http(index), "news"))
        .collect();
    let published = http(cluster.http(0), "POST", "/topics/news", b"hello-cli").unwrap();
    assert_eq!(published.status, 202);
    let id = published.json()["id"].as_str().unwrap().to_string();
    for subscriber in &mut subscribers {
        let events = read_until(subscriber, b"\"text\":\"hello-cli\"");
        let events = String::from_utf8_lossy(&events).to_string();
        assert!(events.contains(&format!("id: {id}")), "{events}");
        assert!(events.contains(&format!("\"origin\":\"{}\"", cluster.members[0].id)));
    }
    // The file lists its topics: the default topic is not among them.
    assert_error(
        &http(cluster.http(1), "POST", "/topics/default", b"x").unwrap(),
        404,
        "unknown_topic",
    );
    let oversize = http(cluster.http(1), "POST", "/topics/news", &[b'x'; 257]).unwrap();
    assert_eq!(assert_error(&oversize, 413, "too_large")["max_bytes"], 256);
    assert_error(
        &http(cluster.http(2), "POST", "/topics/bad%2Fname", b"x").unwrap(),
        400,
        "invalid_topic",
    );
}

/// Everything `child` wrote to stderr (read to its end: call once it has exited).
fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

/// Sends `signal` (a `kill` name such as `INT`) to `child` and waits for a clean exit.
fn stop_with(child: &mut Child, signal: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let exit = wait_exit(child);
    assert!(exit.success(), "SIG{signal} ended the node with {exit:?}");
}

/// Waits (at most 20 s) until the node at `address` answers `/status`.
fn wait_serving(address: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err()
        || with_header(address, "/status", "").status != 200
    {
        assert!(Instant::now() < deadline, "the node did not start serving");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGINT stops the node as cleanly as SIGTERM; a secret file others can read is a warning at
/// the next start, naming the file.
#[cfg(unix)]
#[test]
fn sigint_stops_the_node_cleanly_and_a_readable_token_is_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let http_address = free_tcp();
    let mut child = node_with("", &http_address.to_string(), dir.path());
    wait_serving(http_address);
    stop_with(&mut child, "INT");
    let token_path = dir.path().join("data").join("http-token");
    std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = node_with("", &http_address.to_string(), dir.path());
    wait_serving(http_address);
    stop_with(&mut child, "INT");
    let stderr = stderr_of(&mut child);
    assert!(
        stderr.contains("readable by other users") && stderr.contains("http-token"),
        "{stderr}"
    );
}
