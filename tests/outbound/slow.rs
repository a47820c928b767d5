//! A store whose writes after a send (complete, renew) take a while: for a caller that gives
//! up while its key's last step is written.

use std::future::Future;
use std::time::Duration;
use tower_idempotency::Store;
use tower_idempotency::engine::Fingerprint;
use tower_idempotency::store::{Claim, Forgotten, Record, StoreError, StoreKey, Token};

/// `S`, with every `complete` and `renew` held for `delay` (tokio time) before it is made.
pub(crate) struct SlowWrites<S> {
    inner: S,
    delay: Duration,
}

impl<S> SlowWrites<S> {
    pub(crate) fn new(inner: S, delay: Duration) -> Self {
        Self { inner, delay }
    }
}

impl<S: Store> Store for SlowWrites<S> {
    fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        self.inner.claim(key, fingerprint, lease)
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner
            .complete(key, token, fingerprint, record, retention)
            .await
    }

    fn release(
        &self,
        key: &StoreKey,
        token: &Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.inner.release(key, token)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.renew(key, token, lease).await
    }

    fn forget(
        &self,
        key: &StoreKey,
        pending: bool,
    ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send {
        self.inner.forget(key, pending)
    }
}
