//! When a response body goes out as it comes: [`Streaming`], given to
//! [`IdempotencyLayer::streaming`](super::IdempotencyLayer::streaming).

use std::time::Duration;

/// When a response body goes out as it comes, and how long its key is held meanwhile.
///
/// A recordable body is read whole before the response goes out, then recorded. Three kinds
/// go out as they come instead: a streaming media type, a body over the record limit, and a
/// body that has not ended within the collection bound. Such a response is recorded as
/// status and headers only, once its body has ended. See
/// [response bodies](super#response-bodies).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::http::{IdempotencyLayer, Streaming};
///
/// let layer = IdempotencyLayer::default().streaming(
///     Streaming::default()
///         .content_types(["text/event-stream", "application/x-ndjson"])
///         .collect_timeout(Duration::from_secs(2))
///         .lease_limit(Duration::from_secs(30 * 60)),
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Streaming {
    pub(crate) content_types: Vec<Box<str>>,
    pub(crate) collect_timeout: Duration,
    pub(crate) lease_limit: Duration,
}

impl Default for Streaming {
    fn default() -> Self {
        Self {
            content_types: vec![Box::from("text/event-stream")],
            collect_timeout: Duration::from_secs(5),
            lease_limit: Duration::from_secs(5 * 60),
        }
    }
}

impl Streaming {
    /// The defaults: `text/event-stream` streams, 5 s collection bound, 5 min lease limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// The media types whose responses go out as they come, never held back. Default:
    /// `text/event-stream` (server-sent events).
    ///
    /// The list replaces the default. A type is matched without its parameters, in any case.
    pub fn content_types<I>(mut self, types: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.content_types = types
            .into_iter()
            .map(|t| Box::from(t.as_ref().trim().to_ascii_lowercase()))
            .collect();
        self
    }

    /// How long the layer waits for a recordable body to end. Default: 5 s.
    ///
    /// Past it, the layer sends what it has read and lets the rest stream through. The bound
    /// starts when the handler has answered and its body first has to be waited for. A body
    /// whose frames are all ready is read without it.
    ///
    /// Why 5 s: a body produced at once, or merely forwarded, ends well within it. A body
    /// still going after 5 s is a stream by nature. And 5 s is far below the idle timeouts of
    /// clients and proxies, commonly 30 to 60 s. Set it shorter for interactive streams of a
    /// type not on the streaming list. Set it longer for slow finite bodies to record whole.
    pub fn collect_timeout(mut self, timeout: Duration) -> Self {
        self.collect_timeout = timeout;
        self
    }

    /// How long the key of a streaming response stays held while its body has not ended.
    /// Default: 5 min.
    ///
    /// Until then its lease is renewed, and a repeat gets 409. After it the lease is no
    /// longer renewed and lapses: a retry runs again, while the first stream goes on.
    ///
    /// The limit is the trade-off for a stream that never ends. Renewing its lease forever
    /// would answer every retry with 409 for as long as the connection lives. Raise it for
    /// long finite streams whose work must not run twice.
    pub fn lease_limit(mut self, limit: Duration) -> Self {
        self.lease_limit = limit;
        self
    }

    /// Whether a response of these headers streams through: its media type, without
    /// parameters, is one of the streaming content types.
    pub(crate) fn is_streaming(&self, headers: &http::HeaderMap) -> bool {
        let Some(value) = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let media_type = value.split(';').next().unwrap_or_default().trim();
        self.content_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case(media_type))
    }
}
