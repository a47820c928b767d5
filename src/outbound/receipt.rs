//! Receipts: what a send returned, kept under its key so a repeat is answered with it.

use bytes::Bytes;
use std::fmt;

/// A response that can be kept as the receipt of a send, and read back for a repeat.
///
/// Implemented for `()`, [`Bytes`], `Vec<u8>` and `String`; for `http::Response<Bytes>` (the
/// HTTP adapter's receipt); with feature `json`, for [`Json<T>`](super::Json) of any
/// `Serialize + DeserializeOwned` type; with feature `lettre`, for SMTP replies. Implement it
/// for a receipt type of your own.
pub trait Receipt: Sized {
    /// The receipt as bytes to store.
    ///
    /// # Errors
    /// The receipt cannot be encoded; the send still counts as sent (the key is held for
    /// the hold time instead of completed).
    fn to_bytes(&self) -> Result<Bytes, ReceiptError>;

    /// The receipt read back from the bytes [`to_bytes`](Receipt::to_bytes) made.
    ///
    /// # Errors
    /// The bytes are not such a receipt; the repeat fails with
    /// [`OutboundError::RecordInvalid`](super::OutboundError::RecordInvalid), nothing sent.
    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError>;

    /// A smaller form of the receipt, for when [`to_bytes`](Receipt::to_bytes) is over the
    /// engine's record limit (an HTTP response: its status and headers without the body).
    /// `None` (the default): there is none, and the key is held for the hold time instead of
    /// completed, so a repeat within it sends nothing.
    fn to_fitted_bytes(&self) -> Option<Bytes> {
        None
    }
}

/// A receipt that could not be encoded or decoded.
#[derive(Debug)]
pub struct ReceiptError {
    message: &'static str,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ReceiptError {
    /// An error with a short message.
    #[must_use]
    pub fn new(message: &'static str) -> Self {
        Self {
            message,
            source: None,
        }
    }

    /// An error with a short message, caused by `source`.
    #[must_use]
    pub fn with_source(
        message: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            message,
            source: Some(source.into()),
        }
    }

    /// The short message.
    #[must_use]
    pub fn message(&self) -> &'static str {
        self.message
    }
}

impl fmt::Display for ReceiptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receipt: {}", self.message)
    }
}

impl std::error::Error for ReceiptError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl Receipt for () {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        Ok(Bytes::new())
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(ReceiptError::new(
                "bytes where an empty receipt was expected",
            ))
        }
    }
}

impl Receipt for Bytes {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        Ok(self.clone())
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        Ok(bytes)
    }
}

impl Receipt for Vec<u8> {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        Ok(Bytes::copy_from_slice(self))
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        Ok(bytes.into())
    }
}

impl Receipt for String {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        Ok(Bytes::copy_from_slice(self.as_bytes()))
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        String::from_utf8(bytes.into())
            .map_err(|e| ReceiptError::with_source("a text receipt that is not UTF-8", e))
    }
}

/// A receipt of any `Serialize + DeserializeOwned` type, kept as JSON (feature `json`).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tower_idempotency::outbound::{Json, Receipt};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Charge { id: String, amount: u64 }
///
/// let receipt = Json(Charge { id: "ch_1".into(), amount: 500 });
/// let back = Json::<Charge>::from_bytes(receipt.to_bytes().unwrap()).unwrap();
/// assert_eq!(back.0, receipt.0);
/// ```
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Json<T>(pub T);

#[cfg(feature = "json")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Receipt for Json<T> {
    fn to_bytes(&self) -> Result<Bytes, ReceiptError> {
        serde_json::to_vec(&self.0)
            .map(Bytes::from)
            .map_err(|e| ReceiptError::with_source("the receipt cannot be serialized", e))
    }

    fn from_bytes(bytes: Bytes) -> Result<Self, ReceiptError> {
        serde_json::from_slice(&bytes)
            .map(Json)
            .map_err(|e| ReceiptError::with_source("the stored receipt does not deserialize", e))
    }
}
