//! The webhook door: [`WebhookLayer`], a sender's verification in front of the HTTP door's
//! claim, replay and record.

use super::{Sender, WebhookError};
use crate::engine::key::IdempotencyKey;
use crate::engine::scope::Scope;
use crate::engine::{Engine, Fingerprint, Verdict};
use crate::http::{
    Drain, Idempotency, IdempotencyLayer, KeySource, ReadError, RequestBody, ResponseBody,
    read_limited, read_rejection, render,
};
use crate::metrics::{Door, Outcome};
use crate::store::{MemoryStore, Store};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

/// The default request body limit of a webhook endpoint: 1 MiB, as the HTTP door's. A body is
/// buffered before its signature is checked, so the limit also bounds what an unsigned
/// request can make the process hold.
const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// The namespace of webhook keys by default.
const NAMESPACE: &str = "webhook";

/// Every delivery is one request: the fingerprint is the same for all, so a redelivery whose
/// bytes differ (a sender may change a field between attempts) is still the same event.
const FINGERPRINT: &[u8] = b"tower-idempotency/webhook/v1";

/// What verification found, for the inner layer: the delivery's key and its endpoint's scope.
/// Private, so no request can carry one that was not verified here.
#[derive(Clone)]
struct Verified {
    key: IdempotencyKey,
    scope: Scope,
}

/// Receives a sender's webhooks: each delivery verified, then each event run once. Cheap to
/// clone.
///
/// One layer per sender's endpoint, on its route:
///
/// ```
/// use axum::{Router, routing::post};
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::webhook::{GitHub, Stripe, WebhookLayer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = std::sync::Arc::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/webhooks/stripe", post(|body: String| async move { "ok" })
///         .layer(WebhookLayer::new(Stripe::new("whsec_test")?, store.clone())))
///     .route("/webhooks/github", post(|| async { "ok" })
///         .layer(WebhookLayer::new(GitHub::new("It's a Secret to Everybody")?, store)));
/// # Ok(()) }
/// ```
///
/// The [module page](super#the-layer) gives the check order and what each answer means.
pub struct WebhookLayer<Se, St = MemoryStore> {
    sender: Arc<Se>,
    http: IdempotencyLayer<St>,
    endpoint: Option<Arc<str>>,
    max_request_body: usize,
}

impl<Se, St> Clone for WebhookLayer<Se, St> {
    fn clone(&self) -> Self {
        Self {
            sender: Arc::clone(&self.sender),
            http: self.http.clone(),
            endpoint: self.endpoint.clone(),
            max_request_body: self.max_request_body,
        }
    }
}

impl<Se: fmt::Debug, St> fmt::Debug for WebhookLayer<Se, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookLayer")
            .field("sender", &self.sender)
            .field("endpoint", &self.endpoint)
            .field("max_request_body", &self.max_request_body)
            .field("http", &self.http)
            .finish()
    }
}

impl<Se: Sender, St: Store> WebhookLayer<Se, St> {
    /// A layer for `sender`'s deliveries over `engine`: a store, or an [`Engine`] shared with
    /// other doors.
    ///
    /// The lease, the record limit and the secret are the engine's. The retention is the
    /// sender's [`retention`](Sender::retention), whatever the engine's: set another with
    /// [`retention`](Self::retention).
    #[must_use]
    pub fn new(sender: Se, engine: impl Into<Engine<St>>) -> Self {
        let retention = sender.retention();
        let http = IdempotencyLayer::new(engine)
            .retention(retention)
            .metrics_door(Door::Webhook)
            .config(|c| {
                c.key_source = KeySource::Fn(Arc::new(|parts: &http::request::Parts| {
                    parts
                        .extensions
                        .get::<Verified>()
                        .map(|v| v.key.as_str().to_owned())
                }));
                c.principal_fn = Some(Arc::new(|parts: &http::request::Parts| {
                    parts.extensions.get::<Verified>().map(|v| v.scope.clone())
                }));
                // Every method, extension methods too: a verified delivery sent again under
                // another method is still the same event, never run unclaimed.
                c.every_method = true;
                c.namespace = Arc::from(NAMESPACE);
                c.max_request_body = MAX_REQUEST_BODY;
                // The sender's id names the event: every delivery of one id is one request.
                c.fingerprint = crate::http::Fingerprinting::default()
                    .custom(|_, _| Fingerprint::builder().field(FINGERPRINT).finish());
                // Only a 2xx tells the sender the event was taken; anything else it sends
                // again, and the retry runs.
                c.classify_fn = Some(Arc::new(|res: &http::response::Parts| {
                    if res.status.is_success() {
                        Verdict::Record
                    } else {
                        Verdict::Release
                    }
                }));
            });
        Self {
            sender: Arc::new(sender),
            http,
            endpoint: None,
            max_request_body: MAX_REQUEST_BODY,
        }
    }

