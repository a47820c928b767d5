//! The embedded store: sharded, bounded, in process memory.
//!
//! [`MemoryStore`] keeps records in `N` shards (default 16), each behind its own
//! [`std::sync::Mutex`] that is held only for the synchronous work of one step (never across an
//! `.await`). A key's shard is chosen by its scope hash, so every record of one caller lives in
//! one shard and the per-scope cap is checked under that shard's lock alone.
//!
//! # Bounds
//!
//! | bound | default | split |
//! | --- | --- | --- |
//! | [`max_entries`](MemoryStoreBuilder::max_entries) | 100 000 | each shard holds at most `max_entries / shards` records |
//! | [`max_bytes`](MemoryStoreBuilder::max_bytes) | 64 MiB | each shard holds at most `max_bytes / shards` bytes |
//! | [`max_entries_per_scope`](MemoryStoreBuilder::max_entries_per_scope) | 1 000 | per scope (a scope lives in one shard) |
//!
//! A record is counted as its encoded bytes plus [`ENTRY_OVERHEAD`] (160) bytes for the entry
//! itself, its index slot and allocator overhead; a pending claim counts `ENTRY_OVERHEAD` alone.
//! The per-scope bookkeeping (about 50 bytes per scope that has records) is not counted; it is
//! bounded by the number of records and removed when a scope has none left.
//!
//! Because the budgets are split evenly, eviction is shard-local and lock-local; the price is
//! that a skewed load can fill one shard while others still have room.
//!
//! # Making room
//!
//! When a claim (or a `complete`, which needs room for the record's bytes) does not fit:
//!
//! 1. expired records are dropped: a completed record past its retention, a pending claim past
//!    its lease. A shard keeps its earliest deadline and only sweeps when something can have
//!    expired;
//! 2. then the oldest completed records, in order of completion. Each of these *early drops*
//!    is logged with `tracing::warn!` and counted in [`MemoryStats::early_drops`]: a retry of
//!    that request would run its work again;
//! 3. a pending claim inside its lease is never dropped. A shard left with nothing it may drop
//!    refuses with [`StoreErrorKind::StoreFull`] (the HTTP layer answers 503).
//!
//! A scope at its cap makes room from its own records only: expired first, then its own oldest
//! completed record, so one busy client never evicts other clients' records. A scope whose
//! records are all pending is refused with [`StoreErrorKind::ScopeFull`] (429) while other scopes
//! still claim.
//!
//! Expired records are treated as absent by every step, using the store's [`Clock`]
//! ([`TokioClock`] unless [`MemoryStoreBuilder::clock`] sets another), and dropped when a step
//! meets them; [`MemoryStore::remove_expired`] drops them all at once.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use tower_idempotency::store::memory::MemoryStore;
//! use tower_idempotency::{Claim, Fingerprint, IdempotencyKey, Record, Scope, Store, StoreKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_idempotency::StoreError> {
//! let store = MemoryStore::builder()
//!     .max_entries(10_000)
//!     .max_bytes(8 * 1024 * 1024)
//!     .max_entries_per_scope(100)
//!     .shards(4)
//!     .build();
//!
//! let key = StoreKey::derive("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1", 255).unwrap());
//! let fp = Fingerprint::builder().field(b"POST").field(b"/orders").finish();
//! let lease = Duration::from_secs(30);
//!
//! let Claim::Claimed(token) = store.claim(&key, &fp, lease).await? else { panic!("a free key") };
//! assert!(matches!(store.claim(&key, &fp, lease).await?, Claim::Pending { .. }));
//!
//! let record = Record::from_bytes(Bytes::from_static(b"an encoded response"));
//! assert!(store.complete(&key, &token, &fp, record.clone(), Duration::from_secs(3600)).await?);
//! assert!(matches!(store.claim(&key, &fp, lease).await?, Claim::Done { record: r, .. } if r == record));
//!
//! let stats = store.stats();
//! assert_eq!((stats.entries, stats.pending, stats.early_drops), (1, 0, 0));
//! # Ok(())
//! # }
//! ```

