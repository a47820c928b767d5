//! The retry rules both stacks share. [`RetryPolicy::decide`] takes what was sent, how often,
//! and what came back. It answers: retry after a delay, or stop.

use super::classify::{Verdict, classify};
use super::reply::Reply;
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use std::fmt;
use std::time::Duration;

/// When to retry a request and how long to wait first: the [rules](crate#the-rules), with
/// limits.
///
/// One value serves every request of a client. It holds settings only: the stacks keep each
/// request's attempt count and start time with the request. It is the `tower::retry::Policy`
/// of the tower stack, and the settings of `RetryMiddleware` (feature `reqwest`).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_client::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .keys_honoured_by(["api.example.com".parse().unwrap()])
///     .max_attempts(4)
///     .deadline(Duration::from_secs(10))
///     .base_delay(Duration::from_millis(50))
///     .max_delay(Duration::from_secs(2))
///     .max_retry_after(Duration::from_secs(5));
/// # let _ = policy;
/// ```
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    max_attempts: u32,
    deadline: Duration,
    base_delay: Duration,
    max_delay: Duration,
    max_retry_after: Duration,
    key_header: HeaderName,
    honoured: Honoured,
}

/// The servers known to honour idempotency keys.
#[derive(Clone, Debug)]
enum Honoured {
    Listed(Vec<Authority>),
    All,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The defaults: 5 attempts within 30 s, backoff from 100 ms up to 5 s, a `Retry-After`
    /// of up to 30 s honoured, the key in `Idempotency-Key`, no server declared to honour
    /// keys.
    #[must_use]
    pub fn new() -> Self {
        Self {
            max_attempts: 5,
            deadline: Duration::from_secs(30),
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
            key_header: crate::protocol::KEY_HEADER,
            honoured: Honoured::Listed(Vec::new()),
        }
    }

    /// Declares servers that honour idempotency keys. A keyed POST, PATCH or other
    /// non-idempotent request to one of them is retried on every retryable reply: a 5xx, a
    /// timeout, a lost connection. A repeat under the same key is answered from the record.
    /// To any other server such a request is retried only on a reply that shows nothing
    /// ran: see the [rules](crate#the-rules).
    ///
    /// A server is its host, with a port or without. `api.example.com` matches every port of
    /// that host; `127.0.0.1:3000` matches that port only. A URL without a port has its
    /// scheme's default, 80 or 443. Hosts compare without case. Calls add to the list.
    ///
    /// Default: no server.
    ///
    /// ```
    /// use http::uri::Authority;
    /// use tower_idempotency_client::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new().keys_honoured_by([
    ///     Authority::from_static("api.example.com"),
    ///     Authority::from_static("127.0.0.1:3000"),
    /// ]);
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn keys_honoured_by(mut self, servers: impl IntoIterator<Item = Authority>) -> Self {
        if let Honoured::Listed(list) = &mut self.honoured {
            list.extend(servers);
        }
        self
    }

    /// Declares that every server this client calls honours idempotency keys. It suits a
    /// client of one API that de-duplicates by key. It suits a tonic channel above all: its
    /// requests carry no host at the retry layer.
    ///
    /// Risk: a server that ignores keys runs a retried POST again.
    #[must_use]
    pub fn keys_honoured_by_all(mut self) -> Self {
        self.honoured = Honoured::All;
        self
    }

    /// Whether the server at `host` and `port` was declared to honour keys. `port` is the
    /// URL's, or its scheme's default.
    pub(crate) fn honours(&self, host: Option<&str>, port: Option<u16>) -> bool {
        match &self.honoured {
            Honoured::All => true,
            Honoured::Listed(list) => host.is_some_and(|host| {
                list.iter().any(|a| {
                    a.host().eq_ignore_ascii_case(host)
                        && a.port_u16().is_none_or(|p| Some(p) == port)
                })
            }),
        }
    }

