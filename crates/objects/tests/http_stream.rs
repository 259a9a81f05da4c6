//! `GET` streams an object from its content file: slow readers of many large objects hold a chunk
//! each in the node's heap, not an object each, every reader gets exactly the content, and a
//! content file damaged on disk cuts its response short of its `Content-Length`. `PUT` streams a
//! large body into its content file: slow writers hold a piece each, not their bodies so far.
//!
//! The daemon runs on its own runtime, whose threads (the store's blocking pool included) are the
//! counting allocator's tracked context, so the heap measured is the node's alone.
#![cfg(feature = "net")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshwire_alloc_count::{
    mark_thread, reset_tracked_peak, track_marked_threads, tracked_live_and_peak, CountingAllocator,
};
use meshwire_objects::net::{Daemon, ObjectConfig};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Objects and slow readers (one each).
const OBJECTS: usize = 8;
/// Each object's size: above the object cache's largest entry (a quarter of half the store's
/// budget below), so no read is served from a shared cached copy, and above what the socket
/// buffers between node and reader take (Linux lets a sender's buffer grow to 4 MiB).
const OBJECT_BYTES: usize = 8 << 20;
/// The store's memory budget.
const STORE_MEMORY: usize = 2 << 20;
/// What each slow reader reads before it stalls.
const FIRST_READ: usize = 16 << 10;

/// The tests' nodes share the tracked context: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

fn content(index: usize) -> Vec<u8> {
    (0..OBJECT_BYTES)
        .map(|i| (i as u8).wrapping_mul(index as u8 | 1) ^ (i >> 10) as u8)
        .collect()
}

