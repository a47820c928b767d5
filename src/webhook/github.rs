//! GitHub.

use super::secrets::{self, Secrets};
use super::{Sender, WebhookError, WebhookErrorKind};
use crate::engine::key::IdempotencyKey;
use crate::error::ConfigError;
use http::request::Parts;
use std::fmt;
use std::time::{Duration, SystemTime};

const SIGNATURE: &str = "x-hub-signature-256";
const DELIVERY: &str = "x-github-delivery";

/// GitHub's webhooks.
///
/// GitHub signs the body with HMAC-SHA256 under the webhook's secret and sends
/// `X-Hub-Signature-256: sha256=<hex>`. The key is `X-GitHub-Delivery`, which a redelivery
/// keeps. GitHub signs no timestamp: a captured delivery verifies however old it is, so the
/// record's retention is what refuses its replay, and neither is the delivery id signed.
///
/// ```
/// use std::time::SystemTime;
/// use tower_idempotency::webhook::{GitHub, Sender};
///
/// // GitHub's published example.
/// let github = GitHub::new("It's a Secret to Everybody")?;
/// let (parts, ()) = http::Request::post("/webhooks/github")
///     .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
///     .header(
///         "x-hub-signature-256",
///         "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
///     )
///     .body(())?
///     .into_parts();
/// let key = github.verify(&parts, b"Hello, World!", SystemTime::now())?;
/// assert_eq!(key.as_str(), "72d3162e-cc78-11e3-81ab-4c9367dc0958");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct GitHub {
    secrets: Secrets,
}

impl GitHub {
    /// The webhook's secret.
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

impl Sender for GitHub {
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
        let hex = header.trim().strip_prefix("sha256=").ok_or_else(|| {
            WebhookError::new(
                WebhookErrorKind::SignatureMalformed,
                "`X-Hub-Signature-256` does not start with `sha256=`",
            )
        })?;
        let signatures = secrets::collect(std::iter::once(secrets::decode_hex(hex)), SIGNATURE)?;
        secrets::check(&self.secrets, &[body], &signatures, SIGNATURE)?;
        secrets::key_header(request, DELIVERY)
    }

    /// Three days. GitHub does not deliver again by itself; a redelivery is asked for by hand,
    /// and only for deliveries of the past three days.
    fn retention(&self) -> Duration {
        Duration::from_secs(3 * 24 * 60 * 60)
    }

    fn name(&self) -> &str {
        "github"
    }
}

impl fmt::Debug for GitHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitHub")
            .field("secrets", &self.secrets)
            .finish()
    }
}
