//! The HTTP adapter: send once through any HTTP client, and forward the key.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::outbound::http::HttpSendOnceLayer;
//!
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let payments = ServiceBuilder::new()
//!     .layer(HttpSendOnceLayer::new(MemoryStore::new()).namespace("payments"))
//!     .service(client);
//! // payments.oneshot(Request<Bytes> with `Idempotency-Key: charge:order-17`)
//! //   → Delivery::Recorded(Response<Bytes>), and a repeat → Delivery::Replayed(the same response)
//! # let _ = payments;
//! ```
//!
//! The client is any `Service<http::Request<B>>`: hyper-util's, or a tower HTTP stack. The
//! key goes to the provider as `Idempotency-Key`.
//!
//! # The key
//!
//! The key is the outgoing request's `Idempotency-Key` header. Without one, it is a
//! [`DerivedKey`] in the request's extensions, then sent as the header. Put the inbound
//! request's derived key there: the [`DerivedKey`] extractor, or
//! [`ClaimedKey::derived_key`](crate::http::ClaimedKey::derived_key). A retried inbound
//! request then sends the same key downstream, and the provider can de-duplicate too. A
//! request with neither is sent as it is. Give each provider its own
//! [`namespace`](HttpSendOnceLayer::namespace) when one job calls several with one key.
//!
//! The fingerprint is the method, URI, `Content-Type` and body. The request body is taken as
//! [`Bytes`], what API calls and webhooks send, and handed to the client as its body type.
//!
//! # What the answers mean
//!
//! [`HttpClassifier`] gives these verdicts.
//!
//! | answer | verdict | key |
//! | --- | --- | --- |
//! | 2xx | `Record`: the response is the receipt (status, body, headers but those on [`DENIED_HEADERS`](crate::http::DENIED_HEADERS)) | completed |
//! | 3xx but 304, such as a 303 after a create | `Record`: the redirect is the answer | completed |
//! | 408, 425, 429, and 503 with `Retry-After`: the provider's own "come back then" | `Release` | released |
//! | 503 without `Retry-After`: maybe a proxy's answer after the request was forwarded | `Hold` | held |
//! | 409 with `Retry-After`: the provider's own "in flight" | `Hold` | held |
//! | 500, 502, 504 and other 5xx: the provider may have acted | `Hold` | held |
//! | 501, 304, other 4xx, 1xx | `Fail` | released |
//! | the client's connect stage failed: hyper-util's `Error::is_connect` (feature `hyper-util`), a [`NotSent`](super::NotSent) in the error's chain | `Release` | released |
//! | a timeout, a connection closed, reset or unreachable, any other transport error | `Hold` | held |
//! | the response body fails or is over [`max_response_body`](HttpSendOnceLayer::max_response_body) | `Hold` | held |
//!
//! Only the client can say that it never sent. An `io::Error` kind cannot: Linux reports
//! `EHOSTUNREACH` and `ENETUNREACH` on a connection that was already sending. So a transport
//! error holds its key unless the client's own connect stage failed. With hyper-util's
//! legacy client, turn on the feature `hyper-util`, or a refused connection holds its key
//! too: the safe side. A timeout cannot tell whether the request was written, so every
//! timeout holds. Bound each call with `tower::timeout::TimeoutLayer` inside this layer.
//! Keep retries outside it: a retry inside may end with a connect error after an earlier
//! attempt went.
//!
//! [`DerivedKey`]: crate::DerivedKey

use super::classify::never_sent;
use super::identify::{Identify, Identity};
use super::service::{SendOnce, SendOnceLayer};
use crate::engine::key::IdempotencyKey;
use crate::engine::scope::DerivedKey;
use crate::engine::{
    BoxFuture, Classify, Codec, CodecError, CodecErrorKind, Engine, Fingerprint, KeyError, Raw,
    Recorded, Scope, Verdict,
};
use crate::store::Record;
use crate::store::Store;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use std::error::Error as StdError;
use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The HTTP adapter's key namespace.
const NAMESPACE: &str = "outbound/http";

/// The largest response body kept as a receipt: 1 MiB.
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The service [`HttpSendOnceLayer`] makes over the client `S`.
///
/// It takes `Request<Bytes>` and answers
/// [`Delivery`](super::Delivery)`<Response<Bytes>, CallError>`, or an
/// [`OutboundError`](super::OutboundError)`<CallError>`.
pub type HttpSendOnce<S, St, B = Full<Bytes>> =
    SendOnce<HttpCall<S, B>, St, HttpIdentify, HttpClassifier>;

