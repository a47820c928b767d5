//! What the client reads of the protocol: header names, gRPC statuses and the layer's codes.
//! The server crate defines the same values; the tests check that they agree.

use http::{HeaderMap, HeaderName, header};

/// The request header that carries the idempotency key by default: `Idempotency-Key`.
pub const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The header of a response answered from the record of an earlier run.
pub(crate) const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The gRPC status, in a Trailers-Only response's headers.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The gRPC status message; the layer's rejections start it with their code.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// How long the server asks a gRPC client to wait before it retries (gRPC A6).
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// The start of every code the idempotency layer sends in place of running a call.
pub(crate) const LAYER_CODE_PREFIX: &str = "idempotency.";
/// The layer's code for a repeat whose first run has not finished.
pub(crate) const IN_FLIGHT_CODE: &str = "idempotency.in_flight";

/// The gRPC status codes the retry rules tell apart.
pub(crate) mod grpc_code {
    pub(crate) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(crate) const ABORTED: i32 = 10;
    pub(crate) const UNAVAILABLE: i32 = 14;
}

/// Whether a response with these headers is gRPC: its `content-type` starts with
/// `application/grpc`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A `grpc-status` value: a decimal number and nothing else. A number that is not a known
/// code is still a status.
fn parse_status(value: &[u8]) -> Option<i32> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The `grpc-status` among these headers, if it is a number.
pub(crate) fn status_of(headers: &HeaderMap) -> Option<i32> {
    parse_status(headers.get(GRPC_STATUS)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tower_idempotency::http::RejectionKind;

    #[test]
    fn the_copies_agree_with_the_server_crate() {
        assert_eq!(KEY_HEADER, tower_idempotency::http::KEY_HEADER);
        assert_eq!(REPLAYED_HEADER, tower_idempotency::http::REPLAYED_HEADER);
        assert_eq!(IN_FLIGHT_CODE, RejectionKind::InFlight.code());
        assert!(IN_FLIGHT_CODE.starts_with(LAYER_CODE_PREFIX));
    }

    #[test]
    fn grpc_is_told_by_its_content_type() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(!is_grpc(&h));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn status_values_are_strict() {
        assert_eq!(parse_status(b"0"), Some(0));
        assert_eq!(parse_status(b"16"), Some(16));
        for bad in [&b""[..], b" 0", b"0 ", b"+1", b"-1", b"1a", b"0000"] {
            assert_eq!(parse_status(bad), None, "{bad:?}");
        }
    }
}
