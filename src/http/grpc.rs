//! gRPC mode: the same [`IdempotencyLayer`](super::IdempotencyLayer) in front of a tonic server.
//!
//! A request whose `content-type` starts with `application/grpc` (`application/grpc`,
//! `application/grpc+proto`, …) is handled in gRPC mode, every other request in HTTP mode, so
//! one layer can sit in front of a server that speaks both. Nothing needs configuring and no
//! cargo feature is needed; the `tonic` feature only adds `Rejection::to_status` and
//! tonic's `NamedService` for the layered service.
//!
//! ```no_run
//! use tonic::transport::Server;
//! use tower_idempotency::IdempotencyLayer;
//!
//! # async fn run(routes: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
//! Server::builder()
//!     // Your authentication interceptor/layer goes first (outermost) and inserts a
//!     // `tower_idempotency::Principal` into the request extensions.
//!     .layer(IdempotencyLayer::new())
//!     .add_routes(routes) // or .add_service(OrdersServer::new(orders))
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Around a single generated service instead of the whole server, use tonic's
//! `LayerExt::named_layer` (keeps the service's name for routing):
//! `Server::builder().add_service(IdempotencyLayer::new().named_layer(OrdersServer::new(orders)))`.
//! With the `tonic` feature the layered service is itself a `NamedService`, so
//! `add_service(tower::ServiceBuilder::new().layer(idempotency).service(svc))` works too.
//!
//! # The request
//!
//! The check order is the one of HTTP mode (see [the module docs](super)):
//!
//! - **key**: the `idempotency-key` metadata entry (or the configured header, or `key_fn`);
//! - **principal**: the [`Principal`](super::Principal) request extension (or `principal_fn`),
//!   inserted by an interceptor or tower layer that runs before this one. With tonic's
//!   `InterceptorLayer`, what the interceptor puts into `Request::extensions_mut()` reaches the
//!   layer as an `http` extension;
//! - **fingerprint**: the default covers the HTTP method (always `POST`), the path (the gRPC
//!   method, `/orders.v1.Orders/Create`), the (empty) query, the `content-type` and the request
//!   body, that is the length-prefixed request message(s) exactly as sent (compressed bytes if
//!   the client compresses). Other metadata is not part of it (`grpc-timeout` differs between
//!   retries). A retry must send the same message under the same key.
//!
//! # Classification
//!
//! In gRPC mode the response's HTTP status is 200 and the outcome is in the gRPC status: the
//! `grpc-status` header of a Trailers-Only response, or else the `grpc-status` trailer. The layer
//! reads the response body (up to the record limit, `max_record_body`, default 1 MiB, and the
//! collection bound, `collect_timeout`, default 5 s) to see the trailers before it decides, and
//! only then sends the response on.
//!
//! | gRPC status | action |
//! | --- | --- |
//! | `OK` (0) | recorded |
//! | `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7), `FAILED_PRECONDITION` (9), `OUT_OF_RANGE` (11), `UNIMPLEMENTED` (12), `UNAUTHENTICATED` (16) | recorded: the caller caused them and the same request gets the same answer |
//! | `CANCELLED` (1), `UNKNOWN` (2), `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED` (8), `ABORTED` (10), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15) | released: transient, a retry runs the handler again |
//! | no `grpc-status`, or one that is not a number from 0 to 16 | released |
//! | the response (all messages) is over the record limit | released, not recorded (the status cannot be seen before the body is sent, and a status-only record would replay an empty stream); the client gets the whole response, a warning is logged |
//! | the response has not ended within the collection bound (a long or endless server stream) | released, not recorded, for the same reason; what was read goes out, then the rest as it comes |
//! | the response body fails while read | released; the client sees the same failure |
//! | the inner service returns `Err` | released, the error is returned unchanged |
//! | an HTTP status other than 200 | the HTTP table: 2xx, 3xx (but 304) and 4xx (but 408, 425, 429) recorded, the rest released |
//!
//! # What is recorded and replayed
//!
//! - the initial metadata (response headers) through the same allow list as HTTP: by default
//!   `content-type` and `grpc-encoding` (so a compressed response replays), plus what you add
//!   with `allow_header` (e.g. `x-order-id`);
//! - the response messages (the body), unless [`ResponseMode::StatusAndHeaders`](super::ResponseMode);
//! - the trailing metadata through the same allow list: the gRPC status trailers
//!   (`grpc-status`, `grpc-message`, `grpc-status-details-bin`) always, and the status's custom
//!   metadata only when it is on the allow list (add it with `allow_header`, e.g. `x-field`);
//!   nothing on the deny list. In a Trailers-Only response (how tonic sends an error returned by
//!   a handler) the status and its metadata are headers: the status trailers are recorded as
//!   trailers, allowed metadata as headers, the rest not at all.
//!
//! A replay is a valid gRPC response: the recorded initial metadata plus
//! `idempotent-replayed: true`, the recorded messages, then the recorded trailers. A record
//! without messages (an error, an empty stream, status mode) is replayed Trailers-Only, so the
//! `tonic::Status` a client gets carries the recorded metadata and `idempotent-replayed` in
//! `Status::metadata()`. Every replay re-validates the record (as in HTTP mode, plus: a
//! recorded 200 must carry a `grpc-status` that is recorded); one that fails is answered
//! `UNAVAILABLE` with `idempotency.record_invalid`, never replayed.
//!
//! [`ResponseMode::StatusAndHeaders`](super::ResponseMode) keeps no messages: a replay has the status
//! and metadata but no message, which a unary client takes as an error (tonic: `INTERNAL`,
//! "Missing response message") even for `OK`. Use it only for RPCs whose answer is the status
//! and metadata, or for streams where an empty stream is a valid answer.
//!
//! # Rejections
//!
//! A rejection in gRPC mode is a gRPC status, sent Trailers-Only (HTTP 200,
//! `content-type: application/grpc`, `grpc-status`, and `grpc-message` = `<code>: <detail>`,
//! percent-encoded, e.g. `idempotency.in_flight: a request with this key is still being
//! processed; retry later`), with `grpc-retry-pushback-ms` on the retryable ones. The
//! [`Rejection`](super::Rejection) is still inserted into the response's extensions.
//! [`render_rejection`](super::IdempotencyLayer::render_rejection) renders HTTP rejections
//! only; gRPC rejections always look like this ([`RejectionKind::grpc_code`](super::RejectionKind::grpc_code)).
//!
//! | code | gRPC status | why this one |
//! | --- | --- | --- |
//! | `idempotency.key_missing`, `idempotency.key_invalid` | `INVALID_ARGUMENT` | the request is malformed |
//! | `idempotency.body_unreadable` | `INVALID_ARGUMENT` | as HTTP's 400 |
//! | `idempotency.principal_missing` | `UNAUTHENTICATED` | no credentials for a keyed call |
//! | `idempotency.in_flight` | `ABORTED` | a concurrency conflict; gRPC says to retry it at a higher level, after the pushback |
//! | `idempotency.key_reused` | `FAILED_PRECONDITION` | not `ALREADY_EXISTS`: clients commonly read that as "my create already happened", which is false here (the key's earlier request was a different one); the caller must fix its state (use a new key), not retry |
//! | `idempotency.body_too_large` | `RESOURCE_EXHAUSTED` | what gRPC itself answers for a message larger than the receive limit; retrying the same request will not help |
//! | `idempotency.scope_full` | `RESOURCE_EXHAUSTED` | the caller's quota of calls in progress (pushback) |
//! | `idempotency.store_failed`, `idempotency.store_full`, `idempotency.record_invalid` | `UNAVAILABLE` | the handler did not run; retryable (pushback, except `record_invalid`) |
//!
//! # Streaming RPCs
//!
//! - **Client streaming and bidirectional**: the request stream is buffered whole (up to
//!   `max_request_body`, `RESOURCE_EXHAUSTED` above it) and fingerprinted before the handler
//!   runs, so the handler sees the stream only once the client has half-closed it. A
//!   bidirectional call in which the client waits for a reply before it finishes sending
//!   (ping-pong) would wait until its deadline: do not send a key on such calls, or put the
//!   layer only around the services that need it.
//! - **Server streaming**: the response stream is held back until it ends, then recorded with
//!   its status when it fits the record limit and ends within the collection bound (a replay
//!   sends every message again, then the status). When it grows over the limit or is still
//!   going at the bound, what was read is sent on followed by the rest of the stream as it
//!   comes, and the key is released at once (a retry runs again). Either way the client
//!   receives the whole stream, in order, with its status; a stream is never cut. A long-lived
//!   stream (a subscription) is held back for the collection bound only, then flows; raise
//!   `collect_timeout` for finite streams slower than 5 s that should be recorded.
//!
//! # gRPC-Web
//!
//! Put the layer inside tonic-web's layer, so it sees plain gRPC. A gRPC-Web response carries
//! its trailers inside the body, which the layer does not parse: such responses are released

