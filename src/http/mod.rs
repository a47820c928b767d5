//! The HTTP door: [`IdempotencyLayer`] for axum, hyper and tonic servers.
//!
//! # Check order
//!
//! 1. A method outside the configured set (default: all but GET, HEAD, OPTIONS, TRACE) passes
//!    through with no store call.
//! 2. The key is read from the `Idempotency-Key` header (or another header, or a closure).
//! 3. No key and `required(false)`: the request passes through, before any principal check.
//! 4. The principal: required (default) → 401 without one; optional → one shared anonymous scope.
//! 5. No key (required) → 400 `idempotency.key_missing`; an invalid key → 400 `idempotency.key_invalid`.
//! 6. The body is buffered up to the limit (413 above it, from `Content-Length` first, then while
//!    reading) and fingerprinted: SHA-256 over method, path, raw query, content-type and body.
//! 7. The store key is a domain-separated hash of namespace, tenant, principal and key.
//! 8. Claim: nothing found → run; pending with the same fingerprint → 409; done with the same
//!    fingerprint → replay; another fingerprint → 422; store failure → 503 (handler not run);
//!    full scope → 429; full store → 503.
//! 9. After the handler: 2xx, 3xx (but 304) and 4xx (but 408, 425, 429) are recorded, then
//!    sent (a redirect such as `303 See Other` after a create is the work's final answer, and
//!    is replayed with its `Location`); 1xx, 304, 5xx, 408, 425, 429, an inner error and a body
//!    that fails while read are released. A [classification hook](#after-the-handler) can
//!    release more.
//!
//! The caller always gets the response its handler produced, also when recording it failed (the
//! key then stays pending until its lease lapses: 409 until then, a re-run after).
//!
//! If the response future is dropped before the handler finishes (the client went away), lease
//! renewal stops and the key stays pending until its lease lapses: the work may have happened,
//! so it is neither recorded nor released.
//!
//! # After the handler
//!
//! A released response is sent and the key freed: a retry under it runs the handler again. A
//! recorded one is the key's answer for the retention: a retry gets it replayed, and another
//! request under the key gets 422 `idempotency.key_reused`.
//!
//! **Validation errors.** The idempotency step belongs after validation, so that a request
//! that fails validation can be corrected and sent again with the same key. A layer around an
//! axum router runs *before* the handlers' extractors, so their rejections (malformed JSON →
//! 400, a missing `content-type` → 415, a `Json<T>` that does not deserialize → 422) are
//! answered inside the layer and, by the table above, recorded: the corrected request then
//! gets 422 `idempotency.key_reused`. Choose one of:
//!
//! - [`#[idempotent]`](crate::idempotent) on the handler: it runs the handler's extractors
//!   before it claims the key, so an extractor rejection is answered without touching the
//!   store (the right default for axum handlers);
//! - the layer with [`classify(release_validation_errors)`](IdempotencyLayer::classify):
//!   400, 413, 415 and 422 are released. A handler's own answer with one of these statuses is
//!   released too, so use it when those statuses mean "nothing was done" in your handlers;
//! - your own hook ([`IdempotencyLayer::classify`]): the response's status, headers and
//!   extensions decide [`Classification::Record`] or [`Classification::Release`];
//! - the default (no hook) when the handlers validate nothing the layer could see first, or
//!   validation runs in a middleware outside the layer.
//!
//! A hook only releases more: it is asked about the responses the table records, never about
//! a released one.
//!
//! # Two idempotency layers on one request
//!
//! A route should have one idempotency layer, but two may meet: a router-wide layer and an
//! [`#[idempotent]`](crate::idempotent) handler, or the layer added twice. The crate keeps them
//! from poisoning a key:
//!
//! - a layer that finds the request already claimed (a [`ClaimedKey`] in its extensions) under
//!   the store key it would claim passes the request through: the outer layer's claim,
//!   settings and record apply. A warning is logged the first time (then debug lines), since
//!   one of the two layers is redundant;
//! - a layer never records a rejection of another layer inside it (a response carrying a
//!   [`Rejection`] extension, e.g. the inner layer's 409 for a key in flight in its own
//!   namespace): it releases its claim, and the caller gets the rejection with its
//!   `Retry-After`.
//!
//! # gRPC
//!
//! A request whose `content-type` starts with `application/grpc` is handled in
//! [gRPC mode](grpc): the same steps, but classified by its gRPC status (read from the
//! trailers), replayed with its trailers, and rejected with gRPC statuses instead of
//! problem+json. One layer serves HTTP and gRPC callers side by side.
//!
//! # Example
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::http::{IdempotencyLayer, PrincipalMode};
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(IdempotencyLayer::new().required(false).principal(PrincipalMode::Optional));
//! ```

// Imports run one way. `body`, `headers` and `extensions` import no sibling, `grpc` only
// `headers`; then `rejection` → `config` → `classify` → `replay` → `future` → `service` →
// `layer`, each using only modules before it, never one after it.
mod body;
mod classify;
mod config;
mod extensions;
mod future;
pub mod grpc;
mod headers;
mod layer;
mod rejection;
mod replay;
mod service;

pub use body::{RequestBody, ResponseBody};
pub use config::{
    Classification, ConfigError, ConfigErrorKind, DEFAULT_MAX_REQUEST_BODY, Principal,
    PrincipalMode, ResponseMode, release_validation_errors,
};
pub use extensions::ClaimedKey;
pub(crate) use extensions::KeyAbsent;
pub use future::ResponseFuture;
pub use headers::{DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, REPLAYED_HEADER};
pub use layer::IdempotencyLayer;
pub use rejection::{Rejection, RejectionKind};
pub use service::Idempotency;

// For `#[idempotent]`, which runs the handler's extractors between the checks and the claim.
#[cfg(feature = "macros")]
pub(crate) use {
    body::read_limited,
    grpc::is_grpc,
    service::{Plan, plan, read_rejection, render},
};
