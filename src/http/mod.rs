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
//! 8. Claim: nothing found → run; pending with the same fingerprint → 409; done with the same
//!    fingerprint → replay; another fingerprint → 422; store failure → 503 (handler not run);
//!    full scope → 429; full store → 503.
//! 9. After the handler: 2xx and 4xx (but 408, 425, 429) are recorded, then sent; 1xx, 3xx, 5xx,
//!    408, 425, 429, an inner error and a body that fails while read are released. A streaming
//!    response (`text/event-stream`, or a body not ended within a bound) and a body over the
//!    record limit go out as they come, recorded as status and headers only once they have
//!    ended (see [response bodies](#response-bodies)).
//!
//! The caller always gets the response its handler produced, also when recording it failed (the
//! key then stays pending until its lease lapses: 409 until then, a re-run after). A response
//! with a recorded header or trailer too long for a record (a value over 64 KiB) is recorded
//! without that field, and a warning names it.
//!
//! If the response future is dropped before the handler finishes (the client went away), lease
//! renewal stops and the key stays pending until its lease lapses: the work may have happened,
//! so it is neither recorded nor released.
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
    ConfigError, ConfigErrorKind, DEFAULT_COLLECT_TIMEOUT, DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_STREAM_LEASE_LIMIT, DEFAULT_STREAMING_CONTENT_TYPES, Principal, PrincipalMode,
    ResponseMode,
};
pub use extensions::ClaimedKey;
pub(crate) use extensions::KeyMissing;
pub use future::ResponseFuture;
pub use headers::{
    DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, REPLAYED_HEADER, REPRESENTATION_HEADERS,
};
pub use layer::IdempotencyLayer;
pub use rejection::{Rejection, RejectionKind};
pub use service::Idempotency;