/// A node with a store on disk and the HTTP API, on a thread of its own; stops when dropped.
struct Node {
    http: SocketAddr,
    data: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start() -> Self {
        track_marked_threads();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let data_dir = data.clone();
        let thread = std::thread::spawn(move || {
            mark_thread(true);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_start(|| mark_thread(true))
                .build()
                .unwrap();
            rt.block_on(async move {
                let objects = ObjectConfig {
                    replication: 1,
                    write_quorum: 1,
                    read_quorum: 1,
                    ..ObjectConfig::default()
                };
                let daemon = Daemon::builder(objects)
                    .data_dir(data_dir)
                    .store_memory_bytes(STORE_MEMORY)
                    .http(loopback())
                    .bind(loopback(), |_| {})
                    .await
                    .unwrap();
                address_tx.send(daemon.http_address().unwrap()).unwrap();
                let _ = stopped.await;
                daemon.shutdown().await.unwrap();
            });
        });
        let http = address_rx.recv().unwrap();
        Self {
            http,
            data,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// A connection with a small receive buffer, so a stalled reader stalls the node soon.
    fn connect(&self) -> TcpStream {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_recv_buffer_size(16 << 10).unwrap();
        socket.connect(&self.http.into()).unwrap();
        let stream = TcpStream::from(socket);
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
    }

    fn put(&self, key: &str, body: &[u8]) {
        let mut stream = self.connect();
        let head = format!(
            "PUT /objects/{key} HTTP/1.1\r\nHost: node\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 201"),
            "PUT {key}: {}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// Sends a `GET` of `key` and reads the head of its answer; returns the stream, the declared
    /// `Content-Length` and the body bytes read with the head.
    fn get_head(&self, key: &str) -> (TcpStream, usize, Vec<u8>) {
        let mut stream = self.connect();
        let request =
            format!("GET /objects/{key} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let mut buffer = [0u8; 4096];
        let split = loop {
            let read = stream.read(&mut buffer).unwrap();
            assert!(read > 0, "the connection closed before the head");
            raw.extend_from_slice(&buffer[..read]);
            if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break split;
            }
        };
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 200"),
            "GET {key}: {}",
            String::from_utf8_lossy(&raw)
        );
        let len = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .expect("a Content-Length");
        (stream, len, raw[split + 4..].to_vec())
    }

    fn content_files(&self) -> Vec<PathBuf> {
        let dir: &Path = &self.data.join("objects.content");
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads the rest of a body to the end of the connection.
fn read_rest(mut stream: TcpStream, mut body: Vec<u8>) -> Vec<u8> {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return body,
            Ok(read) => body.extend_from_slice(&buffer[..read]),
        }
    }
}

#[test]
fn slow_readers_of_large_objects_hold_a_chunk_each_and_get_every_byte() {
    let _exclusive = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::start();
    for index in 0..OBJECTS {
        node.put(&format!("large-{index}"), &content(index));
    }
    assert_eq!(node.content_files().len(), OBJECTS);
    std::thread::sleep(Duration::from_millis(200));
    let before = tracked_live_and_peak().0;
    reset_tracked_peak();
    let mut readers = Vec::new();
    for index in 0..OBJECTS {
        let (mut stream, len, mut body) = node.get_head(&format!("large-{index}"));
        assert_eq!(len, OBJECT_BYTES);
        while body.len() < FIRST_READ {
            let mut buffer = [0u8; 4096];
            let read = stream.read(&mut buffer).unwrap();
            assert!(read > 0, "the body ended early");
            body.extend_from_slice(&buffer[..read]);
        }
        readers.push((stream, body));
    }
    // Every reader has begun and stalls; the node sends until the sockets' buffers are full.
    std::thread::sleep(Duration::from_millis(500));
    let held = tracked_live_and_peak().1 - before;
    // Whole objects would hold OBJECTS × 8 MiB; a chunk each (and the connections' buffers)
    // is well under a quarter of that.
    let bound = (OBJECTS * OBJECT_BYTES / 4) as i64;
    assert!(
        held < bound,
        "{OBJECTS} slow readers of {OBJECT_BYTES}-byte objects raised the node's heap by {held} bytes (bound {bound})"
    );
    for (index, (stream, body)) in readers.into_iter().enumerate() {
        assert!(
            read_rest(stream, body) == content(index),
            "large-{index} differs"
        );
    }
}

#[test]
fn a_content_file_damaged_while_it_streams_cuts_the_response_short() {
    let _exclusive = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::start();
    // Larger than the socket buffers between node and reader, so the node has not read its end
    // when the reader stalls.
    let len = 8 << 20;
    let original: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    node.put("damaged", &original);
    let files = node.content_files();
    assert_eq!(files.len(), 1);
    let (stream, declared, body) = node.get_head("damaged");
    assert_eq!(declared, len);
    // The last byte flipped in place, under the open reader.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(len as u64 - 1)).unwrap();
    file.write_all(&[original[len - 1] ^ 0xff]).unwrap();
    drop(file);
    let body = read_rest(stream, body);
    assert!(
        body.len() < len,
        "a damaged object was served whole ({} bytes)",
        body.len()
    );
    assert_eq!(
        body[..],
        original[..body.len()],
        "the bytes served are the object's"
    );
    // The next read finds the damage before it answers: no replica holds a good copy.
    let mut stream = node.connect();
    stream
        .write_all(b"GET /objects/damaged HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .unwrap();
    let answer = read_rest(stream, Vec::new());
    assert!(
        answer.starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn slow_writers_of_large_objects_hold_a_piece_each_and_store_every_byte() {
    let _exclusive = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::start();
    std::thread::sleep(Duration::from_millis(200));
    let before = tracked_live_and_peak().0;
    reset_tracked_peak();
    // Each writer sends half its body, then stalls.
    let half = OBJECT_BYTES / 2;
    let mut writers = Vec::new();
    for index in 0..OBJECTS {
        let mut stream = node.connect();
        let head = format!(
            "PUT /objects/slow-{index} HTTP/1.1\r\nHost: node\r\nConnection: close\r\nContent-Length: {OBJECT_BYTES}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&content(index)[..half]).unwrap();
        writers.push(stream);
    }
    std::thread::sleep(Duration::from_millis(500));
    let held = tracked_live_and_peak().1 - before;
    // Bodies held as they arrive would hold OBJECTS × 4 MiB (measured: 41 MB before PUTs were
    // streamed); a piece each, with each connection's read buffer, measured 6.1 MB.
    let bound = (OBJECTS * half / 3) as i64;
    assert!(
        held < bound,
        "{OBJECTS} writers stalled half-way through {OBJECT_BYTES}-byte bodies raised the node's heap by {held} bytes (bound {bound})"
    );
    for (index, mut stream) in writers.into_iter().enumerate() {
        stream.write_all(&content(index)[half..]).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 201"),
            "PUT slow-{index}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(node.content_files().len(), OBJECTS);
    for index in 0..OBJECTS {
        let (stream, len, body) = node.get_head(&format!("slow-{index}"));
        assert_eq!(len, OBJECT_BYTES);
        assert!(
            read_rest(stream, body) == content(index),
            "slow-{index} differs"
        );
    }
}
