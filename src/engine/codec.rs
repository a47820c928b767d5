//! How a door keeps a result in its record, and reads it back for a repeat.

use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future: what the crate's hooks and trait methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Turns a result into the bytes of its record, and back for a repeat.
///
/// One codec serves every door that keeps results: a message handler's result, an outbound
/// send's receipt. [`Raw`] keeps bytes and text as they are, [`Json`] (feature `json`) any
/// `Serialize + DeserializeOwned` value, and [`Discard`] keeps nothing.
///
/// ```
/// use bytes::Bytes;
/// use tower_idempotency::engine::{Codec, Raw};
///
/// let bytes = Raw.encode(&String::from("receipt")).unwrap();
/// let back: String = Raw.decode(bytes).unwrap();
/// assert_eq!(back, "receipt");
/// ```
pub trait Codec<T>: Send + Sync + 'static {
    /// The bytes to record.
    ///
    /// # Errors
    /// `value` cannot be encoded. The work still counts as done: the door says what it does
    /// then (the outbound door holds the key, the message door records no result).
    fn encode(&self, value: &T) -> Result<Bytes, CodecError>;

    /// The value read back from bytes that [`encode`](Self::encode) made.
    ///
    /// # Errors
    /// The bytes are not such a value: the record is refused as invalid and nothing runs.
    fn decode(&self, bytes: Bytes) -> Result<T, CodecError>;

    /// A smaller form of `value`, for when [`encode`](Self::encode)'s bytes are over the
    /// engine's record limit (an HTTP response: its status and headers). `None`, the default:
    /// there is none.
    fn encode_fitted(&self, value: &T) -> Option<Bytes> {
        let _ = value;
        None
    }

    /// Whether the codec keeps values at all. [`Discard`] does not: a repeat is answered
    /// without a value.
    fn keeps_values(&self) -> bool {
        true
    }
}

/// Keeps nothing: a repeat is answered without the first run's value.
#[derive(Clone, Copy, Debug, Default)]
pub struct Discard;

impl<T> Codec<T> for Discard {
    fn encode(&self, _: &T) -> Result<Bytes, CodecError> {
        Ok(Bytes::new())
    }

    fn decode(&self, _: Bytes) -> Result<T, CodecError> {
        Err(CodecError::new(
            CodecErrorKind::Decode,
            "the codec keeps no values",
        ))
    }

    fn keeps_values(&self) -> bool {
        false
    }
}

/// Keeps bytes and text as they are: [`Bytes`], `Vec<u8>`, `String` and `()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl Codec<Bytes> for Raw {
    fn encode(&self, value: &Bytes) -> Result<Bytes, CodecError> {
        Ok(value.clone())
    }

    fn decode(&self, bytes: Bytes) -> Result<Bytes, CodecError> {
        Ok(bytes)
    }
}

impl Codec<Vec<u8>> for Raw {
    fn encode(&self, value: &Vec<u8>) -> Result<Bytes, CodecError> {
        Ok(Bytes::copy_from_slice(value))
    }

    fn decode(&self, bytes: Bytes) -> Result<Vec<u8>, CodecError> {
        Ok(bytes.into())
    }
}

impl Codec<String> for Raw {
    fn encode(&self, value: &String) -> Result<Bytes, CodecError> {
        Ok(Bytes::copy_from_slice(value.as_bytes()))
    }

    fn decode(&self, bytes: Bytes) -> Result<String, CodecError> {
        String::from_utf8(bytes.into()).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Decode, "recorded text is not UTF-8", e)
        })
    }
}

impl Codec<()> for Raw {
    fn encode(&self, (): &()) -> Result<Bytes, CodecError> {
        Ok(Bytes::new())
    }

    fn decode(&self, bytes: Bytes) -> Result<(), CodecError> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(CodecError::new(
                CodecErrorKind::Decode,
                "bytes recorded where nothing was expected",
            ))
        }
    }
}

/// Keeps any `Serialize + DeserializeOwned` value as JSON (feature `json`).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tower_idempotency::engine::{Codec, Json};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Charge { id: String, amount: u64 }
///
/// let charge = Charge { id: "ch_1".into(), amount: 500 };
/// let back: Charge = Json.decode(Json.encode(&charge).unwrap()).unwrap();
/// assert_eq!(back, charge);
/// ```
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

#[cfg(feature = "json")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Codec<T> for Json {
    fn encode(&self, value: &T) -> Result<Bytes, CodecError> {
        serde_json::to_vec(value).map(Bytes::from).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Encode, "the value does not serialize", e)
        })
    }

    fn decode(&self, bytes: Bytes) -> Result<T, CodecError> {
        serde_json::from_slice(&bytes).map_err(|e| {
            CodecError::with_source(CodecErrorKind::Decode, "the record does not deserialize", e)
        })
    }
}

/// A value a [`Codec`] could not encode, or bytes it could not decode.
#[derive(Debug)]
pub struct CodecError {
    kind: CodecErrorKind,
    message: &'static str,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What a [`CodecError`] failed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecErrorKind {
    /// The value could not be turned into bytes.
    Encode,
    /// The bytes could not be turned back into a value.
    Decode,
}

impl CodecErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.encode_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Encode => "idempotency.encode_failed",
            Self::Decode => "idempotency.decode_failed",
        }
    }
}

impl CodecError {
    /// An error with a short message.
    #[must_use]
    pub fn new(kind: CodecErrorKind, message: &'static str) -> Self {
        Self {
            kind,
            message,
            source: None,
        }
    }

    /// An error with a short message, caused by `source`.
    #[must_use]
    pub fn with_source(
        kind: CodecErrorKind,
        message: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            kind,
            message,
            source: Some(source.into()),
        }
    }

    /// What failed.
    #[must_use]
    pub fn kind(&self) -> CodecErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.encode_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "codec: {}", self.message)
    }
}

impl std::error::Error for CodecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
