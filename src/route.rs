//! Per-route idempotency with the [`#[idempotent]`](crate::idempotent) attribute, and the
//! shared [`IdempotentRoutes`] it reads from the request extensions.
//!
//! The attribute marks one axum handler idempotent where it is written, with per-route options
//! (lease, retention, response mode, namespace suffix, …) merged over one shared configuration:
//! the store, principal source, namespace and limits of an [`IdempotencyLayer`], installed once
//! on the router as an [`Extension`](axum::Extension). The handler then runs the layer's own
//! check order, classification and replay, with one difference: the handler's extractors run
//! before the key is claimed, so a request they refuse (a validation error) leaves the key free
//! for the corrected request.
//!
//! ```
//! use axum::extract::Extension;
//! use axum::http::StatusCode;
//! use axum::routing::post;
//! use axum::Router;
//! use tower_idempotency::{idempotent, IdempotencyLayer, IdempotentRoutes, MemoryStore};
//!
//! #[idempotent(ttl = "1h", namespace = "payments")]
//! async fn create_payment(body: String) -> (StatusCode, String) {
//!     (StatusCode::CREATED, format!("charged for {body}"))
//! }
//!
//! #[idempotent(response = "status_and_headers", namespace = "refunds")]
//! async fn create_refund() -> StatusCode {
//!     StatusCode::ACCEPTED
//! }
//!
//! let shared = IdempotencyLayer::with_store(MemoryStore::new()).namespace("billing");
//! let app: Router = Router::new()
//!     .route("/payments", post(create_payment))
//!     .route("/refunds", post(create_refund))
//!     .layer(Extension(IdempotentRoutes::new(shared)));
//! ```

use crate::__private::RouteOptions;
use crate::fingerprint::Fingerprint;
use crate::http::IdempotencyLayer;
use crate::record::Record;
use crate::scope::StoreKey;
use crate::store::{Claim, Store, StoreError, Token};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
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
/// let config = IdempotentRoutes::new(IdempotencyLayer::with_store(MemoryStore::new()).namespace("payments"));
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
                layer: layer.map_store(|store| DynStore::new(Arc::clone(store))),
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

/// A store behind a trait object, so layers over different stores have one type
/// (`IdempotencyLayer<DynStore>`). Cheap to clone.
///
/// Each call boxes the store's future: one small allocation per store step.
///
/// ```
/// use tower_idempotency::{route::DynStore, IdempotencyLayer, MemoryStore};
///
/// let layer: IdempotencyLayer<DynStore> = IdempotencyLayer::with_store(DynStore::new(MemoryStore::new()));
/// ```
#[derive(Clone)]
pub struct DynStore(Arc<dyn ErasedStore>);

impl DynStore {
    /// `store` behind a trait object.
    #[must_use]
    pub fn new<St: Store>(store: St) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DynStore(..)")
    }
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The object-safe twin of [`Store`]: the same steps, returning boxed futures.
trait ErasedStore: Send + Sync + 'static {
    fn claim<'a>(
        &'a self,
        key: &'a StoreKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Claim>;
    fn complete<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        fingerprint: &'a Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> BoxFuture<'a, bool>;
    fn release<'a>(&'a self, key: &'a StoreKey, token: &'a Token) -> BoxFuture<'a, bool>;
    fn renew<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, bool>;
}

impl<St: Store> ErasedStore for St {
    fn claim<'a>(
        &'a self,
        key: &'a StoreKey,
        fingerprint: &'a Fingerprint,
        lease: Duration,
    ) -> BoxFuture<'a, Claim> {
        Box::pin(Store::claim(self, key, fingerprint, lease))
    }
    fn complete<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        fingerprint: &'a Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(Store::complete(self, key, token, fingerprint, record, ttl))
    }
    fn release<'a>(&'a self, key: &'a StoreKey, token: &'a Token) -> BoxFuture<'a, bool> {
        Box::pin(Store::release(self, key, token))
    }
    fn renew<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(Store::renew(self, key, token, lease))
    }
}

// `async fn`s rather than returning the boxed futures: a boxed future borrows all arguments
// for one lifetime, which the trait's `impl Future` return cannot name.
impl Store for DynStore {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.0.claim(key, fingerprint, lease).await
    }
    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.complete(key, token, fingerprint, record, ttl).await
    }
    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.0.release(key, token).await
    }
    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.0.renew(key, token, lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ResponseMode;
    use crate::{MemoryStore, Secret};

    static ROUTE: RouteOptions = RouteOptions::new()
        .lease(Duration::from_millis(1500))
        .ttl(Duration::from_secs(60))
        .namespace("refunds")
        .response(ResponseMode::StatusAndHeaders);
    static PLAIN: RouteOptions = RouteOptions::new();

    fn shared() -> IdempotencyLayer<MemoryStore> {
        IdempotencyLayer::new()
            .namespace("billing")
            .lease(Duration::from_secs(7))
            .ttl(Duration::from_secs(70))
            .max_record_body(512)
            .secret(Secret::new([7u8; 32]).expect("a 32-byte secret"))
    }

    #[test]
    fn erasing_the_store_keeps_every_engine_setting() {
        let config = IdempotentRoutes::new(shared());
        let engine = config.layer().engine();
        assert_eq!(
            (engine.lease(), engine.ttl(), engine.max_record_body()),
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
            (engine.lease(), engine.ttl(), engine.max_record_body()),
            (Duration::from_millis(1500), Duration::from_secs(60), 512),
            "lease and ttl from the route, the record limit shared"
        );
        assert!(format!("{engine:?}").contains("authenticated: true"));
        let c = &layer.state.config;
        assert_eq!(&*c.namespace, "billing/refunds");
        assert_eq!(c.response_mode, ResponseMode::StatusAndHeaders);
        assert_eq!(
            &*config.layer().state.config.namespace,
            "billing",
            "the shared layer is untouched"
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
