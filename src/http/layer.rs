//! The layer: a builder over the shared settings, and the [`Layer`] that wraps a service.

use super::config::{ClassifyFn, Config, KeySource, LayerState, PrincipalMode, ResponseMode};
use super::fingerprint::Fingerprinting;
use super::rejection::Rejection;
use super::service::Idempotency;
use super::streaming::Streaming;
use crate::engine::detach::Drain;
use crate::engine::scope::Scope;
use crate::engine::{Classify, Engine};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::{MemoryStore, Store};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method, Response};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Applies [`Idempotency`] to a service. Cheap to clone.
///
/// Build it from a store or an [`Engine`], then set options. Each option's default is on its
/// setter. The [module docs](crate::http) give the check order.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::engine::Engine;
/// use tower_idempotency::http::{IdempotencyLayer, Streaming};
/// use tower_idempotency::MemoryStore;
///
/// let engine = Engine::builder(MemoryStore::new()).lease(Duration::from_secs(30)).build();
/// let layer = IdempotencyLayer::new(engine)
///     .namespace("orders")
///     .wait_in_flight(Duration::from_secs(2))
///     .streaming(Streaming::default().collect_timeout(Duration::from_secs(1)));
/// ```
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

impl Default for IdempotencyLayer<MemoryStore> {
    /// A layer over a new [`MemoryStore`] with its default bounds.
    fn default() -> Self {
        Self::new(MemoryStore::new())
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer over `engine`: a store, or an [`Engine`] to share one store with other doors.
    ///
    /// The lease, the retention, the record limit and the secret are the engine's: set them
    /// on [`Engine::builder`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::engine::Engine;
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new());
    /// let engine = Engine::builder(MemoryStore::new()).retention(Duration::from_secs(3600)).build();
    /// let layer = IdempotencyLayer::new(engine);
    /// ```
    #[must_use]
    pub fn new(engine: impl Into<Engine<St>>) -> Self {
        Self {
            state: Arc::new({
                let engine = engine.into();
                LayerState {
                    config: Config {
                        secret: engine.secret().cloned(),
                        ..Config::default()
                    },
                    engine,
                    drain: Drain::new(),
                }
            }),
        }
    }

