//! The embedded store: sharded, bounded, in process memory, fair to its callers under pressure.
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
//!     .shards(4)
//!     .build()
//!     .expect("settings that can work");
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
//!
//! [`MemoryStore`] keeps records in `N` shards, 16 by default. Each shard sits behind its own
//! [`std::sync::Mutex`]. The lock is held only for the synchronous work of one operation, never
//! across an `.await`. A key's shard is chosen by its scope hash. A scope is the namespace,
//! tenant and principal of one caller, so every record of one caller lives in one shard.
//! Shards split the locking, not the budgets.
//!
//! # Bounds
//!
//! | bound | default | counts |
//! | --- | --- | --- |
//! | [`max_entries`](MemoryStoreBuilder::max_entries) | 100 000 | records, pending and completed, and steps, in the whole store |
//! | [`max_bytes`](MemoryStoreBuilder::max_bytes) | 64 MiB | counted bytes of records and steps in the whole store |
//! | [`max_pending_per_scope`](MemoryStoreBuilder::max_pending_per_scope) | a tenth of `max_entries`: 10 000 (at least 16) | one scope's pending claims and their keys' steps |
//! | [`max_pending_bytes_per_scope`](MemoryStoreBuilder::max_pending_bytes_per_scope) | a tenth of `max_bytes`: 6.4 MiB (at least 64 KiB) | counted bytes of those |
//! | [`max_entries_per_scope`](MemoryStoreBuilder::max_entries_per_scope) | none | an optional fixed cap on one scope's records and steps |
//!
//! The bounds are store-wide and hold at every instant. While there is room, any scope may use
//! it for completed records. So a single caller can fill the whole store with them before
//! anything is dropped, and under pressure they are dropped by the rule below. One record may be
//! as large as the store allows.
//!
//! What a pending claim holds is never dropped: the claim, and the steps of its key. So each
//! scope may hold only its *pending share* of the store that way, a tenth by default. A claim
//! or a step past it is refused with [`StoreErrorKind::ScopeFull`], answered 429, while the
//! other scopes still claim. Without the share, one caller whose work never finishes (or who
//! sends fresh keys faster than its work ends) could fill the store with claims and every other
//! caller would get 503. With it, that takes ten such callers at once; a caller may still have
//! 10 000 requests in flight. Claims past their lease are not counted. Set the share with
//! [`max_pending_per_scope`](MemoryStoreBuilder::max_pending_per_scope) and
//! [`max_pending_bytes_per_scope`](MemoryStoreBuilder::max_pending_bytes_per_scope), or turn it
//! off with `usize::MAX` (for one trusted caller that is the only one, say). [`build`](MemoryStoreBuilder::build) refuses a `max_bytes`
//! below one record of [`max_record_bytes`](MemoryStoreBuilder::max_record_bytes).
//!
//! A record is counted as its encoded bytes plus 160 bytes. The 160 bytes cover the entry
//! itself, its index slot and allocator overhead. A pending claim counts the 160 bytes alone.
//! A [step](#steps) counts as one entry more, of its value plus 96 bytes. The per-scope
//! bookkeeping is not counted: about 80 bytes per scope that has records. It is bounded by the
//! number of records and removed when a scope has none left.
//!
//! A scope's *weight* is how much of the store it holds, its steps included. It is the larger
//! of its two shares: `max(bytes, entries × max_bytes / max_entries)`. That is its counted
//! bytes, or its records and steps priced at the average room an entry has. Under pressure,
//! room comes from the heaviest scope.
//!
//! # Making room
//!
//! An operation needs room when it adds to the store. A claim needs one record of 160 bytes. A
//! `complete` needs the record's bytes, less the steps it frees, and a record when nothing
//! holds the key any more. A step needs one entry of its bytes, and the key's record when no
//! claim holds the key. When the store does not have that room free:
//!
//! 1. expired records go first. These are completed records past their retention, pending
//!    claims past their lease, and released keys' steps past their retention. The requester's shard goes first, oldest completed first. Then
//!    that shard is swept if anything in it may have expired. Then another shard's expired
//!    records go. A shard keeps and publishes its earliest deadline. It only sweeps when
//!    something can have expired;
//! 2. then *droppable* records inside their retention go, one at a time: completed records,
//!    and released keys with their steps. Each is the oldest of its scope. `R` is the requesting scope and `w(R)` its weight when the operation began. The
//!    rule picks:
//!    - `R`'s own, when `R` weighs at least as much as every scope that has a completed
//!      record;
//!    - else the heaviest scope's that has one, if it weighs at least `w(R)`;
//!    - else `R`'s own, if it has any left;
//!    - else nothing may go.
//!
//!    So a scope never loses a record to make room for a scope that holds more than it.
//!    Between scopes of equal weight, the requester gives. Each of these *early drops* is
//!    counted in [`MemoryStats::early_drops`] and logged with `tracing::warn!`: at most one
//!    line per 10 s of the store's [`Clock`], whose `drops` field counts the drops since the
//!    last line, so a full store does not write a line per request. A retry of that request
//!    would run its work again, or those steps;
//! 3. a pending claim inside its lease is never dropped, nor are its steps (each scope holds
//!    at most its pending share of them). When the rule
//!    allows nothing more, the operation is refused. It gets [`StoreErrorKind::ScopeFull`] when `R` holds records: all
//!    pending, or too few for a large record. The HTTP layer answers that with 429. Else it
//!    gets [`StoreErrorKind::StoreFull`], answered with 503: a newcomer to a store full of
//!    pending claims.
//!
//! Room for one operation is made in one shard at a time. That is the shard holding the heaviest
//! scope with a completed record, or the requester's own shard on a tie. Within it, the
//! heaviest scope goes first. An operation never holds two shard locks. Before it drops a live record
//! there, the shard checks that what the rule lets it drop is enough. If not, it drops nothing,
//! and the operation tries the next shard. After eight shards the operation is refused. So nothing is
//! dropped for an operation that is refused anyway. Expired records may still go, as they are absent
//! already.
//!
//! With a fixed cap, [`max_entries_per_scope`](MemoryStoreBuilder::max_entries_per_scope), an
//! operation may add a record or a step to a scope at its cap. It first drops the scope's own
//! expired records, then its own oldest droppable records. It is refused with `ScopeFull` when
//! all its records are pending, while other scopes still claim. The records go only if the
//! operation then gets all the room it needs.
//!
//! Every operation treats expired records as absent, using the store's [`Clock`]. That clock is
//! [`TokioClock`] unless [`MemoryStoreBuilder::clock`] sets another. Expired records are
//! dropped when an operation meets them or needs their room. [`MemoryStore::purge`] drops
//! them all at once.
//!
//! # Steps
//!
//! The [`Steps`](crate::Steps) of a request's work live in its key's record, in its shard. So
//! they share the store's one budget and its one fairness rule: each step counts as an entry
//! of its value plus 96 bytes against `max_entries`, `max_bytes` and the scope's weight and
//! cap.
//!
//! | the key | its steps |
//! | --- | --- |
//! | pending | kept while the claim holds the key, whatever their retention; never dropped |
//! | released, or its lease lapsed | kept for their retention from then, or from the last step if later; the next claim takes them |
//! | completed | freed: its record answers every repeat, so steps serve nothing. A step recorded after it is not kept |
//! | forgotten | deleted with it |
//!
//! A released key's steps are droppable under pressure, as a completed record is: the oldest
//! of the heaviest scope goes first, and each drop is counted and logged. Keeping them out of
//! reach would let one caller whose requests fail fill the store with steps nobody may take
//! back for the whole retention, and refuse every other caller. The harm of a drop is the
//! same as a completed record's: a retry runs that work again.
//!
//! [`prepare_step`](Store::prepare_step) renews the claim and checks the room for a step's
//! record, at least its 96 bytes, by the rule above before the step's work runs. A store with
//! no room refuses it with [`StoreErrorKind::ScopeFull`] or [`StoreErrorKind::StoreFull`], and
//! the work does not run. The room is checked, not held: a step whose value is larger than
//! the room left may still be refused when it is recorded, after its work ran; a retry then
//! runs it again.
//!
//! # Cost
//!
//! The store-wide counts are two atomic counters. An operation takes the room it needs from them
//! before it adds anything. It keeps the room its drops free for itself, so a concurrent operation
//! cannot take it first. Each shard keeps its scopes that have a completed record in a binary
//! heap by weight. The heap is updated in `O(log n)` on each change, so the heaviest is found
//! without a scan over scopes. An operation that must make room reads one published value per shard:
//! the weight of its heaviest scope and its earliest deadline. When the room is in another
//! shard, the operation leaves its own shard's lock, visits that one, and starts again.

