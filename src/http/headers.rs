//! The header lists: what a record may keep, what it never keeps, and the header names of the
//! gRPC wire protocol.
//!
//! Only headers on the ALLOW list are stored and replayed. The fixed DENY list is never
//! stored, never replayed and cannot be added to the allow list. A record is re-validated
//! against the *current* lists at every replay. So a record written under looser settings, or
//! tampered with, is refused with 503 instead of replayed.
//!
//! Trailers pass the same two lists. They are HTTP trailers, gRPC trailing metadata, and the
//! trailers of a gRPC Trailers-Only response, which arrive as headers. The gRPC status
//! trailers are always kept: `grpc-status`, `grpc-message` and `grpc-status-details-bin`.

use crate::engine::record::FieldRef;
use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The request header that carries the idempotency key by default: `Idempotency-Key`. The
/// layer reads it. The client crate, `tower-idempotency-client`, sends it.
pub const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The header added to every replayed response: `Idempotent-Replayed: true`. With
/// [`IdempotencyLayer::mark_first_runs`](crate::IdempotencyLayer::mark_first_runs), a first
/// run's answer carries it too, `false`. A page on another origin reads it only when the server
/// lists it in `Access-Control-Expose-Headers` (tower-http's
/// `CorsLayer::expose_headers`); the README's *Browsers and CORS* shows the layer.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers stored and replayed by default, together with `grpc-encoding`. See
/// [gRPC mode](super#grpc-mode).
pub const DEFAULT_ALLOWED_HEADERS: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_DISPOSITION,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::VARY,
    header::LINK,
];

/// Headers that are never stored nor replayed: per-connection, per-response or secret.
pub const DENIED_HEADERS: &[&str] = &[
    "set-cookie",
    "cookie",
    "authorization",
    "proxy-authorization",
    "proxy-authenticate",
    "www-authenticate",
    "date",
    "age",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "content-language",
    "retry-after",
    "x-request-id",
    "x-correlation-id",
    "traceparent",
    "tracestate",
    "server",
    "alt-svc",
    "idempotent-replayed",
];

/// Headers that describe a response's body: its encoding, range, validators and digests.
/// They are dropped from a record that keeps no body, and never replayed from one. That is
/// status mode, a body over the record limit, or a streaming response. Its replay has an empty
/// body, which they would misdescribe. A gzip client fails to decode it. A cache would key it
/// by the `etag`. A digest check fails. `content-length` is on the deny list and never
/// recorded. `content-type` is kept: it names the kind of answer a replay stands for.
pub const REPRESENTATION_HEADERS: &[&str] = &[
    "content-encoding",
    "content-range",
    "etag",
    "last-modified",
    "digest",
    "content-digest",
    "repr-digest",
    "content-md5",
];

/// Whether a raw header name describes a body. See [`REPRESENTATION_HEADERS`].
pub(crate) fn describes_body(name: &[u8]) -> bool {
    REPRESENTATION_HEADERS.iter().any(|h| h.as_bytes() == name)
}

/// Name prefixes that are never stored. Rate-limit state belongs to the moment it was sent.
const DENIED_PREFIXES: &[&str] = &["ratelimit", "x-ratelimit-"];

/// The gRPC status header or trailer.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The gRPC status message header or trailer, percent-encoded.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// The gRPC rich error details trailer. It holds a serialized `google.rpc.Status`.
pub(crate) const GRPC_STATUS_DETAILS: HeaderName =
    HeaderName::from_static("grpc-status-details-bin");
