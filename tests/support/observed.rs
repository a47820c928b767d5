//! A store that forwards every step to the store it wraps and tells an observer how each
//! claim and complete ended. It changes nothing: the fault storms use it to count what the
//! store acknowledged.

use std::time::{Duration, SystemTime};
use tower_idempotency::engine::Fingerprint;
use tower_idempotency::store::{Claim, Forgotten, Record, Store, StoreError, StoreKey, Token};

/// A step the observer is told of, once it has ended. `began` is when it was sent.
pub(crate) enum Step<'a> {
    Claim {
        key: &'a StoreKey,
        began: SystemTime,
        result: &'a Result<Claim, StoreError>,
    },
    Complete {
        key: &'a StoreKey,
        token: &'a Token,
        record: &'a Record,
        began: SystemTime,
        result: &'a Result<bool, StoreError>,
    },
}

/// `inner`, observed by `observe`.
pub(crate) struct Observed<S, F> {
    inner: S,
    observe: F,
}

impl<S, F> Observed<S, F> {
    pub(crate) fn new(inner: S, observe: F) -> Self {
        Self { inner, observe }
    }
}

impl<S: Store, F: Fn(Step<'_>) + Send + Sync + 'static> Store for Observed<S, F> {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let began = SystemTime::now();
        let result = self.inner.claim(key, fingerprint, lease).await;
        (self.observe)(Step::Claim {
            key,
            began,
            result: &result,
        });
        result
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let began = SystemTime::now();
        let kept = record.clone();
        let result = self
            .inner
            .complete(key, token, fingerprint, record, retention)
            .await;
        (self.observe)(Step::Complete {
            key,
            token,
            record: &kept,
            began,
            result: &result,
        });
        result
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.inner.release(key, token).await
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(key, token, lease).await
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        self.inner.forget(key, pending).await
    }

    async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        self.inner.lease_left(key).await
    }

    fn notifies_settled(&self) -> bool {
        self.inner.notifies_settled()
    }

    async fn wait_settled(&self, key: &StoreKey, within: Duration) {
        self.inner.wait_settled(key, within).await;
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