    /// [`honours`](Self::honours) for an `http::Uri`. A URI without a host honours only under
    /// [`keys_honoured_by_all`](Self::keys_honoured_by_all).
    pub(crate) fn honours_uri(&self, uri: &http::Uri) -> bool {
        let port = uri.port_u16().or_else(|| match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        self.honours(uri.host(), port)
    }

    /// The most attempts per request, the first one included. `1` never retries; `0` counts
    /// as `1`.
    ///
    /// Default: 5.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// No retry starts later than this after the first attempt started. A retry whose delay
    /// would end past the deadline is not made. An attempt in progress is not cut short:
    /// bound each attempt with the client's request timeout. That is reqwest's `timeout`, or
    /// tower's `TimeoutLayer` inside the retry layer.
    ///
    /// Default: 30 s.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The backoff of the first retry when the server gave no `Retry-After`. It doubles with
    /// every retry up to [`max_delay`](Self::max_delay). Each delay is drawn between half of
    /// it and all of it, so that clients that failed together do not retry together.
    ///
    /// Default: 100 ms.
    #[must_use]
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The longest backoff between two attempts. A `Retry-After` is bounded by
    /// [`max_retry_after`](Self::max_retry_after) instead.
    ///
    /// Default: 5 s.
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// The longest `Retry-After` or gRPC `grpc-retry-pushback-ms` honoured. A server that
    /// asks for a longer wait gets no retry: its answer is returned at once, with
    /// [`StopReason::RetryAfterTooLong`]. It is never retried earlier than it asked.
    ///
    /// Default: 30 s.
    #[must_use]
    pub fn max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// The request header that carries the key. It must match the server's and the stamping
    /// layer's.
    ///
    /// Default: [`KEY_HEADER`](crate::KEY_HEADER), `Idempotency-Key`.
    #[must_use]
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// The header that carries the key.
    #[must_use]
    pub fn key_header_name(&self) -> &HeaderName {
        &self.key_header
    }

    /// The decision after an attempt: retry after a delay, or stop and say why.
    ///
    /// ```
    /// use http::{HeaderMap, Method, StatusCode};
    /// use std::time::Duration;
    /// use tower_idempotency_client::{Attempt, Decision, Reply, StopReason, RetryPolicy};
    ///
    /// let policy = RetryPolicy::new();
    /// let post = Method::POST;
    /// let mut headers = HeaderMap::new();
    /// headers.insert(http::header::RETRY_AFTER, "1".parse().unwrap());
    /// let in_flight = Reply::response(StatusCode::CONFLICT, &headers);
    ///
    /// // A keyed POST that met a 409 with `Retry-After: 1` is retried after one second.
    /// let first = Attempt::new(&post, true, 1, Duration::ZERO);
    /// assert_eq!(policy.decide(&first, &in_flight), Decision::Retry(Duration::from_secs(1)));
    ///
    /// // A 503 may follow a run: the keyed POST is retried only where keys are honoured.
    /// let none = HeaderMap::new();
    /// let unavailable = Reply::response(StatusCode::SERVICE_UNAVAILABLE, &none);
    /// assert_eq!(policy.decide(&first, &unavailable), Decision::Stop(StopReason::NotHonoured));
    /// let honoured = first.key_honoured(true);
    /// assert!(matches!(policy.decide(&honoured, &unavailable), Decision::Retry(_)));
    ///
    /// // The same POST without a key is never retried.
    /// let unkeyed = Attempt::new(&post, false, 1, Duration::ZERO);
    /// assert_eq!(policy.decide(&unkeyed, &in_flight), Decision::Stop(StopReason::NotKeyed));
    ///
    /// // A 422 (the key was used for another request) is final.
    /// let reused = Reply::response(StatusCode::UNPROCESSABLE_ENTITY, &none);
    /// assert_eq!(policy.decide(&first, &reused), Decision::Stop(StopReason::Final));
    /// ```
    #[must_use]
    pub fn decide(&self, attempt: &Attempt<'_>, reply: &Reply<'_>) -> Decision {
        let (after, unrun) = match classify(reply) {
            Verdict::Final => return Decision::Stop(StopReason::Final),
            Verdict::Retry { after, unrun } => (after, unrun),
        };
        if !is_idempotent(attempt.method) {
            if !attempt.keyed {
                return Decision::Stop(StopReason::NotKeyed);
            }
            // A server that ignores keys would run the work again: only a reply that
            // shows nothing ran is repeated there.
            if !attempt.honoured && !unrun {
                return Decision::Stop(StopReason::NotHonoured);
            }
        }
        if attempt.number >= self.max_attempts {
            return Decision::Stop(StopReason::AttemptsExhausted);
        }
        let delay = match after {
            Some(after) if after > self.max_retry_after => {
                return Decision::Stop(StopReason::RetryAfterTooLong);
            }
            Some(after) => after,
            None => self.backoff(attempt.number),
        };
        if attempt.elapsed.saturating_add(delay) > self.deadline {
            return Decision::Stop(StopReason::DeadlineExceeded);
        }
        Decision::Retry(delay)
    }

    /// The backoff before attempt `made + 1`: `base × 2^(made − 1)` capped at `max_delay`,
    /// drawn between half of it and all of it.
    fn backoff(&self, made: u32) -> Duration {
        let doublings = made.saturating_sub(1).min(32);
        let cap = self
            .base_delay
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max_delay);
        let half = cap / 2;
        let mut r = [0u8; 8];
        // Without randomness (never on a supported OS) the whole delay is taken.
        if getrandom::fill(&mut r).is_err() {
            return cap;
        }
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = u64::from_le_bytes(r) % nanos.saturating_add(1);
        half + Duration::from_nanos(jitter)
    }
}

