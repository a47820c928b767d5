//! What a message is to the door, and how its key is found.

use crate::engine::key::{DEFAULT_MAX_KEY_LEN, IdempotencyKey, KeyError};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt;

/// Domain tag of the body digest, so no other hash the crate makes has the same input.
const DIGEST_DOMAIN: &[u8] = b"tower-idempotency/message-digest/v1";

/// Domain tag of a hashed header value, apart from the body digest.
const HASHED_DOMAIN: &[u8] = b"tower-idempotency/message-hashed-id/v1";

/// What the door reads from a message: its topic, its headers, its body.
///
/// Implemented for [`Envelope`] and, with the `nats` feature, for `async_nats::Message`.
/// Implement it for your broker's message type to put the layer in front of its handler.
pub trait Message {
    /// The topic, queue or subject the message came from.
    fn topic(&self) -> &str;

    /// The value of the header or attribute `name`, compared without regard to ASCII case.
    /// The first one when the message carries several.
    fn header(&self, name: &str) -> Option<&[u8]>;

    /// The body, borrowed as the producer sent it. For a message that holds a typed value,
    /// such as an apalis task's arguments, its serialized form.
    fn body(&self) -> Cow<'_, [u8]>;

    /// The version of the body's schema, when the message says. Default: `None`.
    ///
    /// It is hashed with the body, so the same bytes under two schemas are two messages.
    fn schema_version(&self) -> Option<&str> {
        None
    }
}

/// A broker-neutral message: topic, headers, body and an optional schema version. For
/// brokers without a type of their own, and for tests.
///
/// ```
/// use tower_idempotency::message::{Envelope, Message};
///
/// let m = Envelope::new("orders", "{\"sku\":\"X\"}").with_header("Idempotency-Key", "order-17");
/// assert_eq!(m.header("idempotency-key"), Some(&b"order-17"[..]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Envelope {
    /// The topic or queue name.
    pub topic: String,
    /// Headers or attributes, in order.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
    /// The schema version of the body, if any.
    pub schema_version: Option<String>,
}

impl Envelope {
    /// A message on `topic` with `body` and no headers.
    #[must_use]
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            headers: Vec::new(),
            body: body.into(),
            schema_version: None,
        }
    }

    /// The same message with one more header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The same message with a schema version.
    #[must_use]
    pub fn with_schema_version(mut self, version: impl Into<String>) -> Self {
        self.schema_version = Some(version.into());
        self
    }
}

impl Message for Envelope {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &v[..])
    }

    fn body(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.body)
    }

    fn schema_version(&self) -> Option<&str> {
        self.schema_version.as_deref()
    }
}

/// A message's idempotency key: one the producer gave, or a digest of the message itself.
///
/// The two kinds never meet in the store: a given key that happens to spell a digest's hex
/// is still another key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MessageKey(Kind);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Kind {
    Given(IdempotencyKey),
    Digest(IdempotencyKey),
}

impl MessageKey {
    /// A key the producer gave, in a header, an attribute or a field of the job.
    ///
    /// It is trimmed of spaces and tabs, then must be 1 to 255 bytes of visible ASCII or
    /// spaces.
    ///
    /// # Errors
    /// A [`KeyError`] saying why the value is not a key: empty, too long, or a byte outside
    /// visible ASCII.
    pub fn given(value: &[u8]) -> Result<Self, KeyError> {
        let trimmed = trim(value);
        let text = std::str::from_utf8(trimmed)
            .map_err(|_| KeyError::new(crate::engine::key::KeyErrorKind::NonAscii))?;
        IdempotencyKey::with_max_len(text, DEFAULT_MAX_KEY_LEN).map(|k| Self(Kind::Given(k)))
    }

    /// The digest of a message: SHA-256 over the length-prefixed topic, schema version and body.
    ///
    /// A missing schema version is hashed as absent. Byte-identical redeliveries have the
    /// same digest. Two messages whose fields differ never do, wherever the boundaries
    /// between fields fall.
    ///
    /// ```
    /// use tower_idempotency::message::MessageKey;
    ///
    /// let a = MessageKey::digest("orders", None, b"ab");
    /// assert_eq!(a, MessageKey::digest("orders", None, b"ab"));
    /// assert_ne!(a, MessageKey::digest("ordersa", None, b"b"));
    /// assert_ne!(a, MessageKey::digest("orders", Some("2"), b"ab"));
    /// ```
    #[must_use]
    pub fn digest(topic: &str, schema_version: Option<&str>, body: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(DIGEST_DOMAIN);
        lp(&mut h, topic.as_bytes());
        match schema_version {
            None => h.update([0u8]),
            Some(v) => {
                h.update([1u8]);
                lp(&mut h, v.as_bytes());
            }
        }
        lp(&mut h, body);
        let hex = crate::hex::encode(&h.finalize());
        // 64 hex digits are always a valid key.
        let key = IdempotencyKey::with_max_len(&hex, DEFAULT_MAX_KEY_LEN)
            .unwrap_or_else(|_| unreachable!("hex digits form a key"));
        Self(Kind::Digest(key))
    }

