//! Publish to named topics over the node's gossip and hand what arrives to bounded subscribers.
//!
//! # Design
//!
//! [`Topics`] runs one [`GossipService`] on the node. Each configured topic is one gossip class
//! (see [`crate::proto::topic`] for the name rules, the class mapping, how collisions are handled
//! and the envelope every message travels in) with the policy of its [`TopicPolicy`]: relay (`all`:
//! every node re-disseminates; `origin`: only the publisher), the body size limit, the size up to
//! which a message is pushed whole, latency sensitivity and how long pools keep it.
//!
//! - Only configured topics exist: publishing to or subscribing to any other name is refused
//!   (HTTP `404 unknown_topic`), and gossip of a class this node does not configure is ignored
//!   and counted by gossip itself. Without a config the node has one topic, [`DEFAULT_TOPIC`].
//!   At most [`MAX_TOPICS`] topics, each body at most [`MAX_TOPIC_BYTES`].
//! - Gossip reaches every connected peer, members of the object cluster or not: the allowlist
//!   decides who may connect, and a relayed topic needs every node on the way to configure it.
//! - The validator accepts a message from a peer only if its envelope decodes, names the topic
//!   this node configured on the message's class and its body is within that topic's limit; what
//!   it refuses is counted in `meshwire_topic_rejected_total{reason}` (`malformed`,
//!   `unknown_topic`, `too_large`), never delivered and never relayed.
//! - Subscribers see messages from peers and messages published on this node, each once.
//!   Every subscriber has a queue of [`TopicsConfig::subscriber_buffer`] events; the events are
//!   shared (one copy however many subscribers hold them). A message that finds a queue full
//!   drops that subscriber (`meshwire_topic_subscribers_dropped_total{reason="lagged"}`): its
//!   stream yields what is queued, then [`SubscriptionItem::Ended`] with the reason, then ends. If
//!   the subscriber has not consumed that within [`LAGGED_CUT_AFTER`] (a client that stopped
//!   reading), its HTTP connection is cut, so the bytes stuck in its socket are freed too. The
//!   publisher and the other subscribers never wait for a slow one. Memory held for subscribers
//!   is thus at most the last `subscriber_buffer` events of each topic plus what each HTTP
//!   connection buffers.
//! - At most [`TopicsConfig::max_subscribers`] subscribers at once (`subscriber_limit` refusals),
//!   and fewer than the HTTP API's connection cap, so streams cannot take every connection.
//! - [`Topics::close`] (the daemon's shutdown) ends every subscription with the reason
//!   `shutdown`, so the HTTP server's graceful shutdown is not held up by open streams.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshwire::{Node, PeerId};
use meshwire_gossip::proto::{ArtifactId, ClassId, ClassPolicy, GossipConfig, Relay};
use meshwire_gossip::{Delivered, GossipService, GossipServiceError, GossipSettings};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{mpsc, Notify};

use crate::proto::topic::{class_of, Envelope, TopicError, TopicName, MAX_ENVELOPE_OVERHEAD_BYTES};

/// The topic a node has when its config names none.
pub const DEFAULT_TOPIC: &str = "default";

/// Most topics a node configures.
pub const MAX_TOPICS: usize = 64;

/// Largest body limit a topic may have (1 MiB).
pub const MAX_TOPIC_BYTES: usize = 1024 * 1024;

/// Largest per-subscriber queue, in events.
pub const MAX_SUBSCRIBER_BUFFER: usize = 4096;

/// How long a dropped subscriber has to read its last events before its connection is cut.
pub const LAGGED_CUT_AFTER: Duration = Duration::from_secs(5);

