//! What a send did: the answer of the door, and its errors.

use crate::engine::key::KeyError;
use crate::engine::record::RecordError;
use crate::store::StoreError;
use std::error::Error as StdError;
use std::fmt;

/// What became of a send through the door (the `Ok` of [`SendOnce`](super::SendOnce)).
///
/// | variant | sent now | key |
/// | --- | --- | --- |
/// | `Sent` | yes | completed with the receipt |
/// | `SentWithoutKey` | yes, without de-duplication: the request had no key | none |
/// | `Replayed` | no: an earlier send under the key went | unchanged |
/// | `Rejected` | no: the provider answered and took nothing | released |
/// | `InFlight` | no: another send under the key is running now | unchanged |
/// | `Held` | no: an earlier send under the key may have gone, and no receipt is kept | unchanged |
/// | `Unknown` | maybe | held for the hold time |
///
/// `InFlight`, `Held` and `Unknown` are not errors to retry at once: the message may be on
/// its way. After `InFlight`, try again shortly (or let the door
/// [wait](super::SendOnceLayer::wait_in_flight)); after `Held` or `Unknown`, check with the
/// provider, or try again after the hold time.
#[derive(Debug)]
#[non_exhaustive]
pub enum Delivery<R, E> {
    /// The message went now; its receipt was recorded under the key.
    Sent(R),
    /// The message went now, without de-duplication: the request had no key, so nothing was
    /// claimed or recorded, and a repeat sends again. Refuse such requests with
    /// [`require_key`](super::SendOnceLayer::require_key).
    SentWithoutKey(R),
    /// An earlier send under this key went: its receipt. Nothing was sent now.
    Replayed(R),
    /// The provider answered that it took nothing (a 4xx, a 429, an SMTP 5xx reply to a command
    /// before the message, ...). The key was released: another send under it goes.
    Rejected {
        /// The provider's answer.
        response: R,
        /// Whether the same request may succeed later (429, 503 with `Retry-After`, SMTP 4xx).
        retryable: bool,
    },
    /// Another send under this key is running now. Nothing was sent now.
    InFlight,
    /// An earlier send under this key may have gone: its delivery was unknown (or its receipt
    /// could not be kept), and the key is held for the hold time. Nothing was sent now.
    Held,
    /// This send may have gone: the key is held for the hold time, so a retry meanwhile is
    /// answered [`Held`](Delivery::Held) and sends nothing.
    Unknown(Unknown<R, E>),
}

impl<R, E> Delivery<R, E> {
    /// The receipt, when the message went (now or before).
    #[must_use]
    pub fn receipt(&self) -> Option<&R> {
        match self {
            Self::Sent(r) | Self::SentWithoutKey(r) | Self::Replayed(r) => Some(r),
            _ => None,
        }
    }

    /// The receipt, when the message went (now or before).
    #[must_use]
    pub fn into_receipt(self) -> Option<R> {
        match self {
            Self::Sent(r) | Self::SentWithoutKey(r) | Self::Replayed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether this call sent the message (`Sent`, `SentWithoutKey`).
    #[must_use]
    pub fn is_sent(&self) -> bool {
        matches!(self, Self::Sent(_) | Self::SentWithoutKey(_))
    }

    /// Whether the message may be on its way without a receipt (`InFlight`, `Held`,
    /// `Unknown`).
    #[must_use]
    pub fn is_unknown(&self) -> bool {
        matches!(self, Self::InFlight | Self::Held | Self::Unknown(_))
    }
}

/// Why the delivery of a send is unknown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unknown<R, E> {
    /// The provider answered in a way that does not say (an HTTP 500, 502 or 504, a 503
    /// without `Retry-After`).
    Response(R),
    /// The exchange failed after it may have reached the provider (a timeout after the request
    /// was written, a connection reset mid-exchange).
    Error(E),
    /// A batch path returned fewer answers than requests: this one has none.
    NoAnswer,
}

/// Why a send through the door failed. Nothing was sent in any case.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboundError<E> {
    /// The inner service failed before anything could go (its client's connect stage failed);
    /// the key was released.
    Failed {
        /// The inner service's error.
        error: E,
        /// Whether the same request may succeed later.
        retryable: bool,
    },
    /// The request's key is not a valid idempotency key.
    KeyInvalid(KeyError),
    /// The request has no key, and the door [requires one](super::SendOnceLayer::require_key)
    /// (`idempotency.key_missing`).
    KeyMissing,
    /// The key was used before for a different request (`idempotency.key_reused`).
    KeyReused,
    /// The store failed to claim the key (`idempotency.store_failed`): retryable.
    Store(StoreError),
    /// The record found under the key is not a receipt this door can read
    /// (`idempotency.record_invalid`); it is not replayed.
    RecordInvalid(RecordError),
    /// A repeat, in the same batch, of a request whose send failed before anything went (its
    /// answer is the first one's `Failed` or `Rejected`). Its key is free.
    RepeatFailed {
        /// Whether sending the same request again may succeed.
        retryable: bool,
    },
}

