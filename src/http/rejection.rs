//! Rejections: why the layer answered instead of the handler, rendered as RFC 9457
//! `application/problem+json` with a stable machine code, or for a gRPC caller as a gRPC
//! status.

use super::grpc::GrpcCode;
use super::headers::{GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Declares the enum and [`RejectionKind::ALL`] from one list, so that no kind is left out of
/// `ALL` (the OpenAPI declarations are derived from it).
macro_rules! rejection_kinds {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every case, in the order declared.
            ///
            /// ```
            /// use tower_idempotency::http::RejectionKind;
            ///
            /// assert!(RejectionKind::ALL.contains(&RejectionKind::KeyReused));
            /// ```
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];
        }
    };
}

rejection_kinds! {
/// The cases in which the layer answers by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The key is required and the request has none: 400.
    KeyMissing,
    /// The key is not valid: 400.
    KeyInvalid,
    /// The principal is required and the request has none: 401.
    PrincipalMissing,
    /// The same request is still running under this key: 409, retryable.
    InFlight,
    /// The key was used for a different request: 422.
    KeyReused,
    /// The request body is over the limit: 413.
    BodyTooLarge,
    /// The request body could not be read: 400.
    BodyUnreadable,
    /// The store failed or timed out, and the handler did not run: 503, retryable.
    Store,
    /// The caller's scope holds its maximum of pending records: 429, retryable.
    ScopeFull,
    /// The store is full of pending records: 503, retryable.
    StoreFull,
    /// The stored record failed re-validation and was not replayed: 503.
    RecordInvalid,
}
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
            Self::Store | Self::StoreFull | Self::RecordInvalid => StatusCode::SERVICE_UNAVAILABLE,
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
            Self::Store => "idempotency.store_failed",
            Self::ScopeFull => "idempotency.scope_full",
            Self::StoreFull => "idempotency.store_full",
            Self::RecordInvalid => "idempotency.record_invalid",
        }
    }

    /// The problem type: a URI naming this case, sent as the problem document's `type`. It is
    /// this variant's page on docs.rs, so a caller who follows it reads what the case means.
    /// [`Rejection::with_problem_type`] sends another.
    ///
    /// ```
    /// use tower_idempotency::http::RejectionKind;
    ///
    /// assert_eq!(
    ///     RejectionKind::InFlight.problem_type(),
    ///     "https://docs.rs/tower-idempotency/latest/tower_idempotency/http/enum.RejectionKind.html#variant.InFlight",
    /// );
    /// ```
    #[must_use]
    pub fn problem_type(self) -> &'static str {
        macro_rules! doc_page {
            ($variant:literal) => {
                concat!(
                    "https://docs.rs/tower-idempotency/latest/tower_idempotency/http/",
                    "enum.RejectionKind.html#variant.",
                    $variant
                )
            };
        }
        match self {
            Self::KeyMissing => doc_page!("KeyMissing"),
            Self::KeyInvalid => doc_page!("KeyInvalid"),
            Self::PrincipalMissing => doc_page!("PrincipalMissing"),
            Self::InFlight => doc_page!("InFlight"),
            Self::KeyReused => doc_page!("KeyReused"),
            Self::BodyTooLarge => doc_page!("BodyTooLarge"),
            Self::BodyUnreadable => doc_page!("BodyUnreadable"),
            Self::Store => doc_page!("Store"),
            Self::ScopeFull => doc_page!("ScopeFull"),
            Self::StoreFull => doc_page!("StoreFull"),
            Self::RecordInvalid => doc_page!("RecordInvalid"),
        }
    }

    /// Whether a retry of the same request may succeed: in flight, store failure, full
    /// scope or store.
    #[must_use]
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::InFlight | Self::Store | Self::ScopeFull | Self::StoreFull
        )
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
            Self::Store => "Idempotency store unavailable",
            Self::ScopeFull => "Too many requests in progress",
            Self::StoreFull => "Idempotency store full",
            Self::RecordInvalid => "Stored response could not be replayed",
        }
    }

    /// The gRPC status code of this case, a `tonic::Code` as `i32`. See the
    /// [mapping](crate::http#grpc-rejections).
    ///
    /// ```
    /// use tower_idempotency::http::RejectionKind;
    ///
    /// assert_eq!(RejectionKind::InFlight.grpc_code(), 10); // ABORTED
    /// assert_eq!(RejectionKind::KeyReused.grpc_code(), 9); // FAILED_PRECONDITION
    /// ```
    #[must_use]
    pub fn grpc_code(self) -> i32 {
        self.grpc_status().as_i32()
    }

    fn grpc_status(self) -> GrpcCode {
        match self {
            Self::KeyMissing | Self::KeyInvalid | Self::BodyUnreadable => GrpcCode::InvalidArgument,
            Self::PrincipalMissing => GrpcCode::Unauthenticated,
            Self::InFlight => GrpcCode::Aborted,
            Self::KeyReused => GrpcCode::FailedPrecondition,
            Self::BodyTooLarge | Self::ScopeFull => GrpcCode::ResourceExhausted,
            Self::Store | Self::StoreFull | Self::RecordInvalid => GrpcCode::Unavailable,
        }
    }
}

