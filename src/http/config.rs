//! The layer's settings and the state every clone of the layer and its services share.

use super::fingerprint::Fingerprinting;
use super::headers::HeaderPolicy;
use super::rejection::{Rejection, Renderer};
use super::streaming::Streaming;
use crate::engine::detach::Drain;
use crate::engine::key::{DEFAULT_MAX_KEY_LEN, IdempotencyKey, KeyError, KeyErrorKind};
use crate::engine::scope::Scope;
use crate::engine::{Classify, Engine, Verdict};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The default request body limit: 1 MiB.
pub(crate) const MAX_REQUEST_BODY: usize = 1024 * 1024;

/// The principal a request acts for. The application's authentication layer puts it into the
/// request extensions. That layer must run before the idempotency layer.
///
/// ```
/// use tower_idempotency::http::Principal;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Principal::new("alice").with_tenant("acme"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal(Scope);

impl Principal {
    /// A principal by its stable id.
    #[must_use]
    pub fn new(id: impl Into<String>) -> Self {
        Self(Scope::principal(id))
    }

    /// The same principal under a tenant.
    #[must_use]
    pub fn with_tenant(self, tenant: impl Into<String>) -> Self {
        Self(self.0.with_tenant(tenant))
    }

    /// The scope keys of this principal live in.
    #[must_use]
    pub fn scope(&self) -> &Scope {
        &self.0
    }
}

impl From<Principal> for Scope {
    fn from(p: Principal) -> Self {
        p.0
    }
}

/// Whether a request must carry a principal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrincipalMode {
    /// A keyed request without a principal is refused with 401. The default.
    #[default]
    Required,
    /// Requests without a principal share ONE anonymous scope. An anonymous caller who sends
    /// another anonymous caller's key is served that caller's stored response. Pair it with
    /// [`ResponseMode::StatusAndHeaders`] unless the responses are safe for any anonymous
    /// caller.
    Optional,
}

/// What a recorded response keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseMode {
    /// Status, allowed headers and body. The default.
    #[default]
    Full,
    /// Status and allowed headers only, for bodies that must not rest in the store. A replay
    /// has an empty body, so the headers that describe a body are not kept:
    /// [`REPRESENTATION_HEADERS`](super::REPRESENTATION_HEADERS). The record is written once
    /// the body has ended, and the key released if the body fails.
    StatusAndHeaders,
}

/// A classification preset: releases the answers to a request that failed validation.
///
/// It releases `400 Bad Request`, `413 Content Too Large`, `415 Unsupported Media Type` and
/// `422 Unprocessable Content`, and records the rest as the table does. Give it to
/// [`IdempotencyLayer::classify`](super::IdempotencyLayer::classify).
///
/// These are the statuses of axum's extractor rejections, answered *inside* the layer.
/// Malformed JSON gets 400. A missing or wrong `content-type` gets 415. A `Json<T>` or
/// `Form<T>` that does not deserialize gets 422. A body over axum's limit gets 413. A bad
/// query string or path parameter gets 400. Released, they leave the key free. So the client
/// can send the corrected request with the same key. Recorded, the corrected request would get
/// `422 idempotency.key_reused`.
///
/// The trade-off: a handler's own 400, 413, 415 or 422 is released too, so a retry under the
/// same key runs the handler again. That is right for validation errors, where the handler
/// did nothing. It is wrong for a handler that did work and then answered one of these: give
/// such an outcome another status, such as 409, or write your own hook. `#[idempotent]`
/// handlers do not need this preset for extractor rejections: the attribute runs the
/// extractors before it claims the key.
///
/// ```
/// use axum::http::StatusCode;
/// use tower_idempotency::engine::{Classify, Verdict};
/// use tower_idempotency::http::{IdempotencyLayer, ValidationClassifier};
///
/// let layer = IdempotencyLayer::default().classify(ValidationClassifier);
///
/// // Or a hook of your own, on top of the preset:
/// let layer = IdempotencyLayer::default().classify(|res: &http::response::Parts| match res.status {
///     StatusCode::NOT_FOUND => Verdict::Release,
///     _ => ValidationClassifier.classify(res),
/// });
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ValidationClassifier;

impl Classify<http::response::Parts> for ValidationClassifier {
    fn classify(&self, res: &http::response::Parts) -> Verdict {
        match res.status.as_u16() {
            400 | 413 | 415 | 422 => Verdict::Release,
            _ => Verdict::Record,
        }
    }
}

pub(crate) type IdentifyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;
pub(crate) type ClassifyFn = Arc<dyn Classify<http::response::Parts>>;

#[derive(Clone)]
pub(crate) enum KeySource {
    Header(HeaderName),
    Fn(IdentifyFn),
}

/// What a layer and every service it makes share, behind one `Arc`. That is the engine, with
/// its store, lease and retention, and the HTTP settings.
pub(crate) struct LayerState<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) config: Config,
    /// The claimed work not finished yet. Clones share it: one count per layer.
    pub(crate) drain: Drain,
}

impl<St: crate::Store> crate::engine::steps::StepSource for LayerState<St> {
    fn step_settings(&self) -> crate::engine::steps::StepSettings {
        self.engine.step_settings()
    }
}

