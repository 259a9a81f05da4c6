//! The object service over a [`meshwire::Node`], its redb store and its HTTP API.

pub mod http;
pub mod service;
pub mod store;

pub use service::{ObjectConfig, ObjectService, ObjectServiceError};
pub use store::{Store, StoreError, StoredObject};