/// Whether a request of this method may be retried without a key: the safe and idempotent
/// methods of RFC 9110 (GET, HEAD, OPTIONS, TRACE, PUT, DELETE).
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// What had been sent when a reply arrived: the input of [`RetryPolicy::decide`] with the
/// reply.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    method: &'a Method,
    keyed: bool,
    honoured: bool,
    number: u32,
    elapsed: Duration,
}

impl<'a> Attempt<'a> {
    /// Attempt `number` of a request of `method`, 1 for the first. It carries an idempotency
    /// key if `keyed`, and started `elapsed` after the first attempt. Its server is not known
    /// to honour keys.
    #[must_use]
    pub fn new(method: &'a Method, keyed: bool, number: u32, elapsed: Duration) -> Self {
        Self {
            method,
            keyed,
            honoured: false,
            number,
            elapsed,
        }
    }

    /// Whether the server is known to honour the key. The stacks set it from
    /// [`RetryPolicy::keys_honoured_by`].
    ///
    /// Default: `false`.
    #[must_use]
    pub fn key_honoured(mut self, honoured: bool) -> Self {
        self.honoured = honoured;
        self
    }
}

/// The answer of [`RetryPolicy::decide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Send the same request, with the same key, after this delay.
    Retry(Duration),
    /// Return this reply to the caller.
    Stop(StopReason),
}

/// Why the attempts stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The reply is final: a success, or an answer a retry would not change. That is 400,
    /// 401, 403, 404, 413, 422 `idempotency.key_reused`, a 409 without `Retry-After`, …
    Final,
    /// The reply was retryable, but the request may not be repeated: a POST, PATCH or other
    /// non-idempotent method without an idempotency key.
    NotKeyed,
    /// The reply was retryable but may follow a run of the work: a 5xx, a timeout, a lost
    /// connection. The server is not known to honour keys, see
    /// [`RetryPolicy::keys_honoured_by`]. A repeat could run the work twice.
    NotHonoured,
    /// The reply was retryable, but the request's body cannot be sent again. It is a
    /// streaming body, sent once.
    NotReplayable,
    /// The last allowed attempt was made.
    AttemptsExhausted,
    /// The next retry would start past the deadline.
    DeadlineExceeded,
    /// The server asked to wait longer than [`RetryPolicy::max_retry_after`].
    RetryAfterTooLong,
}

