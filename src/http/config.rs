//! The layer's settings and the state every clone of the layer and its services share.

use super::fingerprint::FingerprintSpec;
use super::headers::HeaderPolicy;
use super::rejection::{Rejection, Renderer};
use crate::engine::detach::Drain;
use crate::engine::Engine;
use crate::engine::fingerprint::Fingerprint;
use crate::json::{Found, JsonField, is_json};
use crate::engine::key::{DEFAULT_MAX_KEY_LEN, IdempotencyKey, KeyError, KeyErrorKind};
use crate::engine::scope::Scope;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, Method};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The default request body limit (1 MiB).
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;

/// The default collection bound (5 s): how long the layer waits for a recordable response's
/// body to end before it sends what it has read and lets the rest stream through (see
/// [response bodies](super#response-bodies)).
pub const DEFAULT_COLLECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default stream lease limit (5 min): how long the lease of a response that streams
/// through is renewed while its body has not ended (see
/// [response bodies](super#response-bodies)).
pub const DEFAULT_STREAM_LEASE_LIMIT: Duration = Duration::from_secs(5 * 60);

/// The media types that stream through by default: `text/event-stream` (server-sent events).
pub const DEFAULT_STREAMING_CONTENT_TYPES: &[&str] = &["text/event-stream"];

/// The principal a request acts for, put into request extensions by the application's
/// authentication layer (which must run before the idempotency layer).
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
    /// A keyed request without a principal is refused with 401 (the default).
    #[default]
    Required,
    /// Requests without a principal share ONE anonymous scope: an anonymous caller who sends
    /// another anonymous caller's key is served that caller's stored response. Pair it with
    /// [`ResponseMode::StatusAndHeaders`] unless the responses are safe for any anonymous caller.
    Optional,
}

/// What a recorded response keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseMode {
    /// Status, allowed headers and body (the default).
    #[default]
    Full,
    /// Status and allowed headers only, for bodies that must not rest in the store; a replay
    /// has an empty body, so the headers that describe a body are not kept
    /// ([`REPRESENTATION_HEADERS`](super::REPRESENTATION_HEADERS)). The record is written
    /// once the body has ended (released if the body fails).
    StatusAndHeaders,
}

/// What becomes of a handler's response that the classification table would record: recorded
/// (the default), or released. Returned by a hook given to
/// [`IdempotencyLayer::classify`](super::IdempotencyLayer::classify).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Classification {
    /// Recorded, then sent: a repeat under the key gets this response replayed.
    Record,
    /// Sent, not recorded: the key is freed, so a retry under it runs the handler again.
    Release,
}

/// A classification preset: releases `400 Bad Request`, `413 Content Too Large`,
/// `415 Unsupported Media Type` and `422 Unprocessable Content`, the answers to a request that
/// failed validation, and records the rest as the table does. Give it to
/// [`IdempotencyLayer::classify`](super::IdempotencyLayer::classify).
///
/// These are the statuses of axum's extractor rejections, which are answered *inside* the
/// layer: malformed JSON (400), a missing or wrong `content-type` (415), a `Json<T>` or
/// `Form<T>` that does not deserialize (422), a body over axum's limit (413), a bad query
/// string or path parameter (400). Released, they leave the key free, so the client can send
/// the corrected request with the same key (reference: the idempotency step runs after
/// validation); recorded, the corrected request would get `422 idempotency.key_reused`.
///
/// The trade-off: a handler's own 400, 413, 415 or 422 is released too, so a retry under the
/// same key runs the handler again. That is right for validation errors (the handler did
/// nothing), but not for a handler that did work and then answered one of these: give such an
/// outcome another status (409, say), or write your own hook. When the handlers are
/// `#[idempotent]` handlers this preset is not needed for extractor rejections: the attribute
/// runs the extractors before it claims the key.
///
/// ```
/// use axum::http::StatusCode;
/// use tower_idempotency::http::{Classification, IdempotencyLayer, release_validation_errors};
///
/// let layer = IdempotencyLayer::new().classify(release_validation_errors);
///
/// // Or a hook of your own, on top of the preset:
/// let layer = IdempotencyLayer::new().classify(|res| match res.status {
///     StatusCode::NOT_FOUND => Classification::Release,
///     _ => release_validation_errors(res),
/// });
/// ```
#[must_use]
pub fn release_validation_errors(res: &http::response::Parts) -> Classification {
    match res.status.as_u16() {
        400 | 413 | 415 | 422 => Classification::Release,
        _ => Classification::Record,
    }
}

