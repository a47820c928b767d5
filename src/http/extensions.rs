//! What the layer puts into a request's extensions for the handler and the axum extractors.

use crate::engine::key::IdempotencyKey;
use crate::engine::scope::{DerivedKey, Scope, StoreKey};
use std::sync::Arc;

/// Marks a request the layer saw without a key, for the extractors' rejection messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyMissing;

/// The key a request was claimed under. The layer puts it into the request's extensions
/// before the inner service runs. The axum extractors read it. Other servers, such as tonic,
/// can read it with `req.extensions().get::<ClaimedKey>()`.
///
/// Another idempotency layer inside this one may find it: a second `IdempotencyLayer`, or an
/// `#[idempotent]` handler. If it would claim the same store key, it passes the request
/// through instead of claiming it again.
#[derive(Clone, Debug)]
pub struct ClaimedKey {
    key: IdempotencyKey,
    namespace: Arc<str>,
    scope: Scope,
    store_key: StoreKey,
}

impl ClaimedKey {
    pub(crate) fn new(
        key: IdempotencyKey,
        namespace: Arc<str>,
        scope: Scope,
        store_key: StoreKey,
    ) -> Self {
        Self {
            key,
            namespace,
            scope,
            store_key,
        }
    }

    /// The store key the request was claimed under.
    pub(crate) fn store_key(&self) -> &StoreKey {
        &self.store_key
    }

    /// The client's validated key.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The stable key to forward to a provider that de-duplicates. It is hashed on each call.
    #[must_use]
    pub fn derived_key(&self) -> DerivedKey {
        DerivedKey::derive(&self.namespace, &self.scope, &self.key)
    }
}