/// Wraps an HTTP client so that a request sent twice under one key goes once.
///
/// The client is a `Service<Request<B>>`. `B` is [`Full<Bytes>`] unless set with
/// [`request_body`](Self::request_body). See the [module docs](self).
#[must_use]
pub struct HttpSendOnceLayer<St, B = Full<Bytes>> {
    door: SendOnceLayer<St, HttpIdentify, HttpClassifier>,
    max_response_body: usize,
    body: PhantomData<fn() -> B>,
}

impl<St, B> Clone for HttpSendOnceLayer<St, B> {
    fn clone(&self) -> Self {
        Self {
            door: self.door.clone(),
            max_response_body: self.max_response_body,
            body: PhantomData,
        }
    }
}

impl<St, B> fmt::Debug for HttpSendOnceLayer<St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSendOnceLayer")
            .field("door", &self.door)
            .field("max_response_body", &self.max_response_body)
            .finish()
    }
}

impl<St: Store> HttpSendOnceLayer<St> {
    /// A layer over `engine`, an [`Engine`] or a store.
    ///
    /// It suits clients whose request body is [`Full<Bytes>`], such as hyper-util's
    /// `build_http::<Full<Bytes>>()`. The key header is `Idempotency-Key`.
    pub fn new(engine: impl Into<Engine<St>>) -> Self {
        Self {
            door: SendOnceLayer::new(engine, HttpIdentify::default())
                .classify(HttpClassifier)
                .namespace(NAMESPACE),
            max_response_body: MAX_RESPONSE_BODY,
            body: PhantomData,
        }
    }
}

impl<St: Store, B> HttpSendOnceLayer<St, B> {
    /// The client's request body type: built from the request's [`Bytes`].
    /// Default: [`Full<Bytes>`].
    pub fn request_body<B2>(self) -> HttpSendOnceLayer<St, B2> {
        HttpSendOnceLayer {
            door: self.door,
            max_response_body: self.max_response_body,
            body: PhantomData,
        }
    }

    /// See [`SendOnceLayer::namespace`]. Default: `outbound/http`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.door = self.door.namespace(namespace);
        self
    }

    /// See [`SendOnceLayer::scope`].
    pub fn scope(mut self, scope: Scope) -> Self {
        self.door = self.door.scope(scope);
        self
    }

    /// See [`SendOnceLayer::hold`]. Default: 10 minutes.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.door = self.door.hold(hold);
        self
    }

    /// See [`SendOnceLayer::wait_in_flight`]. Default: zero.
    pub fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.door = self.door.wait_in_flight(bound);
        self
    }

    /// See [`SendOnceLayer::require_key`]. On, a request with neither an `Idempotency-Key`
    /// nor a [`DerivedKey`] is refused. Default: off.
    pub fn require_key(mut self, on: bool) -> Self {
        self.door = self.door.require_key(on);
        self
    }

    /// The largest response body read and kept as the receipt.
    ///
    /// A longer one is an unknown delivery: the provider answered, but the answer cannot be
    /// kept. A receipt over the engine's
    /// [record limit](crate::engine::EngineBuilder::max_record_body) is kept without its
    /// body. Default: 1 MiB.
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }
}

impl<S, St: Store, B> Layer<S> for HttpSendOnceLayer<St, B> {
    type Service = HttpSendOnce<S, St, B>;

    fn layer(&self, inner: S) -> Self::Service {
        self.door.layer(HttpCall {
            inner,
            max_response_body: self.max_response_body,
            body: PhantomData,
        })
    }
}

/// Reads the key of an outgoing HTTP request: its key header, else a [`DerivedKey`] in its
/// extensions. The fingerprint: method, URI, `Content-Type`, body.
#[derive(Clone, Debug)]
pub struct HttpIdentify {
    header: HeaderName,
}

impl Default for HttpIdentify {
    fn default() -> Self {
        Self {
            header: crate::http::KEY_HEADER,
        }
    }
}

