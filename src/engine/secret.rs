//! Optional record authentication and fingerprint keying.
//!
//! Off by default. With a [`Secret`] configured on the engine:
//!
//! - every record carries an HMAC-SHA256 tag over its content, its store key and its request
//!   fingerprint. A record written into the store by anyone without the secret is refused with
//!   503 `record_invalid`, never replayed. So is a record moved to another key;
//! - the fingerprint the store sees is keyed by the secret. So a low-entropy request body, such
//!   as a short code or a PIN, cannot be confirmed by brute force from a store dump.
//!
//! Every replica sharing a store must use the same secret. Changing it makes existing records
//! unreadable: they are answered 503 until they expire. Existing pending keys then look like
//! other requests, answered 422, until their lease ends.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::Fingerprint;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::sync::Arc;

type HmacSha256 = Hmac<Sha256>;

const FINGERPRINT_DOMAIN: &[u8] = b"tower-idempotency/keyed-fingerprint/v1";
const RECORD_DOMAIN: &[u8] = b"tower-idempotency/record-mac/v1";

/// The length of a record's authentication tag.
pub(crate) const TAG_LEN: usize = 32;

/// A secret key for record authentication and fingerprint keying, at least 32 bytes long.
///
/// Off by default. With a [`Secret`] configured on the engine:
///
/// - every record carries an HMAC-SHA256 tag over its content, its store key and its request
///   fingerprint. A record written into the store by anyone without the secret is refused with
///   503 `record_invalid`, never replayed. So is a record moved to another key;
/// - the fingerprint the store sees is keyed by the secret. So a low-entropy request body, such
///   as a short code or a PIN, cannot be confirmed by brute force from a store dump.
///
/// Every replica sharing a store must use the same secret. Changing it makes existing records
/// unreadable: they are answered 503 until they expire. Existing pending keys then look like
/// other requests, answered 422, until their lease ends.
///
/// ```
/// use tower_idempotency::Secret;
///
/// let secret = Secret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
/// assert!(Secret::new(b"short".to_vec()).is_err());
/// ```
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// The shortest secret accepted, in bytes.
    pub const MIN_LEN: usize = 32;

    /// A secret from key material, such as 32 random bytes from your secret manager.
    ///
    /// # Errors
    /// A [`ConfigError`] of kind [`SecretTooShort`](ConfigErrorKind::SecretTooShort) when
    /// the key is shorter than [`Secret::MIN_LEN`] bytes.
    pub fn new(key: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let key = key.into();
        if key.len() < Self::MIN_LEN {
            return Err(ConfigError::new(
                ConfigErrorKind::SecretTooShort,
                format!(
                    "the idempotency secret has {} bytes; at least {} are required",
                    key.len(),
                    Self::MIN_LEN
                ),
            ));
        }
        Ok(Self(key.into()))
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
        <HmacSha256 as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
    }

    /// The fingerprint as the store sees it: HMAC of the plain fingerprint.
    pub(crate) fn key_fingerprint(&self, fp: &Fingerprint) -> Fingerprint {
        let mut m = self.mac();
        m.update(FINGERPRINT_DOMAIN);
        m.update(fp.as_bytes());
        Fingerprint::from_bytes(m.finalize().into_bytes().into())
    }

    fn record_mac(&self, key_id: &[u8; 32], fp: &Fingerprint, content: &[u8]) -> HmacSha256 {
        let mut m = self.mac();
        m.update(RECORD_DOMAIN);
        m.update(key_id);
        m.update(fp.as_bytes());
        m.update(content);
        m
    }

    /// The tag of a record's content under its store key and fingerprint.
    pub(crate) fn tag(&self, key_id: &[u8; 32], fp: &Fingerprint, content: &[u8]) -> [u8; TAG_LEN] {
        self.record_mac(key_id, fp, content)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a tag in constant time.
    pub(crate) fn verify(
        &self,
        key_id: &[u8; 32],
        fp: &Fingerprint,
        content: &[u8],
        tag: &[u8],
    ) -> bool {
        self.record_mac(key_id, fp, content)
            .verify_slice(tag)
            .is_ok()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}
