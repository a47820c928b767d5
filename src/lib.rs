//! Tower middleware that makes retries safe.
//!
//! A client retries a `POST` after a timeout, a queue redelivers a message, a job runs twice:
//! each repeat carries the same idempotency key, and the repeat is answered from the record of
//! the first run instead of doing the work again.
//!
//! **The guarantee: no duplicate processing within the limits of the store.** It is
//! at-least-once execution with de-duplication, not exactly-once. The limits are the *lease*
//! (a process that dies mid-request, or cannot renew its claim, lets another run the work once
//! the lease lapses), the *retention* (a repeat after the record expired runs again) and the
//! *store's durability* (a record the store lost cannot answer a repeat). Tier C
//! (`transactional::within`, feature `postgres`) removes the lease's window for work that is
//! writes to PostgreSQL: the work and its record commit together.
//!
//! # Example
//!
//! ```
//! use axum::extract::Request;
//! use axum::http::{StatusCode, header::AUTHORIZATION};
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::{Router, routing::post};
//! use tower_idempotency::{IdempotencyLayer, Principal};
//!
//! async fn create_order() -> (StatusCode, &'static str) {
//!     (StatusCode::CREATED, r#"{"id":"o-1"}"#)
//! }
//!
//! // Keys are scoped per caller, so the layer needs to know who calls: your authentication
//! // puts a `Principal` into the request extensions before the idempotency layer runs. This
//! // demo takes the bearer token's text as the user name; a real service verifies the token
//! // first. Never give every caller the same principal: callers would then share keys, and
//! // one could be answered with another's recorded response.
//! async fn authenticate(mut req: Request, next: Next) -> Response {
//!     let user = req
//!         .headers()
//!         .get(AUTHORIZATION)
//!         .and_then(|v| v.to_str().ok())
//!         .and_then(|v| v.strip_prefix("Bearer "))
//!         .map(str::to_owned);
//!     if let Some(user) = user {
//!         req.extensions_mut().insert(Principal::new(user));
//!     }
//!     next.run(req).await // no principal: the layer answers a keyed request with 401
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new()) // inner: runs after authentication
//!     .layer(middleware::from_fn(authenticate)); // outer: runs first
//! ```
//!
//! A client sends `Idempotency-Key: <unique value>` on a request it may retry. The first
//! request runs; a repeat with the same key, caller and request gets the same status, headers
//! and body back with `Idempotent-Replayed: true`; a repeat while the first still runs gets
//! `409`, and the same key on a different request `422`.
//!
//! # Where to start
//!
//! **The layer.** [`IdempotencyLayer`] wraps any tower HTTP service (axum, hyper, tonic): the
//! check order, what is recorded and what is released, replays and rejections are in the
//! [`http`] module. The caller's identity comes from a [`Principal`] in the request
//! extensions; [`PrincipalMode`] and [`ResponseMode`] are its two most used settings.
//!
//! **Stores.** [`MemoryStore`] (the default) keeps records in the process, bounded;
//! `RedisStore` (feature `redis`) shares them between replicas; `PostgresStore` (feature
//! `postgres`) keeps them in a PostgreSQL table, as durable as your data. Implement the
//! [`Store`] trait for your own backend: the [`store`] module shows how, and its conformance
//! suite (feature `test-util`) checks that your store answers like ours.
//!
//! **In one transaction.** `transactional::within` (feature `postgres`, tier C) claims the key,
//! runs the work and writes its record in one PostgreSQL transaction, so a crash can never
//! leave the work without its record: for work that is writes to the same database.
//!
//! **In handlers.** The [`IdempotencyKey`] and [`DerivedKey`] extractors (feature `axum`,
//! see [`extract`]) give a handler its request's key, e.g. to forward a stable key to a
//! payment provider. The `#[idempotent]` attribute (feature `macros`, see `route`) makes one
//! axum handler idempotent where it is written, with options per route.
//!
//! **Calling an idempotent API.** The [`client`] module is the other half: it stamps a key
//! once per logical request and retries what is safe to retry with the same key, as a tower
//! layer and retry policy (hyper-util, tonic) or a `reqwest-middleware` middleware (feature
//! `reqwest`).
//!
//! **Sending once.** The [`outbound`] module wraps an outbound transport (an HTTP client, a
//! lettre mail transport, any tower service) so that a job that runs twice sends its email,
//! webhook or payment call once; a send of unknown delivery keeps its key, and the caller is
//! told so.
//!
//! **Below the doors.** A *door* is one way into the same machinery: the HTTP layer, the
//! attribute, the extractors and [`outbound`] are doors today. Each turns its input into a
//! key, a scope and a fingerprint and asks the [`engine`] to claim, run, and complete or
//! release; only the engine talks to the store. A new door (a queue consumer, say) is built on
//! [`engine::Engine`].
//!
//! # Features
//!
//! | feature | default | adds |
//! | --- | --- | --- |
//! | `axum` | yes | the extractors |
//! | `redis` | no | `RedisStore` |
//! | `redis-cluster` | no | `RedisStore` over Redis Cluster |
//! | `postgres` | no | `PostgresStore` and tier C, `transactional::within` (sqlx) |
//! | `macros` | no | `#[idempotent]` (enables `axum`) |
//! | `tonic` | no | `Rejection::to_status` and tonic's `NamedService` for the layered service |
//! | `test-util` | no | the store conformance suite, for your own `Store` |
//! | `reqwest` | no | `client::RetryMiddleware`, client retries for `reqwest-middleware` |
//! | `hyper-util` | no | hyper-util's connect errors told apart (nothing sent): the client's tower retries retry a POST whose connect failed to any server; the outbound door releases its key |
//! | `lettre` | no | `outbound::mail`, send-once email over lettre's `AsyncTransport` |
//! | `nats` | no | `message::jetstream`, the message door on async-nats JetStream consumers |
//! | `apalis` | no | `message::jobs`, the message door as an apalis worker layer |
//! | `json` | no | `outbound::Json` and `message::Json`: receipts and message results of any serde type kept as JSON |
//! | `metrics` | no | counters and histograms through the `metrics` facade (below) |
//!
//! # Metrics
//!
//! With the feature `metrics`, every door counts what it did through the
//! [`metrics`](https://docs.rs/metrics/0.24) facade, for whichever recorder the application
//! installs (`metrics-exporter-prometheus`, StatsD, ...). Without the feature the calls are
//! compiled out. Every label takes its values from a fixed list: never a key, principal, path
//! or other value that grows with the traffic.
//!
//! | metric | type | labels | counts |
//! | --- | --- | --- | --- |
//! | `idempotency_requests_total` | counter | `door`, `outcome` | each request a door decided on, once, by what it did |
//! | `idempotency_results_total` | counter | `door`, `result` | each claimed key (`outcome="fresh"`), once, by how it ended |
//! | `idempotency_store_duration_seconds` | histogram | `store`, `op`, `result` | each store step the engine runs, in seconds |
//! | `idempotency_memory_entries` | gauge | — | records the process's `MemoryStore`s hold (pending and completed), summed over the stores |
//! | `idempotency_memory_pending` | gauge | — | of those, pending claims |
//! | `idempotency_memory_bytes` | gauge | — | bytes counted against the stores' `max_bytes` |
//! | `idempotency_memory_early_drops_total` | counter | — | completed records dropped before their retention ended, to make room, in all the stores |
//! | `idempotency_client_attempts_total` | counter | `decision` | each attempt of the client's retries, by what followed |
//!
//! - `door`: `http` (`IdempotencyLayer`), `grpc` (the layer, on a gRPC request), `route`
//!   (`#[idempotent]` handlers and `IdempotentRoutes::layer`), `extract` (the extractors'
//!   own refusals: the layer already counted the request), `within` (tier C), `message`
//!   (queue consumers), `outbound` (send once).
//! - `outcome`: `fresh` (claimed, the work runs), `replayed`, `in_flight` (409),
//!   `key_reused` (422), `key_missing`, `key_invalid`, `principal_missing`, `body_too_large`,
//!   `body_unreadable`, `store_failed`, `scope_full` (429), `store_full`, `record_invalid`,
//!   `passthrough` (the layer acts on the method but the request has no key and needs none),
//!   `config_missing` (a wiring error: no `IdempotentRoutes`, an extractor without the layer).
//!   A method the layer does not act on (`GET`, by default) is not counted.
//! - `result`: `completed`, `released` (a retry runs again), `complete_failed` and
//!   `release_failed` (the key stays pending until its lease lapses; in `within`, the
//!   transaction rolled back), `lease_lost` (the lease had lapsed and another request held
//!   the key: not recorded), `abandoned` (the client went away before a streamed body ended),
//!   `held` (`outbound`: the delivery is unknown, the key is kept so nothing is sent again).
//! - `store`: `memory`, `redis`, `postgres`, or what a store of your own returns from
//!   [`Store::name`] (`custom` by default); `op`: `claim`, `complete`, `release`, `renew`;
//!   `result`: `ok`, or the error's kind (`unavailable`, `timeout`, `protocol`, `store_full`,
//!   `scope_full`, `conflict`).
//! - `decision`: `retry`, or why the client stopped: `final`, `not_keyed`, `not_honoured`, `not_replayable`,
//!   `attempts_exhausted`, `deadline_exceeded`, `retry_after_too_long`.
//!
//! A layer adds labels of its own with `IdempotencyLayer::metrics_label` (a route name, say),
//! fixed when it is built. The memory store sets its gauges at most once a second after a
//! claim or a completion; `MemoryStore::report_metrics` sets them now (call it where the
//! metrics are rendered). The quickstart serves them all at `GET /metrics`.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod detach;
mod fingerprint;
mod json;
mod key;
mod metrics;
mod record;
mod scope;
mod secret;

pub mod client;
pub mod engine;
pub mod http;
pub mod message;
pub mod outbound;
pub mod store;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod extract;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub mod route;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod transactional;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

#[doc(inline)]
pub use crate::http::{IdempotencyLayer, Principal, PrincipalMode, ResponseMode};
#[doc(inline)]
pub use crate::key::IdempotencyKey;
#[doc(inline)]
pub use crate::scope::DerivedKey;
#[doc(inline)]
pub use crate::secret::Secret;
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
pub use crate::route::IdempotentRoutes;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use tower_idempotency_macros::idempotent;

#[cfg(feature = "macros")]
#[doc(hidden)]
#[path = "macros_support.rs"]
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
