//! The client's idempotency key: parsing and validation.
//!
//! A header value that starts with `"` is an RFC 9651 Item whose bare item must be a String.
//! Parameters after it are ignored. Anything else is taken verbatim, as many clients send bare
//! UUIDs that are not sf-tokens. It must be visible ASCII without `"`, `,` or spaces. `"abc"`
//! and `abc` are the same key.

use std::fmt;

/// The default longest key, in bytes.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 255;

/// A validated idempotency key as the client sent it, after sf-string unquoting.
///
/// A header value that starts with `"` is an RFC 9651 Item whose bare item must be a String.
/// Parameters after it are ignored. Anything else is taken verbatim, as many clients send bare
/// UUIDs that are not sf-tokens. It must be visible ASCII without `"`, `,` or spaces. `"abc"`
/// and `abc` are the same key. Keys are 1 to 255 bytes by default.
///
/// Behind an [`IdempotencyLayer`](crate::IdempotencyLayer), it is also an axum extractor. See
/// [`extract`](crate::http::extract).
///
/// Its `Debug` output is redacted, so a key never reaches a log by accident. Use
/// [`as_str`](Self::as_str) when you need the value.
///
/// ```
/// use tower_idempotency::IdempotencyKey;
///
/// let quoted = IdempotencyKey::parse_header(br#""8e03978e-40d5";p=1"#).unwrap();
/// let bare = IdempotencyKey::parse_header(b"8e03978e-40d5").unwrap();
/// assert_eq!(quoted, bare);
/// assert!(IdempotencyKey::parse_header(b"a, b").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Box<str>);

impl IdempotencyKey {
    /// Parses one header value under the key rules, with keys of 1 to 255 bytes.
    ///
    /// # Errors
    /// A [`KeyError`] saying why the value is not a key.
    pub fn parse_header(value: &[u8]) -> Result<Self, KeyError> {
        Self::parse_header_with_max_len(value, DEFAULT_MAX_KEY_LEN)
    }

    /// Parses one header value under the key rules, with keys of `1..=max_len` bytes.
    ///
    /// # Errors
    /// A [`KeyError`] saying why the value is not a key.
    pub fn parse_header_with_max_len(value: &[u8], max_len: usize) -> Result<Self, KeyError> {
        let value = trim_ows(value);
        if value.is_empty() {
            return Err(KeyError::new(KeyErrorKind::Empty));
        }
        if value[0] == b'"' {
            return Self::parse_sf_string(value, max_len);
        }
        if let Some(&b) = value.iter().find(|b| !is_bare_key_byte(**b)) {
            return Err(KeyError::new(match b {
                b',' => KeyErrorKind::List,
                b' ' | b'\t' | b'"' => KeyErrorKind::InvalidCharacter,
                0x80..=0xff => KeyErrorKind::NonAscii,
                _ => KeyErrorKind::InvalidCharacter,
            }));
        }
        let s = std::str::from_utf8(value).map_err(|_| KeyError::new(KeyErrorKind::NonAscii))?;
        Self::checked(s, max_len)
    }

    /// Validates a key that did not come from a header, such as a key closure's or a message
    /// field's. It must be 1 to 255 bytes of visible ASCII or spaces: what an sf-string can carry.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyKey;
    ///
    /// assert_eq!(IdempotencyKey::new("order-17").unwrap().as_str(), "order-17");
    /// assert!(IdempotencyKey::new("").is_err());
    /// ```
    ///
    /// # Errors
    /// A [`KeyError`] saying why the value is not a key.
    pub fn new(key: &str) -> Result<Self, KeyError> {
        Self::with_max_len(key, DEFAULT_MAX_KEY_LEN)
    }

    /// As [`new`](Self::new), with keys of `1..=max_len` bytes.
    ///
    /// # Errors
    /// A [`KeyError`] saying why the value is not a key.
    pub fn with_max_len(key: &str, max_len: usize) -> Result<Self, KeyError> {
        if let Some(b) = key.bytes().find(|b| !(0x20..=0x7e).contains(b)) {
            return Err(KeyError::new(if b >= 0x80 {
                KeyErrorKind::NonAscii
            } else {
                KeyErrorKind::InvalidCharacter
            }));
        }
        Self::checked(key, max_len)
    }

