//! The bytes the store writes and reads: key names, values, and numeric arguments.
//!
//! The layout is described in the [module docs](super#keys-and-values).

use super::error::protocol;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreKey;
use crate::store::{Claim, Inspected, StepId, StepRecorded, StoreError, Token};
use ::redis::Value;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::time::Duration;

const NAMESPACE_DOMAIN: &[u8] = b"tower-idempotency/redis-ns/v1";
pub(super) const PENDING: u8 = b'P';
pub(super) const DONE: u8 = b'D';
/// End of the fingerprint, after the state byte.
pub(super) const FP_END: usize = 1 + 32;
/// A pending value: state byte, fingerprint, token.
pub(super) const PENDING_LEN: usize = FP_END + 16;
/// Longest expiry sent to Redis (about 100 years): far past any lease or retention, and far
/// from the overflow Redis refuses when it adds an expiry to its clock.
pub(super) const MAX_EXPIRY_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `ti:` and the first 16 hex digits of the store prefix's domain-separated SHA-256.
pub(super) fn prefix_of(prefix: &str) -> Result<String, ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the Redis store's prefix must not be empty",
        ));
    }
    let mut h = Sha256::new();
    h.update(NAMESPACE_DOMAIN);
    h.update(prefix.as_bytes());
    let digest = h.finalize();
    Ok(format!("ti:{}", crate::hex::encode(&digest[..8])))
}

/// `'P' fingerprint token`: the value of a key held pending.
pub(super) fn pending_value(fingerprint: &Fingerprint, token: &Token) -> [u8; PENDING_LEN] {
    let mut pending = [0u8; PENDING_LEN];
    pending[0] = PENDING;
    pending[1..FP_END].copy_from_slice(fingerprint.as_bytes());
    pending[FP_END..].copy_from_slice(token.as_bytes());
    pending
}

/// One argument of a command: bytes as they are, or a done value.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Bytes(&'a [u8]),
    /// `'D' fingerprint record`, the value of a completed key, written straight into the
    /// command: the record is copied once, into the command's buffer.
    Done(&'a Fingerprint, &'a [u8]),
}

impl Arg<'_> {
    /// The argument's length in bytes.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::Done(_, record) => FP_END + record.len(),
        }
    }
}

impl ::redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + ::redis::RedisWrite,
    {
        match self {
            Self::Bytes(b) => out.write_arg(b),
            Self::Done(fingerprint, record) => {
                use std::io::Write as _;
                let mut w = out.writer_for_next_arg();
                // Writes into the command's own buffer: they cannot fail.
                let _ = w.write_all(&[DONE]);
                let _ = w.write_all(fingerprint.as_bytes());
                let _ = w.write_all(record);
            }
        }
    }
}

/// A duration as whole milliseconds for `PX`/`PEXPIRE`: rounded up, at least 1, at most
/// [`MAX_EXPIRY_MS`].
pub(super) fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_EXPIRY_MS)
}

