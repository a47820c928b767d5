//! The record of a finished request, and its versioned binary encoding.
//!
//! A store keeps a [`Record`] as opaque bytes. Only this module reads or writes them. Decoding
//! re-validates everything: version, flags, lengths, status range, header bytes, body size. So
//! a record that was truncated, flipped or written by someone else is refused instead of
//! replayed. Body and header values decode as slices of the record's `Bytes`, with no copies.
//!
//! Layout, version 1, big-endian:
//!
//! ```text
//! "TI" 0x01 flags:u8 status:u16
//! headers:u16 { name_len:u16 name value_len:u16 value }*
//! body_len:u32 body
//! trailers:u16 { name_len:u16 name value_len:u16 value }*   (present when flags & HAS_TRAILERS)
//! written_at_ms:u64 kept_until_ms:u64                        (present when flags & TIMES; Unix ms)
//! tag:[u8; 32]                                               (present when flags & MAC)
//! ```
//!
//! A record sealed under an encrypting [`Secret`](crate::Secret) keeps only its first four
//! bytes in the clear; the rest is a whole record of the layout above, without a tag, encrypted:
//!
//! ```text
//! "TI" 0x01 flags:u8 (SEALED only) nonce:[u8; 24] content tag:[u8; 16]
//! ```

use crate::store::Record;
use bytes::{BufMut, Bytes, BytesMut};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 2] = b"TI";
const VERSION: u8 = 1;
const FLAG_BODY: u8 = 0b0000_0001;
const FLAG_TRAILERS: u8 = 0b0000_0010;
/// The last 32 bytes are an HMAC tag. See [`Secret`](crate::Secret).
const FLAG_MAC: u8 = 0b0000_0100;
/// The work declared this response its final answer, whatever its status.
const FLAG_DECLARED: u8 = 0b0000_1000;
/// When the record was written and until when it is kept follow the trailers.
const FLAG_TIMES: u8 = 0b0001_0000;
const KNOWN_FLAGS: u8 = FLAG_BODY | FLAG_TRAILERS | FLAG_MAC | FLAG_DECLARED | FLAG_TIMES;
/// The content is encrypted: see [`Secret::encrypting`](crate::Secret). Never beside
/// another flag, never in the content it seals.
const FLAG_SEALED: u8 = 0b0010_0000;
/// The clear head of a sealed record, bound to its content.
#[cfg(feature = "encrypt")]
const SEALED_HEAD: [u8; 4] = [MAGIC[0], MAGIC[1], VERSION, FLAG_SEALED];
/// The field that tags a record with the door that wrote it, for doors other than HTTP.
const DOOR_FIELD: &[u8] = b"tower-idempotency-door";

// The engine's half of `Record`: the store keeps the bytes, only this module reads them.
impl Record {
    /// Decodes and validates the record, refusing bodies over `max_body` bytes.
    ///
    /// # Errors
    /// A [`RecordError`] naming the first thing that is wrong.
    pub fn decode(&self, max_body: usize) -> Result<Recorded, RecordError> {
        let sealed_head = self.as_bytes().get(..3) == Some(&[MAGIC[0], MAGIC[1], VERSION][..]);
        let content = match self.as_bytes().get(3) {
            // Only a record of this layout is called encrypted; other bytes are invalid.
            Some(flags) if sealed_head && flags & FLAG_SEALED != 0 => {
                return Err(RecordError::unauthenticated(
                    "record is encrypted; only its secret opens it",
                ));
            }
            Some(flags) if flags & FLAG_MAC != 0 => {
                let end = self
                    .as_bytes()
                    .len()
                    .checked_sub(crate::engine::secret::TAG_LEN);
                self.as_bytes()
                    .slice(..end.ok_or(RecordError::new("truncated record"))?)
            }
            _ => self.as_bytes().clone(),
        };
        Self::decode_content(&content, max_body)
    }

    /// Verifies the record's tag under `secret` for this key and fingerprint, then decodes it.
    pub(crate) fn decode_verified(
        &self,
        max_body: usize,
        secret: &crate::Secret,
        key_id: &[u8; 32],
        fingerprint: &crate::store::Fingerprint,
    ) -> Result<Recorded, RecordError> {
        let flags = *self
            .as_bytes()
            .get(3)
            .ok_or(RecordError::new("truncated record"))?;
        if flags & FLAG_SEALED != 0 {
            let content = self.open(secret, key_id, fingerprint)?;
            if content
                .get(3)
                .is_some_and(|f| f & (FLAG_MAC | FLAG_SEALED) != 0)
            {
                return Err(RecordError::new("an encrypted record seals another"));
            }
            return Self::decode_content(&content, max_body);
        }
        if flags & FLAG_MAC == 0 {
            return Err(RecordError::unauthenticated("record is not authenticated"));
        }
        let end = self
            .as_bytes()
            .len()
            .checked_sub(crate::engine::secret::TAG_LEN)
            .ok_or(RecordError::new("truncated record"))?;
        if !secret.verify(
            key_id,
            fingerprint,
            &self.as_bytes()[..end],
            &self.as_bytes()[end..],
        ) {
            return Err(RecordError::unauthenticated("record authentication failed"));
        }
        Self::decode_content(&self.as_bytes().slice(..end), max_body)
    }

