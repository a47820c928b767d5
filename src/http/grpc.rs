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
//! reads the response body (up to the record limit, `max_record_body`, default 1 MiB) to see the
//! trailers before it decides, and only then sends the response on.
//!
//! | gRPC status | action |
//! | --- | --- |
//! | `OK` (0) | recorded |
//! | `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7), `FAILED_PRECONDITION` (9), `OUT_OF_RANGE` (11), `UNIMPLEMENTED` (12), `UNAUTHENTICATED` (16) | recorded: the caller caused them and the same request gets the same answer |
//! | `CANCELLED` (1), `UNKNOWN` (2), `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED` (8), `ABORTED` (10), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15) | released: transient, a retry runs the handler again |
//! | no `grpc-status`, or one that is not a number from 0 to 16 | released |
//! | the response (all messages) is over the record limit | released, not recorded (the status cannot be seen before the body is sent, and a status-only record would replay an empty stream); the client gets the whole response, a warning is logged |
//! | the response body fails while read | released; the client sees the same failure |
//! | the inner service returns `Err` | released, the error is returned unchanged |
//! | an HTTP status other than 200 | the HTTP table: 2xx and 4xx (but 408, 425, 429) recorded, the rest released |
//!
//! # What is recorded and replayed
//!
//! - the initial metadata (response headers) through the same allow list as HTTP: by default
//!   `content-type` and `grpc-encoding` (so a compressed response replays), plus what you add
//!   with `allow_header` (e.g. `x-order-id`);
//! - the response messages (the body), unless [`ResponseMode::Status`](super::ResponseMode);
//! - the trailing metadata (`grpc-status`, `grpc-message`, `grpc-status-details-bin` and the
//!   status's custom metadata): everything but the fixed deny list. In a Trailers-Only response
//!   (how tonic sends an error returned by a handler) the status and its metadata are headers;
//!   they are recorded as trailers (every header that is neither allowed nor denied).
//!
//! A replay is a valid gRPC response: the recorded initial metadata plus
//! `idempotent-replayed: true`, the recorded messages, then the recorded trailers. A record
//! without messages (an error, an empty stream, status mode) is replayed Trailers-Only, so the
//! `tonic::Status` a client gets carries the recorded metadata and `idempotent-replayed` in
//! `Status::metadata()`. Every replay re-validates the record (as in HTTP mode, plus: a
//! recorded 200 must carry a `grpc-status` that is recorded); one that fails is answered
//! `UNAVAILABLE` with `idempotency.record_invalid`, never replayed.
//!
//! [`ResponseMode::Status`](super::ResponseMode) keeps no messages: a replay has the status
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
//! [`Rejection`] is still inserted into the response's extensions.
//! [`render_rejection`](super::IdempotencyLayer::render_rejection) renders HTTP rejections
//! only; gRPC rejections always look like this ([`RejectionKind::grpc_code`]).
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
//!   its status when it fits the record limit (a replay sends every message again, then the
//!   status). When it grows over the limit, what was read is sent on followed by the rest of
//!   the stream as it comes, and the key is released. Either way the client receives the whole
//!   stream, in order, with its status; a stream is never cut. A long-lived stream (a
//!   subscription) would be held back for its whole life: do not send a key on such calls.
//!
//! # gRPC-Web
//!
//! Put the layer inside tonic-web's layer, so it sees plain gRPC. A gRPC-Web response carries
//! its trailers inside the body, which the layer does not parse: such responses are released
//! (never recorded) unless they are Trailers-Only.

use super::body::{Collected, ResponseBody, collect_limited};
use super::config::{Config, ResponseMode};
use super::headers::{GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, HeaderPolicy};
use super::rejection::{Rejection, RejectionKind};
use super::service::Outcome;
use crate::record::StoredResponse;
use crate::scope::StoreKey;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body::Body;

/// gRPC status codes, as numbers (no tonic dependency needed).
mod code {
    pub(super) const OK: i32 = 0;
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const INVALID_ARGUMENT: i32 = 3;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const NOT_FOUND: i32 = 5;
    pub(super) const ALREADY_EXISTS: i32 = 6;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const FAILED_PRECONDITION: i32 = 9;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const OUT_OF_RANGE: i32 = 11;
    pub(super) const UNIMPLEMENTED: i32 = 12;
    pub(super) const INTERNAL: i32 = 13;
    pub(super) const UNAVAILABLE: i32 = 14;
    pub(super) const DATA_LOSS: i32 = 15;
    pub(super) const UNAUTHENTICATED: i32 = 16;
}

