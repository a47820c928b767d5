//! Rejections: why the layer answered instead of the handler, rendered as RFC 9457
//! `application/problem+json` with a stable machine code.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The cases in which the layer answers by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The key is required and the request has none (400).
    KeyMissing,
    /// The key is not valid (400).
    KeyInvalid,
    /// The principal is required and the request has none (401).
    PrincipalMissing,
    /// The same request is still running under this key (409, retryable).
    InFlight,
    /// The key was used for a different request (422).
    KeyReused,
    /// The request body is over the limit (413).
    BodyTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// The store failed or timed out; the handler did not run (503, retryable).
    StoreFailed,
    /// The caller's scope holds its maximum of pending records (429, retryable).
    ScopeFull,
    /// The store is full of pending records (503, retryable).
    StoreFull,
    /// The stored record failed re-validation and was not replayed (503).
    RecordInvalid,
}

impl RejectionKind {
    /// The HTTP status of this case.
    #[must_use]
    pub fn status(self) -> StatusCode {
        match self {
            Self::KeyMissing | Self::KeyInvalid | Self::BodyUnreadable => StatusCode::BAD_REQUEST,
            Self::PrincipalMissing => StatusCode::UNAUTHORIZED,
            Self::InFlight => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ScopeFull => StatusCode::TOO_MANY_REQUESTS,
            Self::StoreFailed | Self::StoreFull | Self::RecordInvalid => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The stable machine code, e.g. `idempotency.key_missing`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::KeyMissing => "idempotency.key_missing",
            Self::KeyInvalid => "idempotency.key_invalid",
            Self::PrincipalMissing => "idempotency.principal_missing",
            Self::InFlight => "idempotency.in_flight",
            Self::KeyReused => "idempotency.key_reused",
            Self::BodyTooLarge => "idempotency.body_too_large",
            Self::BodyUnreadable => "idempotency.body_unreadable",
            Self::StoreFailed => "idempotency.store_failed",
            Self::ScopeFull => "idempotency.scope_full",
            Self::StoreFull => "idempotency.store_full",
            Self::RecordInvalid => "idempotency.record_invalid",
        }
    }

    /// A short human title.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Self::KeyMissing => "Idempotency key missing",
            Self::KeyInvalid => "Idempotency key invalid",
            Self::PrincipalMissing => "Authentication required for an idempotent request",
            Self::InFlight => "A request with this idempotency key is in progress",
            Self::KeyReused => "Idempotency key reused with a different request",
            Self::BodyTooLarge => "Request body too large",
            Self::BodyUnreadable => "Request body could not be read",
            Self::StoreFailed => "Idempotency store unavailable",
            Self::ScopeFull => "Too many requests in progress",
            Self::StoreFull => "Idempotency store full",
            Self::RecordInvalid => "Stored response could not be replayed",
        }
    }
}

impl fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Why the layer answered a request itself. Also inserted into the response's extensions, so
/// outer layers and tests can read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    kind: RejectionKind,
    detail: Cow<'static, str>,
    retry_after: Option<Duration>,
}

impl Rejection {
    pub(crate) fn new(kind: RejectionKind, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A request body over `limit` bytes (413), declared or read.
    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self::new(
            RejectionKind::BodyTooLarge,
            format!("the request body is over the limit of {limit} bytes"),
        )
    }

    pub(crate) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Which case this is.
    #[must_use]
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The HTTP status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// A sentence for the caller saying what was wrong.
    #[must_use]
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// When a retry may succeed (sent as `Retry-After`), for the retryable cases.
    #[must_use]
    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The default rendering: `application/problem+json` with `type`, `title`, `status`,
    /// `detail` and `code`, plus `Cache-Control: no-store` and `Retry-After` when set.
    #[must_use]
    pub fn to_problem_response(&self) -> Response<Bytes> {
        #[derive(Serialize)]
        struct Code {
            code: &'static str,
        }
        let problem = problem_details::ProblemDetails::from_status_code(self.status())
            .with_title(self.kind.title())
            .with_detail(self.detail.as_ref())
            .with_extensions(Code {
                code: self.kind.code(),
            });
        let body = problem_details::JsonProblemDetails::from(problem)
            .to_body_string()
            .map_or_else(|_| Bytes::from_static(b"{}"), Bytes::from);
        let mut res = Response::new(body);
        *res.status_mut() = self.status();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(after) = self.retry_after {
            h.insert(
                header::RETRY_AFTER,
                HeaderValue::from(after.as_secs().max(1)),
            );
        }
        res
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.detail)
    }
}

impl std::error::Error for Rejection {}

/// Renders a rejection as a response (the layer adds the `Rejection` to its extensions).
pub(crate) type Renderer = Arc<dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync>;
