//! PLACEHOLDER: a minimal in-memory store so the crate builds; replaced by the sharded, bounded
//! implementation.

use super::{Claim, Store, StoreError, Token};
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The embedded store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<[u8; 32], Entry>>,
    clock: crate::clock::TokioClock,
}

#[derive(Debug)]
enum Entry {
    Pending { token: Token, fp: Fingerprint, until: Duration },
    Done { fp: Fingerprint, record: Record, until: Duration },
}

impl MemoryStore {
    /// A store with the default bounds.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    async fn claim(&self, key: &StoreKey, fingerprint: &Fingerprint, lease: Duration) -> Result<Claim, StoreError> {
        use crate::clock::Clock;
        let now = self.clock.now();
        let mut m = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match m.get(key.id()) {
            Some(Entry::Pending { fp, until, .. }) if *until > now => return Ok(Claim::Pending { fingerprint: *fp }),
            Some(Entry::Done { fp, record, until }) if *until > now => {
                return Ok(Claim::Done { fingerprint: *fp, record: record.clone() });
            }
            _ => {}
        }
        let token = Token::generate()?;
        m.insert(*key.id(), Entry::Pending { token: token.clone(), fp: *fingerprint, until: now + lease });
        Ok(Claim::Claimed(token))
    }
    async fn complete(&self, key: &StoreKey, token: &Token, fingerprint: &Fingerprint, record: Record, ttl: Duration) -> Result<bool, StoreError> {
        use crate::clock::Clock;
        let now = self.clock.now();
        let mut m = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let ok = match m.get(key.id()) {
            Some(Entry::Pending { token: t, until, .. }) => t == token || *until <= now,
            Some(Entry::Done { until, .. }) => *until <= now,
            None => true,
        };
        if ok {
            m.insert(*key.id(), Entry::Done { fp: *fingerprint, record, until: now + ttl });
        }
        Ok(ok)
    }
    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let mut m = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(m.get(key.id()), Some(Entry::Pending { token: t, .. }) if t == token) {
            m.remove(key.id());
            return Ok(true);
        }
        Ok(false)
    }
    async fn renew(&self, key: &StoreKey, token: &Token, lease: Duration) -> Result<bool, StoreError> {
        use crate::clock::Clock;
        let now = self.clock.now();
        let mut m = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Entry::Pending { token: t, until, .. }) = m.get_mut(key.id()) {
            if t == token && *until > now {
                *until = now + lease;
                return Ok(true);
            }
        }
        Ok(false)
    }
}
