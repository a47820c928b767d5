//! What an outgoing request is sent under: its key and its fingerprint.

use crate::engine::key::{IdempotencyKey, KeyError};
use crate::store::Fingerprint;

/// The key a request is sent under and the fingerprint that tells it from another request.
#[derive(Clone, Debug)]
pub struct Identity {
    key: IdempotencyKey,
    fingerprint: Fingerprint,
}

impl Identity {
    /// A request sent under `key`, told apart from another by `fingerprint`.
    #[must_use]
    pub fn new(key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self { key, fingerprint }
    }

    /// The common case: a key given as text and a fingerprint over `fields`.
    ///
    /// Each field is length-prefixed, so `["ab", "c"]` and `["a", "bc"]` differ.
    ///
    /// ```
    /// use tower_idempotency::outbound::Identity;
    ///
    /// let a = Identity::of("welcome:42", [b"alice@example.com".as_slice(), b"Welcome"]).unwrap();
    /// let b = Identity::of("welcome:42", [b"alice@example.com".as_slice(), b"Welcome!"]).unwrap();
    /// assert_eq!(a.key(), b.key());
    /// assert_ne!(a.fingerprint(), b.fingerprint());
    /// ```
    ///
    /// # Errors
    /// The key is not a valid idempotency key: empty, over 255 bytes, or with control
    /// characters.
    pub fn of<'a>(key: &str, fields: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, KeyError> {
        let key = IdempotencyKey::new(key)?;
        let fingerprint = fields
            .into_iter()
            .fold(Fingerprint::builder(), |b, f| b.field(f))
            .finish();
        Ok(Self::new(key, fingerprint))
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The fingerprint.
    #[must_use]
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }
}

/// Reads the [`Identity`] of an outgoing request.
///
/// ```
/// use tower_idempotency::outbound::{Identify, Identity};
///
/// struct Email { key: String, to: String, body: String }
///
/// let by_fields = |m: &Email| {
///     Identity::of(&m.key, [m.to.as_bytes(), m.body.as_bytes()]).map(Some)
/// };
/// let mail = Email { key: "k-1".into(), to: "a@example.com".into(), body: "hi".into() };
/// assert!(by_fields.identify(&mail).unwrap().is_some());
/// ```
///
/// Any `Fn(&Req) -> Result<Option<Identity>, KeyError>` is one. `Ok(None)` means the request
/// has no key: it is sent as it is, without de-duplication. An `Err` fails the send before
/// anything goes: [`KeyInvalid`](super::OutboundErrorKind::KeyInvalid).
pub trait Identify<Req> {
    /// The request's key and fingerprint, `None` when it has no key.
    ///
    /// # Errors
    /// The key the request carries is not a valid key.
    fn identify(&self, req: &Req) -> Result<Option<Identity>, KeyError>;
}

impl<Req, F> Identify<Req> for F
where
    F: Fn(&Req) -> Result<Option<Identity>, KeyError>,
{
    fn identify(&self, req: &Req) -> Result<Option<Identity>, KeyError> {
        self(req)
    }
}