    pub(crate) fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut Arc::make_mut(&mut self.state).config);
        self
    }

    #[cfg(any(feature = "macros", feature = "webhook"))]
    fn map_engine(mut self, f: impl FnOnce(&mut Engine<St>)) -> Self {
        f(&mut Arc::make_mut(&mut self.state).engine);
        self
    }

    /// Reads the key from this header. Default: `Idempotency-Key`.
    #[must_use]
    pub fn header_name(self, name: HeaderName) -> Self {
        self.config(|c| c.key_source = KeySource::Header(name))
    }

    /// Reads the key with a closure instead of a header: from a path segment, say. The value
    /// is validated as a key: `1..=max_key_len` bytes of visible ASCII or spaces.
    #[must_use]
    pub fn identify(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.config(|c| c.key_source = KeySource::Fn(Arc::new(f)))
    }

    /// Whether a request without a key is refused with 400, or passed through. Default: `true`.
    #[must_use]
    pub fn require_key(self, require: bool) -> Self {
        self.config(|c| c.require_key = require)
    }

    /// Reads the caller's scope with a closure. Default: the [`Principal`](super::Principal)
    /// request extension.
    #[must_use]
    pub fn principal_fn(self, f: impl Fn(&Parts) -> Option<Scope> + Send + Sync + 'static) -> Self {
        self.config(|c| c.principal_fn = Some(Arc::new(f)))
    }

    /// Whether a principal is required, 401 without one, or optional: one shared anonymous
    /// scope. Default: [`PrincipalMode::Required`].
    #[must_use]
    pub fn principal(self, mode: PrincipalMode) -> Self {
        self.config(|c| c.principal_mode = mode)
    }

    /// The methods the layer acts on. Default: every method but GET, HEAD, OPTIONS, TRACE.
    #[must_use]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.config(|c| c.methods = Some(methods))
    }

    /// The namespace keys live in, replacing the default. Default: `http`.
    ///
    /// Give each door or route group its own, so two of them sharing a store never read each
    /// other's records. A store's own prefix keeps applications apart.
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let ns: String = namespace.into();
        self.config(|c| c.namespace = Arc::from(ns))
    }

    /// A route's lease over the engine's. It is the `lease` option of `#[idempotent]`.
    #[cfg(feature = "macros")]
    pub(crate) fn lease(self, lease: Duration) -> Self {
        self.map_engine(|e| e.set_lease(lease))
    }

    /// A route's retention over the engine's. It is the `retention` option of `#[idempotent]`,
    /// and a webhook sender's retention.
    #[cfg(any(feature = "macros", feature = "webhook"))]
    pub(crate) fn retention(self, retention: Duration) -> Self {
        self.map_engine(|e| e.set_retention(retention))
    }

    /// The largest request body buffered for the fingerprint, in bytes. Default: 1 MiB.
    ///
    /// A larger body is refused with 413, from its `Content-Length` first, then while read.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.config(|c| c.max_request_body = bytes)
    }

    /// A route's record limit over the engine's. It is the `max_record_body` option of
    /// `#[idempotent]`.
    #[cfg(feature = "macros")]
    pub(crate) fn max_record_body(self, bytes: usize) -> Self {
        self.map_engine(|e| e.set_max_record_body(bytes))
    }

    /// The longest key accepted, in bytes. Default: 255.
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.config(|c| c.max_key_len = bytes.max(1))
    }

    /// What a record keeps. Default: [`ResponseMode::Full`].
    #[must_use]
    pub fn response_mode(self, mode: ResponseMode) -> Self {
        self.config(|c| c.response_mode = mode)
    }

    /// When a response body goes out as it comes, and how long its key is held meanwhile.
    /// Default: [`Streaming::default()`].
    ///
    /// ```
    /// use tower_idempotency::http::{IdempotencyLayer, Streaming};
    ///
    /// let layer = IdempotencyLayer::default()
    ///     .streaming(Streaming::default().content_types(["text/event-stream", "application/x-ndjson"]));
    /// ```
    #[must_use]
    pub fn streaming(self, streaming: Streaming) -> Self {
        self.config(|c| c.streaming = streaming)
    }

    /// What the request fingerprint covers. Default: [`Fingerprinting::default()`], the
    /// method, path, raw query, `Content-Type` and body bytes.
    ///
    /// ```
    /// use tower_idempotency::http::{Fingerprinting, IdempotencyLayer};
    ///
    /// let layer = IdempotencyLayer::default()
    ///     .fingerprint(Fingerprinting::default().json_exclude(["/sent_at"]).unwrap());
    /// ```
    #[must_use]
    pub fn fingerprint(self, fingerprinting: Fingerprinting) -> Self {
        self.config(|c| c.fingerprint = fingerprinting)
    }

    /// Adds a header to the allow list of recorded and replayed headers.
    ///
    /// # Errors
    /// [`ConfigErrorKind::DeniedHeader`] for a header on the fixed deny list. That list holds
    /// `set-cookie`, `date`, `content-length`, hop-by-hop headers, `retry-after`,
    /// `ratelimit-*`, ….
    ///
    /// ```
    /// use tower_idempotency::http::IdempotencyLayer;
    /// use http::HeaderName;
    ///
    /// let layer = IdempotencyLayer::default().allow_header(HeaderName::from_static("x-order-id")).unwrap();
    /// assert!(IdempotencyLayer::default().allow_header(HeaderName::from_static("set-cookie")).is_err());
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

    /// Adds a fixed label to every metric this layer counts, with feature `metrics`. The route it
    /// guards is a good label, so that two layers in one process are graphed apart. A later label
    /// with the same key replaces the earlier one.
    ///
    /// Keep the value fixed and few. Never use a key, principal, path with ids, or anything else
    /// that grows with the traffic. Every distinct value is a new time series.
    ///
    /// # Errors
    /// [`ConfigErrorKind::ReservedLabel`] for a key the layer sets itself: `door`,
    /// `outcome` or `result`.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::default().metrics_label("route", "create_order").unwrap();
    /// assert!(IdempotencyLayer::default().metrics_label("outcome", "x").is_err());
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
                ConfigErrorKind::ReservedLabel,
                format!("the metric label `{key}` is set by the layer itself"),
            ));
        }
        let value = value.into();
        Ok(self.config(|c| c.metrics = c.metrics.with_label(key, value)))
    }

    /// Renders rejections with your own function instead of problem+json. The layer still inserts
    /// the [`Rejection`] into the response's extensions. This applies to HTTP requests only. A
    /// gRPC request is always rejected with a gRPC status: see [`Rejection::to_grpc_response`].
    #[must_use]
    pub fn render_rejection(
        self,
        f: impl Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.config(|c| c.renderer = Some(Arc::new(f)))
    }

    /// Gives the [`Verdict`](crate::engine::Verdict) on a response the table would record.
    /// Default: every such response is recorded.
    ///
    /// The hook sees the response's status, headers and extensions, not its body. It is asked
    /// only about a response the table records: 2xx, 3xx but 304, 4xx but 408, 425, 429. That
    /// holds in HTTP mode and for a non-200 answer to a gRPC request. So it can release more,
    /// never record what the table releases: such a record could never be replayed. A
    /// rejection of another idempotency layer is released before the hook is asked. See
    /// [after the handler](crate::http#after-the-handler).
    ///
    /// | verdict | the key |
    /// | --- | --- |
    /// | `Record` | recorded, as the table says |
    /// | `Release`, `Fail` | released: a retry runs the handler again |
    /// | `Hold` | held: its claim is kept for one lease from the response, 409 until then, a re-run after |
    ///
    /// [`ValidationClassifier`](super::ValidationClassifier) is the preset for axum
    /// routes whose extractors refuse invalid requests. The corrected request can then be
    /// sent with the same key.
    ///
    /// A closure names the type of its argument, as any [`Classify`] hook:
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_idempotency::engine::Verdict;
    /// use tower_idempotency::http::{IdempotencyLayer, ValidationClassifier};
    ///
    /// let layer = IdempotencyLayer::default().classify(ValidationClassifier);
    /// let layer = IdempotencyLayer::default().classify(|res: &http::response::Parts| {
    ///     if res.status == StatusCode::ACCEPTED { Verdict::Hold } else { Verdict::Record }
    /// });
    /// ```
    #[must_use]
    pub fn classify(self, hook: impl Classify<http::response::Parts>) -> Self {
        let hook: ClassifyFn = Arc::new(hook);
        self.config(|c| c.classify_fn = Some(hook))
    }

    /// Whether a claimed request's work runs to its end when the response future is dropped
    /// before it finishes. Default: `true`.
    ///
    /// A client that closes the connection, or an outer timeout, drops the response future. With
    /// `true`, the rest of the work is moved onto a task of its own and finishes. That work is
    /// the handler, the reading of its response body, and the record. The handler is never cut
    /// between two side effects, and the retry is answered from the record. While the caller
    /// waits nothing moves: the work is polled in place as any future. Wait for such work at
    /// shutdown with [`drain`](Self::drain).
    ///
    /// With `false`, the handler is cancelled where it stands, as a dropped future is in tower.
    /// The key stays pending until its lease lapses: 409 until then, a re-run after. This suits
    /// handlers that must stop when nobody waits for them, and whose side effects are safe to cut
    /// short. An expensive report nobody will read is one.
    ///
    /// Work that runs on is bounded twice. In time, [`detached_timeout`](Self::detached_timeout)
    /// bounds it: by default 5 min after its caller left. In number,
    /// [`max_detached`](Self::max_detached) bounds it: by default 1024 at once. So a hung handler
    /// does not hold its key, nor the process, forever. And work whose callers left does not
    /// escape the concurrency limits and timeouts outside the layer. Work cut by either bound is
    /// treated as with `false`: nothing recorded, nothing released.
    ///
    /// There are three limits. A response whose body streams through is not drained for a caller
    /// that has gone. Its key stays pending until its lease lapses, as before. Such a body has a
    /// streaming media type, or is over the record limit or slower than the collection bound. See
    /// [response bodies](super#response-bodies). A handler that panicked is never run on, and its
    /// key stays pending until its lease lapses. And work is finished only while the runtime
    /// lives. A process that exits, or a runtime shut down, with work running leaves those keys
    /// pending.
    #[must_use]
    pub fn run_to_completion(self, on: bool) -> Self {
        self.config(|c| c.run_to_completion = on)
    }

    /// How long work whose caller went away runs on before it is cancelled. Default: 5 min.
    /// See [`run_to_completion`](Self::run_to_completion). The bound starts when the caller goes
    /// away. Any value is accepted: `Duration::MAX` never cancels, `ZERO` cancels at the
    /// work's next wait.
    ///
    /// At the bound the work is cancelled where it stands, and its lease is no longer renewed.
    /// Nothing is recorded, since the handler gave no answer. Nothing is released: it may have had
    /// effects, and a retry must not run beside them at once. The key stays pending until its
    /// lease lapses, with 409 until then. A retry after that runs the work again, as after a
    /// crash. Set it above the slowest handler's time: work cut short may have done part of its
    /// effects.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::default().detached_timeout(Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.state)
            .drain
            .set_detached_timeout(timeout);
        self
    }

    /// How many works whose callers went away run on at once, for this layer and every service
    /// and route made from it. Default: 1024. See [`run_to_completion`](Self::run_to_completion).
    /// Work dropped by its caller while that many run is cancelled where it stands, as with
    /// `run_to_completion(false)`. Nothing is recorded or released, and its key stays pending
    /// until its lease lapses. The caller is gone, so there is no one to make wait. Zero detaches
    /// nothing.
    #[must_use]
    pub fn max_detached(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.state).drain.set_max_detached(max);
        self
    }

    /// How long a repeat that finds the same request in flight waits for the first run to
    /// finish before it is answered. Default: zero, 409 `idempotency.in_flight` at once.
    ///
    /// Within the bound the repeat gets what the first run left: its replay. When the first
    /// run was released, after a 5xx say, it gets a run of its own. Past the bound it gets 409,
    /// with a `Retry-After` of the lease the first run has left, at most a third of the lease.
    /// On the memory store the waiter is woken in process when the key settles. On Redis,
    /// across processes, and other stores it asks again with backoff: 10 ms doubling to 250 ms,
    /// one claim round trip each. A waiting repeat holds its connection and a task for up to
    /// the bound. Keep it short: a few seconds, below the clients' timeouts. A request with
    /// another fingerprint is answered 422 at once, never made to wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::default().wait_in_flight(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn wait_in_flight(self, bound: Duration) -> Self {
        self.config(|c| c.wait_in_flight = bound)
    }

    /// Marks first runs too: the handler's response to a request that claimed its key carries
    /// `Idempotent-Replayed: false`, as a replay carries `true`. Clients that branch on the
    /// header's presence then see it on every answer of a keyed request the handler produced.
    /// Default: off, the header is sent on replays only.
    ///
    /// Rejections (409, 422, 503, …) carry no such header: neither ran the work nor replayed
    /// it. Nor does a request the layer passes through: no key, or a method it does not act on.
    /// A browser reads the header of a cross-origin answer only when the server exposes it;
    /// see [`REPLAYED_HEADER`](super::REPLAYED_HEADER).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::{IdempotencyLayer, Principal};
    ///
    /// let svc = IdempotencyLayer::default()
    ///     .mark_first_runs(true)
    ///     .layer(service_fn(|_req| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("made")))
    ///     }));
    /// let request = || {
    ///     http::Request::post("/orders")
    ///         .header("idempotency-key", "k-1")
    ///         .extension(Principal::new("alice"))
    ///         .body(String::new())
    ///         .unwrap()
    /// };
    /// let first = svc.clone().oneshot(request()).await.unwrap();
    /// assert_eq!(first.headers()["idempotent-replayed"], "false");
    /// let again = svc.oneshot(request()).await.unwrap();
    /// assert_eq!(again.headers()["idempotent-replayed"], "true");
    /// # }
    /// ```
    #[must_use]
    pub fn mark_first_runs(self, on: bool) -> Self {
        self.config(|c| c.mark_first_runs = on)
    }

    /// Fails open: when the store is down, runs the work without a claim instead of refusing
    /// the request. Default: off, fail closed. A claim the store cannot answer (unreachable,
    /// or no answer within its timeout) is then answered 503 with `Retry-After`, and the
    /// handler does not run.
    ///
    /// On, such a request runs the handler and its response is passed on as it comes. **The
    /// risk**: while the store is down nothing is de-duplicated. A repeat of the request may run
    /// the work again, and the first run's response is not recorded, so a repeat after the
    /// outage runs it again too. Turn it on only for a route whose work is safe to repeat, or
    /// whose duplicates cost less than its refusals during an outage. Each such request is
    /// counted with the outcome `ran_unclaimed` and logged at warn.
    ///
    /// Only a claim that fails with [`StoreErrorKind::Unavailable`] or
    /// [`StoreErrorKind::Timeout`](crate::store::StoreErrorKind::Timeout) fails open: a store
    /// that is unreachable or silent, and also one that refuses the connection or the command
    /// (a wrong password, a missing permission or table: a misconfigured deploy then runs
    /// every such request unclaimed until it is fixed, so alert on `ran_unclaimed`). A full
    /// store or scope (429, 503), an answer the store cannot understand, and every record
    /// found are answered as without it.
    ///
    /// [`StoreErrorKind::Unavailable`]: crate::store::StoreErrorKind::Unavailable
    /// So is a repeat that [waits](Self::wait_in_flight) for its key in flight and then gets
    /// no answer: the store said the key is taken, so it is refused (503), never run beside
    /// the first run.
    /// The handler's [`Steps`](crate::Steps) are not tied to a claim: a step refuses to run
    /// ([`StepErrorKind::NotClaimed`](crate::engine::StepErrorKind::NotClaimed)).
    ///
    /// ```
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// // A route whose work is safe to repeat: better run twice than refuse.
    /// let layer = IdempotencyLayer::default().fail_open(true);
    /// ```
    #[must_use]
    pub fn fail_open(self, on: bool) -> Self {
        self.config(|c| c.fail_open = on)
    }

    /// The claimed work of this layer that has not finished yet, to wait on at shutdown.
    ///
    /// Every service and `#[idempotent]` route made from this layer, and from its clones,
    /// counts into the same handle.
    #[must_use]
    pub fn drain(&self) -> Drain {
        self.state.drain.clone()
    }

    /// Forgets the record of `key` sent by the caller of `scope` through this layer's namespace.
    /// The key can then be used again: see [`Engine::forget`]. A pending claim is kept, as
    /// [`Forgotten::KeptPending`](crate::store::Forgotten::KeptPending). Delete it too with
    /// [`forget_even_pending`](Self::forget_even_pending).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Principal};
    /// use tower_idempotency::store::Forgotten;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::default();
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
        let store_key = self
            .state
            .engine
            .store_key(&self.state.config.namespace, scope, key);
        self.state.engine.forget(&store_key).await
    }

    /// As [`forget`](Self::forget), and a pending claim is deleted too. Its work may still be
    /// running, and a retry then runs it again. See [`Engine::forget_even_pending`].
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget_even_pending(
        &self,
        key: &crate::IdempotencyKey,
        scope: &Scope,
    ) -> Result<crate::store::Forgotten, crate::store::StoreError> {
        let store_key = self
            .state
            .engine
            .store_key(&self.state.config.namespace, scope, key);
        self.state.engine.forget_even_pending(&store_key).await
    }

    /// What holds `key` sent by the caller of `scope` through this layer's namespace: nothing,
    /// a request in flight and its lease left, or the recorded status and when the record
    /// expires. It reads only. See [`Engine::inspect`].
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Principal};
    /// use tower_idempotency::engine::KeyState;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::default();
    /// let key = IdempotencyKey::new("order-7").unwrap();
    /// let state = layer.inspect(&key, Principal::new("alice").scope()).await.unwrap();
    /// assert_eq!(state, KeyState::Absent);
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    pub async fn inspect(
        &self,
        key: &crate::IdempotencyKey,
        scope: &Scope,
    ) -> Result<crate::engine::KeyState, crate::store::StoreError> {
        let store_key = self
            .state
            .engine
            .store_key(&self.state.config.namespace, scope, key);
        self.state.engine.inspect(&store_key).await
    }

    /// The engine the layer uses, with its store, lease and retention.
    #[must_use]
    pub fn engine(&self) -> &Engine<St> {
        &self.state.engine
    }

    /// The same settings over another store, made from this layer's engine. Every engine setting
    /// carries over: lease, retention, record limit and secret. It erases the store type for
    /// `IdempotentRoutes`.
    #[cfg(feature = "macros")]
    pub(crate) fn map_store<T: Store>(&self, f: impl FnOnce(&Arc<St>) -> T) -> IdempotencyLayer<T> {
        IdempotencyLayer {
            state: Arc::new(LayerState {
                engine: self.state.engine.map_store(f),
                config: self.state.config.clone(),
                // The routes' work is the shared layer's: one wait covers them all.
                drain: self.state.drain.clone(),
            }),
        }
    }

    /// Counts this layer's HTTP requests under another door, as for `#[idempotent]` handlers
    /// and webhooks.
    #[cfg(any(feature = "macros", feature = "webhook"))]
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