impl StopReason {
    /// A short name for logs and metrics: `final`, `not_keyed`, …
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Final => "final",
            Self::NotKeyed => "not_keyed",
            Self::NotHonoured => "not_honoured",
            Self::NotReplayable => "not_replayable",
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::RetryAfterTooLong => "retry_after_too_long",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a response was obtained. Both stacks insert it into the final response's extensions:
/// `http::Response::extensions()`, `reqwest::Response::extensions()`.
/// [`RetryError`](crate::RetryError) carries it when the attempts end in an error.
///
/// A response without it was not seen by a retrying stack. With tower, a request whose body
/// cannot be cloned bypasses the policy.
///
/// Its `Debug` form shows the key as `Sensitive`. The key stands for the work: keep it out of
/// logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempts {
    count: u32,
    replayed: bool,
    reason: StopReason,
    key: Option<HeaderValue>,
}

impl Attempts {
    /// `count` attempts, the last answered with `headers` (empty for an error), stopped for
    /// `reason`. The key is in `header` of the request's `request_headers`.
    pub(crate) fn new(
        count: u32,
        headers: &HeaderMap,
        reason: StopReason,
        request_headers: &HeaderMap,
        header: &HeaderName,
    ) -> Self {
        let key = request_headers.get(header).map(|v| {
            let mut v = v.clone();
            v.set_sensitive(true);
            v
        });
        Self {
            count,
            replayed: headers
                .get(crate::protocol::REPLAYED_HEADER)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")),
            reason,
            key,
        }
    }

    /// How many attempts were made, the last one included. 1 means no retry.
    #[must_use]
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether the server answered from the record of an earlier run: `Idempotent-Replayed:
    /// true`. An attempt whose answer was lost had done the work, or an earlier call with the
    /// same key had.
    #[must_use]
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// Why no further attempt was made.
    #[must_use]
    pub fn reason(&self) -> StopReason {
        self.reason
    }

    /// The idempotency key every attempt carried, stamped by the stack or given by the
    /// caller. `None` for a request without one. To resume this logical request, send it again
    /// later with this key in the same header. A server that honours keys answers from its
    /// record if an attempt ran the work.
    #[must_use]
    pub fn key(&self) -> Option<&HeaderValue> {
        self.key.as_ref()
    }
}

/// At most the first 8 characters of a key, for logs: never the whole key.
pub(crate) fn key_prefix(headers: &HeaderMap, name: &HeaderName) -> String {
    match headers.get(name).and_then(|v| v.to_str().ok()) {
        Some(key) => key.chars().take(8).collect(),
        None => "-".to_owned(),
    }
}

/// The target of the client's events (one per attempt).
const LOG_TARGET: &str = "tower_idempotency_client";

