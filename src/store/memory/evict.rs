//! Making room: expired records first, then the oldest completed ones.

use super::ENTRY_OVERHEAD;
use super::shard::Shard;
use super::slab::{NIL, State, at};
use crate::scope::StoreKey;
use crate::store::{StoreError, StoreErrorKind};

impl Shard {
    /// Makes room in the scope for one more record: its expired records first, then its own
    /// oldest completed one. Refuses with `ScopeFull` when all its records are pending.
    pub(super) fn make_scope_room(&mut self, scope: &[u8; 32], now: u64) -> Result<(), StoreError> {
        let Some(s) = self.find_scope(scope) else {
            return Ok(());
        };
        if at(self.scopes[at(s)].records) < self.limits.per_scope {
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
            if last || at(self.scopes[at(s)].records) < self.limits.per_scope {
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
        if at(slot.records) < self.limits.per_scope {
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
    pub(super) fn make_room(
        &mut self,
        new_entries: usize,
        extra: usize,
        now: u64,
    ) -> Result<(), StoreError> {
        let fits =
            |s: &Self| s.len + new_entries <= s.limits.entries && s.bytes + extra <= s.limits.bytes;
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
        let pending_only = self.pending + new_entries <= self.limits.entries
            && self.pending * ENTRY_OVERHEAD + extra <= self.limits.bytes;
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
    pub(super) fn sweep(&mut self, now: u64) {
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
    pub(super) fn drop_entry(&mut self, idx: u32, now: u64) {
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
}