    /// The content of a sealed record, decrypted under a key of `secret`'s ring.
    #[cfg(feature = "encrypt")]
    fn open(
        &self,
        secret: &crate::Secret,
        key_id: &[u8; 32],
        fingerprint: &crate::store::Fingerprint,
    ) -> Result<Bytes, RecordError> {
        use crate::engine::secret::{NONCE_LEN, SEAL_TAG_LEN};
        let b = self.as_bytes();
        let start = SEALED_HEAD.len() + NONCE_LEN;
        let tag_at = b
            .len()
            .checked_sub(SEAL_TAG_LEN)
            .filter(|at| *at >= start)
            .ok_or(RecordError::new("truncated record"))?;
        if b[..SEALED_HEAD.len()] != SEALED_HEAD {
            return Err(RecordError::new("unknown record flags"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[SEALED_HEAD.len()..start]);
        let mut tag = [0u8; SEAL_TAG_LEN];
        tag.copy_from_slice(&b[tag_at..]);
        let mut content = BytesMut::from(&b[start..tag_at]);
        if !secret.open_content(
            key_id,
            fingerprint,
            &SEALED_HEAD,
            &nonce,
            &mut content,
            &tag,
        ) {
            return Err(RecordError::unauthenticated(
                "record cannot be decrypted by the secret",
            ));
        }
        Ok(content.freeze())
    }

    /// Without the feature, no secret opens a sealed record: it is refused, never replayed.
    #[cfg(not(feature = "encrypt"))]
    fn open(
        &self,
        _: &crate::Secret,
        _: &[u8; 32],
        _: &crate::store::Fingerprint,
    ) -> Result<Bytes, RecordError> {
        Err(RecordError::unauthenticated(
            "record is encrypted; the `encrypt` feature opens it",
        ))
    }

    /// Seals `content`, a whole untagged record, for this key and fingerprint under `secret`:
    /// encrypted when the secret encrypts, else tagged.
    fn sealed(
        content: BytesMut,
        secret: &crate::Secret,
        key_id: &[u8; 32],
        fingerprint: &crate::store::Fingerprint,
    ) -> Result<Self, RecordError> {
        #[cfg(feature = "encrypt")]
        if secret.encrypts() {
            use crate::engine::secret::{NONCE_LEN, SEAL_TAG_LEN};
            let start = SEALED_HEAD.len() + NONCE_LEN;
            let mut out = BytesMut::with_capacity(start + content.len() + SEAL_TAG_LEN);
            out.put_slice(&SEALED_HEAD);
            out.put_bytes(0, NONCE_LEN);
            out.put_slice(&content);
            let (nonce, tag) =
                secret.seal_content(key_id, fingerprint, &SEALED_HEAD, &mut out[start..])?;
            out[SEALED_HEAD.len()..start].copy_from_slice(&nonce);
            out.put_slice(&tag);
            return Ok(Self::from_bytes(out.freeze()));
        }
        let mut bytes = content;
        if let Some(flags) = bytes.get_mut(3) {
            *flags |= FLAG_MAC;
        }
        let tag = secret.tag(key_id, fingerprint, &bytes);
        bytes.extend_from_slice(&tag);
        Ok(Self::from_bytes(bytes.freeze()))
    }

    /// Appends the tag of `secret` for this key and fingerprint, or encrypts the record when
    /// the secret encrypts.
    ///
    /// # Errors
    /// Only when encrypting, with no random bytes for the nonce.
    pub(crate) fn seal(
        self,
        secret: &crate::Secret,
        key_id: &[u8; 32],
        fingerprint: &crate::store::Fingerprint,
    ) -> Result<Self, RecordError> {
        Self::sealed(
            BytesMut::from(self.into_bytes()),
            secret,
            key_id,
            fingerprint,
        )
    }

    fn decode_content(buf: &Bytes, max_body: usize) -> Result<Recorded, RecordError> {
        let mut r = Reader { buf, pos: 0 };
        if r.take(2)? != MAGIC {
            return Err(RecordError::new("bad magic"));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(RecordError::new("unknown record version"));
        }
        let flags = r.u8()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(RecordError::new("unknown record flags"));
        }
        let status = r.u16()?;
        if !(100..=999).contains(&status) {
            return Err(RecordError::new("status out of range"));
        }
        let headers = r.fields()?;
        let body_len = r.u32()? as usize;
        if body_len > max_body {
            return Err(RecordError::new("body over the record limit"));
        }
        if flags & FLAG_BODY == 0 && body_len != 0 {
            return Err(RecordError::new("body in a status-only record"));
        }
        let body = r.slice(body_len)?;
        let trailers = if flags & FLAG_TRAILERS != 0 {
            r.fields()?
        } else {
            Vec::new()
        };
        let times = if flags & FLAG_TIMES != 0 {
            let written = r.u64()?;
            let kept = r.u64()?;
            if kept < written {
                return Err(RecordError::new("kept until before written"));
            }
            Some(RecordTimes {
                written_at: UNIX_EPOCH + Duration::from_millis(written),
                kept_until: UNIX_EPOCH + Duration::from_millis(kept),
            })
        } else {
            None
        };
        if r.pos != buf.len() {
            return Err(RecordError::new("trailing bytes"));
        }
        Ok(Recorded {
            status,
            headers,
            body: (flags & FLAG_BODY != 0).then_some(body),
            trailers: (flags & FLAG_TRAILERS != 0).then_some(trailers),
            declared: flags & FLAG_DECLARED != 0,
            times,
        })
    }
}

/// A header or trailer field as stored: lowercase name and raw value bytes.
pub type Field = (Bytes, Bytes);

/// A response as recorded, free of any HTTP crate's types.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recorded {
    /// The status code.
    pub status: u16,
    /// Header fields in order, repeated names kept.
    pub headers: Vec<Field>,
    /// The body, or `None` when only the status was recorded.
    pub body: Option<Bytes>,
    /// Trailer fields, when the response had trailers: gRPC status and metadata.
    pub trailers: Option<Vec<Field>>,
    /// The work declared this response its final answer, whatever its status. In HTTP that is a
    /// declared [`Verdict::Record`](crate::engine::Verdict::Record). It is replayed even with a
    /// status the classification would not record, such as a 500. The HTTP layer sets it only on
    /// such a status. It refuses at replay a record that has it on any other: a damaged flag must
    /// not pass unnoticed.
    pub declared: bool,
    /// When the record was written and until when it is kept, when the door wrote them.
    pub times: Option<RecordTimes>,
}

