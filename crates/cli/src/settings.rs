//! Read `meshwire node` settings from a TOML file and command-line flags (flags win).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context};
use meshwire::{Congestion, Keypair, NodeConfig, PeerId};
use meshwire_gossip::proto::{ClassId, Relay};
use meshwire_objects::net::ring::RingConfig;
use meshwire_objects::net::{HttpAuth, HttpLimits, TopicPolicy, TopicsConfig};
use serde::Deserialize;

/// Flags of `meshwire node`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// A TOML file with any of the settings below (see docs/node.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node's data directory (identity key).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// UDP address to listen on.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A peer to keep connected, as PEERID@HOST:PORT (repeatable).
    #[arg(long = "peer")]
    pub peers: Vec<PeerAddress>,
    /// Accept and dial only these peers (repeatable); without it, any peer may connect.
    #[arg(long = "allow")]
    pub allow: Vec<PeerId>,
    /// TCP address of the HTTP API (default 127.0.0.1:7780).
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// A member of this node's object cluster, by PeerId (repeatable; adds to `[objects] members`).
    /// Objects are placed on, replicated to and served to members only; without any, the node is
    /// a cluster of one.
    #[arg(long = "member")]
    pub members: Vec<PeerId>,
    /// Serve the HTTP API on a non-loopback address without requiring the token (anyone who
    /// reaches the port can write; logged as a warning).
    #[arg(long)]
    pub danger_http_without_token: bool,
    /// Check the config file and flags as a start would (identity, transport, objects, HTTP
    /// limits and token policy), print a one-line summary and exit without binding anything:
    /// status 0 when the node would start, 1 with the reason otherwise. Peer host names are
    /// checked for form only, not looked up.
    #[arg(long)]
    pub check_config: bool,
}

/// A peer's identity and address: `PEERID@HOST:PORT`, where HOST is an IP address or a DNS name
/// (a Kubernetes pod's stable name, for one), resolved when the node starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddress {
    pub peer_id: PeerId,
    /// `HOST:PORT` as given.
    pub address: String,
}

impl PeerAddress {
    /// The address's first resolution in the family a node's socket can reach (IPv4 or IPv6;
    /// no lookup for an IP address).
    pub async fn resolve(&self, ipv4: bool) -> std::io::Result<SocketAddr> {
        tokio::net::lookup_host(self.address.as_str())
            .await?
            .find(|address| address.is_ipv4() == ipv4)
            .ok_or_else(|| {
                let family = if ipv4 { "IPv4" } else { "IPv6" };
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{} resolves to no {family} address", self.address),
                )
            })
    }
}

impl FromStr for PeerAddress {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (id, address) = text
            .split_once('@')
            .with_context(|| format!("peer {text:?} is not PEERID@HOST:PORT"))?;
        let peer_id = id
            .parse()
            .with_context(|| format!("bad peer id in {text:?}"))?;
        if address.parse::<SocketAddr>().is_err() {
            let (host, port) = address
                .rsplit_once(':')
                .with_context(|| format!("bad address in {text:?}: not HOST:PORT"))?;
            port.parse::<u16>()
                .with_context(|| format!("bad port in {text:?}"))?;
            let label_ok = |label: &str| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            };
            if host.len() > 253 || !host.split('.').all(label_ok) {
                bail!("bad address in {text:?}: {host:?} is neither an IP address nor a DNS name");
            }
        }
        Ok(Self {
            peer_id,
            address: address.to_string(),
        })
    }
}

/// The settings file. Unknown keys are errors, so a typo is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    #[serde(default)]
    peers: Vec<String>,
    allowlist: Option<Vec<String>>,
    #[serde(default)]
    transport: FileTransport,
    http_listen: Option<SocketAddr>,
    #[serde(default)]
    http: FileHttp,
    #[serde(default)]
    objects: FileObjects,
    #[serde(default)]
    gossip: FileGossip,
    #[serde(default)]
    pipeline: FilePipeline,
}

/// The `[pipeline]` table: a batch pipeline round a ring of nodes (see docs/node.md).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePipeline {
    /// PeerIds in ring order; absent or empty: no pipeline.
    #[serde(default)]
    ring: Vec<String>,
    in_flight: Option<usize>,
    batch_deadline_ms: Option<u64>,
    chunk_bytes: Option<usize>,
    max_batch_bytes: Option<usize>,
}

