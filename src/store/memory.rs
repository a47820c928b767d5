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
//! use tower_idempotency::{IdempotencyKey, Store};
//! use tower_idempotency::engine::{Fingerprint, Scope};
//! use tower_idempotency::store::{Claim, Record, StoreKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_idempotency::store::StoreError> {
//! let store = MemoryStore::builder()
//!     .max_entries(10_000)
//!     .max_bytes(8 * 1024 * 1024)
//!     .max_entries_per_scope(100)
//!     .shards(4)
//!     .build();
//!
//! let key = StoreKey::derive("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1").unwrap());
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

use super::{Claim, Store, StoreError, StoreErrorKind, Token};
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
use crate::store::clock::{Clock, TokioClock};
use hashbrown::HashTable;
use std::fmt;
use std::hash::BuildHasher;
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

/// "No entry" in the intrusive lists and free lists.
const NIL: u32 = u32::MAX;

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

/// The bounds of one shard.
#[derive(Debug, Clone, Copy)]
struct Limits {
    entries: usize,
    bytes: usize,
    per_scope: usize,
}

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
            let shard = lock(cell);
            stats.entries += shard.len;
            stats.pending += shard.pending;
            stats.bytes += shard.bytes;
            stats.scopes += shard.scope_index.len();
            stats.early_drops += shard.early_drops;
            stats.expired_drops += shard.expired_drops;
            stats.scope_full_refusals += shard.scope_full;
            stats.store_full_refusals += shard.store_full;
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
            self.limits,
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
            self.limits,
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

/// What a [`MemoryStore`] holds, and what it dropped or refused since it was built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Records held, pending and completed (expired ones not yet dropped included).
    pub entries: usize,
    /// Of those, pending claims.
    pub pending: usize,
    /// Bytes counted against `max_bytes`: record bytes plus [`ENTRY_OVERHEAD`] per record.
    pub bytes: usize,
    /// Scopes that hold at least one record.
    pub scopes: usize,
    /// Completed records dropped before their retention ended, to make room.
    pub early_drops: u64,
    /// Expired records dropped (past retention, or pending past lease).
    pub expired_drops: u64,
    /// Steps refused because the scope was at its cap with only pending records.
    pub scope_full_refusals: u64,
    /// Steps refused because the shard held nothing it could drop.
    pub store_full_refusals: u64,
}

/// Builds a [`MemoryStore`].
///
/// Zero and out-of-range values are clamped, never refused: at least one shard and at most
/// [`MAX_SHARDS`], and no more shards than `max_entries`; each shard holds at least one record
/// and at least [`ENTRY_OVERHEAD`] bytes (room for one pending claim); a scope holds at least one
/// record. A shard holds at most `u32::MAX - 1` records.
///
/// ```
/// use tower_idempotency::store::clock::ManualClock;
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
    /// it; tests use [`ManualClock`](crate::store::clock::ManualClock)).
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
                .map(|_| ShardCell(Mutex::new(Shard::new())))
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

/// One record. Kept compact (about 128 bytes): hashes inline, times as `u64` nanoseconds of the
/// store's clock, `u32` slab indices for the two intrusive lists of completed records.
struct Entry {
    id: [u8; 32],
    fingerprint: Fingerprint,
    /// Lease end while pending, retention end once done (nanoseconds of the store's clock).
    deadline: u64,
    state: State,
    /// The slot of the entry's scope in `Shard::scopes`; `NIL` marks a vacant slab slot.
    scope: u32,
    /// The shard's completed records, oldest first. In a vacant entry, `next` is the free list.
    prev: u32,
    next: u32,
    /// The scope's completed records, oldest first.
    scope_prev: u32,
    scope_next: u32,
}

/// Two variants only, so the discriminant hides in `Bytes`' pointer niche (32 bytes, not 40).
enum State {
    Pending(Token),
    Done(Record),
}

/// The state a vacant slot keeps (it owns nothing).
const VACANT: State = State::Pending(Token::from_bytes([0; 16]));

impl Entry {
    fn is_vacant(&self) -> bool {
        self.scope == NIL
    }
}

/// A scope that holds records. A vacant slot has `records == 0` and `head` is the free list.
struct ScopeSlot {
    hash: [u8; 32],
    records: u32,
    head: u32,
    tail: u32,
}

struct Shard {
    // Keys are SHA-256 outputs, but a client chooses them: a seeded hash keeps bucket
    // collisions out of reach, and foldhash is several times cheaper than SipHash here.
    hasher: foldhash::quality::RandomState,
    /// Slab indices of live entries, hashed by id.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    free: u32,
    /// Slot indices of scopes with records, hashed by scope hash.
    scope_index: HashTable<u32>,
    scopes: Vec<ScopeSlot>,
    free_scope: u32,
    done_head: u32,
    done_tail: u32,
    len: usize,
    pending: usize,
    bytes: usize,
    /// No entry's deadline is earlier than this (`u64::MAX`: no entry).
    earliest: u64,
    early_drops: u64,
    expired_drops: u64,
    scope_full: u64,
    store_full: u64,
}

