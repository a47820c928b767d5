//! What a [`MemoryStore`] holds and what it dropped or refused.

use super::shard::Shard;
use super::slab::at;
#[cfg(doc)]
use super::{ENTRY_OVERHEAD, MemoryStore, MemoryStoreBuilder};

/// What a [`MemoryStore`] holds, and what it dropped or refused since it was built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Records held: pending, completed, and released keys kept for their steps. With
    /// [`steps`](Self::steps) they count against
    /// [`max_entries`](MemoryStoreBuilder::max_entries). Expired ones not yet dropped are
    /// included.
    pub entries: usize,
    /// Of those, pending claims.
    pub pending: usize,
    /// Bytes counted for the records: record bytes plus 160 bytes per record. With
    /// [`step_bytes`](Self::step_bytes) they count against
    /// [`max_bytes`](MemoryStoreBuilder::max_bytes).
    pub bytes: usize,
    /// Scopes that hold at least one record.
    pub scopes: usize,
    /// Records and steps held by the scope that holds the most, among those with a droppable
    /// record (completed, or released with steps). Its weight is the larger of its shares of
    /// `max_entries` and `max_bytes`. It is the scope a full store takes room from first.
    pub largest_scope_entries: usize,
    /// That scope's counted bytes, its steps' included.
    pub largest_scope_bytes: usize,
    /// Completed records, and released keys with their steps, dropped before their retention
    /// ended, to make room. Each one is logged. Each came from a scope that held at least as
    /// much as the scope it made room for.
    pub early_drops: u64,
    /// Expired records dropped: past retention, pending past lease, or released past their
    /// steps' retention.
    pub expired_drops: u64,
    /// Operations refused with `ScopeFull`, answered 429. Either the scope is at its fixed cap with
    /// only pending records. Or, in a full store, the room would have to come from the scope's
    /// own records, and they are pending or too few.
    pub scope_full_refusals: u64,
    /// Operations refused with `StoreFull`, answered 503. The store is full, the requesting scope
    /// holds no record, and what the rule lets go would not make the room.
    pub store_full_refusals: u64,
    /// Steps of requests' work held under their keys' records. Each counts as one entry
    /// against [`max_entries`](MemoryStoreBuilder::max_entries): `entries + steps` never
    /// passes it.
    pub steps: usize,
    /// Bytes counted for those steps: each value plus 96 bytes. `bytes + step_bytes` never
    /// passes [`max_bytes`](MemoryStoreBuilder::max_bytes).
    pub step_bytes: usize,
}

impl Shard {
    /// Adds this shard's counts to `stats`. The refusals are counted store-wide.
    pub(super) fn add_to(&self, stats: &mut MemoryStats) {
        stats.entries += self.len;
        stats.pending += self.pending;
        stats.bytes += self.bytes - self.step_bytes;
        stats.steps += self.steps;
        stats.step_bytes += self.step_bytes;
        stats.scopes += self.scope_index.len();
        stats.early_drops += self.early_drops;
        stats.expired_drops += self.expired_drops;
        if let Some((weight, s)) = self.by_weight.top() {
            let largest = self.budget.limits.weight(
                u32::try_from(stats.largest_scope_entries).unwrap_or(u32::MAX),
                stats.largest_scope_bytes,
            );
            if weight > largest {
                let slot = &self.scopes[at(s)];
                stats.largest_scope_entries = at(slot.records);
                stats.largest_scope_bytes = slot.bytes;
            }
        }
    }
}
