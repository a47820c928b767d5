//! The header lists: what a record may keep, what it never keeps, and the header names of the
//! gRPC wire protocol.
//!
//! Only headers on the ALLOW list are stored and replayed; the fixed DENY list is never stored,
//! never replayed and cannot be added to the allow list. A record is re-validated against the
//! *current* lists at every replay, so a record written under looser settings, or tampered
//! with, is refused (503) instead of replayed.

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

/// Name prefixes that are never stored (rate-limit state belongs to the moment it was sent).
const DENIED_PREFIXES: &[&str] = &["ratelimit", "x-ratelimit-"];

/// The gRPC status header or trailer.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The gRPC status message header or trailer (percent-encoded).
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
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

/// Whether a raw header name is on the fixed deny list (a name that is not UTF-8 counts as
/// denied).
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
    /// Adds `name` to the allow list; `false` (and nothing added) for a denied header.
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
        self.allowed.iter().any(|a| a.as_str().as_bytes() == name)
    }

    /// The allowed headers of a response, in order, repeated lines kept.
    pub(crate) fn record(&self, headers: &HeaderMap) -> Vec<Field> {
        headers
            .iter()
            .filter(|(name, _)| self.allowed.contains(name))
            .map(|(n, v)| field(n, v))
            .collect()
    }

    /// Trailers (gRPC status and metadata): everything but the deny list.
    pub(crate) fn record_trailers(trailers: &HeaderMap) -> Vec<Field> {
        trailers
            .iter()
            .filter(|(n, _)| !is_denied(n.as_str()))
            .map(|(n, v)| field(n, v))
            .collect()
    }

    /// The trailers of a gRPC Trailers-Only response, which arrive as its headers: every
    /// header that is neither allowed (recorded as a header) nor denied.
    pub(crate) fn record_trailers_only(&self, headers: &HeaderMap) -> Vec<Field> {
        headers
            .iter()
            .filter(|(n, _)| !self.allows(n.as_str().as_bytes()) && !is_denied(n.as_str()))
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
}
