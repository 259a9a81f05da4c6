//! `meshwire node` processes on loopback for the CLI tests (the dashboard and `meshwire status` ones
//! start clusters whose nodes all require the HTTP token, so every check also checks the token path).

#![allow(dead_code)] // Each test file uses its own part of the helpers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_meshwire");

pub fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

pub fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The peer id of the identity in `data_dir` (created if there is none).
pub fn peer_id(data_dir: &Path) -> String {
    let output = Command::new(BIN)
        .args(["id", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// One HTTP/1.1 GET with `Connection: close`: the status and the body.
pub fn get(
    address: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let authorization = token.map_or_else(String::new, |token| {
        format!("Authorization: Bearer {token}\r\n")
    });
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let status = String::from_utf8_lossy(&raw[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    Ok((status, raw[split + 4..].to_vec()))
}

/// One HTTP/1.1 PUT with `Connection: close`: the status.
pub fn put(address: SocketAddr, path: &str, token: &str, body: &[u8]) -> u16 {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

pub struct Member {
    pub data_dir: PathBuf,
    pub id: String,
    pub udp: SocketAddr,
    pub http: SocketAddr,
    child: Child,
}

/// Nodes that are members of one object cluster, every pair configured as peers, each requiring
/// its HTTP token.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<Member>,
}

impl Cluster {
    /// `nodes` nodes; each also dials the `extra_peers` (`ID@ADDRESS`).
    pub fn start(nodes: usize, extra_peers: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("node.toml");
        std::fs::write(
            &config,
            "[objects]\nreplication = 3\nwrite_quorum = 2\nread_quorum = 2\n\
             [http]\nrequire_token = true\n",
        )
        .unwrap();
        let planned: Vec<(PathBuf, String, SocketAddr, SocketAddr)> = (0..nodes)
            .map(|index| {
                let data_dir = dir.path().join(format!("n{index}"));
                let id = peer_id(&data_dir);
                (data_dir, id, free_udp(), free_tcp())
            })
            .collect();
        let members = planned
            .iter()
            .enumerate()
            .map(|(index, (data_dir, id, udp, http))| {
                let mut command = Command::new(BIN);
                command
                    .arg("node")
                    .arg("--config")
                    .arg(&config)
                    .arg("--data-dir")
                    .arg(data_dir)
                    .arg("--listen")
                    .arg(udp.to_string())
                    .arg("--http")
                    .arg(http.to_string())
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(dir.path().join(format!("n{index}.log"))).unwrap(),
                    );
                for (other, (_, other_id, other_udp, _)) in planned.iter().enumerate() {
                    if other != index {
                        command.arg("--peer").arg(format!("{other_id}@{other_udp}"));
                        command.arg("--member").arg(other_id);
                    }
                }
                for peer in extra_peers {
                    command.arg("--peer").arg(peer);
                }
                Member {
                    data_dir: data_dir.clone(),
                    id: id.clone(),
                    udp: *udp,
                    http: *http,
                    child: command.spawn().unwrap(),
                }
            })
            .collect();
        Self { dir, members }
    }

    /// Node `index`'s token file, once the node has written it and answers with it.
    pub fn token_file(&self, index: usize) -> PathBuf {
        let path = self.members[index].data_dir.join("http-token");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(token) = std::fs::read_to_string(&path) {
                if let Ok((200, _)) = get(self.members[index].http, "/status", Some(token.trim())) {
                    return path;
                }
            }
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(self.dir.path().join(format!("n{index}.log")))
                    .unwrap_or_default();
                panic!("node {index} did not start within 60 s; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `index`'s resident set size (`VmRSS`), in bytes.
    pub fn rss_bytes(&self, index: usize) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.members[index].child.id()))
                .unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse().ok())
            .unwrap();
        kib * 1024
    }

    /// Node `index`'s token.
    pub fn token(&self, index: usize) -> String {
        std::fs::read_to_string(self.token_file(index))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Node `index`'s `/status`.
    pub fn status(&self, index: usize) -> serde_json::Value {
        let (status, body) = get(
            self.members[index].http,
            "/status",
            Some(&self.token(index)),
        )
        .unwrap();
        assert_eq!(status, 200);
        serde_json::from_slice(&body).unwrap()
    }

    /// Waits until node `index` is connected to `peers` peers.
    pub fn wait_connected(&self, index: usize, peers: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let connected = self.status(index)["peers"]
                .as_array()
                .map_or(0, |p| p.iter().filter(|p| p["connected"] == true).count());
            if connected >= peers {
                return;
            }
            assert!(Instant::now() < deadline, "node {index} did not connect");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.child.kill();
            let _ = member.child.wait();
        }
    }
}

/// Runs `meshwire status` with `args`, in an empty directory (no default token file).
pub fn status_command(args: &[&str]) -> Output {
    let cwd = tempfile::tempdir().unwrap();
    Command::new(BIN)
        .arg("status")
        .args(args)
        .current_dir(cwd.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}
