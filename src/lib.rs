#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
pub mod engine;
pub mod fingerprint;
pub mod key;
pub mod record;
pub mod scope;
pub mod secret;
pub mod store;

pub use engine::{Begin, Engine, Ticket};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError, KeyErrorKind};
pub use record::{Record, RecordError, StoredResponse};
pub use scope::{DerivedKey, Scope, StoreKey};
pub use secret::{Secret, SecretTooShort};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
pub use store::{Claim, MemoryStore, Store, StoreError, StoreErrorKind, Token};
pub mod http;

pub use crate::http::{IdempotencyLayer, Principal};

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub mod route;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use route::IdempotencyConfig;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use tower_idempotency_macros::idempotent;
#[cfg(feature = "macros")]
#[doc(hidden)]
#[path = "macros_support.rs"]
pub mod __private;