/// Why a topic setting, publish or subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicsError {
    /// A topic name is not `[A-Za-z0-9._-]{1,64}`.
    #[error(transparent)]
    InvalidName(#[from] TopicError),
    /// The name is valid but not a configured topic.
    #[error("no topic {0:?} on this node (topics are configured in [gossip.topics])")]
    UnknownTopic(String),
    /// A body over the topic's limit.
    #[error("a body of {len} bytes exceeds topic {topic:?}'s limit of {max} bytes")]
    TooLarge {
        /// The topic.
        topic: String,
        /// The body's length (or its declared length).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Every subscriber slot is taken.
    #[error("all {max} subscriber slots are taken")]
    SubscriberLimit {
        /// The cap.
        max: usize,
    },
    /// The node is shutting down.
    #[error("the node is shutting down")]
    Closed,
    /// Gossip refused the message (for example, its pool is full).
    #[error("gossip refused the message: {0}")]
    Gossip(#[from] GossipServiceError),
    /// More topics than [`MAX_TOPICS`], or none.
    #[error("{count} topics configured; 1 to {MAX_TOPICS} are allowed")]
    TopicCount {
        /// How many were configured.
        count: usize,
    },
    /// Two topics of this node fall on one gossip class.
    #[error(
        "topics {first:?} and {second:?} both map to gossip class {class}; \
         pin one of them to a free class with `class = N` (on every node)"
    )]
    ClassCollision {
        /// One topic.
        first: String,
        /// The other.
        second: String,
        /// Their class.
        class: u8,
    },
    /// A topic setting out of range.
    #[error("topic {topic:?}: {problem}")]
    Policy {
        /// The topic.
        topic: String,
        /// What is wrong.
        problem: String,
    },
    /// `subscriber_buffer` or `max_subscribers` out of range.
    #[error("[gossip] {0}")]
    Subscribers(String),
}

impl TopicsError {
    /// The label this refusal is counted under in `meshwire_topic_refused_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidName(_) => "invalid_name",
            Self::UnknownTopic(_) => "unknown_topic",
            Self::TooLarge { .. } => "too_large",
            Self::SubscriberLimit { .. } => "subscriber_limit",
            Self::Closed => "shutting_down",
            Self::Gossip(_) => "gossip",
            Self::TopicCount { .. }
            | Self::ClassCollision { .. }
            | Self::Policy { .. }
            | Self::Subscribers(_) => "config",
        }
    }
}

/// How one topic's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicPolicy {
    /// `All`: every node that receives a message re-disseminates it; `Origin`: only its publisher.
    pub relay: Relay,
    /// Largest body a publish may carry, in bytes (at most [`MAX_TOPIC_BYTES`]).
    pub max_bytes: usize,
    /// Messages of at most this many bytes (with their envelope) are pushed whole instead of
    /// advertised and pulled.
    pub push_whole_max_bytes: u32,
    /// Push every message whole and flush at once.
    pub latency_sensitive: bool,
    /// How long gossip pools keep a message (and so how late a peer may still pull it).
    pub expiry: Duration,
    /// The gossip class, when pinned; otherwise [`class_of`] the name.
    pub class: Option<ClassId>,
}

impl Default for TopicPolicy {
    /// Relay by all, 64 KiB bodies, pushed whole up to 1 KiB, kept 60 s, class from the name.
    fn default() -> Self {
        Self {
            relay: Relay::All,
            max_bytes: 64 * 1024,
            push_whole_max_bytes: 1024,
            latency_sensitive: false,
            expiry: Duration::from_secs(60),
            class: None,
        }
    }
}

/// The topics of a node and its subscriber bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicsConfig {
    /// Topic name to policy.
    pub topics: BTreeMap<String, TopicPolicy>,
    /// Events queued per subscriber before it is dropped as lagging (1 to [`MAX_SUBSCRIBER_BUFFER`]).
    pub subscriber_buffer: usize,
    /// Subscribers at once (at least 1; fewer than the HTTP API's `max_connections`).
    pub max_subscribers: usize,
}

impl Default for TopicsConfig {
    /// The topic [`DEFAULT_TOPIC`] with the default policy, 64 events per subscriber, 32 subscribers.
    fn default() -> Self {
        Self {
            topics: BTreeMap::from([(DEFAULT_TOPIC.to_string(), TopicPolicy::default())]),
            subscriber_buffer: 64,
            max_subscribers: 32,
        }
    }
}

/// A configured topic, resolved.
#[derive(Debug, Clone)]
pub struct TopicInfo {
    /// Its name.
    pub name: TopicName,
    /// Its gossip class.
    pub class: ClassId,
    /// Its policy.
    pub policy: TopicPolicy,
}

