//! Who a key belongs to, and the hashes a store sees instead of the raw key.
//!
//! A client key is only unique for one caller. So every key is scoped by the namespace, the
//! tenant and the principal. There is one namespace per door or route group. The store is
//! given a domain-separated SHA-256 of those parts, never the parts themselves. So a store dump
//! holds no raw key, principal or namespace.

use crate::engine::key::IdempotencyKey;
use crate::store::StoreKey;
use sha2::{Digest, Sha256};
use std::fmt;

const SCOPE_DOMAIN: &[u8] = b"tower-idempotency/scope/v1";
const STORE_KEY_DOMAIN: &[u8] = b"tower-idempotency/store-key/v1";
const DERIVED_DOMAIN: &[u8] = b"tower-idempotency/derived-key/v1";

/// The caller a key belongs to: an authenticated principal and an optional tenant.
///
/// `Scope::anonymous()` is the one scope all callers without a principal share. It is only
/// used with an optional principal. See the layer's docs for the risk.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    // Boxed strings, not `String`s: a scope is carried in every keyed request's future, and
    // 16 bytes less of it keeps that future within the allocator's small-size cache.
    tenant: Option<Box<str>>,
    principal: Option<Box<str>>,
}

impl Scope {
    /// The scope of one principal, without a tenant.
    #[must_use]
    pub fn principal(id: impl Into<String>) -> Self {
        Self {
            tenant: None,
            principal: Some(id.into().into_boxed_str()),
        }
    }

    /// The shared scope of callers without a principal.
    #[must_use]
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// The same scope under a tenant.
    #[must_use]
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into().into_boxed_str());
        self
    }

    /// The principal, if any.
    #[must_use]
    pub fn principal_id(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// The tenant, if any.
    #[must_use]
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    fn hash_into(&self, h: &mut Sha256, namespace: &str) {
        lp(h, namespace.as_bytes());
        opt(h, self.tenant.as_deref());
        opt(h, self.principal.as_deref());
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Principals are personal data: say whether they are there, not what they are.
        f.debug_struct("Scope")
            .field("tenant", &self.tenant.as_ref().map(|_| ".."))
            .field("principal", &self.principal.as_ref().map(|_| ".."))
            .finish()
    }
}

fn lp(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

fn opt(h: &mut Sha256, v: Option<&str>) {
    match v {
        None => h.update([0u8]),
        Some(v) => {
            h.update([1u8]);
            lp(h, v.as_bytes());
        }
    }
}

// The engine's half of `StoreKey`: deriving one from a client key.
impl StoreKey {
    /// Derives the store key of `key` for `scope` under `namespace`.
    ///
    /// ```
    /// use tower_idempotency::IdempotencyKey;
    /// use tower_idempotency::engine::Scope;
    /// use tower_idempotency::store::StoreKey;
    ///
    /// let key = IdempotencyKey::new("k1").unwrap();
    /// let alice = StoreKey::derive("app", &Scope::principal("alice"), &key);
    /// let bob = StoreKey::derive("app", &Scope::principal("bob"), &key);
    /// assert_ne!(alice, bob);
    /// ```
    #[must_use]
    pub fn derive(namespace: &str, scope: &Scope, key: &IdempotencyKey) -> Self {
        let mut h = Sha256::new();
        h.update(SCOPE_DOMAIN);
        scope.hash_into(&mut h, namespace);
        let scope_hash: [u8; 32] = h.finalize().into();

        let mut h = Sha256::new();
        h.update(STORE_KEY_DOMAIN);
        h.update(scope_hash);
        lp(&mut h, key.as_str().as_bytes());
        Self::from_parts(scope_hash, h.finalize().into())
    }
}

/// A stable key derived from the client's key, to forward to a provider that de-duplicates,
/// such as a payment API. A retry then reaches the provider under the same key.
///
/// It is the hex SHA-256 of the namespace, scope and client key under its own domain tag. So it
/// differs from the store key: a provider never learns what the store is keyed by. It also
/// differs from the client's key, which a provider never learns either.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DerivedKey(String);

impl DerivedKey {
    /// Derives the forwarding key of `key` for `scope` under `namespace`.
    #[must_use]
    pub fn derive(namespace: &str, scope: &Scope, key: &IdempotencyKey) -> Self {
        let mut h = Sha256::new();
        h.update(DERIVED_DOMAIN);
        scope.hash_into(&mut h, namespace);
        lp(&mut h, key.as_str().as_bytes());
        Self(crate::hex::encode(&h.finalize()))
    }

    /// The key of a SHA-256 digest made under a domain tag of its own, as a step's key.
    pub(crate) fn from_digest(digest: &[u8]) -> Self {
        Self(crate::hex::encode(digest))
    }

    /// The key as 64 lowercase hex characters.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DerivedKey").field(&self.0).finish()
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> IdempotencyKey {
        IdempotencyKey::new(s).unwrap()
    }

    #[test]
    fn every_part_changes_the_store_key() {
        let base = StoreKey::derive("ns", &Scope::principal("p"), &key("k"));
        assert_ne!(
            base,
            StoreKey::derive("ns2", &Scope::principal("p"), &key("k"))
        );
        assert_ne!(
            base,
            StoreKey::derive("ns", &Scope::principal("p").with_tenant("t"), &key("k"))
        );
        assert_ne!(base, StoreKey::derive("ns", &Scope::anonymous(), &key("k")));
        assert_ne!(
            base,
            StoreKey::derive("ns", &Scope::principal("p"), &key("k2"))
        );
        assert_eq!(
            base,
            StoreKey::derive("ns", &Scope::principal("p"), &key("k"))
        );
    }

    #[test]
    fn tenant_and_principal_cannot_be_swapped() {
        let a = StoreKey::derive("ns", &Scope::principal("x").with_tenant("y"), &key("k"));
        let b = StoreKey::derive("ns", &Scope::principal("y").with_tenant("x"), &key("k"));
        assert_ne!(a, b);
    }

    #[test]
    fn derived_key_differs_from_store_key() {
        let s = Scope::principal("p");
        let d = DerivedKey::derive("ns", &s, &key("k"));
        assert_eq!(d.as_str().len(), 64);
        assert_ne!(d.as_str(), StoreKey::derive("ns", &s, &key("k")).id_hex());
    }
}