    fn parse_sf_string(value: &[u8], max_len: usize) -> Result<Self, KeyError> {
        // The common form, `"…"` with no escape and no parameter, taken as it is: the
        // characters an sf-string holds unescaped are exactly these (RFC 9651 §3.3.3). Anything
        // else goes through the parser.
        if let [b'"', inner @ .., b'"'] = value
            && inner
                .iter()
                .all(|&b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
            && let Ok(s) = std::str::from_utf8(inner)
        {
            return Self::checked(s, max_len);
        }
        let parsed = sfv::Parser::new(value).parse_item_with_visitor(StringItem);
        match parsed {
            Ok(Some(s)) => Self::checked_owned(s, max_len),
            Ok(None) => Err(KeyError::new(KeyErrorKind::NotAString)),
            Err(_) if value.iter().any(|b| *b >= 0x80) => {
                Err(KeyError::new(KeyErrorKind::NonAscii))
            }
            Err(_) if is_list(value) => Err(KeyError::new(KeyErrorKind::List)),
            Err(_) => Err(KeyError::new(KeyErrorKind::BrokenString)),
        }
    }

    fn checked(s: &str, max_len: usize) -> Result<Self, KeyError> {
        Self::check_len(s, max_len)?;
        Ok(Self(s.into()))
    }

    /// As `checked`, keeping the string it is given (no second copy).
    fn checked_owned(s: Box<str>, max_len: usize) -> Result<Self, KeyError> {
        Self::check_len(&s, max_len)?;
        Ok(Self(s))
    }

    fn check_len(s: &str, max_len: usize) -> Result<(), KeyError> {
        if s.is_empty() {
            Err(KeyError::new(KeyErrorKind::Empty))
        } else if s.len() > max_len {
            Err(KeyError::new(KeyErrorKind::TooLong { max: max_len }))
        } else {
            Ok(())
        }
    }

    /// The key as the client sent it (unquoted).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} bytes>)", self.0.len())
    }
}

/// Takes the bare item of an sf Item if it is a String, ignoring its parameters.
struct StringItem;

impl<'de> sfv::visitor::ItemVisitor<'de> for StringItem {
    type Out = Option<Box<str>>;
    type Error = sfv::Error;

    fn bare_item(
        self,
        bare_item: sfv::BareItemFromInput<'de>,
    ) -> Result<impl sfv::visitor::ParameterVisitor<'de, Out = Self::Out>, Self::Error> {
        let s = match bare_item {
            sfv::BareItemFromInput::String(s) => Some(s.as_str().into()),
            _ => None,
        };
        Ok(sfv::visitor::parameter_visitor_with(
            sfv::visitor::Ignored,
            move |()| Ok(s),
        ))
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

fn is_bare_key_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && b != b'"' && b != b','
}

/// A quoted value followed by a comma outside the quotes reads as a list.
fn is_list(value: &[u8]) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for &b in value {
        match (in_string, escaped, b) {
            (true, false, b'\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, false, b'"') => in_string = !in_string,
            (false, _, b',') => return true,
            _ => {}
        }
    }
    false
}

/// Why a value is not a valid idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    kind: KeyErrorKind,
}

impl KeyError {
    pub(crate) fn new(kind: KeyErrorKind) -> Self {
        Self { kind }
    }

    /// What was wrong with the key.
    #[must_use]
    pub fn kind(&self) -> KeyErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.key_empty`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }
}

/// The reasons a key is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyErrorKind {
    /// The value is empty (or `""`).
    Empty,
    /// The key is longer than the configured maximum.
    TooLong {
        /// The configured maximum, in bytes.
        max: usize,
    },
    /// A control character, space (outside quotes) or `"` inside a bare key.
    InvalidCharacter,
    /// A byte outside ASCII.
    NonAscii,
    /// A quoted string that does not parse (unterminated, a bad escape, trailing bytes).
    BrokenString,
    /// A structured item that is not a String (e.g. an integer after a quote was expected).
    NotAString,
    /// A list of values where one key was expected.
    List,
    /// More than one header line carried a key.
    MultipleValues,
}

