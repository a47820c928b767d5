//! Stamping: one fresh key per logical request, kept by every retry.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// A fresh idempotency key: a random UUID v4 in its text form, such as
/// `0f8fad5b-d9cb-469f-a165-70867728950e`. Its 122 random bits come from the operating
/// system.
///
/// # Panics
///
/// If the operating system has no random source to give (`getrandom` fails). A supported
/// platform never does that.
#[must_use]
pub fn new_key() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source");
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // variant RFC 4122
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from(HEX[usize::from(byte >> 4)]));
        s.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    s
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Which requests get a key, in which header. The tower layer and the reqwest middleware
/// share it.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    pub(crate) header: HeaderName,
    methods: Option<Vec<Method>>,
}

impl Default for Stamp {
    fn default() -> Self {
        Self::with_header(crate::protocol::KEY_HEADER)
    }
}

impl Stamp {
    /// Every non-safe method, in `header`.
    pub(crate) fn with_header(header: HeaderName) -> Self {
        Self {
            header,
            methods: None,
        }
    }

    pub(crate) fn set_methods(&mut self, methods: impl IntoIterator<Item = Method>) {
        self.methods = Some(methods.into_iter().collect());
    }

    /// Whether a request of this method gets a key: the configured methods, by default every
    /// method but the safe ones. The server layer checks the same set by default.
    fn stamps(&self, method: &Method) -> bool {
        match &self.methods {
            Some(list) => list.contains(method),
            None => !matches!(
                *method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
            ),
        }
    }

    /// Adds a fresh key unless the request carries one: a key given by the caller is kept.
    pub(crate) fn apply(&self, method: &Method, headers: &mut HeaderMap) {
        if self.stamps(method) && !headers.contains_key(&self.header) {
            let mut key = HeaderValue::try_from(new_key()).expect("a UUID is a valid header value");
            // Kept out of `Debug` output and of HPACK tables on HTTP/2.
            key.set_sensitive(true);
            headers.insert(self.header.clone(), key);
        }
    }
}

/// Stamps an idempotency key on each request that has none. With
/// [`RetryPolicy`](crate::RetryPolicy) as a `tower::retry::Policy`, it makes the tower stack.
///
/// Put it **outside** the retry layer, so that the key is chosen once per logical request and
/// every attempt repeats it. Inside, each attempt would get a key of its own, and the server
/// would take it for a new request. The policy refuses to retry a keyless POST, so the mistake
/// costs the retries, never a repeat.
///
/// By default every method but GET, HEAD, OPTIONS and TRACE is stamped, in `Idempotency-Key`.
/// The server layer checks the same set of methods.
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct StampKeyLayer {
    stamp: Stamp,
}

impl StampKeyLayer {
    /// Stamps every non-safe method in `Idempotency-Key`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The header to put the key in. The server's and
    /// [`RetryPolicy::key_header`](crate::RetryPolicy::key_header) must match.
    ///
    /// Default: [`KEY_HEADER`](crate::KEY_HEADER), `Idempotency-Key`.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.stamp.header = name;
        self
    }

    /// Only requests of these methods get a key.
    ///
    /// Default: every method but GET, HEAD, OPTIONS and TRACE.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.stamp.set_methods(methods);
        self
    }
}

impl<S> Layer<S> for StampKeyLayer {
    type Service = StampKey<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StampKey {
            inner,
            stamp: self.stamp.clone(),
        }
    }
}

/// The service of [`StampKeyLayer`].
#[derive(Clone, Debug)]
pub struct StampKey<S> {
    inner: S,
    stamp: Stamp,
}

impl<S> StampKey<S> {
    /// [`StampKeyLayer::new`], as a shortcut.
    pub fn layer() -> StampKeyLayer {
        StampKeyLayer::new()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for StampKey<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let method = req.method().clone();
        self.stamp.apply(&method, req.headers_mut());
        self.inner.call(req)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uuid_v4_and_differ() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('4'), "version 4: {a}");
        assert!(
            matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "variant: {a}"
        );
        assert!(a.bytes().all(|c| c == b'-' || HEX.contains(&c)));
        tower_idempotency::IdempotencyKey::new(&a).unwrap();
    }

    #[test]
    fn stamps_non_safe_methods_and_keeps_a_given_key() {
        let s = Stamp::default();
        let mut h = HeaderMap::new();
        s.apply(&Method::GET, &mut h);
        assert!(h.is_empty());
        s.apply(&Method::POST, &mut h);
        let first = h.get(&s.header).unwrap().clone();
        s.apply(&Method::POST, &mut h);
        assert_eq!(h.get(&s.header), Some(&first), "a present key is kept");
        let mut patch = HeaderMap::new();
        s.apply(&Method::PATCH, &mut patch);
        assert!(patch.contains_key(&s.header));
    }
}
