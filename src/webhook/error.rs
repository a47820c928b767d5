//! Why a delivery was refused before it reached the store.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

/// What kind of [`WebhookError`] this is.
///
/// Every kind refuses the delivery before the store is asked: a request that fails here
/// cannot take a real event's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WebhookErrorKind {
    /// The request carries no signature of the sender's scheme.
    SignatureMissing,
    /// The signature header does not parse: not visible ASCII, an entry without `=`, no
    /// entry that decodes, too many entries, or the header sent twice.
    SignatureMalformed,
    /// The signatures parse, but none is the body's under any of the endpoint's secrets: a
    /// forged or altered request, or a secret the endpoint does not know.
    SignatureMismatch,
    /// The sender signs a timestamp and the request has none.
    TimestampMissing,
    /// The signed timestamp is not a number of seconds since the Unix epoch.
    TimestampMalformed,
    /// The signature verifies, but its timestamp is further from now than the sender's
    /// tolerance, in the past or the future: a replay of a real delivery, or a clock off.
    TimestampOutsideTolerance,
    /// The verified request carries no delivery id where the sender puts it.
    KeyMissing,
    /// The delivery id is not a valid idempotency key (its [`source`](StdError::source) says
    /// why), or it is not one string.
    KeyInvalid,
    /// The sender puts the delivery id in a JSON body, and the body is not JSON.
    BodyNotJson,
}

impl WebhookErrorKind {
    /// The stable machine code, e.g. `idempotency.signature_mismatch`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::SignatureMissing => "idempotency.signature_missing",
            Self::SignatureMalformed => "idempotency.signature_malformed",
            Self::SignatureMismatch => "idempotency.signature_mismatch",
            Self::TimestampMissing => "idempotency.timestamp_missing",
            Self::TimestampMalformed => "idempotency.timestamp_malformed",
            Self::TimestampOutsideTolerance => "idempotency.timestamp_outside_tolerance",
            Self::KeyMissing => "idempotency.key_missing",
            Self::KeyInvalid => "idempotency.key_invalid",
            Self::BodyNotJson => "idempotency.body_not_json",
        }
    }
}

/// A delivery a [`Sender`](super::Sender) refused: its [`kind`](Self::kind), a stable
/// [`code`](Self::code), a message naming the header or field, and the parser's or the key's
/// error as its [`source`](StdError::source).
///
/// A sender of your own builds one with [`new`](Self::new):
///
/// ```
/// use tower_idempotency::webhook::{WebhookError, WebhookErrorKind};
///
/// let err = WebhookError::new(WebhookErrorKind::KeyMissing, "no `x-delivery` header");
/// assert_eq!(err.code(), "idempotency.key_missing");
/// ```
#[derive(Debug)]
pub struct WebhookError {
    kind: WebhookErrorKind,
    detail: Cow<'static, str>,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl WebhookError {
    /// A refusal of this kind, with a message that says which header or field.
    pub fn new(kind: WebhookErrorKind, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: None,
        }
    }

    /// The same refusal, caused by `source`.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What was refused.
    #[must_use]
    pub fn kind(&self) -> WebhookErrorKind {
        self.kind
    }

    /// The stable machine code of its kind.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}

impl fmt::Display for WebhookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.detail)
    }
}

impl StdError for WebhookError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
