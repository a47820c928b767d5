//! Standard Webhooks: Svix, Resend, Clerk and others.
//!
//! Not the `standardwebhooks` crate (1.0.1, its one release): it reads the clock itself, so
//! neither a test nor the caller can give "now"; it holds one secret per verifier, so a
//! rotation formats and hashes the body once per secret; it refuses a body that is not UTF-8
//! though the scheme signs bytes; it signs the timestamp reformatted rather than as sent; its
//! exhaustive error enum has no stable codes. It would also bring base64 0.21 (a third major
//! in the tree), a second HMAC implementation, `time` and `thiserror`. This is a few dozen
//! lines on the crate's own HMAC.

use super::secrets::{self, BASE64, Secrets};
use super::{Sender, WebhookError, WebhookErrorKind};
use crate::engine::key::IdempotencyKey;
use crate::error::{ConfigError, ConfigErrorKind};
use base64::Engine as _;
use http::request::Parts;
use std::fmt;
use std::time::{Duration, SystemTime};

/// The specification's headers, and Svix's own names for them, which Svix sends unless an
/// endpoint asks for the unbranded ones.
const HEADERS: [Headers; 2] = [
    Headers {
        id: "webhook-id",
        timestamp: "webhook-timestamp",
        signature: "webhook-signature",
    },
    Headers {
        id: "svix-id",
        timestamp: "svix-timestamp",
        signature: "svix-signature",
    },
];

struct Headers {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// A sender that follows the Standard Webhooks specification: Svix, Resend, Clerk and others.
///
/// It signs `{webhook-id}.{webhook-timestamp}.{body}` with HMAC-SHA256 and sends
/// `webhook-signature: v1,<base64>`, several entries separated by spaces. The secret is
/// written `whsec_<base64>`. A signature verifies within five minutes of its timestamp, either
/// way; the key is `webhook-id`. Entries of other versions (`v1a`, asymmetric) are ignored.
/// A request with `svix-signature` and no `webhook-signature` is read under Svix's own names,
/// `svix-id`, `svix-timestamp` and `svix-signature`, all three.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use tower_idempotency::webhook::{Sender, StandardWebhooks};
///
/// // The specification's example.
/// let sender = StandardWebhooks::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let (parts, ()) = http::Request::post("/webhooks")
///     .header("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
///     .header("webhook-timestamp", "1614265330")
///     .header("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
///     .body(())?
///     .into_parts();
/// let now = UNIX_EPOCH + Duration::from_secs(1614265330 + 60);
/// let key = sender.verify(&parts, br#"{"test": 2432232314}"#, now)?;
/// assert_eq!(key.as_str(), "msg_p5jXN8AQM9LWM0D4loKWxJek");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct StandardWebhooks {
    secrets: Secrets,
    tolerance: Duration,
}

impl StandardWebhooks {
    /// The endpoint's secret, as the sender shows it: `whsec_` and base64 (the prefix may be
    /// left off).
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`] for a secret that is empty or not base64.
    pub fn new(secret: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            secrets: Secrets::new(decode_secret(secret)?)?,
            tolerance: Duration::from_secs(5 * 60),
        })
    }

    /// One more secret that verifies: during a rotation, the old and the new.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`] for a secret that is empty or not base64.
    pub fn secret(mut self, secret: &str) -> Result<Self, ConfigError> {
        self.secrets = self.secrets.and(decode_secret(secret)?)?;
        Ok(self)
    }

    /// How far from now a signed timestamp may be, either way. Five minutes by default, as
    /// the specification says.
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }
}

fn decode_secret(secret: &str) -> Result<Vec<u8>, ConfigError> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    BASE64.decode(b64).map_err(|_| {
        ConfigError::new(
            ConfigErrorKind::SecretInvalid,
            "a Standard Webhooks secret is `whsec_` and base64",
        )
    })
}

impl Sender for StandardWebhooks {
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError> {
        // The specification's names, else Svix's: one set, never a mix of the two.
        let names = HEADERS
            .iter()
            .find(|names| request.headers.contains_key(names.signature))
            .unwrap_or(&HEADERS[0]);
        let header = secrets::required(
            request,
            names.signature,
            WebhookErrorKind::SignatureMissing,
            WebhookErrorKind::SignatureMalformed,
        )?;
        let mut v1 = Vec::new();
        for entry in header.split(' ').filter(|entry| !entry.is_empty()) {
            match entry.split_once(',') {
                Some(("v1", sig)) => v1.push(sig),
                // Another version, such as `v1a` (asymmetric), is not this sender's to check.
                Some(_) => {}
                None => {
                    return Err(WebhookError::new(
                        WebhookErrorKind::SignatureMalformed,
                        format!("an entry of `{}` has no `,`", names.signature),
                    ));
                }
            }
        }
        if v1.is_empty() && !header.trim().is_empty() {
            return Err(WebhookError::new(
                WebhookErrorKind::SignatureMissing,
                format!("no `v1` signature in `{}`", names.signature),
            ));
        }
        let signatures =
            secrets::collect(v1.into_iter().map(secrets::decode_base64), names.signature)?;
        // The id is signed: without it nothing can verify, so the request is unverified, not
        // a verified one short of its key.
        let id = secrets::required(
            request,
            names.id,
            WebhookErrorKind::SignedIdMissing,
            WebhookErrorKind::SignedIdMalformed,
        )?;
        let timestamp = secrets::required(
            request,
            names.timestamp,
            WebhookErrorKind::TimestampMissing,
            WebhookErrorKind::TimestampMalformed,
        )?;
        let signed_at = secrets::parse_timestamp(timestamp, names.timestamp)?;
        // The timestamp as sent, not reformatted: those are the bytes the sender signed.
        secrets::check(
            &self.secrets,
            &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
            &signatures,
            names.signature,
        )?;
        secrets::within_tolerance(signed_at, now, self.tolerance)?;
        secrets::key(id, names.id)
    }

    /// Three days. Svix's schedule of retries ends about 28 hours after the first attempt;
    /// three days is more than twice that, and the horizon of the other built-in senders. A
    /// delivery resent by hand after the retention runs again.
    fn retention(&self) -> Duration {
        Duration::from_secs(3 * 24 * 60 * 60)
    }

    fn name(&self) -> &str {
        "standard-webhooks"
    }
}

impl fmt::Debug for StandardWebhooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("secrets", &self.secrets)
            .field("tolerance", &self.tolerance)
            .finish()
    }
}