mod budget;
mod builder;
mod evict;
mod index;
mod shard;
#[cfg(feature = "metrics")]
mod share;
mod slab;
mod stats;
mod steps;
#[cfg(test)]
mod tests;
mod waiters;
mod weights;

pub use builder::MemoryStoreBuilder;
pub use stats::MemoryStats;

use super::{
    Claim, Forgotten, Inspected, StepId, StepRecorded, Store, StoreError, StoreErrorKind, Token,
};
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreKey;
use crate::store::clock::Clock;
#[cfg(doc)]
use crate::store::clock::TokioClock;
use budget::{Budget, Usage, Visited};
use bytes::Bytes;
use shard::Short;
use shard::{Op, Shard};
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The default bound on stored records, over all shards.
pub(crate) const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// The default bound on stored bytes over all shards. Each record counts plus [`ENTRY_OVERHEAD`].
pub(crate) const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;
/// The default size of the largest record the store must be able to hold: the engine's default
/// body limit plus 64 KiB for the status, headers and trailers.
pub(crate) const DEFAULT_MAX_RECORD_BYTES: usize =
    crate::store::DEFAULT_MAX_RECORD_BODY + 64 * 1024;
/// The default share of the store one scope may hold under pending claims: a tenth of
/// `max_entries` and of `max_bytes`. So it takes ten callers whose work never finishes to fill
/// the store with what nothing may drop, while one caller may still have thousands of requests
/// in flight.
pub(crate) const PENDING_SHARE: usize = 10;
/// The least default share, in entries and bytes, unless the store is smaller: a small store
/// still lets a pending claim record its steps.
pub(crate) const PENDING_FLOOR: (usize, usize) = (16, 64 * 1024);
/// The default number of shards.
pub(crate) const DEFAULT_SHARDS: usize = 16;
/// The largest number of shards; larger requests are clamped to it.
pub(crate) const MAX_SHARDS: usize = 1024;
/// The bytes each record is counted for on top of its encoded length. They cover the entry,
/// its index slot and allocator overhead. A pending claim is counted this much alone.
pub(crate) const ENTRY_OVERHEAD: usize = 160;
/// The bytes each step is counted for on top of its value: its id, its value's handle and its
/// place in the key's list, with allocator overhead. A step is also one entry.
pub(crate) const STEP_OVERHEAD: usize = 96;

