//! Why the door did not let a message through, and whether the broker should try again.

use crate::engine::Verdict;
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
    /// The handler returned an error. The [classifier](super::MessageIdempotencyLayer::classify)
    /// decides the rest. By default the key is released and the error is retryable. With
    /// [`Verdict::Fail`](crate::engine::Verdict::Fail) it is not retryable: dead-letter it.
    /// With [`Verdict::Hold`](crate::engine::Verdict::Hold) the key stays pending, and
    /// [`MessageError::retry_after`] says for how long.
    Work,
    /// A repeat of a message still being handled, refused after
    /// [`wait_in_flight`](super::MessageIdempotencyLayer::wait_in_flight). Retryable, after
    /// [`MessageError::retry_after`].
    InFlight,
    /// The store could not claim the key. The handler did not run. Retryable.
    Store,
    /// The message has no key, and keys are required. Refused so that it dead-letters
    /// instead of running unprotected. Not retryable.
    KeyMissing,
    /// The message carries a key that is not valid. Not retryable.
    KeyInvalid,
    /// The key was used by a different message for the same consumer. A key is scoped by
    /// the consumer, not by the topic. Not retryable: the producer reused a key.
    KeyReused,
    /// The record under the key failed validation, so it is not used. Not retryable.
    RecordInvalid,
}

impl MessageErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::InFlight => "idempotency.in_flight",
            Self::Store => "idempotency.store_failed",
            Self::KeyMissing => "idempotency.key_missing",
            Self::KeyInvalid => "idempotency.key_invalid",
            Self::KeyReused => "idempotency.key_reused",
            Self::RecordInvalid => "idempotency.record_invalid",
        }
    }
}

/// The door refused or failed a message.
///
/// The handler's own error comes back with [`into_inner`](Self::into_inner). The store's and
/// the key's errors are its [`source`](StdError::source).
pub struct MessageError<E> {
    inner: Inner<E>,
}

enum Inner<E> {
    /// The handler's error, the verdict its key was settled with, and for a hold how long
    /// the key stays claimed.
    Handler(E, Verdict, Option<Duration>),
    InFlight(Duration),
    Store(StoreError),
    KeyMissing,
    KeyInvalid(KeyError),
    KeyReused,
    RecordInvalid(Option<RecordError>),
}

impl<E> MessageError<E> {
    /// A handler's error, settled with `verdict`; `held` is how long a hold keeps the key.
    pub(crate) fn handler(e: E, verdict: Verdict, held: Option<Duration>) -> Self {
        Self {
            inner: Inner::Handler(e, verdict, held),
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
            Inner::Handler(..) => MessageErrorKind::Work,
            Inner::InFlight(_) => MessageErrorKind::InFlight,
            Inner::Store(_) => MessageErrorKind::Store,
            Inner::KeyMissing => MessageErrorKind::KeyMissing,
            Inner::KeyInvalid(_) => MessageErrorKind::KeyInvalid,
            Inner::KeyReused => MessageErrorKind::KeyReused,
            Inner::RecordInvalid(_) => MessageErrorKind::RecordInvalid,
        }
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// Whether a redelivery may succeed.
    ///
    /// True for a handler's error whose key was released or held, a message in flight and a
    /// store failure. The others fail the same way every time: dead-letter them.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.inner,
            Inner::Handler(_, Verdict::Release | Verdict::Hold, _)
                | Inner::InFlight(_)
                | Inner::Store(_)
        )
    }

    /// How long to wait before a redelivery, when the key is still pending.
    ///
    /// For a message in flight: the lease the first delivery's claim has left, at most a
    /// third of the engine's lease. A running claim is renewed every third of the lease, so
    /// the cap keeps the wait to one renewal period: 20 s for the default 60 s lease. A
    /// claim whose consumer is gone lapses within it. For a handler's error whose key was
    /// held: the engine's lease. `None` for every other error.
    ///
    /// Adapters that count deliveries start lower and grow toward it, as the
    /// [`nats`](super::nats) adapter does.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self.inner {
            Inner::InFlight(d) | Inner::Handler(_, Verdict::Hold, Some(d)) => Some(d),
            _ => None,
        }
    }

    /// The handler's error, if that is what this is.
    #[must_use]
    pub fn get_ref(&self) -> Option<&E> {
        match &self.inner {
            Inner::Handler(e, ..) => Some(e),
            _ => None,
        }
    }

    /// The handler's error, if that is what this is.
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self.inner {
            Inner::Handler(e, ..) => Some(e),
            _ => None,
        }
    }

    /// The handler's error as `Err`, or this error as one that holds no handler error.
    /// For adapters whose handler errors do not implement `Error`. Ask
    /// [`is_retryable`](Self::is_retryable) first: the handler's error comes back bare.
    #[cfg(feature = "apalis")]
    pub(crate) fn split_handler(self) -> Result<MessageError<std::convert::Infallible>, E> {
        let inner = match self.inner {
            Inner::Handler(e, ..) => return Err(e),
            Inner::InFlight(d) => Inner::InFlight(d),
            Inner::Store(e) => Inner::Store(e),
            Inner::KeyMissing => Inner::KeyMissing,
            Inner::KeyInvalid(e) => Inner::KeyInvalid(e),
            Inner::KeyReused => Inner::KeyReused,
            Inner::RecordInvalid(e) => Inner::RecordInvalid(e),
        };
        Ok(MessageError { inner })
    }
}

impl<E: fmt::Debug> fmt::Debug for MessageError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("MessageError");
        d.field("kind", &self.kind());
        match &self.inner {
            Inner::Handler(e, verdict, _) => d.field("handler", e).field("verdict", verdict),
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
            Inner::Handler(e, Verdict::Record, _) => {
                write!(f, "the message handler failed; recorded as done: {e}")
            }
            Inner::Handler(e, Verdict::Fail, _) => {
                write!(f, "the message handler failed for good: {e}")
            }
            Inner::Handler(e, Verdict::Hold, _) => write!(
                f,
                "the message handler failed and may have had its effect; its key is held: {e}"
            ),
            // `Release`, and any verdict added later.
            Inner::Handler(e, ..) => write!(f, "the message handler failed: {e}"),
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
            Inner::Handler(e, ..) => Some(e),
            Inner::Store(e) => Some(e),
            Inner::KeyInvalid(e) => Some(e),
            Inner::RecordInvalid(Some(e)) => Some(e),
            _ => None,
        }
    }
}
