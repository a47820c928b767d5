//! Client retries that cannot run the work twice: one idempotency key per logical request,
//! sent on every attempt, and a retry only where it is safe.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower::retry::RetryLayer;
//! use tower::timeout::TimeoutLayer;
//! use tower_idempotency_client::{RetryPolicy, StampKeyLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! // The order API runs behind an idempotency layer: its 5xx and lost answers are retried.
//! let policy = RetryPolicy::new().keys_honoured_by(["orders.internal".parse()?]);
//! let client = ServiceBuilder::new()
//!     .layer(StampKeyLayer::new()) // outside: one key per logical request
//!     .layer(RetryLayer::new(policy)) // inside: every attempt repeats it
//!     .layer(TimeoutLayer::new(Duration::from_secs(10))) // each attempt bounded
//!     .service(http);
//! # let _ = client;
//! # Ok(()) }
//! ```
//!
//! A server that de-duplicates is half of the story. The client must send **the same key on
//! every attempt** of one logical request. It retries what a retry may fix and stops on the
//! rest. Two stacks share one set of rules, [`RetryPolicy::decide`]:
//!
//! - **tower**: [`StampKeyLayer`] stamps the key, and [`RetryPolicy`] is a
//!   `tower::retry::Policy`. It serves hyper-util clients, and tonic channels with
//!   [`BufferRequestLayer`].
//! - **reqwest** (feature `reqwest`): `RetryMiddleware` stamps and retries in one piece, for
//!   `reqwest-middleware` clients.
//!
//! The crate holds none of the server's code. It reads the protocol's headers and gRPC codes,
//! so it talks to any server that follows the protocol. The `tower-idempotency` crate is one.
//!
//! # The rules
//!
//! **The key.** Each logical request gets one key, a random UUID v4 ([`new_key`]). It is
//! stamped before the first attempt and repeated on every retry. A request that already
//! carries a key keeps it. Give your own key when the logical request outlives the process:
//! store it with the work, and send it again after a restart. By default every method but
//! GET, HEAD, OPTIONS and TRACE is stamped.
//!
//! **Which servers honour keys.** A key protects a repeat only on a server that de-duplicates
//! by it. A server that ignores the header runs a repeated POST again. An answer does not tell
//! them apart, so you declare it. [`RetryPolicy::keys_honoured_by`] names the servers, by host
//! or by host and port. [`RetryPolicy::keys_honoured_by_all`] says every server does. The
//! default declares none.
//!
//! **What is retried**, always with the same key:
//!
//! | reply | nothing ran | GET, HEAD, OPTIONS, TRACE, PUT, DELETE | keyed POST, PATCH, … to a server declared to honour keys | keyed POST, PATCH, … to any other server | delay |
//! | --- | --- | --- | --- | --- | --- |
//! | connect failed, as the client's connect stage says | yes | retried | retried | retried | backoff |
//! | timeout, connection reset or closed before the answer | no | retried | retried | **stop** | backoff |
//! | 500, 502, 503, 504 and other 5xx | no | retried | retried | **stop** | `Retry-After` if sent, else backoff |
//! | 408, 425, 429 | yes | retried | retried | retried | `Retry-After` if sent, else backoff |
//! | 409 with `Retry-After`: the layer's `idempotency.in_flight`, the first attempt still runs | yes | retried | retried | retried | `Retry-After` |
//! | 409 without `Retry-After`: an application conflict | | stop | stop | stop | |
//! | 501, 505, 506, 508, 510, 511: the server cannot serve this request at all | | stop | stop | stop | |
//! | 400, 401, 403, 404, 413, every other 4xx, and 422 `idempotency.key_reused`: a bug in the caller | | stop | stop | stop | |
//! | 1xx, 2xx, 3xx | | final | final | final | |
//! | gRPC `UNAVAILABLE` | only with the layer's code, such as `idempotency.store_failed` | retried | retried | only with the layer's code | `grpc-retry-pushback-ms` if sent, else backoff |
//! | gRPC `ABORTED` with `idempotency.in_flight` | yes | retried | retried | retried | pushback |
//! | gRPC `RESOURCE_EXHAUSTED` with a pushback: `idempotency.scope_full` | only with the layer's code | retried | retried | only with the layer's code | pushback |
//! | any other gRPC status, `FAILED_PRECONDITION` for `idempotency.key_reused` included | | stop | stop | stop | |
//!
//! **The default, and why.** With no server declared, a keyed POST is repeated only after an
//! reply that shows the attempt ran nothing:
//!
//! - a failed connect: nothing was sent;
//! - a 4xx that refuses the request: 408, 425, 429, the in-flight 409;
//! - a gRPC status that the idempotency layer sent in place of the call.
//!
//! A timeout, a lost connection or a 5xx may follow a run. A proxy answers 502 or 503 after it
//! forwarded the request, for one. So the attempts stop there, with
//! [`StopReason::NotHonoured`]. The caller gets the answer or a [`RetryError`], with the key to
//! resume under once it knows what happened. This default never makes a POST run twice on a
//! server that ignores keys. Declare the servers that honour keys to have those replies
//! retried too.
//!
//! A failed connect counts only when the client says it failed in its connect stage:
//! reqwest's `is_connect()`, hyper-util's `is_connect()` with feature `hyper-util`, tonic's
//! `ConnectError` with feature `tonic`. An I/O error kind alone does not count. An unreachable
//! host, even a refused connection, may be reported on a connection that had sent the request.
//!
//! **What is never retried**: a POST, PATCH or other non-idempotent method **without a key**.
//! A retry could do the work twice; stamp a key to make it retryable. GET, HEAD, OPTIONS,
//! TRACE, PUT and DELETE are retried with or without a key, to any server.
//!
//! **Limits.** At most 5 attempts, see [`max_attempts`](RetryPolicy::max_attempts). No retry
//! starts more than 30 s after the first attempt, see [`deadline`](RetryPolicy::deadline).
//! Backoff doubles from 100 ms up to 5 s, see [`base_delay`](RetryPolicy::base_delay) and
//! [`max_delay`](RetryPolicy::max_delay). Each delay is drawn between half of it and all of
//! it. A `Retry-After` over 30 s is not waited for: the answer is returned. See
//! [`max_retry_after`](RetryPolicy::max_retry_after).
//!
//! **What the caller learns.** The final response carries an [`Attempts`] extension. It tells
//! how many attempts were made, why they stopped, and the key they carried. It tells whether
//! the answer was replayed (`Idempotent-Replayed: true`): an earlier attempt did the work, and
//! its answer was lost. When the attempts end in an error, the error is a [`RetryError`]. It
//! holds the same [`Attempts`] and what the last attempt met, [`RetryError::kind`]. To resume
//! a logical request later, send it again with that key.
//!
//! **Logs.** Each attempt emits one `tracing` event, target `tower_idempotency_client`. It
//! holds the attempt number, the status or failure, the delay, and the key's first 8
//! characters only. The key's `Debug` form is `Sensitive`.
//!
//! **The guarantee** is the server's: no duplicate processing within the limits of its store.
//! Retries are safe while the server keeps the first attempt's record, and while the first
//! attempt holds its lease. A retry after the record expired runs the work again.
//!
//! # tower and hyper-util
//!
//! The example above is the tower stack. The request body must be `Clone`, as `Full<Bytes>`
//! is: each attempt sends a clone. Bound each attempt with `tower::timeout::TimeoutLayer`
//! inside the retry layer. Its `BoxError` is read as a timeout. When the attempts give up, the
//! retry layer's error is then a [`RetryError`]: downcast the `BoxError`. A service below whose
//! error is not a `BoxError` has its error returned as is.
//!
//! # tonic
//!
//! A tonic channel takes the same layers, plus [`BufferRequestLayer`]. A `tonic::body::Body`
//! cannot be cloned, so the request message is read into memory first, up to a limit. Below
//! the retry layer it becomes a tonic body again. A streaming call whose caller is still
//! sending, or whose messages pass the limit, is sent once, never held or retried.
//!
//! gRPC statuses are read from a Trailers-Only response, which is how a server sends an error
//! and how the layer sends its rejections. A response whose status comes in its trailers has
//! already begun: it is final.
//!
//! A tonic client's requests carry no host at the retry layer. Declare the channel's server
//! with [`RetryPolicy::keys_honoured_by_all`] when it honours keys.
//!
//! ```no_run
//! use tower::ServiceBuilder;
//! use tower::retry::RetryLayer;
//! use tower_idempotency_client::{BufferRequestLayer, BufferedBody, RetryPolicy, StampKeyLayer};
//!
//! let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
//! let retrying = ServiceBuilder::new()
//!     .layer(StampKeyLayer::new())
//!     .layer(BufferRequestLayer::new())
//!     .layer(RetryLayer::new(RetryPolicy::new().keys_honoured_by_all()))
//!     .map_request(|req: http::Request<BufferedBody>| req.map(tonic::body::Body::new))
//!     .service(channel);
//! // OrdersClient::new(retrying): every unary call is stamped and retried.
//! # let _ = retrying;
//! ```
//!
//! # reqwest
//!
//! With feature `reqwest`, `RetryMiddleware` does both jobs for a `reqwest-middleware` client.
//! The crate re-exports the `reqwest` and `reqwest_middleware` it was built with.
//!
//! ```
//! # #[cfg(feature = "reqwest")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use tower_idempotency_client::reqwest_middleware::ClientBuilder;
//! use tower_idempotency_client::{Attempts, RetryMiddleware, RetryPolicy, reqwest};
//!
//! let policy = RetryPolicy::new().keys_honoured_by(["127.0.0.1:3000".parse()?]);
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(policy))
//!     .build();
//! let res = client
//!     .post("http://127.0.0.1:3000/orders")
//!     .header("content-type", "application/json")
//!     .body(r#"{"item":"book"}"#)
//!     .send()
//!     .await?;
//! let attempts = res.extensions().get::<Attempts>().map(Attempts::count);
//! println!("{} after {:?} attempts", res.status(), attempts);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | adds | companion crate |
//! | --- | --- | --- |
//! | `reqwest` | `RetryMiddleware`, and the re-exports `reqwest` and `reqwest_middleware` | reqwest 0.13, reqwest-middleware 0.5 |
//! | `hyper-util` | hyper-util's connect errors told apart: nothing was sent | hyper-util 0.1 |
//! | `tonic` | tonic's `ConnectError` told apart: nothing was sent | tonic 0.14 |
//! | `metrics` | the counter below, through the `metrics` facade | metrics 0.24 |
//!
//! # Metrics
//!
//! With feature `metrics`, one counter: `idempotency_client_attempts_total{decision}`. It
//! counts each attempt by what followed it: `retry`, or why the attempts stopped
//! ([`StopReason::as_str`]: `final`, `not_keyed`, `not_honoured`, …).

#![cfg_attr(docsrs, feature(doc_cfg))]

// `policy` holds the rules and their types, `classify` reads replies for them; `stamp`,
// `retry` (tower) and `middleware` (reqwest) are the stacks; `buffer` stands alone.
mod buffer;
mod classify;
mod error;
mod metrics;
#[cfg(feature = "reqwest")]
mod middleware;
mod policy;
mod protocol;
mod reply;
mod retry;
mod stamp;

pub use buffer::{BufferRequest, BufferRequestLayer, BufferedBody};
pub use error::RetryError;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use middleware::RetryMiddleware;
pub use policy::{Attempt, Attempts, Decision, RetryPolicy, StopReason};
pub use protocol::KEY_HEADER;
pub use reply::{Reply, RetryErrorKind};
pub use stamp::{StampKey, StampKeyLayer, new_key};

/// The reqwest crate (0.13) the middleware works with.
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use reqwest;
/// The reqwest-middleware crate (0.5) `RetryMiddleware` plugs into.
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use reqwest_middleware;

// The README's example, compiled as a doctest so that it cannot rot.
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