    /// A key for an identifier that is not a valid key itself: its SHA-256.
    ///
    /// For a broker's message id over 255 bytes, or not ASCII. It is kept apart from given
    /// keys and from message digests. The same identifier always gives the same key.
    ///
    /// ```
    /// use tower_idempotency::message::MessageKey;
    ///
    /// let long = "x".repeat(300);
    /// assert!(MessageKey::given(long.as_bytes()).is_err());
    /// assert_eq!(MessageKey::hashed(long.as_bytes()), MessageKey::hashed(long.as_bytes()));
    /// assert_ne!(MessageKey::hashed(b"id-1"), MessageKey::given(b"id-1").unwrap());
    /// ```
    #[must_use]
    pub fn hashed(value: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(HASHED_DOMAIN);
        lp(&mut h, value);
        let hex = crate::hex::encode(&h.finalize());
        let key = IdempotencyKey::with_max_len(&hex, DEFAULT_MAX_KEY_LEN)
            .unwrap_or_else(|_| unreachable!("hex digits form a key"));
        Self(Kind::Digest(key))
    }

    /// Whether the producer gave this key, rather than it being a digest of the message.
    #[must_use]
    pub fn is_given(&self) -> bool {
        matches!(self.0, Kind::Given(_))
    }

    /// The key to derive the store key from, and whether it is a digest.
    pub(crate) fn parts(&self) -> (&IdempotencyKey, bool) {
        match &self.0 {
            Kind::Given(k) => (k, false),
            Kind::Digest(k) => (k, true),
        }
    }
}

impl fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Given keys may be personal data; digests are not, but say only which kind it is.
        match self.0 {
            Kind::Given(_) => f.write_str("MessageKey::Given(..)"),
            Kind::Digest(_) => f.write_str("MessageKey::Digest(..)"),
        }
    }
}

fn lp(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// Finds a message's key. It may find none: the message then runs untracked, or is
/// refused when the layer requires keys.
///
/// Any `Fn(&M) -> Result<Option<MessageKey>, KeyError>` is an `Identify`, e.g. a key from a field
/// of the body:
///
/// ```
/// use tower_idempotency::message::{Envelope, Identify, MessageKey};
///
/// let by_order_id = |m: &Envelope| {
///     let order = m.body.strip_prefix(b"order:").unwrap_or_default();
///     if order.is_empty() { Ok(None) } else { MessageKey::given(order).map(Some) }
/// };
/// let key = by_order_id.identify(&Envelope::new("orders", "order:17")).unwrap();
/// assert!(key.is_some_and(|k| k.is_given()));
/// ```
pub trait Identify<M>: Send + Sync + 'static {
    /// The message's key, `Ok(None)` for none.
    ///
    /// # Errors
    /// The message carries a key that is not valid. The layer refuses the message, so it
    /// never runs unprotected.
    fn identify(&self, message: &M) -> Result<Option<MessageKey>, KeyError>;
}

impl<M, F> Identify<M> for F
where
    F: Fn(&M) -> Result<Option<MessageKey>, KeyError> + Send + Sync + 'static,
{
    fn identify(&self, message: &M) -> Result<Option<MessageKey>, KeyError> {
        self(message)
    }
}

