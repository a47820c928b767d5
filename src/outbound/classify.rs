//! Whether a send went, failed before anything could go, or may have gone.

use crate::client::Failure;
use crate::client::classify::failure_of_any;

/// What a send's result says about the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// It went: the response is the receipt, recorded under the key.
    Sent,
    /// Nothing went (the connection was refused, the provider said no): the key is released so
    /// another attempt may send. `retryable` says whether the same request may succeed later
    /// (a refused connection, a 429 or a 4xx SMTP reply) or not (a 400, a 5xx SMTP reply).
    Failed {
        /// Whether sending the same request again may succeed.
        retryable: bool,
    },
    /// It may have gone (a timeout after the request was written, a connection lost
    /// mid-exchange): the key is kept, so a retry does not send it again.
    Unknown,
}

/// Decides the [`Verdict`] of a send from its result. The adapters bring their own
/// ([`HttpClassifier`](super::http::HttpClassifier), `SmtpClassifier`); any
/// `Fn(Result<&R, &E>) -> Verdict` is one too.
pub trait Classify<R, E> {
    /// The verdict of a send that came back with `result`.
    fn classify(&self, result: Result<&R, &E>) -> Verdict;
}

impl<R, E, F> Classify<R, E> for F
where
    F: Fn(Result<&R, &E>) -> Verdict,
{
    fn classify(&self, result: Result<&R, &E>) -> Verdict {
        self(result)
    }
}

/// The classifier of the generic door: a response is [`Verdict::Sent`]; an error is
/// [`Verdict::Failed`] (retryable) when its chain shows the connection was never made (an
/// `io::Error` of kind `ConnectionRefused`, `AddrNotAvailable`, `HostUnreachable` or
/// `NetworkUnreachable`, read from an `io::Error` or a `tower::BoxError`), and
/// [`Verdict::Unknown`] otherwise: an error it cannot read may have come after the message
/// went, so the key is kept.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl<R, E: 'static> Classify<R, E> for DefaultClassifier {
    fn classify(&self, result: Result<&R, &E>) -> Verdict {
        match result {
            Ok(_) => Verdict::Sent,
            Err(e) => verdict_of_failure(failure_of_any(e)),
        }
    }
}

/// A transport failure's verdict: only a connection never made is a certain failure.
pub(crate) fn verdict_of_failure(failure: Failure) -> Verdict {
    match failure {
        Failure::Connect => Verdict::Failed { retryable: true },
        _ => Verdict::Unknown,
    }
}
