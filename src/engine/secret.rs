//! Optional record authentication, fingerprint and store key keying. See [`Secret`].

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::Fingerprint;
use crate::store::StoreKey;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;
use std::sync::Arc;

type HmacSha256 = Hmac<Sha256>;

const FINGERPRINT_DOMAIN: &[u8] = b"tower-idempotency/keyed-fingerprint/v1";
const RECORD_DOMAIN: &[u8] = b"tower-idempotency/record-mac/v1";
/// Derives the key of store keys from the secret's material.
const STORE_KEY_KEY_DOMAIN: &[u8] = b"tower-idempotency/store-key-key/v1";
const KEYED_SCOPE_DOMAIN: &[u8] = b"tower-idempotency/keyed-scope/v1";
const KEYED_ID_DOMAIN: &[u8] = b"tower-idempotency/keyed-id/v1";

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
///   as a short code or a PIN, cannot be confirmed by brute force from a store dump;
/// - the store key is keyed too: an HMAC of the plain store key under a key derived from the
///   secret, apart from the record and fingerprint keys. So who reads the store cannot tell
///   whether a record is for a given key, principal or namespace by deriving its store key.
///   Derive keys with [`Engine::store_key`](crate::engine::Engine::store_key) when using the
///   engine directly.
///
/// Every replica sharing a store must use the same secret. To change it, make the new one
/// with [`Secret::rotated`]: it keeps the store keys, so records written under the old secret
/// are still found, and refused until they expire, never run again: a completed record or a
/// pending key is answered 422 (its fingerprint was keyed by the old secret), recorded steps
/// 503 `record_invalid`. A secret made anew with [`Secret::new`] changes the store keys as well: records
/// written under the old one are no longer found, and a retry of a request made before the
/// change runs its work again. Make that change only when no such retry can come.
///
/// ```
/// use tower_idempotency::Secret;
///
/// let secret = Secret::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
/// assert!(Secret::new(b"short".to_vec()).is_err());
/// ```
#[derive(Clone)]
pub struct Secret {
    /// Keys the records' tags and the fingerprints.
    key: Arc<[u8]>,
    /// Keys the store keys: derived from the first secret, kept by [`Secret::rotated`].
    store_keys: [u8; 32],
}

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
        let mut m = hmac_of(&key);
        m.update(STORE_KEY_KEY_DOMAIN);
        let store_keys = m.finalize().into_bytes().into();
        Ok(Self {
            key: key.into(),
            store_keys,
        })
    }

    /// A new secret that authenticates records and keys fingerprints with `key`, and keeps the
    /// store keys of this one. This is how to change the secret without changing where records
    /// are found: a retry of a request made under the old secret still finds its record, and
    /// is refused (422, or 503 for its recorded steps), never run again.
    ///
    /// [`Secret::new`] with new material changes the store keys too: records written under
    /// the old secret are no longer found, and a retry of a request made before the change
    /// runs its work again. Change the secret that way only when no such retry can come: after
    /// the retention has passed with the store drained, or on a store emptied for the change.
    ///
    /// ```
    /// use tower_idempotency::Secret;
    ///
    /// let first = Secret::new([1u8; 32].to_vec())?;
    /// let second = first.rotated([2u8; 32].to_vec())?;
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Secret::new`], for key material shorter than [`Secret::MIN_LEN`] bytes.
    pub fn rotated(&self, key: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        Ok(Self {
            store_keys: self.store_keys,
            ..Self::new(key)?
        })
    }

    fn mac(&self) -> HmacSha256 {
        hmac_of(&self.key)
    }

    /// The store key under this secret: each part of the plain key, HMAC-keyed with the store
    /// keys' key. The scope part stays one per scope, so stores still group a scope's keys.
    pub(crate) fn key_store_key(&self, plain: &StoreKey) -> StoreKey {
        let part = |domain: &[u8], bytes: &[u8; 32]| -> [u8; 32] {
            let mut m = hmac_of(&self.store_keys);
            m.update(domain);
            m.update(bytes);
            m.finalize().into_bytes().into()
        };
        StoreKey::from_parts(
            part(KEYED_SCOPE_DOMAIN, plain.scope_hash()),
            part(KEYED_ID_DOMAIN, plain.id()),
        )
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

fn hmac_of(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::key::IdempotencyKey;
    use crate::engine::scope::Scope;

    fn derive(secret: Option<&Secret>, principal: &str, key: &str) -> StoreKey {
        crate::engine::store_key(
            secret,
            "orders",
            &Scope::principal(principal),
            &IdempotencyKey::new(key).expect("valid"),
        )
    }

    /// With a secret, the store key is keyed: apart from the plain derivation and from another
    /// secret's; a rotated secret keeps its store keys; one scope keeps one scope part.
    #[test]
    fn the_store_key_is_keyed_under_the_secret() {
        let one = Secret::new([1u8; 32].to_vec()).expect("valid");
        let two = Secret::new([2u8; 32].to_vec()).expect("valid");
        let plain = derive(None, "alice", "k");
        let keyed = derive(Some(&one), "alice", "k");
        assert_ne!(keyed.id(), plain.id());
        assert_ne!(keyed.scope_hash(), plain.scope_hash());
        assert_ne!(keyed, derive(Some(&two), "alice", "k"));
        assert_eq!(keyed, derive(Some(&one), "alice", "k"), "stable");
        let rotated = one.rotated([3u8; 32].to_vec()).expect("valid");
        assert_eq!(
            keyed,
            derive(Some(&rotated), "alice", "k"),
            "rotation keeps it"
        );
        assert_ne!(
            rotated.key_fingerprint(&Fingerprint::from_bytes([0; 32])),
            one.key_fingerprint(&Fingerprint::from_bytes([0; 32])),
            "rotation changes the record and fingerprint keys"
        );
        let other = derive(Some(&one), "alice", "k2");
        assert_eq!(
            other.scope_hash(),
            keyed.scope_hash(),
            "one scope part per scope"
        );
        assert_ne!(other.id(), keyed.id());
        assert_ne!(
            derive(Some(&one), "bob", "k").scope_hash(),
            keyed.scope_hash()
        );
        // The store keys' key is not the record key: a tag made with one is not the other.
        assert_ne!(&one.store_keys[..], &one.key[..]);
    }
}
