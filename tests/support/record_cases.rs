//! Record-decoder inputs that start as valid records: a record drawn from the input bytes is
//! encoded, then damaged (bytes flipped, cut, extended, inserted or removed; a length, count,
//! status, time or the flags rewritten), so decoding reaches every field instead of stopping at
//! the magic. Shared by the cargo-fuzz target `record_decoder` and its stand-in in the `http`
//! test binary; each mounts this file with `#[path]`.

// The fuzz target does not tally how far its cases reach.
#![allow(dead_code)]

use bytes::Bytes;
use std::time::{Duration, UNIX_EPOCH};
use tower_idempotency::engine::{RecordErrorKind, RecordTimes, Recorded};
use tower_idempotency::store::Record;

/// The body limit the decoder is given: small, so a rewritten body length can pass it.
pub(crate) const MAX_BODY: usize = 64 * 1024;
const FLAG_MAC: u8 = 0b0000_0100;
const KNOWN_FLAGS: u8 = 0b0001_1111;
const TAG_LEN: usize = 32;

/// The choices of one case, read from fuzzer or proptest bytes; zeros once they run out.
pub(crate) struct Source<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Source<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| acc << 8 | u64::from(self.byte()))
    }
    /// A number below `n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        let r = usize::from(self.byte()) << 8 | usize::from(self.byte());
        r % n
    }
    fn chance(&mut self, in_256: u8) -> bool {
        self.byte() < in_256
    }
    fn pick_from(&mut self, set: &[u8], max: usize) -> Bytes {
        let n = self.below(max + 1);
        (0..n).map(|_| set[self.below(set.len())]).collect()
    }
}

const NAME: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_.!#$%&'*+^`|~";

fn fields(src: &mut Source<'_>) -> Vec<(Bytes, Bytes)> {
    let value: Vec<u8> = (0x20..0x7f).chain([b'\t', 0x80, 0xff]).collect();
    let n = src.below(4);
    (0..n)
        .map(|_| {
            let mut name = src.pick_from(NAME, 10);
            if name.is_empty() {
                name = Bytes::from_static(b"x");
            }
            (name, src.pick_from(&value, 12))
        })
        .collect()
}

/// A valid response drawn from `src`, every optional part present about half the time.
pub(crate) fn response(src: &mut Source<'_>) -> Recorded {
    let status = 100 + u16::try_from(src.below(900)).unwrap_or(0);
    let headers = fields(src);
    let body = src
        .chance(192)
        .then(|| (0..src.below(48)).map(|_| src.byte()).collect::<Bytes>());
    let mut r = Recorded::new(status, headers, body);
    if src.chance(128) {
        let trailers = fields(src);
        r = r.with_trailers(trailers);
    }
    if src.chance(64) {
        r = r.declared();
    }
    if src.chance(128) {
        let written = UNIX_EPOCH + Duration::from_millis(src.u64() >> 20);
        r.times = Some(RecordTimes::new(
            written,
            Duration::from_millis(src.u64() >> 30),
        ));
    }
    r
}

/// Where a valid record's numbers are: (offset, width) of the version, flags, status, each
/// count and length, and the times.
fn numbers(rec: &[u8]) -> Vec<(usize, usize)> {
    let be = |at: usize, w: usize| {
        rec[at..at + w]
            .iter()
            .fold(0usize, |a, b| a << 8 | *b as usize)
    };
    let mut out = vec![(2, 1), (3, 1), (4, 2)];
    let mut pos = 6;
    let walk_fields = |pos: &mut usize, out: &mut Vec<(usize, usize)>| {
        out.push((*pos, 2));
        let count = be(*pos, 2);
        *pos += 2;
        for _ in 0..2 * count {
            out.push((*pos, 2));
            *pos += 2 + be(*pos, 2);
        }
    };
    walk_fields(&mut pos, &mut out);
    out.push((pos, 4));
    pos += 4 + be(pos, 4);
    if rec[3] & 0b10 != 0 {
        walk_fields(&mut pos, &mut out);
    }
    if rec[3] & 0b1_0000 != 0 {
        out.push((pos, 8));
        out.push((pos + 8, 8));
    }
    out
}

