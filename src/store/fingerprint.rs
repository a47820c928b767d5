//! The request fingerprint: tells a repeat of a request from another request under the same key.
//!
//! A fingerprint is a SHA-256 over length-prefixed fields, domain-separated from every other
//! hash the crate makes, so no two field lists can produce the same input.

use sha2::{Digest, Sha256};
use std::fmt;

const DOMAIN: &[u8] = b"tower-idempotency/fingerprint/v1";

/// A 32-byte digest of the parts of a request that must match for a repeat to be a replay.
///
/// ```
/// use tower_idempotency::engine::Fingerprint;
///
/// let a = Fingerprint::builder().field(b"POST").field(b"/orders").finish();
/// let b = Fingerprint::builder().field(b"POST/").field(b"orders").finish();
/// assert_ne!(a, b, "fields are length-prefixed");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Starts a fingerprint over a sequence of fields.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder::new()
    }

    /// A fingerprint from its 32 bytes (as a store returns them).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes of the digest.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…)")
    }
}

/// Builds a [`Fingerprint`] one length-prefixed field at a time.
#[derive(Clone)]
#[must_use]
pub struct FingerprintBuilder {
    hasher: Sha256,
}

impl fmt::Debug for FingerprintBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FingerprintBuilder").finish_non_exhaustive()
    }
}

impl FingerprintBuilder {
    fn new() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN);
        Self { hasher }
    }

    /// Adds one field (its length first, so field boundaries cannot shift).
    pub fn field(mut self, bytes: &[u8]) -> Self {
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
        self
    }

    /// Adds one field made of several chunks (a body in pieces), hashing each once.
    pub fn field_chunks<'a>(mut self, chunks: impl IntoIterator<Item = &'a [u8]> + Clone) -> Self {
        let len: usize = chunks.clone().into_iter().map(<[u8]>::len).sum();
        self.hasher.update((len as u64).to_be_bytes());
        for c in chunks {
            self.hasher.update(c);
        }
        self
    }

    /// Adds one field of `len` bytes that `write` feeds in pieces; it must feed exactly `len`.
    #[cfg(feature = "json")]
    pub(crate) fn field_from(mut self, len: u64, write: impl FnOnce(&mut Gather<'_>)) -> Self {
        self.hasher.update(len.to_be_bytes());
        let mut gather = Gather {
            hasher: &mut self.hasher,
            buf: [0; 256],
            filled: 0,
            written: 0,
        };
        write(&mut gather);
        gather.flush();
        debug_assert_eq!(
            gather.written, len,
            "a field fed other than its declared length"
        );
        self
    }

    /// The finished fingerprint.
    #[must_use]
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.hasher.finalize().into())
    }
}

/// Gathers the small pieces of a field on the stack: one hash update per piece would cost more
/// than the piece.
#[cfg(feature = "json")]
pub(crate) struct Gather<'a> {
    hasher: &'a mut Sha256,
    buf: [u8; 256],
    filled: usize,
    written: u64,
}

#[cfg(feature = "json")]
impl Gather<'_> {
    #[inline]
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        self.written += bytes.len() as u64;
        if self.filled + bytes.len() > self.buf.len() {
            self.flush();
        }
        if bytes.len() > self.buf.len() {
            self.hasher.update(bytes);
        } else {
            self.buf[self.filled..self.filled + bytes.len()].copy_from_slice(bytes);
            self.filled += bytes.len();
        }
    }

    fn flush(&mut self) {
        self.hasher.update(&self.buf[..self.filled]);
        self.filled = 0;
    }
}