// This module holds what the other parts of the layer share about gRPC: telling a gRPC request
// apart and reading its status. Classification, replay and rejections live next to their HTTP
// counterparts (`classify`, `replay`, `rejection`).

use super::headers::GRPC_STATUS;
use http::{HeaderMap, header};

/// A gRPC status code (the numbers of `tonic::Code`, without a tonic dependency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code with this number; `None` for a number that is not a gRPC code.
    pub(crate) fn from_i32(n: i32) -> Option<Self> {
        Some(match n {
            0 => Self::Ok,
            1 => Self::Cancelled,
            2 => Self::Unknown,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            _ => return None,
        })
    }

    /// The code's number, as sent in `grpc-status`.
    pub(crate) fn as_i32(self) -> i32 {
        self as i32
    }
}

/// Whether a request (or response) with these headers is gRPC: its `content-type` starts
/// with `application/grpc`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A `grpc-status` value: a decimal number and nothing else (kept as a number: one that is
/// not a gRPC code is still a status, an unrecordable one).
pub(crate) fn parse_status(value: &[u8]) -> Option<i32> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The `grpc-status` among these headers (or trailers), if it is a number.
pub(crate) fn status_of(headers: &HeaderMap) -> Option<i32> {
    parse_status(headers.get(GRPC_STATUS)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_is_told_by_its_content_type() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(!is_grpc(&h));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn status_values_are_strict() {
        assert_eq!(parse_status(b"0"), Some(0));
        assert_eq!(parse_status(b"16"), Some(16));
        for bad in [&b""[..], b" 0", b"0 ", b"+1", b"-1", b"1a", b"0000"] {
            assert_eq!(parse_status(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn codes_round_trip_through_their_numbers() {
        for n in 0..=16 {
            let code = GrpcCode::from_i32(n).expect("a gRPC code");
            assert_eq!(code.as_i32(), n);
        }
        assert_eq!(GrpcCode::from_i32(-1), None);
        assert_eq!(GrpcCode::from_i32(17), None);
    }
}