impl Identify<Request<Bytes>> for HttpIdentify {
    fn identify(&self, req: &Request<Bytes>) -> Result<Option<Identity>, KeyError> {
        let mut values = req.headers().get_all(&self.header).iter();
        let key = match (values.next(), values.next()) {
            (Some(_), Some(_)) => {
                return Err(KeyError::new(
                    crate::engine::key::KeyErrorKind::MultipleValues,
                ));
            }
            (Some(v), None) => IdempotencyKey::parse_header(v.as_bytes())?,
            (None, _) => match req.extensions().get::<DerivedKey>() {
                Some(derived) => IdempotencyKey::new(derived.as_str())?,
                None => return Ok(None),
            },
        };
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .map_or(&b""[..], HeaderValue::as_bytes);
        let fingerprint = Fingerprint::builder()
            .field(req.method().as_str().as_bytes())
            .field(req.uri().to_string().as_bytes())
            .field(content_type)
            .field(req.body())
            .finish();
        Ok(Some(Identity::new(key, fingerprint)))
    }
}

/// The HTTP reading of a send's result: the table in the [module docs](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpClassifier;

impl Classify<Result<Response<Bytes>, CallError>> for HttpClassifier {
    fn classify(&self, result: &Result<Response<Bytes>, CallError>) -> Verdict {
        match result {
            Ok(res) => verdict_of_status(res.status(), res.headers().contains_key(RETRY_AFTER)),
            Err(e) if e.kind == CallErrorKind::ResponseBody => Verdict::Hold,
            Err(e) if never_sent(&*e.source) => Verdict::Release,
            Err(_) => Verdict::Hold,
        }
    }
}

fn verdict_of_status(status: StatusCode, retry_after: bool) -> Verdict {
    match status.as_u16() {
        200..=299 => Verdict::Record,
        304 => Verdict::Fail,
        // A redirect may follow the action (a 303 after a create): it is the answer, kept.
        300..=399 => Verdict::Record,
        408 | 425 | 429 => Verdict::Release,
        // The provider's own "unavailable, come back then"; without a date it may be a
        // proxy's answer for an upstream that failed after the request was forwarded.
        503 if retry_after => Verdict::Release,
        409 if retry_after => Verdict::Hold,
        501 => Verdict::Fail,
        500..=599 => Verdict::Hold,
        _ => Verdict::Fail,
    }
}

/// Which part of an HTTP call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// The client's call failed before a response head came.
    Work,
    /// The response body failed or was over the limit, after the provider answered.
    ResponseBody,
}

impl CallErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::ResponseBody => "idempotency.response_body_failed",
        }
    }
}

/// Why an HTTP call failed: the client's error, or a response body that failed or was too
/// long. Its [`source`](StdError::source) is the client's error.
#[derive(Debug)]
pub struct CallError {
    source: BoxError,
    kind: CallErrorKind,
}

impl CallError {
    /// Which part of the call failed.
    #[must_use]
    pub fn kind(&self) -> CallErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// The client's error, or the body's.
    #[must_use]
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// The client's error, or the body's.
    #[must_use]
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CallErrorKind::Work => write!(f, "the HTTP call failed: {}", self.source),
            CallErrorKind::ResponseBody => {
                write!(f, "the HTTP response body failed: {}", self.source)
            }
        }
    }
}

impl StdError for CallError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// An HTTP client as the door needs it: `Request<Bytes>` in, the key header forwarded,
/// `Response<Bytes>` out (the body read whole, up to a limit).
pub struct HttpCall<S, B = Full<Bytes>> {
    inner: S,
    max_response_body: usize,
    body: PhantomData<fn() -> B>,
}

impl<S: Clone, B> Clone for HttpCall<S, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            max_response_body: self.max_response_body,
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, B> fmt::Debug for HttpCall<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCall")
            .field("inner", &self.inner)
            .field("max_response_body", &self.max_response_body)
            .finish()
    }
}