impl TopicsConfig {
    /// Checks names, limits and classes; returns the topics by name.
    pub fn resolve(&self) -> Result<BTreeMap<String, TopicInfo>, TopicsError> {
        if self.topics.is_empty() || self.topics.len() > MAX_TOPICS {
            return Err(TopicsError::TopicCount {
                count: self.topics.len(),
            });
        }
        if !(1..=MAX_SUBSCRIBER_BUFFER).contains(&self.subscriber_buffer) {
            return Err(TopicsError::Subscribers(format!(
                "subscriber_buffer must be 1 to {MAX_SUBSCRIBER_BUFFER}, not {}",
                self.subscriber_buffer
            )));
        }
        if self.max_subscribers == 0 {
            return Err(TopicsError::Subscribers(
                "max_subscribers must be positive".into(),
            ));
        }
        let mut by_class: BTreeMap<ClassId, String> = BTreeMap::new();
        let mut resolved = BTreeMap::new();
        for (name, policy) in &self.topics {
            let topic = TopicName::new(name)?;
            let problem = |problem: String| TopicsError::Policy {
                topic: name.clone(),
                problem,
            };
            if !(1..=MAX_TOPIC_BYTES).contains(&policy.max_bytes) {
                return Err(problem(format!(
                    "max_bytes must be 1 to {MAX_TOPIC_BYTES}, not {}",
                    policy.max_bytes
                )));
            }
            if policy.expiry.is_zero() {
                return Err(problem("expiry must be positive".into()));
            }
            let class = policy.class.unwrap_or_else(|| class_of(&topic));
            if let Some(first) = by_class.insert(class, name.clone()) {
                return Err(TopicsError::ClassCollision {
                    first,
                    second: name.clone(),
                    class: class.0,
                });
            }
            resolved.insert(
                name.clone(),
                TopicInfo {
                    name: topic,
                    class,
                    policy: *policy,
                },
            );
        }
        Ok(resolved)
    }

    /// The gossip settings these topics need: one class per topic, artifacts up to the largest
    /// body plus its envelope, the other limits at gossip's defaults.
    fn gossip_config(topics: &BTreeMap<String, TopicInfo>) -> GossipConfig {
        let mut config = GossipConfig::default();
        let largest = topics
            .values()
            .map(|topic| topic.policy.max_bytes)
            .max()
            .unwrap_or(0);
        config.max_artifact_bytes = u32::try_from(largest + MAX_ENVELOPE_OVERHEAD_BYTES)
            .expect("MAX_TOPIC_BYTES plus an envelope fits u32");
        for topic in topics.values() {
            let policy = topic.policy;
            config.classes.insert(
                topic.class,
                ClassPolicy {
                    relay: policy.relay,
                    push_whole_max_bytes: policy.push_whole_max_bytes,
                    latency_sensitive: policy.latency_sensitive,
                    expiry: policy.expiry,
                },
            );
        }
        config
    }
}

/// One message of a topic, as subscribers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicEvent {
    /// The gossip artifact's content id.
    pub id: ArtifactId,
    /// The topic.
    pub topic: TopicName,
    /// The node it was published on, as its envelope says.
    pub origin: PeerId,
    /// The peer it arrived from (this node's own id for a local publish).
    pub from: PeerId,
    /// The origin's publish clock, µs since the Unix epoch.
    pub sequence: u64,
    /// The body.
    pub body: Bytes,
}

/// What a publish produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The gossip artifact's content id.
    pub id: ArtifactId,
    /// The gossip class it travels on.
    pub class: ClassId,
    /// Its sequence.
    pub sequence: u64,
}

/// Why a subscription ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// Its queue was full when a message arrived.
    Lagged,
    /// The node is shutting down.
    Shutdown,
}

impl EndReason {
    /// The reason's name (in metrics and in the last event of a stream).
    pub fn name(self) -> &'static str {
        match self {
            Self::Lagged => "lagged",
            Self::Shutdown => "shutdown",
        }
    }
}

/// What a subscription yields.
#[derive(Debug, Clone)]
pub enum SubscriptionItem {
    /// A message.
    Event(Arc<TopicEvent>),
    /// The node dropped this subscription; nothing follows.
    Ended(EndReason),
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

/// `meshwire_topic_*`: published and received messages per topic, refusals, rejections,
/// subscribers and the subscribers dropped.
#[derive(Debug, Clone, Default)]
struct TopicMetrics {
    published: Family<TopicLabel, Counter>,
    received: Family<TopicLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
    rejected: Family<ReasonLabel, Counter>,
    subscribers: Gauge,
    dropped: Family<ReasonLabel, Counter>,
}

impl TopicMetrics {
    fn register(node: &Node) -> Self {
        let metrics = Self::default();
        node.metrics().register_with(|registry| {
            let registry = registry.sub_registry_with_prefix("topic");
            registry.register(
                "published",
                "Messages published on this node, by topic",
                metrics.published.clone(),
            );
            registry.register(
                "received",
                "Messages received from peers and delivered to subscribers, by topic",
                metrics.received.clone(),
            );
            registry.register(
                "refused",
                "Publishes and subscriptions refused, by reason",
                metrics.refused.clone(),
            );
            registry.register(
                "rejected",
                "Messages from peers the topic validator rejected, by reason",
                metrics.rejected.clone(),
            );
            registry.register(
                "subscribers",
                "Open subscriptions",
                metrics.subscribers.clone(),
            );
            registry.register(
                "subscribers_dropped",
                "Subscriptions the node ended, by reason",
                metrics.dropped.clone(),
            );
        });
        metrics
    }

