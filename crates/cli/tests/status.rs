//! `meshwire status` against real `meshwire node` processes: one exit code per verdict, and one
//! clear line on stderr when the node cannot be asked.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Output;

use support::{free_tcp, free_udp, peer_id, status_command, Cluster};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("meshwire status was killed")
}

/// Asserts a failure to ask: exit 2, nothing on stdout, one line on stderr containing `needle`.
fn assert_cannot_ask(output: &Output, needle: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(code(output), 2, "stderr: {stderr}");
    assert!(output.stdout.is_empty(), "stdout: {}", text(&output.stdout));
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.contains(needle), "stderr: {stderr}");
}

#[test]
fn a_connected_cluster_is_healthy_and_a_cut_off_node_is_not() {
    let lost = tempfile::tempdir().unwrap();
    // A configured peer that never answers: nothing listens on its address.
    let absent = format!("{}@{}", peer_id(lost.path()), free_udp());
    let cluster = Cluster::start(3, &[]);
    let alone = Cluster::start(1, &[absent]);
    for index in 0..3 {
        cluster.wait_connected(index, 2);
    }
    let http = cluster.members[0].http.to_string();
    let token_file = cluster.token_file(0);
    let output = status_command(&[
        "--http",
        &http,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let stdout = text(&output.stdout);
    assert_eq!(code(&output), 0, "{stdout}{}", text(&output.stderr));
    assert_eq!(stdout.lines().last(), Some("healthy"), "{stdout}");
    for member in &cluster.members[1..] {
        assert!(stdout.contains(&member.id[..16]), "{stdout}");
    }
    assert_eq!(stdout.matches(" connected ").count(), 2, "{stdout}");

    let http = alone.members[0].http.to_string();
    let token_file = alone.token_file(0);
    let output = status_command(&[
        "--http",
        &http,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let stdout = text(&output.stdout);
    assert_eq!(code(&output), 1, "{stdout}{}", text(&output.stderr));
    assert_eq!(
        stdout.lines().last(),
        Some("unhealthy: 0 of 1 configured peers connected"),
        "{stdout}"
    );
}

#[test]
fn a_wrong_or_missing_token_cannot_ask() {
    let cluster = Cluster::start(1, &[]);
    let http = cluster.members[0].http.to_string();
    cluster.token_file(0);
    let wrong = cluster.dir.path().join("wrong-token");
    std::fs::write(&wrong, "0123456789abcdef0123456789abcdef\n").unwrap();
    let output = status_command(&["--http", &http, "--token-file", wrong.to_str().unwrap()]);
    assert_cannot_ask(&output, "refused the token (401 unauthorized)");
    // No --token-file, and no default one in the working directory: no token is sent.
    let output = status_command(&["--http", &http]);
    assert_cannot_ask(&output, "no token was sent");
    let missing = cluster.dir.path().join("no-such-file");
    let output = status_command(&["--http", &http, "--token-file", missing.to_str().unwrap()]);
    assert_cannot_ask(&output, "cannot read the token file");
}

#[test]
fn an_unreachable_address_cannot_ask() {
    // Bound and dropped: nothing listens there.
    let address = free_tcp().to_string();
    let output = status_command(&["--http", &address]);
    assert_cannot_ask(&output, &format!("cannot reach {address}"));
}

#[test]
fn a_server_that_is_not_a_node_cannot_ask() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request);
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\
                  Connection: close\r\n\r\nhello world\n",
            )
            .unwrap();
    });
    let output = status_command(&["--http", &address]);
    server.join().unwrap();
    assert_cannot_ask(&output, "is not a meshwire node");
    assert!(text(&output.stderr).contains("hello world"));
}
