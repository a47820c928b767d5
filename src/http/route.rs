//! Per-route idempotency: the [`#[idempotent]`](crate::idempotent) attribute, and the shared
//! [`IdempotentRoutes`] it reads from the request extensions.
//!
//! ```
//! use axum::extract::Extension;
//! use axum::http::StatusCode;
//! use axum::routing::post;
//! use axum::Router;
//! use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes, MemoryStore};
//!
//! #[idempotent(retention = "1h", namespace = "payments")]
//! async fn create_payment(body: String) -> (StatusCode, String) {
//!     (StatusCode::CREATED, format!("charged for {body}"))
//! }
//!
//! #[idempotent(response_mode = "status_and_headers", namespace = "refunds")]
//! async fn create_refund() -> StatusCode {
//!     StatusCode::ACCEPTED
//! }
//!
//! let shared = IdempotencyLayer::new(MemoryStore::new()).namespace("billing");
//! let app: Router = Router::new()
//!     .route("/payments", post(create_payment))
//!     .route("/refunds", post(create_refund))
//!     .layer(Extension(IdempotentRoutes::new(shared)));
//! ```
//!
//! The attribute marks one axum handler idempotent where it is written. Its options override
//! one shared configuration, per route: lease, retention, response mode, namespace and more.
//! The shared configuration is an [`IdempotencyLayer`]: the store, principal source, namespace
//! and limits. It is installed once on the router as an [`Extension`](axum::Extension).
//!
//! The handler then runs the layer's own check order, classification and replay, with one
//! difference. Its extractors run before the key is claimed. So a request they refuse, a
//! validation error, leaves the key free for the corrected request. A [`Steps`](crate::Steps)
//! argument is taken then too, and tied to the claim before the handler runs.

use crate::http::{IdempotencyLayer, PrincipalMode, ResponseMode};
use crate::store::Store;
pub use crate::store::erased::DynStore;
use http::HeaderName;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// The idempotent routes of one router: the shared settings of every
/// [`#[idempotent]`](crate::idempotent) handler (the store, principal source, namespace, limits
/// and defaults of an [`IdempotencyLayer`]), and each route's layer, built from them and the
/// route's own options on its first request and kept. The handlers read it from the request
/// extensions.
///
/// Install it once on the router, after the routes (so it wraps them):
///
/// ```
/// # use axum::{Extension, Router};
/// # use tower_idempotency::{IdempotencyLayer, IdempotentRoutes, MemoryStore};
/// let config = IdempotentRoutes::new(IdempotencyLayer::new(MemoryStore::new()).namespace("payments"));
/// let app: Router = Router::new() /* .route(…) */ .layer(Extension(config));
/// ```
///
/// The store type is erased ([`DynStore`]) so that one configuration type fits every store and
/// every router state: each store call costs one small allocation (a boxed future), next to a
/// SHA-256 fingerprint and usually a network round trip.
///
/// Cheap to clone. The merged settings of each attributed route are built on first use and
/// kept here, so a request does not rebuild them.
#[derive(Clone)]
pub struct IdempotentRoutes {
    inner: Arc<Inner>,
}

struct Inner {
    layer: IdempotencyLayer<DynStore>,
    /// The shared layer with each route's options applied, keyed by the address of the route's
    /// `static` options (statics never move).
    routes: RwLock<HashMap<usize, IdempotencyLayer<DynStore>>>,
}

impl IdempotentRoutes {
    /// The configuration of `layer`: its store, settings and defaults, shared by every
    /// attributed handler of the router.
    #[must_use]
    pub fn new<St: Store>(layer: IdempotencyLayer<St>) -> Self {
        Self {
            inner: Arc::new(Inner {
                layer: layer
                    .map_store(|store| DynStore::new(Arc::clone(store)))
                    .metrics_door(crate::metrics::Door::Route),
                routes: RwLock::new(HashMap::new()),
            }),
        }
    }

    /// The shared layer (without any route's options), over the type-erased store. It can also
    /// be used as a layer, sharing the store with the attributed handlers.
    #[must_use]
    pub fn layer(&self) -> &IdempotencyLayer<DynStore> {
        &self.inner.layer
    }

    /// The shared layer with `route`'s options applied, built once per route.
    pub(crate) fn layer_for(&self, route: &'static RouteOptions) -> IdempotencyLayer<DynStore> {
        if route.is_empty() {
            return self.inner.layer.clone();
        }
        let id = std::ptr::from_ref(route) as usize;
        let routes = &self.inner.routes;
        if let Some(layer) = routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            return layer.clone();
        }
        routes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_insert_with(|| route.apply(self.inner.layer.clone()))
            .clone()
    }
}