    fn count(family: &Family<ReasonLabel, Counter>, reason: &'static str) {
        family.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// How a subscription learns why it ended, and how its connection is cut if it stops reading.
#[derive(Debug, Default)]
struct EndState {
    reason: Mutex<Option<EndReason>>,
    finished: AtomicBool,
    cut: Option<Arc<Notify>>,
}

#[derive(Debug)]
struct Slot {
    id: u64,
    events: mpsc::Sender<Arc<TopicEvent>>,
    end: Arc<EndState>,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    closed: bool,
    count: usize,
    by_topic: HashMap<String, Vec<Slot>>,
}

struct Inner {
    topics: BTreeMap<String, TopicInfo>,
    gossip: GossipService,
    local: PeerId,
    subscriber_buffer: usize,
    max_subscribers: usize,
    registry: Mutex<Registry>,
    metrics: TopicMetrics,
    last_sequence: AtomicU64,
    fan_out: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.fan_out.abort();
    }
}

/// The node's topics: publish, subscribe, close. Clones share them.
#[derive(Clone)]
pub struct Topics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Topics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topics")
            .field("topics", &self.inner.topics.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The registry holds plain data; a panic elsewhere does not invalidate it.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Topics {
    /// Starts gossip for `config`'s topics on `node` (its [`meshwire::protocols::GOSSIP`]
    /// protocol must be free). Must run inside a tokio runtime.
    pub fn start(node: &Node, config: &TopicsConfig) -> Result<Self, TopicsError> {
        let topics = config.resolve()?;
        let metrics = TopicMetrics::register(node);
        let settings = GossipSettings::new(TopicsConfig::gossip_config(&topics));
        let by_class: BTreeMap<ClassId, TopicInfo> = topics
            .values()
            .map(|topic| (topic.class, topic.clone()))
            .collect();
        let rejected = metrics.rejected.clone();
        let validator = Box::new(move |class: ClassId, payload: &Bytes| {
            let reason = match (by_class.get(&class), Envelope::decode(payload)) {
                (_, Err(_)) => "malformed",
                (Some(topic), Ok(envelope)) if envelope.topic == topic.name => {
                    if envelope.body.len() <= topic.policy.max_bytes {
                        return true;
                    }
                    "too_large"
                }
                _ => "unknown_topic",
            };
            TopicMetrics::count(&rejected, reason);
            false
        });
        let (gossip, delivered) = GossipService::spawn(node, settings, validator)?;
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            topics,
            gossip,
            local: node.peer_id(),
            subscriber_buffer: config.subscriber_buffer,
            max_subscribers: config.max_subscribers,
            registry: Mutex::new(Registry::default()),
            metrics,
            last_sequence: AtomicU64::new(0),
            fan_out: tokio::spawn(fan_out(weak.clone(), delivered)).abort_handle(),
        });
        Ok(Self { inner })
    }

    /// The configured topics by name.
    pub fn topics(&self) -> &BTreeMap<String, TopicInfo> {
        &self.inner.topics
    }

    /// The gossip service underneath.
    pub fn gossip(&self) -> &GossipService {
        &self.inner.gossip
    }

    /// Open subscriptions of `topic`.
    pub fn subscriber_count(&self, topic: &str) -> usize {
        lock(&self.inner.registry)
            .by_topic
            .get(topic)
            .map_or(0, Vec::len)
    }

    /// Current value of `meshwire_topic_subscribers_dropped_total{reason}`.
    pub fn dropped_count(&self, reason: EndReason) -> u64 {
        self.inner
            .metrics
            .dropped
            .get_or_create(&ReasonLabel {
                reason: reason.name(),
            })
            .get()
    }

