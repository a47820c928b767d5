// gRPC mode: the rules are in `grpc.md`, a section of the `http` module's page.

// This module holds what the other parts of the layer share about gRPC: telling a gRPC request
// apart and reading its status. Classification, replay and rejections live next to their HTTP
// counterparts (`classify`, `replay`, `rejection`).

use super::headers::GRPC_STATUS;
use http::{HeaderMap, header};

/// A gRPC status code (the numbers of `tonic::Code`, without a tonic dependency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code with this number; `None` for a number that is not a gRPC code.
    pub(crate) fn from_i32(n: i32) -> Option<Self> {
        Some(match n {
            0 => Self::Ok,
            1 => Self::Cancelled,
            2 => Self::Unknown,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            _ => return None,
        })
    }

    /// The code's number, as sent in `grpc-status`.
    pub(crate) fn as_i32(self) -> i32 {
        self as i32
    }
}

/// Whether a request (or response) with these headers is gRPC: its `content-type` starts
/// with `application/grpc`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A `grpc-status` value: a decimal number and nothing else (kept as a number: one that is
/// not a gRPC code is still a status, an unrecordable one).
pub(crate) fn parse_status(value: &[u8]) -> Option<i32> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The `grpc-status` among these headers (or trailers), if it is a number.
pub(crate) fn status_of(headers: &HeaderMap) -> Option<i32> {
    parse_status(headers.get(GRPC_STATUS)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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

    #[test]
    fn codes_round_trip_through_their_numbers() {
        for n in 0..=16 {
            let code = GrpcCode::from_i32(n).expect("a gRPC code");
            assert_eq!(code.as_i32(), n);
        }
        assert_eq!(GrpcCode::from_i32(-1), None);
        assert_eq!(GrpcCode::from_i32(17), None);
    }
}
