//! The HTTP door: [`IdempotencyLayer`] for axum, hyper and tonic servers.
//!
//! # Check order
//!
//! 1. A method outside the configured set (default: all but GET, HEAD, OPTIONS, TRACE) passes
//!    through with no store call.
//! 2. The key is read from the `Idempotency-Key` header (or another header, or a closure);
//!    without one, from a field of a JSON body when
//!    [`key_from_json_field`](IdempotencyLayer::key_from_json_field) is set (the body is then
//!    read first, up to the limit of step 6, and steps 3–5 run on what it holds).
//! 3. No key and `required(false)`: the request passes through, before any principal check.
//! 4. The principal: required (default) → 401 without one; optional → one shared anonymous scope.
//! 5. No key (required) → 400 `idempotency.key_missing`; an invalid key → 400 `idempotency.key_invalid`.
//! 6. The body is buffered up to the limit (413 above it, from `Content-Length` first, then while
//!    reading) and fingerprinted: SHA-256 over method, path, raw query, content-type and body
//!    (a JSON body by value with
//!    [`fingerprint_json_by_value`](IdempotencyLayer::fingerprint_json_by_value)).
//! 7. The store key is a domain-separated hash of namespace, tenant, principal and key.
//! 8. Claim: nothing found → run; pending with the same fingerprint → 409 with a
//!    `Retry-After` from the lease left (or, with
//!    [`wait_in_flight`](IdempotencyLayer::wait_in_flight), a wait for the first run and its
//!    replay); done with the same
//!    fingerprint → replay; another fingerprint → 422; store failure → 503 (handler not run);
//!    full scope → 429; full store → 503.
//! 9. After the handler: 2xx, 3xx (but 304) and 4xx (but 408, 425, 429) are recorded, then
//!    sent (a redirect such as `303 See Other` after a create is the work's final answer, and
//!    is replayed with its `Location`); 1xx, 304, 5xx, 408, 425, 429, an inner error and a body
//!    that fails while read are released. A [classification hook](#after-the-handler) can
//!    release more. A streaming response (`text/event-stream`, or a body not ended within a
//!    bound) and a body over the record limit go out as they come, recorded as status and
//!    headers only once they have ended (see [response bodies](#response-bodies)).
//!
//! The caller always gets the response its handler produced, also when recording it failed (the
//! key then stays pending until its lease lapses: 409 until then, a re-run after). A response
//! with a recorded header or trailer too long for a record (a value over 64 KiB) is recorded
//! without that field, and a warning names it.
//!
//! If the response future is dropped before the handler finishes (the client went away, an
//! outer timeout fired), the claimed work runs on by itself and its outcome is recorded or
//! released as if the caller were still there: the retry gets the replay, the handler runs
//! once. Wait for such work at shutdown with [`IdempotencyLayer::in_flight`]; turn it off with
//! [`run_to_completion(false)`](IdempotencyLayer::run_to_completion) (the handler is then
//! cancelled, and the key stays pending until its lease lapses).
//!
//! Work that runs on is bounded: it is cancelled [`detached_timeout`](IdempotencyLayer::detached_timeout)
//! after its caller left (default 5 min), and work dropped while
//! [`max_detached`](IdempotencyLayer::max_detached) works already run on (default 1024) is
//! cancelled at once. Cancelled work records and releases nothing: its key stays pending until
//! its lease lapses (409 until then, a re-run after), as after a crash. A handler that panicked
//! is never run on either; its key too is left to its lease.
//!
//! # Response bodies
//!
//! A recordable response's body is read before the response goes out, up to the record limit
//! (`max_record_body`, default 1 MiB) and the collection bound (`collect_timeout`, default
//! 5 s, counted from the handler's answer). Read whole, it is recorded (its bytes only in
//! [`ResponseMode::Full`]), then sent. Any other body goes out as it comes, never held back
//! until its end:
//!
//! | the response | goes out |
//! | --- | --- |
//! | a streaming media type (`streaming_content_types`, default `text/event-stream`) | at once, frame by frame |
//! | a body over the record limit | what was read, then the rest as it comes (a warning is logged in full mode) |
//! | a body that has not ended within the collection bound (a long download, a chat completion streamed as another type) | what was read, then the rest as it comes |
//!
//! Nothing is lost and the order is kept. Such a response is recorded as status and headers
//! only (a replay has an empty body, so the headers that describe a body are dropped:
//! [`REPRESENTATION_HEADERS`]), and only once its body has ended:
//!
//! | the body that goes out as it comes | the key |
//! | --- | --- |
//! | ends | completed (status and headers); the client sees the end of the body only once the record is written, so a retry sent after it is replayed |
//! | fails | released, not recorded: a retry runs again (a success the client never received is never replayed) |
//! | is dropped before its end (the client went away) | neither completed nor released: it stays pending until its lease lapses (409 until then, a re-run after), as when the client goes away mid-handler |
//! | has not ended after `stream_lease_limit` (default 5 min) | its lease is no longer renewed and lapses: a retry after that runs again while the first stream goes on; a body that ends later is still recorded unless a retry holds the key by then |
//!
//! A response [declared definitive](Declared::Definitive) is the exception: its status and
//! headers are recorded at once, before its body goes on, so neither a failing body, nor a
//! client that leaves, nor the stream lease limit can free its key or let it lapse.
//!
//! Until its end (or the limit) the key stays pending, its lease renewed, so a duplicate gets
//! 409. The limit is the trade-off for a stream that never ends (a subscription sent with a
//! key): renewing its lease forever would answer every retry with 409 and pin a pending entry
//! for as long as the connection lives; recording it at once would replay a success whose
//! body may still fail. Raise `stream_lease_limit` for long finite streams whose work must not
//! run twice.
//!
//! Why 5 s for the collection bound: a body that is produced at once (almost every JSON
//! answer) or merely forwarded ends well within it, so it is recorded whole; a body still
//! going after 5 s is a stream by nature, and 5 s is far below the idle and first-byte timeouts
//! of clients and proxies (commonly 30–60 s), so holding it back that long breaks nobody. Set
//! it shorter for interactive streams of a type not on the streaming list, longer for slow
//! finite bodies that should be recorded whole.
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
//! - `#[idempotent]` (feature `macros`) on the handler: it runs the handler's extractors
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
//! **The handler's own word.** A handler that knows what its work did says so with a
//! [`Declared`] marker in its response's extensions, and the layer follows it over the table
//! and the hook: [`NotStarted`](Declared::NotStarted) releases the key (nothing happened),
//! [`Definitive`](Declared::Definitive) records the response whatever its status (a 500 after
//! a charge that went through is replayed, never charged again), and
//! [`Ambiguous`](Declared::Ambiguous) keeps the key pending until its lease lapses (a retry
//! neither replays nor runs at once). See [`Declared`] for the reasoning.
//!
//! # Two idempotency layers on one request
//!
//! A route should have one idempotency layer, but two may meet: a router-wide layer and an
//! `#[idempotent]` (feature `macros`) handler, or the layer added twice. The crate keeps them
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