/// The in-process store. It is cheap to share behind an `Arc`, as the engine does. See the
/// [module docs](self) for its bounds and eviction order.
pub struct MemoryStore {
    shards: Box<[ShardCell]>,
    budget: Arc<Budget>,
    clock: Arc<dyn Clock>,
    waiters: waiters::Waiters,
    /// When the gauges were last set, in the store clock's nanoseconds plus one. 0 means never.
    #[cfg(feature = "metrics")]
    reported: std::sync::atomic::AtomicU64,
    /// What this store last added to the gauges.
    #[cfg(feature = "metrics")]
    share: share::MemoryShare,
}

/// A store that goes takes its figures out of the gauges.
#[cfg(feature = "metrics")]
impl Drop for MemoryStore {
    fn drop(&mut self) {
        self.share.withdraw();
    }
}

/// One shard on its own cache lines, so two cores locking neighbouring shards do not contend.
#[repr(align(128))]
struct ShardCell(Mutex<Shard>);

impl MemoryStore {
    /// A store with the default bounds and clock.
    #[must_use]
    pub fn new() -> Self {
        MemoryStoreBuilder::new().assemble()
    }

    /// A builder to set the bounds, the number of shards or the clock.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::new()
    }

    /// Counts of what the store holds and what it dropped or refused, summed over the shards.
    /// Each shard is locked in turn, so the sum is not one instant's snapshot.
    ///
    /// Records and steps that expired but were not yet dropped are still counted.
    #[must_use]
    pub fn stats(&self) -> MemoryStats {
        let mut stats = MemoryStats::default();
        for cell in &*self.shards {
            lock(cell).add_to(&mut stats);
        }
        stats.scope_full_refusals = self.budget.scope_full.load(Relaxed);
        stats.store_full_refusals = self.budget.store_full.load(Relaxed);
        stats
    }

    /// Drops every expired record and step now, and returns how many it dropped, steps
    /// included, as `PostgresStore::purge` counts its rows. Correctness never needs it: expired
    /// records are absent to every operation and dropped when room is needed. It is useful to
    /// give memory back after a burst.
    pub fn purge(&self) -> u64 {
        let now = self.now();
        self.shards
            .iter()
            .map(|cell| {
                let mut shard = lock(cell);
                if shard.earliest <= now {
                    shard.sweep(now);
                }
                // The room the sweep freed counts a record and each of its steps as an entry.
                let room = shard.finish();
                drop(shard);
                let dropped = room.entries as u64;
                self.budget.give_back(room);
                dropped
            })
            .sum()
    }

    fn home(&self, key: &StoreKey) -> usize {
        let [a, b, c, d, ..] = *key.scope_hash();
        u32::from_le_bytes([a, b, c, d]) as usize % self.shards.len()
    }

    /// Runs an operation that needs no room in the key's shard.
    fn at_home<T>(&self, key: &StoreKey, f: impl FnOnce(&mut Shard) -> T) -> T {
        let mut shard = lock(&self.shards[self.home(key)]);
        let out = f(&mut shard);
        let room = shard.finish();
        drop(shard);
        self.budget.give_back(room);
        out
    }

    /// Runs an operation that may need room in the key's shard. When the room must come from another
    /// shard, the operation leaves its own shard's lock and visits the other one. It never holds two
    /// locks. Then it starts again with the room it was given.
    fn with_room<T>(
        &self,
        key: &StoreKey,
        mut f: impl FnMut(&mut Shard, &Op) -> Result<T, Short>,
    ) -> Result<T, StoreError> {
        let home = self.home(key);
        let mut op = Op {
            now: self.now(),
            visited: Visited::default(),
        };
        let mut credit = Usage::default();
        let out = loop {
            let mut shard = lock(&self.shards[home]);
            shard.credit = credit;
            let out = f(&mut shard, &op);
            credit = shard.finish();
            drop(shard);
            match out {
                Ok(v) => break Ok(v),
                Err(Short::Refused(e)) => break Err(e),
                Err(Short::Elsewhere(_)) if op.visited.is_full() => {
                    self.budget.store_full.fetch_add(1, Relaxed);
                    break Err(StoreError::new(
                        StoreErrorKind::StoreFull,
                        "the store is full and no shard could make room for this operation",
                    ));
                }
                Err(Short::Elsewhere(visit)) => {
                    let mut other = lock(&self.shards[visit.shard]);
                    other.credit = credit;
                    other.give_room(&visit, op.now);
                    credit = other.finish();
                    drop(other);
                    op.visited.add(visit.shard);
                }
            }
        };
        self.budget.give_back(credit);
        out
    }

    fn now(&self) -> u64 {
        nanos(self.clock.now())
    }

    /// Updates the metrics from [`stats`](Self::stats) now. The gauges are
    /// `idempotency_memory_entries` (records and steps, as `max_entries` counts them),
    /// `…_pending` and `…_bytes` (records' and steps', as `max_bytes` counts them). The counter
    /// is `idempotency_memory_early_drops_total`.
    ///
    /// The store updates them by itself at most once a second, after a claim or a completion.
    /// Call this where the metrics are rendered, such as a `/metrics` route, for figures of the
    /// instant. They are the sums over the process's memory stores. Each store moves them by its
    /// own change since its last report, and takes its figures out when it is dropped. So two
    /// stores add up, and the counter never goes back. Install the metrics recorder at start-up,
    /// before the stores first report.
    ///
    /// ```
    /// # use tower_idempotency::MemoryStore;
    /// let store = MemoryStore::new();
    /// store.report_metrics(); // with a recorder installed, sets the gauges to 0
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn report_metrics(&self) {
        let s = self.stats();
        self.share.report(
            s.entries + s.steps,
            s.pending,
            s.bytes + s.step_bytes,
            s.early_drops,
        );
    }

    /// Reports the gauges when a second has passed since the last report.
    #[cfg(feature = "metrics")]
    fn report_now_and_then(&self) {
        const EVERY: u64 = 1_000_000_000;
        let now = self.now().saturating_add(1);
        let last = self.reported.load(Relaxed);
        if (last == 0 || now.saturating_sub(last) >= EVERY)
            && self
                .reported
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.report_metrics();
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = &self.budget.limits;
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_entries", &limits.entries)
            .field("max_bytes", &limits.bytes)
            .field(
                "max_entries_per_scope",
                &(limits.per_scope != usize::MAX).then_some(limits.per_scope),
            )
            .field("max_pending_per_scope", &limits.pending_share.entries)
            .field("max_pending_bytes_per_scope", &limits.pending_share.bytes)
            .finish_non_exhaustive()
    }
}

