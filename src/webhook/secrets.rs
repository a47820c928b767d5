//! An endpoint's secrets and the checks every sender shares: one header line, a signed
//! timestamp within tolerance, a delivery id that is a key.

use super::{WebhookError, WebhookErrorKind};
use crate::engine::key::IdempotencyKey;
use crate::error::{ConfigError, ConfigErrorKind};
use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderValue;
use http::request::Parts;
use sha2::Sha256;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// The length of an HMAC-SHA256 signature, in bytes.
pub(super) const SIGNATURE_LEN: usize = 32;

/// A header may carry this many signatures. More is refused as malformed: each one costs an
/// HMAC comparison per secret, and no sender sends more than a few.
pub(super) const MAX_SIGNATURES: usize = 16;

/// Base64 as the senders write it; padding optional, as some write it without.
pub(super) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The secrets an endpoint accepts, for HMAC-SHA256 signatures: one, or several while a
/// secret rotates, when a signature under any one of them verifies.
///
/// The built-in senders keep theirs in one; a [`Sender`](super::Sender) of your own can too.
/// [`verify`](Self::verify) compares in constant time.
///
/// ```
/// use tower_idempotency::webhook::Secrets;
///
/// let secrets = Secrets::new("old secret")?.and("new secret")?;
/// # let _ = secrets;
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Secrets {
    // Keyed once: each check clones the keyed state instead of hashing the key again.
    keyed: Vec<HmacSha256>,
}

impl Secrets {
    /// The endpoint's secret, as raw bytes.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`] for an empty secret.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        Ok(Self {
            keyed: vec![keyed(secret.as_ref())?],
        })
    }

    /// These secrets and one more: during a rotation, the old and the new.
    ///
    /// # Errors
    /// [`ConfigErrorKind::SecretInvalid`] for an empty secret.
    pub fn and(mut self, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        self.keyed.push(keyed(secret.as_ref())?);
        Ok(self)
    }

    /// How many secrets verify.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keyed.len()
    }

    /// Never: there is at least one secret.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty()
    }

    /// Whether one of `signatures` is the HMAC-SHA256 of `message` (its parts concatenated)
    /// under one of the secrets. Each comparison takes the same time wherever the bytes
    /// differ.
    ///
    /// ```
    /// use tower_idempotency::webhook::Secrets;
    ///
    /// // GitHub's published example.
    /// let secrets = Secrets::new("It's a Secret to Everybody")?;
    /// let sig = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    /// let sig: Vec<u8> = (0..64)
    ///     .step_by(2)
    ///     .map(|i| u8::from_str_radix(&sig[i..i + 2], 16).unwrap())
    ///     .collect();
    /// assert!(secrets.verify(&[b"Hello, World!"], [sig.as_slice()]));
    /// assert!(!secrets.verify(&[b"Hello, World?"], [sig.as_slice()]));
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    pub fn verify<'a>(
        &self,
        message: &[&[u8]],
        signatures: impl IntoIterator<Item = &'a [u8]> + Clone,
    ) -> bool {
        self.keyed.iter().any(|key| {
            let mut mac = key.clone();
            for part in message {
                mac.update(part);
            }
            signatures
                .clone()
                .into_iter()
                .any(|sig| mac.clone().verify_slice(sig).is_ok())
        })
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} redacted)", self.keyed.len())
    }
}

fn keyed(secret: &[u8]) -> Result<HmacSha256, ConfigError> {
    if secret.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::SecretInvalid,
            "a webhook secret is empty",
        ));
    }
    // HMAC takes a key of any length.
    Ok(<HmacSha256 as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length")))
}

/// The header's one line, or none. A second line is refused: which one was signed is not
/// known, and a proxy may have added it.
pub(super) fn one<'a>(
    parts: &'a Parts,
    name: &'static str,
    twice: WebhookErrorKind,
) -> Result<Option<&'a HeaderValue>, WebhookError> {
    let mut values = parts.headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(WebhookError::new(
            twice,
            format!("the `{name}` header is sent more than once"),
        ));
    }
    Ok(first)
}

/// The header's one line as visible ASCII, or the error of `missing`.
pub(super) fn required<'a>(
    parts: &'a Parts,
    name: &'static str,
    missing: WebhookErrorKind,
    malformed: WebhookErrorKind,
) -> Result<&'a str, WebhookError> {
    let value = one(parts, name, malformed)?
        .ok_or_else(|| WebhookError::new(missing, format!("no `{name}` header")))?;
    value.to_str().map_err(|_| {
        WebhookError::new(
            malformed,
            format!("the `{name}` header is not visible ASCII"),
        )
    })
}

