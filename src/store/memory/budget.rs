//! The store-wide budgets: what all shards hold together, and where room can be made.
//!
//! Each shard counts its own records under its lock. The budget counts the sum with two atomic
//! counters. An operation takes room from the budget into its *credit* before it adds anything. The
//! room its drops free goes into that credit too, so no other operation can take it first. What the
//! operation does not use goes back when it ends. The bounds therefore hold at every instant
//! without a store-wide lock: `used = sum of the shards' counts + the credits of running operations`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// How many shards one operation may visit to make room before it is refused.
pub(super) const MAX_VISITS: usize = 8;

/// The store's bounds, fixed when it is built.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) entries: usize,
    pub(super) bytes: usize,
    /// The optional fixed cap on one scope's records. `usize::MAX` means none.
    pub(super) per_scope: usize,
    /// The most one scope may hold under pending claims, their steps included: nothing may drop
    /// it. `usize::MAX` entries and bytes mean no share.
    pub(super) pending_share: Usage,
    /// What one record weighs for its entry: `bytes / entries`, at least 1. So a scope's weight is
    /// the larger of its two shares of the store, in bytes.
    pub(super) entry_weight: u64,
}

impl Limits {
    pub(super) fn new(
        entries: usize,
        bytes: usize,
        per_scope: Option<usize>,
        pending_share: Usage,
    ) -> Self {
        Self {
            entries,
            bytes,
            per_scope: per_scope.unwrap_or(usize::MAX),
            pending_share,
            entry_weight: u64::try_from(bytes / entries.max(1))
                .unwrap_or(u64::MAX)
                .max(1),
        }
    }

    /// How much a scope of `records` records and `bytes` counted bytes holds. It is the larger of
    /// its share of `max_entries` and its share of `max_bytes`, expressed in bytes.
    pub(super) fn weight(&self, records: u32, bytes: usize) -> u64 {
        u64::try_from(bytes)
            .unwrap_or(u64::MAX)
            .max(u64::from(records).saturating_mul(self.entry_weight))
    }
}

/// Records and counted bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) entries: usize,
    pub(super) bytes: usize,
}

impl Usage {
    pub(super) const fn new(entries: usize, bytes: usize) -> Self {
        Self { entries, bytes }
    }

    pub(super) fn covers(self, need: Self) -> bool {
        self.entries >= need.entries && self.bytes >= need.bytes
    }

    pub(super) fn is_zero(self) -> bool {
        self.entries == 0 && self.bytes == 0
    }

    /// `self - other`, each count at least zero.
    pub(super) fn minus(self, other: Self) -> Self {
        Self::new(
            self.entries.saturating_sub(other.entries),
            self.bytes.saturating_sub(other.bytes),
        )
    }

    pub(super) fn plus(self, other: Self) -> Self {
        Self::new(self.entries + other.entries, self.bytes + other.bytes)
    }
}

/// The counters every shard shares.
pub(super) struct Budget {
    pub(super) limits: Limits,
    /// What the store holds, on a cache line of its own. Every operation that adds writes it.
    used: Padded<(AtomicUsize, AtomicUsize)>,
    /// What each shard offers to other shards' operations, each on its own cache line. Its shard writes
    /// it. Others read it only when they need room.
    offers: Box<[Padded<Offer>]>,
    pub(super) scope_full: AtomicU64,
    pub(super) store_full: AtomicU64,
    /// Early drops not yet told in a warning.
    unwarned: AtomicU64,
    /// When the next warning of early drops may be logged, in the store clock's nanoseconds.
    warn_after: AtomicU64,
}

/// The least time between two warnings of early drops: 10 s of the store's clock. A full store
/// may drop a record for every new request; a line for each would flood the log.
pub(super) const DROP_WARNING_EVERY: u64 = 10_000_000_000;

#[repr(align(128))]
struct Padded<T>(T);

struct Offer {
    /// The weight of the shard's heaviest scope that has a completed record. 0 means none.
    top: AtomicU64,
    /// No record of the shard expires earlier than this.
    earliest: AtomicU64,
}

/// The shards an operation already visited, which it may not visit again.
#[derive(Debug, Default)]
pub(super) struct Visited {
    shards: [usize; MAX_VISITS],
    len: usize,
}

impl Visited {
    pub(super) fn add(&mut self, shard: usize) {
        if self.len < MAX_VISITS {
            self.shards[self.len] = shard;
            self.len += 1;
        }
    }

    pub(super) fn contains(&self, shard: usize) -> bool {
        self.shards[..self.len].contains(&shard)
    }

