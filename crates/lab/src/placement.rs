//! Run the hosts of one case as separate processes: where each runs, the control channel between
//! the processes, and the logs hosts share through it.
//!
//! # Design
//!
//! `meshwire lab host` runs one host of a case: the experiment builds its whole lab as always, and
//! a lab with a [`Placement`] keeps only that host's software, gives every host the address the
//! placement names, and runs on real sockets ([`crate::socket::Carrier::KernelRate`] when the
//! kernel serializes the links, as between the network namespaces of `scripts/netns-lab.sh`).
//! Every process starts its run at the placement's wall-clock `start`, so [`crate::lab::clock`]
//! reads the same in all of them (they share the machine's clock).
//!
//! What one host's software records and another's reads goes through a [`SharedLog`]: within one
//! process (virtual time, `--realtime`) it is plain shared memory; across processes each append is
//! also sent to every other process, which adds it to its own copy. The processes talk over Unix
//! datagram sockets in a directory they share (`<dir>/<host>.sock`; path-bound Unix sockets reach
//! across network namespaces), never over the emulated network. Three messages exist: a process is
//! ready (its hosts have started, so their sockets are bound: clients start only when every other
//! process is ready), a log grew, a client finished (a process whose clients have all finished,
//! here or elsewhere, ends its run). A log has one writing host.

use std::cell::{OnceCell, Ref, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Where this process's host runs and where the others are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The host this process runs.
    pub host: String,
    /// Every host's address, this one's included.
    pub addresses: BTreeMap<String, IpAddr>,
    /// A directory every process can reach, for the control sockets.
    pub control_dir: PathBuf,
    /// When the run starts (the same instant for every process).
    pub start: SystemTime,
    /// Whether the kernel serializes bit-rate links (`tc tbf` on the veths); else the sockets do.
    pub kernel_rate: bool,
}

/// Bytes of log entries one control message carries at most (Unix datagrams stay well below the
/// socket buffer).
const MESSAGE_BYTES: usize = 32 * 1024;

/// How often pending appends are sent.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_millis(1);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Message {
    Ready {
        host: String,
    },
    Append {
        log: String,
        entries: Vec<serde_json::Value>,
    },
    Finished {
        host: String,
    },
}

type Applier = Box<dyn Fn(Vec<serde_json::Value>)>;