    /// How long a delivery's record is kept, so a redelivery within it is answered from the
    /// record. Default: the sender's [`retention`](Sender::retention), at least as long as it
    /// may deliver the same event again. A redelivery after it runs again.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.http = self.http.retention(retention);
        self
    }

    /// The endpoint the delivery ids are kept for, with the sender's
    /// [`name`](Sender::name). Default: the route's template, axum's `MatchedPath`
    /// (`/webhooks/github/{hook}`), where the layer sits on an axum route; else the request's
    /// path. So a delivery sent again to another path of its route is replayed, not run again:
    /// GitHub and Shopify sign the body only, not the path.
    ///
    /// Two endpoints never share ids: one sender's event delivered to two routes runs once at
    /// each. Set it to keep the ids when a route moves, or to give two routes one set of ids.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::webhook::{Stripe, WebhookLayer};
    ///
    /// let layer = WebhookLayer::new(Stripe::new("whsec_test")?, MemoryStore::new())
    ///     .endpoint("billing")
    ///     .retention(Duration::from_secs(7 * 24 * 60 * 60));
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    #[must_use]
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(Arc::from(endpoint.into()));
        self
    }

    /// The largest request body read, in bytes. Default: 1 MiB. A larger body is refused
    /// with 413 `idempotency.body_too_large` before its signature is checked.
    ///
    /// The body is read whole before it is verified, so this bounds what any request, signed
    /// or not, makes the process hold. Most events are a few kilobytes; GitHub sends
    /// payloads of up to 25 MB (a push of many commits), and does not deliver a refused one
    /// again by itself: raise it for such an endpoint.
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self.http = self.http.config(|c| c.max_request_body = bytes);
        self
    }

    /// The namespace the delivery ids live in. Default: `webhook`.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.http = self.http.namespace(namespace);
        self
    }

    /// How long a redelivery that finds its event running waits for the first run before it
    /// is answered. Default: zero, 409 `idempotency.in_flight` at once, with `Retry-After`.
    /// See [`IdempotencyLayer::wait_in_flight`].
    #[must_use]
    pub fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.http = self.http.wait_in_flight(bound);
        self
    }

    /// Adds a fixed label to every metric this layer counts, with feature `metrics`. See
    /// [`IdempotencyLayer::metrics_label`].
    ///
    /// # Errors
    /// [`ConfigErrorKind::ReservedLabel`](crate::ConfigErrorKind::ReservedLabel) for `door`,
    /// `outcome` or `result`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(
        mut self,
        key: &'static str,
        value: impl Into<String>,
    ) -> Result<Self, crate::ConfigError> {
        self.http = self.http.metrics_label(key, value)?;
        Ok(self)
    }

    /// The handlers' work that has not finished yet, to wait on at shutdown. A handler whose
    /// caller went away runs on, as in the HTTP door: see
    /// [`IdempotencyLayer::run_to_completion`].
    #[must_use]
    pub fn drain(&self) -> Drain {
        self.http.drain()
    }

    /// The engine the layer uses, with its store, lease and retention.
    #[must_use]
    pub fn engine(&self) -> &Engine<St> {
        self.http.engine()
    }
}

