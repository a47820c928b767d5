//! A store behind a trait object: one type for layers over different stores. The HTTP door's
//! routes keep their configuration over it.

use crate::store::{
    Claim, Fingerprint, Forgotten, Inspected, Record, StepId, StepRecorded, Store, StoreError,
    StoreKey, Token,
};
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A store behind a trait object, so layers over different stores have one type
/// (`IdempotencyLayer<DynStore>`). Cheap to clone.
///
/// Each call boxes the store's future: one small allocation per store operation.
///
/// ```
/// use tower_idempotency::http::route::DynStore;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// let layer: IdempotencyLayer<DynStore> = IdempotencyLayer::new(DynStore::new(MemoryStore::new()));
/// ```
#[derive(Clone)]
pub struct DynStore(Arc<dyn ErasedStore>);

impl DynStore {
    /// The store behind the erasure, to tell which records it writes to.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn as_any(&self) -> &dyn std::any::Any {
        self.0.as_any()
    }

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

/// The object-safe twin of [`Store`]: the same operations, returning boxed futures.
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
        retention: Duration,
    ) -> BoxFuture<'a, bool>;
    fn release<'a>(&'a self, key: &'a StoreKey, token: &'a Token) -> BoxFuture<'a, bool>;
    fn renew<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, bool>;
    fn forget<'a>(&'a self, key: &'a StoreKey, pending: bool) -> BoxFuture<'a, Forgotten>;
    fn lease_left<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Option<Duration>>;
    fn inspect<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Inspected>;
    fn notifies_settled(&self) -> bool;
    fn wait_settled<'a>(
        &'a self,
        key: &'a StoreKey,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    fn record_step<'a>(
        &'a self,
        key: &'a StoreKey,
        step: &'a StepId,
        value: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, StepRecorded>;
    fn steps<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Vec<(StepId, Bytes)>>;
    fn prepare_step<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, bool>;
    fn name(&self) -> &'static str;
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn as_any(&self) -> &dyn std::any::Any;
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
        retention: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(Store::complete(
            self,
            key,
            token,
            fingerprint,
            record,
            retention,
        ))
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
    fn forget<'a>(&'a self, key: &'a StoreKey, pending: bool) -> BoxFuture<'a, Forgotten> {
        Box::pin(Store::forget(self, key, pending))
    }
    fn lease_left<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Option<Duration>> {
        Box::pin(Store::lease_left(self, key))
    }
    fn inspect<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Inspected> {
        Box::pin(Store::inspect(self, key))
    }
    fn notifies_settled(&self) -> bool {
        Store::notifies_settled(self)
    }
    fn wait_settled<'a>(
        &'a self,
        key: &'a StoreKey,
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(Store::wait_settled(self, key, within))
    }
    fn record_step<'a>(
        &'a self,
        key: &'a StoreKey,
        step: &'a StepId,
        value: Bytes,
        retention: Duration,
    ) -> BoxFuture<'a, StepRecorded> {
        Box::pin(Store::record_step(self, key, step, value, retention))
    }
    fn steps<'a>(&'a self, key: &'a StoreKey) -> BoxFuture<'a, Vec<(StepId, Bytes)>> {
        Box::pin(Store::steps(self, key))
    }
    fn prepare_step<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(Store::prepare_step(self, key, token, lease))
    }
    fn name(&self) -> &'static str {
        Store::name(self)
    }
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn as_any(&self) -> &dyn std::any::Any {
        self
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
        retention: Duration,
    ) -> Result<bool, StoreError> {
        self.0
            .complete(key, token, fingerprint, record, retention)
            .await
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
    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        self.0.forget(key, pending).await
    }
    async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        self.0.lease_left(key).await
    }
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        self.0.inspect(key).await
    }
    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        self.0.record_step(key, step, value, retention).await
    }
    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        self.0.steps(key).await
    }
    async fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.0.prepare_step(key, token, lease).await
    }
    fn notifies_settled(&self) -> bool {
        self.0.notifies_settled()
    }
    async fn wait_settled(&self, key: &StoreKey, within: Duration) {
        self.0.wait_settled(key, within).await;
    }
    fn name(&self) -> &'static str {
        self.0.name()
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::DynStore;
    use crate::store::postgres::PostgresStore;
    use sqlx::postgres::PgPoolOptions;

    // `transactional::step` tells a route's store from another by looking through the erasure.
    #[tokio::test]
    async fn the_postgres_store_behind_the_erasure_is_found() {
        let pool = PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool connects nowhere yet");
        let store = PostgresStore::new(pool, "orders").expect("a valid prefix");
        let erased = DynStore::new(store.clone());
        let found = PostgresStore::of(&erased).expect("the store behind the erasure");
        assert!(found.same_records(&store));
        assert!(PostgresStore::of(&DynStore::new(crate::MemoryStore::new())).is_none());
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod sqlite_tests {
    use super::DynStore;
    use crate::store::sqlite::SqliteStore;
    use sqlx::sqlite::SqlitePoolOptions;

    // `transactional::sqlite::step` tells a route's store from another the same way.
    #[tokio::test]
    async fn the_sqlite_store_behind_the_erasure_is_found() {
        let pool = SqlitePoolOptions::new()
            .connect_lazy("sqlite://nowhere.db")
            .expect("a lazy pool opens nothing yet");
        let store = SqliteStore::new(pool, "orders").expect("a valid prefix");
        let erased = DynStore::new(store.clone());
        let found = SqliteStore::of(&erased).expect("the store behind the erasure");
        assert!(found.same_records(&store));
        assert!(SqliteStore::of(&DynStore::new(crate::MemoryStore::new())).is_none());
    }
}
