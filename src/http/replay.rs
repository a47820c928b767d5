//! What is recorded from a response, and how a record becomes a response again.
//!
//! Only headers on the ALLOW list are stored and replayed; the fixed DENY list is never stored,
//! never replayed and cannot be added to the allow list. A record is re-validated against the
//! *current* lists at every replay, so a record written under looser settings, or tampered
//! with, is refused (503) instead of replayed.

use super::body::ResponseBody;
use crate::record::{Field, StoredResponse};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use http_body::Body;

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

/// Whether `name` is on the fixed deny list.
pub(crate) fn is_denied(name: &str) -> bool {
    DENIED_HEADERS.contains(&name) || DENIED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether a response with this status is recorded: 2xx, and 4xx except 408, 425 and 429.
pub(crate) fn is_recordable(status: u16) -> bool {
    matches!(status, 200..=299)
        || (matches!(status, 400..=499) && !matches!(status, 408 | 425 | 429))
}

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
                .chain([super::grpc::GRPC_ENCODING])
                .collect(),
        }
    }
}

impl HeaderPolicy {
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
        let mut out = Vec::new();
        for (name, value) in headers {
            if self.allowed.contains(name) {
                out.push((
                    Bytes::copy_from_slice(name.as_str().as_bytes()),
                    Bytes::copy_from_slice(value.as_bytes()),
                ));
            }
        }
        out
    }

    /// Trailers (gRPC status and metadata): everything but the deny list.
    pub(crate) fn record_trailers(trailers: &HeaderMap) -> Vec<Field> {
        trailers
            .iter()
            .filter(|(n, _)| !is_denied(n.as_str()))
            .map(|(n, v)| {
                (
                    Bytes::copy_from_slice(n.as_str().as_bytes()),
                    Bytes::copy_from_slice(v.as_bytes()),
                )
            })
            .collect()
    }

    /// Re-validates a record against the current rules and builds the replayed response.
    pub(crate) fn replay<B: Body>(
        &self,
        record: StoredResponse,
    ) -> Result<Response<ResponseBody<B>>, &'static str> {
        if !is_recordable(record.status) {
            return Err("status is not recordable");
        }
        let status = StatusCode::from_u16(record.status).map_err(|_| "invalid status")?;
        let mut headers = HeaderMap::with_capacity(record.headers.len() + 1);
        for (name, value) in record.headers {
            if is_denied_bytes(&name) || !self.allows(&name) {
                return Err("header not on the allow list");
            }
            headers.append(to_name(&name)?, to_value(value)?);
        }
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        let trailers = match record.trailers {
            None => None,
            Some(fields) => {
                let mut t = HeaderMap::with_capacity(fields.len());
                for (name, value) in fields {
                    if is_denied_bytes(&name) {
                        return Err("denied trailer");
                    }
                    t.append(to_name(&name)?, to_value(value)?);
                }
                Some(t)
            }
        };
        let mut res = Response::new(ResponseBody::buffered(
            record.body.unwrap_or_default(),
            trailers,
        ));
        *res.status_mut() = status;
        *res.headers_mut() = headers;
        Ok(res)
    }
}

fn is_denied_bytes(name: &[u8]) -> bool {
    std::str::from_utf8(name).map_or(true, is_denied)
}

fn to_name(name: &[u8]) -> Result<HeaderName, &'static str> {
    HeaderName::from_bytes(name).map_err(|_| "invalid header name")
}

fn to_value(value: Bytes) -> Result<HeaderValue, &'static str> {
    HeaderValue::from_maybe_shared(value).map_err(|_| "invalid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_table() {
        for s in [200, 201, 204, 299, 400, 401, 404, 409, 422, 499] {
            assert!(is_recordable(s), "{s} is recorded");
        }
        for s in [100, 101, 199, 300, 304, 408, 425, 429, 500, 502, 503, 599] {
            assert!(!is_recordable(s), "{s} is released");
        }
    }

    #[test]
    fn deny_list_cannot_be_allowed() {
        let mut p = HeaderPolicy::default();
        assert!(!p.allow(HeaderName::from_static("set-cookie")));
        assert!(!p.allow(HeaderName::from_static("ratelimit-remaining")));
        assert!(p.allow(HeaderName::from_static("x-order-id")));
    }
}
