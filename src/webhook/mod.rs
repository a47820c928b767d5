//! Webhooks: a sender's signed deliveries, verified, each event run once.
//!
//! ```
//! use axum::{Router, body::Body, routing::post};
//! use tower::ServiceExt;
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::webhook::{GitHub, WebhookLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let github = GitHub::new("It's a Secret to Everybody")?;
//! let app: Router = Router::new().route(
//!     "/webhooks/github",
//!     post(|body: String| async move { format!("got {} bytes", body.len()) })
//!         .layer(WebhookLayer::new(github, MemoryStore::new())),
//! );
//!
//! // A delivery as GitHub signs it: an HMAC of the raw body, and its delivery id.
//! let delivery = |body: &'static str| {
//!     http::Request::post("/webhooks/github")
//!         .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
//!         .header(
//!             "x-hub-signature-256",
//!             "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
//!         )
//!         .body(Body::from(body))
//! };
//! let first = app.clone().oneshot(delivery("Hello, World!")?).await?;
//! assert_eq!(first.status(), 200);
//!
//! // GitHub delivers it again: the recorded answer, and the handler does not run.
//! let again = app.clone().oneshot(delivery("Hello, World!")?).await?;
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//!
//! // One byte changed: refused before the store is asked.
//! let forged = app.oneshot(delivery("Hello, World?")?).await?;
//! assert_eq!(forged.status(), 401);
//! # Ok(()) }
//! ```
//!
//! A webhook sender delivers each event at least once: Stripe, Shopify and Standard Webhooks
//! senders retry when the answer is slow or not 2xx, and GitHub delivers again when asked to
//! by hand. A [`Sender`] checks that a delivery comes from the sender, and gives the
//! delivery's [`IdempotencyKey`]: the sender's own id for the event, the same on every
//! retry. A [`WebhookLayer`] on the sender's route verifies each delivery, then runs its
//! event once under that key, through the [HTTP door](crate::http)'s claim, replay and
//! record. One layer per sender's endpoint:
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::webhook::{Stripe, StandardWebhooks, WebhookLayer};
//!
//! # async fn on_stripe() {}
//! # async fn on_svix() {}
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(MemoryStore::new()); // one store for every endpoint
//! let stripe = Stripe::new("whsec_…")?;
//! let svix = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//! let app: Router = Router::new()
//!     .route("/webhooks/stripe", post(on_stripe).layer(WebhookLayer::new(stripe, engine.clone())))
//!     .route("/webhooks/svix", post(on_svix).layer(WebhookLayer::new(svix, engine)));
//! # Ok(()) }
//! ```
//!
//! # The layer
//!
//! 1. The raw body is read whole, up to
//!    [`max_request_body`](WebhookLayer::max_request_body), 1 MiB by default: 413
//!    `idempotency.body_too_large` above it, from `Content-Length` or while read.
//! 2. The sender verifies the delivery, in the [order](#the-check-order) below. A delivery
//!    that fails is refused with a problem document carrying the
//!    [`WebhookError`]'s code, and never reaches the store: 401 when it is not shown to come
//!    from the sender (a signature, a signed timestamp or a signed delivery id missing or
//!    malformed, a signature forged, a timestamp stale), 400 when it is but names no valid
//!    delivery id. See [`WebhookErrorKind::status`].
//! 3. The claim, under the sender's delivery id, in the scope of the endpoint: the sender's
//!    [`name`](Sender::name) and the route's template (axum's `MatchedPath`, else the
//!    request's path), or the [`endpoint`](WebhookLayer::endpoint) set. It is not scoped by a user: two endpoints
//!    never share ids, and one endpoint's ids are the same whoever delivers. Every delivery
//!    of one id is the same request, whatever its bytes and its method: a sender may change
//!    a field between two attempts of one event.
//! 4. The handler gets the request rebuilt with the verified bytes: `String`, `Bytes`,
//!    `Json<T>` and every other axum extractor read it as sent. The
//!    [`IdempotencyKey`] extractor gives the delivery id, and [`Steps`](crate::Steps) work
//!    as in the HTTP door.
//!
//! | the delivery | the answer |
//! | --- | --- |
//! | the first of its id | the handler's; a 2xx is recorded |
//! | a redelivery of a completed event | the recorded 2xx, with `idempotent-replayed: true`; the handler does not run |
//! | a redelivery while the event runs | 409 `idempotency.in_flight` with `Retry-After`; the handler does not run |
//! | after a handler's 5xx, 4xx or error | released: the sender's retry (GitHub's by hand) runs the handler again |
//! | after a handler's panic | no answer; the event is pending until the lease lapses (60 s by default): 409 until then, then the sender's retry runs it |
//! | forged, stale, unsigned, or without the signed id (Standard Webhooks) | 401 with the error's code; nothing stored |
//! | verified, without a valid id | 400 with the error's code; nothing stored |
//! | the store down | 503 `idempotency.store_failed`; the handler does not run |
//!
//! **In flight: 409.** Stripe, Shopify and Standard Webhooks senders retry any answer that
//! is not 2xx, later, on their own schedule, so the status only has to be not 2xx and not a
//! success a sender might count. GitHub never delivers again by itself: a delivery it saw
//! fail is delivered again only by hand, from the hook's recent deliveries or its API. 409 with `Retry-After` is the answer every door of the crate gives a repeat whose
//! first run has not finished, with its code `idempotency.in_flight`; a 503 would read as the
//! receiver being down. The first run goes on, and is recorded, even when the sender has
//! hung up on it, for up to 5 minutes after, as in the HTTP door (see
//! [`run_to_completion`](crate::IdempotencyLayer::run_to_completion)). [`wait_in_flight`](WebhookLayer::wait_in_flight) makes the redelivery wait
//! for it instead.
//!
//! **A handler's 4xx is released.** Only a 2xx tells a sender the event was taken; any
//! other answer it delivers again (GitHub, when asked by hand). Recorded, a 4xx would answer every one of those retries
//! with the same refusal, and a handler fixed meanwhile would never see the event. Released,
//! each retry runs the handler again, as after a 5xx. A handler that did the event's work and
//! still answers a 4xx says so with [`declare`](crate::http::declare)`(Verdict::Record)`:
//! then the 4xx is recorded and replayed.
//!
//! **Retention.** A delivery's record is kept for the sender's
//! [`retention`](Sender::retention), whatever the engine's: its retries' horizon (three days
//! for Stripe, GitHub and Standard Webhooks, 48 hours for Shopify). A redelivery after it
//! runs again. [`WebhookLayer::retention`] sets another. The lease, the record limit and the
//! secret are the engine's.
//!
//! A sender that signs no timestamp (GitHub, Shopify) lets a captured delivery verify however
//! old it is: within the retention its id is answered from the record, after it the event
//! runs again. Keep the retention at least the sender's, and see
//! [no timestamp](#the-senders).
//!
//! The door counts and logs as the others, under `door="webhook"`: a refused delivery is
//! `outcome="unverified"` (a Standard Webhooks delivery without its signed id included), or
//! `key_missing`, `key_invalid` for a verified one without a valid id; the rest are the HTTP door's outcomes and results. See the
//! [metrics](crate#metrics).
//!
//! # The check order
//!
//! A sender's [`verify`](Sender::verify) checks, in this order:
//!
//! 1. The signature header: [`SignatureMissing`](WebhookErrorKind::SignatureMissing),
//!    [`SignatureMalformed`](WebhookErrorKind::SignatureMalformed).
//! 2. What the sender signs beside the body. A timestamp, its header or field:
//!    [`TimestampMissing`](WebhookErrorKind::TimestampMissing),
//!    [`TimestampMalformed`](WebhookErrorKind::TimestampMalformed). The delivery id, where it
//!    is signed (Standard Webhooks):
//!    [`SignedIdMissing`](WebhookErrorKind::SignedIdMissing),
//!    [`SignedIdMalformed`](WebhookErrorKind::SignedIdMalformed).
//! 3. The signature over the raw body, in constant time, under each of the endpoint's
//!    secrets: [`SignatureMismatch`](WebhookErrorKind::SignatureMismatch).
//! 4. The signed timestamp within the sender's tolerance:
//!    [`TimestampOutsideTolerance`](WebhookErrorKind::TimestampOutsideTolerance). It is judged
//!    only once the signature verifies, so this kind says a genuine delivery came late: a
//!    replay, or a clock off.
//! 5. The key: [`KeyMissing`](WebhookErrorKind::KeyMissing),
//!    [`KeyInvalid`](WebhookErrorKind::KeyInvalid), and for a key in the body
//!    [`BodyNotJson`](WebhookErrorKind::BodyNotJson).
//!
//! A sender checks without a layer too:
//!
//! ```
//! use std::time::SystemTime;
//! use tower_idempotency::webhook::{GitHub, Sender, WebhookErrorKind};
//!
//! let github = GitHub::new("It's a Secret to Everybody")?;
//! let (parts, ()) = http::Request::post("/webhooks/github")
//!     .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
//!     .header(
//!         "x-hub-signature-256",
//!         "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
//!     )
//!     .body(())?
//!     .into_parts();
//!
//! // The raw body, as received: the signature is over its bytes.
//! let key = github.verify(&parts, b"Hello, World!", SystemTime::now())?;
//! assert_eq!(key.as_str(), "72d3162e-cc78-11e3-81ab-4c9367dc0958");
//!
//! let err = github.verify(&parts, b"Hello, World?", SystemTime::now()).unwrap_err();
//! assert_eq!(err.kind(), WebhookErrorKind::SignatureMismatch);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Standard Webhooks signs its id with the body, so there a request without one cannot be
//! verified: it is refused at step 2, 401 [`SignedIdMissing`](WebhookErrorKind::SignedIdMissing),
//! and counted `unverified`, never as a missing key, whether it is genuine or forged. The
//! other senders sign the body alone: their id is read at step 5, once the body verified, so
//! a forged request without an id is refused for its signature.
//!
//! Verification needs no store: a request that fails it cannot take a real event's key.
//! Each header is read from its one line; a header sent twice is refused.
//!
//! # The senders
//!
//! | sender | signs, HMAC-SHA256 | signature | tolerance | key | retention |
//! | --- | --- | --- | --- | --- | --- |
//! | [`StandardWebhooks`] (Svix, Resend, Clerk…) | `{webhook-id}.{webhook-timestamp}.{body}` under the `whsec_` secret, base64-decoded | `webhook-signature: v1,<base64> …` | 5 min | `webhook-id` (`svix-id` under Svix's names) | 3 days |
//! | [`Stripe`] | `{t}.{body}` under the `whsec_…` string as it is | `Stripe-Signature: t=<unix>,v1=<hex>,…` | 300 s old, any time ahead | the body's top-level `"id"` | 3 days |
//! | [`GitHub`] | the body | `X-Hub-Signature-256: sha256=<hex>` | none | `X-GitHub-Delivery` | 3 days |
//! | [`Shopify`] | the body | `X-Shopify-Hmac-Sha256: <base64>` | none | `X-Shopify-Event-Id`, else `X-Shopify-Webhook-Id` | 48 h |
//!
//! **Tolerance.** Where a sender signs a timestamp, a signature verifies only within the
//! tolerance of it, so a captured delivery cannot be sent again later. Standard Webhooks
//! holds it either way, as its libraries do. Stripe's libraries bound the age only, and so
//! does [`Stripe`]: a receiver whose clock runs behind Stripe's still takes its deliveries,
//! and a timestamp ahead is signed with the secret like any other. "Now" is the `now`
//! argument of [`Sender::verify`]: the time is the caller's (the layer's is the system
//! clock), and a test can set it. Each such sender has a `tolerance` setting.
//!
//! **Rotation.** A header may carry several signatures, and an endpoint several secrets
//! (each sender's `secret` method adds one): a delivery verifies when any signature is the
//! body's under any secret. Stripe sends one `v1` per secret while it rolls a secret;
//! Standard Webhooks senders one `v1,` entry per secret. A header with more than 16
//! signatures of the sender's scheme is refused.
//!
//! **No timestamp.** GitHub and Shopify sign only the body: a captured delivery verifies
//! however old it is. Against a replay of an old delivery under its own id, the record's
//! retention is the guard; keep it at least the sender's [`retention`](Sender::retention).
//! Their delivery ids are not signed either: a captured delivery sent again under a new id
//! verifies and runs again, so what guards it is the secret and the transport's encryption.
//!
//! **Retention.** [`Sender::retention`] is how long the sender may deliver the same event
//! again: Stripe retries for up to three days, Shopify within 48 hours, a Standard Webhooks
//! sender such as Svix for about 28 hours, and GitHub redelivers by hand only, within three
//! days. A delivery resent by hand after the record's retention runs again.
//!
//! # A sender of your own
//!
//! A sender is one method, with [`Secrets`] for HMAC-SHA256 signatures in constant time;
//! [`retention`](Sender::retention) and [`name`](Sender::name) have defaults (three days,
//! `webhook`). Here, a sender that signs the body and sends the signature in hex and its
//! delivery id in `x-delivery`:
//!
//! ```
//! use http::request::Parts;
//! use std::time::SystemTime;
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::webhook::{Secrets, Sender, WebhookError, WebhookErrorKind};
//!
//! struct Acme(Secrets);
//!
//! impl Sender for Acme {
//!     fn verify(&self, req: &Parts, body: &[u8], _now: SystemTime)
//!         -> Result<IdempotencyKey, WebhookError> {
//!         use WebhookErrorKind::*;
//!         let header = |name, kind| {
//!             req.headers.get(name).and_then(|v| v.to_str().ok())
//!                 .ok_or_else(|| WebhookError::new(kind, format!("no valid `{name}`")))
//!         };
//!         let hex = header("x-acme-signature", SignatureMissing)?;
//!         let sig: Vec<u8> = (0..hex.len()).step_by(2)
//!             .map(|i| hex.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()))
//!             .collect::<Option<_>>()
//!             .ok_or_else(|| WebhookError::new(SignatureMalformed, "not hex"))?;
//!         if !self.0.verify(&[body], [sig.as_slice()]) {
//!             return Err(WebhookError::new(SignatureMismatch, "forged"));
//!         }
//!         IdempotencyKey::new(header("x-delivery", KeyMissing)?)
//!             .map_err(|e| WebhookError::new(KeyInvalid, "bad id").with_source(e))
//!     }
//! }
//!
//! let acme = Acme(Secrets::new("It's a Secret to Everybody")?);
//! let (parts, ()) = http::Request::post("/")
//!     .header("x-delivery", "d-1")
//!     .header("x-acme-signature",
//!         "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
//!     .body(())?
//!     .into_parts();
//! assert_eq!(acme.verify(&parts, b"Hello, World!", SystemTime::now())?.as_str(), "d-1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod github;
mod layer;
mod secrets;
mod shopify;
mod standard;
mod stripe;

#[cfg(test)]
mod tests;

pub use self::error::{WebhookError, WebhookErrorKind};
pub use self::github::GitHub;
pub use self::layer::{Webhook, WebhookLayer};
pub use self::secrets::Secrets;
pub use self::shopify::Shopify;
pub use self::standard::StandardWebhooks;
pub use self::stripe::Stripe;

use crate::engine::key::IdempotencyKey;
use http::request::Parts;
use std::time::{Duration, SystemTime};

/// A webhook sender: how it signs a delivery and where it puts the delivery's id.
///
/// [`verify`](Self::verify) checks the request's signature over its raw body and gives the
/// delivery's key, or says why the delivery is refused. It never needs a store. The
/// built-in senders are [`StandardWebhooks`], [`Stripe`], [`GitHub`] and [`Shopify`]; the
/// [module page](self) shows a sender of your own.
pub trait Sender: Send + Sync + 'static {
    /// Verifies the request (its head and raw body) as of `now`, and gives the delivery's
    /// key: the sender's own id for the event, the same on each of its retries.
    ///
    /// # Errors
    /// A [`WebhookError`] saying why the delivery is refused.
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError>;

    /// How long the sender may deliver the same event again: a record of it is kept at least
    /// this long. Three days unless the sender says otherwise.
    fn retention(&self) -> Duration {
        Duration::from_secs(3 * 24 * 60 * 60)
    }

    /// The sender's name: with the endpoint, the scope its delivery ids are kept in, so two
    /// senders' ids never meet. Keep it fixed: a new name forgets the ids seen under the old
    /// one. `webhook` unless the sender says otherwise.
    fn name(&self) -> &str {
        "webhook"
    }
}

// A layer may hold a sender behind a pointer, or choose one at run time.
impl<S: Sender + ?Sized> Sender for std::sync::Arc<S> {
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError> {
        (**self).verify(request, body, now)
    }

    fn retention(&self) -> Duration {
        (**self).retention()
    }

    fn name(&self) -> &str {
        (**self).name()
    }
}

impl<S: Sender + ?Sized> Sender for Box<S> {
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError> {
        (**self).verify(request, body, now)
    }

    fn retention(&self) -> Duration {
        (**self).retention()
    }

    fn name(&self) -> &str {
        (**self).name()
    }
}
