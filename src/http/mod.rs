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
//!    408, 425, 429, an inner error and a body that fails while read are released.
//!
//! The caller always gets the response its handler produced, also when recording it failed (the
//! key then stays pending until its lease lapses: 409 until then, a re-run after).
//!
//! If the response future is dropped before the handler finishes (the client went away), lease
//! renewal stops and the key stays pending until its lease lapses: the work may have happened,
//! so it is neither recorded nor released.
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
pub(crate) use extensions::KeyMissing;
pub use future::ResponseFuture;
pub use headers::{DEFAULT_ALLOWED_HEADERS, DENIED_HEADERS, KEY_HEADER, REPLAYED_HEADER};
// The gRPC wire names, shared with the client's retry rules.
pub(crate) use headers::{GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS};
pub use layer::IdempotencyLayer;
pub use rejection::{Rejection, RejectionKind};
pub use service::Idempotency;
