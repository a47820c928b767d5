//! The HTTP door: [`IdempotencyLayer`] for axum, hyper and tonic servers.
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::http::{IdempotencyLayer, PrincipalMode};
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(IdempotencyLayer::default().require_key(false).principal(PrincipalMode::Optional));
//! ```
//!
//! A store or an [`Engine`](crate::engine::Engine) builds the layer:
//! `IdempotencyLayer::new(engine)`. The lease, the retention, the record limit and the secret
//! are the engine's settings. The rest are the layer's.
//!
//! # Check order
//!
//! 1. A method outside the configured set passes through with no store call. By default the
//!    layer acts on every method but GET, HEAD, OPTIONS and TRACE.
//! 2. The key is read from the `Idempotency-Key` header, another header, or a closure.
//! 3. No key and `require_key(false)`: the request passes through, before any principal check.
//! 4. The principal. Required by default: 401 without one. Optional: one shared anonymous
//!    scope.
//! 5. No key, when one is required: 400 `idempotency.key_missing`. An invalid key: 400
//!    `idempotency.key_invalid`.
//! 6. The body is buffered up to the limit: 413 above it, from `Content-Length` first, then
//!    while reading. Then it is fingerprinted: SHA-256 over method, path, raw query,
//!    content-type and body. [`Fingerprinting`] widens or narrows what counts.
//! 7. The store key is a domain-separated hash of namespace, tenant, principal and key.
//! 8. Claim. Nothing found: run. Pending with the same fingerprint: 409, with a `Retry-After`
//!    of the lease left, at most a third of the lease (one renewal period: 20 s for the default
//!    60 s lease), 1 s when the first run has just settled or the store cannot tell; every
//!    door computes it alike. Or, with [`wait_in_flight`](IdempotencyLayer::wait_in_flight), a
//!    wait for the first run and its replay. Done with the same fingerprint: replay. Another
//!    fingerprint: 422. A store failure: 503, the handler not run (a route that
//!    [fails open](IdempotencyLayer::fail_open) runs it unclaimed when the store is out of
//!    reach or silent). A full scope: 429. A full store: 503.
//! 9. After the handler, by status. 2xx, 3xx but 304, and 4xx but 408, 425 and 429 are
//!    recorded, then sent. A redirect such as `303 See Other` after a create is the work's
//!    final answer: it is replayed with its `Location`. 1xx, 304, 5xx, 408, 425, 429, an
//!    inner error and a body that fails while read are released. A
//!    [classification hook](#after-the-handler) can release more. A streaming response and a
//!    body over the record limit go out as they come. They are recorded as status and
//!    headers only, once they have ended: see [response bodies](#response-bodies).
//!    Before the status, what the handler's [`Steps`](crate::Steps) found: the key's recorded
//!    steps belong to another fingerprint: 422 `idempotency.key_reused`; a step record that
//!    fails validation: 503 `idempotency.record_invalid`. Either answers whatever the handler
//!    returned, and releases the key, so the first request's steps stay for its retry.
//!
//! The caller always gets the response its handler produced, also when recording it failed.
//! The key then stays pending until its lease lapses: 409 until then, a re-run after. A
//! recorded header or trailer too long for a record, a value over 64 KiB, is left out of the
//! record, and a warning names it.
//!
//! A run whose lease lapsed may find its key taken: the store was out of reach for longer than
//! the lease, say, and a retry claimed the key and ran the handler again. Each of the two
//! callers gets the response of its own run. Only the run that holds the key when it ends is
//! recorded, so every later retry is replayed that one, the winner's. The run that lost its
//! lease records nothing (`lease_lost` in the [metrics](crate#metrics)).
//!
//! # When the caller goes away
//!
//! The response future may be dropped before the handler finishes: the client went away, an
//! outer timeout fired. The claimed work then runs on by itself. Its outcome is recorded or
//! released as if the caller were still there: the retry gets the replay, the handler runs
//! once. Wait for such work at shutdown with [`IdempotencyLayer::drain`]. Turn it off with
//! [`run_to_completion(false)`](IdempotencyLayer::run_to_completion): the handler is then
//! cancelled, and the key stays pending until its lease lapses.
//!
//! Work that runs on is bounded. It is cancelled
//! [`detached_timeout`](IdempotencyLayer::detached_timeout) after its caller left, 5 min by
//! default. Work dropped while [`max_detached`](IdempotencyLayer::max_detached) works already
//! run on is cancelled at once. That bound is 1024 by default. Cancelled work records and
//! releases nothing. Its key stays pending until its lease lapses, as after a crash. A handler
//! that panicked is never run on either. Its key too is left to its lease.
//!
//! # Response bodies
//!
//! A recordable response's body is read before the response goes out. The read stops at the
//! record limit, the engine's `max_record_body`, 1 MiB by default. It also stops at the
//! collection bound, 5 s by default, counted from the handler's answer. Read whole, the body
//! is recorded, then sent. Its bytes are kept only in [`ResponseMode::Full`]. Any other body
//! goes out as it comes, never held back until its end. [`Streaming`] sets the bounds.
//!
//! | the response | goes out |
//! | --- | --- |
//! | a streaming media type (`text/event-stream` by default) | at once, frame by frame |
//! | a body over the record limit | what was read, then the rest as it comes; a warning is logged in full mode |
//! | a body not ended within the collection bound: a long download, a chat completion of another type | what was read, then the rest as it comes |
//!
//! Nothing is lost and the order is kept. Such a response is recorded as status and headers
//! only, once its body has ended. A replay has an empty body, so the headers that describe a
//! body are dropped: [`REPRESENTATION_HEADERS`].
//!
//! | the body that goes out as it comes | the key |
//! | --- | --- |
//! | ends | completed with status and headers; the client sees the end of the body only once the record is written, so a retry sent after it is replayed |
//! | fails | released, not recorded: a retry runs again, and a success the client never received is never replayed |
//! | is dropped before its end: the client went away | neither completed nor released: pending until its lease lapses, as when the client goes away mid-handler |
//! | has not ended after the stream lease limit (5 min by default) | its lease is no longer renewed and lapses: a retry after that runs again while the first stream goes on; a body that ends later is still recorded unless a retry holds the key by then |
//!
//! A response [declared](declare) `Record` is the exception. Its status and headers are
//! recorded at once, before its body goes on. Neither a failing body, nor a client that
//! leaves, nor the stream lease limit can then free its key or let it lapse.
//!
//! Until its end, or the limit, the key stays pending with its lease renewed: a repeat gets
//! 409. See [`Streaming::lease_limit`] for the trade-off.
//!
//! # After the handler
//!
//! A released response is sent and the key freed: a retry under it runs the handler again. A
//! recorded one is the key's answer for the retention. A retry gets it replayed. Another
//! request under the key gets 422 `idempotency.key_reused`.
//!
//! **Validation errors.** The idempotency step belongs after validation. Then a request that
//! fails validation can be corrected and sent again with the same key. But a layer around an
//! axum router runs *before* the handlers' extractors. Their rejections are answered inside
//! the layer and, by the table above, recorded. Such rejections are malformed JSON with 400,
//! a missing `content-type` with 415, and a `Json<T>` that does not deserialize with 422. The
//! corrected request then gets 422 `idempotency.key_reused`. Choose one of:
//!
//! - `#[idempotent]` on the handler, with feature `macros`. It runs the handler's extractors
//!   before it claims the key, so an extractor rejection never touches the store. The right
//!   default for axum handlers.
//! - [`classify(ValidationClassifier)`](IdempotencyLayer::classify): 400, 413, 415 and
//!   422 are released. A handler's own answer with one of these statuses is released too. Use
//!   it when those statuses mean "nothing was done" in your handlers.
//! - Your own hook, any [`Classify`](crate::engine::Classify) over the response's
//!   [`Parts`](http::response::Parts): its status, headers and extensions give a
//!   [`Verdict`](crate::engine::Verdict).
//! - No hook, when the handlers validate nothing the layer could see first, or validation
//!   runs in a middleware outside the layer.
//!
//! A hook only releases or holds more. It is asked about the responses the table records,
//! never about a released one.
//!
//! **The handler's own word.** A handler that knows what its work did says so: it puts a
//! [`Verdict`](crate::engine::Verdict) into its response's extensions, with [`declare`] or as
//! an axum response part. The layer follows it over the table and the hook. `Release` frees
//! the key: nothing happened. `Record` records the response whatever its status: a 500 after
//! a charge that went through is replayed, never charged again. `Hold` keeps the key's claim
//! for one lease from the response, as every door holds a key: a retry neither replays nor
//! runs at once. See [`declare`] for the
//! reasoning.
//!
//! # Two idempotency layers on one request
//!
//! A route should have one idempotency layer, but two may meet: a router-wide layer and an
//! `#[idempotent]` handler, or the layer added twice. The crate keeps them from poisoning a
//! key:
//!
//! - A layer may find the request already claimed under the store key it would claim: a
//!   [`ClaimedKey`] in its extensions. It passes the request through, and the outer layer's
//!   claim, settings and record apply. A warning is logged the first time, then debug lines,
//!   since one of the two layers is redundant.
//! - A layer never records a rejection of another layer inside it: a response carrying a
//!   [`Rejection`] extension, such as the inner layer's 409. It releases its claim, and the
//!   caller gets the rejection with its `Retry-After`.
//!
//!
#![doc = include_str!("grpc.md")]

