//! Why the door did not let a message through, and whether the broker should try again.

use crate::engine::key::KeyError;
use crate::engine::record::RecordError;
use crate::store::StoreError;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// What kind of [`MessageError`] this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageErrorKind {
    /// The handler returned an error; the key was released. Retryable (redeliver), unless the
    /// layer's [`permanent_errors`](super::MessageIdempotencyLayer::permanent_errors)
    /// classifier calls it permanent: then [`MessageError::is_retryable`] is false and
    /// [`MessageError::is_permanent`] true (dead-letter it).
    Handler,
    /// A duplicate of a message still in progress, under [`InProgress::Reject`](super::InProgress::Reject)
    /// or past the bound of [`InProgress::Wait`](super::InProgress::Wait) (retryable, after
    /// [`MessageError::retry_after`]).
    InFlight,
    /// The store could not claim the key; the handler did not run (retryable).
    Store,
    /// The message is on a listed topic, has no key, and keys are required: refused so it
    /// dead-letters instead of running unprotected (not retryable).
    KeyMissing,
    /// The message carries a key that is not valid (not retryable).
    KeyInvalid,
    /// The key was used by a different message (another topic, schema version or body) for
    /// the same consumer: a key is scoped by the consumer, not by the topic (not retryable:
    /// the producer reused a key).
    KeyReused,
    /// The record of a completed duplicate failed validation or did not decode; it is never
    /// used (not retryable).
    RecordInvalid,
}

/// The door refused or failed a message. The handler's own error is kept, as are the store's
/// and the key's as [`source`](StdError::source).
pub struct MessageError<E> {
    inner: Inner<E>,
}

enum Inner<E> {
    /// The error, and whether the layer's classifier calls it permanent.
    Handler(E, bool),
    InFlight(Duration),
    Store(StoreError),
    KeyMissing,
    KeyInvalid(KeyError),
    KeyReused,
    RecordInvalid(Option<RecordError>),
}

impl<E> MessageError<E> {
    pub(crate) fn handler(e: E) -> Self {
        Self {
            inner: Inner::Handler(e, false),
        }
    }

    /// The handler's error, called permanent (`true`) or retryable by the layer's classifier.
    pub(crate) fn handler_classified(e: E, permanent: bool) -> Self {
        Self {
            inner: Inner::Handler(e, permanent),
        }
    }

    pub(crate) fn in_flight(retry_after: Duration) -> Self {
        Self {
            inner: Inner::InFlight(retry_after),
        }
    }

    pub(crate) fn store(e: StoreError) -> Self {
        Self {
            inner: Inner::Store(e),
        }
    }

    pub(crate) fn key_missing() -> Self {
        Self {
            inner: Inner::KeyMissing,
        }
    }

    pub(crate) fn key_invalid(e: KeyError) -> Self {
        Self {
            inner: Inner::KeyInvalid(e),
        }
    }

    pub(crate) fn key_reused() -> Self {
        Self {
            inner: Inner::KeyReused,
        }
    }

    pub(crate) fn record_invalid(e: Option<RecordError>) -> Self {
        Self {
            inner: Inner::RecordInvalid(e),
        }
    }

    /// What kind of error this is.
    #[must_use]
    pub fn kind(&self) -> MessageErrorKind {
        match &self.inner {
            Inner::Handler(..) => MessageErrorKind::Handler,
            Inner::InFlight(_) => MessageErrorKind::InFlight,
            Inner::Store(_) => MessageErrorKind::Store,
            Inner::KeyMissing => MessageErrorKind::KeyMissing,
            Inner::KeyInvalid(_) => MessageErrorKind::KeyInvalid,
            Inner::KeyReused => MessageErrorKind::KeyReused,
            Inner::RecordInvalid(_) => MessageErrorKind::RecordInvalid,
        }
    }

