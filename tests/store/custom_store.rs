//! The store of your own from the `store` module docs, held to the conformance suite: a store
//! written outside the crate proves it answers like ours with `store_conformance!`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tower_idempotency::conformance::Harness;
use tower_idempotency::engine::Fingerprint;
use tower_idempotency::store::{
    Claim, Forgotten, Inspected, Record, Store, StoreError, StoreKey, Token,
};

enum Entry {
    Pending {
        token: Token,
        fingerprint: Fingerprint,
        until: Instant,
    },
    Done {
        fingerprint: Fingerprint,
        record: Record,
        until: Instant,
    },
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        match self {
            Entry::Pending { until, .. } | Entry::Done { until, .. } => *until > now,
        }
    }
    fn held_by(&self, holder: &Token, now: Instant) -> bool {
        matches!(self, Entry::Pending { token, .. } if token == holder) && self.live(now)
    }
}

#[derive(Default)]
struct HashMapStore(Mutex<HashMap<StoreKey, Entry>>);

impl Store for HashMapStore {
    async fn claim(
        &self,
        key: &StoreKey,
        fp: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let token = Token::generate()?;
        let now = Instant::now();
        let mut map = self.0.lock().expect("not poisoned");
        match map.get(key).filter(|e| e.live(now)) {
            Some(Entry::Pending { fingerprint, .. }) => Ok(Claim::Pending {
                fingerprint: *fingerprint,
            }),
            Some(Entry::Done {
                fingerprint,
                record,
                ..
            }) => Ok(Claim::Done {
                fingerprint: *fingerprint,
                record: record.clone(),
            }),
            None => {
                let until = now + lease;
                map.insert(
                    *key,
                    Entry::Pending {
                        token: token.clone(),
                        fingerprint: *fp,
                        until,
                    },
                );
                Ok(Claim::Claimed(token))
            }
        }
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fp: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut map = self.0.lock().expect("not poisoned");
        let free = map
            .get(key)
            .is_none_or(|e| e.held_by(token, now) || !e.live(now));
        if free {
            map.insert(
                *key,
                Entry::Done {
                    fingerprint: *fp,
                    record,
                    until: now + retention,
                },
            );
        }
        Ok(free)
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let mut map = self.0.lock().expect("not poisoned");
        let held = map
            .get(key)
            .is_some_and(|e| e.held_by(token, Instant::now()));
        if held {
            map.remove(key);
        }
        Ok(held)
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut map = self.0.lock().expect("not poisoned");
        match map.get_mut(key) {
            Some(Entry::Pending {
                token: t, until, ..
            }) if t == token && *until > now => {
                *until = now + lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        let now = Instant::now();
        let mut map = self.0.lock().expect("not poisoned");
        let found = match map.get(key).filter(|e| e.live(now)) {
            None => return Ok(Forgotten::Nothing),
            Some(Entry::Done { .. }) => Forgotten::Record,
            Some(Entry::Pending { .. }) if pending => Forgotten::Pending,
            Some(Entry::Pending { .. }) => return Ok(Forgotten::KeptPending),
        };
        map.remove(key);
        Ok(found)
    }

    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let now = Instant::now();
        let map = self.0.lock().expect("not poisoned");
        Ok(match map.get(key).filter(|e| e.live(now)) {
            None => Inspected::Absent,
            Some(Entry::Pending {
                fingerprint, until, ..
            }) => Inspected::Pending {
                fingerprint: *fingerprint,
                lease_left: *until - now,
            },
            Some(Entry::Done {
                fingerprint,
                record,
                until,
            }) => Inspected::Done {
                fingerprint: *fingerprint,
                record: record.clone(),
                expires_in: *until - now,
            },
        })
    }
}

struct MyHarness(HashMapStore);

impl Harness for MyHarness {
    type S = HashMapStore;
    fn store(&self) -> &HashMapStore {
        &self.0
    }
    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    // This store keeps no steps: the suite checks that it says so.
    fn keeps_steps(&self) -> bool {
        false
    }
}

tower_idempotency::store_conformance!(async { MyHarness(HashMapStore::default()) });
