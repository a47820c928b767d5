//! The layer: a builder over the shared settings, and the [`Layer`] that wraps a service.

use super::config::{
    Classification, Config, ConfigError, ConfigErrorKind, KeySource, LayerState, PrincipalMode,
    ResponseMode,
};
use super::rejection::Rejection;
use super::service::Idempotency;
use crate::engine::Engine;
use crate::fingerprint::Fingerprint;
use crate::scope::Scope;
use crate::store::{MemoryStore, Store};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method, Response};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Applies [`Idempotency`] to a service. Built with `#[must_use]` options; cheap to clone.
///
/// See the [module docs](crate::http) for the check order and every option's default.
pub struct IdempotencyLayer<St = MemoryStore> {
    pub(crate) state: Arc<LayerState<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.state.engine)
            .field("config", &self.state.config)
            .finish()
    }
}

impl IdempotencyLayer<MemoryStore> {
    /// A layer over a new [`MemoryStore`] with its default bounds.
    #[must_use]
    pub fn new() -> Self {
        Self::with_store(MemoryStore::new())
    }
}

impl Default for IdempotencyLayer<MemoryStore> {
    fn default() -> Self {
        Self::new()
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `store`.
    #[must_use]
    pub fn with_store(store: St) -> Self {
        Self::with_engine(Engine::new(store))
    }

    /// A layer over an engine (to share one store, lease and retention with other doors).
    #[must_use]
    pub fn with_engine(engine: Engine<St>) -> Self {
        Self {
            state: Arc::new(LayerState {
                engine,
                config: Config::default(),
            }),
        }
    }

    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut Arc::make_mut(&mut self.state).config);
        self
    }

    fn engine(mut self, f: impl FnOnce(Engine<St>) -> Engine<St>) -> Self {
        let state = Arc::make_mut(&mut self.state);
        state.engine = f(state.engine.clone());
        self
    }

    /// Reads the key from this header (default `Idempotency-Key`).
    #[must_use]
    pub fn header_name(self, name: HeaderName) -> Self {
        self.config(|c| c.key_source = KeySource::Header(name))
    }

    /// Reads the key with a closure instead of a header (e.g. from a path segment). The value
    /// is validated as a key: `1..=max_key_len` bytes of visible ASCII or spaces.
    #[must_use]
    pub fn key_fn(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.config(|c| c.key_source = KeySource::Fn(Arc::new(f)))
    }

    /// Whether a request without a key is refused (400, the default) or passed through.
    #[must_use]
    pub fn required(self, required: bool) -> Self {
        self.config(|c| c.required = required)
    }

    /// Reads the caller's scope with a closure instead of the [`Principal`](super::Principal)
    /// request extension (the default).
    #[must_use]
    pub fn principal_fn(self, f: impl Fn(&Parts) -> Option<Scope> + Send + Sync + 'static) -> Self {
        self.config(|c| c.principal_fn = Some(Arc::new(f)))
    }

    /// Whether a principal is required (401 without one, the default) or optional (one
    /// shared anonymous scope).
    #[must_use]
    pub fn principal(self, mode: PrincipalMode) -> Self {
        self.config(|c| c.principal_mode = mode)
    }

    /// The methods the layer acts on (default: every method but GET, HEAD, OPTIONS, TRACE).
    #[must_use]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.config(|c| c.methods = Some(methods))
    }

    /// The namespace keys live in (default `default`): one per application or route group, so
    /// two of them sharing a store never read each other's records.
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let ns: String = namespace.into();
        self.config(|c| c.namespace = Arc::from(ns))
    }

    /// Appends `/suffix` to the namespace (`payments` → `payments/refunds`), so one route or
    /// route group keeps its keys apart from the rest of the namespace. Used by the
    /// `#[idempotent(namespace = "…")]` option.
    #[doc(hidden)]
    #[must_use]
    pub fn namespace_suffix(self, suffix: &str) -> Self {
        self.config(|c| c.namespace = Arc::from(format!("{}/{suffix}", c.namespace)))
    }

    /// How long a claim holds a key (default 60 s), renewed while the handler runs.
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.engine(|e| e.with_lease(lease))
    }

    /// How long a completed record is kept (default 24 h).
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.engine(|e| e.with_ttl(ttl))
    }

    /// The largest request body buffered for the fingerprint (default 1 MiB); larger → 413.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.config(|c| c.max_request_body = bytes)
    }

    /// The largest response body recorded (default 1 MiB); a larger response is recorded as
    /// status and headers only, and a warning is logged. (A larger gRPC response is released
    /// instead: see [gRPC mode](super::grpc).)
    #[must_use]
    pub fn max_record_body(self, bytes: usize) -> Self {
        self.engine(|e| e.with_max_record_body(bytes))
    }

    /// The longest key accepted, in bytes (default 255).
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.config(|c| c.max_key_len = bytes.max(1))
    }

    /// What a record keeps (default [`ResponseMode::Full`]).
    #[must_use]
    pub fn response_mode(self, mode: ResponseMode) -> Self {
        self.config(|c| c.response_mode = mode)
    }

    /// Adds a header to the allow list of recorded and replayed headers.
    ///
    /// # Errors
    /// [`ConfigErrorKind::DeniedHeader`] for a header on the fixed deny list (`set-cookie`,
    /// `date`, `content-length`, hop-by-hop headers, `retry-after`, `ratelimit-*`, …).
    ///
    /// ```
    /// use tower_idempotency::http::IdempotencyLayer;
    /// use http::HeaderName;
    ///
    /// let layer = IdempotencyLayer::new().allow_header(HeaderName::from_static("x-order-id")).unwrap();
    /// assert!(IdempotencyLayer::new().allow_header(HeaderName::from_static("set-cookie")).is_err());
    /// ```
    pub fn allow_header(mut self, name: HeaderName) -> Result<Self, ConfigError> {
        let state = Arc::make_mut(&mut self.state);
        if state.config.headers.allow(name.clone()) {
            Ok(self)
        } else {
            Err(ConfigError::new(
                ConfigErrorKind::DeniedHeader,
                format!("the header `{name}` is never recorded or replayed and cannot be allowed"),
            ))
        }
    }

    /// Renders rejections with your own function instead of problem+json. The layer still
    /// inserts the [`Rejection`] into the response's extensions. Applies to HTTP requests
    /// only: a gRPC request is always rejected with a gRPC status
    /// ([`Rejection::to_grpc_response`]).
    #[must_use]
    pub fn render_rejection(
        self,
        f: impl Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.config(|c| c.renderer = Some(Arc::new(f)))
    }

    /// Computes the fingerprint with your own function (given the request head and the
    /// buffered body) instead of method, path, raw query, content-type and body.
    #[must_use]
    pub fn fingerprint_fn(
        self,
        f: impl Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.config(|c| c.fingerprint_fn = Some(Arc::new(f)))
    }

    /// Decides with `f` whether a response the classification table would record is recorded
    /// or released (see the [module docs](crate::http#after-the-handler)); by default every
    /// such response is recorded.
    ///
    /// `f` sees the response's status, headers and extensions (not its body) and is called only
    /// for a response the table records (2xx, 3xx but 304, 4xx but 408, 425, 429), in HTTP
    /// mode and for a non-200 answer to a gRPC request: it can release more, never record
    /// what the table releases (such a record could never be replayed). A rejection of another
    /// idempotency layer is released before `f` is asked.
    ///
    /// [`release_validation_errors`](super::release_validation_errors) is the preset for a
    /// layer around axum routes whose extractors reject invalid requests (400, 413, 415, 422):
    /// the corrected request can then be sent with the same key.
    ///
    /// ```
    /// use tower_idempotency::http::{IdempotencyLayer, release_validation_errors};
    ///
    /// let layer = IdempotencyLayer::new().classify(release_validation_errors);
    /// ```
    #[must_use]
    pub fn classify(
        self,
        f: impl Fn(&http::response::Parts) -> Classification + Send + Sync + 'static,
    ) -> Self {
        self.config(|c| c.classify_fn = Some(Arc::new(f)))
    }

    /// Authenticates records with an HMAC under `secret` and keys the stored fingerprints, so
    /// a record written into the store by someone else is refused (503), not replayed. Off by
    /// default; see [`crate::secret`].
    #[must_use]
    pub fn secret(self, secret: crate::Secret) -> Self {
        self.engine(|e| e.with_secret(secret))
    }

    /// The engine the layer uses (its store, lease and retention).
    #[must_use]
    pub fn engine_ref(&self) -> &Engine<St> {
        &self.state.engine
    }

    /// The same settings over another store, made from this layer's engine; every engine
    /// setting (lease, retention, record limit, secret) carries over. (Erases the store type
    /// for `IdempotentRoutes`.)
    #[cfg(feature = "macros")]
    pub(crate) fn map_store<T: Store>(&self, f: impl FnOnce(&Arc<St>) -> T) -> IdempotencyLayer<T> {
        IdempotencyLayer {
            state: Arc::new(LayerState {
                engine: self.state.engine.map_store(f),
                config: self.state.config.clone(),
            }),
        }
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            state: Arc::clone(&self.state),
        }
    }
}
