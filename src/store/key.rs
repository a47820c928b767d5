//! What a store is keyed by. The engine derives a key from the client's key and its scope
//! (`StoreKey::derive`); a store only compares and stores the hashes.

use std::fmt;

/// What a store is keyed by: the hash of the scope, for per-scope caps, and the hash of the
/// whole key. The whole key is namespace, scope and client key. Neither hash can be turned back
/// into its parts.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreKey {
    scope: [u8; 32],
    id: [u8; 32],
}

impl StoreKey {
    /// A store key from its two hashes, for tests and stores that rebuild keys.
    #[must_use]
    pub const fn from_parts(scope: [u8; 32], id: [u8; 32]) -> Self {
        Self { scope, id }
    }

    /// The hash of the namespace and scope, shared by every key of one caller.
    #[must_use]
    pub const fn scope_hash(&self) -> &[u8; 32] {
        &self.scope
    }

    /// The hash that identifies this key. It is unique per namespace, scope and client key.
    #[must_use]
    pub const fn id(&self) -> &[u8; 32] {
        &self.id
    }

    /// The id as 64 lowercase hex characters, for stores keyed by text.
    #[must_use]
    pub fn id_hex(&self) -> String {
        crate::hex::encode(&self.id)
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({}…)", &crate::hex::encode(&self.id)[..12])
    }
}
