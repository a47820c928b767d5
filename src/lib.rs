// The crate page. Blocks shared with the README are files of their own; scripts/readme.sh
// checks that the README carries them byte for byte.
#![doc = include_str!("docs/intro.md")]
#![doc = include_str!("docs/crate.md")]
#![doc = include_str!("docs/guarantee.md")]
#![doc = include_str!("docs/steps.md")]
#![doc = include_str!("docs/features.md")]
#![doc = include_str!("docs/namespaces.md")]
#![doc = include_str!("docs/metrics.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod hex;
mod metrics;

pub mod engine;
pub mod http;
pub mod message;
pub mod outbound;
pub mod store;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod transactional;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub mod webhook;

#[doc(inline)]
pub use crate::engine::key::IdempotencyKey;
#[doc(inline)]
pub use crate::engine::scope::DerivedKey;
#[doc(inline)]
pub use crate::engine::secret::Secret;
#[doc(inline)]
pub use crate::engine::steps::Steps;
#[doc(inline)]
pub use crate::error::{ConfigError, ConfigErrorKind};
#[doc(inline)]
pub use crate::http::{IdempotencyLayer, Principal, PrincipalMode, ResponseMode};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use crate::store::postgres::PostgresStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use crate::store::redis::RedisStore;
#[doc(inline)]
pub use crate::store::{MemoryStore, Store};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
#[doc(inline)]
pub use crate::http::route::IdempotentRoutes;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use tower_idempotency_macros::idempotent;

#[cfg(feature = "macros")]
#[doc(hidden)]
#[path = "http/macros_support.rs"]
pub mod __private;

// The README's examples, compiled as doctests so they cannot rot (they need every feature).
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "postgres",
    feature = "macros",
    feature = "tonic",
    feature = "reqwest"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
