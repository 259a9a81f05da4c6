//! `meshwire node` processes on loopback: what the operator sees in the logs.

use std::io::BufRead;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod support;

use support::{peer_id, BIN};

fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node(data_dir: &std::path::Path, udp: SocketAddr, peers: &[String]) -> Killed {
    let mut command = Command::new(BIN);
    command
        .arg("node")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg(udp.to_string())
        .arg("--http")
        .arg(free_tcp().to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for peer in peers {
        command.arg("--peer").arg(peer);
    }
    Killed(command.spawn().unwrap())
}

#[test]
fn a_dial_to_the_wrong_key_is_a_warning_with_both_peer_ids() {
    let dir = tempfile::tempdir().unwrap();
    let (real_dir, stale_dir) = (dir.path().join("real"), dir.path().join("stale"));
    let real = peer_id(&real_dir);
    // The operator configured a peer id that is not the key at that address.
    let stale = peer_id(&stale_dir);
    let real_udp = free_udp();
    let _real = node(&real_dir, real_udp, &[]);
    let mut dialer = node(
        &dir.path().join("dialer"),
        free_udp(),
        &[format!("{stale}@{real_udp}")],
    );
    let (lines, received) = mpsc::channel();
    let stderr = dialer.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let warning = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = received
            .recv_timeout(left)
            .expect("a warning about the refused dial within 20 s");
        if line.contains("dial refused") {
            break line;
        }
    };
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains(&format!("expected={stale}")), "{warning}");
    assert!(warning.contains(&format!("actual={real}")), "{warning}");
}

#[test]
fn a_peer_given_by_host_name_is_resolved_and_connected() {
    let dir = tempfile::tempdir().unwrap();
    let (named_dir, dialer_dir) = (dir.path().join("named"), dir.path().join("dialer"));
    let named = peer_id(&named_dir);
    let named_udp = free_udp();
    let _named = node(&named_dir, named_udp, &[]);
    let mut dialer = Command::new(BIN);
    dialer
        .arg("node")
        .arg("--data-dir")
        .arg(&dialer_dir)
        .arg("--listen")
        .arg(free_udp().to_string())
        .arg("--http")
        .arg(free_tcp().to_string())
        .arg("--peer")
        .arg(format!("{named}@localhost:{}", named_udp.port()))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut dialer = Killed(dialer.spawn().unwrap());
    let stderr = dialer.0.stderr.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let connected = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = received
            .recv_timeout(left)
            .expect("a connection to the named peer within 20 s");
        if line.contains("connected") && line.contains(&named) && !line.contains("disconnected") {
            break line;
        }
    };
    assert!(connected.contains(&named_udp.to_string()), "{connected}");
}
