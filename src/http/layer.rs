//! The layer: a builder over the shared settings, and the [`Layer`] that wraps a service.

use super::config::{
    Classification, Config, ConfigError, ConfigErrorKind, KeySource, LayerState, PrincipalMode,
    ResponseMode,
};
use super::fingerprint::FingerprintSpec;
use super::rejection::Rejection;
use super::service::Idempotency;
use crate::engine::detach::Drain;
use crate::engine::Engine;
use crate::engine::fingerprint::Fingerprint;
use crate::json::JsonField;
use crate::engine::scope::Scope;
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
                in_flight: Drain::new(),
            }),
        }
    }

    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut Arc::make_mut(&mut self.state).config);
        self
    }

    fn map_engine(mut self, f: impl FnOnce(&mut Engine<St>)) -> Self {
        f(&mut Arc::make_mut(&mut self.state).engine);
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

    /// Also reads the key from a field of a JSON body, for clients that cannot set headers.
    /// Off by default.
    ///
    /// `field` is an RFC 6901 JSON pointer when it starts with `/` (`/meta/idempotency_key`;
    /// `~1` stands for `/` and `~0` for `~` in a name), otherwise the name of a top-level
    /// field, taken as it is (`idempotency_key`).
    ///
    /// - **The header wins.** The body is looked at only when the header (or
    ///   [`key_fn`](Self::key_fn)) gives no key; a request with both is keyed by the header,
    ///   and the field is then just part of the body (and of its fingerprint).
    /// - **JSON bodies only**: `Content-Type: application/json` or `application/*+json`,
    ///   parameters such as `charset` ignored. Any other body is not read for a key.
    /// - **The value** must be a JSON string, validated like a key from [`key_fn`](Self::key_fn)
    ///   (`1..=max_key_len` bytes of visible ASCII or spaces; escapes such as `\u0041` are
    ///   decoded first). No such field, `null`, or a body that is not valid JSON is *no key*: with
    ///   [`required(false)`](Self::required) the request passes through (the handler then answers
    ///   broken JSON itself), otherwise 400 `idempotency.key_missing`. A number, boolean, object
    ///   or array there, a string that is not a valid key, or the field twice in one object is
    ///   400 `idempotency.key_invalid` (a client that sent a key in the wrong shape is told so,
    ///   never run unprotected).
    ///
    /// **The cost**: the layer cannot know whether such a request has a key before it has read
    /// its body, so a JSON request without a key header is buffered (up to
    /// [`max_request_body`](Self::max_request_body)) even when it turns out to have no key, and
    /// one over the limit is refused with 413 even with `required(false)`: it could carry a key
    /// the layer cannot read. A request with a key header, a body that is not JSON, and a
    /// method the layer does not act on are not buffered for this. A required key still checks
    /// the principal before the body is read (401 whatever the body holds); with
    /// `required(false)` a request without a key passes through before the principal check,
    /// as ever.
    ///
    /// # Errors
    /// [`ConfigErrorKind::InvalidJsonField`] for an empty `field`, or a pointer with a `~` not
    /// followed by `0` or `1`.
    ///
    /// ```
    /// use http::Request;
    /// use http_body_util::Full;
    /// use bytes::Bytes;
    /// use std::convert::Infallible;
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    /// use tower_idempotency::{IdempotencyLayer, Principal};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = IdempotencyLayer::new().key_from_json_field("/idempotency_key").unwrap();
    /// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req| async {
    ///     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("created"))))
    /// }));
    /// let request = || {
    ///     let mut req = Request::post("/orders")
    ///         .header("content-type", "application/json")
    ///         .body(Full::new(Bytes::from(r#"{"idempotency_key":"order-7","item":"book"}"#)))
    ///         .unwrap();
    ///     req.extensions_mut().insert(Principal::new("alice"));
    ///     req
    /// };
    /// let first = svc.clone().oneshot(request()).await.unwrap();
    /// assert!(!first.headers().contains_key("idempotent-replayed"));
    /// let again = svc.clone().oneshot(request()).await.unwrap();
    /// assert_eq!(again.headers()["idempotent-replayed"], "true");
    /// # });
    /// ```
    pub fn key_from_json_field(self, field: &str) -> Result<Self, ConfigError> {
        let field = JsonField::parse(field).map_err(|reason| {
            ConfigError::new(
                ConfigErrorKind::InvalidJsonField,
                format!("`{field}` is not a JSON body field for the key: {reason}"),
            )
        })?;
        Ok(self.config(|c| c.json_key = Some(field)))
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
    #[cfg(feature = "macros")]
    pub(crate) fn namespace_suffix(self, suffix: &str) -> Self {
        self.config(|c| c.namespace = Arc::from(format!("{}/{suffix}", c.namespace)))
    }

    /// How long a claim holds a key (default 60 s), renewed while the handler runs.
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.map_engine(|e| e.set_lease(lease))
    }

    /// How long a completed record is kept (default 24 h).
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.map_engine(|e| e.set_ttl(ttl))
    }

    /// The largest request body buffered for the fingerprint (default 1 MiB); larger → 413.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.config(|c| c.max_request_body = bytes)
    }

    /// The largest response body recorded (default 1 MiB); a larger response goes out as it
    /// comes and is recorded as status and headers only once its body has ended, and a
    /// warning is logged. (A larger gRPC response is released instead: see
    /// [gRPC mode](super::grpc).)
    #[must_use]
    pub fn max_record_body(self, bytes: usize) -> Self {
        self.map_engine(|e| e.set_max_record_body(bytes))
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

    /// How long the layer waits for a recordable response's body to end before it sends what
    /// it has read and lets the rest stream through, recorded as status and headers once it
    /// has ended (default 5 s, [`DEFAULT_COLLECT_TIMEOUT`](super::DEFAULT_COLLECT_TIMEOUT)).
    /// The bound starts when the handler has answered and its body first has to be waited
    /// for (a body whose frames are all ready is read without it); see
    /// [response bodies](super#response-bodies).
    #[must_use]
    pub fn collect_timeout(self, timeout: Duration) -> Self {
        self.config(|c| c.collect_timeout = timeout)
    }

    /// How long the key of a response that streams through stays held (its lease renewed)
    /// while its body has not ended (default 5 min,
    /// [`DEFAULT_STREAM_LEASE_LIMIT`](super::DEFAULT_STREAM_LEASE_LIMIT)). After it the lease
    /// is no longer renewed and lapses: a retry runs again, while the first stream goes on.
    /// See [response bodies](super#response-bodies).
    #[must_use]
    pub fn stream_lease_limit(self, limit: Duration) -> Self {
        self.config(|c| c.stream_lease_limit = limit)
    }

    /// The media types whose responses stream through as they come, never held back, and are
    /// recorded as status and headers once they have ended (default `text/event-stream`,
    /// [`DEFAULT_STREAMING_CONTENT_TYPES`](super::DEFAULT_STREAMING_CONTENT_TYPES)). The list
    /// replaces the default; a type is matched without its parameters, in any case.
    ///
    /// ```
    /// use tower_idempotency::http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new()
    ///     .streaming_content_types(["text/event-stream", "application/x-ndjson"]);
    /// ```
    #[must_use]
    pub fn streaming_content_types<I>(self, types: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let types = types
            .into_iter()
            .map(|t| Box::from(t.as_ref().trim().to_ascii_lowercase()))
            .collect();
        self.config(|c| c.streaming_content_types = types)
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

    /// Adds a fixed label to every metric this layer counts (feature `metrics`), e.g. the
    /// route it guards, so that two layers in one process are graphed apart. A later label
    /// with the same key replaces the earlier one.
    ///
    /// Keep the value fixed and few: never a key, principal, path with ids, or anything else
    /// that grows with the traffic (every distinct value is a new time series).
    ///
    /// # Errors
    /// [`ConfigErrorKind::ReservedMetricLabel`] for a key the layer sets itself: `door`,
    /// `outcome` or `result`.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new().metrics_label("route", "create_order").unwrap();
    /// assert!(IdempotencyLayer::new().metrics_label("outcome", "x").is_err());
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(
        self,
        key: &'static str,
        value: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        if crate::metrics::RESERVED_LABELS.contains(&key) {
            return Err(ConfigError::new(
                ConfigErrorKind::ReservedMetricLabel,
                format!("the metric label `{key}` is set by the layer itself"),
            ));
        }
        let value = value.into();
        Ok(self.config(|c| c.metrics = c.metrics.with_label(key, value)))
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
    /// buffered body) instead of method, path, raw query, content-type and body. (It replaces
    /// [`fingerprint_json_by_value`](Self::fingerprint_json_by_value) too.)
    #[must_use]
    pub fn fingerprint_fn(
        self,
        f: impl Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.config(|c| c.fingerprint_fn = Some(Arc::new(f)))
    }

    /// Fingerprints a JSON body by its value instead of its bytes, so a client library that
    /// serialises the body again for a retry (`{"item": "book"}`, then `{"item":"book"}`) gets a
    /// replay instead of 422. Off by default.
    ///
    /// For `Content-Type: application/json` and `application/*+json` bodies (parameters ignored)
    /// the body is parsed and its canonical form is fingerprinted: insignificant whitespace
    /// and the order of object members are ignored, and escapes in strings are decoded
    /// (`"\u00e9"` is `"é"`). Everything else still counts: array order, the value and type
    /// of every member, and a **number's literal text** (`1`, `1.0` and `1e0` differ; a
    /// retry is never replayed as an earlier request that a decimal parser would read
    /// otherwise). A name repeated in one object keeps its members in their order. A body
    /// that does not parse (or nests deeper than 128) is fingerprinted by its bytes, as is
    /// every other content type. The method, path, query and `Content-Type` header are
    /// fingerprinted as before.
    ///
    /// The cost is one parse of the body per keyed request (the canonical form is streamed into
    /// the hash, never built whole): `cargo bench --bench layer -- fingerprint` compares it with
    /// the raw fingerprint. Turning the option on or off changes the fingerprint of every JSON
    /// body, so a retry across that change is answered 422.
    ///
    /// ```
    /// use http::Request;
    /// use http_body_util::Full;
    /// use bytes::Bytes;
    /// use std::convert::Infallible;
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    /// use tower_idempotency::{IdempotencyLayer, Principal};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = IdempotencyLayer::new().fingerprint_json_by_value(true);
    /// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req| async {
    ///     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("created"))))
    /// }));
    /// let request = |body: &'static str| {
    ///     let mut req = Request::post("/orders")
    ///         .header("content-type", "application/json")
    ///         .header("idempotency-key", "order-7")
    ///         .body(Full::new(Bytes::from(body)))
    ///         .unwrap();
    ///     req.extensions_mut().insert(Principal::new("alice"));
    ///     req
    /// };
    /// svc.clone().oneshot(request(r#"{"item": "book", "qty": 1}"#)).await.unwrap();
    /// let again = svc.clone().oneshot(request(r#"{"qty":1,"item":"book"}"#)).await.unwrap();
    /// assert_eq!(again.headers()["idempotent-replayed"], "true");
    /// let other = svc.clone().oneshot(request(r#"{"qty":1.0,"item":"book"}"#)).await.unwrap();
    /// assert_eq!(other.status(), 422);
    /// # });
    /// ```
    #[must_use]
    pub fn fingerprint_json_by_value(self, on: bool) -> Self {
        self.config(|c| c.json_by_value = on)
    }

    fn spec(self, f: impl FnOnce(&mut FingerprintSpec)) -> Self {
        self.config(|c| f(c.fingerprint_spec.get_or_insert_with(Box::default)))
    }

    fn json_fields<'a>(
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<JsonField>, ConfigError> {
        pointers
            .into_iter()
            .map(|p| {
                JsonField::parse(p).map_err(|reason| {
                    ConfigError::new(
                        ConfigErrorKind::InvalidJsonField,
                        format!("`{p}` is not a JSON body field for the fingerprint: {reason}"),
                    )
                })
            })
            .collect()
    }

    /// Leaves these fields of a JSON body out of the fingerprint: values that change between
    /// attempts without changing the request (a timestamp, a nonce, a refreshed credential).
    /// Each is an RFC 6901 JSON pointer (`/meta/sent_at`; `/items/0` for an array item) or a
    /// top-level name. The body is then compared by value (as
    /// [`fingerprint_json_by_value`](Self::fingerprint_json_by_value)); every member of a
    /// repeated name goes. A body that is not JSON is fingerprinted by its bytes, as ever.
    ///
    /// ```
    /// use http::Request;
    /// use http_body_util::Full;
    /// use bytes::Bytes;
    /// use std::convert::Infallible;
    /// use tower::{ServiceBuilder, ServiceExt, service_fn};
    /// use tower_idempotency::{IdempotencyLayer, Principal};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = IdempotencyLayer::new().fingerprint_json_exclude(["/sent_at"]).unwrap();
    /// let svc = ServiceBuilder::new().layer(layer).service(service_fn(|_req| async {
    ///     Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("created"))))
    /// }));
    /// let request = |body: &'static str| {
    ///     let mut req = Request::post("/orders")
    ///         .header("content-type", "application/json")
    ///         .header("idempotency-key", "order-7")
    ///         .body(Full::new(Bytes::from(body)))
    ///         .unwrap();
    ///     req.extensions_mut().insert(Principal::new("alice"));
    ///     req
    /// };
    /// svc.clone().oneshot(request(r#"{"item":"book","sent_at":"12:00:00"}"#)).await.unwrap();
    /// let retry = svc.clone().oneshot(request(r#"{"item":"book","sent_at":"12:00:05"}"#)).await.unwrap();
    /// assert_eq!(retry.headers()["idempotent-replayed"], "true");
    /// # });
    /// ```
    ///
    /// # Errors
    /// [`ConfigErrorKind::InvalidJsonField`] for an empty name or a malformed pointer.
    pub fn fingerprint_json_exclude<'a>(
        self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, ConfigError> {
        let fields = Self::json_fields(pointers)?;
        Ok(self.spec(|s| s.exclude = fields))
    }

    /// Fingerprints only these fields of a JSON body (by value, in the order given; an absent
    /// field counts as absent), so anything else in the body may change between attempts.
    /// Pointers as in [`fingerprint_json_exclude`](Self::fingerprint_json_exclude), which still
    /// applies inside the included values. A body that is not JSON: its bytes.
    ///
    /// # Errors
    /// [`ConfigErrorKind::InvalidJsonField`] for an empty name or a malformed pointer.
    pub fn fingerprint_json_include<'a>(
        self,
        pointers: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, ConfigError> {
        let fields = Self::json_fields(pointers)?;
        Ok(self.spec(|s| s.include = fields))
    }

    /// Fingerprints axum's route template (`/orders/{id}`, from
    /// [`MatchedPath`](axum::extract::MatchedPath)) instead of the request path. Off by
    /// default. With a key that names the resource already, this lets `/orders/7` and
    /// `/orders/7/` (or a path rewritten by a proxy) count as one request; it also means two
    /// paths of one route under one key are one request, so use it only where the key is
    /// unique per resource.
    ///
    /// axum sets `MatchedPath` when it routes: add the layer with `Router::route_layer` or on
    /// a route (the `#[idempotent]` handlers always see it). A layer added with
    /// `Router::layer` runs before routing: it fingerprints the path, and warns once.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    #[must_use]
    pub fn fingerprint_route_template(self, on: bool) -> Self {
        self.spec(|s| s.route_template = on)
    }

    /// Fingerprints these request headers too (their values in order, absent counted), e.g. a
    /// `X-Account` that selects what the request acts on. None by default.
    #[must_use]
    pub fn fingerprint_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.spec(|s| s.headers = names)
    }

    /// Fingerprints the query with its parameters sorted, so `?a=1&b=2` and `?b=2&a=1` are one
    /// request. Off by default (the raw query counts, order included). Parameters are compared
    /// as sent (`%41` and `A` differ); a repeated parameter counts each time.
    #[must_use]
    pub fn fingerprint_canonical_query(self, on: bool) -> Self {
        self.spec(|s| s.canonical_query = on)
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
    /// default; see [`Secret`](crate::Secret).
    #[must_use]
    pub fn secret(self, secret: crate::Secret) -> Self {
        self.map_engine(|e| e.set_secret(secret))
    }

    /// Whether a claimed request's work runs to its end when the response future is dropped
    /// before it finishes (default `true`).
    ///
    /// A client that closes the connection, or an outer timeout, drops the response future.
    /// With `true`, the rest of the work (the handler, the reading of its response body, the
    /// record) is moved onto a task of its own and finishes: the handler is never cut between
    /// two side effects, and the retry is answered from the record. While the caller waits
    /// nothing moves: the work is polled in place as any future. Wait for such work at
    /// shutdown with [`in_flight`](Self::in_flight).
    ///
    /// With `false`, the handler is cancelled where it stands, as a dropped future is in
    /// tower, and the key stays pending until its lease lapses (409 until then, a re-run
    /// after): for handlers that must stop when nobody waits for them (an expensive report
    /// nobody will read), and whose side effects are safe to cut short.
    ///
    /// Work that runs on is bounded, in time by [`detached_timeout`](Self::detached_timeout)
    /// (default 5 min after its caller left) and in number by
    /// [`max_detached`](Self::max_detached) (default 1024 at once): a hung handler does not
    /// hold its key, nor the process, forever, and work whose callers left does not escape
    /// the concurrency limits and timeouts outside the layer. Work cut by either bound is
    /// treated as with `false`: nothing recorded, nothing released.
    ///
    /// Three limits. A response whose body streams through (a streaming media type, a body
    /// over the record limit or slower than the collection bound; see
    /// [response bodies](super#response-bodies)) is not drained for a caller that has gone:
    /// its key stays pending until its lease lapses, as before. A handler that panicked is
    /// never run on (its key stays pending until its lease lapses). And work is finished only
    /// while the runtime lives; a process that exits (or a runtime shut down) with work
    /// running leaves those keys pending.
    #[must_use]
    pub fn run_to_completion(self, on: bool) -> Self {
        self.config(|c| c.run_to_completion = on)
    }

    /// How long work whose caller went away runs on before it is cancelled (default 5 min); see
    /// [`run_to_completion`](Self::run_to_completion). The bound starts when the caller goes
    /// away. Any value is accepted: `Duration::MAX` never cancels, `ZERO` cancels at the
    /// work's next wait.
    ///
    /// At the bound the work is cancelled where it stands and its lease is no longer renewed:
    /// nothing is recorded (the handler gave no answer) and nothing is released (it may have
    /// had effects, and a retry must not run beside them at once). The key stays pending until
    /// its lease lapses (409 until then), and a retry after it runs the work again, as after a
    /// crash. Set it above the slowest handler's time: work cut short may have done part of
    /// its effects.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new().detached_timeout(Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.state)
            .in_flight
            .set_detached_timeout(timeout);
        self
    }

    /// How many works whose callers went away run on at once, for this layer and every
    /// service and route made from it (default 1024); see
    /// [`run_to_completion`](Self::run_to_completion). Work dropped by its caller while that
    /// many run is cancelled where it stands, as with `run_to_completion(false)`: nothing
    /// recorded, nothing released, its key pending until its lease lapses. (The caller is
    /// gone: there is no one to make wait.) Zero detaches nothing.
    #[must_use]
    pub fn max_detached(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.state)
            .in_flight
            .set_max_detached(max);
        self
    }

    /// How long a duplicate that finds the same request in flight waits for the first run to
    /// finish before it is answered (default zero: 409 `idempotency.in_flight` at once).
    ///
    /// Within the bound the duplicate gets what the first run left: its replay, or, when the
    /// first run was released (a 5xx, say), a run of its own. Past the bound: 409, with a
    /// `Retry-After` from the lease the first run has left. On the memory store the waiter is
    /// woken in process when the key settles; on Redis (across processes) and other stores it
    /// asks again with backoff (10 ms doubling to 250 ms, one claim round trip each). A waiting
    /// duplicate holds its connection and a task for up to the bound: keep it short (a few
    /// seconds, below the clients' timeouts). A request with another fingerprint is answered
    /// 422 at once, never made to wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new().wait_in_flight(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn wait_in_flight(self, bound: Duration) -> Self {
        self.config(|c| c.wait_in_flight = bound)
    }

    /// Tells the client until when the key's record is kept, and how old a replayed one is
    /// (default off). A recorded response and its replays carry
    /// [`Tower-Idempotency-Kept-Until`](super::KEPT_UNTIL_HEADER) (an HTTP-date: when the
    /// retention ends), and a replay [`Tower-Idempotency-Age`](super::RECORD_AGE_HEADER) (the
    /// record's age in seconds). The record then holds when it was written and until when it
    /// is kept (16 bytes more). Vendor-prefixed until the IETF draft names a header.
    ///
    /// A record written while this was off carries no times: its replays carry no such
    /// headers.
    #[must_use]
    pub fn record_times(self, on: bool) -> Self {
        self.config(|c| c.record_times = on)
    }

    /// The claimed work of this layer that has not finished yet, to wait on at shutdown (see
    /// [`Drain`]). Every service and `#[idempotent]` route made from this layer (and
    /// from its clones) counts into the same handle.
    #[must_use]
    pub fn in_flight(&self) -> Drain {
        self.state.in_flight.clone()
    }

    /// Forgets the record of `key` sent by the caller of `scope` through this layer (its
    /// namespace), so the key can be used again: see [`Engine::forget`]. A pending claim is
    /// kept ([`Forgotten::KeptPending`](crate::store::Forgotten::KeptPending)); delete it too
    /// with [`forget_even_pending`](Self::forget_even_pending).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Principal};
    /// use tower_idempotency::store::Forgotten;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::new();
    /// let key = IdempotencyKey::new("order-7").unwrap();
    /// let found = layer.forget(&key, Principal::new("alice").scope()).await.unwrap();
    /// assert_eq!(found, Forgotten::Nothing);
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(
        &self,
        key: &crate::IdempotencyKey,
        scope: &Scope,
    ) -> Result<crate::store::Forgotten, crate::store::StoreError> {
        let store_key = crate::engine::scope::StoreKey::derive(&self.state.config.namespace, scope, key);
        self.state.engine.forget(&store_key).await
    }

    /// As [`forget`](Self::forget), and a pending claim is deleted too (its work may still be
    /// running: a retry then runs it again): see [`Engine::forget_even_pending`].
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget_even_pending(
        &self,
        key: &crate::IdempotencyKey,
        scope: &Scope,
    ) -> Result<crate::store::Forgotten, crate::store::StoreError> {
        let store_key = crate::engine::scope::StoreKey::derive(&self.state.config.namespace, scope, key);
        self.state.engine.forget_even_pending(&store_key).await
    }

    /// The engine the layer uses (its store, lease and retention).
    #[must_use]
    pub fn engine(&self) -> &Engine<St> {
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
                // The routes' work is the shared layer's: one wait covers them all.
                in_flight: self.state.in_flight.clone(),
            }),
        }
    }

    /// Counts this layer's HTTP requests under another door (`#[idempotent]` handlers).
    #[cfg(feature = "macros")]
    pub(crate) fn metrics_door(self, door: crate::metrics::Door) -> Self {
        self.config(|c| c.metrics = c.metrics.with_door(door))
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
