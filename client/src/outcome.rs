//! What an attempt came back with: the input of the retry rules.

use http::{HeaderMap, StatusCode};

/// What an attempt came back with.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Outcome<'a> {
    /// A response arrived (its body is not needed: the rules read the status and headers).
    Response {
        /// The HTTP status.
        status: StatusCode,
        /// The response headers (`Retry-After`; for gRPC the Trailers-Only status).
        headers: &'a HeaderMap,
    },
    /// No response arrived.
    Failed(RetryErrorKind),
}

impl<'a> Outcome<'a> {
    /// A response with this status and these headers.
    #[must_use]
    pub fn response(status: StatusCode, headers: &'a HeaderMap) -> Self {
        Self::Response { status, headers }
    }
}

/// Why no response arrived, as far as the client can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryErrorKind {
    /// The connection could not be made: nothing reached the server. The client's retry
    /// stacks report it only where the client itself says its connect stage failed
    /// (reqwest's and hyper-util's `is_connect()`, tonic's `ConnectError`), so a POST is
    /// retried after it even to a server not declared to honour keys.
    Connect,
    /// The attempt timed out; the request may have reached the server.
    Timeout,
    /// The connection was reset or closed before the answer was complete; the request may
    /// have reached the server (and its handler may have run).
    ConnectionLost,
    /// The exchange failed for a reason the client cannot tell apart (a tower stack's error
    /// that says no more, an I/O error without the client's stage); treated as a transport
    /// failure that may have followed a run.
    Transport,
    /// A failure a retry cannot fix: the request could not be built or its body not encoded,
    /// a redirect loop, and the like.
    Other,
}