/// A signed timestamp: seconds since the Unix epoch, in digits only.
pub(super) fn parse_timestamp(value: &str, name: &str) -> Result<i64, WebhookError> {
    // Eighteen digits fit an i64; no sender writes more, nor a sign.
    if value.is_empty() || value.len() > 18 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WebhookError::new(
            WebhookErrorKind::TimestampMalformed,
            format!("the timestamp in `{name}` is not a number of seconds"),
        ));
    }
    value.parse().map_err(|e| {
        WebhookError::new(
            WebhookErrorKind::TimestampMalformed,
            format!("the timestamp in `{name}` is not a number of seconds"),
        )
        .with_source(e)
    })
}

/// Refuses a signed timestamp further than `tolerance` from `now`, either way.
pub(super) fn within_tolerance(
    timestamp: i64,
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), WebhookError> {
    tolerated(timestamp, now, tolerance, true)
}

/// Refuses a signed timestamp older than `tolerance`; one ahead of `now` passes.
pub(super) fn not_older_than(
    timestamp: i64,
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), WebhookError> {
    tolerated(timestamp, now, tolerance, false)
}

fn tolerated(
    timestamp: i64,
    now: SystemTime,
    tolerance: Duration,
    ahead_too: bool,
) -> Result<(), WebhookError> {
    let now = unix_seconds(now);
    let tolerance = tolerance.as_secs();
    let off = timestamp.abs_diff(now);
    if off <= tolerance || (!ahead_too && timestamp > now) {
        return Ok(());
    }
    let detail = if timestamp < now {
        format!("the signed timestamp is {off} s old; the tolerance is {tolerance} s")
    } else {
        format!("the signed timestamp is {off} s ahead; the tolerance is {tolerance} s")
    };
    Err(WebhookError::new(
        WebhookErrorKind::TimestampOutsideTolerance,
        detail,
    ))
}

fn unix_seconds(now: SystemTime) -> i64 {
    match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The delivery id as a key.
pub(super) fn key(id: &str, name: &str) -> Result<IdempotencyKey, WebhookError> {
    IdempotencyKey::new(id).map_err(|e| {
        WebhookError::new(
            WebhookErrorKind::KeyInvalid,
            format!("the delivery id in `{name}` is not a valid key"),
        )
        .with_source(e)
    })
}

/// A delivery id header's one line, as a key.
pub(super) fn key_header(
    parts: &Parts,
    name: &'static str,
) -> Result<IdempotencyKey, WebhookError> {
    let id = required(
        parts,
        name,
        WebhookErrorKind::KeyMissing,
        WebhookErrorKind::KeyInvalid,
    )?;
    key(id, name)
}

/// A signature in base64; `None` if it does not decode to one.
pub(super) fn decode_base64(text: &str) -> Option<[u8; SIGNATURE_LEN]> {
    // 32 bytes are 44 characters; a longer entry cannot be one, and is not decoded.
    if text.len() > 44 {
        return None;
    }
    let mut buf = [0u8; 48];
    let n = BASE64.decode_slice(text, &mut buf).ok()?;
    buf.get(..n)?.try_into().ok()
}

/// A signature in hex digits, either case; `None` if it is not one.
pub(super) fn decode_hex(text: &str) -> Option<[u8; SIGNATURE_LEN]> {
    let text = text.as_bytes();
    if text.len() != SIGNATURE_LEN * 2 {
        return None;
    }
    let mut out = [0u8; SIGNATURE_LEN];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let hi = char::from(pair[0]).to_digit(16)?;
        let lo = char::from(pair[1]).to_digit(16)?;
        *byte = u8::try_from(hi << 4 | lo).ok()?;
    }
    Some(out)
}

/// Verifies decoded signatures: refused as malformed when none decoded, as a mismatch when
/// none is the message's.
pub(super) fn check(
    secrets: &Secrets,
    message: &[&[u8]],
    signatures: &[[u8; SIGNATURE_LEN]],
    name: &str,
) -> Result<(), WebhookError> {
    if signatures.is_empty() {
        return Err(WebhookError::new(
            WebhookErrorKind::SignatureMalformed,
            format!("no signature in `{name}` decodes"),
        ));
    }
    if secrets.verify(
        message,
        signatures.iter().map(<[u8; SIGNATURE_LEN]>::as_slice),
    ) {
        Ok(())
    } else {
        Err(WebhookError::new(
            WebhookErrorKind::SignatureMismatch,
            format!("no signature in `{name}` matches the body under the endpoint's secrets"),
        ))
    }
}

/// Collects at most [`MAX_SIGNATURES`] signatures from a header's entries.
pub(super) fn collect(
    entries: impl Iterator<Item = Option<[u8; SIGNATURE_LEN]>>,
    name: &str,
) -> Result<Vec<[u8; SIGNATURE_LEN]>, WebhookError> {
    let mut out = Vec::new();
    for (i, sig) in entries.enumerate() {
        if i >= MAX_SIGNATURES {
            return Err(WebhookError::new(
                WebhookErrorKind::SignatureMalformed,
                format!("more than {MAX_SIGNATURES} signatures in `{name}`"),
            ));
        }
        out.extend(sig);
    }
    Ok(out)
}