/// The `[gossip]` table: publish/subscribe topics and their subscribers (see docs/node.md).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGossip {
    subscriber_buffer: Option<usize>,
    max_subscribers: Option<usize>,
    /// Topic name to policy; absent: the one topic `default`.
    topics: Option<BTreeMap<String, FileTopic>>,
}

/// One `[gossip.topics.NAME]` table.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTopic {
    relay: Option<String>,
    max_bytes: Option<usize>,
    push_whole_max_bytes: Option<u32>,
    latency_sensitive: Option<bool>,
    expiry_ms: Option<u64>,
    class: Option<u8>,
}

/// The `[http]` table: the HTTP API's limits and token policy (see docs/node.md).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHttp {
    header_read_timeout_ms: Option<u64>,
    body_idle_timeout_ms: Option<u64>,
    min_body_bytes_per_sec: Option<u64>,
    min_body_rate_grace_ms: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    max_concurrent_requests: Option<usize>,
    max_body_bytes_in_flight: Option<usize>,
    retry_after_secs: Option<u64>,
    shutdown_grace_ms: Option<u64>,
    require_token: Option<bool>,
    metrics_open: Option<bool>,
    danger_allow_unauthenticated: Option<bool>,
}

/// The `[objects]` table: replication and quorum settings (see the `# Design` of crates/objects/src/lib.rs).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileObjects {
    pub replication: Option<usize>,
    pub write_quorum: Option<usize>,
    pub read_quorum: Option<usize>,
    pub read_policy: Option<String>,
    pub max_object_bytes: Option<usize>,
    pub deadline_ms: Option<u64>,
    pub max_clock_skew_ms: Option<u64>,
    pub anti_entropy_interval_ms: Option<u64>,
    pub store_memory_bytes: Option<usize>,
    #[serde(default)]
    pub members: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTransport {
    bandwidth_mbit_per_s: Option<u64>,
    max_rtt_ms: Option<u64>,
    keep_alive_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    congestion: Option<String>,
    initial_window_kib: Option<u64>,
}

/// Settings resolved from file and flags.
#[derive(Debug)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub peers: Vec<PeerAddress>,
    pub allowlist: Option<HashSet<PeerId>>,
    pub http: SocketAddr,
    pub http_limits: HttpLimits,
    pub http_auth: HttpAuth,
    pub objects: meshwire_objects::net::ObjectConfig,
    /// Publish/subscribe topics (`[gossip]`).
    pub topics: TopicsConfig,
    /// The batch pipeline round a ring (`[pipeline]`), if configured.
    pub ring: Option<RingConfig>,
    /// The store's memory budget (redb's page cache and the object cache).
    pub store_memory_bytes: usize,
    /// The object cluster's other members (this node is always one).
    pub members: Vec<PeerId>,
    transport: FileTransport,
}