/// Whether a request (or response) with these headers is gRPC: its `content-type` starts
/// with `application/grpc`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Whether a response with this gRPC status code is recorded (`OK` and the caller-caused
/// codes) or released (the transient codes, and any number that is not a gRPC code). See the
/// [classification table](self#classification).
pub(crate) fn is_recorded_code(code: i32) -> bool {
    use code::*;
    match code {
        OK | INVALID_ARGUMENT | NOT_FOUND | ALREADY_EXISTS | PERMISSION_DENIED
        | FAILED_PRECONDITION | OUT_OF_RANGE | UNIMPLEMENTED | UNAUTHENTICATED => true,
        CANCELLED | UNKNOWN | DEADLINE_EXCEEDED | RESOURCE_EXHAUSTED | ABORTED | INTERNAL
        | UNAVAILABLE | DATA_LOSS => false,
        _ => false,
    }
}

impl RejectionKind {
    /// The gRPC status code of this case (a `tonic::Code` as `i32`); see the
    /// [mapping](crate::http::grpc#rejections).
    ///
    /// ```
    /// use tower_idempotency::http::RejectionKind;
    ///
    /// assert_eq!(RejectionKind::InFlight.grpc_code(), 10); // ABORTED
    /// assert_eq!(RejectionKind::KeyReused.grpc_code(), 9); // FAILED_PRECONDITION
    /// ```
    #[must_use]
    pub fn grpc_code(self) -> i32 {
        match self {
            Self::KeyMissing | Self::KeyInvalid | Self::BodyUnreadable => code::INVALID_ARGUMENT,
            Self::PrincipalMissing => code::UNAUTHENTICATED,
            Self::InFlight => code::ABORTED,
            Self::KeyReused => code::FAILED_PRECONDITION,
            Self::BodyTooLarge | Self::ScopeFull => code::RESOURCE_EXHAUSTED,
            Self::StoreFailed | Self::StoreFull | Self::RecordInvalid => code::UNAVAILABLE,
        }
    }
}

impl Rejection {
    /// The gRPC status message: the machine code, then the detail
    /// (`idempotency.key_reused: this key was already used for a different request`).
    #[must_use]
    pub fn grpc_message(&self) -> String {
        format!("{}: {}", self.kind().code(), self.detail())
    }

    /// The gRPC rendering: a Trailers-Only response (HTTP 200, `content-type:
    /// application/grpc`, `grpc-status`, percent-encoded `grpc-message`, and
    /// `grpc-retry-pushback-ms` when a retry may succeed). The layer uses it for every
    /// rejection of a gRPC request.
    #[must_use]
    pub fn to_grpc_response(&self) -> Response<Bytes> {
        let mut res = Response::new(Bytes::new());
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(GRPC_STATUS, HeaderValue::from(self.kind().grpc_code()));
        if let Ok(message) = HeaderValue::from_maybe_shared(percent_encode(&self.grpc_message())) {
            h.insert(GRPC_MESSAGE, message);
        }
        if let Some(after) = self.retry_after_hint() {
            h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis(after)));
        }
        res
    }

    /// The rejection as a `tonic::Status`: the same code, message and pushback metadata as
    /// the layer's gRPC rendering. For code that answers by itself (an interceptor that checks
    /// keys first, say) and for tests.
    ///
    /// ```
    /// # fn doc(res: http::Response<()>) -> Option<tonic::Status> {
    /// use tower_idempotency::http::Rejection;
    ///
    /// let status = res.extensions().get::<Rejection>()?.to_status();
    /// assert!(status.message().starts_with("idempotency."));
    /// # Some(status) }
    /// ```
    #[cfg(feature = "tonic")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    #[must_use]
    pub fn to_status(&self) -> tonic::Status {
        let mut status = tonic::Status::new(
            tonic::Code::from_i32(self.kind().grpc_code()),
            self.grpc_message(),
        );
        if let Some(after) = self.retry_after_hint() {
            status.metadata_mut().insert(
                "grpc-retry-pushback-ms",
                tonic::metadata::MetadataValue::from(millis(after)),
            );
        }
        status
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Percent-encodes a `grpc-message` value: bytes outside visible ASCII and space, and `%`.
fn percent_encode(s: &str) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        }
    }
    Bytes::from(out)
}