fn at(i: u32) -> usize {
    i as usize
}

impl Shard {
    fn new() -> Self {
        Self {
            hasher: foldhash::quality::RandomState::default(),
            index: HashTable::new(),
            entries: Vec::new(),
            free: NIL,
            scope_index: HashTable::new(),
            scopes: Vec::new(),
            free_scope: NIL,
            done_head: NIL,
            done_tail: NIL,
            len: 0,
            pending: 0,
            bytes: 0,
            earliest: u64::MAX,
            early_drops: 0,
            expired_drops: 0,
            scope_full: 0,
            store_full: 0,
        }
    }

    // ---- the four steps -------------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        token: Token,
        deadline: u64,
        now: u64,
        limits: Limits,
    ) -> Result<Claim, StoreError> {
        let hash = self.hasher.hash_one(key.id());
        if let Some(idx) = self.find(hash, key.id()) {
            let e = &self.entries[at(idx)];
            if e.deadline > now {
                return Ok(match &e.state {
                    State::Pending(_) => Claim::Pending {
                        fingerprint: e.fingerprint,
                    },
                    State::Done(record) => Claim::Done {
                        fingerprint: e.fingerprint,
                        record: record.clone(),
                    },
                });
            }
            self.drop_entry(idx, now);
        }
        self.make_scope_room(key.scope_hash(), now, limits)?;
        self.make_room(1, ENTRY_OVERHEAD, now, limits)?;
        self.insert(
            key,
            hash,
            *fingerprint,
            State::Pending(token.clone()),
            deadline,
        )?;
        Ok(Claim::Claimed(token))
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(
        &mut self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        deadline: u64,
        now: u64,
        limits: Limits,
    ) -> Result<bool, StoreError> {
        let hash = self.hasher.hash_one(key.id());
        if let Some(idx) = self.find(hash, key.id()) {
            let e = &self.entries[at(idx)];
            if e.deadline > now {
                if !matches!(&e.state, State::Pending(t) if t == token) {
                    return Ok(false);
                }
                // Our own pending entry: it is live and not completed, so making room never
                // drops it.
                let extra = record.len();
                self.make_room(0, extra, now, limits)?;
                let e = &mut self.entries[at(idx)];
                e.state = State::Done(record);
                e.fingerprint = *fingerprint;
                e.deadline = deadline;
                self.pending -= 1;
                self.bytes += extra;
                self.earliest = self.earliest.min(deadline);
                self.link_done(idx);
                return Ok(true);
            }
            self.drop_entry(idx, now);
        }
        // Nothing holds the key: write the record as a new entry.
        self.make_scope_room(key.scope_hash(), now, limits)?;
        self.make_room(1, ENTRY_OVERHEAD + record.len(), now, limits)?;
        let idx = self.insert(key, hash, *fingerprint, State::Done(record), deadline)?;
        self.link_done(idx);
        Ok(true)
    }

    fn release(&mut self, key: &StoreKey, token: &Token, now: u64) -> bool {
        let hash = self.hasher.hash_one(key.id());
        let Some(idx) = self.find(hash, key.id()) else {
            return false;
        };
        let e = &self.entries[at(idx)];
        if e.deadline <= now {
            self.drop_entry(idx, now);
            return false;
        }
        if matches!(&e.state, State::Pending(t) if t == token) {
            self.remove(idx);
            return true;
        }
        false
    }

    fn renew(&mut self, key: &StoreKey, token: &Token, deadline: u64, now: u64) -> bool {
        let hash = self.hasher.hash_one(key.id());
        let Some(idx) = self.find(hash, key.id()) else {
            return false;
        };
        let e = &mut self.entries[at(idx)];
        if e.deadline <= now {
            self.drop_entry(idx, now);
            return false;
        }
        if matches!(&e.state, State::Pending(t) if t == token) {
            e.deadline = deadline;
            self.earliest = self.earliest.min(deadline);
            return true;
        }
        false
    }

    // ---- making room ----------------------------------------------------------------------

    /// Makes room in the scope for one more record: its expired records first, then its own
    /// oldest completed one. Refuses with `ScopeFull` when all its records are pending.
    fn make_scope_room(
        &mut self,
        scope: &[u8; 32],
        now: u64,
        limits: Limits,
    ) -> Result<(), StoreError> {
        let Some(s) = self.find_scope(scope) else {
            return Ok(());
        };
        if at(self.scopes[at(s)].records) < limits.per_scope {
            return Ok(());
        }
        // The scope's oldest completed records are the likeliest to have expired.
        loop {
            let head = self.scopes[at(s)].head;
            if head == NIL || self.entries[at(head)].deadline > now {
                break;
            }
            let last = self.scopes[at(s)].records == 1;
            self.drop_entry(head, now);
            if last || at(self.scopes[at(s)].records) < limits.per_scope {
                return Ok(());
            }
        }
        if self.earliest <= now {
            self.sweep(now);
        }
        let Some(s) = self.find_scope(scope) else {
            return Ok(());
        };
        let slot = &self.scopes[at(s)];
        if at(slot.records) < limits.per_scope {
            return Ok(());
        }
        if slot.head == NIL {
            self.scope_full += 1;
            return Err(StoreError::new(
                StoreErrorKind::ScopeFull,
                "the scope is at its cap and all its records are pending",
            ));
        }
        self.drop_entry(slot.head, now);
        Ok(())
    }

    /// Makes room for `new_entries` more records and `extra` more bytes: expired records first,
    /// then the oldest completed ones. Refuses with `StoreFull` (dropping nothing that is live)
    /// when the pending claims alone leave no room.
    fn make_room(
        &mut self,
        new_entries: usize,
        extra: usize,
        now: u64,
        limits: Limits,
    ) -> Result<(), StoreError> {
        let fits =
            |s: &Self| s.len + new_entries <= limits.entries && s.bytes + extra <= limits.bytes;
        if fits(self) {
            return Ok(());
        }
        // The oldest completed records are the likeliest to have expired: a cheap first pass.
        while !fits(self)
            && self.done_head != NIL
            && self.entries[at(self.done_head)].deadline <= now
        {
            self.drop_entry(self.done_head, now);
        }
        if !fits(self) && self.earliest <= now {
            self.sweep(now);
        }
        if fits(self) {
            return Ok(());
        }
        // Would dropping every completed record be enough? If not, drop none of them.
        let pending_only = self.pending + new_entries <= limits.entries
            && self.pending * ENTRY_OVERHEAD + extra <= limits.bytes;
        if !pending_only {
            self.store_full += 1;
            return Err(StoreError::new(
                StoreErrorKind::StoreFull,
                "the store is full and holds nothing it may drop",
            ));
        }
        while !fits(self) && self.done_head != NIL {
            self.drop_entry(self.done_head, now);
        }
        Ok(())
    }

    /// Drops every expired entry and recomputes the earliest deadline.
    fn sweep(&mut self, now: u64) {
        let mut earliest = u64::MAX;
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.is_vacant() {
                continue;
            }
            if e.deadline <= now {
                // `i` < entries.len() <= u32::MAX by construction.
                if let Ok(idx) = u32::try_from(i) {
                    self.drop_entry(idx, now);
                }
            } else {
                earliest = earliest.min(e.deadline);
            }
        }
        self.earliest = earliest;
    }

    /// Removes an entry to make room or because it expired, counting (and for a live completed
    /// record, logging) the drop.
    fn drop_entry(&mut self, idx: u32, now: u64) {
        let e = &self.entries[at(idx)];
        if e.deadline <= now {
            self.expired_drops += 1;
        } else if matches!(e.state, State::Done(_)) {
            self.early_drops += 1;
            let scope = self.scopes[at(e.scope)].hash;
            tracing::warn!(
                key = ?StoreKey::from_parts(scope, e.id),
                retention_left_ms = (e.deadline - now) / 1_000_000,
                "idempotency record dropped before its retention ended to make room; a retry of \
                 its request would run again (raise the memory store's bounds)"
            );
        }
        self.remove(idx);
    }

    // ---- the slab, the index and the lists ------------------------------------------------

    fn find(&self, hash: u64, id: &[u8; 32]) -> Option<u32> {
        self.index
            .find(hash, |&i| self.entries[at(i)].id == *id)
            .copied()
    }

    fn find_scope(&self, scope: &[u8; 32]) -> Option<u32> {
        let hash = self.hasher.hash_one(scope);
        self.scope_index
            .find(hash, |&s| self.scopes[at(s)].hash == *scope)
            .copied()
    }

    fn scope_slot(&mut self, scope: &[u8; 32]) -> Result<u32, StoreError> {
        if let Some(s) = self.find_scope(scope) {
            return Ok(s);
        }
        let slot = ScopeSlot {
            hash: *scope,
            records: 0,
            head: NIL,
            tail: NIL,
        };
        let s = if self.free_scope == NIL {
            let s = index_of(self.scopes.len())?;
            self.scopes.push(slot);
            s
        } else {
            let s = self.free_scope;
            self.free_scope = self.scopes[at(s)].head;
            self.scopes[at(s)] = slot;
            s
        };
        let Self {
            hasher,
            scope_index,
            scopes,
            ..
        } = self;
        scope_index.insert_unique(hasher.hash_one(scope), s, |&t| {
            hasher.hash_one(scopes[at(t)].hash)
        });
        Ok(s)
    }

    /// Adds a live entry (the caller made room). A `Done` entry must then be linked.
    fn insert(
        &mut self,
        key: &StoreKey,
        hash: u64,
        fingerprint: Fingerprint,
        state: State,
        deadline: u64,
    ) -> Result<u32, StoreError> {
        // Both fallible steps come before any change.
        let new_slot = if self.free == NIL {
            Some(index_of(self.entries.len())?)
        } else {
            None
        };
        let scope = self.scope_slot(key.scope_hash())?;
        let entry = Entry {
            id: *key.id(),
            fingerprint,
            deadline,
            state,
            scope,
            prev: NIL,
            next: NIL,
            scope_prev: NIL,
            scope_next: NIL,
        };
        let bytes = ENTRY_OVERHEAD
            + if let State::Done(r) = &entry.state {
                r.len()
            } else {
                0
            };
        let pending = matches!(entry.state, State::Pending(_));
        let idx = if let Some(idx) = new_slot {
            self.entries.push(entry);
            idx
        } else {
            let idx = self.free;
            self.free = self.entries[at(idx)].next;
            self.entries[at(idx)] = entry;
            idx
        };
        let Self {
            hasher,
            index,
            entries,
            ..
        } = self;
        index.insert_unique(hash, idx, |&i| hasher.hash_one(entries[at(i)].id));
        self.scopes[at(scope)].records += 1;
        self.len += 1;
        self.bytes += bytes;
        if pending {
            self.pending += 1;
        }
        self.earliest = self.earliest.min(deadline);
        Ok(idx)
    }

    /// Removes a live entry and everything that points at it.
    fn remove(&mut self, idx: u32) {
        if self.entries[at(idx)].is_vacant() {
            return;
        }
        let state = std::mem::replace(&mut self.entries[at(idx)].state, VACANT);
        match &state {
            State::Pending(_) => {
                self.pending -= 1;
                self.bytes -= ENTRY_OVERHEAD;
            }
            State::Done(record) => {
                self.unlink_done(idx);
                self.bytes -= ENTRY_OVERHEAD + record.len();
            }
        }
        let hash = self.hasher.hash_one(self.entries[at(idx)].id);
        if let Ok(found) = self.index.find_entry(hash, |&i| i == idx) {
            found.remove();
        }
        let s = self.entries[at(idx)].scope;
        let slot = &mut self.scopes[at(s)];
        slot.records -= 1;
        if slot.records == 0 {
            let hash = self.hasher.hash_one(slot.hash);
            if let Ok(found) = self.scope_index.find_entry(hash, |&t| t == s) {
                found.remove();
            }
            slot.head = self.free_scope;
            slot.tail = NIL;
            self.free_scope = s;
        }
        let e = &mut self.entries[at(idx)];
        e.scope = NIL;
        e.next = self.free;
        self.free = idx;
        self.len -= 1;
    }

    /// Appends a completed entry to the shard's and its scope's lists (newest last).
    fn link_done(&mut self, idx: u32) {
        let tail = self.done_tail;
        let s = self.entries[at(idx)].scope;
        let scope_tail = self.scopes[at(s)].tail;
        let e = &mut self.entries[at(idx)];
        e.prev = tail;
        e.next = NIL;
        e.scope_prev = scope_tail;
        e.scope_next = NIL;
        if tail == NIL {
            self.done_head = idx;
        } else {
            self.entries[at(tail)].next = idx;
        }
        self.done_tail = idx;
        if scope_tail == NIL {
            self.scopes[at(s)].head = idx;
        } else {
            self.entries[at(scope_tail)].scope_next = idx;
        }
        self.scopes[at(s)].tail = idx;
    }

    fn unlink_done(&mut self, idx: u32) {
        let Entry {
            prev,
            next,
            scope_prev,
            scope_next,
            scope,
            ..
        } = self.entries[at(idx)];
        if prev == NIL {
            self.done_head = next;
        } else {
            self.entries[at(prev)].next = next;
        }
        if next == NIL {
            self.done_tail = prev;
        } else {
            self.entries[at(next)].prev = prev;
        }
        if scope_prev == NIL {
            self.scopes[at(scope)].head = scope_next;
        } else {
            self.entries[at(scope_prev)].scope_next = scope_next;
        }
        if scope_next == NIL {
            self.scopes[at(scope)].tail = scope_prev;
        } else {
            self.entries[at(scope_next)].scope_prev = scope_prev;
        }
        let e = &mut self.entries[at(idx)];
        e.prev = NIL;
        e.next = NIL;
        e.scope_prev = NIL;
        e.scope_next = NIL;
    }
}

