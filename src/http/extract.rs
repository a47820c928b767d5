//! axum extractors for handlers behind the [`IdempotencyLayer`](crate::IdempotencyLayer).
//!
//! | extractor | gives | without a claimed key |
//! | --- | --- | --- |
//! | [`IdempotencyKey`] | the client's validated key | [`KeyRejection`]: 400 (no key sent) or 500 (no layer) |
//! | [`DerivedKey`] | a stable 64-hex key per namespace, caller and client key, to forward to a provider that de-duplicates (a payment API) | the same |
//! | `Option<IdempotencyKey>`, `Option<DerivedKey>` | the same, or `None` | never fails |
//!
//! When the layer claims a key it puts a [`ClaimedKey`] into the
//! request's extensions; these extractors read it (a tonic handler reads it with
//! `request.extensions().get::<ClaimedKey>()`).
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
//!     .layer(IdempotencyLayer::new().principal(PrincipalMode::Optional));
//! ```

use crate::http::{ClaimedKey, KeyMissing};
#[doc(no_inline)]
pub use crate::engine::key::IdempotencyKey;
#[doc(no_inline)]
pub use crate::engine::scope::DerivedKey;
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use std::convert::Infallible;
use std::fmt;

/// The rejection of [`IdempotencyKey`] and [`DerivedKey`] when the request has no claimed key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRejection {
    /// The layer saw the request, which had no key (the layer runs with `required(false)`):
    /// 400, use `Option<…>` in the handler to accept unkeyed requests.
    KeyMissing,
    /// No `IdempotencyLayer` ran before this handler: 500, a wiring error.
    LayerMissing,
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::KeyMissing => "this request requires an idempotency key",
            Self::LayerMissing => {
                "no idempotency key in the request extensions: is `IdempotencyLayer` installed on this route?"
            }
        })
    }
}

impl std::error::Error for KeyRejection {}

impl IntoResponse for KeyRejection {
    fn into_response(self) -> Response {
        let status = match self {
            Self::KeyMissing => StatusCode::BAD_REQUEST,
            Self::LayerMissing => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, self.to_string()).into_response()
    }
}

fn missing(parts: &Parts) -> KeyRejection {
    use crate::metrics::{Door, Outcome, request};
    if parts.extensions.get::<KeyMissing>().is_some() {
        request(Door::Extract, Outcome::KeyMissing);
        KeyRejection::KeyMissing
    } else {
        request(Door::Extract, Outcome::ConfigMissing);
        KeyRejection::LayerMissing
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

/// What the layer put into the extensions when it claimed the key.
fn claimed(parts: &Parts) -> Option<&ClaimedKey> {
    parts.extensions.get::<ClaimedKey>()
}