    /// Whether a redelivery may succeed: the handler's error (unless called permanent), a
    /// message in flight, a store failure. The others will fail the same way every time:
    /// dead-letter them.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.inner,
            Inner::Handler(_, false) | Inner::InFlight(_) | Inner::Store(_)
        )
    }

    /// Whether this is a handler error that the layer's
    /// [`permanent_errors`](super::MessageIdempotencyLayer::permanent_errors) classifier
    /// calls permanent: the key was released, and a redelivery would fail the same way.
    /// Adapters dead-letter it (JetStream: `Term`; apalis: abort) instead of retrying.
    #[must_use]
    pub fn is_permanent(&self) -> bool {
        matches!(self.inner, Inner::Handler(_, true))
    }

    /// For a message in flight: how long to wait before redelivering, at most a third of the
    /// engine's lease. The lease the first delivery's claim has left, when that is shorter
    /// (a claim whose consumer is gone lapses then); a running claim is renewed every third of
    /// the lease, so its lease left says nothing about when it ends, and the cap keeps the
    /// wait to one renewal period (20 s for the default 60 s lease). A third of the lease when
    /// the store cannot tell. Adapters that count deliveries start lower and grow toward it
    /// (the [`jetstream`](super::jetstream) adapter does).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self.inner {
            Inner::InFlight(d) => Some(d),
            _ => None,
        }
    }

    /// The handler's error, if that is what this is.
    #[must_use]
    pub fn handler_error(&self) -> Option<&E> {
        match &self.inner {
            Inner::Handler(e, _) => Some(e),
            _ => None,
        }
    }

    /// The handler's error, or this error back.
    ///
    /// # Errors
    /// `self`, when it is not the handler's error.
    pub fn into_handler_error(self) -> Result<E, Self> {
        match self.inner {
            Inner::Handler(e, _) => Ok(e),
            inner => Err(Self { inner }),
        }
    }

    /// The handler's error as `Err`, or this error as a door error that holds no handler
    /// error (for adapters whose handler errors do not implement `Error`). Ask
    /// [`is_permanent`](Self::is_permanent) first: the handler's error comes back bare.
    #[cfg(feature = "apalis")]
    pub(crate) fn split_handler(self) -> Result<MessageError<std::convert::Infallible>, E> {
        let inner = match self.inner {
            Inner::Handler(e, _) => return Err(e),
            Inner::InFlight(d) => Inner::InFlight(d),
            Inner::Store(e) => Inner::Store(e),
            Inner::KeyMissing => Inner::KeyMissing,
            Inner::KeyInvalid(e) => Inner::KeyInvalid(e),
            Inner::KeyReused => Inner::KeyReused,
            Inner::RecordInvalid(e) => Inner::RecordInvalid(e),
        };
        Ok(MessageError { inner })
    }

    /// The store's error, if that is what this is.
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.inner {
            Inner::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for MessageError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("MessageError");
        d.field("kind", &self.kind());
        match &self.inner {
            Inner::Handler(e, permanent) => d.field("handler", e).field("permanent", permanent),
            Inner::InFlight(after) => d.field("retry_after", after),
            Inner::Store(e) => d.field("store", e),
            Inner::KeyInvalid(e) => d.field("key", e),
            Inner::RecordInvalid(e) => d.field("record", e),
            Inner::KeyMissing | Inner::KeyReused => &mut d,
        };
        d.finish()
    }
}

impl<E: fmt::Display> fmt::Display for MessageError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Handler(e, false) => write!(f, "the message handler failed: {e}"),
            Inner::Handler(e, true) => write!(f, "the message handler failed for good: {e}"),
            Inner::InFlight(after) => write!(
                f,
                "a delivery of this message is still being handled; retry after {after:?}"
            ),
            Inner::Store(_) => f.write_str("the idempotency store could not claim the message"),
            Inner::KeyMissing => f.write_str("the message has no idempotency key"),
            Inner::KeyInvalid(_) => f.write_str("the message's idempotency key is not valid"),
            Inner::KeyReused => {
                f.write_str("the message's idempotency key was used by a different message")
            }
            Inner::RecordInvalid(_) => {
                f.write_str("the record of this message's first run failed validation")
            }
        }
    }
}

impl<E: StdError + 'static> StdError for MessageError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.inner {
            Inner::Handler(e, _) => Some(e),
            Inner::Store(e) => Some(e),
            Inner::KeyInvalid(e) => Some(e),
            Inner::RecordInvalid(Some(e)) => Some(e),
            _ => None,
        }
    }
}