/// A slab index for a new slot. Bounds keep slabs below `u32::MAX` slots, so this never fails in
/// practice; if it did, the step is refused rather than corrupting the lists.
fn index_of(len: usize) -> Result<u32, StoreError> {
    u32::try_from(len)
        .ok()
        .filter(|&i| i != NIL)
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::StoreFull,
                "the store's shard index is exhausted",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::clock::ManualClock;
    use bytes::Bytes;

    const LEASE: Duration = Duration::from_secs(10);
    const TTL: Duration = Duration::from_secs(100);

    fn key(scope: u8, id: u32) -> StoreKey {
        let mut k = [0u8; 32];
        k[..4].copy_from_slice(&id.to_le_bytes());
        k[4] = scope;
        StoreKey::from_parts([scope; 32], k)
    }

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_bytes([n; 32])
    }

    fn record(len: usize) -> Record {
        Record::from_bytes(Bytes::from(vec![7u8; len]))
    }

    fn store(b: MemoryStoreBuilder) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new();
        (b.shards(1).clock(clock.clone()).build(), clock)
    }

    fn block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    async fn claim(s: &MemoryStore, k: StoreKey) -> Result<Claim, StoreError> {
        s.claim(&k, &fp(1), LEASE).await
    }

    async fn claimed(s: &MemoryStore, k: StoreKey) -> Token {
        match claim(s, k).await {
            Ok(Claim::Claimed(t)) => t,
            other => panic!("expected {k:?} to be claimed, got {other:?}"),
        }
    }

    async fn done(s: &MemoryStore, k: StoreKey, len: usize, ttl: Duration) {
        let t = claimed(s, k).await;
        assert!(
            s.complete(&k, &t, &fp(1), record(len), ttl)
                .await
                .expect("complete"),
            "complete {k:?}"
        );
    }

    /// What the store holds for `k`, without touching it.
    fn peek(s: &MemoryStore, k: StoreKey) -> &'static str {
        let now = s.now();
        let shard = s.shard(&k);
        let Some(i) = shard.find(shard.hasher.hash_one(k.id()), k.id()) else {
            return "absent";
        };
        let e = &shard.entries[at(i)];
        match &e.state {
            _ if e.deadline <= now => "expired",
            State::Pending(_) => "pending",
            State::Done(_) => "done",
        }
    }

    impl MemoryStore {
        /// Checks every invariant of every shard.
        fn check(&self) {
            for cell in &*self.shards {
                lock(cell).check(self.limits);
            }
        }
    }

    impl Shard {
        fn check(&self, limits: Limits) {
            let live: Vec<u32> = (0..self.entries.len())
                .filter(|&i| !self.entries[i].is_vacant())
                .map(|i| u32::try_from(i).expect("index"))
                .collect();
            assert_eq!(self.len, live.len(), "len");
            assert_eq!(self.index.len(), live.len(), "index len");
            assert!(self.len <= limits.entries, "entries bound");
            assert!(self.bytes <= limits.bytes, "bytes bound");
            let mut bytes = 0;
            let mut pending = 0;
            let mut per_scope = std::collections::HashMap::<u32, u32>::new();
            for &i in &live {
                let e = &self.entries[at(i)];
                assert!(e.deadline >= self.earliest, "earliest is a lower bound");
                assert_eq!(
                    self.find(self.hasher.hash_one(e.id), &e.id),
                    Some(i),
                    "indexed"
                );
                *per_scope.entry(e.scope).or_default() += 1;
                match &e.state {
                    State::Pending(_) => {
                        pending += 1;
                        bytes += ENTRY_OVERHEAD;
                    }
                    State::Done(r) => bytes += ENTRY_OVERHEAD + r.len(),
                }
            }
            assert_eq!(self.bytes, bytes, "bytes");
            assert_eq!(self.pending, pending, "pending");
            assert_eq!(
                self.scope_index.len(),
                per_scope.len(),
                "no empty scopes kept"
            );
            for (&s, &n) in &per_scope {
                let slot = &self.scopes[at(s)];
                assert_eq!(slot.records, n, "scope count");
                assert!(at(n) <= limits.per_scope, "scope cap");
                assert_eq!(self.find_scope(&slot.hash), Some(s), "scope indexed");
                // The scope list holds exactly the scope's completed entries, in order.
                let mut prev = NIL;
                let mut i = slot.head;
                let mut listed = 0;
                while i != NIL {
                    let e = &self.entries[at(i)];
                    assert!(
                        matches!(e.state, State::Done(_)) && e.scope == s,
                        "scope list"
                    );
                    assert_eq!(e.scope_prev, prev, "scope back link");
                    prev = i;
                    i = e.scope_next;
                    listed += 1;
                }
                assert_eq!(slot.tail, prev, "scope tail");
                let done = live
                    .iter()
                    .filter(|&&i| {
                        self.entries[at(i)].scope == s
                            && matches!(self.entries[at(i)].state, State::Done(_))
                    })
                    .count();
                assert_eq!(listed, done, "every completed entry of the scope is listed");
            }
            let mut prev = NIL;
            let mut i = self.done_head;
            let mut listed = 0;
            while i != NIL {
                let e = &self.entries[at(i)];
                assert!(matches!(e.state, State::Done(_)), "done list");
                assert_eq!(e.prev, prev, "back link");
                prev = i;
                i = e.next;
                listed += 1;
            }
            assert_eq!(self.done_tail, prev, "tail");
            assert_eq!(
                listed,
                self.len - self.pending,
                "every completed entry is listed"
            );
        }
    }

    #[test]
    fn entry_fits_its_stated_overhead() {
        let per_entry = std::mem::size_of::<Entry>() + std::mem::size_of::<u32>() + 1;
        assert!(
            std::mem::size_of::<Entry>() <= 128,
            "entry is {} bytes",
            std::mem::size_of::<Entry>()
        );
        assert!(
            per_entry + 16 <= ENTRY_OVERHEAD,
            "entry, index slot and malloc header fit the overhead"
        );
    }

    #[test]
    fn expired_records_go_before_the_oldest_completed() {
        block(async {
            let (s, clock) = store(MemoryStore::builder().max_entries(4));
            done(&s, key(1, 1), 10, TTL).await; // oldest completed, long retention
            done(&s, key(2, 2), 10, Duration::from_secs(1)).await; // expires first
            claimed(&s, key(3, 3)).await; // pending, lease 10 s
            let t4 = claimed(&s, key(4, 4)).await;
            s.complete(&key(4, 4), &t4, &fp(1), record(1), TTL)
                .await
                .expect("complete");
            clock.advance(Duration::from_secs(2));

            claimed(&s, key(5, 5)).await;
            assert_eq!(
                peek(&s, key(1, 1)),
                "done",
                "the oldest completed record survives"
            );
            assert_eq!(peek(&s, key(3, 3)), "pending");
            let st = s.stats();
            assert_eq!((st.expired_drops, st.early_drops), (1, 0), "{st:?}");

            // An expired pending claim goes before the oldest completed record too.
            clock.advance(Duration::from_secs(9)); // key 3's lease (10 s) has lapsed; key 5's has not
            claimed(&s, key(6, 6)).await;
            assert_eq!(peek(&s, key(1, 1)), "done");
            let st = s.stats();
            assert_eq!(
                (st.expired_drops, st.early_drops, st.entries),
                (2, 0, 4),
                "{st:?}"
            );
            s.check();
        });
    }

    #[test]
    fn oldest_completed_goes_when_nothing_expired() {
        block(async {
            let (s, _clock) = store(MemoryStore::builder().max_entries(3));
            done(&s, key(1, 1), 10, TTL).await;
            done(&s, key(2, 2), 10, TTL).await;
            claimed(&s, key(3, 3)).await;

            claimed(&s, key(4, 4)).await;
            assert_eq!(
                peek(&s, key(1, 1)),
                "absent",
                "the oldest completed record was dropped"
            );
            assert_eq!(peek(&s, key(2, 2)), "done");
            assert_eq!(peek(&s, key(3, 3)), "pending");
            let st = s.stats();
            assert_eq!((st.early_drops, st.expired_drops), (1, 0), "{st:?}");
            s.check();
        });
    }

    #[test]
    fn pending_in_lease_is_never_dropped() {
        block(async {
            let (s, clock) = store(MemoryStore::builder().max_entries(2));
            claimed(&s, key(1, 1)).await;
            claimed(&s, key(2, 2)).await;

            let err = claim(&s, key(3, 3))
                .await
                .expect_err("only pending records: full");
            assert_eq!(err.kind(), StoreErrorKind::StoreFull);
            assert_eq!(peek(&s, key(1, 1)), "pending");
            assert_eq!(peek(&s, key(2, 2)), "pending");
            assert_eq!(s.stats().store_full_refusals, 1);

            // Once the leases lapse, the claims are expired and make room.
            clock.advance(LEASE);
            claimed(&s, key(3, 3)).await;
            assert_eq!(s.stats().early_drops, 0);
            s.check();
        });
    }

    #[test]
    fn full_store_drops_nothing_when_dropping_cannot_help() {
        block(async {
            let (s, _clock) = store(MemoryStore::builder().max_entries(3));
            done(&s, key(1, 1), 10, TTL).await;
            claimed(&s, key(2, 2)).await;
            claimed(&s, key(3, 3)).await;
            // One completed record: dropping it makes room.
            claimed(&s, key(4, 4)).await;
            assert_eq!(peek(&s, key(1, 1)), "absent");
            // Now all three are pending.
            assert_eq!(
                claim(&s, key(5, 5)).await.expect_err("full").kind(),
                StoreErrorKind::StoreFull
            );
            s.check();
        });
    }

    #[test]
    fn scope_at_its_cap_drops_its_own_oldest() {
        block(async {
            let (s, _clock) = store(
                MemoryStore::builder()
                    .max_entries(100)
                    .max_entries_per_scope(2),
            );
            done(&s, key(9, 1), 10, TTL).await; // another scope's, oldest of all
            done(&s, key(1, 2), 10, TTL).await;
            done(&s, key(1, 3), 10, TTL).await;

            claimed(&s, key(1, 4)).await;
            assert_eq!(peek(&s, key(9, 1)), "done", "other scopes are left alone");
            assert_eq!(peek(&s, key(1, 2)), "absent", "the scope's own oldest went");
            assert_eq!(peek(&s, key(1, 3)), "done");
            assert_eq!(s.stats().early_drops, 1);
            s.check();
        });
    }

    #[test]
    fn scope_at_its_cap_drops_its_expired_first() {
        block(async {
            let (s, clock) = store(
                MemoryStore::builder()
                    .max_entries(100)
                    .max_entries_per_scope(3),
            );
            done(&s, key(1, 1), 10, TTL).await;
            done(&s, key(1, 2), 10, Duration::from_secs(1)).await;
            claimed(&s, key(1, 3)).await;
            clock.advance(Duration::from_secs(2));

            claimed(&s, key(1, 4)).await;
            assert_eq!(peek(&s, key(1, 1)), "done");
            let st = s.stats();
            assert_eq!((st.early_drops, st.expired_drops), (0, 1), "{st:?}");
            s.check();
        });
    }

    #[test]
    fn all_pending_scope_is_full_while_others_claim() {
        block(async {
            let (s, _clock) = store(
                MemoryStore::builder()
                    .max_entries(100)
                    .max_entries_per_scope(2),
            );
            claimed(&s, key(1, 1)).await;
            claimed(&s, key(1, 2)).await;

            let err = claim(&s, key(1, 3)).await.expect_err("scope full");
            assert_eq!(err.kind(), StoreErrorKind::ScopeFull);
            claimed(&s, key(2, 1)).await;
            let st = s.stats();
            assert_eq!(
                (st.scope_full_refusals, st.store_full_refusals, st.entries),
                (1, 0, 3),
                "{st:?}"
            );
            s.check();
        });
    }

    #[test]
    fn bytes_bound_is_respected() {
        block(async {
            let limit = 2 * ENTRY_OVERHEAD + 100;
            let (s, _clock) = store(MemoryStore::builder().max_bytes(limit));
            done(&s, key(1, 1), 60, TTL).await;
            let t2 = claimed(&s, key(2, 2)).await;
            assert_eq!(s.stats().bytes, 2 * ENTRY_OVERHEAD + 60);

            // Completing key 2 needs 60 more bytes: key 1 (not key 2) is dropped to fit.
            assert!(
                s.complete(&key(2, 2), &t2, &fp(1), record(60), TTL)
                    .await
                    .expect("complete")
            );
            let st = s.stats();
            assert_eq!(
                (st.entries, st.bytes, st.early_drops),
                (1, ENTRY_OVERHEAD + 60, 1),
                "{st:?}"
            );
            assert_eq!(peek(&s, key(2, 2)), "done");
            s.check();

            // A record that can never fit is refused without dropping anything.
            let t3 = claimed(&s, key(3, 3)).await;
            let err = s
                .complete(&key(3, 3), &t3, &fp(1), record(limit), TTL)
                .await
                .expect_err("too big");
            assert_eq!(err.kind(), StoreErrorKind::StoreFull);
            assert_eq!(peek(&s, key(3, 3)), "pending", "the key stays pending");
            assert_eq!(peek(&s, key(2, 2)), "done", "nothing was dropped in vain");
            assert!(s.stats().bytes <= limit);
            s.check();
        });
    }

    #[test]
    fn empty_scopes_leave_no_bookkeeping() {
        block(async {
            let (s, clock) = store(MemoryStore::builder());
            for i in 0..50u8 {
                let t = claimed(&s, key(i, 1)).await;
                assert!(s.release(&key(i, 1), &t).await.expect("release"));
                done(&s, key(i, 2), 5, Duration::from_secs(1)).await;
            }
            assert_eq!(s.stats().scopes, 50);
            clock.advance(Duration::from_secs(2));
            assert_eq!(s.remove_expired(), 50);
            let st = s.stats();
            assert_eq!(
                (st.entries, st.bytes, st.pending, st.scopes),
                (0, 0, 0, 0),
                "{st:?}"
            );
            s.check();
        });
    }

    #[test]
    fn expired_entries_are_absent_to_every_step() {
        block(async {
            let (s, clock) = store(MemoryStore::builder());
            let t = claimed(&s, key(1, 1)).await;
            clock.advance(LEASE);
            assert!(
                !s.renew(&key(1, 1), &t, LEASE).await.expect("renew"),
                "an expired lease is not renewed"
            );
            assert_eq!(s.stats().entries, 0, "and the expired entry was dropped");
            let t = claimed(&s, key(1, 1)).await;
            clock.advance(LEASE);
            assert!(!s.release(&key(1, 1), &t).await.expect("release"));
            assert_eq!(s.stats().expired_drops, 2);
            s.check();
        });
    }

    #[test]
    fn zero_bounds_are_clamped() {
        block(async {
            let clock = ManualClock::new();
            let s = MemoryStore::builder()
                .max_entries(0)
                .max_bytes(0)
                .max_entries_per_scope(0)
                .shards(0)
                .clock(clock)
                .build();
            assert_eq!(s.shards.len(), 1);
            assert_eq!(
                (s.limits.entries, s.limits.bytes, s.limits.per_scope),
                (1, ENTRY_OVERHEAD, 1)
            );
            claimed(&s, key(1, 1)).await;

            let s = MemoryStore::builder().max_entries(3).shards(64).build();
            assert_eq!(s.shards.len(), 3, "no more shards than entries");
            let s = MemoryStore::builder().shards(usize::MAX).build();
            assert_eq!(s.shards.len(), MAX_SHARDS);
            assert_eq!(s.limits.entries, DEFAULT_MAX_ENTRIES / MAX_SHARDS);
        });
    }

    /// Random steps over a few scopes and keys under tight bounds; every invariant holds after
    /// each step.
    #[test]
    fn random_steps_keep_every_invariant() {
        block(async {
            let (s, clock) = store(
                MemoryStore::builder()
                    .max_entries(12)
                    .max_bytes(12 * ENTRY_OVERHEAD + 200)
                    .max_entries_per_scope(4),
            );
            let mut tokens: std::collections::HashMap<u32, Token> =
                std::collections::HashMap::new();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for _ in 0..20_000 {
                let r = next();
                let id = u32::try_from(r % 24).expect("small");
                let k = key(u8::try_from(id % 5).expect("small"), id);
                let len = usize::try_from((r >> 8) % 80).expect("small");
                let ttl = Duration::from_millis((r >> 16) % 3000);
                match (r >> 32) % 6 {
                    0 | 1 => {
                        if let Ok(Claim::Claimed(t)) = s.claim(&k, &fp(1), ttl).await {
                            tokens.insert(id, t);
                        }
                    }
                    2 => {
                        if let Some(t) = tokens.get(&id) {
                            let _ = s.complete(&k, t, &fp(1), record(len), ttl).await;
                        }
                    }
                    3 => {
                        if let Some(t) = tokens.get(&id) {
                            let _ = s.release(&k, t).await;
                        }
                    }
                    4 => {
                        if let Some(t) = tokens.get(&id) {
                            let _ = s.renew(&k, t, ttl).await;
                        }
                    }
                    _ => clock.advance(Duration::from_millis((r >> 40) % 500)),
                }
                s.check();
            }
            let st = s.stats();
            assert!(
                st.early_drops > 0 && st.expired_drops > 0 && st.scope_full_refusals > 0,
                "{st:?}"
            );
        });
    }

    #[test]
    fn shards_split_by_scope() {
        block(async {
            let clock = ManualClock::new();
            let s = MemoryStore::builder()
                .max_entries(64)
                .shards(4)
                .clock(clock)
                .build();
            for scope in 0..=255u8 {
                let _ = claim(&s, key(scope, 1)).await;
            }
            let per_shard: Vec<usize> = s.shards.iter().map(|c| lock(c).len).collect();
            assert!(per_shard.iter().all(|&n| n <= 16), "{per_shard:?}");
            assert_eq!(per_shard.iter().sum::<usize>(), 64, "{per_shard:?}");
            s.check();
        });
    }
}
