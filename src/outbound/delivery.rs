//! What a send did: the answer of the door, and its errors.

use crate::engine::key::KeyError;
use crate::engine::record::RecordError;
use crate::store::StoreError;
use std::error::Error as StdError;
use std::fmt;

/// What became of a send through the door: the `Ok` of [`SendOnce`](super::SendOnce).
///
/// A send that went through the door is answered for the verdict its key was settled with:
/// `Recorded`, `Released`, `Failed` or `Held`, one per [`Verdict`](crate::engine::Verdict).
///
/// | variant | sent now | key |
/// | --- | --- | --- |
/// | `Recorded` | yes | completed with the receipt |
/// | `Released` | no: the provider answered and took nothing; a retry may succeed | released |
/// | `Failed` | no: the provider answered and took nothing; a retry fails the same way | released |
/// | `Held` | maybe | its claim held for the hold time |
/// | `Untracked` | yes, without de-duplication: the request had no key | none |
/// | `Replayed` | no: an earlier send under the key went | unchanged |
/// | `InFlight` | no: another send under the key is running now, or may have gone and is held | unchanged |
///
/// `InFlight` and `Held` are not errors to retry at once: the message may be on its way.
/// After `InFlight`, try again shortly, or let the door
/// [wait](super::SendOnceLayer::wait_in_flight); a held key stays in flight for the hold
/// time. After `Held`, check with the provider, or try again after the hold time.
#[derive(Debug)]
#[non_exhaustive]
pub enum Delivery<R, E> {
    /// The message went now; its receipt was recorded under the key. A receipt over the
    /// engine's record limit with no fitted form is not: the key is held for the hold time.
    Recorded(R),
    /// The provider answered that it took nothing, and the classifier gave `Release`: a
    /// 429, a 503 with `Retry-After`, an SMTP 4xx. The key was released: the same request
    /// may succeed later.
    Released(R),
    /// The provider answered that it took nothing, and the classifier gave `Fail`: a 4xx, an
    /// SMTP 5xx reply. The key was released; the same request fails the same way.
    Failed(R),
    /// This send may have gone. Its claim is held for the hold time: a repeat meanwhile is
    /// answered [`InFlight`](Delivery::InFlight) and sends nothing.
    Held(Unknown<R, E>),
    /// The message went now, without de-duplication. The request had no key: nothing was
    /// claimed or recorded, and a repeat sends again. Refuse such requests with
    /// [`require_key`](super::SendOnceLayer::require_key).
    Untracked(R),
    /// An earlier send under this key went: its receipt. Nothing was sent now.
    Replayed(R),
    /// Another send under this key is running now, or may have gone and its key is held.
    /// Nothing was sent now.
    InFlight,
}

impl<R, E> Delivery<R, E> {
    /// The receipt, when the message went, now or before.
    #[must_use]
    pub fn receipt(&self) -> Option<&R> {
        match self {
            Self::Recorded(r) | Self::Untracked(r) | Self::Replayed(r) => Some(r),
            _ => None,
        }
    }

    /// The receipt, when the message went, now or before.
    #[must_use]
    pub fn into_receipt(self) -> Option<R> {
        match self {
            Self::Recorded(r) | Self::Untracked(r) | Self::Replayed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether this call sent the message: `Recorded` or `Untracked`.
    #[must_use]
    pub fn is_sent(&self) -> bool {
        matches!(self, Self::Recorded(_) | Self::Untracked(_))
    }

    /// Whether the message may be on its way without a receipt: `InFlight` or `Held`.
    #[must_use]
    pub fn is_unknown(&self) -> bool {
        matches!(self, Self::InFlight | Self::Held(_))
    }
}

/// Why the delivery of a send is unknown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unknown<R, E> {
    /// The provider answered in a way that does not say: an HTTP 500, 502 or 504, or a 503
    /// without `Retry-After`.
    Response(R),
    /// The exchange failed after it may have reached the provider: a timeout after the
    /// request was written, a connection reset mid-exchange.
    Error(E),
}

/// Why a send through the door failed. Nothing was sent in any case.
///
/// Read it with [`kind`](Self::kind). The inner service's error comes back with
/// [`into_inner`](Self::into_inner); the store's and the key's are the
/// [`source`](StdError::source).
#[derive(Debug)]
pub struct OutboundError<E> {
    inner: Inner<E>,
}

#[derive(Debug)]
enum Inner<E> {
    Failed { error: E, retryable: bool },
    KeyInvalid(KeyError),
    KeyMissing,
    KeyReused,
    Store(StoreError),
    RecordInvalid(RecordError),
}

/// What kind of [`OutboundError`] this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutboundErrorKind {
    /// The inner service failed before anything could go: its client's connect stage failed.
    /// The key was released. [`OutboundError::is_retryable`] says if a retry may succeed.
    Work,
    /// The request's key is not a valid idempotency key.
    KeyInvalid,
    /// The request has no key, and the door
    /// [requires one](super::SendOnceLayer::require_key).
    KeyMissing,
    /// The key was used before for a different request.
    KeyReused,
    /// The store failed to claim the key. Retryable.
    Store,
    /// The record under the key is not a receipt this door can read. It is not replayed.
    RecordInvalid,
}