/// When a record was written and until when its store keeps it, to the millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordTimes {
    /// When the record was written.
    pub written_at: SystemTime,
    /// When its retention ends.
    pub kept_until: SystemTime,
}

impl RecordTimes {
    /// Written `now`, kept for `retention`. A `retention` past what the system clock can count keeps it
    /// until about a century from `now`.
    #[must_use]
    pub fn new(now: SystemTime, retention: Duration) -> Self {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
        Self {
            written_at: now,
            kept_until: now
                .checked_add(retention.min(CENTURY))
                .or_else(|| now.checked_add(CENTURY))
                .unwrap_or(now),
        }
    }
}

impl Recorded {
    /// A record of a door that is not HTTP, such as messages and outbound receipts. It has status
    /// 200, one field naming `door`, and `body`. The tag keeps one door from replaying another's
    /// record found under the same store key.
    pub(crate) fn of_door(door: &'static [u8], body: Option<Bytes>) -> Self {
        Self::new(
            200,
            vec![(Bytes::from_static(DOOR_FIELD), Bytes::from_static(door))],
            body,
        )
    }

    /// Whether this record was written by [`Recorded::of_door`] for `door`.
    pub(crate) fn is_of_door(&self, door: &[u8]) -> bool {
        self.status == 200
            && matches!(self.headers.as_slice(), [(n, v)] if n == DOOR_FIELD && v == door)
    }

    /// A record of `status`, `headers` and `body`. A `body` of `None` means status-only.
    #[must_use]
    pub fn new(status: u16, headers: Vec<Field>, body: Option<Bytes>) -> Self {
        Self {
            status,
            headers,
            body,
            trailers: None,
            declared: false,
            times: None,
        }
    }

    /// The same record with trailers.
    #[must_use]
    pub fn with_trailers(mut self, trailers: Vec<Field>) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// The same record, declared the work's final answer whatever its status.
    #[must_use]
    pub fn declared(mut self) -> Self {
        self.declared = true;
        self
    }

    /// Encodes the response into a [`Record`].
    ///
    /// # Errors
    /// When a field is too long for the layout, or a name or value holds bytes a header may not.
    /// Too long is a name or value over 64 KiB, more than 65 535 fields, or a body over 4 GiB.
    pub fn encode(&self) -> Result<Record, RecordError> {
        let fields_len =
            |fs: &[Field]| fs.iter().map(|(n, v)| 4 + n.len() + v.len()).sum::<usize>();
        let body = self.body.as_deref().unwrap_or_default();
        let cap = 6
            + 2
            + fields_len(&self.headers)
            + 4
            + body.len()
            + self.trailers.as_deref().map_or(0, |t| 2 + fields_len(t))
            + if self.times.is_some() { 16 } else { 0 };
        let mut out = BytesMut::with_capacity(cap);
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        let mut flags = 0;
        if self.body.is_some() {
            flags |= FLAG_BODY;
        }
        if self.trailers.is_some() {
            flags |= FLAG_TRAILERS;
        }
        if self.declared {
            flags |= FLAG_DECLARED;
        }
        if self.times.is_some() {
            flags |= FLAG_TIMES;
        }
        out.put_u8(flags);
        if !(100..=999).contains(&self.status) {
            return Err(RecordError::unencodable("status out of range"));
        }
        out.put_u16(self.status);
        put_fields(&mut out, &self.headers)?;
        out.put_u32(
            u32::try_from(body.len()).map_err(|_| RecordError::unencodable("body too long"))?,
        );
        out.put_slice(body);
        if let Some(t) = &self.trailers {
            put_fields(&mut out, t)?;
        }
        if let Some(t) = &self.times {
            out.put_u64(unix_ms(t.written_at));
            out.put_u64(unix_ms(t.kept_until));
        }
        Ok(Record::from_bytes(out.freeze()))
    }
}

