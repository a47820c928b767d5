//! Whether a send went, failed before anything could go, or may have gone.

use crate::engine::{Classify, Verdict};
use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::io;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The classifier of the generic door.
///
/// A response is [`Verdict::Record`]: it went. An error is [`Verdict::Release`] only when
/// the client says it never sent (see [`NotSent`]). Any other error is [`Verdict::Hold`]: it
/// may have come after the request went.
///
/// I/O error kinds do not decide. Linux reports `EHOSTUNREACH`, `ENETUNREACH` and even
/// `ECONNREFUSED` on a connection that was already sending. A retry layer inside the door
/// may also end with a refused connection after an earlier attempt went.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl<R, E: 'static> Classify<Result<R, E>> for DefaultClassifier {
    fn classify(&self, result: &Result<R, E>) -> Verdict {
        match result {
            Ok(_) => Verdict::Record,
            Err(e) if never_sent_any(e) => Verdict::Release,
            Err(_) => Verdict::Hold,
        }
    }
}

/// An error that says nothing went out: the client failed in its own connect stage.
///
/// ```
/// use std::io;
/// use tower_idempotency::engine::{Classify, Verdict};
/// use tower_idempotency::outbound::{DefaultClassifier, NotSent};
///
/// let refused = io::Error::other(NotSent::new(io::Error::from(io::ErrorKind::ConnectionRefused)));
/// assert_eq!(DefaultClassifier.classify(&Err::<(), _>(refused)), Verdict::Release);
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert_eq!(DefaultClassifier.classify(&Err::<(), _>(reset)), Verdict::Hold);
/// ```
///
/// No connection, no TLS session, no name: no byte of the request was written. Return it
/// from a client of your own, or put it in your error's chain of sources. An `io::Error`
/// wrapping it counts too. The door's classifiers then release the key.
///
/// The door also reads the stage of the clients it knows. These are hyper-util's legacy
/// client (`Error::is_connect`, feature `hyper-util`) and reqwest (`Error::is_connect`,
/// feature `reqwest`). Keep retries outside the door: a retry layer inside it may end with a
/// connect error after an earlier attempt went.
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
        DefaultClassifier.classify(&Err::<(), _>(e))
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
            assert_eq!(verdict(io::Error::from(kind)), Verdict::Hold, "{kind:?}");
        }
    }

    #[test]
    fn a_not_sent_anywhere_in_the_chain_releases() {
        let inner = io::Error::other(NotSent::new("no route"));
        let boxed: BoxError = Box::new(io::Error::other(inner));
        assert_eq!(
            DefaultClassifier.classify(&Err::<(), _>(boxed)),
            Verdict::Release
        );
    }
}
