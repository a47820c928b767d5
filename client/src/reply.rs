//! What an attempt came back with: the input of the retry rules.

use http::{HeaderMap, StatusCode};

/// What an attempt came back with.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Reply<'a> {
    /// A response arrived. The rules read its status and headers, not its body.
    Response {
        /// The HTTP status.
        status: StatusCode,
        /// The response headers: `Retry-After`, and for gRPC the Trailers-Only status.
        headers: &'a HeaderMap,
    },
    /// No response arrived.
    Failed(RetryErrorKind),
}

impl<'a> Reply<'a> {
    /// A response with this status and these headers.
    #[must_use]
    pub fn response(status: StatusCode, headers: &'a HeaderMap) -> Self {
        Self::Response { status, headers }
    }
}

/// Why no response arrived, as far as the client can tell: what [`Reply::Failed`] carries
/// and what [`RetryError::kind`](crate::RetryError::kind) returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryErrorKind {
    /// The connection could not be made: nothing reached the server. The stacks report it
    /// only where the client says its connect stage failed: reqwest's and hyper-util's
    /// `is_connect()`, tonic's `ConnectError`. A POST is retried after it to any server.
    Connect,
    /// The attempt timed out; the request may have reached the server.
    Timeout,
    /// The connection was reset or closed before the answer was complete. The request may
    /// have reached the server, and its handler may have run.
    ConnectionLost,
    /// The exchange failed for a reason the client cannot tell apart: a tower stack's error
    /// that says no more, or an I/O error without the client's stage. It is treated as a
    /// failure that may have followed a run.
    Transport,
    /// A failure a retry cannot fix: a request that could not be built, a body that could not
    /// be encoded, a redirect loop.
    Other,
}