/// One process's end of the control channel.
pub(crate) struct Control {
    me: String,
    dir: PathBuf,
    socket: OnceCell<Rc<tokio::net::UnixDatagram>>,
    peers: RefCell<Vec<String>>,
    outbox: RefCell<BTreeMap<String, VecDeque<Vec<u8>>>>,
    pending: RefCell<BTreeMap<String, Vec<serde_json::Value>>>,
    appliers: RefCell<HashMap<String, Applier>>,
    ready: RefCell<BTreeSet<String>>,
    finished: RefCell<BTreeSet<String>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("me", &self.me)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Control {
    pub(crate) fn new(placement: &Placement) -> Self {
        Self {
            me: placement.host.clone(),
            dir: placement.control_dir.clone(),
            socket: OnceCell::new(),
            peers: RefCell::default(),
            outbox: RefCell::default(),
            pending: RefCell::default(),
            appliers: RefCell::default(),
            ready: RefCell::default(),
            finished: RefCell::default(),
        }
    }

    fn path(dir: &Path, host: &str) -> PathBuf {
        dir.join(format!("{host}.sock"))
    }

    /// Binds this process's socket (inside the runtime) and notes the processes to talk to.
    pub(crate) fn bind(&self, peers: Vec<String>) -> io::Result<()> {
        let path = Self::path(&self.dir, &self.me);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let socket = tokio::net::UnixDatagram::bind(&path)?;
        if self.socket.set(Rc::new(socket)).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "control socket bound twice",
            ));
        }
        self.outbox.replace(
            peers
                .iter()
                .map(|peer| (peer.clone(), VecDeque::new()))
                .collect(),
        );
        *self.peers.borrow_mut() = peers;
        Ok(())
    }

    pub(crate) fn register(&self, log: &str, applier: Applier) {
        self.appliers.borrow_mut().insert(log.to_string(), applier);
    }

    fn append(&self, log: &str, entry: serde_json::Value) {
        self.pending
            .borrow_mut()
            .entry(log.to_string())
            .or_default()
            .push(entry);
    }

    fn broadcast(&self, message: &Message) {
        let Ok(bytes) = serde_json::to_vec(message) else {
            return;
        };
        for queue in self.outbox.borrow_mut().values_mut() {
            queue.push_back(bytes.clone());
        }
    }

    /// Tells every other process that this one's hosts have started.
    pub(crate) fn announce_ready(&self) {
        self.broadcast(&Message::Ready {
            host: self.me.clone(),
        });
    }

    /// Tells every other process that this one's client finished.
    pub(crate) fn announce_finished(&self) {
        self.broadcast(&Message::Finished {
            host: self.me.clone(),
        });
    }

    /// Whether every other process has said it is ready.
    pub(crate) fn all_ready(&self) -> bool {
        let ready = self.ready.borrow();
        self.peers.borrow().iter().all(|peer| ready.contains(peer))
    }

    /// Whether every host in `clients` has finished.
    pub(crate) fn finished(&self, clients: &[String]) -> bool {
        let finished = self.finished.borrow();
        clients.iter().all(|client| finished.contains(client))
    }

    /// Whether nothing waits to be sent.
    pub(crate) fn idle(&self) -> bool {
        self.pending.borrow().is_empty() && self.outbox.borrow().values().all(VecDeque::is_empty)
    }

    /// Encodes pending appends and sends what each peer's socket takes, in order; what it does
    /// not take yet (its process has not bound it, or its queue is full) waits for the next flush.
    pub(crate) fn flush(&self) {
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        for (log, entries) in pending {
            let mut chunk = Vec::new();
            let mut bytes = 0;
            for entry in entries {
                bytes += entry.to_string().len() + 1;
                chunk.push(entry);
                if bytes >= MESSAGE_BYTES {
                    self.broadcast(&Message::Append {
                        log: log.clone(),
                        entries: std::mem::take(&mut chunk),
                    });
                    bytes = 0;
                }
            }
            if !chunk.is_empty() {
                self.broadcast(&Message::Append {
                    log: log.clone(),
                    entries: chunk,
                });
            }
        }
        let Some(socket) = self.socket.get() else {
            return;
        };
        for (peer, queue) in self.outbox.borrow_mut().iter_mut() {
            let path = Self::path(&self.dir, peer);
            while let Some(message) = queue.front() {
                match socket.try_send_to(message, &path) {
                    Ok(_) => {
                        queue.pop_front();
                    }
                    Err(error) => {
                        tracing::trace!(%peer, %error, "control message waits");
                        break;
                    }
                }
            }
        }
    }

    fn apply(&self, bytes: &[u8]) {
        let message = match serde_json::from_slice::<Message>(bytes) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "malformed control message");
                return;
            }
        };
        match message {
            Message::Ready { host } => {
                self.ready.borrow_mut().insert(host);
            }
            Message::Finished { host } => {
                self.finished.borrow_mut().insert(host);
            }
            Message::Append { log, entries } => match self.appliers.borrow().get(&log) {
                Some(applier) => applier(entries),
                None => tracing::warn!(%log, "append to an unknown log"),
            },
        }
    }

    /// Receives and applies messages, and flushes every [`FLUSH_INTERVAL`], until dropped.
    pub(crate) async fn serve(self: Rc<Self>) {
        let Some(socket) = self.socket.get().cloned() else {
            return;
        };
        let mut buffer = vec![0u8; 2 * MESSAGE_BYTES + 4096];
        let mut ticker = tokio::time::interval(FLUSH_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let received = tokio::select! {
                ready = socket.readable() => ready.map(|()| true),
                _ = ticker.tick() => Ok(false),
            };
            match received {
                Ok(true) => loop {
                    match socket.try_recv(&mut buffer) {
                        Ok(len) => self.apply(&buffer[..len]),
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                        Err(error) => {
                            tracing::warn!(%error, "control socket failed");
                            return;
                        }
                    }
                },
                Ok(false) => self.flush(),
                Err(error) => {
                    tracing::warn!(%error, "control socket failed");
                    return;
                }
            }
        }
    }
}

/// An append-only list one host records and any host reads: shared memory within a process,
/// replicated to the other processes when hosts run apart (see the module documentation).
pub struct SharedLog<T> {
    name: String,
    entries: Rc<RefCell<Vec<T>>>,
    control: Option<Rc<Control>>,
}

impl<T> Clone for SharedLog<T> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            entries: self.entries.clone(),
            control: self.control.clone(),
        }
    }
}

impl<T> std::fmt::Debug for SharedLog<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLog")
            .field("name", &self.name)
            .field("len", &self.entries.borrow().len())
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned + 'static> SharedLog<T> {
    pub(crate) fn new(name: &str, control: Option<Rc<Control>>) -> Self {
        let entries: Rc<RefCell<Vec<T>>> = Rc::default();
        if let Some(control) = &control {
            let copy = entries.clone();
            let log = name.to_string();
            control.register(
                name,
                Box::new(move |values| {
                    for value in values {
                        match serde_json::from_value(value) {
                            Ok(entry) => copy.borrow_mut().push(entry),
                            Err(error) => tracing::warn!(%log, %error, "malformed log entry"),
                        }
                    }
                }),
            );
        }
        Self {
            name: name.to_string(),
            entries,
            control,
        }
    }

    /// Appends `entry` (and sends it to the other processes, if any).
    pub fn push(&self, entry: T) {
        if let Some(control) = &self.control {
            match serde_json::to_value(&entry) {
                Ok(value) => control.append(&self.name, value),
                Err(error) => tracing::warn!(log = %self.name, %error, "log entry not sent"),
            }
        }
        self.entries.borrow_mut().push(entry);
    }
}

impl<T> SharedLog<T> {
    /// Entries so far.
    pub fn len(&self) -> usize {
        self.entries.borrow().len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.entries.borrow().is_empty()
    }

    /// The entries so far.
    pub fn entries(&self) -> Ref<'_, [T]> {
        Ref::map(self.entries.borrow(), Vec::as_slice)
    }
}