/// A `grpc-status` value: a decimal number and nothing else.
fn parse_code(value: &[u8]) -> Option<i32> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn status_of(headers: &HeaderMap) -> Option<i32> {
    parse_code(headers.get(GRPC_STATUS)?.as_bytes())
}

/// Step 9 in gRPC mode, for an HTTP 200 response: read the body up to the record limit, find
/// the gRPC status, then record or release.
pub(super) async fn classify<B>(
    config: &Config,
    max: usize,
    key: &StoreKey,
    res: Response<B>,
) -> Outcome<B>
where
    B: Body<Data = Bytes> + Send + 'static,
{
    let (parts, body) = res.into_parts();
    if body.size_hint().lower() > max as u64 {
        tracing::warn!(key = ?key, "gRPC response over the record limit; released, not recorded");
        return Outcome::Release(Response::from_parts(parts, ResponseBody::passthrough(body)));
    }
    let (data, trailers) = match collect_limited(body, max).await {
        Collected::Whole { data, trailers } => (data, trailers),
        Collected::TooLarge { prefix, rest } => {
            tracing::warn!(key = ?key, "gRPC response over the record limit; released, not recorded");
            return Outcome::Release(Response::from_parts(
                parts,
                ResponseBody::prefixed(prefix, rest),
            ));
        }
        Collected::Failed { prefix, error } => {
            return Outcome::Release(Response::from_parts(
                parts,
                ResponseBody::failed(prefix, error),
            ));
        }
    };
    // A Trailers-Only response has its status in the headers (tonic's clients look there first).
    let trailers_only = parts.headers.contains_key(GRPC_STATUS);
    let code = if trailers_only {
        status_of(&parts.headers)
    } else {
        trailers.as_ref().and_then(status_of)
    };
    if !code.is_some_and(is_recorded_code) {
        tracing::debug!(key = ?key, grpc_status = ?code, "gRPC status not recorded");
        return Outcome::Release(Response::from_parts(
            parts,
            ResponseBody::buffered(data, trailers),
        ));
    }
    let policy = &config.headers;
    let mut trailer_fields = Vec::new();
    if trailers_only {
        // The headers of a Trailers-Only response are its trailers.
        trailer_fields.extend(policy.record_trailers_only(&parts.headers));
    }
    if let Some(t) = &trailers {
        trailer_fields.extend(HeaderPolicy::record_trailers(t));
    }
    let body = (config.response_mode == ResponseMode::Full).then(|| data.clone());
    let record = StoredResponse::new(StatusCode::OK.as_u16(), policy.record(&parts.headers), body)
        .with_trailers(trailer_fields);
    Outcome::Record(
        Response::from_parts(parts, ResponseBody::buffered(data, trailers)),
        record,
    )
}