/// One input: a valid record (sealed with a tag about a quarter of the time) and up to three
/// kinds of damage; one case in eight is left undamaged.
pub(crate) fn case(data: &[u8]) -> Vec<u8> {
    let mut src = Source::new(data);
    let r = response(&mut src);
    let mut rec = r
        .encode()
        .expect("a drawn response encodes")
        .as_bytes()
        .to_vec();
    let numbers = numbers(&rec);
    if src.chance(64) {
        rec[3] |= FLAG_MAC;
        rec.extend((0..TAG_LEN).map(|_| src.byte()));
    }
    let damages = if src.chance(32) { 0 } else { 1 + src.below(3) };
    for _ in 0..damages {
        let len = rec.len();
        // Most damage lands past the 6-byte header, so most cases reach the fields; one in
        // eight may land anywhere.
        let from = if src.chance(32) { 0 } else { 6.min(len) };
        match src.below(7) {
            0 if len > from => {
                let at = from + src.below(len - from);
                rec[at] ^= src.byte() | 1;
            }
            1 => rec.truncate(from + src.below(len - from + 1)),
            2 => rec.extend((0..=src.below(16)).map(|_| src.byte())),
            3 => {
                let at = from + src.below(len - from + 1);
                let b = src.byte();
                rec.insert(at, b);
            }
            4 if len > from => {
                let at = from + src.below(len - from);
                rec.remove(at);
            }
            5 if len > 3 => rec[3] ^= 1 << src.below(if from == 0 { 8 } else { 5 }),
            _ => {
                let header = if from == 0 {
                    0
                } else {
                    3.min(numbers.len() - 1)
                };
                let (at, width) = numbers[header + src.below(numbers.len() - header)];
                if at + width > rec.len() {
                    continue;
                }
                let old = rec[at..at + width]
                    .iter()
                    .fold(0u64, |a, b| a << 8 | u64::from(*b));
                let new = match src.below(5) {
                    0 => old.wrapping_add(1),
                    1 => old.wrapping_sub(1),
                    2 => 0,
                    3 => u64::MAX,
                    _ => src.u64(),
                };
                let bytes = new.to_be_bytes();
                rec[at..at + width].copy_from_slice(&bytes[8 - width..]);
            }
        }
    }
    rec
}

/// How far into a record the decoder got, judged from the input alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The first two bytes are not the magic.
    Magic,
    /// Past the magic; the version, flags or status are wrong, or the record is cut inside them.
    Header,
    /// A valid header: the decoder reads the fields, body, trailers and times.
    Fields,
}

/// The bytes the decoder reads as content: a tagged record without its tag.
fn content(input: &[u8]) -> &[u8] {
    match input.get(3) {
        Some(f) if f & FLAG_MAC != 0 => &input[..input.len().saturating_sub(TAG_LEN)],
        _ => input,
    }
}

pub(crate) fn reach(input: &[u8]) -> Reach {
    let c = content(input);
    if !c.starts_with(b"TI") {
        return Reach::Magic;
    }
    let header_ok = c.len() >= 6
        && c[2] == 1
        && c[3] & !KNOWN_FLAGS == 0
        && (100..=999).contains(&u16::from_be_bytes([c[4], c[5]]));
    if header_ok {
        Reach::Fields
    } else {
        Reach::Header
    }
}

/// Decodes `input`, which must not panic. A record that decodes re-encodes to the same bytes
/// (less the tag and its flag: the decoder does not check a tag) and decodes to the same
/// response again. Returns the decoder's refusal, if any.
pub(crate) fn check(input: &[u8]) -> Result<(), &'static str> {
    let response = match Record::from_bytes(Bytes::copy_from_slice(input)).decode(MAX_BODY) {
        Ok(r) => r,
        Err(e) => {
            // A record of this layout flagged as sealed needs its secret: refused as such.
            let sealed =
                input.len() >= 4 && input[..3] == [b'T', b'I', 1] && input[3] & 0b0010_0000 != 0;
            let want = if sealed {
                RecordErrorKind::Unauthenticated
            } else {
                RecordErrorKind::Invalid
            };
            assert_eq!(e.kind(), want, "{e}");
            return Err(e.reason());
        }
    };
    let again = response.encode().expect("a decoded record re-encodes");
    let mut want = content(input).to_vec();
    want[3] &= !FLAG_MAC;
    assert_eq!(
        again.as_bytes().as_ref(),
        want.as_slice(),
        "re-encoded bytes"
    );
    assert_eq!(again.decode(MAX_BODY).expect("re-decodes"), response);
    Ok(())
}