impl Settings {
    pub fn load(args: &NodeArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let mut peers = file
            .peers
            .iter()
            .map(|text| text.parse())
            .collect::<anyhow::Result<Vec<PeerAddress>>>()?;
        peers.extend(args.peers.iter().cloned());
        let mut allowlist = match file.allowlist {
            Some(list) => Some(
                list.iter()
                    .map(|id| {
                        id.parse::<PeerId>()
                            .with_context(|| format!("bad peer id {id:?} in allowlist"))
                    })
                    .collect::<anyhow::Result<HashSet<_>>>()?,
            ),
            None => None,
        };
        if !args.allow.is_empty() {
            allowlist
                .get_or_insert_with(HashSet::new)
                .extend(args.allow.iter().copied());
        }
        if let Some(congestion) = &file.transport.congestion {
            parse_congestion(congestion)?;
        }
        let objects = object_config(&file.objects)?;
        let mut members = file
            .objects
            .members
            .iter()
            .map(|id| {
                id.parse::<PeerId>()
                    .with_context(|| format!("bad peer id {id:?} in [objects] members"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        members.extend(args.members.iter().copied());
        let http_limits = http_limits(&file.http)?;
        let topics = topics_config(&file.gossip)?;
        let ring = ring_config(&file.pipeline)?;
        let http_auth = HttpAuth {
            require_token: file.http.require_token,
            metrics_open: file.http.metrics_open.unwrap_or(false),
            danger_allow_unauthenticated: args.danger_http_without_token
                || file.http.danger_allow_unauthenticated.unwrap_or(false),
        };
        Ok(Self {
            data_dir: args
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("meshwire-data")),
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| "127.0.0.1:7700".parse().expect("valid literal")),
            peers,
            allowlist,
            http: args
                .http
                .or(file.http_listen)
                .unwrap_or_else(|| "127.0.0.1:7780".parse().expect("valid literal")),
            http_limits,
            http_auth,
            objects,
            topics,
            ring,
            store_memory_bytes: file
                .objects
                .store_memory_bytes
                .unwrap_or(meshwire_objects::net::DEFAULT_STORE_MEMORY_BYTES),
            members,
            transport: file.transport,
        })
    }

    /// Checks everything a start checks before it binds (identity, transport, objects, HTTP
    /// limits and token policy) without creating, binding or looking up anything, and returns a
    /// one-line summary.
    pub fn check(&self) -> anyhow::Result<String> {
        let identity = Keypair::load(&self.data_dir)?;
        // A throwaway key stands in for one the start would create; only the settings are checked.
        let mut config = NodeConfig::new(identity.clone().unwrap_or_else(Keypair::generate));
        self.apply(&mut config);
        config.validate().context("[transport] is invalid")?;
        self.objects
            .validate_for(config.limits.max_payload_bytes)
            .context("[objects] is invalid")?;
        self.http_limits
            .validate_for(self.objects.max_object_bytes)
            .context("[http] is invalid")?;
        self.http_auth.check(self.http)?;
        self.topics.resolve().context("[gossip] is invalid")?;
        if self.topics.max_subscribers >= self.http_limits.max_connections {
            bail!(
                "[gossip] max_subscribers ({}) must be below [http] max_connections ({})",
                self.topics.max_subscribers,
                self.http_limits.max_connections
            );
        }
        if let (Some(ring), Some(keypair)) = (&self.ring, &identity) {
            if !ring.ring.contains(&keypair.peer_id()) {
                bail!(
                    "[pipeline] ring does not list this node ({})",
                    keypair.peer_id()
                );
            }
        }
        let who = match &identity {
            Some(keypair) => format!(
                "peer {} ({})",
                keypair.peer_id(),
                self.data_dir.join("identity.pem").display()
            ),
            None => format!(
                "new identity (created in {} at start)",
                self.data_dir.display()
            ),
        };
        let own = identity.as_ref().map(Keypair::peer_id);
        // A start skips the entry with the node's own PeerId (one file can list every member).
        let peers = self
            .peers
            .iter()
            .filter(|peer| Some(peer.peer_id) != own)
            .count();
        let mut members: HashSet<PeerId> = self.members.iter().copied().collect();
        members.extend(own);
        let names: Vec<&str> = self.topics.topics.keys().map(String::as_str).collect();
        let topics = match names.len() {
            1 => format!("topic {}", names[0]),
            2..=4 => format!("topics {}", names.join(", ")),
            count => format!("{count} topics"),
        };
        let token = if self.token_required() {
            "token required"
        } else {
            "token optional"
        };
        Ok(format!(
            "config ok: {who}; udp {}; http {} ({token}); {} peers; {} members; \
             replication {}, write quorum {}, read quorum {}; {topics}",
            self.listen,
            self.http,
            peers,
            members.len().max(1),
            self.objects.replication,
            self.objects.write_quorum,
            self.objects.read_quorum,
        ))
    }

    /// Whether the HTTP API will require the token on every request (as the daemon decides it).
    fn token_required(&self) -> bool {
        let auth = &self.http_auth;
        if self.http.ip().is_loopback() {
            auth.require_token.unwrap_or(false)
        } else {
            auth.require_token == Some(true) || !auth.danger_allow_unauthenticated
        }
    }

    pub fn apply(&self, config: &mut NodeConfig) {
        config.allowlist = self.allowlist.clone();
        let transport = &mut config.transport;
        if let Some(mbit) = self.transport.bandwidth_mbit_per_s {
            transport.bandwidth_bits_per_sec = mbit * 1_000_000;
        }
        if let Some(ms) = self.transport.max_rtt_ms {
            transport.max_rtt = Duration::from_millis(ms);
        }
        if let Some(ms) = self.transport.keep_alive_ms {
            transport.keep_alive = Duration::from_millis(ms);
        }
        if let Some(ms) = self.transport.idle_timeout_ms {
            transport.idle_timeout = Duration::from_millis(ms);
        }
        if let Some(Ok(congestion)) = self.transport.congestion.as_deref().map(parse_congestion) {
            transport.congestion = congestion;
        }
        if let Some(kib) = self.transport.initial_window_kib {
            transport.initial_window_bytes = Some(kib.saturating_mul(1024));
        }
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {} is invalid", path.display()))
}

fn object_config(file: &FileObjects) -> anyhow::Result<meshwire_objects::net::ObjectConfig> {
    let mut config = meshwire_objects::net::ObjectConfig::default();
    if let Some(value) = file.replication {
        config.replication = value;
    }
    if let Some(value) = file.write_quorum {
        config.write_quorum = value;
    }
    if let Some(value) = file.read_quorum {
        config.read_quorum = value;
    }
    if let Some(policy) = &file.read_policy {
        config.read_policy = policy.parse()?;
    }
    if let Some(value) = file.max_object_bytes {
        config.max_object_bytes = value;
    }
    if let Some(ms) = file.deadline_ms {
        config.deadline = Duration::from_millis(ms);
    }
    if let Some(ms) = file.max_clock_skew_ms {
        config.max_clock_skew = Duration::from_millis(ms);
    }
    if let Some(ms) = file.anti_entropy_interval_ms {
        config.anti_entropy_interval = Duration::from_millis(ms);
    }
    if config.write_quorum == 0
        || config.write_quorum > config.replication
        || config.read_quorum == 0
        || config.read_quorum > config.replication
    {
        bail!("[objects] needs 1 <= write_quorum, read_quorum <= replication");
    }
    Ok(config)
}

fn http_limits(file: &FileHttp) -> anyhow::Result<HttpLimits> {
    let mut limits = HttpLimits::default();
    let millis = |value: Option<u64>, into: &mut Duration| {
        if let Some(ms) = value {
            *into = Duration::from_millis(ms);
        }
    };
    millis(file.header_read_timeout_ms, &mut limits.header_read_timeout);
    millis(file.body_idle_timeout_ms, &mut limits.body_idle_timeout);
    millis(file.min_body_rate_grace_ms, &mut limits.min_body_rate_grace);
    millis(file.shutdown_grace_ms, &mut limits.shutdown_grace);
    if let Some(secs) = file.retry_after_secs {
        limits.retry_after = Duration::from_secs(secs);
    }
    if let Some(rate) = file.min_body_bytes_per_sec {
        limits.min_body_bytes_per_sec = rate;
    }
    if let Some(max) = file.max_connections {
        limits.max_connections = max;
    }
    if let Some(max) = file.max_connections_per_client {
        limits.max_connections_per_client = max;
    }
    if let Some(max) = file.max_concurrent_requests {
        limits.max_concurrent_requests = max;
    }
    if let Some(max) = file.max_body_bytes_in_flight {
        limits.max_body_bytes_in_flight = max;
    }
    limits.validate().context("[http] is invalid")?;
    Ok(limits)
}

fn ring_config(file: &FilePipeline) -> anyhow::Result<Option<RingConfig>> {
    if file.ring.is_empty() {
        return Ok(None);
    }
    let ring = file
        .ring
        .iter()
        .map(|id| {
            id.parse::<PeerId>()
                .with_context(|| format!("bad peer id {id:?} in [pipeline] ring"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if ring.len() < 2 || ring.iter().collect::<HashSet<_>>().len() != ring.len() {
        bail!("[pipeline] ring needs at least two distinct peer ids");
    }
    let mut config = RingConfig::new(ring);
    if let Some(value) = file.in_flight {
        config.in_flight = value;
    }
    if let Some(ms) = file.batch_deadline_ms {
        config.batch_deadline = Duration::from_millis(ms);
    }
    if let Some(value) = file.chunk_bytes {
        config.chunk_bytes = value;
    }
    if let Some(value) = file.max_batch_bytes {
        config.max_batch_bytes = value;
    }
    config.validate()?;
    Ok(Some(config))
}

fn topics_config(file: &FileGossip) -> anyhow::Result<TopicsConfig> {
    let mut config = TopicsConfig::default();
    if let Some(buffer) = file.subscriber_buffer {
        config.subscriber_buffer = buffer;
    }
    if let Some(max) = file.max_subscribers {
        config.max_subscribers = max;
    }
    if let Some(topics) = &file.topics {
        config.topics = topics
            .iter()
            .map(|(name, topic)| Ok((name.clone(), topic_policy(name, topic)?)))
            .collect::<anyhow::Result<_>>()?;
    }
    config.resolve().context("[gossip] is invalid")?;
    Ok(config)
}

fn topic_policy(name: &str, file: &FileTopic) -> anyhow::Result<TopicPolicy> {
    let mut policy = TopicPolicy::default();
    if let Some(relay) = &file.relay {
        policy.relay = match relay.as_str() {
            "all" => Relay::All,
            "origin" => Relay::Origin,
            other => bail!("[gossip.topics.{name}] relay {other:?} is not \"all\" or \"origin\""),
        };
    }
    if let Some(bytes) = file.max_bytes {
        policy.max_bytes = bytes;
    }
    if let Some(bytes) = file.push_whole_max_bytes {
        policy.push_whole_max_bytes = bytes;
    }
    if let Some(sensitive) = file.latency_sensitive {
        policy.latency_sensitive = sensitive;
    }
    if let Some(ms) = file.expiry_ms {
        policy.expiry = Duration::from_millis(ms);
    }
    policy.class = file.class.map(ClassId);
    Ok(policy)
}

fn parse_congestion(name: &str) -> anyhow::Result<Congestion> {
    Ok(match name {
        "cubic" => Congestion::Cubic,
        "bbr" => Congestion::Bbr,
        "newreno" => Congestion::NewReno,
        "meshwire" => Congestion::Meshwire,
        other => bail!("unknown congestion controller {other:?} (cubic, bbr, newreno, meshwire)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: Option<PathBuf>) -> NodeArgs {
        NodeArgs {
            config,
            data_dir: None,
            listen: None,
            peers: Vec::new(),
            allow: Vec::new(),
            http: None,
            members: Vec::new(),
            danger_http_without_token: false,
            check_config: false,
        }
    }

    #[test]
    fn parses_peer_addresses() {
        let id = PeerId::from_bytes([5; 32]);
        let parsed: PeerAddress = format!("{id}@127.0.0.1:9000").parse().unwrap();
        assert_eq!(parsed.peer_id, id);
        assert_eq!(parsed.address, "127.0.0.1:9000");
        let named: PeerAddress = format!("{id}@meshwire-1.meshwire.default.svc:7700")
            .parse()
            .unwrap();
        assert_eq!(named.address, "meshwire-1.meshwire.default.svc:7700");
        let v6: PeerAddress = format!("{id}@[::1]:7700").parse().unwrap();
        assert_eq!(v6.address, "[::1]:7700");
        assert!("nonsense".parse::<PeerAddress>().is_err());
        for bad in [
            "nowhere",
            "host:port",
            "host:70000",
            ":7700",
            "bad_host:7700",
            "a..b:1",
        ] {
            assert!(
                format!("{id}@{bad}").parse::<PeerAddress>().is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn file_settings_and_flags_combine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let id = PeerId::from_bytes([5; 32]);
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:7000\"\npeers = [\"{id}@127.0.0.1:7001\"]\n\
                 allowlist = [\"{id}\"]\n[transport]\ncongestion = \"bbr\"\nmax_rtt_ms = 50\n\
                 initial_window_kib = 64\n"
            ),
        )
        .unwrap();
        let mut flags = args(Some(path));
        flags.listen = Some("127.0.0.1:7100".parse().unwrap());
        let settings = Settings::load(&flags).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:7100".parse().unwrap());
        assert_eq!(settings.peers.len(), 1);
        let mut config = NodeConfig::new(meshwire::Keypair::from_seed([1; 32]));
        settings.apply(&mut config);
        assert_eq!(config.transport.congestion, Congestion::Bbr);
        assert_eq!(config.transport.max_rtt, Duration::from_millis(50));
        assert_eq!(config.transport.initial_window_bytes, Some(64 * 1024));
        assert!(config.allowlist.unwrap().contains(&id));
    }

    #[test]
    fn members_come_from_the_file_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let (a, b) = (PeerId::from_bytes([5; 32]), PeerId::from_bytes([6; 32]));
        std::fs::write(
            &path,
            format!("[objects]\nmembers = [\"{a}\"]\nmax_clock_skew_ms = 2500\nanti_entropy_interval_ms = 0\n"),
        )
        .unwrap();
        let mut flags = args(Some(path.clone()));
        flags.members.push(b);
        let settings = Settings::load(&flags).unwrap();
        assert_eq!(settings.members, vec![a, b]);
        assert_eq!(settings.objects.max_clock_skew, Duration::from_millis(2500));
        assert_eq!(settings.objects.anti_entropy_interval, Duration::ZERO);
        std::fs::write(&path, "[objects]\nmembers = [\"nobody\"]\n").unwrap();
        let error = format!("{:#}", Settings::load(&args(Some(path))).unwrap_err());
        assert!(error.contains("[objects] members"), "{error}");
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:7000\"\nlisten_port = 3\n").unwrap();
        let error = format!(
            "{:#}",
            Settings::load(&args(Some(path.clone()))).unwrap_err()
        );
        assert!(error.contains("unknown field"), "{error}");
        std::fs::write(&path, "[transport]\ncongestion = \"fast\"\n").unwrap();
        let error = format!(
            "{:#}",
            Settings::load(&args(Some(path.clone()))).unwrap_err()
        );
        assert!(error.contains("unknown congestion"), "{error}");
        std::fs::write(&path, "[http]\nmax_connections = 0\n").unwrap();
        let error = format!("{:#}", Settings::load(&args(Some(path))).unwrap_err());
        assert!(
            error.contains("max_connections must be positive"),
            "{error}"
        );
    }

    #[test]
    fn gossip_table_sets_topics_and_subscriber_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let settings = Settings::load(&args(None)).unwrap();
        assert_eq!(settings.topics, TopicsConfig::default());
        std::fs::write(
            &path,
            "[gossip]\nsubscriber_buffer = 8\nmax_subscribers = 4\n\
             [gossip.topics.blocks]\nrelay = \"origin\"\nmax_bytes = 4096\nexpiry_ms = 1000\n\
             [gossip.topics.\"shares.v1\"]\nclass = 7\nlatency_sensitive = true\n",
        )
        .unwrap();
        let settings = Settings::load(&args(Some(path.clone()))).unwrap();
        assert_eq!(settings.topics.subscriber_buffer, 8);
        assert_eq!(settings.topics.max_subscribers, 4);
        let names: Vec<_> = settings.topics.topics.keys().cloned().collect();
        assert_eq!(names, ["blocks", "shares.v1"]);
        let blocks = settings.topics.topics["blocks"];
        assert_eq!(blocks.relay, Relay::Origin);
        assert_eq!(blocks.max_bytes, 4096);
        assert_eq!(blocks.expiry, Duration::from_secs(1));
        assert_eq!(settings.topics.topics["shares.v1"].class, Some(ClassId(7)));
        for (text, expected) in [
            ("[gossip.topics.\"a b\"]\n", "not 1 to 64 characters"),
            ("[gossip.topics.t]\nrelay = \"some\"\n", "relay"),
            ("[gossip.topics.t]\nmax_bytes = 2000000\n", "max_bytes"),
            ("[gossip.topics.t]\nttl = 3\n", "unknown field"),
            ("[gossip]\nsubscriber_buffer = 0\n", "subscriber_buffer"),
            (
                "[gossip.topics.a]\nclass = 1\n[gossip.topics.b]\nclass = 1\n",
                "class 1",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let error = format!(
                "{:#}",
                Settings::load(&args(Some(path.clone()))).unwrap_err()
            );
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn http_table_sets_limits_and_token_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "[http]\nheader_read_timeout_ms = 500\nmax_connections_per_client = 4\n\
             retry_after_secs = 3\nrequire_token = true\nmetrics_open = true\n",
        )
        .unwrap();
        let settings = Settings::load(&args(Some(path))).unwrap();
        assert_eq!(
            settings.http_limits.header_read_timeout,
            Duration::from_millis(500)
        );
        assert_eq!(settings.http_limits.max_connections_per_client, 4);
        assert_eq!(settings.http_limits.retry_after, Duration::from_secs(3));
        assert_eq!(
            settings.http_limits.max_connections,
            HttpLimits::default().max_connections
        );
        assert_eq!(settings.http_auth.require_token, Some(true));
        assert!(settings.http_auth.metrics_open);
        assert!(!settings.http_auth.danger_allow_unauthenticated);
    }
}
