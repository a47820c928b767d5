//! A shard's slab, id index, scope slots, lists of droppable records and order of scopes by
//! weight.
//!
//! Every change to a shard's counts goes through [`Shard::insert`], [`Shard::fill`],
//! [`Shard::remove`] and, for steps, `add_step` and `clear_steps`, which keep the operation's credit in balance. What the shard adds comes out
//! of the credit. What it removes goes into it.

use super::ENTRY_OVERHEAD;
use super::budget::Usage;
use super::shard::Shard;
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreKey;
use crate::store::{StoreError, StoreErrorKind};
use std::hash::BuildHasher;

use super::slab::{Entry, NIL, ScopeSlot, State, VACANT, at};

impl Shard {
    pub(super) fn find(&self, hash: u64, id: &[u8; 32]) -> Option<u32> {
        self.index
            .find(hash, |&i| self.entries[at(i)].id == *id)
            .copied()
    }

    pub(super) fn find_scope(&self, scope: &[u8; 32]) -> Option<u32> {
        let hash = self.hasher.hash_one(scope);
        self.scope_index
            .find(hash, |&s| self.scopes[at(s)].hash == *scope)
            .copied()
    }

    pub(super) fn scope_slot(&mut self, scope: &[u8; 32]) -> Result<u32, StoreError> {
        if let Some(s) = self.find_scope(scope) {
            return Ok(s);
        }
        let slot = ScopeSlot {
            hash: *scope,
            records: 0,
            bytes: 0,
            droppable: Usage::default(),
            head: NIL,
            tail: NIL,
            rank: NIL,
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

    /// Adds a live entry. The operation's credit must cover it, as the caller made room.
    pub(super) fn insert(
        &mut self,
        key: &StoreKey,
        hash: u64,
        fingerprint: Fingerprint,
        state: State,
        deadline: u64,
    ) -> Result<u32, StoreError> {
        // Both fallible parts come before any change.
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
            steps: NIL,
        };
        let bytes = ENTRY_OVERHEAD
            + if let State::Done(r) = &entry.state {
                r.len()
            } else {
                0
            };
        let pending = entry.state.is_pending();
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
        let slot = &mut self.scopes[at(scope)];
        slot.records += 1;
        slot.bytes += bytes;
        self.len += 1;
        self.bytes += bytes;
        if pending {
            self.pending += 1;
        } else {
            self.link_done(idx);
        }
        self.earliest = self.earliest.min(deadline);
        self.rerank(scope);
        self.spend(Usage::new(1, bytes));
        Ok(idx)
    }

    /// Turns a pending or released entry into a completed one, and frees its steps: the record
    /// answers every repeat. The operation's credit plus the steps' room must cover the record.
    pub(super) fn fill(
        &mut self,
        idx: u32,
        fingerprint: Fingerprint,
        record: Record,
        deadline: u64,
    ) {
        self.clear_steps(idx);
        let s = self.entries[at(idx)].scope;
        let extra = record.len();
        if self.entries[at(idx)].state.is_pending() {
            self.pending -= 1;
        } else {
            self.unlink_done(idx);
        }
        let e = &mut self.entries[at(idx)];
        e.state = State::Done(record);
        e.fingerprint = fingerprint;
        e.deadline = deadline;
        self.bytes += extra;
        self.scopes[at(s)].bytes += extra;
        self.earliest = self.earliest.min(deadline);
        self.link_done(idx);
        self.rerank(s);
        self.spend(Usage::new(0, extra));
    }

    /// The bytes the entry is counted for, its steps' included.
    pub(super) fn cost(&self, idx: u32) -> usize {
        let e = &self.entries[at(idx)];
        ENTRY_OVERHEAD
            + match &e.state {
                State::Open(_) => 0,
                State::Done(r) => r.len(),
            }
            + self.step_list(idx).map_or(0, |l| l.bytes)
    }

    /// What removing the entry frees: one entry for it and one per step, and its bytes.
    pub(super) fn usage(&self, idx: u32) -> Usage {
        Usage::new(
            1 + self.step_list(idx).map_or(0, |l| l.steps.len()),
            self.cost(idx),
        )
    }

    pub(super) fn spend(&mut self, room: Usage) {
        debug_assert!(self.credit.covers(room), "room was made before it is used");
        self.credit = self.credit.minus(room);
    }

    /// Removes a live entry and everything that points at it. Its room goes into the credit.
    pub(super) fn remove(&mut self, idx: u32) {
        if self.entries[at(idx)].is_vacant() {
            return;
        }
        self.clear_steps(idx);
        let s = self.entries[at(idx)].scope;
        let cost = self.cost(idx);
        // Unlinked while its state still says what it counted for.
        if self.entries[at(idx)].state.is_pending() {
            self.pending -= 1;
        } else {
            self.unlink_done(idx);
        }
        self.entries[at(idx)].state = VACANT;
        self.bytes -= cost;
        let hash = self.hasher.hash_one(self.entries[at(idx)].id);
        if let Ok(found) = self.index.find_entry(hash, |&i| i == idx) {
            found.remove();
        }
        let slot = &mut self.scopes[at(s)];
        slot.records -= 1;
        slot.bytes -= cost;
        if slot.records == 0 {
            debug_assert!(
                slot.droppable.is_zero(),
                "a scope's droppable part is its own"
            );
            let hash = self.hasher.hash_one(slot.hash);
            if let Ok(found) = self.scope_index.find_entry(hash, |&t| t == s) {
                found.remove();
            }
            slot.head = self.free_scope;
            slot.tail = NIL;
            self.free_scope = s;
        }
        self.rerank(s);
        let e = &mut self.entries[at(idx)];
        e.scope = NIL;
        e.next = self.free;
        self.free = idx;
        self.len -= 1;
        self.credit = self.credit.plus(Usage::new(1, cost));
    }

    /// Moves the scope to its place in `by_weight` after a change. It is ranked by its weight
    /// while it has a droppable record to give, and out of it otherwise. A vacant slot has no
    /// records.
    pub(super) fn rerank(&mut self, s: u32) {
        let slot = &self.scopes[at(s)];
        let weight = (slot.records > 0 && slot.head != NIL).then(|| self.weight(s));
        if weight != self.by_weight.weight_of(&self.scopes, s) {
            self.by_weight.set(&mut self.scopes, s, weight);
        }
    }

    /// How much the scope holds. See [`Limits::weight`](super::budget::Limits::weight).
    pub(super) fn weight(&self, s: u32) -> u64 {
        let slot = &self.scopes[at(s)];
        self.budget.limits.weight(slot.records, slot.bytes)
    }

    /// Appends a droppable entry to the shard's and its scope's lists, newest last.
    pub(super) fn link_done(&mut self, idx: u32) {
        let tail = self.done_tail;
        let s = self.entries[at(idx)].scope;
        let usage = self.usage(idx);
        let slot = &mut self.scopes[at(s)];
        slot.droppable = slot.droppable.plus(usage);
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

    pub(super) fn unlink_done(&mut self, idx: u32) {
        let usage = self.usage(idx);
        let s = self.entries[at(idx)].scope;
        let slot = &mut self.scopes[at(s)];
        slot.droppable = slot.droppable.minus(usage);
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

/// A slab index for a new slot. Bounds keep slabs below `u32::MAX` slots, so this never fails
/// in practice. If it did, the operation is refused rather than corrupting the lists.
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