/// The compression of a gRPC response's messages. It is on the default allow list, so a
/// compressed response replays. `grpc-accept-encoding` is not. It describes the server, not
/// the response, and a replay is valid without it.
pub(crate) const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// The retry delay a server suggests to a gRPC client with a retry policy, in milliseconds.
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether `name` is on the fixed deny list.
pub(crate) fn is_denied(name: &str) -> bool {
    DENIED_HEADERS.contains(&name) || DENIED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `name` is one of the gRPC status trailers: `grpc-status`, `grpc-message` or
/// `grpc-status-details-bin`. These are kept in a record's trailers whatever the allow list
/// says. A gRPC response without its status is no answer.
pub(crate) fn is_grpc_status_trailer(name: &[u8]) -> bool {
    [GRPC_STATUS, GRPC_MESSAGE, GRPC_STATUS_DETAILS]
        .iter()
        .any(|n| n.as_str().as_bytes() == name)
}

/// Whether a raw header name is on the fixed deny list. A name that is not UTF-8 counts as
/// denied.
pub(crate) fn is_denied_bytes(name: &[u8]) -> bool {
    std::str::from_utf8(name).map_or(true, is_denied)
}

/// The allow list in force: the defaults plus what `allow_header` added.
#[derive(Clone, Debug)]
pub(crate) struct HeaderPolicy {
    allowed: Vec<HeaderName>,
}

impl Default for HeaderPolicy {
    fn default() -> Self {
        Self {
            allowed: DEFAULT_ALLOWED_HEADERS
                .iter()
                .cloned()
                .chain([GRPC_ENCODING])
                .collect(),
        }
    }
}

impl HeaderPolicy {
    /// Adds `name` to the allow list. Returns `false` for a denied header, and adds nothing.
    pub(crate) fn allow(&mut self, name: HeaderName) -> bool {
        if is_denied(name.as_str()) {
            return false;
        }
        if !self.allowed.contains(&name) {
            self.allowed.push(name);
        }
        true
    }

    pub(crate) fn allows(&self, name: &[u8]) -> bool {
        self.allowed_name(name).is_some()
    }

    /// The allowed header of this raw name, to replay a recorded field without parsing its name
    /// again. It is never a denied one, since `allow` refuses those.
    pub(crate) fn allowed_name(&self, name: &[u8]) -> Option<&HeaderName> {
        self.allowed.iter().find(|a| a.as_str().as_bytes() == name)
    }

    /// The allowed headers of a response, in order, repeated lines kept. This is what a record
    /// keeps. They are borrowed from the response. The record is written from them, no copy.
    pub(crate) fn recorded<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> impl Iterator<Item = FieldRef<'a>> + 'a {
        headers
            .iter()
            .filter(|(n, _)| self.allowed.contains(n))
            .map(as_field)
    }

    /// The allowed headers of a response recorded without its body. Those that describe a body
    /// are dropped: see [`REPRESENTATION_HEADERS`].
    pub(crate) fn recorded_without_body<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> impl Iterator<Item = FieldRef<'a>> + 'a {
        self.recorded(headers)
            .filter(|(name, _)| !describes_body(name))
    }

    /// Whether a trailer is recorded and replayed. It is when on the allow list or a gRPC status
    /// trailer. It never is when on the deny list.
    pub(crate) fn allows_trailer(&self, name: &[u8]) -> bool {
        !is_denied_bytes(name) && (is_grpc_status_trailer(name) || self.allows(name))
    }

    /// The trailers a record keeps: HTTP trailers, or gRPC status and trailing metadata. These are
    /// the allowed ones and the gRPC status trailers, in order, repeated lines kept.
    pub(crate) fn recorded_trailers<'a>(
        &'a self,
        trailers: &'a HeaderMap,
    ) -> impl Iterator<Item = FieldRef<'a>> + 'a {
        trailers
            .iter()
            .map(as_field)
            .filter(|(n, _)| self.allows_trailer(n))
    }

    /// The trailers of a gRPC Trailers-Only response, which arrive as its headers. These are the
    /// gRPC status trailers. The allowed headers are recorded as headers, the rest not at all.
    pub(crate) fn recorded_trailers_only<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> impl Iterator<Item = FieldRef<'a>> + 'a {
        headers
            .iter()
            .map(as_field)
            .filter(|(n, _)| self.allows_trailer(n) && !self.allows(n))
    }
}

fn as_field<'a>((name, value): (&'a HeaderName, &'a HeaderValue)) -> FieldRef<'a> {
    (name.as_str().as_bytes(), value.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_list_cannot_be_allowed() {
        let mut p = HeaderPolicy::default();
        assert!(!p.allow(HeaderName::from_static("set-cookie")));
        assert!(!p.allow(HeaderName::from_static("ratelimit-remaining")));
        assert!(p.allow(HeaderName::from_static("x-order-id")));
    }

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        fields
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    fn names<'a>(fields: impl Iterator<Item = FieldRef<'a>>) -> Vec<&'a str> {
        fields
            .map(|(n, _)| std::str::from_utf8(n).expect("ASCII"))
            .collect()
    }

    #[test]
    fn trailers_pass_the_allow_and_deny_lists() {
        let mut p = HeaderPolicy::default();
        assert!(p.allow(HeaderName::from_static("x-order-id")));
        let trailers = map(&[
            ("grpc-status", "3"),
            ("grpc-message", "bad"),
            ("grpc-status-details-bin", "CAM"),
            ("x-order-id", "o-1"),
            ("x-field", "quantity"),
            ("server-timing", "db;dur=53"),
            ("set-cookie", "a=b"),
        ]);
        assert_eq!(
            names(p.recorded_trailers(&trailers)),
            [
                "grpc-status",
                "grpc-message",
                "grpc-status-details-bin",
                "x-order-id"
            ]
        );
        // Trailers-Only: `content-type` and `x-order-id` are headers (allowed); the status
        // trailers are trailers; the rest is not kept.
        let mut headers = trailers;
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        assert_eq!(
            names(p.recorded_trailers_only(&headers)),
            ["grpc-status", "grpc-message", "grpc-status-details-bin"]
        );
        assert_eq!(names(p.recorded(&headers)), ["x-order-id", "content-type"]);
        for name in ["grpc-status", "x-order-id"] {
            assert!(p.allows_trailer(name.as_bytes()), "{name}");
        }
        for name in ["x-field", "set-cookie", "date", "ratelimit-limit"] {
            assert!(!p.allows_trailer(name.as_bytes()), "{name}");
        }
    }
}
