//! How a handler's result is kept, so a completed duplicate can be answered with it.

use bytes::Bytes;

/// Turns a handler's result into bytes for the record, and back for a duplicate.
///
/// [`Discard`] (the default) keeps nothing: a duplicate is acknowledged without a result.
/// [`Raw`] keeps results that are bytes or text; [`Json`] (feature `json`) any
/// `Serialize + DeserializeOwned` result.
pub trait ResultCodec<R>: Send + Sync + 'static {
    /// The bytes to record, or `None` to record that the message was handled, without a result.
    fn encode(&self, result: &R) -> Option<Bytes>;

    /// The result from recorded bytes; `None` when they do not decode (the record is then
    /// refused as invalid).
    fn decode(&self, bytes: Bytes) -> Option<R>;
}

/// Keeps no result: a completed duplicate is answered `Duplicate(None)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Discard;

impl<R> ResultCodec<R> for Discard {
    fn encode(&self, _: &R) -> Option<Bytes> {
        None
    }

    fn decode(&self, _: Bytes) -> Option<R> {
        None
    }
}

/// Keeps results that are bytes or text as they are: [`Bytes`], `Vec<u8>`, `String`, `()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl ResultCodec<Bytes> for Raw {
    fn encode(&self, result: &Bytes) -> Option<Bytes> {
        Some(result.clone())
    }

    fn decode(&self, bytes: Bytes) -> Option<Bytes> {
        Some(bytes)
    }
}

impl ResultCodec<Vec<u8>> for Raw {
    fn encode(&self, result: &Vec<u8>) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(result))
    }

    fn decode(&self, bytes: Bytes) -> Option<Vec<u8>> {
        Some(bytes.into())
    }
}

impl ResultCodec<String> for Raw {
    fn encode(&self, result: &String) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(result.as_bytes()))
    }

    fn decode(&self, bytes: Bytes) -> Option<String> {
        String::from_utf8(bytes.into()).ok()
    }
}

impl ResultCodec<()> for Raw {
    fn encode(&self, (): &()) -> Option<Bytes> {
        Some(Bytes::new())
    }

    fn decode(&self, bytes: Bytes) -> Option<()> {
        bytes.is_empty().then_some(())
    }
}

/// Keeps any `Serialize + DeserializeOwned` result as JSON (feature `json`).
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

#[cfg(feature = "json")]
impl<R> ResultCodec<R> for Json
where
    R: serde::Serialize + serde::de::DeserializeOwned,
{
    fn encode(&self, result: &R) -> Option<Bytes> {
        match serde_json::to_vec(result) {
            Ok(v) => Some(v.into()),
            Err(e) => {
                tracing::warn!(error = %e, "message result not serializable; recorded without it");
                None
            }
        }
    }

    fn decode(&self, bytes: Bytes) -> Option<R> {
        serde_json::from_slice(&bytes).ok()
    }
}