impl Recorded {
    /// The same response without the parts the layout cannot hold. These are a header or trailer
    /// field whose name or value is over 64 KiB or holds bytes a field may not. They are fields
    /// past the 65 535th, and a body over 4 GiB. Also returns what was left out, for the log:
    /// `header <name>`, `trailer <name>`, `body`. Values are never named.
    #[must_use]
    pub(crate) fn fitted(&self) -> (Recorded, Vec<String>) {
        let mut dropped = Vec::new();
        let mut fit = |fields: &[Field], kind: &str| -> Vec<Field> {
            let mut kept = Vec::with_capacity(fields.len().min(usize::from(u16::MAX)));
            for (n, v) in fields {
                let fits = n.len() <= usize::from(u16::MAX)
                    && v.len() <= usize::from(u16::MAX)
                    && valid_name(n)
                    && valid_value(v)
                    && kept.len() < usize::from(u16::MAX);
                if fits {
                    kept.push((n.clone(), v.clone()));
                } else {
                    dropped.push(format!("{kind} {}", String::from_utf8_lossy(n)));
                }
            }
            kept
        };
        let headers = fit(&self.headers, "header");
        let trailers = self.trailers.as_deref().map(|t| fit(t, "trailer"));
        let body = match &self.body {
            Some(b) if u32::try_from(b.len()).is_err() => {
                dropped.push("body".to_owned());
                None
            }
            b => b.clone(),
        };
        let fitted = Recorded {
            status: self.status,
            headers,
            body,
            trailers,
            declared: self.declared,
            times: self.times,
        };
        (fitted, dropped)
    }
}

/// A record written straight from a response's parts, with no list of copied fields in
/// between. This is the HTTP layer's hot path. [`Recorded::encode`] builds the same
/// bytes from owned fields. Fields the layout cannot hold are left out and named, as
/// [`Recorded::fitted`] does. The times and the tag are added before it is stored.
pub(crate) struct Draft {
    out: BytesMut,
    /// What was left out, for the log: `header <name>`, `trailer <name>`, `body`.
    dropped: Vec<String>,
}

/// A field as read from a response: name and value bytes, borrowed.
pub(crate) type FieldRef<'a> = (&'a [u8], &'a [u8]);

/// The encoded size of some fields. It is an upper bound: fields left out are counted.
fn fields_len<'a>(fields: impl Iterator<Item = FieldRef<'a>>) -> usize {
    fields.map(|(n, v)| 4 + n.len() + v.len()).sum()
}

impl Draft {
    /// Writes `status`, `headers`, `body` and `trailers` in one allocation of the exact size. A
    /// `body` of `None` means status only. It leaves room for `tail` more bytes: the times and the
    /// tag.
    ///
    /// # Errors
    /// Only for a status outside 100–999. Nothing else stops a record being written.
    pub(crate) fn write<'a, H, T>(
        status: u16,
        headers: impl Fn() -> H,
        body: Option<&[u8]>,
        trailers: Option<impl Fn() -> T>,
        declared: bool,
        tail: usize,
    ) -> Result<Self, RecordError>
    where
        H: Iterator<Item = FieldRef<'a>>,
        T: Iterator<Item = FieldRef<'a>>,
    {
        if !(100..=999).contains(&status) {
            return Err(RecordError::unencodable("status out of range"));
        }
        // A body the layout cannot hold is left out, as `fitted` does.
        let body = body.filter(|b| u32::try_from(b.len()).is_ok());
        // Sized first (the fields are walked twice), so the record is one exact allocation.
        let cap = 6
            + 2
            + fields_len(headers())
            + 4
            + body.map_or(0, <[u8]>::len)
            + trailers.as_ref().map_or(0, |t| 2 + fields_len(t()))
            + tail;
        let mut draft = Draft {
            out: BytesMut::with_capacity(cap),
            dropped: Vec::new(),
        };
        let mut flags = 0;
        if body.is_some() {
            flags |= FLAG_BODY;
        }
        if trailers.is_some() {
            flags |= FLAG_TRAILERS;
        }
        if declared {
            flags |= FLAG_DECLARED;
        }
        draft.out.put_slice(MAGIC);
        draft.out.put_u8(VERSION);
        draft.out.put_u8(flags);
        draft.out.put_u16(status);
        draft.fields(headers(), "header");
        let body = body.unwrap_or_default();
        // Checked above (a body over 4 GiB is left out).
        draft.out.put_u32(u32::try_from(body.len()).unwrap_or(0));
        draft.out.put_slice(body);
        if let Some(t) = trailers {
            draft.fields(t(), "trailer");
        }
        Ok(draft)
    }

    /// One field section: its count, then the fields that fit. The count is written last.
    fn fields<'a>(&mut self, fields: impl Iterator<Item = FieldRef<'a>>, kind: &str) {
        let at = self.out.len();
        self.out.put_u16(0);
        let mut count: u16 = 0;
        for (n, v) in fields {
            let fits = count < u16::MAX
                && n.len() <= usize::from(u16::MAX)
                && v.len() <= usize::from(u16::MAX)
                && valid_name(n)
                && valid_value(v);
            if !fits {
                self.dropped
                    .push(format!("{kind} {}", String::from_utf8_lossy(n)));
                continue;
            }
            // Both lengths checked just above.
            self.out.put_u16(u16::try_from(n.len()).unwrap_or(0));
            self.out.put_slice(n);
            self.out.put_u16(u16::try_from(v.len()).unwrap_or(0));
            self.out.put_slice(v);
            count += 1;
        }
        self.out[at..at + 2].copy_from_slice(&count.to_be_bytes());
    }

    /// Adds when the record is written and until when it is kept. No door writes times; the
    /// format still reads them.
    #[cfg(test)]
    pub(crate) fn stamp(&mut self, times: RecordTimes) {
        if self.out[3] & FLAG_TIMES != 0 {
            return;
        }
        self.out[3] |= FLAG_TIMES;
        self.out.put_u64(unix_ms(times.written_at));
        self.out.put_u64(unix_ms(times.kept_until));
    }

    /// What was left out because the layout cannot hold it. Empty when nothing was.
    pub(crate) fn dropped(&self) -> &[String] {
        &self.dropped
    }

    /// The record, tagged (or encrypted) under `secret` for this key and fingerprint when
    /// there is one.
    ///
    /// # Errors
    /// Only when encrypting, with no random bytes for the nonce.
    pub(crate) fn finish(
        self,
        secret: Option<&crate::Secret>,
        key_id: &[u8; 32],
        fingerprint: &crate::store::Fingerprint,
    ) -> Result<Record, RecordError> {
        match secret {
            Some(secret) => Record::sealed(self.out, secret, key_id, fingerprint),
            None => Ok(Record::from_bytes(self.out.freeze())),
        }
    }
}