fn lock(cell: &ShardCell) -> MutexGuard<'_, Shard> {
    // A panic under the lock cannot leave an operation half done in a way later operations rely on more
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
        let lease = nanos(lease);
        let claim = self.with_room(key, |shard, op| {
            let deadline = op.now.saturating_add(lease);
            shard.claim(key, fingerprint, &token, deadline, op)
        });
        #[cfg(feature = "metrics")]
        self.report_now_and_then();
        claim
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let retention = nanos(retention);
        let mut record = Some(record);
        let written = self.with_room(key, |shard, op| {
            let deadline = op.now.saturating_add(retention);
            shard.complete(key, token, fingerprint, &mut record, deadline, op)
        })?;
        if written {
            self.waiters.wake(key.id());
        }
        #[cfg(feature = "metrics")]
        self.report_now_and_then();
        Ok(written)
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let now = self.now();
        let released = self.at_home(key, |shard| shard.release(key, token, now));
        if released {
            self.waiters.wake(key.id());
        }
        Ok(released)
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        let now = self.now();
        // The key is used anew, so its steps go with it; a kept claim's work may still need them.
        let found = self.at_home(key, |shard| shard.forget(key, pending, now));
        if found == Forgotten::Pending {
            // A repeat waiting on the forgotten claim may now run.
            self.waiters.wake(key.id());
        }
        Ok(found)
    }

    async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        let now = self.now();
        Ok(self
            .at_home(key, |shard| shard.pending_left(key, now))
            .map(Duration::from_nanos))
    }

    /// One read under the key's shard lock. It neither sweeps nor reorders: a record inspected
    /// is dropped, when the store is full, no later than if it had not been.
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let now = self.now();
        Ok(self.at_home(key, |shard| shard.inspect(key, now)))
    }

    fn notifies_settled(&self) -> bool {
        true
    }

    /// Woken by the completion or release of the key in this process: no polling.
    async fn wait_settled(&self, key: &StoreKey, within: Duration) {
        let sub = self.waiters.subscribe(key.id());
        let notified = sub.notify.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        // Looked at after subscribing, so a completion in between is not missed. A lease that
        // lapses wakes nobody: the wait ends with it.
        let now = self.now();
        let Some(left) = self.at_home(key, |shard| shard.pending_left(key, now)) else {
            return;
        };
        let _ = tokio::time::timeout(within.min(Duration::from_nanos(left)), notified).await;
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.now();
        let deadline = now.saturating_add(nanos(lease));
        Ok(self.at_home(key, |shard| shard.renew(key, token, deadline, now)))
    }

    /// A completed key keeps no steps: its record answers every repeat, so a step recorded
    /// after it is not kept.
    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        let retention = nanos(retention);
        self.with_room(key, |shard, op| {
            shard.record_step(key, step, &value, retention, op)
        })
    }

    /// Renews the claim, then makes sure a step's record of its fixed overhead has room by the
    /// store's rule, dropping what the rule allows. Refuses with `StoreFull` or `ScopeFull`, as a
    /// claim would be, before the step acts.
    async fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let lease = nanos(lease);
        self.with_room(key, |shard, op| {
            let deadline = op.now.saturating_add(lease);
            shard.prepare_step(key, token, deadline, op)
        })
    }

    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        let now = self.now();
        Ok(self.at_home(key, |shard| shard.read_steps(key, now)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
