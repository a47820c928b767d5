//! The store's view of a record: opaque bytes. The engine encodes and decodes them
//! (`engine::record`); a store only keeps them.

use bytes::Bytes;
use std::fmt;

/// An encoded record: opaque bytes to a store.
#[derive(Clone, PartialEq, Eq)]
pub struct Record(Bytes);

impl Record {
    /// Wraps bytes read back from a store. They are validated when decoded, not here.
    #[must_use]
    pub fn from_bytes(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// The encoded bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }

    /// The encoded bytes, owned.
    #[must_use]
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// The encoded length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the record holds no bytes at all. That is never true of an encoded response.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Record(<{} bytes>)", self.0.len())
    }
}
