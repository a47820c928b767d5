//! Building a [`MemoryStore`]: its bounds, shards and clock.

use super::budget::{Budget, Limits};
use super::shard::Shard;
use super::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_SHARDS, ENTRY_OVERHEAD, MAX_SHARDS,
    MemoryStore, ShardCell,
};
use crate::clock::{Clock, TokioClock};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Builds a [`MemoryStore`].
///
/// The bounds are store-wide: shards split the locking, not the budgets, so any scope may use
/// all the room there is. Zero and out-of-range values are clamped, never refused: at least one
/// shard and at most [`MAX_SHARDS`]; the store holds at least one record and at least
/// [`ENTRY_OVERHEAD`] bytes (room for one pending claim); a cap lets a scope hold at least one
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
    max_entries_per_scope: Option<usize>,
    shards: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl MemoryStoreBuilder {
    /// A builder with the defaults: 100 000 records, 64 MiB, no fixed cap per scope, 16 shards,
    /// [`TokioClock`].
    pub fn new() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries_per_scope: None,
            shards: DEFAULT_SHARDS,
            clock: None,
        }
    }

    /// The most records the store holds, over all shards.
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// The most bytes the store holds (record bytes plus [`ENTRY_OVERHEAD`] per record), over
    /// all shards.
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// A fixed cap on the records of one scope (namespace, tenant and principal). Off by
    /// default: any scope may use the room there is, and a full store makes room from the
    /// scope that holds the most (see the [module docs](super)). With a cap, a scope at it
    /// makes room from its own records first.
    pub fn max_entries_per_scope(mut self, n: usize) -> Self {
        self.max_entries_per_scope = Some(n);
        self
    }

    /// The number of shards, each with its own lock (clamped to `1..=`[`MAX_SHARDS`]). The
    /// budgets are not split between them.
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
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.clamp(1, MAX_SHARDS);
        let limits = Limits::new(
            self.max_entries.max(1),
            self.max_bytes.max(ENTRY_OVERHEAD),
            self.max_entries_per_scope.map(|n| n.max(1)),
        );
        let budget = Arc::new(Budget::new(limits, shards));
        MemoryStore {
            shards: (0..shards)
                .map(|i| ShardCell(Mutex::new(Shard::new(Arc::clone(&budget), i))))
                .collect(),
            budget,
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