    /// Current value of `meshwire_topic_refused_total{reason}`.
    pub fn refused_count(&self, reason: &'static str) -> u64 {
        self.inner
            .metrics
            .refused
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    /// Current value of `meshwire_topic_rejected_total{reason}` (messages from peers).
    pub fn rejected_count(&self, reason: &'static str) -> u64 {
        self.inner
            .metrics
            .rejected
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    fn refuse(&self, error: TopicsError) -> TopicsError {
        TopicMetrics::count(&self.inner.metrics.refused, error.reason());
        error
    }

    /// The configured topic called `name`; a refusal (counted) for an invalid or unknown name.
    pub fn topic(&self, name: &str) -> Result<&TopicInfo, TopicsError> {
        TopicName::new(name).map_err(|error| self.refuse(error.into()))?;
        self.inner
            .topics
            .get(name)
            .ok_or_else(|| self.refuse(TopicsError::UnknownTopic(name.to_string())))
    }

    /// Refuses (and counts) a body of `len` bytes, declared or read, over `topic`'s limit.
    pub fn check_size(&self, topic: &TopicInfo, len: usize) -> Result<(), TopicsError> {
        if len > topic.policy.max_bytes {
            return Err(self.refuse(TopicsError::TooLarge {
                topic: topic.name.to_string(),
                len,
                max: topic.policy.max_bytes,
            }));
        }
        Ok(())
    }

    /// Publishes `body` on `topic` to every peer and to this node's subscribers.
    pub fn publish(&self, topic: &str, body: Bytes) -> Result<Published, TopicsError> {
        let info = self.topic(topic)?;
        self.check_size(info, body.len())?;
        if lock(&self.inner.registry).closed {
            return Err(self.refuse(TopicsError::Closed));
        }
        let sequence = self.next_sequence();
        let envelope = Envelope {
            topic: info.name.clone(),
            origin: self.inner.local,
            sequence,
            body,
        };
        let id = self
            .inner
            .gossip
            .publish(info.class, envelope.encode())
            .map_err(|error| self.refuse(error.into()))?;
        self.inner
            .metrics
            .published
            .get_or_create(&TopicLabel {
                topic: topic.to_string(),
            })
            .inc();
        self.inner.dispatch(Arc::new(TopicEvent {
            id,
            topic: envelope.topic,
            origin: self.inner.local,
            from: self.inner.local,
            sequence,
            body: envelope.body,
        }));
        Ok(Published {
            id,
            class: info.class,
            sequence,
        })
    }

    /// The publish clock: µs since the Unix epoch, and always past the last one, so two
    /// publishes of one body are two messages, also across restarts.
    fn next_sequence(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
            });
        let previous = self
            .inner
            .last_sequence
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                Some(now.max(last.saturating_add(1)))
            })
            .unwrap_or_else(|last| last);
        now.max(previous.saturating_add(1))
    }

    /// Subscribes to `topic`. `cut`, when given, is notified to close the subscriber's connection
    /// if it is dropped and does not read its end within [`LAGGED_CUT_AFTER`].
    pub fn subscribe(
        &self,
        topic: &str,
        cut: Option<Arc<Notify>>,
    ) -> Result<Subscription, TopicsError> {
        let info = self.topic(topic)?;
        let mut registry = lock(&self.inner.registry);
        if registry.closed {
            drop(registry);
            return Err(self.refuse(TopicsError::Closed));
        }
        if registry.count >= self.inner.max_subscribers {
            drop(registry);
            return Err(self.refuse(TopicsError::SubscriberLimit {
                max: self.inner.max_subscribers,
            }));
        }
        let (sender, events) = mpsc::channel(self.inner.subscriber_buffer);
        let end = Arc::new(EndState {
            cut,
            ..EndState::default()
        });
        let id = registry.next_id;
        registry.next_id += 1;
        registry.count += 1;
        registry
            .by_topic
            .entry(info.name.to_string())
            .or_default()
            .push(Slot {
                id,
                events: sender,
                end: end.clone(),
            });
        self.inner.metrics.subscribers.inc();
        Ok(Subscription {
            topics: Arc::downgrade(&self.inner),
            topic: info.name.to_string(),
            id,
            events,
            end,
            done: false,
        })
    }

    /// Ends every subscription with [`EndReason::Shutdown`] and refuses new ones and publishes.
    pub fn close(&self) {
        let mut registry = lock(&self.inner.registry);
        registry.closed = true;
        let slots: Vec<Slot> = registry.by_topic.drain().flat_map(|(_, s)| s).collect();
        registry.count = 0;
        drop(registry);
        for slot in slots {
            self.inner.end(slot, EndReason::Shutdown);
        }
    }
}

