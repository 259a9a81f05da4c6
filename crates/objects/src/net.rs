//! The object service over a [`meshwire::Node`], its redb store, its HTTP API, and the daemon that assembles them.

pub mod daemon;
pub mod http;
pub mod ring;
pub mod service;
pub mod store;
pub mod topics;

pub use daemon::{Daemon, DaemonBuilder, DaemonError};
pub use http::auth::{AuthError, HttpAuth, Token, TOKEN_FILE};
pub use http::limits::{HttpLimits, LimitsError};
pub use http::serve::HttpMetrics;
pub use service::{
    ObjectConfig, ObjectService, ObjectServiceError, PhysicalClock, ReplicaError, ServiceOptions,
    SystemClock, WriteOutcome,
};
pub use store::{
    CommitCounts, Store, StoreError, StoredObject,
    DEFAULT_MEMORY_BYTES as DEFAULT_STORE_MEMORY_BYTES,
};
pub use topics::{
    EndReason, Published, Subscription, SubscriptionItem, TopicEvent, TopicInfo, TopicPolicy,
    Topics, TopicsConfig, TopicsError,
};
