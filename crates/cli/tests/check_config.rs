//! `meshwire node --check-config`: what a start would refuse is refused without binding anything.

use std::path::Path;
use std::process::{Command, Output};

mod support;

use support::{peer_id, BIN};

fn check(config: &Path, data_dir: &Path) -> Output {
    Command::new(BIN)
        .args(["node", "--check-config", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

#[test]
fn a_valid_config_prints_one_line_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (id_a, id_b) = (peer_id(&a), peer_id(&b));
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"0.0.0.0:7700\"\nhttp_listen = \"0.0.0.0:7780\"\n\
             peers = [\"{id_a}@10.0.0.1:7700\", \"{id_b}@node-b.cluster.local:7700\"]\n\
             [objects]\nmembers = [\"{id_a}\", \"{id_b}\"]\n"
        ),
    )
    .unwrap();
    let output = check(&config, &a);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with(&format!("config ok: peer {id_a}")),
        "{stdout}"
    );
    // Its own entry is skipped at start; the host name is not looked up.
    assert!(
        stdout.contains("(token required); 1 peers; 2 members"),
        "{stdout}"
    );
    let files: Vec<_> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files,
        ["identity.pem"],
        "only the identity `meshwire id` made"
    );

    // An empty data directory: the identity a start would create is not created.
    let fresh = dir.path().join("fresh");
    let output = check(&config, &fresh);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8(output.stdout)
        .unwrap()
        .contains("new identity"));
    assert!(!fresh.exists());
}

#[test]
fn what_a_start_refuses_is_an_error_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("node.toml");
    let cases = [
        (
            "[objects]\nreplication = 2\nwrite_quorum = 3\n",
            "write_quorum",
        ),
        (
            "[objects]\nmax_object_bytes = 100000000\n",
            "[objects] is invalid",
        ),
        (
            "[transport]\nkeep_alive_ms = 5000\nidle_timeout_ms = 6000\n",
            "three keep-alive intervals",
        ),
        (
            "http_listen = \"0.0.0.0:7780\"\n[http]\nrequire_token = false\n",
            "0.0.0.0:7780",
        ),
        (
            "[http]\nmax_body_bytes_in_flight = 1024\n",
            "[http] is invalid",
        ),
        ("peers = [\"nobody@10.0.0.1:7700\"]\n", "bad peer id"),
        ("listen_port = 7700\n", "unknown field"),
    ];
    for (text, reason) in cases {
        std::fs::write(&config, text).unwrap();
        let output = check(&config, &data);
        assert_eq!(output.status.code(), Some(1), "{text}: {output:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(reason), "{text}: {stderr}");
        assert!(output.stdout.is_empty(), "{text}");
    }
    std::fs::write(&config, "").unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("identity.pem"), "not a key").unwrap();
    let output = check(&config, &data);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("identity.pem") && stderr.contains("not PEM"),
        "{stderr}"
    );
}
