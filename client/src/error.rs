//! The error of a logical request whose attempts ended in a failure.

use super::policy::Attempts;
use super::reply::RetryErrorKind;
use http::HeaderValue;
use std::error::Error as StdError;
use std::fmt;
use tower::BoxError;

/// The attempts of one logical request ended without a response.
///
/// It holds what the last attempt met ([`kind`](Self::kind)), that attempt's error
/// ([`source`](StdError::source)), how many attempts were made and why no further one was
/// ([`attempts`](Self::attempts)), and the key they all carried ([`key`](Self::key)).
///
/// The key lets the caller resume. Send the same request again with it, later or from another
/// process. A server that honours keys answers from its record if an attempt ran the work.
/// The `Debug` form shows the key as `Sensitive`; the `Display` form leaves it out.
///
/// Both stacks return it. The tower stack returns it as the retry layer's `tower::BoxError`,
/// when the service below fails with a `BoxError` as `tower::timeout::Timeout` does. The
/// reqwest stack returns it inside `reqwest_middleware::Error::Middleware`, where
/// `RetryError::of_reqwest` finds it (feature `reqwest`).
///
/// ```
/// use tower_idempotency_client::RetryError;
///
/// fn resume_key(err: &tower::BoxError) -> Option<String> {
///     let gave_up = err.downcast_ref::<RetryError>()?;
///     let key = gave_up.key()?.to_str().ok()?;
///     Some(key.to_owned()) // store it with the work; send it again later
/// }
/// # let _ = resume_key;
/// ```
#[derive(Debug)]
pub struct RetryError {
    failure: RetryErrorKind,
    attempts: Attempts,
    source: BoxError,
}

impl RetryError {
    pub(crate) fn new(failure: RetryErrorKind, attempts: Attempts, source: BoxError) -> Self {
        Self {
            failure,
            attempts,
            source,
        }
    }

    /// What the last attempt met: a timeout, a lost connection, a failed connect, …
    #[must_use]
    pub fn kind(&self) -> RetryErrorKind {
        self.failure
    }

    /// How many attempts were made and why no further one was.
    #[must_use]
    pub fn attempts(&self) -> &Attempts {
        &self.attempts
    }

    /// The idempotency key every attempt carried, to resume under. `None` for a request
    /// without one.
    #[must_use]
    pub fn key(&self) -> Option<&HeaderValue> {
        self.attempts.key()
    }

    /// The last attempt's error. For the reqwest stack it is a `reqwest_middleware::Error`.
    #[must_use]
    pub fn into_inner(self) -> BoxError {
        self.source
    }

    /// The `RetryError` inside the error of a `reqwest-middleware` client with
    /// `RetryMiddleware`, if there is one.
    #[cfg(feature = "reqwest")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
    #[must_use]
    pub fn of_reqwest(err: &reqwest_middleware::Error) -> Option<&Self> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<Self>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

impl fmt::Display for RetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.attempts.count();
        write!(
            f,
            "the request failed after {n} attempt{} ({}): {}",
            if n == 1 { "" } else { "s" },
            self.attempts.reason(),
            self.source
        )
    }
}

impl StdError for RetryError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
