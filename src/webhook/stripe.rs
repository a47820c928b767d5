//! Stripe.

use super::secrets::{self, Secrets};
use super::{Sender, WebhookError, WebhookErrorKind};
use crate::engine::key::IdempotencyKey;
use crate::error::ConfigError;
use http::request::Parts;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::time::{Duration, SystemTime};

const SIGNATURE: &str = "stripe-signature";

/// Stripe's webhooks.
///
/// Stripe signs `{t}.{body}` with HMAC-SHA256 under the endpoint's secret, the `whsec_…`
/// string taken as it is (not decoded), and sends `Stripe-Signature: t=<unix>,v1=<hex>`,
/// with one `v1` entry per secret while Stripe rolls one. `v0` and other schemes are ignored.
/// A signature verifies until it is 300 seconds old, as Stripe's own libraries check it; a
/// `t` ahead of the receiver's clock verifies too, as in those libraries, so a clock running
/// behind Stripe's does not refuse its deliveries. The key is the event's
/// top-level `"id"` (`evt_…`) in the JSON body.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_idempotency::webhook::{Sender, Stripe};
///
/// let stripe = Stripe::new("whsec_test_secret")?;
/// let body = br#"{"id":"evt_1","object":"event"}"#;
/// let (parts, ()) = http::Request::post("/webhooks/stripe")
///     .header(
///         "stripe-signature",
///         "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd",
///     )
///     .body(())?
///     .into_parts();
/// let now = UNIX_EPOCH + Duration::from_secs(1700000000);
/// assert_eq!(stripe.verify(&parts, body, now)?.as_str(), "evt_1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Stripe {
    secrets: Secrets,
    tolerance: Duration,
}

impl Stripe {
    /// The endpoint's signing secret, `whsec_…`, as Stripe shows it.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`](crate::ConfigErrorKind::SecretInvalid) for an empty
    /// secret.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        Ok(Self {
            secrets: Secrets::new(secret)?,
            tolerance: Duration::from_secs(300),
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

    /// How old `t` may be. 300 seconds by default, as Stripe's libraries; a `t` ahead of now
    /// is not refused, as there.
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }
}

impl Sender for Stripe {
    fn verify(
        &self,
        request: &Parts,
        body: &[u8],
        now: SystemTime,
    ) -> Result<IdempotencyKey, WebhookError> {
        let header = secrets::required(
            request,
            SIGNATURE,
            WebhookErrorKind::SignatureMissing,
            WebhookErrorKind::SignatureMalformed,
        )?;
        let mut timestamp = None;
        let mut v1 = Vec::new();
        for item in header.split(',') {
            let Some((name, value)) = item.trim().split_once('=') else {
                return Err(WebhookError::new(
                    WebhookErrorKind::SignatureMalformed,
                    "an entry of `Stripe-Signature` has no `=`",
                ));
            };
            match name {
                "t" if timestamp.is_some() => {
                    return Err(WebhookError::new(
                        WebhookErrorKind::SignatureMalformed,
                        "`Stripe-Signature` has two timestamps",
                    ));
                }
                "t" => timestamp = Some(value),
                "v1" => v1.push(value),
                _ => {}
            }
        }
        if v1.is_empty() {
            return Err(WebhookError::new(
                WebhookErrorKind::SignatureMissing,
                "no `v1` signature in `Stripe-Signature`",
            ));
        }
        let signatures = secrets::collect(v1.into_iter().map(secrets::decode_hex), SIGNATURE)?;
        let timestamp = timestamp.ok_or_else(|| {
            WebhookError::new(
                WebhookErrorKind::TimestampMissing,
                "no `t` in `Stripe-Signature`",
            )
        })?;
        let signed_at = secrets::parse_timestamp(timestamp, SIGNATURE)?;
        secrets::check(
            &self.secrets,
            &[timestamp.as_bytes(), b".", body],
            &signatures,
            SIGNATURE,
        )?;
        // Stripe's libraries bound the age only: a receiver whose clock runs behind Stripe's
        // still takes its deliveries, and a timestamp ahead can only be signed with the secret.
        secrets::not_older_than(signed_at, now, self.tolerance)?;
        event_id(body)
    }

    /// Three days: Stripe retries a delivery for up to three days.
    fn retention(&self) -> Duration {
        Duration::from_secs(3 * 24 * 60 * 60)
    }

    fn name(&self) -> &str {
        "stripe"
    }
}

impl fmt::Debug for Stripe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stripe")
            .field("secrets", &self.secrets)
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// The event's top-level `"id"`. Only that field is read; the rest is skipped unparsed into
/// values.
fn event_id(body: &[u8]) -> Result<IdempotencyKey, WebhookError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = de
        .deserialize_any(TopVisitor)
        .and_then(|top| de.end().map(|()| top))
        .map_err(|e| {
            WebhookError::new(WebhookErrorKind::BodyNotJson, "the body is not JSON").with_source(e)
        })?;
    match top {
        Top::Id(id) => secrets::key(&id, "id"),
        Top::Missing => Err(WebhookError::new(
            WebhookErrorKind::KeyMissing,
            "the event has no top-level `id`",
        )),
        Top::NotAnObject => Err(WebhookError::new(
            WebhookErrorKind::KeyMissing,
            "the body is not a JSON object, so it has no `id`",
        )),
        Top::NotAString => Err(WebhookError::new(
            WebhookErrorKind::KeyInvalid,
            "the event's `id` is not a string",
        )),
        Top::Twice => Err(WebhookError::new(
            WebhookErrorKind::KeyInvalid,
            "the event has two top-level `id` fields",
        )),
    }
}

/// What the top level of the body holds, as far as the key goes.
enum Top {
    Id(String),
    Missing,
    NotAnObject,
    NotAString,
    Twice,
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
        let mut found: Option<Top> = None;
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if name != "id" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value = map.next_value::<serde_json::Value>()?;
            found = Some(match (found, value) {
                (Some(_), _) => Top::Twice,
                (None, serde_json::Value::String(id)) => Top::Id(id),
                (None, _) => Top::NotAString,
            });
        }
        Ok(found.unwrap_or(Top::Missing))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Top::NotAnObject)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Top, E> {
        Ok(Top::NotAnObject)
    }
}
