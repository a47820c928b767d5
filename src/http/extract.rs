//! axum extractors for handlers behind the [`IdempotencyLayer`](crate::IdempotencyLayer).
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::{http::PrincipalMode, DerivedKey, IdempotencyKey, IdempotencyLayer};
//!
//! async fn charge(key: Option<IdempotencyKey>, derived: DerivedKey) -> String {
//!     // Forward `derived` to a payment provider that de-duplicates on it.
//!     format!("charging under {derived} (client key present: {})", key.is_some())
//! }
//!
//! let app: Router = Router::new()
//!     .route("/charges", post(charge))
//!     .layer(IdempotencyLayer::default().principal(PrincipalMode::Optional));
//! ```
//!
//! | extractor | gives | without a claimed key |
//! | --- | --- | --- |
//! | [`IdempotencyKey`] | the client's validated key | [`KeyRejection`]: 400 (no key sent) or 500 (no layer) |
//! | [`DerivedKey`] | a stable 64-hex key per namespace, caller and client key, to forward to a provider that de-duplicates (a payment API) | the same |
//! | [`Steps`] | the request's steps: each side effect recorded as it succeeds, answered from its record on a retry | the same |
//! | `Option<IdempotencyKey>`, `Option<DerivedKey>`, `Option<Steps>` | the same, or `None` | never fails |
//!
//! When the layer claims a key it puts a [`ClaimedKey`] into the request's extensions. These
//! extractors read it. A tonic handler reads it with
//! `request.extensions().get::<ClaimedKey>()`.

#[doc(no_inline)]
pub use crate::engine::key::IdempotencyKey;
#[doc(no_inline)]
pub use crate::engine::scope::DerivedKey;
#[doc(no_inline)]
pub use crate::engine::steps::Steps;
use crate::http::extensions::StepsSlot;
use crate::http::{ClaimedKey, KeyMissing};
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use std::convert::Infallible;
use std::fmt;

/// The rejection of [`IdempotencyKey`] and [`DerivedKey`] when the request has no claimed key.
///
/// ```
/// use tower_idempotency::http::extract::{KeyRejection, KeyRejectionKind};
///
/// fn status(rejection: &KeyRejection) -> u16 {
///     match rejection.kind() {
///         KeyRejectionKind::KeyMissing => 400,
///         _ => 500,
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRejection {
    kind: KeyRejectionKind,
}

/// What a [`KeyRejection`] says is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyRejectionKind {
    /// The layer saw the request, which had no key: the layer runs with `require_key(false)`.
    /// Answered 400. Take `Option<…>` in the handler to accept unkeyed requests.
    KeyMissing,
    /// No `IdempotencyLayer` ran before this handler: 500, a wiring error.
    LayerMissing,
}

impl KeyRejection {
    /// What is missing.
    #[must_use]
    pub fn kind(&self) -> KeyRejectionKind {
        self.kind
    }

    /// The stable machine code: `idempotency.key_missing` or `idempotency.layer_missing`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self.kind {
            KeyRejectionKind::KeyMissing => "idempotency.key_missing",
            KeyRejectionKind::LayerMissing => "idempotency.layer_missing",
        }
    }

    /// The HTTP status it is answered with: 400 or 500.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self.kind {
            KeyRejectionKind::KeyMissing => StatusCode::BAD_REQUEST,
            KeyRejectionKind::LayerMissing => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            KeyRejectionKind::KeyMissing => "this request requires an idempotency key",
            KeyRejectionKind::LayerMissing => {
                "no idempotency key in the request extensions: is `IdempotencyLayer` installed on this route?"
            }
        })
    }
}

impl std::error::Error for KeyRejection {}

impl IntoResponse for KeyRejection {
    fn into_response(self) -> Response {
        (self.status(), self.to_string()).into_response()
    }
}

fn missing(parts: &Parts) -> KeyRejection {
    use crate::metrics::{Door, Outcome, request};
    if parts.extensions.get::<KeyMissing>().is_some() {
        request(Door::Extract, Outcome::KeyMissing);
        KeyRejection {
            kind: KeyRejectionKind::KeyMissing,
        }
    } else {
        request(Door::Extract, Outcome::ConfigMissing);
        KeyRejection {
            kind: KeyRejectionKind::LayerMissing,
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        claimed(parts)
            .map(|c| c.key().clone())
            .ok_or_else(|| missing(parts))
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(claimed(parts).map(|c| c.key().clone()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for DerivedKey {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        claimed(parts)
            .map(ClaimedKey::derived_key)
            .ok_or_else(|| missing(parts))
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for DerivedKey {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(claimed(parts).map(ClaimedKey::derived_key))
    }
}

/// The claimed request's [`Steps`]: each side effect in a named step, answered from its
/// record on a retry. Rejected as [`IdempotencyKey`] is when the request has no claimed key.
impl<S: Send + Sync> FromRequestParts<S> for Steps {
    type Rejection = KeyRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        steps(parts).ok_or_else(|| missing(parts))
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Steps {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(steps(parts))
    }
}

/// The steps of the claimed request; for an `#[idempotent]` handler, those its claim will bind.
fn steps(parts: &Parts) -> Option<Steps> {
    if let Some(slot) = parts.extensions.get::<StepsSlot>() {
        return Some(slot.0.clone());
    }
    let claimed = claimed(parts)?;
    Some(claimed.steps().unwrap_or_else(Steps::unbound))
}

/// What the layer put into the extensions when it claimed the key.
fn claimed(parts: &Parts) -> Option<&ClaimedKey> {
    parts.extensions.get::<ClaimedKey>()
}
