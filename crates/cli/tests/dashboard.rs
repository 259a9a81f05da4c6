//! The live dashboard of a real cluster of `meshwire node` processes, rendered by headless
//! Chromium: the page shows what `/status` says, and its byte counter moves.
//!
//! Without `/usr/bin/chromium` (Debian's `chromium` package) the browser test prints
//! `skipped: ...` and passes; the HTTP checks run everywhere.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{get, put, Cluster};

const CHROMIUM: &str = "/usr/bin/chromium";

/// The page's DOM after Chromium ran it for `budget_ms` of virtual time (each poll's fetch still
/// takes real time; virtual time only skips the waits between polls).
fn dump_dom(profile: &Path, url: &str, budget_ms: u32) -> String {
    let output = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// The text of the element with `id` in `dom` (the page fills these with plain text).
fn element_text<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let after = &dom[start..];
    let text = &after[after.find('>')? + 1..];
    Some(&text[..text.find('<')?])
}

/// The `data-value` attribute of the element with `id` in `dom`.
fn element_value(dom: &str, id: &str) -> Option<u64> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let value = &tag[tag.find("data-value=\"")? + "data-value=\"".len()..];
    value[..value.find('"')?].parse().ok()
}

#[test]
fn the_page_is_open_and_its_data_needs_the_token() {
    let cluster = Cluster::start(1, &[]);
    let token = cluster.token(0);
    let http = cluster.members[0].http;
    let (status, page) = get(http, "/dashboard", None).unwrap();
    assert_eq!(status, 200);
    let page = String::from_utf8(page).unwrap();
    assert!(page.contains("<title>meshwire node</title>"));
    assert!(!page.contains(&token));
    let (status, body) = get(http, "/dashboard/data", None).unwrap();
    assert_eq!(status, 401);
    let refusal: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal["error"], "unauthorized");
    let (status, body) = get(http, "/dashboard/data", Some(&token)).unwrap();
    assert_eq!(status, 200);
    let data: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        data["status"]["peer_id"].as_str(),
        Some(cluster.members[0].id.as_str())
    );
    let started = data["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|sample| sample["name"] == "meshwire_start_time_seconds")
        .and_then(|sample| sample["value"].as_f64())
        .expect("the start time is in the data");
    assert!(started <= data["now_unix_seconds"].as_f64().unwrap());
}

#[test]
fn chromium_renders_live_data_that_matches_status() {
    if !Path::new(CHROMIUM).exists() {
        println!("skipped: {CHROMIUM} is absent (apt-get install chromium to run this test)");
        return;
    }
    let cluster = Cluster::start(3, &[]);
    for index in 0..3 {
        cluster.wait_connected(index, 2);
    }
    let token = cluster.token(0);
    let http = cluster.members[0].http;
    let url = format!("http://{http}/dashboard#token={token}");
    let profiles = tempfile::tempdir().unwrap();

    let first = dump_dom(&profiles.path().join("first"), &url, 3000);
    assert!(first.contains("data-state=\"live\""), "{first}");
    let status = cluster.status(0);
    let peers = status["peers"].as_array().unwrap();
    let connected = peers
        .iter()
        .filter(|peer| peer["connected"] == true)
        .count();
    assert_eq!(connected, 2);
    assert_eq!(
        element_text(&first, "peers-connected"),
        Some("2"),
        "{first}"
    );
    assert_eq!(element_text(&first, "peers-known"), Some("2"));
    assert_eq!(element_text(&first, "peer-id"), status["peer_id"].as_str());
    for peer in peers {
        let short = &peer["peer"].as_str().unwrap()[..16];
        assert!(first.contains(short), "peer {short} is not on the page");
    }
    // Frame bytes of messages: an idle mesh may not have sent any yet.
    let sent_before = element_value(&first, "bytes-sent").expect("a sent-bytes counter");

    // Traffic between the two looks: an object written through this node goes to its replicas.
    let content = vec![7u8; 256 * 1024];
    assert_eq!(put(http, "/objects/dashboard-test", &token, &content), 201);
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        let dom = dump_dom(&profiles.path().join("second"), &url, 3000);
        if element_value(&dom, "bytes-sent").is_some_and(|sent| sent >= sent_before + 256 * 1024) {
            break dom;
        }
        assert!(
            Instant::now() < deadline,
            "the sent bytes did not move: {dom}"
        );
    };
    assert!(second.contains("data-state=\"live\""));
    assert_eq!(element_text(&second, "writes-ok"), Some("1"), "{second}");
}
