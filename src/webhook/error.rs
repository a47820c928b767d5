//! Why a delivery was refused before it reached the store.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
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
    /// The sender signs its delivery id with the body (Standard Webhooks), and the request has
    /// none: nothing can verify it, so it is refused as unverified, not as a missing key.
    SignedIdMissing,
    /// The signed delivery id's header is sent more than once, or is not visible ASCII: no one
    /// line of it can be the signed id.
    SignedIdMalformed,
    /// The signature verifies, but its timestamp is further from now than the sender's
    /// tolerance (for Stripe, older than it): a replay of a real delivery, or a clock off.
    TimestampOutsideTolerance,
    /// The verified request carries no delivery id where the sender puts it. A sender that
    /// signs its id refuses a request without one before it is verified:
    /// [`SignedIdMissing`](Self::SignedIdMissing).
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
            Self::SignedIdMissing => "idempotency.signed_id_missing",
            Self::SignedIdMalformed => "idempotency.signed_id_malformed",
            Self::TimestampOutsideTolerance => "idempotency.timestamp_outside_tolerance",
            Self::KeyMissing => "idempotency.key_missing",
            Self::KeyInvalid => "idempotency.key_invalid",
            Self::BodyNotJson => "idempotency.body_not_json",
        }
    }

    /// The HTTP status the [`WebhookLayer`](super::WebhookLayer) answers with.
    ///
    /// `401 Unauthorized` when the delivery is not shown to come from the sender: a signature,
    /// a signed timestamp or a signed delivery id missing or malformed, a signature forged, a
    /// timestamp stale. `400 Bad Request` when it
    /// is, but it names no valid delivery id. Either way the sender is told the delivery was
    /// not taken, and nothing is stored.
    ///
    /// ```
    /// use tower_idempotency::webhook::WebhookErrorKind;
    ///
    /// assert_eq!(WebhookErrorKind::SignatureMismatch.status(), 401);
    /// assert_eq!(WebhookErrorKind::KeyMissing.status(), 400);
    /// ```
    #[must_use]
    pub fn status(self) -> StatusCode {
        match self {
            Self::SignatureMissing
            | Self::SignatureMalformed
            | Self::SignatureMismatch
            | Self::TimestampMissing
            | Self::TimestampMalformed
            | Self::SignedIdMissing
            | Self::SignedIdMalformed
            | Self::TimestampOutsideTolerance => StatusCode::UNAUTHORIZED,
            Self::KeyMissing | Self::KeyInvalid | Self::BodyNotJson => StatusCode::BAD_REQUEST,
        }
    }

    /// A short human title.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Self::SignatureMissing => "Webhook signature missing",
            Self::SignatureMalformed => "Webhook signature malformed",
            Self::SignatureMismatch => "Webhook signature does not verify",
            Self::TimestampMissing => "Webhook timestamp missing",
            Self::TimestampMalformed => "Webhook timestamp malformed",
            Self::SignedIdMissing => "Webhook signed delivery id missing",
            Self::SignedIdMalformed => "Webhook signed delivery id malformed",
            Self::TimestampOutsideTolerance => "Webhook timestamp outside the tolerance",
            Self::KeyMissing => "Webhook delivery id missing",
            Self::KeyInvalid => "Webhook delivery id invalid",
            Self::BodyNotJson => "Webhook body is not JSON",
        }
    }

    /// The problem type: this variant's page on docs.rs, sent as the problem document's
    /// `type`.
    #[must_use]
    pub fn problem_type(self) -> &'static str {
        macro_rules! doc_page {
            ($variant:literal) => {
                concat!(
                    "https://docs.rs/tower-idempotency/latest/tower_idempotency/webhook/",
                    "enum.WebhookErrorKind.html#variant.",
                    $variant
                )
            };
        }
        match self {
            Self::SignatureMissing => doc_page!("SignatureMissing"),
            Self::SignatureMalformed => doc_page!("SignatureMalformed"),
            Self::SignatureMismatch => doc_page!("SignatureMismatch"),
            Self::TimestampMissing => doc_page!("TimestampMissing"),
            Self::TimestampMalformed => doc_page!("TimestampMalformed"),
            Self::SignedIdMissing => doc_page!("SignedIdMissing"),
            Self::SignedIdMalformed => doc_page!("SignedIdMalformed"),
            Self::TimestampOutsideTolerance => doc_page!("TimestampOutsideTolerance"),
            Self::KeyMissing => doc_page!("KeyMissing"),
            Self::KeyInvalid => doc_page!("KeyInvalid"),
            Self::BodyNotJson => doc_page!("BodyNotJson"),
        }
    }

    /// Whether the delivery failed its signature or timestamp, rather than its key.
    pub(crate) fn is_unverified(self) -> bool {
        self.status() == StatusCode::UNAUTHORIZED
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

    /// The message that says which header or field.
    #[must_use]
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The answer the [`WebhookLayer`](super::WebhookLayer) sends: `application/problem+json`
    /// with `type` ([`WebhookErrorKind::problem_type`]), `title`, `status`
    /// ([`WebhookErrorKind::status`]), `detail` and `code`, and `Cache-Control: no-store`, as
    /// every rejection of the crate.
    ///
    /// ```
    /// use tower_idempotency::webhook::{WebhookError, WebhookErrorKind};
    ///
    /// let res = WebhookError::new(WebhookErrorKind::SignatureMismatch, "forged").to_problem_response();
    /// assert_eq!(res.status(), 401);
    /// let body = std::str::from_utf8(res.body()).unwrap();
    /// assert!(body.contains(r#""code":"idempotency.signature_mismatch""#));
    /// ```
    #[must_use]
    pub fn to_problem_response(&self) -> Response<Bytes> {
        // `type` is written as an extension, as the HTTP door's rejections write it.
        #[derive(Serialize)]
        struct Members {
            #[serde(rename = "type")]
            problem_type: &'static str,
            code: &'static str,
        }
        let kind = self.kind;
        let problem = problem_details::ProblemDetails::from_status_code(kind.status())
            .with_title(kind.title())
            .with_detail(self.detail.as_ref())
            .with_extensions(Members {
                problem_type: kind.problem_type(),
                code: kind.code(),
            });
        let body = problem_details::JsonProblemDetails::from(problem)
            .to_body_string()
            .map_or_else(|_| Bytes::from_static(b"{}"), Bytes::from);
        let mut res = Response::new(body);
        *res.status_mut() = kind.status();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        res
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