impl<St: Store> From<IdempotencyLayer<St>> for IdempotentRoutes {
    fn from(layer: IdempotencyLayer<St>) -> Self {
        Self::new(layer)
    }
}

impl fmt::Debug for IdempotentRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentRoutes")
            .field("layer", &self.inner.layer)
            .finish_non_exhaustive()
    }
}

/// One route's options from the attribute; `None` keeps the shared configuration's setting.
/// Built in a `static` by the generated code.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct RouteOptions {
    require_key: Option<bool>,
    header: Option<&'static str>,
    lease: Option<Duration>,
    retention: Option<Duration>,
    response: Option<ResponseMode>,
    namespace: Option<&'static str>,
    max_record_body: Option<usize>,
    max_request_body: Option<usize>,
    principal: Option<PrincipalMode>,
    wait_in_flight: Option<Duration>,
    mark_first_runs: Option<bool>,
}

impl RouteOptions {
    /// No options: the shared configuration as it is.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            require_key: None,
            header: None,
            lease: None,
            retention: None,
            response: None,
            namespace: None,
            max_record_body: None,
            max_request_body: None,
            principal: None,
            wait_in_flight: None,
            mark_first_runs: None,
        }
    }

    /// `require_key` / `require_key = false`.
    #[must_use]
    pub const fn require_key(mut self, require: bool) -> Self {
        self.require_key = Some(require);
        self
    }

    /// `header_name = "…"` (checked and lower-cased by the macro).
    #[must_use]
    pub const fn header_name(mut self, name: &'static str) -> Self {
        self.header = Some(name);
        self
    }

    /// `lease = "…"`.
    #[must_use]
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// `retention = "…"`.
    #[must_use]
    pub const fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// `response_mode = "full" | "status_and_headers"`.
    #[must_use]
    pub const fn response_mode(mut self, mode: ResponseMode) -> Self {
        self.response = Some(mode);
        self
    }

    /// `namespace = "…"`: the route's namespace, replacing the shared one.
    #[must_use]
    pub const fn namespace(mut self, namespace: &'static str) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// `max_record_body = n`.
    #[must_use]
    pub const fn max_record_body(mut self, bytes: usize) -> Self {
        self.max_record_body = Some(bytes);
        self
    }

    /// `max_request_body = n`.
    #[must_use]
    pub const fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = Some(bytes);
        self
    }

    /// `principal = "required" | "optional"`.
    #[must_use]
    pub const fn principal(mut self, mode: PrincipalMode) -> Self {
        self.principal = Some(mode);
        self
    }

    /// `wait_in_flight = "…"`.
    #[must_use]
    pub const fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.wait_in_flight = Some(bound);
        self
    }

    /// `mark_first_runs` / `mark_first_runs = false`.
    #[must_use]
    pub const fn mark_first_runs(mut self, on: bool) -> Self {
        self.mark_first_runs = Some(on);
        self
    }

    pub(crate) fn is_empty(&self) -> bool {
        let Self {
            require_key,
            header,
            lease,
            retention,
            response,
            namespace,
            max_record_body,
            max_request_body,
            principal,
            wait_in_flight,
            mark_first_runs,
        } = self;
        require_key.is_none()
            && header.is_none()
            && lease.is_none()
            && retention.is_none()
            && response.is_none()
            && namespace.is_none()
            && max_record_body.is_none()
            && max_request_body.is_none()
            && principal.is_none()
            && wait_in_flight.is_none()
            && mark_first_runs.is_none()
    }

    /// The shared layer with these options over it.
    pub(crate) fn apply(
        &self,
        mut layer: IdempotencyLayer<DynStore>,
    ) -> IdempotencyLayer<DynStore> {
        if let Some(require) = self.require_key {
            layer = layer.require_key(require);
        }
        if let Some(name) = self.header {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(name) => layer = layer.header_name(name),
                // The macro checks the name at compile time; only a hand-built value gets here.
                Err(_) => tracing::error!(
                    header = name,
                    "invalid idempotency key header name in the route's options; the shared header is used"
                ),
            }
        }
        if let Some(lease) = self.lease {
            layer = layer.lease(lease);
        }
        if let Some(retention) = self.retention {
            layer = layer.retention(retention);
        }
        if let Some(mode) = self.response {
            layer = layer.response_mode(mode);
        }
        if let Some(namespace) = self.namespace {
            layer = layer.namespace(namespace);
        }
        if let Some(bytes) = self.max_record_body {
            layer = layer.max_record_body(bytes);
        }
        if let Some(bytes) = self.max_request_body {
            layer = layer.max_request_body(bytes);
        }
        if let Some(mode) = self.principal {
            layer = layer.principal(mode);
        }
        if let Some(bound) = self.wait_in_flight {
            layer = layer.wait_in_flight(bound);
        }
        if let Some(on) = self.mark_first_runs {
            layer = layer.mark_first_runs(on);
        }
        layer
    }
}

