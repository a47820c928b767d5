//! Shopify.

use super::secrets::{self, Secrets};
use super::{Sender, WebhookError, WebhookErrorKind};
use crate::engine::key::IdempotencyKey;
use crate::error::ConfigError;
use http::request::Parts;
use std::fmt;
use std::time::{Duration, SystemTime};

const SIGNATURE: &str = "x-shopify-hmac-sha256";
const EVENT: &str = "x-shopify-event-id";
const WEBHOOK: &str = "x-shopify-webhook-id";

/// Shopify's webhooks.
///
/// Shopify signs the body with HMAC-SHA256 under the app's client secret and sends
/// `X-Shopify-Hmac-Sha256: <base64>`. The key is `X-Shopify-Event-Id`, which Shopify
/// documents as the mark of a repeat: the same on each delivery of one event. A request
/// without it, as from older API versions, is keyed by `X-Shopify-Webhook-Id` so that it is
/// still handled. Shopify signs no timestamp and neither id: a captured delivery verifies
/// however old it is, so the record's retention is what refuses its replay.
///
/// ```
/// use std::time::SystemTime;
/// use tower_idempotency::webhook::{Sender, Shopify};
///
/// let shopify = Shopify::new("hush")?;
/// let (parts, ()) = http::Request::post("/webhooks/shopify")
///     .header("x-shopify-event-id", "98880550-7158-44d4-b7cd-2c97c8a091b5")
///     .header("x-shopify-hmac-sha256", "qBvrsZF7RfB1iS6BX6IHqJTp5L911P7intnPeTPsH0I=")
///     .body(())?
///     .into_parts();
/// let key = shopify.verify(&parts, br#"{"id":820982911946154508}"#, SystemTime::now())?;
/// assert_eq!(key.as_str(), "98880550-7158-44d4-b7cd-2c97c8a091b5");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Shopify {
    secrets: Secrets,
}

impl Shopify {
    /// The app's client secret.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`](crate::ConfigErrorKind::SecretInvalid) for an empty
    /// secret.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        Ok(Self {
            secrets: Secrets::new(secret)?,
        })
    }

    /// One more secret that verifies: during a rotation, the old and the new.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`](crate::ConfigErrorKind::SecretInvalid) for an empty
    /// secret.
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        self.secrets = self.secrets.and(secret)?;
        Ok(self)
    }
}

impl Sender for Shopify {
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        _now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError> {
        let header = secrets::required(
            request,
            SIGNATURE,
            WebhookErrorKind::SignatureMissing,
            WebhookErrorKind::SignatureMalformed,
        )?;
        let signatures = secrets::collect(
            std::iter::once(secrets::decode_base64(header.trim())),
            SIGNATURE,
        )?;
        secrets::check(&self.secrets, &[body], &signatures, SIGNATURE)?;
        if secrets::one(request, EVENT, WebhookErrorKind::KeyInvalid)?.is_some() {
            secrets::key_header(request, EVENT)
        } else {
            secrets::key_header(request, WEBHOOK)
        }
    }

    /// Two days: Shopify's retries of a delivery end within 48 hours.
    fn retention(&self) -> Duration {
        Duration::from_secs(48 * 60 * 60)
    }

    fn name(&self) -> &str {
        "shopify"
    }
}

impl fmt::Debug for Shopify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shopify")
            .field("secrets", &self.secrets)
            .finish()
    }
}