/// The one event per attempt: its number, the method, at most 8 characters of the key, what
/// came back and what follows. A retry is `INFO`. A stop on a retryable reply is `WARN`. A
/// final answer is `DEBUG` on the first attempt and `INFO` after retries. Each attempt is also
/// counted (feature `metrics`).
pub(crate) fn log_attempt(attempt: &Attempt<'_>, key: &str, reply: &Reply<'_>, decision: Decision) {
    let (status, grpc_status, failure) = match *reply {
        Reply::Response { status, headers } => (
            Some(status.as_u16()),
            crate::protocol::status_of(headers),
            None,
        ),
        Reply::Failed(f) => (None, None, Some(f)),
    };
    let n = attempt.number;
    let method = attempt.method.as_str();
    let elapsed_ms = u64::try_from(attempt.elapsed.as_millis()).unwrap_or(u64::MAX);
    crate::metrics::attempt(match decision {
        Decision::Retry(_) => "retry",
        Decision::Stop(reason) => reason.as_str(),
    });
    match decision {
        Decision::Retry(delay) => {
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            tracing::info!(target: LOG_TARGET, attempt = n, method, key, status, grpc_status, failure = ?failure, elapsed_ms, delay_ms, "idempotent request: retrying");
        }
        Decision::Stop(
            reason @ (StopReason::Final | StopReason::NotKeyed | StopReason::NotReplayable),
        ) => {
            if n == 1 {
                tracing::debug!(target: LOG_TARGET, attempt = n, method, key, status, grpc_status, failure = ?failure, elapsed_ms, reason = reason.as_str(), "idempotent request: done");
            } else {
                tracing::info!(target: LOG_TARGET, attempt = n, method, key, status, grpc_status, failure = ?failure, elapsed_ms, reason = reason.as_str(), "idempotent request: done");
            }
        }
        Decision::Stop(reason) => {
            tracing::warn!(target: LOG_TARGET, attempt = n, method, key, status, grpc_status, failure = ?failure, elapsed_ms, reason = reason.as_str(), "idempotent request: giving up");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::reply::RetryErrorKind;
    use http::HeaderValue;
    use http::StatusCode;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    /// The decision on a first attempt to a server that honours keys.
    fn decide_status(policy: &RetryPolicy, method: &Method, keyed: bool, status: u16) -> Decision {
        let h = HeaderMap::new();
        policy.decide(
            &Attempt::new(method, keyed, 1, Duration::ZERO).key_honoured(true),
            &Reply::response(StatusCode::from_u16(status).unwrap(), &h),
        )
    }

    /// Feature `metrics`: each attempt counted once, by what followed it.
    #[cfg(feature = "metrics")]
    #[test]
    fn each_attempt_is_counted_by_what_followed() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let p = RetryPolicy::new();
            let h = HeaderMap::new();
            for (n, status, keyed) in [(1, 503, true), (2, 201, true), (1, 503, false)] {
                let attempt =
                    Attempt::new(&Method::POST, keyed, n, Duration::ZERO).key_honoured(true);
                let reply = Reply::response(StatusCode::from_u16(status).unwrap(), &h);
                log_attempt(&attempt, "k", &reply, p.decide(&attempt, &reply));
            }
        });
        let mut seen: Vec<(String, u64)> = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(ck, _, _, v)| {
                assert_eq!(ck.key().name(), "idempotency_client_attempts_total");
                let decision = ck.key().labels().map(|l| l.value().to_owned()).collect();
                let DebugValue::Counter(n) = v else {
                    panic!("a counter")
                };
                (decision, n)
            })
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            [
                ("final".to_owned(), 1),
                ("not_keyed".to_owned(), 1),
                ("retry".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn retries_transient_statuses_of_a_keyed_post() {
        let p = RetryPolicy::new();
        for s in [408, 425, 429, 500, 502, 503, 504] {
            assert!(
                matches!(
                    decide_status(&p, &Method::POST, true, s),
                    Decision::Retry(_)
                ),
                "{s} must be retried"
            );
        }
    }

    #[test]
    fn never_retries_caller_errors_or_successes() {
        let p = RetryPolicy::new();
        for s in [
            200, 201, 204, 303, 400, 401, 403, 404, 409, 413, 422, 501, 505, 511,
        ] {
            assert_eq!(
                decide_status(&p, &Method::POST, true, s),
                Decision::Stop(StopReason::Final),
                "{s} must not be retried"
            );
        }
    }

    #[test]
    fn an_unkeyed_post_or_patch_is_never_retried() {
        let p = RetryPolicy::new();
        for m in [Method::POST, Method::PATCH] {
            assert_eq!(
                decide_status(&p, &m, false, 503),
                Decision::Stop(StopReason::NotKeyed)
            );
            let failed = Reply::Failed(RetryErrorKind::ConnectionLost);
            assert_eq!(
                p.decide(&Attempt::new(&m, false, 1, Duration::ZERO), &failed),
                Decision::Stop(StopReason::NotKeyed)
            );
        }
    }

    #[test]
    fn a_keyed_post_to_an_undeclared_server_is_retried_only_when_nothing_ran() {
        let p = RetryPolicy::new();
        let first = Attempt::new(&Method::POST, true, 1, Duration::ZERO);
        let none = HeaderMap::new();
        for s in [500, 502, 503, 504] {
            let o = Reply::response(StatusCode::from_u16(s).unwrap(), &none);
            assert_eq!(
                p.decide(&first, &o),
                Decision::Stop(StopReason::NotHonoured),
                "{s}"
            );
        }
        for f in [
            RetryErrorKind::Timeout,
            RetryErrorKind::ConnectionLost,
            RetryErrorKind::Transport,
        ] {
            let o = Reply::Failed(f);
            assert_eq!(
                p.decide(&first, &o),
                Decision::Stop(StopReason::NotHonoured),
                "{f:?}"
            );
        }
        for s in [408, 425, 429] {
            let o = Reply::response(StatusCode::from_u16(s).unwrap(), &none);
            assert!(matches!(p.decide(&first, &o), Decision::Retry(_)), "{s}");
        }
        let connect = Reply::Failed(RetryErrorKind::Connect);
        assert!(matches!(p.decide(&first, &connect), Decision::Retry(_)));
        // Idempotent methods need no declaration.
        let put = Attempt::new(&Method::PUT, true, 1, Duration::ZERO);
        let o = Reply::response(StatusCode::BAD_GATEWAY, &none);
        assert!(matches!(p.decide(&put, &o), Decision::Retry(_)));
    }

    #[test]
    fn declared_servers_match_by_host_and_port() {
        let p = RetryPolicy::new().keys_honoured_by([
            Authority::from_static("API.example.com"),
            Authority::from_static("127.0.0.1:3000"),
            Authority::from_static("[::1]:8080"),
        ]);
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(p.honours_uri(&uri("https://api.example.com/orders")));
        assert!(p.honours_uri(&uri("http://api.EXAMPLE.com:8443/orders")));
        assert!(p.honours_uri(&uri("http://127.0.0.1:3000/orders")));
        assert!(!p.honours_uri(&uri("http://127.0.0.1:3001/orders")));
        assert!(!p.honours_uri(&uri("http://127.0.0.1/orders")));
        assert!(p.honours_uri(&uri("http://[::1]:8080/")));
        assert!(!p.honours_uri(&uri("http://other.example.com/")));
        assert!(!p.honours_uri(&uri("/pkg.Orders/Create")), "no host");
        assert!(!RetryPolicy::new().honours_uri(&uri("https://api.example.com/")));
        let all = RetryPolicy::new().keys_honoured_by_all();
        assert!(all.honours_uri(&uri("/pkg.Orders/Create")));
        let p80 = RetryPolicy::new().keys_honoured_by([Authority::from_static("a.test:80")]);
        assert!(
            p80.honours_uri(&uri("http://a.test/")),
            "the scheme's default port"
        );
        assert!(!p80.honours_uri(&uri("https://a.test/")));
    }

    #[test]
    fn idempotent_methods_are_retried_without_a_key() {
        let p = RetryPolicy::new();
        for m in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
            assert!(matches!(
                decide_status(&p, &m, false, 503),
                Decision::Retry(_)
            ));
        }
    }

    #[test]
    fn a_conflict_is_retried_only_with_retry_after() {
        let p = RetryPolicy::new();
        let h = headers(&[("retry-after", "2")]);
        let d = p.decide(
            &Attempt::new(&Method::POST, true, 1, Duration::ZERO),
            &Reply::response(StatusCode::CONFLICT, &h),
        );
        assert_eq!(d, Decision::Retry(Duration::from_secs(2)));
        assert_eq!(
            decide_status(&p, &Method::POST, true, 409),
            Decision::Stop(StopReason::Final)
        );
    }

    #[test]
    fn retry_after_over_the_cap_stops() {
        let p = RetryPolicy::new().max_retry_after(Duration::from_secs(5));
        let h = headers(&[("retry-after", "6")]);
        let d = p.decide(
            &Attempt::new(&Method::POST, true, 1, Duration::ZERO).key_honoured(true),
            &Reply::response(StatusCode::SERVICE_UNAVAILABLE, &h),
        );
        assert_eq!(d, Decision::Stop(StopReason::RetryAfterTooLong));
    }

    #[test]
    fn transport_failures_are_retried_other_failures_are_not() {
        let p = RetryPolicy::new();
        let a = Attempt::new(&Method::POST, true, 1, Duration::ZERO).key_honoured(true);
        for f in [
            RetryErrorKind::Connect,
            RetryErrorKind::Timeout,
            RetryErrorKind::ConnectionLost,
            RetryErrorKind::Transport,
        ] {
            assert!(matches!(
                p.decide(&a, &Reply::Failed(f)),
                Decision::Retry(_)
            ));
        }
        assert_eq!(
            p.decide(&a, &Reply::Failed(RetryErrorKind::Other)),
            Decision::Stop(StopReason::Final)
        );
    }

    #[test]
    fn stops_after_max_attempts() {
        let p = RetryPolicy::new().max_attempts(3);
        let f = Reply::Failed(RetryErrorKind::Connect);
        let at = |n| Attempt::new(&Method::GET, false, n, Duration::ZERO);
        assert!(matches!(p.decide(&at(2), &f), Decision::Retry(_)));
        assert_eq!(
            p.decide(&at(3), &f),
            Decision::Stop(StopReason::AttemptsExhausted)
        );
        let once = RetryPolicy::new().max_attempts(0);
        assert_eq!(
            once.decide(&at(1), &f),
            Decision::Stop(StopReason::AttemptsExhausted)
        );
    }

    #[test]
    fn stops_when_the_delay_would_pass_the_deadline() {
        let p = RetryPolicy::new().deadline(Duration::from_secs(3));
        let h = headers(&[("retry-after", "2")]);
        let o = Reply::response(StatusCode::TOO_MANY_REQUESTS, &h);
        let at = |ms| Attempt::new(&Method::GET, false, 1, Duration::from_millis(ms));
        assert_eq!(
            p.decide(&at(900), &o),
            Decision::Retry(Duration::from_secs(2))
        );
        assert_eq!(
            p.decide(&at(1100), &o),
            Decision::Stop(StopReason::DeadlineExceeded)
        );
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let p = RetryPolicy::new()
            .base_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(350))
            .max_attempts(100);
        for _ in 0..50 {
            let b1 = p.backoff(1);
            assert!(b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100));
            let b2 = p.backoff(2);
            assert!(b2 >= Duration::from_millis(100) && b2 <= Duration::from_millis(200));
            let b9 = p.backoff(9);
            assert!(b9 >= Duration::from_millis(175) && b9 <= Duration::from_millis(350));
            assert!(p.backoff(u32::MAX) <= Duration::from_millis(350));
        }
    }

    #[test]
    fn attempts_reads_the_replayed_header_and_hides_the_key() {
        let name = crate::protocol::KEY_HEADER;
        let h = headers(&[("idempotent-replayed", "true")]);
        let req = headers(&[("idempotency-key", "0f8fad5b-d9cb-469f-a165-70867728950e")]);
        let a = Attempts::new(2, &h, StopReason::Final, &req, &name);
        assert!(a.replayed());
        assert_eq!(a.key().unwrap(), "0f8fad5b-d9cb-469f-a165-70867728950e");
        assert!(!format!("{a:?}").contains("0f8fad5b"), "{a:?}");
        let none = Attempts::new(
            1,
            &HeaderMap::new(),
            StopReason::Final,
            &HeaderMap::new(),
            &name,
        );
        assert!(!none.replayed());
        assert_eq!(none.key(), None);
    }

    #[test]
    fn logs_at_most_eight_characters_of_a_key() {
        let h = headers(&[("idempotency-key", "0f8fad5b-d9cb-469f-a165-70867728950e")]);
        assert_eq!(key_prefix(&h, &crate::protocol::KEY_HEADER), "0f8fad5b");
        assert_eq!(
            key_prefix(&HeaderMap::new(), &crate::protocol::KEY_HEADER),
            "-"
        );
    }
}