/// The kind of an [`OutboundError`], without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutboundErrorKind {
    /// [`OutboundError::Failed`] and [`OutboundError::RepeatFailed`].
    Failed,
    /// [`OutboundError::KeyInvalid`].
    KeyInvalid,
    /// [`OutboundError::KeyMissing`].
    KeyMissing,
    /// [`OutboundError::KeyReused`].
    KeyReused,
    /// [`OutboundError::Store`].
    StoreFailed,
    /// [`OutboundError::RecordInvalid`].
    RecordInvalid,
}

impl<E> OutboundError<E> {
    /// The kind of failure.
    #[must_use]
    pub fn kind(&self) -> OutboundErrorKind {
        match self {
            Self::Failed { .. } | Self::RepeatFailed { .. } => OutboundErrorKind::Failed,
            Self::KeyInvalid(_) => OutboundErrorKind::KeyInvalid,
            Self::KeyMissing => OutboundErrorKind::KeyMissing,
            Self::KeyReused => OutboundErrorKind::KeyReused,
            Self::Store(_) => OutboundErrorKind::StoreFailed,
            Self::RecordInvalid(_) => OutboundErrorKind::RecordInvalid,
        }
    }

    /// Whether sending the same request again may succeed: a retryable failure of the inner
    /// service, or a store that failed to claim the key.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Failed { retryable, .. } | Self::RepeatFailed { retryable } => *retryable,
            Self::Store(_) => true,
            _ => false,
        }
    }

    /// The machine code of the case, as the HTTP layer's problem details name it
    /// (`idempotency.key_reused`, ...); `None` for the inner service's failure.
    #[must_use]
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::Failed { .. } | Self::RepeatFailed { .. } => None,
            Self::KeyInvalid(_) => Some("idempotency.key_invalid"),
            Self::KeyMissing => Some("idempotency.key_missing"),
            Self::KeyReused => Some("idempotency.key_reused"),
            Self::Store(_) => Some("idempotency.store_failed"),
            Self::RecordInvalid(_) => Some("idempotency.record_invalid"),
        }
    }
}

impl<E: fmt::Display> fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { error, .. } => write!(f, "the send failed, nothing went: {error}"),
            Self::KeyInvalid(e) => write!(f, "idempotency.key_invalid: {e}"),
            Self::KeyMissing => {
                f.write_str("idempotency.key_missing: the request has no key; nothing was sent")
            }
            Self::RepeatFailed { .. } => f.write_str(
                "a repeat in the batch of a request whose send failed; nothing was sent",
            ),
            Self::KeyReused => f.write_str(
                "idempotency.key_reused: the key was used before for a different request",
            ),
            Self::Store(e) => write!(f, "idempotency.store_failed: {e}; nothing was sent"),
            Self::RecordInvalid(e) => write!(f, "idempotency.record_invalid: {e}"),
        }
    }
}

impl<E: StdError + 'static> StdError for OutboundError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Failed { error, .. } => Some(error),
            Self::KeyInvalid(e) => Some(e),
            Self::KeyMissing | Self::RepeatFailed { .. } | Self::KeyReused => None,
            Self::Store(e) => Some(e),
            Self::RecordInvalid(e) => Some(e),
        }
    }
}
