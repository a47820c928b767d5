//! The header lists: what a record may keep, what it never keeps, and the header names of the
//! gRPC wire protocol.
//!
//! Only headers on the ALLOW list are stored and replayed; the fixed DENY list is never stored,
//! never replayed and cannot be added to the allow list. A record is re-validated against the
//! *current* lists at every replay, so a record written under looser settings, or tampered
//! with, is refused (503) instead of replayed.
//!
//! Trailers (HTTP trailers, gRPC trailing metadata, and the trailers of a gRPC Trailers-Only
//! response, which arrive as headers) pass the same two lists; the gRPC status trailers
//! (`grpc-status`, `grpc-message`, `grpc-status-details-bin`) are always kept.

use crate::record::Field;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The request header that carries the idempotency key by default (`Idempotency-Key`), read by
/// the layer and sent by the [client](crate::client).
pub const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The header added to every replayed response.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers stored and replayed by default, together with `grpc-encoding` (see
/// [gRPC mode](super::grpc)).
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

/// Headers that describe a response's body (its encoding, range, validators and digests).
/// They are dropped from a record that keeps no body (status mode, a body over the record
/// limit, a streaming response) and never replayed from one: its replay has an empty body,
/// which they would misdescribe (a gzip client fails to decode it, a cache would key it by the
/// `etag`, a digest check fails). `content-length` is on the deny list and never recorded;
/// `content-type` is kept (it names the kind of answer a replay stands for).
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

/// Whether a raw header name describes a body (see [`REPRESENTATION_HEADERS`]).
pub(crate) fn describes_body(name: &[u8]) -> bool {
    REPRESENTATION_HEADERS.iter().any(|h| h.as_bytes() == name)
}

/// Name prefixes that are never stored (rate-limit state belongs to the moment it was sent).
const DENIED_PREFIXES: &[&str] = &["ratelimit", "x-ratelimit-"];

/// The gRPC status header or trailer.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The gRPC status message header or trailer (percent-encoded).
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// The gRPC rich error details trailer (a serialized `google.rpc.Status`).
pub(crate) const GRPC_STATUS_DETAILS: HeaderName =
    HeaderName::from_static("grpc-status-details-bin");
/// The compression of a gRPC response's messages: on the default allow list, so a compressed
/// response replays. (`grpc-accept-encoding` is not: it describes the server, not the
/// response, and a replay is valid without it.)
pub(crate) const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// The retry delay a server suggests to a gRPC client with a retry policy, in milliseconds.
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether `name` is on the fixed deny list.
pub(crate) fn is_denied(name: &str) -> bool {
    DENIED_HEADERS.contains(&name) || DENIED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `name` is one of the gRPC status trailers (`grpc-status`, `grpc-message`,
/// `grpc-status-details-bin`): kept in a record's trailers whatever the allow list says, since a
/// gRPC response without its status is no answer.
pub(crate) fn is_grpc_status_trailer(name: &[u8]) -> bool {
    [GRPC_STATUS, GRPC_MESSAGE, GRPC_STATUS_DETAILS]
        .iter()
        .any(|n| n.as_str().as_bytes() == name)
}

/// Whether a raw header name is on the fixed deny list (a name that is not UTF-8 counts as
/// denied).
pub(crate) fn is_denied_bytes(name: &[u8]) -> bool {
    std::str::from_utf8(name).map_or(true, is_denied)
}

/// The allow list in force: the defaults plus what `allow_header` added.
#[derive(Clone, Debug)]
pub(crate) struct HeaderPolicy {
    allowed: Vec<HeaderName>,
    /// Each allowed name as the bytes a record holds, made once per layer (and already
    /// shared): recording a header clones a handle instead of copying its name.
    names: Vec<Bytes>,
}

impl Default for HeaderPolicy {
    fn default() -> Self {
        let mut policy = Self {
            allowed: Vec::new(),
            names: Vec::new(),
        };
        for name in DEFAULT_ALLOWED_HEADERS
            .iter()
            .cloned()
            .chain([GRPC_ENCODING])
        {
            policy.push(name);
        }
        policy
    }
}

impl HeaderPolicy {
    /// Adds `name` to the allow list; `false` (and nothing added) for a denied header.
    pub(crate) fn allow(&mut self, name: HeaderName) -> bool {
        if is_denied(name.as_str()) {
            return false;
        }
        if !self.allowed.contains(&name) {
            self.push(name);
        }
        true
    }

    fn push(&mut self, name: HeaderName) {
        let bytes = Bytes::copy_from_slice(name.as_str().as_bytes());
        // The first clone of a `Bytes` made from a `Vec` allocates its shared header; done
        // here, so that the clones made per request only count a reference.
        drop(bytes.clone());
        self.allowed.push(name);
        self.names.push(bytes);
    }

    pub(crate) fn allows(&self, name: &[u8]) -> bool {
        self.allowed_name(name).is_some()
    }

    /// The allowed header of this raw name (never a denied one: `allow` refuses those), to
    /// replay a recorded field without parsing its name again.
    pub(crate) fn allowed_name(&self, name: &[u8]) -> Option<&HeaderName> {
        self.allowed.iter().find(|a| a.as_str().as_bytes() == name)
    }

    /// A recorded field of an allowed header: its name shared, its value copied.
    fn field(&self, name: &HeaderName, value: &HeaderValue) -> Option<Field> {
        let i = self.allowed.iter().position(|a| a == name)?;
        Some((
            self.names[i].clone(),
            Bytes::copy_from_slice(value.as_bytes()),
        ))
    }

    /// The allowed headers of a response, in order, repeated lines kept.
    pub(crate) fn record(&self, headers: &HeaderMap) -> Vec<Field> {
        headers
            .iter()
            .filter_map(|(n, v)| self.field(n, v))
            .collect()
    }

    /// The allowed headers of a response recorded without its body: those that describe a
    /// body dropped ([`REPRESENTATION_HEADERS`]).
    pub(crate) fn record_without_body(&self, headers: &HeaderMap) -> Vec<Field> {
        headers
            .iter()
            .filter(|(name, _)| !describes_body(name.as_str().as_bytes()))
            .filter_map(|(n, v)| self.field(n, v))
            .collect()
    }

    /// Whether a trailer is recorded and replayed: one on the allow list, or a gRPC status
    /// trailer; never one on the deny list.
    pub(crate) fn allows_trailer(&self, name: &[u8]) -> bool {
        !is_denied_bytes(name) && (is_grpc_status_trailer(name) || self.allows(name))
    }

    /// The trailers a record keeps (HTTP trailers, or gRPC status and trailing metadata): the
    /// allowed ones and the gRPC status trailers, in order, repeated lines kept.
    pub(crate) fn record_trailers(&self, trailers: &HeaderMap) -> Vec<Field> {
        trailers
            .iter()
            .filter(|(n, _)| self.allows_trailer(n.as_str().as_bytes()))
            .map(|(n, v)| field(n, v))
            .collect()
    }

    /// The trailers of a gRPC Trailers-Only response, which arrive as its headers: the gRPC
    /// status trailers (the allowed headers are recorded as headers; the rest not at all).
    pub(crate) fn record_trailers_only(&self, headers: &HeaderMap) -> Vec<Field> {
        headers
            .iter()
            .filter(|(n, _)| {
                let name = n.as_str().as_bytes();
                self.allows_trailer(name) && !self.allows(name)
            })
            .map(|(n, v)| field(n, v))
            .collect()
    }
}

fn field(name: &HeaderName, value: &HeaderValue) -> Field {
    (
        Bytes::copy_from_slice(name.as_str().as_bytes()),
        Bytes::copy_from_slice(value.as_bytes()),
    )
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

    fn names(fields: &[Field]) -> Vec<&str> {
        fields
            .iter()
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
            names(&p.record_trailers(&trailers)),
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
            names(&p.record_trailers_only(&headers)),
            ["grpc-status", "grpc-message", "grpc-status-details-bin"]
        );
        assert_eq!(names(&p.record(&headers)), ["x-order-id", "content-type"]);
        for name in ["grpc-status", "x-order-id"] {
            assert!(p.allows_trailer(name.as_bytes()), "{name}");
        }
        for name in ["x-field", "set-cookie", "date", "ratelimit-limit"] {
            assert!(!p.allows_trailer(name.as_bytes()), "{name}");
        }
    }
}