impl KeyErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.key_empty`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Empty => "idempotency.key_empty",
            Self::TooLong { .. } => "idempotency.key_too_long",
            Self::InvalidCharacter => "idempotency.key_invalid_character",
            Self::NonAscii => "idempotency.key_not_ascii",
            Self::BrokenString => "idempotency.key_broken_string",
            Self::NotAString => "idempotency.key_not_a_string",
            Self::List => "idempotency.key_list",
            Self::MultipleValues => "idempotency.key_multiple_values",
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            KeyErrorKind::Empty => f.write_str("the idempotency key is empty"),
            KeyErrorKind::TooLong { max } => {
                write!(f, "the idempotency key is longer than {max} bytes")
            }
            KeyErrorKind::InvalidCharacter => f.write_str(
                "the idempotency key contains a control character, a space or a quote; quote it as an sf-string or use visible ASCII only",
            ),
            KeyErrorKind::NonAscii => f.write_str("the idempotency key contains non-ASCII bytes"),
            KeyErrorKind::BrokenString => {
                f.write_str("the idempotency key is not a valid quoted string (RFC 9651)")
            }
            KeyErrorKind::NotAString => {
                f.write_str("the idempotency key must be a string, not another structured item")
            }
            KeyErrorKind::List => f.write_str("the idempotency key must be one value, not a list"),
            KeyErrorKind::MultipleValues => {
                f.write_str("the idempotency key header must appear exactly once")
            }
        }
    }
}

impl std::error::Error for KeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[u8]) -> Result<IdempotencyKey, KeyErrorKind> {
        IdempotencyKey::parse_header_with_max_len(v, 16).map_err(|e| e.kind())
    }

    #[test]
    fn the_plain_quoted_form_reads_as_the_parser_reads_it() {
        // Every character an sf-string holds unescaped, taken without the parser, gives what
        // the parser gives.
        for b in (0x20u8..=0x7e).filter(|b| *b != b'"' && *b != b'\\') {
            let value = [b'"', b'k', b, b'"'];
            let expected = sfv::Parser::new(&value)
                .parse_item_with_visitor(StringItem)
                .expect("an sf-string")
                .expect("a string");
            assert_eq!(parse(&value).unwrap().as_str(), &*expected, "byte {b:#x}");
        }
        assert_eq!(parse(b"\"\""), Err(KeyErrorKind::Empty));
        assert_eq!(parse(b"\"abc\"def\""), Err(KeyErrorKind::BrokenString));
        assert_eq!(
            parse(b"\"0123456789abcdefg\""),
            Err(KeyErrorKind::TooLong { max: 16 })
        );
    }

    #[test]
    fn quoted_and_bare_are_one_key() {
        assert_eq!(parse(b"\"abc\"").unwrap(), parse(b"abc").unwrap());
        assert_eq!(parse(b"  \"abc\";x=1 ").unwrap().as_str(), "abc");
        assert_eq!(parse(br#""a\"b\\c""#).unwrap().as_str(), r#"a"b\c"#);
        assert_eq!(parse(b"\"a b\"").unwrap().as_str(), "a b");
        assert_eq!(parse(b"123e4567-e89b").unwrap().as_str(), "123e4567-e89b");
    }

    #[test]
    fn refuses_bad_values_with_a_reason() {
        assert_eq!(parse(b""), Err(KeyErrorKind::Empty));
        assert_eq!(parse(b"\"\""), Err(KeyErrorKind::Empty));
        assert_eq!(parse(b"   "), Err(KeyErrorKind::Empty));
        assert_eq!(parse(&[b'a'; 17]), Err(KeyErrorKind::TooLong { max: 16 }));
        assert_eq!(parse(b"a\x01b"), Err(KeyErrorKind::InvalidCharacter));
        assert_eq!(parse(b"a b"), Err(KeyErrorKind::InvalidCharacter));
        assert_eq!(parse("ké".as_bytes()), Err(KeyErrorKind::NonAscii));
        assert_eq!(parse(b"a,b"), Err(KeyErrorKind::List));
        assert_eq!(parse(b"\"a\", \"b\""), Err(KeyErrorKind::List));
        assert_eq!(parse(b"\"abc"), Err(KeyErrorKind::BrokenString));
        assert_eq!(parse(b"\"a\\x\""), Err(KeyErrorKind::BrokenString));
        assert_eq!(parse("\"ké\"".as_bytes()), Err(KeyErrorKind::NonAscii));
    }

    #[test]
    fn debug_is_redacted() {
        let k = parse(b"secret").unwrap();
        assert!(!format!("{k:?}").contains("secret"));
    }
}
