//! The reqwest half: [`RetryMiddleware`] for `reqwest-middleware` clients.

use super::classify::failure_of;
use super::error::RetryError;
use super::policy::{
    Attempt, Attempts, Decision, RetryPolicy, StopReason, key_prefix, log_attempt,
};
use super::reply::{Reply, RetryErrorKind};
use super::stamp::Stamp;
use http::{Extensions, HeaderMap, Method};
use reqwest_middleware::{Middleware, Next};
use std::time::Instant;

/// Stamps an idempotency key on each request that has none, and retries it by the rules of
/// [`RetryPolicy`] with the same key every time. The final response gets an [`Attempts`]
/// extension: `response.extensions().get::<Attempts>()`.
///
/// Each attempt sends a copy made with `reqwest::Request::try_clone`. A request whose body
/// cannot be copied is sent once and never retried, with [`StopReason::NotReplayable`]. That
/// is a streaming body, `Body::wrap_stream`. Buffer the body to make it retryable: `Vec<u8>`,
/// `Bytes`, `String`, `.json(..)`.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use tower_idempotency_client::{RetryMiddleware, RetryPolicy};
///
/// let policy = RetryPolicy::new()
///     .keys_honoured_by(["api.example.com".parse().unwrap()])
///     .max_attempts(4);
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(policy))
///     .build();
/// # let _ = client;
/// ```
///
/// Put it first in the chain (outermost), so that middleware after it runs on every attempt.
///
/// When the attempts end in an error, it is a [`RetryError`] inside
/// `reqwest_middleware::Error::Middleware`; [`RetryError::of_reqwest`] finds it. It holds the
/// attempts, the key to resume under, and what the last attempt met ([`RetryError::kind`]).
/// Its source is that attempt's own `reqwest_middleware::Error`.
///
/// ```
/// use tower_idempotency_client::RetryError;
///
/// fn report(err: &reqwest_middleware::Error) {
///     if let Some(gave_up) = RetryError::of_reqwest(err) {
///         let attempts = gave_up.attempts();
///         println!("{:?} after {} attempts ({})", gave_up.kind(), attempts.count(), attempts.reason());
///         // gave_up.key(): store it, send the request again with it later
///     }
/// }
/// # let _ = report;
/// ```
#[derive(Clone, Debug)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
    stamp: Option<Stamp>,
}

impl RetryMiddleware {
    /// Retries by `policy`; stamps every non-safe method in the policy's key header.
    #[must_use]
    pub fn new(policy: RetryPolicy) -> Self {
        let stamp = Stamp::with_header(policy.key_header_name().clone());
        Self {
            policy,
            stamp: Some(stamp),
        }
    }

    /// Only requests of these methods get a key. Others are retried only when idempotent or
    /// keyed by the caller.
    ///
    /// Default: every method but GET, HEAD, OPTIONS and TRACE.
    #[must_use]
    pub fn stamp_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        if let Some(stamp) = &mut self.stamp {
            stamp.set_methods(methods);
        }
        self
    }

    /// Whether to stamp keys at all. Without stamping, only the idempotent methods and the
    /// requests that carry the caller's own key are retried.
    ///
    /// Default: `true`.
    #[must_use]
    pub fn stamp(mut self, stamp: bool) -> Self {
        if !stamp {
            self.stamp = None;
        } else if self.stamp.is_none() {
            self.stamp = Some(Stamp::with_header(self.policy.key_header_name().clone()));
        }
        self
    }
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let method = req.method().clone();
        if let Some(stamp) = &self.stamp {
            stamp.apply(&method, req.headers_mut());
        }
        let header = self.policy.key_header_name();
        let keyed = req.headers().contains_key(header);
        let key = key_prefix(req.headers(), header);
        let url = req.url();
        let honoured = self
            .policy
            .honours(url.host_str(), url.port_or_known_default());
        // The key, for the caller's answer: each attempt consumes the request itself.
        let mut key_headers = HeaderMap::new();
        if let Some(v) = req.headers().get(header) {
            key_headers.insert(header.clone(), v.clone());
        }
        let started = Instant::now();
        let mut number = 1;
        loop {
            let spare = req.try_clone();
            let result = next.clone().run(req, extensions).await;
            let attempt =
                Attempt::new(&method, keyed, number, started.elapsed()).key_honoured(honoured);
            let mut failure = RetryErrorKind::Transport;
            let decision = {
                let reply = match &result {
                    Ok(res) => Reply::response(res.status(), res.headers()),
                    Err(e) => {
                        failure = failure_of_middleware(e);
                        Reply::Failed(failure)
                    }
                };
                let decision = match self.policy.decide(&attempt, &reply) {
                    Decision::Retry(_) if spare.is_none() => {
                        Decision::Stop(StopReason::NotReplayable)
                    }
                    d => d,
                };
                log_attempt(&attempt, &key, &reply, decision);
                decision
            };
            match (decision, spare) {
                (Decision::Retry(delay), Some(spare)) => {
                    drop(result);
                    tokio::time::sleep(delay).await;
                    req = spare;
                    number += 1;
                }
                (Decision::Stop(reason), _) => {
                    return match result {
                        Ok(mut res) => {
                            let attempts =
                                Attempts::new(number, res.headers(), reason, &key_headers, header);
                            res.extensions_mut().insert(attempts);
                            Ok(res)
                        }
                        Err(e) => {
                            let attempts = Attempts::new(
                                number,
                                &HeaderMap::new(),
                                reason,
                                &key_headers,
                                header,
                            );
                            let gave_up = RetryError::new(failure, attempts, Box::new(e));
                            Err(reqwest_middleware::Error::middleware(gave_up))
                        }
                    };
                }
                // A retry without a copy was turned into a stop above.
                (Decision::Retry(_), None) => return result,
            }
        }
    }
}

/// What a failed attempt says about the exchange. An error of another middleware is not a
/// transport failure: it is returned, not retried.
fn failure_of_middleware(err: &reqwest_middleware::Error) -> RetryErrorKind {
    match err {
        reqwest_middleware::Error::Reqwest(e) => failure_of_reqwest(e),
        reqwest_middleware::Error::Middleware(_) => RetryErrorKind::Other,
    }
}

fn failure_of_reqwest(err: &reqwest::Error) -> RetryErrorKind {
    if err.is_connect() {
        RetryErrorKind::Connect
    } else if err.is_timeout() {
        RetryErrorKind::Timeout
    } else if err.is_request() {
        // Sending failed or the connection ended before the answer: a reset, or a response
        // cut off after the handler ran. Past the connect stage, an unreachable host is a
        // lost connection, not a failed connect.
        match failure_of(err, RetryErrorKind::ConnectionLost) {
            RetryErrorKind::Connect => RetryErrorKind::ConnectionLost,
            f => f,
        }
    } else {
        // Building, redirects, bodies, decoding: a repeat would fail the same way.
        RetryErrorKind::Other
    }
}