impl<S, Se, St> Layer<S> for WebhookLayer<Se, St> {
    type Service = Webhook<S, Se, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Webhook {
            sender: Arc::clone(&self.sender),
            endpoint: self.endpoint.clone(),
            max_request_body: self.max_request_body,
            inner: self.http.layer(inner),
        }
    }
}

/// The service of a [`WebhookLayer`]: verifies each delivery, then claims its event.
pub struct Webhook<S, Se, St> {
    sender: Arc<Se>,
    endpoint: Option<Arc<str>>,
    max_request_body: usize,
    inner: Idempotency<S, St>,
}

impl<S: Clone, Se, St> Clone for Webhook<S, Se, St> {
    fn clone(&self) -> Self {
        Self {
            sender: Arc::clone(&self.sender),
            endpoint: self.endpoint.clone(),
            max_request_body: self.max_request_body,
            inner: self.inner.clone(),
        }
    }
}

impl<S: fmt::Debug, Se, St> fmt::Debug for Webhook<S, Se, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, Se, St, ReqB, ResB> Service<Request<ReqB>> for Webhook<S, Se, St>
where
    S: Service<Request<RequestBody<RequestBody<ReqB>>>, Response = Response<ResB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    Se: Sender,
    St: Store,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // Keep the instance that was polled ready; the clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let sender = Arc::clone(&self.sender);
        let endpoint = self.endpoint.clone();
        let limit = self.max_request_body;
        // The HTTP door's own span and events nest in this one, which names the sender.
        let span = crate::trace::webhook_span(inner.state.engine.span_level(), sender.name());
        let fut = async move {
            let state = Arc::clone(&inner.state);
            let (mut parts, body) = req.into_parts();
            // 1. The raw body, whole and within the limit: the signature is over its bytes. A
            // declared length over it is refused before anything is read.
            let declared = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                return Ok(render(
                    &state,
                    read_rejection(ReadError::TooLarge, limit),
                    false,
                ));
            }
            let body = match read_limited(body, limit).await {
                Ok(body) => body,
                Err(e) => return Ok(render(&state, read_rejection(e, limit), false)),
            };
            // 2. The signature, the timestamp and the key: nothing reaches the store before.
            let key = match sender.verify(&parts, &body, SystemTime::now()) {
                Ok(key) => key,
                Err(e) => return Ok(refuse(&state.config, &e)),
            };
            // 3. The claim, scoped by the sender and the endpoint, in the HTTP door.
            let endpoint = endpoint.unwrap_or_else(|| route_of(&parts));
            let scope = Scope::principal(&*endpoint).with_tenant(sender.name());
            parts.extensions.insert(Verified { key, scope });
            inner
                .call(Request::from_parts(parts, RequestBody::buffered(body)))
                .await
        };
        Box::pin(fut.instrument(span))
    }
}

/// The answer to a delivery that failed verification: counted, logged, and a problem
/// document with the error's code.
fn refuse<B: Body>(config: &crate::http::Config, e: &WebhookError) -> Response<ResponseBody<B>> {
    let kind = e.kind();
    let outcome = if kind.is_unverified() {
        Outcome::Unverified
    } else if kind == super::WebhookErrorKind::KeyMissing {
        Outcome::KeyMissing
    } else {
        Outcome::KeyInvalid
    };
    config.metrics.request(false, outcome);
    // At `DEBUG`, as the HTTP door's refusals: anyone can send unsigned requests, and a line
    // each would let them flood the logs. The metric counts them.
    tracing::debug!(door = "webhook", outcome = outcome.as_str(), code = e.code(), error = %e, "webhook delivery refused; nothing stored");
    let mut res = e
        .to_problem_response()
        .map(|b| ResponseBody::buffered(b, None));
    res.extensions_mut().insert(kind);
    res
}

/// The endpoint of a delivery without a set one: the route's template where axum routed it,
/// so the values of a path parameter share one set of ids; else the path.
fn route_of(parts: &http::request::Parts) -> Arc<str> {
    #[cfg(feature = "axum")]
    if let Some(route) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return Arc::from(route.as_str());
    }
    Arc::from(parts.uri.path())
}