/// A replay for a gRPC request: the HTTP re-validation, plus a recorded 200 must carry a
/// recorded `grpc-status`. A record without messages is sent Trailers-Only.
pub(super) fn replay<B: Body>(
    policy: &HeaderPolicy,
    record: StoredResponse,
) -> Result<Response<ResponseBody<B>>, &'static str> {
    if record.status == StatusCode::OK.as_u16() {
        let code = record
            .trailers
            .iter()
            .flatten()
            .chain(&record.headers)
            .find(|(n, _)| n.as_ref() == GRPC_STATUS.as_str().as_bytes())
            .and_then(|(_, v)| parse_code(v));
        match code {
            Some(c) if is_recorded_code(c) => {}
            Some(_) => return Err("gRPC status is not recordable"),
            None => return Err("gRPC status missing"),
        }
    }
    let trailers_only = record.body.as_ref().is_none_or(Bytes::is_empty);
    let mut res = policy.replay(record)?;
    if trailers_only
        && res.status() == StatusCode::OK
        && let Some(trailers) = res.body_mut().take_trailers()
    {
        let headers = res.headers_mut();
        for (name, value) in &trailers {
            headers.append(name.clone(), value.clone());
        }
    }
    Ok(res)
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl<S: tonic::server::NamedService, St> tonic::server::NamedService for super::Idempotency<S, St> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Field;

    #[test]
    fn every_code_is_classified() {
        let recorded = [0, 3, 5, 6, 7, 9, 11, 12, 16];
        for c in 0..=16 {
            assert_eq!(is_recorded_code(c), recorded.contains(&c), "code {c}");
        }
        assert!(!is_recorded_code(-1));
        assert!(!is_recorded_code(17));
    }

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
        assert_eq!(parse_code(b"0"), Some(0));
        assert_eq!(parse_code(b"16"), Some(16));
        for bad in [&b""[..], b" 0", b"0 ", b"+1", b"-1", b"1a", b"0000"] {
            assert_eq!(parse_code(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(&percent_encode("a b%c")[..], b"a b%25c");
        assert_eq!(&percent_encode("é\n")[..], b"%C3%A9%0A");
    }

    #[test]
    fn rejection_renders_trailers_only() {
        let r = Rejection::new(RejectionKind::InFlight, "busy 100%")
            .retry_after(std::time::Duration::from_secs(1));
        let res = r.to_grpc_response();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.body().is_empty());
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "10");
        assert_eq!(h["grpc-message"], "idempotency.in_flight: busy 100%25");
        assert_eq!(h["grpc-retry-pushback-ms"], "1000");
    }

    fn f(name: &'static str, value: &'static str) -> Field {
        (
            Bytes::from_static(name.as_bytes()),
            Bytes::from_static(value.as_bytes()),
        )
    }

    fn grpc_record(body: Option<&'static [u8]>, trailers: Vec<Field>) -> StoredResponse {
        StoredResponse::new(
            200,
            vec![f("content-type", "application/grpc")],
            body.map(Bytes::from_static),
        )
        .with_trailers(trailers)
    }

    type Res = Response<ResponseBody<http_body_util::Empty<Bytes>>>;

    fn replayed(record: StoredResponse) -> Result<Res, &'static str> {
        replay(&HeaderPolicy::default(), record)
    }

    #[test]
    fn a_replay_needs_a_recorded_grpc_status() {
        let frame: &'static [u8] = b"\0\0\0\0\0";
        let res = replayed(grpc_record(Some(frame), vec![f("grpc-status", "0")])).expect("ok");
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert!(
            !res.headers().contains_key("grpc-status"),
            "sent as a trailer"
        );
        for (trailers, reason) in [
            (
                vec![f("grpc-status", "14")],
                "gRPC status is not recordable",
            ),
            (vec![f("grpc-status", "x")], "gRPC status missing"),
            (vec![f("x-other", "1")], "gRPC status missing"),
        ] {
            let err = replayed(grpc_record(Some(frame), trailers)).expect_err(reason);
            assert_eq!(err, reason);
        }
        let no_trailers = StoredResponse::new(200, vec![], Some(Bytes::from_static(frame)));
        assert_eq!(
            replayed(no_trailers).expect_err("missing"),
            "gRPC status missing"
        );
        // A non-200 recorded under the HTTP table replays as in HTTP mode.
        let http_404 = StoredResponse::new(404, vec![], Some(Bytes::from_static(b"gone")));
        assert_eq!(
            replayed(http_404).expect("404").status(),
            StatusCode::NOT_FOUND
        );
        // The deny list still applies to trailers.
        let denied = grpc_record(None, vec![f("grpc-status", "3"), f("set-cookie", "a=b")]);
        assert_eq!(replayed(denied).expect_err("denied"), "denied trailer");
    }

    #[test]
    fn a_replay_without_messages_is_trailers_only() {
        let record = grpc_record(
            None,
            vec![
                f("grpc-status", "3"),
                f("grpc-message", "bad%20quantity"),
                f("x-field", "quantity"),
            ],
        );
        let res = replayed(record).expect("replay");
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "3");
        assert_eq!(h["grpc-message"], "bad%20quantity");
        assert_eq!(h["x-field"], "quantity");
        assert_eq!(h["idempotent-replayed"], "true");
        assert!(res.body().is_end_stream(), "no body, no trailers left");
    }

    #[test]
    fn every_rejection_has_a_code() {
        use RejectionKind::*;
        for (kind, code) in [
            (KeyMissing, 3),
            (KeyInvalid, 3),
            (BodyUnreadable, 3),
            (PrincipalMissing, 16),
            (InFlight, 10),
            (KeyReused, 9),
            (BodyTooLarge, 8),
            (ScopeFull, 8),
            (StoreFailed, 14),
            (StoreFull, 14),
            (RecordInvalid, 14),
        ] {
            assert_eq!(kind.grpc_code(), code, "{kind}");
        }
    }
}