/// Milliseconds since the Unix epoch, 0 before it.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn put_fields(out: &mut BytesMut, fields: &[Field]) -> Result<(), RecordError> {
    out.put_u16(
        u16::try_from(fields.len()).map_err(|_| RecordError::unencodable("too many fields"))?,
    );
    for (n, v) in fields {
        if !valid_name(n) || !valid_value(v) {
            return Err(RecordError::unencodable("invalid field"));
        }
        out.put_u16(
            u16::try_from(n.len()).map_err(|_| RecordError::unencodable("field name too long"))?,
        );
        out.put_slice(n);
        out.put_u16(
            u16::try_from(v.len()).map_err(|_| RecordError::unencodable("field value too long"))?,
        );
        out.put_slice(v);
    }
    Ok(())
}

/// A lowercase RFC 9110 token.
fn valid_name(n: &[u8]) -> bool {
    !n.is_empty()
        && n.iter().all(|&b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// Visible ASCII, space, tab and obs-text; never CR, LF or NUL.
fn valid_value(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| RecordError::new("truncated record"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn slice(&mut self, n: usize) -> Result<Bytes, RecordError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.buf.slice(start..self.pos))
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn fields(&mut self) -> Result<Vec<Field>, RecordError> {
        let count = self.u16()?;
        let mut out = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let n = usize::from(self.u16()?);
            let name = self.slice(n)?;
            let n = usize::from(self.u16()?);
            let value = self.slice(n)?;
            if !valid_name(&name) || !valid_value(&value) {
                return Err(RecordError::new("invalid field"));
            }
            out.push((name, value));
        }
        Ok(out)
    }
}

/// A record that cannot be encoded, or that failed validation when read back.
///
/// ```
/// use tower_idempotency::engine::{RecordErrorKind, Recorded};
///
/// let err = Recorded::new(42, vec![], None).encode().unwrap_err();
/// assert_eq!(err.kind(), RecordErrorKind::Unencodable);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    kind: RecordErrorKind,
    reason: &'static str,
}

/// What a [`RecordError`] found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordErrorKind {
    /// A record read back failed validation: truncated, damaged, or of an unknown layout.
    /// It is never replayed.
    Invalid,
    /// A record read back was not sealed by the engine's secret, or its tag does not match.
    /// Someone without the secret wrote it, moved it, or the secret changed.
    Unauthenticated,
    /// A response the record layout cannot hold: a status outside 100–999, a field over
    /// 64 KiB, more than 65 535 fields, or bytes a header may not hold.
    Unencodable,
}

impl RecordErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.record_invalid`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Invalid => "idempotency.record_invalid",
            Self::Unauthenticated => "idempotency.record_unauthenticated",
            Self::Unencodable => "idempotency.record_unencodable",
        }
    }
}

impl RecordError {
    /// A record that failed validation.
    pub(crate) const fn new(reason: &'static str) -> Self {
        Self {
            kind: RecordErrorKind::Invalid,
            reason,
        }
    }

    /// A record whose seal does not verify.
    pub(crate) const fn unauthenticated(reason: &'static str) -> Self {
        Self {
            kind: RecordErrorKind::Unauthenticated,
            reason,
        }
    }

    /// A response the layout cannot hold.
    pub(crate) const fn unencodable(reason: &'static str) -> Self {
        Self {
            kind: RecordErrorKind::Unencodable,
            reason,
        }
    }

    /// What was wrong.
    #[must_use]
    pub fn kind(&self) -> RecordErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.record_invalid`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// What was wrong, in a few words.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid idempotency record: {}", self.reason)
    }
}