impl fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Why the layer answered a request itself.
///
/// It is also inserted into the response's extensions, so outer layers and tests can read it.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::http::{Rejection, RejectionKind};
///
/// let busy = Rejection::new(RejectionKind::InFlight, "still running")
///     .with_retry_after(Duration::from_secs(1));
/// assert_eq!(busy.kind(), RejectionKind::InFlight);
/// assert_eq!(busy.code(), "idempotency.in_flight");
/// assert!(busy.is_retryable());
/// assert_eq!(busy.retry_after(), Some(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    kind: RejectionKind,
    detail: Cow<'static, str>,
    retry_after: Option<Duration>,
    problem_type: Option<Cow<'static, str>>,
}

impl Rejection {
    /// A rejection of `kind` with a sentence for the caller. It serves a door of your own
    /// that answers with the layer's problem documents, as the `transactional` example does.
    ///
    /// ```
    /// use tower_idempotency::http::{Rejection, RejectionKind};
    ///
    /// let r = Rejection::new(RejectionKind::KeyReused, "this key was already used for a different request");
    /// assert_eq!(r.to_problem_response().status(), 422);
    /// ```
    #[must_use]
    pub fn new(kind: RejectionKind, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            problem_type: None,
        }
    }

    /// A request body over `limit` bytes, declared or read: 413.
    pub(crate) fn body_too_large(limit: usize) -> Self {
        Self::new(
            RejectionKind::BodyTooLarge,
            format!("the request body is over the limit of {limit} bytes"),
        )
    }

    /// The same rejection with a `Retry-After` hint, sent in whole seconds, at least 1.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The same rejection with another problem type: a URI of your own documentation, sent as
    /// the problem document's `type` instead of [`RejectionKind::problem_type`]. Set it where
    /// the layer renders rejections, with [`render_rejection`](crate::IdempotencyLayer::render_rejection):
    ///
    /// ```
    /// use tower_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::default().render_rejection(|r| {
    ///     let kind = r.code().trim_start_matches("idempotency.");
    ///     r.clone()
    ///         .with_problem_type(format!("https://api.example.com/problems/{kind}"))
    ///         .to_problem_response()
    /// });
    /// ```
    #[must_use]
    pub fn with_problem_type(mut self, uri: impl Into<Cow<'static, str>>) -> Self {
        self.problem_type = Some(uri.into());
        self
    }

    /// The problem type sent as `type`: the one set by [`with_problem_type`](Self::with_problem_type),
    /// else [`RejectionKind::problem_type`].
    #[must_use]
    pub fn problem_type(&self) -> &str {
        self.problem_type
            .as_deref()
            .unwrap_or_else(|| self.kind.problem_type())
    }

    /// Which case this is.
    #[must_use]
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The problem type's stable machine code, e.g. `idempotency.key_missing`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// Whether a retry of the same request may succeed. See [`RejectionKind::is_retryable`].
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
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

    /// When a retry may succeed, sent as `Retry-After`. Set on the retryable cases.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The default rendering: `application/problem+json` with `type` (the
    /// [`problem_type`](Self::problem_type)), `title`, `status`, `detail` and `code`, plus
    /// `Cache-Control: no-store` and `Retry-After` when set.
    ///
    /// ```
    /// use tower_idempotency::http::{Rejection, RejectionKind};
    ///
    /// let res = Rejection::new(RejectionKind::KeyMissing, "send an Idempotency-Key").to_problem_response();
    /// let body = std::str::from_utf8(res.body()).unwrap();
    /// assert!(body.contains(r#""type":"https://docs.rs/tower-idempotency/"#));
    /// assert!(body.contains(r#""code":"idempotency.key_missing""#));
    /// ```
    #[must_use]
    pub fn to_problem_response(&self) -> Response<Bytes> {
        // `type` is written as an extension: any URI reference, fragment included, goes out
        // as given, where the problem crate's own field would parse it as an HTTP URI.
        #[derive(Serialize)]
        struct Members<'a> {
            #[serde(rename = "type")]
            problem_type: &'a str,
            code: &'static str,
        }
        let problem = problem_details::ProblemDetails::from_status_code(self.status())
            .with_title(self.kind.title())
            .with_detail(self.detail.as_ref())
            .with_extensions(Members {
                problem_type: self.problem_type(),
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

    /// The gRPC status message: the machine code, then the detail. An example is
    /// `idempotency.key_reused: this key was already used for a different request`.
    #[must_use]
    pub fn grpc_message(&self) -> String {
        format!("{}: {}", self.kind().code(), self.detail())
    }

    /// The gRPC rendering: a Trailers-Only response. It is an HTTP 200 with `content-type:
    /// application/grpc`, `grpc-status` and a percent-encoded `grpc-message`. It carries
    /// `grpc-retry-pushback-ms` when a retry may succeed. The layer uses it for every
    /// rejection of a gRPC request.
    #[must_use]
    pub fn to_grpc_response(&self) -> Response<Bytes> {
        let mut res = Response::new(Bytes::new());
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(GRPC_STATUS, HeaderValue::from(self.kind().grpc_code()));
        if let Ok(message) = HeaderValue::from_maybe_shared(percent_encode(&self.grpc_message())) {
            h.insert(GRPC_MESSAGE, message);
        }
        if let Some(after) = self.retry_after() {
            h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis(after)));
        }
        res
    }

    /// The rejection as a `tonic::Status`: the same code, message and pushback metadata as
    /// the layer's gRPC rendering. It serves code that answers by itself, such as an
    /// interceptor that checks keys first, and tests.
    ///
    /// ```
    /// # fn doc(res: http::Response<()>) -> Option<tonic::Status> {
    /// use tower_idempotency::http::Rejection;
    ///
    /// let status = res.extensions().get::<Rejection>()?.to_status();
    /// assert!(status.message().starts_with("idempotency."));
    /// # Some(status) }
    /// ```
    #[cfg(feature = "tonic")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
    #[must_use]
    pub fn to_status(&self) -> tonic::Status {
        let mut status = tonic::Status::new(
            tonic::Code::from_i32(self.kind().grpc_code()),
            self.grpc_message(),
        );
        if let Some(after) = self.retry_after() {
            status.metadata_mut().insert(
                "grpc-retry-pushback-ms",
                tonic::metadata::MetadataValue::from(millis(after)),
            );
        }
        status
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Percent-encodes a `grpc-message` value: bytes outside visible ASCII and space, and `%`.
fn percent_encode(s: &str) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        }
    }
    Bytes::from(out)
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.detail)
    }
}

