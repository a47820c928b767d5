//! Building a [`MemoryStore`]: its bounds, shards and clock, and the settings it refuses.

use super::budget::{Budget, Limits, Usage};
use super::shard::Shard;
use super::{
    DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_RECORD_BYTES, DEFAULT_SHARDS,
    ENTRY_OVERHEAD, MAX_SHARDS, MemoryStore, PENDING_FLOOR, PENDING_SHARE, ShardCell,
};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::clock::{Clock, TokioClock};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Builds a [`MemoryStore`].
///
/// The bounds are store-wide: shards split the locking, not the budgets. So any scope may use
/// all the room there is for completed records. What its pending claims hold, which nothing
/// may drop, is limited to its pending share ([`max_pending_per_scope`](Self::max_pending_per_scope)),
/// a tenth of the store by default, so that one caller cannot refuse every other.
/// [`build`](Self::build) refuses settings that can never work, with a [`ConfigError`]. A
/// shard holds at most `u32::MAX - 1` records.
///
/// ```
/// use tower_idempotency::store::clock::ManualClock;
/// use tower_idempotency::ConfigErrorKind;
/// use tower_idempotency::store::MemoryStore;
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder()
///     .max_entries(1_000)
///     .shards(2)
///     .clock(clock.clone())
///     .build()?;
/// assert_eq!(store.stats().entries, 0);
///
/// // 512 KiB cannot hold a record of the engine's largest body (1 MiB)...
/// let err = MemoryStore::builder().max_bytes(512 * 1024).build().unwrap_err();
/// assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
/// // ...unless the records are known to be smaller (`EngineBuilder::max_record_body`).
/// let _small = MemoryStore::builder()
///     .max_bytes(512 * 1024)
///     .max_record_bytes(64 * 1024)
///     .build()?;
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[must_use]
#[derive(Clone)]
pub struct MemoryStoreBuilder {
    max_entries: usize,
    max_bytes: usize,
    max_entries_per_scope: Option<usize>,
    max_pending_per_scope: Option<usize>,
    max_pending_bytes_per_scope: Option<usize>,
    max_record_bytes: usize,
    shards: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl MemoryStoreBuilder {
    /// A builder with the defaults, written on each setter.
    pub fn new() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries_per_scope: None,
            max_pending_per_scope: None,
            max_pending_bytes_per_scope: None,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            shards: DEFAULT_SHARDS,
            clock: None,
        }
    }

    /// The most records and steps the store holds together, over all shards. At least 1.
    /// Default: 100 000.
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// The most bytes the store holds, over all shards. Each record counts its bytes plus
    /// 160 bytes for its entry, and each step its value plus 96 bytes. It must hold one record of
    /// [`max_record_bytes`](Self::max_record_bytes). Default: 64 MiB.
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// A fixed cap on the records and steps of one scope (namespace, tenant and principal), from
    /// 1 to `max_entries`. Off by default: any scope may use the room there is, and a full store
    /// makes room from the scope that holds the most (see the [module docs](super)). With a
    /// cap, a scope at it makes room from its own records first. A key's first step needs two
    /// (the key's record and the step), so a cap of 1 keeps no steps.
    pub fn max_entries_per_scope(mut self, n: usize) -> Self {
        self.max_entries_per_scope = Some(n);
        self
    }

    /// The most records and steps one scope may hold under pending claims: claims whose work has
    /// not finished, and the steps of their keys. Nothing may drop them, so this share is what
    /// keeps one caller from filling the store and refusing every other. A claim or step past
    /// it is refused with [`ScopeFull`](crate::store::StoreErrorKind::ScopeFull), answered
    /// with 429. At least 1; `usize::MAX` turns the share off. Completed records are not
    /// counted: any scope may use the room there is for them. Default: a tenth of
    /// [`max_entries`](Self::max_entries), so 10 000, and at least 16 (or `max_entries` when
    /// that is smaller), so a small store still lets a claim record its steps.
    ///
    /// ```
    /// # use tower_idempotency::MemoryStore;
    /// // One caller may hold up to half the store in work in flight.
    /// let store = MemoryStore::builder()
    ///     .max_entries(1_000)
    ///     .max_pending_per_scope(500)
    ///     .build()?;
    /// // No share: one caller may fill the store with claims (the store-wide rule alone).
    /// let open = MemoryStore::builder()
    ///     .max_pending_per_scope(usize::MAX)
    ///     .max_pending_bytes_per_scope(usize::MAX)
    ///     .build()?;
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    pub fn max_pending_per_scope(mut self, n: usize) -> Self {
        self.max_pending_per_scope = Some(n);
        self
    }

    /// The most counted bytes one scope may hold under pending claims: 160 bytes per claim and
    /// the steps of their keys, each its value plus 96 bytes. As
    /// [`max_pending_per_scope`](Self::max_pending_per_scope), for bytes. At least 160 (one
    /// claim); `usize::MAX` turns it off. Default: a tenth of
    /// [`max_bytes`](Self::max_bytes), so 6.4 MiB, and at least 64 KiB (or `max_bytes` when
    /// that is smaller).
    pub fn max_pending_bytes_per_scope(mut self, n: usize) -> Self {
        self.max_pending_bytes_per_scope = Some(n);
        self
    }

    /// The largest encoded record the store must always be able to hold. Default: 1 MiB plus
    /// 64 KiB, the engine's default body limit plus room for the status, headers and trailers.
    ///
    /// `max_bytes` is refused below it plus 160 bytes. Lower it with the engine's record limit
    /// ([`EngineBuilder::max_record_body`](crate::engine::EngineBuilder::max_record_body)) for a store
    /// smaller than a megabyte. Larger records are still kept when they fit.
    pub fn max_record_bytes(mut self, n: usize) -> Self {
        self.max_record_bytes = n;
        self
    }

    /// The number of shards, each with its own lock. Clamped to 1 to 1024. The budgets are
    /// not split between them. Default: 16.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// The clock that decides expiry (default: [`TokioClock`], so `tokio::time::pause` moves
    /// it; tests use [`ManualClock`](crate::store::clock::ManualClock)).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store.
    ///
    /// # Errors
    /// A [`ConfigError`] of kind [`OutOfRange`](ConfigErrorKind::OutOfRange) for a setting
    /// that can never work: no room for a single record, a byte budget below one record of
    /// [`max_record_bytes`](Self::max_record_bytes), or a per-scope cap of zero or above
    /// `max_entries`, or a pending share below one claim.
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        if self.max_entries == 0 {
            return Err(ConfigError::new(
                ConfigErrorKind::OutOfRange,
                "max_entries is 0: the store could not hold a single claim",
            ));
        }
        let one_record = self.max_record_bytes.saturating_add(ENTRY_OVERHEAD);
        if self.max_bytes < one_record {
            return Err(ConfigError::new(
                ConfigErrorKind::OutOfRange,
                format!(
                    "max_bytes ({}) is below one record of max_record_bytes ({}) plus its \
                     entry overhead: such records could never be kept (raise max_bytes, or \
                     lower max_record_bytes with the engine's record limit)",
                    self.max_bytes, self.max_record_bytes
                ),
            ));
        }
        if let Some(cap) = self.max_entries_per_scope
            && (cap == 0 || cap > self.max_entries)
        {
            return Err(ConfigError::new(
                ConfigErrorKind::OutOfRange,
                format!(
                    "max_entries_per_scope ({cap}) must be from 1 to max_entries ({})",
                    self.max_entries
                ),
            ));
        }
        if self.max_pending_per_scope == Some(0)
            || self
                .max_pending_bytes_per_scope
                .is_some_and(|b| b < ENTRY_OVERHEAD)
        {
            return Err(ConfigError::new(
                ConfigErrorKind::OutOfRange,
                format!(
                    "max_pending_per_scope ({:?}) must be at least 1 and \
                     max_pending_bytes_per_scope ({:?}) at least {ENTRY_OVERHEAD}: a scope \
                     could not hold a single claim",
                    self.max_pending_per_scope, self.max_pending_bytes_per_scope
                ),
            ));
        }
        Ok(self.assemble())
    }

    /// The store these settings describe, unchecked (the defaults pass every check).
    pub(super) fn assemble(self) -> MemoryStore {
        let shards = self.shards.clamp(1, MAX_SHARDS);
        let (entries, bytes) = (self.max_entries.max(1), self.max_bytes.max(ENTRY_OVERHEAD));
        let share = Usage::new(
            self.max_pending_per_scope
                .unwrap_or((entries / PENDING_SHARE).max(PENDING_FLOOR.0.min(entries)))
                .max(1),
            self.max_pending_bytes_per_scope
                .unwrap_or((bytes / PENDING_SHARE).max(PENDING_FLOOR.1.min(bytes)))
                .max(ENTRY_OVERHEAD),
        );
        let limits = Limits::new(entries, bytes, self.max_entries_per_scope, share);
        let budget = Arc::new(Budget::new(limits, shards));
        MemoryStore {
            shards: (0..shards)
                .map(|i| ShardCell(Mutex::new(Shard::new(Arc::clone(&budget), i))))
                .collect(),
            budget,
            clock: self.clock.unwrap_or_else(|| Arc::new(TokioClock::new())),
            waiters: super::waiters::Waiters::default(),
            #[cfg(feature = "metrics")]
            reported: std::sync::atomic::AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            share: super::share::MemoryShare::default(),
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
            .field("max_pending_per_scope", &self.max_pending_per_scope)
            .field(
                "max_pending_bytes_per_scope",
                &self.max_pending_bytes_per_scope,
            )
            .field("max_record_bytes", &self.max_record_bytes)
            .field("shards", &self.shards)
            .field(
                "clock",
                &self.clock.as_ref().map_or("TokioClock", |_| "custom"),
            )
            .finish()
    }
}
