//! Optional record authentication, fingerprint and store key keying. See [`Secret`].

#[cfg(feature = "encrypt")]
use crate::engine::record::RecordError;
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
/// Derives a key of the ring's encryption key from its material: apart from its MAC key.
#[cfg(feature = "encrypt")]
const SEAL_KEY_DOMAIN: &[u8] = b"tower-idempotency/record-seal-key/v1";
/// Begins the associated data of a sealed record.
#[cfg(feature = "encrypt")]
const SEAL_DOMAIN: &[u8] = b"tower-idempotency/record-seal/v1";

/// The length of a sealed record's nonce: XChaCha20's 192 bits, random per record.
#[cfg(feature = "encrypt")]
pub(crate) const NONCE_LEN: usize = 24;
/// The length of a sealed record's Poly1305 tag.
#[cfg(feature = "encrypt")]
pub(crate) const SEAL_TAG_LEN: usize = 16;

/// The length of a record's authentication tag.
pub(crate) const TAG_LEN: usize = 32;

/// A secret key for record authentication and fingerprint keying, at least 32 bytes long, with
/// the other secrets it accepts while it is rotated (a keyring).
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
/// - with [`Secret::encrypting`] (feature `encrypt`), each record's content and each recorded
///   step's value are encrypted too: who reads the store reads no response, result, receipt
///   or step's value.
///
/// Every replica sharing a store must use the same store keys, so the same first secret.
///
/// # Rotation
///
/// A secret signs with one key (its current one: new records' tags and the fingerprints of new
/// claims) and verifies with every key of its ring: the current one and those it accepts. A
/// record, a pending key or a step recorded under any key of the ring is recognised as the
/// request's own and replayed; one under a key outside the ring is refused (503
/// `record_invalid`, or 422 as a key reused with another request), never run again. The store
/// keys stay those of the first secret through every rotation, so records are found where they
/// are.
///
/// Replicas that deploy one at a time rotate in three deploys, each finished on every replica
/// before the next begins:
///
/// 1. **Accept the new secret**: `first.accepting(new)`. Every replica still signs with the
///    old one, and verifies what the new one signs.
/// 2. **Sign with it**: `first.rotated(new)`. It signs with the new one and still accepts the
///    old one. While this deploy rolls out, replicas of step 1 and step 2 sign with different
///    keys and each verifies the other's records.
/// 3. **Drop the old secret** once the longest retention of your routes, plus the longest run
///    (a run renews its lease, and its record is written when it ends), has passed since step 2
///    ended:
///    `first.rotated(new).without_previous()`. Records signed by the old one have expired by
///    then; one still found is refused, never run again. Keep the first secret's material
///    where the replicas read it: it verifies nothing any more, but it derives the store
///    keys, and a replica that starts from `Secret::new(new)` instead looks for every record
///    elsewhere and runs their retries again.
///
/// Skipping step 1 works too, but while step 2 rolls out a replica still on the old ring
/// refuses the records the new one signs (503 `record_invalid` or 422) until it is updated.
///
/// ```
/// use tower_idempotency::Secret;
///
/// # fn main() -> Result<(), tower_idempotency::ConfigError> {
/// let first = Secret::new(b"0123456789abcdef0123456789abcdef".to_vec())?;
/// assert!(Secret::new(b"short".to_vec()).is_err());
///
/// let new = b"another 32 bytes from the secrets".to_vec();
/// let step_1 = first.accepting(new.clone())?; // signs with the first, accepts the new
/// let step_2 = first.rotated(new.clone())?; // signs with the new, accepts the first
/// let step_3 = first.rotated(new)?.without_previous(); // the new one only
/// assert_eq!((step_1.ring_len(), step_2.ring_len(), step_3.ring_len()), (2, 2, 1));
/// # Ok(()) }
/// ```
///
/// A secret made anew with [`Secret::new`] changes the store keys as well: records written
/// under the old one are no longer found, and a retry of a request made before the change runs
/// its work again. Make that change only when no such retry can come.
#[derive(Clone)]
pub struct Secret {
    /// Keys the records' tags and the fingerprints.
    key: Arc<RingKey>,
    /// Keys the store keys: derived from the first secret, kept by [`Secret::rotated`].
    store_keys: [u8; 32],
    /// The HMAC state keyed with `store_keys`, made once: cloned for each store key.
    store_keys_mac: HmacSha256,
    /// The other keys of the ring: records and fingerprints under them are verified, never
    /// written.
    accepted: Arc<[Arc<RingKey>]>,
    /// New records' content is encrypted, not only tagged: [`Secret::encrypting`].
    encrypt: bool,
}