impl Inner {
    /// Queues `event` for every subscriber of its topic; a full queue drops its subscriber.
    fn dispatch(&self, event: Arc<TopicEvent>) {
        let mut ended = Vec::new();
        {
            let mut registry = lock(&self.registry);
            let Some(slots) = registry.by_topic.get_mut(event.topic.as_str()) else {
                return;
            };
            let mut index = 0;
            while index < slots.len() {
                match slots[index].events.try_send(event.clone()) {
                    Ok(()) => index += 1,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        ended.push(slots.swap_remove(index));
                    }
                    // The subscription is gone; its drop removes the slot (or already has).
                    Err(mpsc::error::TrySendError::Closed(_)) => index += 1,
                }
            }
            registry.count -= ended.len();
        }
        for slot in ended {
            self.end(slot, EndReason::Lagged);
        }
    }

    /// Ends a slot already taken out of the registry: records why, closes its queue, and arms
    /// the cut of its connection.
    fn end(&self, slot: Slot, reason: EndReason) {
        *lock(&slot.end.reason) = Some(reason);
        TopicMetrics::count(&self.metrics.dropped, reason.name());
        self.metrics.subscribers.dec();
        drop(slot.events);
        if let Some(cut) = slot.end.cut.clone() {
            let end = slot.end;
            tokio::spawn(async move {
                tokio::time::sleep(LAGGED_CUT_AFTER).await;
                if !end.finished.load(Ordering::Acquire) {
                    cut.notify_one();
                }
            });
        }
    }

    /// Takes subscription `id` of `topic` out of the registry, if it is still there.
    fn remove(&self, topic: &str, id: u64) {
        let mut registry = lock(&self.registry);
        let Some(slots) = registry.by_topic.get_mut(topic) else {
            return;
        };
        if let Some(index) = slots.iter().position(|slot| slot.id == id) {
            slots.swap_remove(index);
            if slots.is_empty() {
                registry.by_topic.remove(topic);
            }
            registry.count -= 1;
            self.metrics.subscribers.dec();
        }
    }
}

/// Hands gossip's deliveries to the subscribers until the topics or the gossip service stop.
async fn fan_out(topics: Weak<Inner>, mut delivered: mpsc::Receiver<Delivered>) {
    while let Some(artifact) = delivered.recv().await {
        let Some(topics) = topics.upgrade() else {
            return;
        };
        // The validator accepted it, so it decodes.
        let Ok(envelope) = Envelope::decode(&artifact.payload) else {
            continue;
        };
        topics
            .metrics
            .received
            .get_or_create(&TopicLabel {
                topic: envelope.topic.to_string(),
            })
            .inc();
        topics.dispatch(Arc::new(TopicEvent {
            id: artifact.id,
            topic: envelope.topic,
            origin: envelope.origin,
            from: artifact.from,
            sequence: envelope.sequence,
            body: envelope.body,
        }));
    }
}

/// One subscriber's queue of a topic's messages. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    topics: Weak<Inner>,
    topic: String,
    id: u64,
    events: mpsc::Receiver<Arc<TopicEvent>>,
    end: Arc<EndState>,
    done: bool,
}

impl Subscription {
    /// The next message; after the node drops the subscription, what was queued, then
    /// [`SubscriptionItem::Ended`] once, then `None`.
    pub async fn next(&mut self) -> Option<SubscriptionItem> {
        if self.done {
            return None;
        }
        if let Some(event) = self.events.recv().await {
            return Some(SubscriptionItem::Event(event));
        }
        self.done = true;
        self.end.finished.store(true, Ordering::Release);
        // The queue closes only when the node ends the subscription, after it set the reason.
        let reason = (*lock(&self.end.reason)).unwrap_or(EndReason::Shutdown);
        Some(SubscriptionItem::Ended(reason))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.end.finished.store(true, Ordering::Release);
        if let Some(topics) = self.topics.upgrade() {
            topics.remove(&self.topic, self.id);
        }
    }
}