impl std::error::Error for Rejection {}

/// Renders a rejection as a response. The layer adds the `Rejection` to its extensions.
pub(crate) type Renderer = Arc<dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(&percent_encode("a b%c")[..], b"a b%25c");
        assert_eq!(&percent_encode("é\n")[..], b"%C3%A9%0A");
    }

    #[test]
    fn rejection_renders_trailers_only() {
        let r = Rejection::new(RejectionKind::InFlight, "busy 100%")
            .with_retry_after(std::time::Duration::from_secs(1));
        let res = r.to_grpc_response();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.body().is_empty());
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "10");
        assert_eq!(h["grpc-message"], "idempotency.in_flight: busy 100%25");
        assert_eq!(h["grpc-retry-pushback-ms"], "1000");
    }

    /// The problem document's members, and how many times `type` appears in it.
    fn members(res: &Response<Bytes>) -> (serde_json::Map<String, serde_json::Value>, usize) {
        let body = std::str::from_utf8(res.body()).expect("utf-8");
        let members = serde_json::from_str(body).expect("a JSON object");
        (members, body.matches(r#""type":"#).count())
    }

    #[test]
    fn every_problem_document_has_one_type_per_code() {
        let kinds = RejectionKind::ALL.iter().copied();
        let mut seen = std::collections::HashSet::new();
        for kind in kinds {
            let res = Rejection::new(kind, "d").to_problem_response();
            let (members, types) = members(&res);
            assert_eq!(types, 1, "{kind}: one `type` member in {members:?}");
            let ty = members["type"].as_str().expect("a string").to_owned();
            assert_eq!(ty, kind.problem_type(), "{kind}");
            assert_eq!(members["code"], kind.code(), "{kind}");
            assert!(ty.starts_with("https://"), "{kind}: an absolute URI");
            assert!(!ty.contains(' ') && !ty.contains('"'), "{kind}");
            assert!(seen.insert(ty.clone()), "{kind}: its own type");
        }
    }

    #[test]
    fn a_problem_type_of_your_own_replaces_the_default() {
        let r = Rejection::new(RejectionKind::KeyReused, "d")
            .with_problem_type("https://api.example.com/problems/key-reused");
        let (members, types) = members(&r.to_problem_response());
        assert_eq!(types, 1, "{members:?}");
        assert_eq!(
            members["type"],
            "https://api.example.com/problems/key-reused"
        );
        assert_eq!(members["code"], "idempotency.key_reused");
    }

    #[test]
    fn every_rejection_has_a_code() {
        use RejectionKind::*;
        for (kind, code) in [
            (KeyMissing, 3),
            (KeyInvalid, 3),
            (BodyUnreadable, 3),
            (PrincipalMissing, 16),
            (InFlight, 10),
            (KeyReused, 9),
            (BodyTooLarge, 8),
            (ScopeFull, 8),
            (Store, 14),
            (StoreFull, 14),
            (RecordInvalid, 14),
        ] {
            assert_eq!(kind.grpc_code(), code, "{kind}");
        }
    }
}