impl std::error::Error for RecordError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_times_take_any_retention() {
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 60 * 60);
        assert_eq!(RecordTimes::new(now, day).kept_until, now + day);
        let longest = RecordTimes::new(now, Duration::MAX).kept_until;
        assert!(longest > now + 99 * 365 * day, "a century, not a panic");
        let late = UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX) * 64);
        assert!(RecordTimes::new(late, Duration::MAX).kept_until >= late);
    }

    fn sample() -> Recorded {
        Recorded::new(
            201,
            vec![
                (
                    Bytes::from_static(b"content-type"),
                    Bytes::from_static(b"application/json"),
                ),
                (Bytes::from_static(b"link"), Bytes::from_static(b"<a>")),
                (Bytes::from_static(b"link"), Bytes::from_static(b"<b>")),
            ],
            Some(Bytes::from_static(b"{\"id\":1}")),
        )
    }

    #[test]
    fn record_times_round_trip_to_the_millisecond() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut r = sample();
        r.times = Some(RecordTimes::new(now, Duration::from_secs(3600)));
        let back = r.encode().expect("encode").decode(1024).expect("decode");
        assert_eq!(back.times, r.times);
        assert_eq!(back, r);
    }

    #[test]
    fn the_declared_flag_round_trips() {
        let r = sample().declared();
        let back = r.encode().expect("encode").decode(1024).expect("decode");
        assert!(back.declared);
        assert!(
            !sample()
                .encode()
                .expect("encode")
                .decode(1024)
                .expect("decode")
                .declared
        );
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(r.encode().unwrap().decode(1024).unwrap(), r);
        let s = Recorded::new(204, vec![], None);
        assert_eq!(s.encode().unwrap().decode(0).unwrap(), s);
        let t = sample().with_trailers(vec![(
            Bytes::from_static(b"grpc-status"),
            Bytes::from_static(b"0"),
        )]);
        assert_eq!(t.encode().unwrap().decode(1024).unwrap(), t);
    }

    #[test]
    fn refuses_every_truncation_and_extension() {
        let bytes = sample().encode().unwrap().into_bytes();
        for n in 0..bytes.len() {
            assert!(
                Record::from_bytes(bytes.slice(..n)).decode(1024).is_err(),
                "prefix {n}"
            );
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(Record::from_bytes(longer.into()).decode(1024).is_err());
    }

    #[test]
    fn refuses_wrong_version_flags_status_and_big_bodies() {
        let bytes = sample().encode().unwrap().into_bytes().to_vec();
        let mut v = bytes.clone();
        v[2] = 2;
        assert_eq!(
            Record::from_bytes(v.into())
                .decode(1024)
                .unwrap_err()
                .reason(),
            "unknown record version"
        );
        let mut v = bytes.clone();
        v[3] |= 0x80;
        assert!(Record::from_bytes(v.into()).decode(1024).is_err());
        let mut v = bytes.clone();
        v[4..6].copy_from_slice(&5000u16.to_be_bytes());
        assert!(Record::from_bytes(v.into()).decode(1024).is_err());
        assert!(Record::from_bytes(bytes.into()).decode(3).is_err());
    }

    #[test]
    fn fitted_leaves_out_only_what_the_layout_cannot_hold() {
        let long = Bytes::from(vec![b'x'; 70 * 1024]);
        let r = Recorded::new(
            201,
            vec![
                (Bytes::from_static(b"link"), Bytes::from_static(b"<a>")),
                (Bytes::from_static(b"link"), long.clone()),
                (Bytes::from_static(b"x-bad"), Bytes::from_static(b"a\r\nb")),
            ],
            Some(Bytes::from_static(b"{}")),
        )
        .with_trailers(vec![
            (Bytes::from_static(b"grpc-status"), Bytes::from_static(b"0")),
            (Bytes::from_static(b"grpc-message"), long),
        ]);
        assert!(r.encode().is_err());
        let (fitted, dropped) = r.fitted();
        assert_eq!(
            dropped,
            ["header link", "header x-bad", "trailer grpc-message"]
        );
        assert_eq!(
            fitted.headers,
            [(Bytes::from_static(b"link"), Bytes::from_static(b"<a>"))]
        );
        assert_eq!(fitted.body, r.body);
        assert_eq!(
            fitted.trailers.as_deref(),
            Some(&[(Bytes::from_static(b"grpc-status"), Bytes::from_static(b"0"))][..])
        );
        let decoded = fitted
            .encode()
            .expect("fits")
            .decode(1024)
            .expect("decodes");
        assert_eq!(decoded, fitted);
        // A response that fits is left as it is.
        assert_eq!(sample().fitted(), (sample(), Vec::<String>::new()));
    }

    #[test]
    fn refuses_header_injection() {
        let bad = Recorded::new(
            200,
            vec![(Bytes::from_static(b"x"), Bytes::from_static(b"a\r\nb"))],
            None,
        );
        assert!(bad.encode().is_err());
        let bad = Recorded::new(
            200,
            vec![(Bytes::from_static(b"X-Up"), Bytes::from_static(b"a"))],
            None,
        );
        assert!(bad.encode().is_err());
    }
}