/// One key of a ring: its material, with what is derived from it made once, when the secret
/// is built, and cloned for each use (an HMAC key schedule and the content key cost more than
/// a record's tag).
struct RingKey {
    material: Box<[u8]>,
    /// The HMAC state keyed with `material`.
    mac: HmacSha256,
    /// The cipher under the content key derived from `material`.
    #[cfg(feature = "encrypt")]
    cipher: chacha20poly1305::XChaCha20Poly1305,
}

impl RingKey {
    fn new(material: Vec<u8>) -> Self {
        let mac = hmac_of(&material);
        Self {
            #[cfg(feature = "encrypt")]
            cipher: seal_cipher(mac.clone()),
            mac,
            material: material.into_boxed_slice(),
        }
    }

    fn mac(&self) -> HmacSha256 {
        self.mac.clone()
    }
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
        let key = RingKey::new(key);
        let mut m = key.mac();
        m.update(STORE_KEY_KEY_DOMAIN);
        let store_keys: [u8; 32] = m.finalize().into_bytes().into();
        Ok(Self {
            key: Arc::new(key),
            store_keys_mac: hmac_of(&store_keys),
            store_keys,
            accepted: Arc::new([]),
            encrypt: false,
        })
    }

    /// A secret that signs with `key`, keeps the store keys of this one, and still accepts
    /// every key of this one's ring: step 2 of a [rotation](Secret#rotation). A retry of a
    /// request made under the old key finds its record and replays it, and a record written by
    /// a replica that still signs with the old key replays here too.
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
    /// assert_eq!(second.ring_len(), 2, "signs with the second, accepts the first");
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Secret::new`], for key material shorter than [`Secret::MIN_LEN`] bytes.
    pub fn rotated(&self, key: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let next = Self::new(key)?;
        let accepted = std::iter::once(&self.key)
            .chain(self.accepted.iter())
            .filter(|k| k.material != next.key.material)
            .cloned()
            .collect();
        Ok(Self {
            store_keys: self.store_keys,
            store_keys_mac: self.store_keys_mac.clone(),
            accepted,
            encrypt: self.encrypt,
            ..next
        })
    }

    /// This secret, also accepting records and fingerprints signed with `key`: step 1 of a
    /// [rotation](Secret#rotation), so that every replica verifies the new key before any
    /// signs with it. It still signs with its current key.
    ///
    /// ```
    /// use tower_idempotency::Secret;
    ///
    /// let first = Secret::new([1u8; 32].to_vec())?;
    /// assert_eq!(first.accepting([2u8; 32].to_vec())?.ring_len(), 2);
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Secret::new`], for key material shorter than [`Secret::MIN_LEN`] bytes.
    pub fn accepting(&self, key: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let key = Self::new(key)?.key;
        if key.material == self.key.material
            || self.accepted.iter().any(|k| k.material == key.material)
        {
            return Ok(self.clone());
        }
        let accepted = self.accepted.iter().cloned().chain([key]).collect();
        Ok(Self {
            accepted,
            ..self.clone()
        })
    }

    /// This secret without the keys it accepts: only its current key verifies. Step 3 of a
    /// [rotation](Secret#rotation), once the retention has passed since every replica signs
    /// with the current key: a record signed by a dropped key is refused, never run again.
    ///
    /// ```
    /// use tower_idempotency::Secret;
    ///
    /// let second = Secret::new([1u8; 32].to_vec())?.rotated([2u8; 32].to_vec())?;
    /// assert_eq!(second.without_previous().ring_len(), 1);
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    #[must_use]
    pub fn without_previous(&self) -> Self {
        Self {
            accepted: Arc::new([]),
            ..self.clone()
        }
    }

    /// This secret, also encrypting the content of every record it writes (feature `encrypt`):
    /// a response's status, headers, body and trailers, a message's or an outbound send's
    /// result, and each recorded step's name and value. Who reads the store sees random bytes
    /// where the response and the steps' results were.
    ///
    /// The content is sealed with XChaCha20-Poly1305 under a key derived from the ring's current
    /// key, apart from the keys of the tags and fingerprints, with a random 192-bit nonce per
    /// record and per step. The store key and the writer's fingerprint are bound to it, and a
    /// step's id (its place) to a step, so a record or a step moved to another key or place
    /// does not open. Rotation works as for the tags: a record or a step sealed under any key
    /// of the ring opens and replays. One the ring cannot open is refused, never replayed, never
    /// run again: a record or step moved or changed with 503 `record_invalid` at a door
    /// ([`StepErrorKind::RecordInvalid`](crate::engine::StepErrorKind::RecordInvalid) for a
    /// step), a step sealed under a key dropped from the ring likewise, and a record sealed
    /// under a dropped key with 422 `key_reused`, as its fingerprint, keyed under that key, no
    /// longer matches. An engine with no secret derives other store keys: it never finds what
    /// an encrypting engine wrote, and a retry runs its work again, as after any
    /// [new secret](Secret#rotation).
    ///
    /// What stays visible to who reads the store: the store key, the keyed fingerprint, the
    /// expiry the store keeps, each value's length (a record's content plus 44 bytes; a step's
    /// name and value plus 75 bytes), how many steps a request recorded, and when each was
    /// written and read. The status code is sealed with the rest. Timing shows no more than the
    /// length does: sealing and opening take time by the content's length only.
    ///
    /// Turning it on or off needs no steps: every secret opens sealed records and steps of its
    /// ring (with the feature on) and tagged ones alike; this only chooses how new ones are
    /// written. Steps tagged before it was turned on replay under it.
    ///
    /// ```
    /// use tower_idempotency::{MemoryStore, Secret};
    /// use tower_idempotency::engine::Engine;
    ///
    /// let secret = Secret::new([7u8; 32].to_vec())?.encrypting();
    /// assert!(secret.encrypts());
    /// assert!(secret.rotated([8u8; 32].to_vec())?.encrypts(), "a rotation keeps it");
    /// let engine = Engine::builder(MemoryStore::new()).secret(secret).build();
    /// # let _ = engine;
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    #[cfg(feature = "encrypt")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encrypt")))]
    #[must_use]
    pub fn encrypting(&self) -> Self {
        Self {
            encrypt: true,
            ..self.clone()
        }
    }

    /// Whether new records' content is encrypted: [`Secret::encrypting`].
    #[must_use]
    pub fn encrypts(&self) -> bool {
        self.encrypt
    }

    /// How many keys verify records: the current one and those accepted.
    #[must_use]
    pub fn ring_len(&self) -> usize {
        1 + self.accepted.len()
    }

    /// Whether `held`, a fingerprint a store keeps, is the keyed form of the plain `fp` under
    /// an accepted key of the ring (the current key's is compared by the caller, first).
    pub(crate) fn accepts_fingerprint(&self, fp: &Fingerprint, held: &Fingerprint) -> bool {
        self.accepted
            .iter()
            .any(|k| keyed_fingerprint(k.mac(), fp) == *held)
    }

    fn mac(&self) -> HmacSha256 {
        self.key.mac()
    }

    /// The store key under this secret: each part of the plain key, HMAC-keyed with the store
    /// keys' key. The scope part stays one per scope, so stores still group a scope's keys.
    pub(crate) fn key_store_key(&self, plain: &StoreKey) -> StoreKey {
        let part = |domain: &[u8], bytes: &[u8; 32]| -> [u8; 32] {
            let mut m = self.store_keys_mac.clone();
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
        keyed_fingerprint(self.mac(), fp)
    }

    /// The tag of a record's content under its store key and fingerprint, with the current key.
    pub(crate) fn tag(&self, key_id: &[u8; 32], fp: &Fingerprint, content: &[u8]) -> [u8; TAG_LEN] {
        record_mac(self.mac(), key_id, fp, content)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a tag in constant time under each key of the ring, the current one first.
    pub(crate) fn verify(
        &self,
        key_id: &[u8; 32],
        fp: &Fingerprint,
        content: &[u8],
        tag: &[u8],
    ) -> bool {
        std::iter::once(&self.key)
            .chain(self.accepted.iter())
            .any(|k| {
                record_mac(k.mac(), key_id, fp, content)
                    .verify_slice(tag)
                    .is_ok()
            })
    }
}

#[cfg(feature = "encrypt")]
impl Secret {
    /// Encrypts `content` in place under the current key, bound to `head` (the record's
    /// unencrypted first bytes), its store key and fingerprint. Returns the nonce and the tag.
    pub(crate) fn seal_content(
        &self,
        key_id: &[u8; 32],
        fp: &Fingerprint,
        head: &[u8],
        content: &mut [u8],
    ) -> Result<([u8; NONCE_LEN], [u8; SEAL_TAG_LEN]), RecordError> {
        use chacha20poly1305::AeadInOut;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|_| RecordError::unencodable("no random bytes for the record's nonce"))?;
        let mut ad = [0u8; AD_MAX];
        let ad = seal_ad(&mut ad, key_id, fp, head)
            .ok_or(RecordError::unencodable("a sealed head over its limit"))?;
        let tag = self
            .key
            .cipher
            .encrypt_inout_detached(&nonce.into(), ad, content.into())
            // Only for a content over 256 GiB, which no record holds (4 GiB bodies at most).
            .map_err(|_| RecordError::unencodable("record too long to encrypt"))?;
        Ok((nonce, tag.into()))
    }

    /// Decrypts `content` in place under the first key of the ring whose tag matches. `false`
    /// when none does: `content` is then left as it was.
    pub(crate) fn open_content(
        &self,
        key_id: &[u8; 32],
        fp: &Fingerprint,
        head: &[u8],
        nonce: &[u8; NONCE_LEN],
        content: &mut [u8],
        tag: &[u8; SEAL_TAG_LEN],
    ) -> bool {
        use chacha20poly1305::AeadInOut;
        let mut ad = [0u8; AD_MAX];
        let Some(ad) = seal_ad(&mut ad, key_id, fp, head) else {
            return false;
        };
        let nonce = (*nonce).into();
        let tag = (*tag).into();
        std::iter::once(&self.key)
            .chain(self.accepted.iter())
            .any(|k| {
                // On a mismatch the content is left untouched: the tag is checked first.
                k.cipher
                    .decrypt_inout_detached(&nonce, ad, (&mut *content).into(), &tag)
                    .is_ok()
            })
    }
}