impl<St> Clone for LayerState<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config.clone(),
            drain: self.drain.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) key_source: KeySource,
    pub(crate) require_key: bool,
    pub(crate) principal_fn: Option<PrincipalFn>,
    pub(crate) principal_mode: PrincipalMode,
    pub(crate) methods: Option<Vec<Method>>,
    /// Acts on every method, extension methods too, whatever `methods` says: for a door
    /// whose requests were all checked before (the webhook door), a method never lets one
    /// reach the handler unclaimed.
    pub(crate) every_method: bool,
    pub(crate) namespace: Arc<str>,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_body: usize,
    pub(crate) response_mode: ResponseMode,
    pub(crate) streaming: Streaming,
    pub(crate) headers: HeaderPolicy,
    pub(crate) renderer: Option<Renderer>,
    pub(crate) fingerprint: Fingerprinting,
    pub(crate) classify_fn: Option<ClassifyFn>,
    /// Claimed work finishes and is recorded when the response future is dropped.
    pub(crate) run_to_completion: bool,
    /// How long a repeat that finds its key in flight waits for the first run. Zero
    /// answers 409 at once.
    pub(crate) wait_in_flight: Duration,
    /// The handler's response of a claimed run carries `idempotent-replayed: false`.
    pub(crate) mark_first_runs: bool,
    /// A claim the store could not answer runs the work unclaimed instead of 503.
    pub(crate) fail_open: bool,
    /// The door's counters, with the layer's static labels, with feature `metrics`.
    pub(crate) metrics: crate::metrics::DoorCounters,
    /// The engine's secret, which keys the store keys.
    pub(crate) secret: Option<crate::Secret>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            key_source: KeySource::Header(super::headers::KEY_HEADER),
            require_key: true,
            principal_fn: None,
            principal_mode: PrincipalMode::Required,
            methods: None,
            every_method: false,
            namespace: Arc::from("http"),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_request_body: MAX_REQUEST_BODY,
            response_mode: ResponseMode::Full,
            streaming: Streaming::default(),
            headers: HeaderPolicy::default(),
            renderer: None,
            fingerprint: Fingerprinting::default(),
            classify_fn: None,
            run_to_completion: true,
            wait_in_flight: Duration::ZERO,
            mark_first_runs: false,
            fail_open: false,
            metrics: crate::metrics::DoorCounters::new(crate::metrics::Door::Http),
            secret: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("require_key", &self.require_key)
            .field("principal_mode", &self.principal_mode)
            .field("methods", &self.methods)
            .field("every_method", &self.every_method)
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .field("max_request_body", &self.max_request_body)
            .field("response_mode", &self.response_mode)
            .field("streaming", &self.streaming)
            .field("headers", &self.headers)
            .field("fingerprint", &self.fingerprint)
            .field("run_to_completion", &self.run_to_completion)
            .field("wait_in_flight", &self.wait_in_flight)
            .field("mark_first_runs", &self.mark_first_runs)
            .field("fail_open", &self.fail_open)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// The store key of `key` for `scope`, as the engine derives it.
    pub(crate) fn store_key(
        &self,
        scope: &crate::engine::Scope,
        key: &crate::IdempotencyKey,
    ) -> crate::store::StoreKey {
        crate::engine::store_key(self.secret.as_ref(), &self.namespace, scope, key)
    }

    /// Step 1: does the layer act on this method at all?
    pub(crate) fn applies_to(&self, method: &Method) -> bool {
        if self.every_method {
            return true;
        }
        match &self.methods {
            Some(m) => m.contains(method),
            None => !matches!(
                *method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
            ),
        }
    }

    /// Step 2: the key, if the request has one.
    pub(crate) fn key(&self, parts: &Parts) -> Option<Result<IdempotencyKey, KeyError>> {
        match &self.key_source {
            KeySource::Header(name) => {
                let mut values = parts.headers.get_all(name).iter();
                let first = values.next()?;
                if values.next().is_some() {
                    return Some(Err(KeyError::new(KeyErrorKind::MultipleValues)));
                }
                Some(IdempotencyKey::parse_header_with_max_len(
                    first.as_bytes(),
                    self.max_key_len,
                ))
            }
            KeySource::Fn(f) => {
                f(parts).map(|k| IdempotencyKey::with_max_len(&k, self.max_key_len))
            }
        }
    }

    /// The detail of a `key_missing` rejection: where a key was looked for.
    pub(crate) fn missing_key_detail(&self) -> String {
        let name = match &self.key_source {
            KeySource::Header(h) => h.as_str(),
            KeySource::Fn(_) => "idempotency key",
        };
        format!("this request requires an `{name}` header")
    }

    /// Step 4: the caller's scope; `None` when a required principal is missing.
    pub(crate) fn scope(&self, parts: &Parts) -> Option<Scope> {
        let found = match &self.principal_fn {
            Some(f) => f(parts),
            None => parts.extensions.get::<Principal>().map(|p| p.0.clone()),
        };
        match (found, self.principal_mode) {
            (Some(s), _) => Some(s),
            (None, PrincipalMode::Optional) => Some(Scope::anonymous()),
            (None, PrincipalMode::Required) => None,
        }
    }

    /// Step 6: the request's fingerprint.
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &Bytes) -> crate::engine::Fingerprint {
        self.fingerprint.fingerprint(parts, body)
    }

    /// Step 9: whether a response of these headers streams through.
    pub(crate) fn is_streaming(&self, headers: &http::HeaderMap) -> bool {
        self.streaming.is_streaming(headers)
    }

    pub(crate) fn render(&self, rejection: &Rejection) -> http::Response<Bytes> {
        match &self.renderer {
            Some(r) => r(rejection),
            None => rejection.to_problem_response(),
        }
    }
}