impl OutboundErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::KeyInvalid => "idempotency.key_invalid",
            Self::KeyMissing => "idempotency.key_missing",
            Self::KeyReused => "idempotency.key_reused",
            Self::Store => "idempotency.store_failed",
            Self::RecordInvalid => "idempotency.record_invalid",
        }
    }
}

impl<E> OutboundError<E> {
    pub(crate) fn failed(error: E, retryable: bool) -> Self {
        Self {
            inner: Inner::Failed { error, retryable },
        }
    }

    pub(crate) fn key_invalid(e: KeyError) -> Self {
        Self {
            inner: Inner::KeyInvalid(e),
        }
    }

    pub(crate) fn key_missing() -> Self {
        Self {
            inner: Inner::KeyMissing,
        }
    }

    pub(crate) fn key_reused() -> Self {
        Self {
            inner: Inner::KeyReused,
        }
    }

    pub(crate) fn store(e: StoreError) -> Self {
        Self {
            inner: Inner::Store(e),
        }
    }

    pub(crate) fn record_invalid(e: RecordError) -> Self {
        Self {
            inner: Inner::RecordInvalid(e),
        }
    }

    /// What kind of error this is.
    #[must_use]
    pub fn kind(&self) -> OutboundErrorKind {
        match &self.inner {
            Inner::Failed { .. } => OutboundErrorKind::Work,
            Inner::KeyInvalid(_) => OutboundErrorKind::KeyInvalid,
            Inner::KeyMissing => OutboundErrorKind::KeyMissing,
            Inner::KeyReused => OutboundErrorKind::KeyReused,
            Inner::Store(_) => OutboundErrorKind::Store,
            Inner::RecordInvalid(_) => OutboundErrorKind::RecordInvalid,
        }
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// Whether sending the same request again may succeed. True for a retryable failure of
    /// the inner service, and for a store that failed to claim the key.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match &self.inner {
            Inner::Failed { retryable, .. } => *retryable,
            Inner::Store(_) => true,
            _ => false,
        }
    }

    /// The inner service's error, when that is what failed.
    #[must_use]
    pub fn get_ref(&self) -> Option<&E> {
        match &self.inner {
            Inner::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The inner service's error, when that is what failed.
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self.inner {
            Inner::Failed { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Failed { error, .. } => write!(f, "the send failed, nothing went: {error}"),
            Inner::KeyInvalid(e) => write!(f, "idempotency.key_invalid: {e}"),
            Inner::KeyMissing => {
                f.write_str("idempotency.key_missing: the request has no key; nothing was sent")
            }
            Inner::KeyReused => f.write_str(
                "idempotency.key_reused: the key was used before for a different request",
            ),
            Inner::Store(e) => write!(f, "idempotency.store_failed: {e}; nothing was sent"),
            Inner::RecordInvalid(e) => write!(f, "idempotency.record_invalid: {e}"),
        }
    }
}

impl<E: StdError + 'static> StdError for OutboundError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.inner {
            Inner::Failed { error, .. } => Some(error),
            Inner::KeyInvalid(e) => Some(e),
            Inner::KeyMissing | Inner::KeyReused => None,
            Inner::Store(e) => Some(e),
            Inner::RecordInvalid(e) => Some(e),
        }
    }
}