/// The cipher of a ring key, from its keyed HMAC state.
#[cfg(feature = "encrypt")]
fn seal_cipher(mut m: HmacSha256) -> chacha20poly1305::XChaCha20Poly1305 {
    use chacha20poly1305::KeyInit;
    m.update(SEAL_KEY_DOMAIN);
    let derived: [u8; 32] = m.finalize().into_bytes().into();
    chacha20poly1305::XChaCha20Poly1305::new(&derived.into())
}

/// The longest head a sealed value binds: a step's (see `steps.rs`).
#[cfg(feature = "encrypt")]
pub(crate) const SEAL_HEAD_MAX: usize = 64;
#[cfg(feature = "encrypt")]
const AD_MAX: usize = SEAL_DOMAIN.len() + 32 + 32 + SEAL_HEAD_MAX;

/// The associated data of a sealed value, written into `buf`: no allocation per record.
/// `None` for a head over [`SEAL_HEAD_MAX`] bytes, which none of the crate's is.
#[cfg(feature = "encrypt")]
fn seal_ad<'a>(
    buf: &'a mut [u8; AD_MAX],
    key_id: &[u8; 32],
    fp: &Fingerprint,
    head: &[u8],
) -> Option<&'a [u8]> {
    if head.len() > SEAL_HEAD_MAX {
        return None;
    }
    let mut at = 0;
    for part in [SEAL_DOMAIN, key_id, fp.as_bytes(), head] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    Some(&buf[..at])
}

