//! The layer's settings and the state every clone of the layer and its services share.

use super::headers::HeaderPolicy;
use super::rejection::{Rejection, Renderer};
use crate::engine::Engine;
use crate::fingerprint::Fingerprint;
use crate::key::{DEFAULT_MAX_KEY_LEN, IdempotencyKey, KeyError, KeyErrorKind};
use crate::scope::Scope;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method};
use std::fmt;
use std::sync::Arc;

/// The default request body limit (1 MiB).
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;

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
    /// has an empty body.
    StatusAndHeaders,
}

pub(crate) type KeyFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<Scope> + Send + Sync>;
pub(crate) type FingerprintFn = Arc<dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync>;

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
}

impl<St> Clone for LayerState<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) key_source: KeySource,
    pub(crate) required: bool,
    pub(crate) principal_fn: Option<PrincipalFn>,
    pub(crate) principal_mode: PrincipalMode,
    pub(crate) methods: Option<Vec<Method>>,
    pub(crate) namespace: Arc<str>,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_body: usize,
    pub(crate) response_mode: ResponseMode,
    pub(crate) headers: HeaderPolicy,
    pub(crate) renderer: Option<Renderer>,
    pub(crate) fingerprint_fn: Option<FingerprintFn>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            key_source: KeySource::Header(super::headers::KEY_HEADER),
            required: true,
            principal_fn: None,
            principal_mode: PrincipalMode::Required,
            methods: None,
            namespace: Arc::from("default"),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            response_mode: ResponseMode::Full,
            headers: HeaderPolicy::default(),
            renderer: None,
            fingerprint_fn: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("required", &self.required)
            .field("principal_mode", &self.principal_mode)
            .field("methods", &self.methods)
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .field("max_request_body", &self.max_request_body)
            .field("response_mode", &self.response_mode)
            .field("headers", &self.headers)
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

    /// The key's source as named in a rejection: the header, or a generic name for `key_fn`.
    pub(crate) fn key_name(&self) -> &str {
        match &self.key_source {
            KeySource::Header(h) => h.as_str(),
            KeySource::Fn(_) => "idempotency key",
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
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map_or(&[][..], |v| v.as_bytes());
        Fingerprint::builder()
            .field(parts.method.as_str().as_bytes())
            .field(parts.uri.path().as_bytes())
            .field(parts.uri.query().unwrap_or_default().as_bytes())
            .field(content_type)
            .field(body)
            .finish()
    }

    pub(crate) fn render(&self, rejection: &Rejection) -> http::Response<Bytes> {
        match &self.renderer {
            Some(r) => r(rejection),
            None => rejection.to_problem_response(),
        }
    }
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