    pub(super) fn is_full(&self) -> bool {
        self.len == MAX_VISITS
    }
}

/// Where else room could come from, as the shards last published it.
#[derive(Debug, Default)]
pub(super) struct Elsewhere {
    /// The shard whose heaviest scope with a completed record is the heaviest, and its weight.
    pub(super) heaviest: Option<(usize, u64)>,
    /// A shard holding a record that has expired.
    pub(super) expired: Option<usize>,
}

impl Budget {
    pub(super) fn new(limits: Limits, shards: usize) -> Self {
        Self {
            limits,
            used: Padded((AtomicUsize::new(0), AtomicUsize::new(0))),
            offers: (0..shards)
                .map(|_| {
                    Padded(Offer {
                        top: AtomicU64::new(0),
                        earliest: AtomicU64::new(u64::MAX),
                    })
                })
                .collect(),
            scope_full: AtomicU64::new(0),
            store_full: AtomicU64::new(0),
            unwarned: AtomicU64::new(0),
            warn_after: AtomicU64::new(0),
        }
    }

    /// Counts an early drop at `now`. Returns the drops to tell, this one included, when a
    /// warning is due: the first drop, then at most one line per [`DROP_WARNING_EVERY`].
    pub(super) fn early_drop(&self, now: u64) -> Option<u64> {
        self.unwarned.fetch_add(1, Relaxed);
        let after = self.warn_after.load(Relaxed);
        (now >= after
            && self
                .warn_after
                .compare_exchange(
                    after,
                    now.saturating_add(DROP_WARNING_EVERY),
                    Relaxed,
                    Relaxed,
                )
                .is_ok())
        .then(|| self.unwarned.swap(0, Relaxed))
    }

    /// Moves free room of the store into `credit` until it covers `need`, or no room is free.
    /// Returns whether it covers `need`.
    pub(super) fn take(&self, need: Usage, credit: &mut Usage) -> bool {
        if credit.covers(need) {
            return true;
        }
        let want = need.minus(*credit);
        let (entries, bytes) = &self.used.0;
        credit.entries += grab(entries, self.limits.entries, want.entries);
        credit.bytes += grab(bytes, self.limits.bytes, want.bytes);
        credit.covers(need)
    }

    /// Returns room to the store.
    pub(super) fn give_back(&self, room: Usage) {
        let (entries, bytes) = &self.used.0;
        if room.entries > 0 {
            entries.fetch_sub(room.entries, Relaxed);
        }
        if room.bytes > 0 {
            bytes.fetch_sub(room.bytes, Relaxed);
        }
    }

    /// What the shards hold plus the credits of running operations.
    #[cfg(test)]
    pub(super) fn used(&self) -> Usage {
        let (entries, bytes) = &self.used.0;
        Usage::new(entries.load(Relaxed), bytes.load(Relaxed))
    }

    /// Publishes the weight of a shard's heaviest scope with a completed record.
    pub(super) fn publish_top(&self, shard: usize, top: u64) {
        self.offers[shard].0.top.store(top, Relaxed);
    }

    /// Publishes a shard's earliest deadline.
    pub(super) fn publish_earliest(&self, shard: usize, earliest: u64) {
        self.offers[shard].0.earliest.store(earliest, Relaxed);
    }

    /// Looks at the other shards: not `home`, and none already visited. It costs one load per
    /// shard. It runs only when an operation could not get room from the free budget and its own
    /// shard's expired records.
    pub(super) fn elsewhere(&self, home: usize, now: u64, visited: &Visited) -> Elsewhere {
        let mut found = Elsewhere::default();
        for (i, Padded(offer)) in self.offers.iter().enumerate() {
            if i == home || visited.contains(i) {
                continue;
            }
            let top = offer.top.load(Relaxed);
            if top > found.heaviest.map_or(0, |(_, w)| w) {
                found.heaviest = Some((i, top));
            }
            if found.expired.is_none() && offer.earliest.load(Relaxed) <= now {
                found.expired = Some(i);
            }
        }
        found
    }
}

/// Adds up to `want` to `counter` without passing `max`. Returns what was added.
fn grab(counter: &AtomicUsize, max: usize, want: usize) -> usize {
    if want == 0 {
        return 0;
    }
    let mut got = 0;
    let _ = counter.fetch_update(Relaxed, Relaxed, |used| {
        got = want.min(max.saturating_sub(used));
        (got > 0).then_some(used + got)
    });
    got
}