mod builder;
mod evict;
mod shard;
mod slab;
mod stats;
#[cfg(test)]
mod tests;

pub use builder::MemoryStoreBuilder;
pub use stats::MemoryStats;

use super::{Claim, Store, StoreError, Token};
use crate::clock::Clock;
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
#[cfg(doc)]
use crate::{clock::TokioClock, store::StoreErrorKind};
use shard::{Limits, Shard};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The default bound on stored records, over all shards.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// The default bound on stored bytes (records plus [`ENTRY_OVERHEAD`] each), over all shards.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// The default bound on the records of one scope.
pub const DEFAULT_MAX_ENTRIES_PER_SCOPE: usize = 1_000;
/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 16;
/// The largest number of shards; larger requests are clamped to it.
pub const MAX_SHARDS: usize = 1024;
/// The bytes each record is counted for on top of its encoded length (the entry, its index slot
/// and allocator overhead). A pending claim is counted this much alone.
pub const ENTRY_OVERHEAD: usize = 160;

/// The in-process store. Cheap to share behind an `Arc` (the engine does); see the
/// [module docs](self) for its bounds and eviction order.
pub struct MemoryStore {
    shards: Box<[ShardCell]>,
    limits: Limits,
    clock: Arc<dyn Clock>,
}

/// One shard on its own cache lines, so two cores locking neighbouring shards do not contend.
#[repr(align(128))]
struct ShardCell(Mutex<Shard>);

impl MemoryStore {
    /// A store with the default bounds and clock.
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder to set the bounds, the number of shards or the clock.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::new()
    }

    /// Counts of what the store holds and what it dropped or refused, summed over the shards
    /// (each shard is locked in turn, so the sum is not one instant's snapshot).
    ///
    /// Records that expired but were not yet dropped are still counted in `entries` and
    /// `bytes`.
    #[must_use]
    pub fn stats(&self) -> MemoryStats {
        let mut stats = MemoryStats::default();
        for cell in &*self.shards {
            lock(cell).add_to(&mut stats);
        }
        stats
    }

    /// Drops every expired record now and returns how many were dropped. Never needed for
    /// correctness (expired records are absent to every step and dropped when room is needed);
    /// useful to give memory back after a burst.
    pub fn remove_expired(&self) -> usize {
        let now = self.now();
        self.shards
            .iter()
            .map(|cell| {
                let mut shard = lock(cell);
                let before = shard.len;
                if shard.earliest <= now {
                    shard.sweep(now);
                }
                before - shard.len
            })
            .sum()
    }

    fn shard(&self, key: &StoreKey) -> MutexGuard<'_, Shard> {
        let [a, b, c, d, ..] = *key.scope_hash();
        let i = u32::from_le_bytes([a, b, c, d]) as usize % self.shards.len();
        lock(&self.shards[i])
    }

    fn now(&self) -> u64 {
        nanos(self.clock.now())
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_entries_per_shard", &self.limits.entries)
            .field("max_bytes_per_shard", &self.limits.bytes)
            .field("max_entries_per_scope", &self.limits.per_scope)
            .finish_non_exhaustive()
    }
}

fn lock(cell: &ShardCell) -> MutexGuard<'_, Shard> {
    // A panic under the lock cannot leave a step half done in a way later steps rely on more
    // than on the store staying usable.
    cell.0.lock().unwrap_or_else(PoisonError::into_inner)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        // Drawn before the lock: the OS call must not lengthen the critical section.
        let token = Token::generate()?;
        let now = self.now();
        self.shard(key).claim(
            key,
            fingerprint,
            token,
            now.saturating_add(nanos(lease)),
            now,
        )
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        self.shard(key).complete(
            key,
            token,
            fingerprint,
            record,
            now.saturating_add(nanos(ttl)),
            now,
        )
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let now = self.now();
        Ok(self.shard(key).release(key, token, now))
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        Ok(self
            .shard(key)
            .renew(key, token, now.saturating_add(nanos(lease)), now))
    }
}