pub(crate) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;
pub(crate) type FingerprintFn = Arc<dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync>;
pub(crate) type ClassifyFn = Arc<dyn Fn(&http::response::Parts) -> Classification + Send + Sync>;

#[derive(Clone)]
pub(crate) enum KeySource {
    Header(HeaderName),
    Fn(KeyFn),
}

/// What a layer and every service it makes share, behind one `Arc`: the engine (store, lease,
/// retention) and the HTTP settings.
pub(crate) struct LayerState<St> {
    pub(crate) engine: Engine<St>,
    pub(crate) config: Config,
    /// The claimed work not finished yet (shared by clones: one count per layer).
    pub(crate) in_flight: Drain,
}

impl<St> Clone for LayerState<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config.clone(),
            in_flight: self.in_flight.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) key_source: KeySource,
    /// The JSON body field read for a key when `key_source` gives none.
    pub(crate) json_key: Option<JsonField>,
    pub(crate) required: bool,
    pub(crate) principal_fn: Option<PrincipalFn>,
    pub(crate) principal_mode: PrincipalMode,
    pub(crate) methods: Option<Vec<Method>>,
    pub(crate) namespace: Arc<str>,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_body: usize,
    pub(crate) response_mode: ResponseMode,
    pub(crate) collect_timeout: Duration,
    pub(crate) stream_lease_limit: Duration,
    pub(crate) streaming_content_types: Vec<Box<str>>,
    pub(crate) headers: HeaderPolicy,
    pub(crate) renderer: Option<Renderer>,
    pub(crate) fingerprint_fn: Option<FingerprintFn>,
    pub(crate) json_by_value: bool,
    pub(crate) classify_fn: Option<ClassifyFn>,
    /// Claimed work finishes (and is recorded) when the response future is dropped.
    pub(crate) run_to_completion: bool,
    /// How long a duplicate that finds its key in flight waits for the first run (zero: 409
    /// at once).
    pub(crate) wait_in_flight: Duration,
    /// Records carry their times; responses say until when the record is kept.
    pub(crate) record_times: bool,
    /// What the fingerprint covers, when not the default.
    pub(crate) fingerprint_spec: Option<Box<FingerprintSpec>>,
    /// The door's counters, with the layer's static labels (feature `metrics`).
    pub(crate) metrics: crate::metrics::DoorCounters,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            key_source: KeySource::Header(super::headers::KEY_HEADER),
            json_key: None,
            required: true,
            principal_fn: None,
            principal_mode: PrincipalMode::Required,
            methods: None,
            namespace: Arc::from("default"),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            response_mode: ResponseMode::Full,
            collect_timeout: DEFAULT_COLLECT_TIMEOUT,
            stream_lease_limit: DEFAULT_STREAM_LEASE_LIMIT,
            streaming_content_types: DEFAULT_STREAMING_CONTENT_TYPES
                .iter()
                .map(|&t| Box::from(t))
                .collect(),
            headers: HeaderPolicy::default(),
            renderer: None,
            fingerprint_fn: None,
            json_by_value: false,
            classify_fn: None,
            run_to_completion: true,
            wait_in_flight: Duration::ZERO,
            record_times: false,
            fingerprint_spec: None,
            metrics: crate::metrics::DoorCounters::new(crate::metrics::Door::Http),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("json_key", &self.json_key)
            .field("required", &self.required)
            .field("principal_mode", &self.principal_mode)
            .field("methods", &self.methods)
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .field("max_request_body", &self.max_request_body)
            .field("response_mode", &self.response_mode)
            .field("collect_timeout", &self.collect_timeout)
            .field("stream_lease_limit", &self.stream_lease_limit)
            .field("streaming_content_types", &self.streaming_content_types)
            .field("headers", &self.headers)
            .field("json_by_value", &self.json_by_value)
            .field("run_to_completion", &self.run_to_completion)
            .field("wait_in_flight", &self.wait_in_flight)
            .field("record_times", &self.record_times)
            .field("fingerprint_spec", &self.fingerprint_spec)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Step 1: does the layer act on this method at all?
    pub(crate) fn applies_to(&self, method: &Method) -> bool {
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

    /// Step 2 for a request `key` found no key in: whether its key may be in its body (a JSON
    /// body field is configured and the body is JSON), so the body must be read to know.
    pub(crate) fn key_in_body(&self, headers: &HeaderMap) -> bool {
        self.json_key.is_some() && is_json(content_type(headers))
    }

    /// Step 2 on a body read for its key: the key in the JSON body field, if there is one.
    /// An invalid key, a field that is not a string or is repeated → `Err(detail)`.
    pub(crate) fn body_key(&self, body: &[u8]) -> Option<Result<IdempotencyKey, String>> {
        let field = self.json_key.as_ref()?;
        let name = field.name();
        match field.find(body) {
            Found::Absent => None,
            Found::String(s) => Some(
                IdempotencyKey::with_max_len(&s, self.max_key_len)
                    .map_err(|e| format!("the `{name}` field of the JSON body: {e}")),
            ),
            Found::NotAString => Some(Err(format!(
                "the `{name}` field of the JSON body must be a string"
            ))),
            Found::Repeated => Some(Err(format!(
                "the `{name}` field appears more than once in the JSON body"
            ))),
        }
    }

    /// The detail of a `key_missing` rejection: where a key was looked for.
    pub(crate) fn missing_key_detail(&self) -> String {
        let name = match &self.key_source {
            KeySource::Header(h) => h.as_str(),
            KeySource::Fn(_) => "idempotency key",
        };
        match &self.json_key {
            None => format!("this request requires an `{name}` header"),
            Some(field) => format!(
                "this request requires an `{name}` header or a `{}` field in its JSON body",
                field.name()
            ),
        }
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

    /// Step 6: the default fingerprint over method, path, raw query, content-type and body.
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        if let Some(f) = &self.fingerprint_fn {
            return f(parts, body);
        }
        let content_type = content_type(&parts.headers);
        if let Some(spec) = &self.fingerprint_spec {
            return spec.fingerprint(parts, body, content_type, self.json_by_value);
        }
        let head = Fingerprint::builder()
            .field(parts.method.as_str().as_bytes())
            .field(parts.uri.path().as_bytes())
            .field(parts.uri.query().unwrap_or_default().as_bytes())
            .field(content_type);
        if self.json_by_value && is_json(content_type) {
            head.json_value(body).finish()
        } else {
            head.field(body).finish()
        }
    }

    /// Step 9: whether a response of these headers streams through (its media type, without
    /// parameters, is one of the streaming content types).
    pub(crate) fn is_streaming(&self, headers: &http::HeaderMap) -> bool {
        let Some(value) = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let media_type = value.split(';').next().unwrap_or_default().trim();
        self.streaming_content_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case(media_type))
    }

    pub(crate) fn render(&self, rejection: &Rejection) -> http::Response<Bytes> {
        match &self.renderer {
            Some(r) => r(rejection),
            None => rejection.to_problem_response(),
        }
    }
}

fn content_type(headers: &HeaderMap) -> &[u8] {
    headers
        .get(http::header::CONTENT_TYPE)
        .map_or(&[][..], |v| v.as_bytes())
}

/// A setting the layer refused when it was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    detail: String,
}

/// The kinds of configuration error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A header on the fixed deny list was offered for the allow list.
    DeniedHeader,
    /// A JSON body field for the key that is empty or not a valid JSON pointer.
    InvalidJsonField,
    /// A metric label whose key the layer sets itself (`door`, `outcome`, `result`).
    ReservedMetricLabel,
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// What was refused.
    #[must_use]
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for ConfigError {}