#[cfg(test)]
mod mac_tests {
    use super::*;
    use crate::engine::secret::Secret;
    use crate::store::Fingerprint;

    fn secret(b: u8) -> Secret {
        Secret::new(vec![b; 32]).unwrap()
    }

    #[test]
    fn sealed_records_verify_only_under_their_key_fingerprint_and_secret() {
        let fp = Fingerprint::builder().field(b"a").finish();
        let other_fp = Fingerprint::builder().field(b"b").finish();
        let r = Recorded::new(201, vec![], Some(Bytes::from_static(b"hi")));
        let sealed = r.encode().unwrap().seal(&secret(1), &[7; 32], &fp).unwrap();
        assert_eq!(
            sealed
                .decode_verified(1024, &secret(1), &[7; 32], &fp)
                .unwrap(),
            r
        );
        assert_eq!(
            sealed.decode(1024).unwrap(),
            r,
            "a tag does not stop plain decoding"
        );
        assert!(
            sealed
                .decode_verified(1024, &secret(2), &[7; 32], &fp)
                .is_err()
        );
        assert!(
            sealed
                .decode_verified(1024, &secret(1), &[8; 32], &fp)
                .is_err()
        );
        assert!(
            sealed
                .decode_verified(1024, &secret(1), &[7; 32], &other_fp)
                .is_err()
        );
        let unsealed = r.encode().unwrap();
        assert!(
            unsealed
                .decode_verified(1024, &secret(1), &[7; 32], &fp)
                .is_err()
        );
        let mut flipped = sealed.as_bytes().to_vec();
        flipped[8] ^= 1;
        assert!(
            Record::from_bytes(flipped.into())
                .decode_verified(1024, &secret(1), &[7; 32], &fp)
                .is_err()
        );
    }
}

#[cfg(test)]
mod draft_tests {
    use super::*;
    use crate::engine::secret::Secret;
    use crate::store::Fingerprint;

    fn refs(fields: &[Field]) -> impl Iterator<Item = FieldRef<'_>> {
        fields.iter().map(|(n, v)| (&n[..], &v[..]))
    }

    fn draft(r: &Recorded, tail: usize) -> Draft {
        let trailers = r.trailers.as_deref().map(|t| move || refs(t));
        Draft::write(
            r.status,
            || refs(&r.headers),
            r.body.as_deref(),
            trailers,
            r.declared,
            tail,
        )
        .expect("write")
    }

    fn sample(trailers: bool) -> Recorded {
        let b = Bytes::from_static;
        let r = Recorded::new(
            201,
            vec![
                (b(b"content-type"), b(b"application/json")),
                (b(b"link"), b(b"<a>")),
                (b(b"link"), b(b"<b>")),
            ],
            Some(b(b"{\"id\":1}")),
        );
        if trailers {
            r.with_trailers(vec![(b(b"grpc-status"), b(b"0"))])
        } else {
            r
        }
    }

    /// The same bytes as the owned record's encoding, in one allocation of the exact size.
    #[test]
    fn writes_what_encode_writes() {
        let fp = Fingerprint::builder().field(b"a").finish();
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let times = RecordTimes::new(now, Duration::from_secs(60));
        for mut r in [
            sample(false),
            sample(true),
            sample(false).declared(),
            Recorded::new(204, vec![], None),
        ] {
            let record = draft(&r, 0).finish(None, &[7; 32], &fp).unwrap();
            assert_eq!(record, r.encode().expect("encode"));
            assert_eq!(record.decode(1024).expect("decode"), r);

            let mut d = draft(&r, 16);
            d.stamp(times);
            let record = d.finish(None, &[7; 32], &fp).unwrap();
            r.times = Some(times);
            assert_eq!(record, r.encode().expect("encode"));
            assert_eq!(record.as_bytes().len(), record.len());
        }
    }

    #[test]
    fn a_tagged_draft_verifies_under_its_key_and_fingerprint_only() {
        let secret = Secret::new(vec![1; 32]).expect("secret");
        let fp = Fingerprint::builder().field(b"a").finish();
        let r = sample(true);
        let record = draft(&r, crate::engine::secret::TAG_LEN)
            .finish(Some(&secret), &[7; 32], &fp)
            .unwrap();
        assert_eq!(
            record,
            r.encode().unwrap().seal(&secret, &[7; 32], &fp).unwrap()
        );
        assert_eq!(
            record
                .decode_verified(1024, &secret, &[7; 32], &fp)
                .unwrap(),
            r
        );
        assert!(
            record
                .decode_verified(1024, &secret, &[8; 32], &fp)
                .is_err()
        );
    }

    /// A field the layout cannot hold is left out and named, but never its value. The rest is
    /// recorded, as `fitted` does for an owned record.
    #[test]
    fn leaves_out_what_does_not_fit_and_names_it() {
        let b = Bytes::from_static;
        let long = Bytes::from(vec![b'v'; 70_000]);
        let r = Recorded::new(
            200,
            vec![
                (b(b"x-big"), long.clone()),
                (b(b"content-type"), b(b"text/plain")),
                (b(b"x-bad"), b(b"a\r\nb")),
            ],
            Some(b(b"ok")),
        )
        .with_trailers(vec![(b(b"x-big-trailer"), long)]);
        let d = draft(&r, 0);
        assert_eq!(
            d.dropped(),
            ["header x-big", "header x-bad", "trailer x-big-trailer"]
        );
        let (fitted, _) = r.fitted();
        let fp = Fingerprint::builder().field(b"a").finish();
        let back = d
            .finish(None, &[7; 32], &fp)
            .unwrap()
            .decode(1024)
            .expect("decode");
        assert_eq!(back, fitted);
        assert_eq!(back.headers.len(), 1);
    }

    #[test]
    fn refuses_a_status_out_of_range() {
        let none: Option<fn() -> std::iter::Empty<FieldRef<'static>>> = None;
        for status in [0, 99, 1000] {
            assert!(Draft::write(status, std::iter::empty, None, none, false, 0).is_err());
        }
    }
}

