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
//! 9. After the handler: 2xx and 4xx (but 408, 425, 429) are recorded, then sent; 1xx, 3xx, 5xx,
//!    408, 425, 429, an inner error and a body that fails while read are released. A body that
//!    goes out before the layer has read it whole is recorded only once it has ended (see
//!    [response bodies](#response-bodies)).
//!
//! The caller always gets the response its handler produced, also when recording it failed (the
//! key then stays pending until its lease lapses: 409 until then, a re-run after).
//!
//! If the response future is dropped before the handler finishes (the client went away), lease
//! renewal stops and the key stays pending until its lease lapses: the work may have happened,
//! so it is neither recorded nor released.
//!
//! # Response bodies
//!
//! A recordable response's body is read before the response goes out, up to the record limit
//! (`max_record_body`, default 1 MiB). Read whole, it is recorded (its bytes only in
//! [`ResponseMode::Full`]), then sent. A body over the limit goes out as it comes: what was
//! read first, then the rest, nothing lost and in order. Its record is status and headers only
//! (a warning is logged in full mode), and it is written only once the body has ended:
//!
//! | the body that goes out as it comes | the key |
//! | --- | --- |
//! | ends | completed (status and headers); the client sees the end of the body only once the record is written, so a retry sent after it is replayed |
//! | fails | released, not recorded: a retry runs again (a success the client never received is never replayed) |
//! | is dropped before its end (the client went away) | neither completed nor released: it stays pending until its lease lapses (409 until then, a re-run after), as when the client goes away mid-handler |
//!
//! While such a body streams, the key stays pending and its lease is renewed.
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
    ConfigError, ConfigErrorKind, DEFAULT_MAX_REQUEST_BODY, Principal, PrincipalMode, ResponseMode,
};
pub use extensions::ClaimedKey;
pub(crate) use extensions::KeyAbsent;
pub use future::ResponseFuture;
pub use headers::{DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, REPLAYED_HEADER};
pub use layer::IdempotencyLayer;
pub use rejection::{Rejection, RejectionKind};
pub use service::Idempotency;