/// A number's decimal digits, on the stack (a command argument).
pub(super) struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    #[allow(clippy::cast_possible_truncation)] // `n % 10` is a digit
    pub(super) fn new(mut n: u64) -> Self {
        let mut buf = [b'0'; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Self { buf, start };
            }
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `<prefix>:{<64 hex digits>}`, the Redis key of a record, on the stack: every command names
/// its key, and the hot path makes no allocation for it.
pub(super) struct KeyBytes {
    buf: [u8; KEY_LEN],
}

/// `ti:` + 16 hex digits, `:{`, 64 hex digits, `}`.
const KEY_LEN: usize = 3 + 16 + 2 + 64 + 1;

impl KeyBytes {
    pub(super) fn new(prefix: &str, key: &StoreKey) -> Self {
        let mut buf = [0u8; KEY_LEN];
        let p = prefix.as_bytes();
        // Every prefix is made by `prefix_of`: `ti:` and 16 hex digits.
        debug_assert_eq!(p.len(), 19);
        buf[..19].copy_from_slice(&p[..19]);
        buf[19..21].copy_from_slice(b":{");
        crate::hex::encode_into(key.id(), &mut buf[21..KEY_LEN - 1]);
        buf[KEY_LEN - 1] = b'}';
        Self { buf }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// `<prefix>:{<64 hex digits>}:s`, the Redis key of a record's steps (a hash, step id →
/// value). Same hash tag as the record, so same cluster slot: forget's script deletes both.
pub(super) struct StepsKeyBytes {
    buf: [u8; KEY_LEN + STEPS_SUFFIX.len()],
}

const STEPS_SUFFIX: &[u8] = b":s";

impl StepsKeyBytes {
    pub(super) fn new(record: &KeyBytes) -> Self {
        let mut buf = [0u8; KEY_LEN + STEPS_SUFFIX.len()];
        buf[..KEY_LEN].copy_from_slice(&record.buf);
        buf[KEY_LEN..].copy_from_slice(STEPS_SUFFIX);
        Self { buf }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// The answer to a claim, by the way it was sent: each way has its own "claimed" answer.
pub(super) enum ClaimReply {
    /// `SET … NX PX … GET`: nil when claimed, else the value found.
    Native(Value),
    /// The claim script: 1 when claimed, else the value found.
    Script(Value),
}

/// Reads a claim's answer. Strict: anything but the way's "claimed" answer or a value of the
/// store's layout is a protocol error, never a claim.
pub(super) fn parse_claim(reply: ClaimReply, token: Token) -> Result<Claim, StoreError> {
    match reply {
        ClaimReply::Native(Value::Nil) | ClaimReply::Script(Value::Int(1)) => {
            Ok(Claim::Claimed(token))
        }
        ClaimReply::Native(Value::BulkString(stored))
        | ClaimReply::Script(Value::BulkString(stored)) => parse_stored(stored),
        _ => Err(protocol("unexpected answer to claim")),
    }
}

/// Parses a value the claim found under the key. Strict: a value of another layout is
/// a protocol error, never a claim.
pub(super) fn parse_stored(stored: Vec<u8>) -> Result<Claim, StoreError> {
    let fingerprint = |b: &[u8]| -> Fingerprint {
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&b[1..FP_END]);
        Fingerprint::from_bytes(fp)
    };
    match stored.first() {
        Some(&PENDING) if stored.len() == PENDING_LEN => Ok(Claim::Pending {
            fingerprint: fingerprint(&stored),
        }),
        Some(&DONE) if stored.len() >= FP_END => {
            let fp = fingerprint(&stored);
            let record = Record::from_bytes(Bytes::from(stored).slice(FP_END..));
            Ok(Claim::Done {
                fingerprint: fp,
                record,
            })
        }
        _ => Err(protocol("unrecognised value under an idempotency key")),
    }
}

/// Reads the inspect script's answer: nil, or the value under the key and its `PTTL`. A
/// value is parsed as a claim parses it; a key without an expiry (`-1`, never written so by
/// this store) reads as kept as long as the store keeps anything.
pub(super) fn parse_inspected(reply: Value) -> Result<Inspected, StoreError> {
    match reply {
        Value::Nil => Ok(Inspected::Absent),
        Value::Array(parts) => match <[Value; 2]>::try_from(parts) {
            Ok([Value::BulkString(stored), Value::Int(ms)]) => {
                let left = match u64::try_from(ms) {
                    Ok(ms) => Duration::from_millis(ms),
                    // Expired between GET and PTTL cannot happen in a script.
                    Err(_) if ms == -2 => return Ok(Inspected::Absent),
                    Err(_) => Duration::from_millis(MAX_EXPIRY_MS),
                };
                Inspected::of(parse_stored(stored)?, left)
            }
            _ => Err(protocol("unexpected answer to inspect")),
        },
        _ => Err(protocol("unexpected answer to inspect")),
    }
}

/// Reads `record_step`'s answer: 1 when recorded, else the bytes recorded first.
pub(super) fn parse_step_recorded(reply: Value) -> Result<StepRecorded, StoreError> {
    match reply {
        Value::Int(1) => Ok(StepRecorded::Recorded),
        Value::BulkString(first) => Ok(StepRecorded::Found(Bytes::from(first))),
        _ => Err(protocol("unexpected answer to record_step")),
    }
}

/// Reads the steps script's answer (`HGETALL` inside a script, a flat array on RESP2 and RESP3
/// alike: field, value, field, value…). Strict: a field that is not a
/// 32-byte step id, or an odd count, is a protocol error.
pub(super) fn parse_steps(reply: Value) -> Result<Vec<(StepId, Bytes)>, StoreError> {
    let step = |field: Value, value: Value| match (field, value) {
        (Value::BulkString(id), Value::BulkString(value)) => {
            let id: [u8; 32] = id
                .try_into()
                .map_err(|_| protocol("a step id under a key is not 32 bytes"))?;
            Ok((StepId::from_bytes(id), Bytes::from(value)))
        }
        _ => Err(protocol("unexpected step in the answer to steps")),
    };
    match reply {
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut items = items.into_iter();
            let mut steps = Vec::with_capacity(items.len() / 2);
            while let (Some(field), Some(value)) = (items.next(), items.next()) {
                steps.push(step(field, value)?);
            }
            Ok(steps)
        }
        _ => Err(protocol("unexpected answer to steps")),
    }
}

/// The 1/0 answer of complete, release and renew; anything else is a protocol error.
pub(super) fn flag(reply: Value, unexpected: &'static str) -> Result<bool, StoreError> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(protocol(unexpected)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::StoreErrorKind;

    #[test]
    fn prefix_hides_the_store_prefix() {
        let p = prefix_of("orders").unwrap();
        assert_eq!(p.len(), 3 + 16);
        assert!(p.starts_with("ti:") && !p.contains("orders"));
        assert_ne!(p, prefix_of("orders2").unwrap());
        assert_eq!(
            prefix_of("").map_err(|e| e.kind()),
            Err(ConfigErrorKind::InvalidName)
        );
    }

    #[test]
    fn millis_round_up_and_stay_in_range() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_secs(60)), 60_000);
        assert_eq!(millis(Duration::MAX), MAX_EXPIRY_MS);
        for n in [0, 1, 9, 10, 60_000, MAX_EXPIRY_MS, u64::MAX] {
            assert_eq!(Digits::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn key_bytes_match_the_documented_key() {
        let prefix = prefix_of("orders").unwrap();
        // Any two hashes: the store never derives a key.
        let key = StoreKey::from_parts([3; 32], [0xa7; 32]);
        assert_eq!(
            KeyBytes::new(&prefix, &key).as_bytes(),
            format!("{prefix}:{{{}}}", key.id_hex()).as_bytes()
        );
    }

    #[test]
    fn a_keys_steps_share_its_hash_tag() {
        let prefix = prefix_of("orders").unwrap();
        // Any two hashes: the store never derives a key.
        let key = StoreKey::from_parts([3; 32], [0xa7; 32]);
        let record = KeyBytes::new(&prefix, &key);
        assert_eq!(
            StepsKeyBytes::new(&record).as_bytes(),
            format!("{prefix}:{{{}}}:s", key.id_hex()).as_bytes()
        );
        // Redis Cluster hashes what lies between the first `{` and the next `}`.
        let tag = |k: &[u8]| {
            let open = k.iter().position(|&b| b == b'{').unwrap();
            let close = open + k[open..].iter().position(|&b| b == b'}').unwrap();
            k[open + 1..close].to_vec()
        };
        assert_eq!(
            tag(record.as_bytes()),
            tag(StepsKeyBytes::new(&record).as_bytes())
        );
    }

    #[test]
    fn step_answers_are_strict() {
        assert_eq!(
            parse_step_recorded(Value::Int(1)).unwrap(),
            StepRecorded::Recorded
        );
        assert_eq!(
            parse_step_recorded(Value::BulkString(Vec::new())).unwrap(),
            StepRecorded::Found(Bytes::new())
        );
        for bad in [Value::Int(0), Value::Nil, Value::Okay] {
            assert_eq!(
                parse_step_recorded(bad).unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
        let id = Value::BulkString(vec![7; 32]);
        let steps = parse_steps(Value::Array(vec![
            id.clone(),
            Value::BulkString(b"\0v".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            steps,
            [(StepId::from_bytes([7; 32]), Bytes::from_static(b"\0v"))]
        );
        assert!(parse_steps(Value::Array(vec![])).unwrap().is_empty());
        for bad in [
            Value::Array(vec![id.clone()]),
            Value::Array(vec![
                Value::BulkString(vec![7; 31]),
                Value::BulkString(vec![]),
            ]),
            Value::Array(vec![id, Value::Int(1)]),
            Value::Nil,
        ] {
            assert_eq!(
                parse_steps(bad).unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
    }

    #[test]
    fn values_have_the_documented_layout() {
        let fp = Fingerprint::from_bytes([7; 32]);
        let token = Token::generate().unwrap();
        let pending = pending_value(&fp, &token);
        assert_eq!(
            pending.to_vec(),
            [&b"P"[..], &[7; 32], token.as_bytes()].concat()
        );
        assert_eq!(
            parse_stored(pending.to_vec()).unwrap(),
            Claim::Pending { fingerprint: fp }
        );
        let done = ::redis::ToRedisArgs::to_redis_args(&Arg::Done(&fp, b"rec"));
        assert_eq!(done, [[&b"D"[..], &[7; 32], b"rec"].concat()]);
        assert_eq!(Arg::Done(&fp, b"rec").len(), done[0].len());
    }

    #[test]
    fn parses_pending_and_done_values() {
        let mut v = vec![PENDING];
        v.extend_from_slice(&[7; 32]);
        v.extend_from_slice(&[9; 16]);
        assert_eq!(
            parse_stored(v).unwrap(),
            Claim::Pending {
                fingerprint: Fingerprint::from_bytes([7; 32])
            }
        );
        let mut v = vec![DONE];
        v.extend_from_slice(&[7; 32]);
        v.extend_from_slice(b"rec");
        let Claim::Done {
            fingerprint,
            record,
        } = parse_stored(v).unwrap()
        else {
            panic!("done")
        };
        assert_eq!(fingerprint, Fingerprint::from_bytes([7; 32]));
        assert_eq!(record.as_bytes().as_ref(), b"rec");
    }

    #[test]
    fn refuses_values_of_another_layout() {
        let mut pending = vec![PENDING];
        pending.extend_from_slice(&[0; 48]);
        for bad in [
            vec![],
            vec![b'X'; 49],
            pending[..48].to_vec(),
            [&pending[..], b"x"].concat(),
            vec![DONE; 32],
        ] {
            let err = parse_stored(bad).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol);
        }
    }

    #[test]
    fn each_way_of_claiming_has_its_own_claimed_answer() {
        let token = || Token::generate().unwrap();
        assert!(matches!(
            parse_claim(ClaimReply::Native(Value::Nil), token()),
            Ok(Claim::Claimed(_))
        ));
        assert!(matches!(
            parse_claim(ClaimReply::Script(Value::Int(1)), token()),
            Ok(Claim::Claimed(_))
        ));
        for bad in [
            ClaimReply::Native(Value::Int(1)),
            ClaimReply::Script(Value::Nil),
            ClaimReply::Native(Value::Okay),
            ClaimReply::Script(Value::Int(0)),
        ] {
            assert_eq!(
                parse_claim(bad, token()).unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
    }

    #[test]
    fn flags_are_strict() {
        assert!(flag(Value::Int(1), "renew").unwrap());
        assert!(!flag(Value::Int(0), "renew").unwrap());
        for bad in [
            Value::Int(2),
            Value::Nil,
            Value::BulkString(b"1".to_vec()),
            Value::Okay,
        ] {
            assert_eq!(
                flag(bad, "renew").unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
    }

    #[test]
    fn scripts_check_the_pending_layout() {
        // The scripts index the token at bytes 34..=49 of a 49-byte pending value ('P' = 80).
        assert_eq!((PENDING_LEN, FP_END + 1, PENDING), (49, 34, 80));
        for src in [
            include_str!("complete.lua"),
            include_str!("release.lua"),
            include_str!("renew.lua"),
        ] {
            assert!(src.contains(
                "#held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1]"
            ));
        }
    }
}