/// The default [`Identify`]: the first key header the message carries, else the digest.
///
/// The header is `Idempotency-Key` by default. Names are compared without regard to case,
/// and the value is trimmed. With no such header, the key is the
/// [digest](MessageKey::digest) of the topic, schema version and body, unless
/// [`hash_body`](Self::hash_body) is off.
///
/// A header that is present but not a valid key refuses the message. It does not fall back
/// to the digest: a producer that meant to give a key is told it is wrong.
///
/// ```
/// use tower_idempotency::message::{Envelope, HeaderOrHash, Identify, MessageKey};
///
/// let keys = HeaderOrHash::new();
/// let given = keys.identify(&Envelope::new("orders", "{}").with_header("idempotency-key", " k-1 ")).unwrap();
/// assert_eq!(given, Some(MessageKey::given(b"k-1").unwrap()));
/// let hashed = keys.identify(&Envelope::new("orders", "{}")).unwrap();
/// assert_eq!(hashed, Some(MessageKey::digest("orders", None, b"{}")));
/// assert_eq!(HeaderOrHash::new().hash_body(false).identify(&Envelope::new("orders", "{}")).unwrap(), None);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct HeaderOrHash {
    /// Each header, and whether a value that is not a valid key is hashed into one.
    headers: Vec<(String, bool)>,
    hash_body: bool,
}

impl Default for HeaderOrHash {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderOrHash {
    /// `Idempotency-Key`, else the digest.
    pub fn new() -> Self {
        Self {
            headers: vec![("Idempotency-Key".to_owned(), false)],
            hash_body: true,
        }
    }

    /// Reads the key from this header instead of `Idempotency-Key`.
    pub fn header(mut self, name: impl Into<String>) -> Self {
        self.headers = vec![(name.into(), false)];
        self
    }

    /// Also reads the key from this header, when the ones before it are absent.
    pub fn or_header(mut self, name: impl Into<String>) -> Self {
        self.headers.push((name.into(), false));
        self
    }

    /// Also reads the key from this header, when the ones before it are absent. A value that
    /// is not a valid key is [hashed](MessageKey::hashed) into one.
    ///
    /// A value over 255 bytes or not ASCII does not refuse the message, and an empty one is
    /// taken as absent. This is for identifiers that a broker or producer library sets by
    /// rules of its own, such as `Nats-Msg-Id`: the producer did not mean them as our key.
    ///
    /// ```
    /// use tower_idempotency::message::{Envelope, HeaderOrHash, Identify, MessageKey};
    ///
    /// let keys = HeaderOrHash::new().or_id_header("Msg-Id");
    /// let id = "é".repeat(200);
    /// let m = Envelope::new("orders", "{}").with_header("Msg-Id", id.clone());
    /// assert_eq!(keys.identify(&m).unwrap(), Some(MessageKey::hashed(id.as_bytes())));
    /// ```
    pub fn or_id_header(mut self, name: impl Into<String>) -> Self {
        self.headers.push((name.into(), true));
        self
    }

    /// Whether a message without a key header is keyed by its digest. Default: `true`.
    /// With `false`, such a message has no key.
    pub fn hash_body(mut self, on: bool) -> Self {
        self.hash_body = on;
        self
    }
}

impl<M: Message> Identify<M> for HeaderOrHash {
    fn identify(&self, message: &M) -> Result<Option<MessageKey>, KeyError> {
        for (name, hash_invalid) in &self.headers {
            if let Some(v) = message.header(name) {
                // An empty id says nothing: the next header, or the digest, decides.
                if *hash_invalid && trim(v).is_empty() {
                    continue;
                }
                return match MessageKey::given(v) {
                    Err(_) if *hash_invalid => Ok(Some(MessageKey::hashed(trim(v)))),
                    given => given.map(Some),
                };
            }
        }
        Ok(self.hash_body.then(|| {
            MessageKey::digest(message.topic(), message.schema_version(), &message.body())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_key_is_trimmed_and_validated() {
        assert_eq!(
            MessageKey::given(b"\t k \t").unwrap(),
            MessageKey::given(b"k").unwrap()
        );
        assert!(MessageKey::given(b"   ").is_err());
        assert!(MessageKey::given("ключ".as_bytes()).is_err());
        assert!(MessageKey::given(&[b'a'; 256]).is_err());
    }

    #[test]
    fn a_given_key_never_equals_a_digest() {
        let d = MessageKey::digest("t", None, b"b");
        let (hex, _) = d.parts();
        assert_ne!(MessageKey::given(hex.as_str().as_bytes()).unwrap(), d);
    }

    #[test]
    fn the_digest_separates_its_fields() {
        let base = MessageKey::digest("t", None, b"");
        assert_ne!(base, MessageKey::digest("t", Some(""), b""));
        assert_ne!(
            MessageKey::digest("t", Some("1"), b"x"),
            MessageKey::digest("t", Some("1x"), b"")
        );
    }
}
