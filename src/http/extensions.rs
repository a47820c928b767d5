//! What the layer puts into a request's extensions for the handler and the axum extractors.

use crate::engine::key::IdempotencyKey;
use crate::engine::scope::{DerivedKey, Scope};
use crate::engine::steps::{ClaimCell, StepSource, Steps};
use crate::store::StoreKey;
use std::fmt;
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
#[derive(Clone)]
pub struct ClaimedKey {
    key: IdempotencyKey,
    namespace: Arc<str>,
    scope: Scope,
    store_key: StoreKey,
    /// The engine and the claim, once claimed: [`Steps`] are made from them only when a
    /// handler asks, one sequence per claim. `Arc` clones per request, no allocation.
    claim: Option<(Arc<dyn StepSource>, Arc<ClaimCell>)>,
}

impl fmt::Debug for ClaimedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimedKey")
            .field("key", &self.key)
            .field("scope", &self.scope)
            .field("store_key", &self.store_key)
            .finish_non_exhaustive()
    }
}

/// The steps of an `#[idempotent]` handler, taken with its arguments before its key is
/// claimed, and tied to the claim when the handler is called.
#[cfg(feature = "axum")]
#[derive(Clone, Debug)]
pub(crate) struct StepsSlot(pub(crate) Steps);

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
            claim: None,
        }
    }

    /// The same, once claimed by `engine`.
    pub(crate) fn claimed(mut self, engine: Arc<dyn StepSource>, claim: Arc<ClaimCell>) -> Self {
        self.claim = Some((engine, claim));
        self
    }

    /// The steps of the claimed request, or `None` before the claim. Every call gives a handle
    /// of the same sequence: a step's place and name are shared by all of them.
    #[must_use]
    pub fn steps(&self) -> Option<Steps> {
        self.claim
            .as_ref()
            .map(|(engine, claim)| Steps::of(claim, || engine.step_settings()))
    }

    /// Ties steps taken before the claim to it (the `#[idempotent]` attribute).
    #[cfg(feature = "macros")]
    pub(crate) fn bind(&self, steps: &Steps) {
        if let Some((engine, claim)) = &self.claim {
            steps.bind(claim, || engine.step_settings());
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