impl<S, B> HttpCall<S, B> {
    /// The client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, B, RB> Service<Request<Bytes>> for HttpCall<S, B>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: From<Bytes>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Bytes>;
    type Error = CallError;
    type Future = BoxFuture<'static, Result<Response<Bytes>, CallError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        self.inner.poll_ready(cx).map_err(|e| CallError {
            source: e.into(),
            kind: CallErrorKind::Work,
        })
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        // A derived key is the key: the provider gets it too, so it can de-duplicate.
        if !req.headers().contains_key(crate::http::KEY_HEADER)
            && let Some(derived) = req.extensions().get::<DerivedKey>()
            && let Ok(v) = HeaderValue::from_str(derived.as_str())
        {
            req.headers_mut().insert(crate::http::KEY_HEADER, v);
        }
        let limit = self.max_response_body;
        let fut = self.inner.call(req.map(B::from));
        Box::pin(async move {
            let res = fut.await.map_err(|e| CallError {
                source: e.into(),
                kind: CallErrorKind::Work,
            })?;
            let (parts, body) = res.into_parts();
            let body = Limited::new(body, limit)
                .collect()
                .await
                .map_err(|source| CallError {
                    source,
                    kind: CallErrorKind::ResponseBody,
                })?
                .to_bytes();
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// An HTTP response as a receipt: status, headers and body. Headers on the deny list are
/// left out: cookies, `Date`, hop-by-hop, ... Its fitted form is status and headers.
impl Codec<Response<Bytes>> for Raw {
    fn encode(&self, res: &Response<Bytes>) -> Result<Bytes, CodecError> {
        let headers = res
            .headers()
            .iter()
            .filter(|(n, _)| !crate::http::is_denied_bytes(n.as_str().as_bytes()))
            .map(|(n, v)| {
                (
                    Bytes::copy_from_slice(n.as_str().as_bytes()),
                    Bytes::copy_from_slice(v.as_bytes()),
                )
            })
            .collect();
        let record = Recorded::new(res.status().as_u16(), headers, Some(res.body().clone()));
        record.encode().map(Record::into_bytes).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Encode, "the response cannot be kept", e)
        })
    }

    fn encode_fitted(&self, res: &Response<Bytes>) -> Option<Bytes> {
        // Status and headers, as the HTTP layer keeps a body over its limit; the headers that
        // describe the body left out are dropped with it.
        let headers = res
            .headers()
            .iter()
            .filter(|(n, _)| {
                !crate::http::is_denied_bytes(n.as_str().as_bytes())
                    && !matches!(n.as_str(), "content-encoding" | "content-range" | "etag")
            })
            .map(|(n, v)| {
                (
                    Bytes::copy_from_slice(n.as_str().as_bytes()),
                    Bytes::copy_from_slice(v.as_bytes()),
                )
            })
            .collect();
        Recorded::new(res.status().as_u16(), headers, None)
            .encode()
            .ok()
            .map(Record::into_bytes)
    }

    fn decode(&self, bytes: Bytes) -> Result<Response<Bytes>, CodecError> {
        let bad = |e: &'static str| CodecError::new(CodecErrorKind::Decode, e);
        let record = Record::from_bytes(bytes).decode(usize::MAX).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Decode, "not an HTTP receipt", e)
        })?;
        let mut res = Response::new(record.body.unwrap_or_default());
        *res.status_mut() =
            StatusCode::from_u16(record.status).map_err(|_| bad("a status out of range"))?;
        for (n, v) in record.headers {
            let name = HeaderName::from_bytes(&n).map_err(|_| bad("a bad header name"))?;
            let value = HeaderValue::from_maybe_shared(v).map_err(|_| bad("a bad header value"))?;
            res.headers_mut().append(name, value);
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_as_the_module_docs_say() {
        let v = |s: u16| verdict_of_status(StatusCode::from_u16(s).unwrap_or_default(), false);
        for s in [200, 201, 202, 204, 301, 302, 303, 307, 308] {
            assert_eq!(v(s), Verdict::Record, "{s}");
        }
        for s in [408, 425, 429] {
            assert_eq!(v(s), Verdict::Release, "{s}");
        }
        for s in [500, 502, 503, 504, 507] {
            assert_eq!(v(s), Verdict::Hold, "{s}");
        }
        for s in [400, 401, 403, 404, 409, 422, 501, 304] {
            assert_eq!(v(s), Verdict::Fail, "{s}");
        }
        assert_eq!(verdict_of_status(StatusCode::CONFLICT, true), Verdict::Hold);
        assert_eq!(
            verdict_of_status(StatusCode::SERVICE_UNAVAILABLE, true),
            Verdict::Release
        );
    }

    #[test]
    fn a_response_receipt_round_trips_without_denied_headers() {
        let res = Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("set-cookie", "s=1")
            .header("x-charge", "ch_1")
            .body(Bytes::from_static(b"{\"id\":\"ch_1\"}"))
            .unwrap_or_default();
        let back: Response<Bytes> = Raw
            .decode(Raw.encode(&res).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(back.status(), 201);
        assert_eq!(back.body(), res.body());
        assert_eq!(
            back.headers().get("x-charge").map(|v| v.as_bytes()),
            Some(&b"ch_1"[..])
        );
        assert!(
            back.headers().get("set-cookie").is_none(),
            "secrets are not kept"
        );
    }
}
