//! Whether a send went, failed before anything could go, or may have gone.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::io;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a send's result says about the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// It went: the response is the receipt, recorded under the key.
    Sent,
    /// Nothing went (the connection was never made, the provider said no): the key is released
    /// so another attempt may send. `retryable` says whether the same request may succeed
    /// later (a connection never made, a 429 or a 4xx SMTP reply) or not (a 400, a 5xx SMTP
    /// reply).
    Failed {
        /// Whether sending the same request again may succeed.
        retryable: bool,
    },
    /// It may have gone (a timeout after the request was written, a connection lost
    /// mid-exchange, an answer that may follow an action): the key is held, so a retry does
    /// not send it again.
    Unknown,
}

/// Decides the [`Verdict`] of a send from its result. The adapters bring their own
/// ([`HttpClassifier`](super::http::HttpClassifier), `MailClassifier`); any
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
/// [`Verdict::Failed`] (retryable) only when the client itself says it failed before it could
/// send (see [`NotSent`]), and [`Verdict::Unknown`] otherwise: an error it cannot place may
/// have come after the request went, so the key is held.
///
/// I/O error kinds do not decide: Linux reports `EHOSTUNREACH`, `ENETUNREACH` and even
/// `ECONNREFUSED` (an ICMP answer) on a connection that was already sending, and a retry
/// layer inside the door may end with a refused connection after an earlier attempt went.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl<R, E: 'static> Classify<R, E> for DefaultClassifier {
    fn classify(&self, result: Result<&R, &E>) -> Verdict {
        match result {
            Ok(_) => Verdict::Sent,
            Err(e) if never_sent_any(e) => Verdict::Failed { retryable: true },
            Err(_) => Verdict::Unknown,
        }
    }
}

/// An error that says nothing went out: the client failed in its own connect stage (no
/// connection, no TLS session, no name), before any byte of the request was written.
///
/// Return it from a client of your own (or put it in your error's chain of sources, an
/// `io::Error` wrapping it included), and the door's classifiers release the key for it. The
/// door also reads the stage of the clients it knows: hyper-util's legacy client
/// (`Error::is_connect`, feature `hyper-util`) and reqwest (`Error::is_connect`, feature
/// `reqwest`). Keep retries outside the door: a retry layer inside it may end with a
/// connect error after an earlier attempt went.
///
/// ```
/// use std::io;
/// use tower_idempotency::outbound::{Classify, DefaultClassifier, NotSent, Verdict};
///
/// let refused = io::Error::other(NotSent::new(io::Error::from(io::ErrorKind::ConnectionRefused)));
/// assert_eq!(DefaultClassifier.classify(Err::<&(), _>(&refused)), Verdict::Failed { retryable: true });
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert_eq!(DefaultClassifier.classify(Err::<&(), _>(&reset)), Verdict::Unknown);
/// ```
#[derive(Debug)]
pub struct NotSent {
    source: BoxError,
}

impl NotSent {
    /// The client's error, marked as raised before anything was sent.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }

    /// The client's error.
    #[must_use]
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nothing was sent: {}", self.source)
    }
}

impl StdError for NotSent {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// Chains deeper than this are not read further (a cycle, or a pathological chain).
const MAX_CHAIN: usize = 32;

/// Whether an error's chain says the client failed before it sent anything: a [`NotSent`], or
/// a known client's connect-stage error.
pub(crate) fn never_sent(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    for _ in 0..MAX_CHAIN {
        let Some(e) = next else { return false };
        if is_connect_stage(e) {
            return true;
        }
        // An `io::Error`'s `source` skips the error it wraps: read that one next.
        next = match e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    false
}

/// One error of a chain: a [`NotSent`] or a client's connect error.
fn is_connect_stage(e: &(dyn StdError + 'static)) -> bool {
    if e.is::<NotSent>() {
        return true;
    }
    #[cfg(feature = "hyper-util")]
    if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        return h.is_connect();
    }
    #[cfg(feature = "reqwest")]
    if let Some(r) = e.downcast_ref::<reqwest::Error>() {
        return r.is_connect();
    }
    false
}

/// [`never_sent`] for an error of any type: read when it is one of the error types a tower
/// client returns (a boxed error, an `io::Error`, [`NotSent`], a known client's error).
pub(crate) fn never_sent_any<E: 'static>(err: &E) -> bool {
    let any: &dyn Any = err;
    if let Some(boxed) = any.downcast_ref::<BoxError>() {
        return never_sent(&**boxed);
    }
    if let Some(io) = any.downcast_ref::<io::Error>() {
        return never_sent(io);
    }
    if let Some(n) = any.downcast_ref::<NotSent>() {
        return never_sent(n);
    }
    #[cfg(feature = "hyper-util")]
    if let Some(h) = any.downcast_ref::<hyper_util::client::legacy::Error>() {
        return h.is_connect();
    }
    #[cfg(feature = "reqwest")]
    if let Some(r) = any.downcast_ref::<reqwest::Error>() {
        return r.is_connect();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(e: io::Error) -> Verdict {
        DefaultClassifier.classify(Err::<&(), _>(&e))
    }

    #[test]
    fn io_kinds_alone_never_release() {
        for kind in [
            io::ErrorKind::HostUnreachable,
            io::ErrorKind::NetworkUnreachable,
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::AddrNotAvailable,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            assert_eq!(verdict(io::Error::from(kind)), Verdict::Unknown, "{kind:?}");
        }
    }

    #[test]
    fn a_not_sent_anywhere_in_the_chain_releases() {
        let inner = io::Error::other(NotSent::new("no route"));
        let boxed: BoxError = Box::new(io::Error::other(inner));
        assert_eq!(
            DefaultClassifier.classify(Err::<&(), _>(&boxed)),
            Verdict::Failed { retryable: true }
        );
    }
}