fn keyed_fingerprint(mut m: HmacSha256, fp: &Fingerprint) -> Fingerprint {
    m.update(FINGERPRINT_DOMAIN);
    m.update(fp.as_bytes());
    Fingerprint::from_bytes(m.finalize().into_bytes().into())
}

fn record_mac(
    mut m: HmacSha256,
    key_id: &[u8; 32],
    fp: &Fingerprint,
    content: &[u8],
) -> HmacSha256 {
    m.update(RECORD_DOMAIN);
    m.update(key_id);
    m.update(fp.as_bytes());
    m.update(content);
    m
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
        assert_ne!(&one.store_keys[..], &one.key.material[..]);
    }

    /// Tags verify under any key of the ring and no other; fingerprints keyed by an accepted
    /// key are recognised, those of a dropped or foreign key are not.
    #[test]
    fn the_ring_verifies_its_keys_only() {
        let fp = Fingerprint::from_bytes([5; 32]);
        let old = Secret::new([1u8; 32].to_vec()).expect("valid");
        let rotated = old.rotated([2u8; 32].to_vec()).expect("valid");
        let accepting = old.accepting([2u8; 32].to_vec()).expect("valid");
        let foreign = old.rotated([9u8; 32].to_vec()).expect("valid");
        let tag_old = old.tag(&[7; 32], &fp, b"content");
        let tag_new = rotated.tag(&[7; 32], &fp, b"content");
        assert_eq!(
            tag_new,
            accepting
                .rotated([2u8; 32].to_vec())
                .expect("valid")
                .tag(&[7; 32], &fp, b"content")
        );
        assert!(rotated.verify(&[7; 32], &fp, b"content", &tag_old));
        assert!(accepting.verify(&[7; 32], &fp, b"content", &tag_new));
        assert!(!old.verify(&[7; 32], &fp, b"content", &tag_new));
        assert!(
            !rotated
                .without_previous()
                .verify(&[7; 32], &fp, b"content", &tag_old)
        );
        assert!(!rotated.verify(
            &[7; 32],
            &fp,
            b"content",
            &foreign.tag(&[7; 32], &fp, b"content")
        ));
        assert!(
            !rotated.verify(&[8; 32], &fp, b"content", &tag_old),
            "bound to its key"
        );

        assert!(rotated.accepts_fingerprint(&fp, &old.key_fingerprint(&fp)));
        assert!(accepting.accepts_fingerprint(&fp, &rotated.key_fingerprint(&fp)));
        assert!(
            !rotated
                .without_previous()
                .accepts_fingerprint(&fp, &old.key_fingerprint(&fp))
        );
        assert!(!rotated.accepts_fingerprint(&fp, &foreign.key_fingerprint(&fp)));
        assert!(
            !rotated
                .accepts_fingerprint(&Fingerprint::from_bytes([6; 32]), &old.key_fingerprint(&fp))
        );

        // One ring, whatever the order of the steps; a key is listed once.
        assert_eq!(
            accepting
                .accepting([2u8; 32].to_vec())
                .expect("valid")
                .ring_len(),
            2
        );
        assert_eq!(
            old.rotated([1u8; 32].to_vec()).expect("valid").ring_len(),
            1
        );
        assert_eq!(
            rotated
                .rotated([3u8; 32].to_vec())
                .expect("valid")
                .ring_len(),
            3
        );
        assert!(old.accepting(b"short".to_vec()).is_err());
    }
}
