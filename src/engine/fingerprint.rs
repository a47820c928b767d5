//! The request fingerprint: tells a repeat of a request from another request under the same key.
//!
//! A fingerprint is a SHA-256 over length-prefixed fields, domain-separated from every other
//! hash the crate makes, so no two field lists can produce the same input.

use crate::json::Canonical;
use sha2::{Digest, Sha256};
use std::fmt;

const DOMAIN: &[u8] = b"tower-idempotency/fingerprint/v1";

/// The field before a JSON value's canonical form, so that no raw field list produces the same
/// hash input as a JSON value.
const JSON_VALUE_TAG: &[u8] = b"json-value/v1";

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

    /// Adds a JSON text by its value, not its bytes: insignificant whitespace and the order of
    /// object members are ignored and string escapes decoded, while array order, every value
    /// and type, and each number's literal text (`1` and `1.0` differ) count. A name repeated
    /// in one object keeps its members in their order. A text that is not strict JSON
    /// (RFC 8259, UTF-8, nested at most 128 deep) is added as [`field`](Self::field) adds it.
    ///
    /// This is what [`IdempotencyLayer::fingerprint_json_by_value`] does with a JSON body, for
    /// a [`fingerprint_fn`] of your own. The canonical form is streamed into the hash (a tag
    /// field, then one field), never built whole.
    ///
    /// [`IdempotencyLayer::fingerprint_json_by_value`]: crate::http::IdempotencyLayer::fingerprint_json_by_value
    /// [`fingerprint_fn`]: crate::http::IdempotencyLayer::fingerprint_fn
    ///
    /// ```
    /// use tower_idempotency::engine::Fingerprint;
    ///
    /// let fp = |json: &str| Fingerprint::builder().json_value(json.as_bytes()).finish();
    /// assert_eq!(fp(r#"{"item": "book", "qty": 1}"#), fp(r#"{"qty":1,"item":"b\u006fok"}"#));
    /// assert_ne!(fp(r#"{"qty":1}"#), fp(r#"{"qty":1.0}"#));
    /// assert_ne!(fp(r#"{"qty":1}"#), Fingerprint::builder().field(br#"{"qty":1}"#).finish());
    /// ```
    pub fn json_value(self, json: &[u8]) -> Self {
        match Canonical::parse(json) {
            Some(value) => self
                .field(JSON_VALUE_TAG)
                .field_from(value.encoded_len(), |g| {
                    value.encode(|bytes| g.write(bytes))
                }),
            None => self.field(json),
        }
    }

    /// As [`json_value`](Self::json_value), over only what `include` points at (when not
    /// empty) and without what `exclude` points at. An excluded array item leaves a mark in
    /// its place, so every pointer reads the body's own indices. A body that is not JSON: its
    /// bytes.
    pub(crate) fn json_filtered(
        self,
        json: &[u8],
        include: &[crate::json::JsonField],
        exclude: &[crate::json::JsonField],
    ) -> Self {
        let Some(value) = Canonical::parse(json) else {
            return self.field(json);
        };
        let value = value.without(exclude);
        let value = if include.is_empty() {
            value
        } else {
            value.only(include)
        };
        self.field(JSON_VALUE_TAG)
            .field_from(value.encoded_len(), |g| {
                value.encode(|bytes| g.write(bytes))
            })
    }

    /// Adds one field of `len` bytes that `write` feeds in pieces; it must feed exactly `len`.
    fn field_from(mut self, len: u64, write: impl FnOnce(&mut Gather<'_>)) -> Self {
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
struct Gather<'a> {
    hasher: &'a mut Sha256,
    buf: [u8; 256],
    filled: usize,
    written: u64,
}

impl Gather<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
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