impl Default for RouteOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ResponseMode;
    use crate::{MemoryStore, Secret};

    static ROUTE: RouteOptions = RouteOptions::new()
        .lease(Duration::from_millis(1500))
        .retention(Duration::from_secs(60))
        .namespace("refunds")
        .response_mode(ResponseMode::StatusAndHeaders);
    static PLAIN: RouteOptions = RouteOptions::new();

    fn shared() -> IdempotencyLayer<MemoryStore> {
        let engine = crate::engine::Engine::builder(MemoryStore::new())
            .lease(Duration::from_secs(7))
            .retention(Duration::from_secs(70))
            .max_record_body(512)
            .secret(Secret::new([7u8; 32]).expect("a 32-byte secret"))
            .build();
        IdempotencyLayer::new(engine).namespace("billing")
    }

    #[test]
    fn erasing_the_store_keeps_every_engine_setting() {
        let config = IdempotentRoutes::new(shared());
        let engine = config.layer().engine();
        assert_eq!(
            (engine.lease(), engine.retention(), engine.max_record_body()),
            (Duration::from_secs(7), Duration::from_secs(70), 512)
        );
        assert!(
            format!("{engine:?}").contains("authenticated: true"),
            "the secret carries over: {engine:?}"
        );
    }

    #[test]
    fn route_options_override_the_shared_settings() {
        let config = IdempotentRoutes::new(shared());
        let layer = config.layer_for(&ROUTE);
        let engine = layer.engine();
        assert_eq!(
            (engine.lease(), engine.retention(), engine.max_record_body()),
            (Duration::from_millis(1500), Duration::from_secs(60), 512),
            "lease and retention from the route, the record limit shared"
        );
        assert!(format!("{engine:?}").contains("authenticated: true"));
        let c = &layer.state.config;
        assert_eq!(
            &*c.namespace, "refunds",
            "the route's namespace replaces the shared one"
        );
        assert_eq!(c.response_mode, ResponseMode::StatusAndHeaders);
        assert_eq!(
            &*config.layer().state.config.namespace,
            "billing",
            "the shared layer is untouched"
        );
    }

    static LONGEST: RouteOptions = RouteOptions::new()
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .wait_in_flight(Duration::MAX);
    static SHORTEST: RouteOptions = RouteOptions::new()
        .lease(Duration::ZERO)
        .retention(Duration::ZERO)
        .wait_in_flight(Duration::ZERO);

    /// No duration a route may name overflows a clock: the longest count as about a century,
    /// the shortest as the least the engine keeps.
    #[test]
    fn route_durations_at_the_extremes_stay_in_range() {
        let config = IdempotentRoutes::new(shared());
        let century = Duration::from_secs(100 * 365 * 24 * 60 * 60);
        let longest = config.layer_for(&LONGEST);
        let engine = longest.engine();
        assert_eq!((engine.lease(), engine.retention()), (century, century));
        assert_eq!(
            longest.state.config.wait_in_flight,
            Duration::MAX,
            "any wait is kept"
        );
        let shortest = config.layer_for(&SHORTEST);
        let engine = shortest.engine();
        assert_eq!(
            (engine.lease(), engine.retention()),
            (Duration::from_millis(3), Duration::from_millis(1))
        );
    }

    #[test]
    fn a_route_layer_is_built_once_per_config() {
        let config = IdempotentRoutes::new(shared());
        let first = config.layer_for(&ROUTE);
        let clone = config.clone();
        let again = clone.layer_for(&ROUTE);
        assert!(
            Arc::ptr_eq(&first.state, &again.state),
            "cached, also for clones of the config"
        );
        let plain = config.layer_for(&PLAIN);
        assert!(
            Arc::ptr_eq(&plain.state, &config.layer().state),
            "no options: the shared layer itself"
        );
        let other = IdempotentRoutes::new(shared()).layer_for(&ROUTE);
        assert!(
            !Arc::ptr_eq(&first.state, &other.state),
            "another config builds its own"
        );
    }
}