#[cfg(all(test, feature = "encrypt"))]
mod sealed_tests {
    use super::*;
    use crate::engine::secret::Secret;
    use crate::store::Fingerprint;

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    /// Sealed under an encrypting secret: nothing but the head in the clear, a fresh nonce per
    /// record, opened by the ring only for its own key and fingerprint, never by plain decoding.
    #[test]
    fn an_encrypted_record_opens_only_under_its_ring_key_and_fingerprint() {
        let fp = Fingerprint::builder().field(b"a").finish();
        let old = Secret::new(vec![1; 32]).unwrap().encrypting();
        let r = Recorded::new(
            201,
            vec![(
                Bytes::from_static(b"location"),
                Bytes::from_static(b"/SECRETMARK"),
            )],
            Some(Bytes::from_static(b"{\"pan\":\"SECRETMARK\"}")),
        );
        let sealed = r.encode().unwrap().seal(&old, &[7; 32], &fp).unwrap();
        let again = r.encode().unwrap().seal(&old, &[7; 32], &fp).unwrap();
        assert_eq!(&sealed.as_bytes()[..4], &SEALED_HEAD);
        assert_ne!(sealed, again, "a random nonce per record");
        assert!(!contains(sealed.as_bytes(), b"SECRETMARK"));
        assert!(!contains(sealed.as_bytes(), b"location"));
        assert_eq!(sealed.len(), r.encode().unwrap().len() + 4 + 24 + 16);

        assert_eq!(
            sealed.decode_verified(1024, &old, &[7; 32], &fp).unwrap(),
            r
        );
        let rotated = old.rotated(vec![2; 32]).unwrap();
        assert_eq!(
            sealed
                .decode_verified(1024, &rotated, &[7; 32], &fp)
                .unwrap(),
            r
        );
        let refused = |s: &Secret, key: &[u8; 32], fp: &Fingerprint| {
            sealed.decode_verified(1024, s, key, fp).unwrap_err().kind()
        };
        let other_fp = Fingerprint::builder().field(b"b").finish();
        assert_eq!(
            refused(&rotated.without_previous(), &[7; 32], &fp),
            RecordErrorKind::Unauthenticated
        );
        assert_eq!(
            refused(&old, &[8; 32], &fp),
            RecordErrorKind::Unauthenticated
        );
        assert_eq!(
            refused(&old, &[7; 32], &other_fp),
            RecordErrorKind::Unauthenticated
        );
        assert!(
            sealed.decode(1024).is_err(),
            "no plain decoding of a sealed record"
        );
        // A body over the limit is refused once opened, as for any record.
        assert!(sealed.decode_verified(3, &old, &[7; 32], &fp).is_err());
        // Every truncation is refused.
        for n in 0..sealed.len() {
            let cut = Record::from_bytes(sealed.as_bytes().slice(..n));
            assert!(
                cut.decode_verified(1024, &old, &[7; 32], &fp).is_err(),
                "prefix {n}"
            );
        }
    }

    /// A sealed record holding a tagged or sealed one is refused, even with a valid seal.
    #[test]
    fn a_sealed_record_never_holds_another_seal_or_tag() {
        let fp = Fingerprint::builder().field(b"a").finish();
        let tagging = Secret::new(vec![1; 32]).unwrap();
        let encrypting = tagging.encrypting();
        let r = Recorded::new(200, vec![], Some(Bytes::from_static(b"x")));
        let tagged = r.encode().unwrap().seal(&tagging, &[7; 32], &fp).unwrap();
        let nested = tagged.seal(&encrypting, &[7; 32], &fp).unwrap();
        assert!(
            nested
                .decode_verified(1024, &encrypting, &[7; 32], &fp)
                .is_err()
        );
        let sealed = r
            .encode()
            .unwrap()
            .seal(&encrypting, &[7; 32], &fp)
            .unwrap();
        let twice = sealed.seal(&encrypting, &[7; 32], &fp).unwrap();
        assert!(
            twice
                .decode_verified(1024, &encrypting, &[7; 32], &fp)
                .is_err()
        );
    }
}