// Imports run one way. `body`, `headers`, `extensions`, `declare`, `fingerprint` and
// `kept` import no sibling, `grpc` only
// `headers`; then `rejection` → `config` → `classify` → `replay` → `future` → `service` →
// `layer`, each using only modules before it, never one after it.
mod body;
mod classify;
mod config;
mod declare;
mod extensions;
mod fingerprint;
mod future;
pub mod grpc;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod extract;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub mod route;
mod headers;
mod kept;
mod layer;
mod rejection;
mod replay;
mod service;

pub use crate::engine::detach::Drain;
pub use body::{RequestBody, ResponseBody};
pub use config::{
    Classification, ConfigError, ConfigErrorKind, DEFAULT_COLLECT_TIMEOUT,
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_STREAM_LEASE_LIMIT, DEFAULT_STREAMING_CONTENT_TYPES,
    Principal, PrincipalMode, ResponseMode, release_validation_errors,
};
pub use declare::Declared;
pub use extensions::ClaimedKey;
// Read by the axum extractors only.
#[cfg(feature = "axum")]
pub(crate) use extensions::KeyMissing;
pub use future::ResponseFuture;
pub use headers::{
    DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, KEY_HEADER, REPLAYED_HEADER, REPRESENTATION_HEADERS,
};
pub use kept::{KEPT_UNTIL_HEADER, RECORD_AGE_HEADER};
// The deny list, shared with the outbound door's HTTP receipts.
pub(crate) use headers::is_denied_bytes;
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
