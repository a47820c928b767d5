//! Building a [`MemoryStore`]: its bounds, shards and clock.

use super::shard::{Limits, Shard};
use super::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_ENTRIES_PER_SCOPE, DEFAULT_SHARDS,
    ENTRY_OVERHEAD, MAX_SHARDS, MemoryStore, ShardCell,
};
use crate::clock::{Clock, TokioClock};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Builds a [`MemoryStore`].
///
/// Zero and out-of-range values are clamped, never refused: at least one shard and at most
/// [`MAX_SHARDS`], and no more shards than `max_entries`; each shard holds at least one record
/// and at least [`ENTRY_OVERHEAD`] bytes (room for one pending claim); a scope holds at least one
/// record. A shard holds at most `u32::MAX - 1` records.
///
/// ```
/// use tower_idempotency::clock::ManualClock;
/// use tower_idempotency::store::memory::MemoryStore;
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().max_entries(1_000).shards(2).clock(clock.clone()).build();
/// assert_eq!(store.stats().entries, 0);
/// ```
#[must_use]
#[derive(Clone)]
pub struct MemoryStoreBuilder {
    max_entries: usize,
    max_bytes: usize,
    max_entries_per_scope: usize,
    shards: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl MemoryStoreBuilder {
    /// A builder with the defaults: 100 000 records, 64 MiB, 1 000 records per scope, 16 shards,
    /// [`TokioClock`].
    pub fn new() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries_per_scope: DEFAULT_MAX_ENTRIES_PER_SCOPE,
            shards: DEFAULT_SHARDS,
            clock: None,
        }
    }

    /// The most records the store holds; each shard holds at most `max_entries / shards`.
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// The most bytes the store holds (record bytes plus [`ENTRY_OVERHEAD`] per record); each
    /// shard holds at most `max_bytes / shards`.
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// The most records one scope (namespace, tenant and principal) holds.
    pub fn max_entries_per_scope(mut self, n: usize) -> Self {
        self.max_entries_per_scope = n;
        self
    }

    /// The number of shards, each with its own lock and an even share of the budgets.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// The clock that decides expiry (default: [`TokioClock`], so `tokio::time::pause` moves
    /// it; tests use [`ManualClock`](crate::clock::ManualClock)).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store, clamping the values as described on [`MemoryStoreBuilder`].
    #[must_use]
    pub fn build(self) -> MemoryStore {
        const MAX_SHARD_ENTRIES: usize = (u32::MAX - 1) as usize;
        let max_entries = self.max_entries.max(1);
        let shards = self.shards.clamp(1, MAX_SHARDS).min(max_entries);
        let limits = Limits {
            entries: (max_entries / shards).clamp(1, MAX_SHARD_ENTRIES),
            bytes: (self.max_bytes / shards).max(ENTRY_OVERHEAD),
            per_scope: self.max_entries_per_scope.max(1),
        };
        MemoryStore {
            shards: (0..shards)
                .map(|_| ShardCell(Mutex::new(Shard::new(limits))))
                .collect(),
            limits,
            clock: self.clock.unwrap_or_else(|| Arc::new(TokioClock::new())),
        }
    }
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStoreBuilder")
            .field("max_entries", &self.max_entries)
            .field("max_bytes", &self.max_bytes)
            .field("max_entries_per_scope", &self.max_entries_per_scope)
            .field("shards", &self.shards)
            .field(
                "clock",
                &self.clock.as_ref().map_or("TokioClock", |_| "custom"),
            )
            .finish()
    }
}