// Imports run one way. `body`, `headers`, `extensions`, `declare`, `json`, `streaming` import
// no sibling, `fingerprint` only `json`, `grpc` only `headers`; then `rejection` → `config` →
// `classify` → `replay` → `future` → `service` → `layer`, each using only modules before it,
// never one after it.
mod body;
mod classify;
mod config;
mod declare;
pub(crate) mod extensions;
mod fingerprint;
mod future;
pub(crate) mod grpc;
#[cfg(feature = "json")]
mod json;
mod streaming;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod extract;

mod headers;
mod layer;
#[cfg(any(feature = "utoipa", feature = "aide"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "utoipa", feature = "aide"))))]
pub mod openapi;
mod rejection;
mod replay;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub mod route;
mod service;

pub use crate::engine::detach::Drain;
pub use body::{RequestBody, ResponseBody};
pub use config::{Principal, PrincipalMode, ResponseMode, ValidationClassifier};
pub use declare::declare;
pub use extensions::ClaimedKey;
// Read by the axum extractors only.
#[cfg(feature = "axum")]
pub(crate) use extensions::KeyMissing;
pub use future::ResponseFuture;
pub use headers::{
    DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, KEY_HEADER, REPLAYED_HEADER, REPRESENTATION_HEADERS,
};
// The deny list, shared with the outbound door's HTTP receipts.
pub use fingerprint::Fingerprinting;
pub(crate) use headers::is_denied_bytes;
pub use layer::IdempotencyLayer;
pub use rejection::{Rejection, RejectionKind};
pub use service::Idempotency;
pub use streaming::Streaming;

// For `#[idempotent]`, which runs the handler's extractors between the checks and the claim.
#[cfg(feature = "macros")]
pub(crate) use {
    grpc::is_grpc,
    service::{Plan, plan},
};
// For `#[idempotent]` and the webhook door, which buffer the body before the claim.
#[cfg(any(feature = "macros", feature = "webhook"))]
pub(crate) use {
    body::read_limited,
    service::{read_rejection, render},
};
// The webhook door sets up an inner layer of its own.
#[cfg(feature = "webhook")]
pub(crate) use {
    body::ReadError,
    config::{Config, KeySource},
};
