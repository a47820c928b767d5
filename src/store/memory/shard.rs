//! A shard: its records, their steps, its scopes and its counters behind one lock, and the
//! operations on them.

use super::ENTRY_OVERHEAD;
use super::budget::{Budget, Usage, Visited};
use super::slab::{Entry, NIL, ScopeSlot, State, StepList, at};
use super::weights::ByWeight;
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreError;
use crate::store::StoreKey;
use crate::store::{Claim, Forgotten, Inspected, Token};
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

/// Why an operation could not get the room it needs in its own shard.
#[derive(Debug)]
pub(super) enum Short {
    /// The operation is refused.
    Refused(StoreError),
    /// Room may be made in another shard: the operation visits it, then tries again.
    Elsewhere(Visit),
}

/// What an operation asks of another shard.
#[derive(Debug, Clone, Copy)]
pub(super) struct Visit {
    pub(super) shard: usize,
    /// The room still missing.
    pub(super) need: Usage,
    /// The requesting scope's weight: no scope lighter than this gives room.
    pub(super) weight: u64,
    /// Whether live records may go, as the shard holds the heaviest scope. Else expired ones
    /// only.
    pub(super) live: bool,
}

/// What one operation knows besides its arguments: the time, and the shards it already visited.
#[derive(Debug)]
pub(super) struct Op {
    pub(super) now: u64,
    pub(super) visited: Visited,
}

/// One shard of a [`MemoryStore`](super::MemoryStore).
pub(super) struct Shard {
    /// The store's bounds and counters, shared by every shard.
    pub(super) budget: Arc<Budget>,
    /// This shard's number in the store: its slot in the budget's published values.
    pub(super) number: usize,
    /// Room the running operation holds. It is counted in the budget, not yet in this shard's
    /// records.
    pub(super) credit: Usage,
    // Keys are SHA-256 outputs, but a client chooses them: a seeded hash keeps bucket
    // collisions out of reach, and foldhash is several times cheaper than SipHash here.
    pub(super) hasher: foldhash::quality::RandomState,
    /// Slab indices of live entries, hashed by id.
    pub(super) index: HashTable<u32>,
    pub(super) entries: Vec<Entry>,
    pub(super) free: u32,
    /// Slot indices of scopes with records, hashed by scope hash.
    pub(super) scope_index: HashTable<u32>,
    pub(super) scopes: Vec<ScopeSlot>,
    pub(super) free_scope: u32,
    /// Keys' steps, each list owned by one entry, and the free slots among them.
    pub(super) step_lists: Vec<StepList>,
    pub(super) free_step_lists: Vec<u32>,
    /// The scopes that have a droppable record, heaviest first: the first gives room first.
    pub(super) by_weight: ByWeight,
    /// The shard's droppable records, oldest first: completed ones, and released keys kept for
    /// their steps. Expired ones are looked for here first.
    pub(super) done_head: u32,
    pub(super) done_tail: u32,
    /// Entries: one per key.
    pub(super) len: usize,
    pub(super) pending: usize,
    /// Counted bytes of the entries and their steps.
    pub(super) bytes: usize,
    /// Steps held, each counted as an entry of the budget, and their counted bytes (also in
    /// `bytes`).
    pub(super) steps: usize,
    pub(super) step_bytes: usize,
    /// No entry's deadline is earlier than this. `u64::MAX` means no entry.
    pub(super) earliest: u64,
    /// The heaviest weight and the earliest deadline last published to the budget.
    pub(super) published: (u64, u64),
    pub(super) early_drops: u64,
    pub(super) expired_drops: u64,
}

impl Shard {
    pub(super) fn new(budget: Arc<Budget>, number: usize) -> Self {
        Self {
            budget,
            number,
            credit: Usage::default(),
            hasher: foldhash::quality::RandomState::default(),
            index: HashTable::new(),
            entries: Vec::new(),
            free: NIL,
            scope_index: HashTable::new(),
            scopes: Vec::new(),
            free_scope: NIL,
            step_lists: Vec::new(),
            free_step_lists: Vec::new(),
            by_weight: ByWeight::default(),
            done_head: NIL,
            done_tail: NIL,
            len: 0,
            pending: 0,
            bytes: 0,
            steps: 0,
            step_bytes: 0,
            earliest: u64::MAX,
            published: (0, u64::MAX),
            early_drops: 0,
            expired_drops: 0,
        }
    }

    /// Ends an operation's visit: publishes what changed and returns the credit it holds.
    pub(super) fn finish(&mut self) -> Usage {
        let top = self.by_weight.top().map_or(0, |(w, _)| w);
        if top != self.published.0 {
            self.budget.publish_top(self.number, top);
            self.published.0 = top;
        }
        if self.earliest != self.published.1 {
            self.budget.publish_earliest(self.number, self.earliest);
            self.published.1 = self.earliest;
        }
        std::mem::take(&mut self.credit)
    }

    pub(super) fn claim(
        &mut self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        token: &Token,
        deadline: u64,
        op: &Op,
    ) -> Result<Claim, Short> {
        let hash = self.hasher.hash_one(key.id());
        if let Some(idx) = self.live(hash, key.id(), op.now) {
            let e = &self.entries[at(idx)];
            return Ok(match &e.state {
                State::Open(Some(_)) => Claim::Pending {
                    fingerprint: e.fingerprint,
                },
                State::Done(record) => Claim::Done {
                    fingerprint: e.fingerprint,
                    record: record.clone(),
                },
                // Released, kept for its steps: the new claim takes it with them.
                State::Open(None) => {
                    self.within_pending_share(key.scope_hash(), self.usage(idx), op.now)?;
                    self.reopen(idx, token, *fingerprint, deadline);
                    Claim::Claimed(token.clone())
                }
            });
        }
        let need = Usage::new(1, ENTRY_OVERHEAD);
        self.within_pending_share(key.scope_hash(), need, op.now)?;
        self.make_room(key.scope_hash(), need, op)?;
        self.insert(
            key,
            hash,
            *fingerprint,
            State::Open(Some(token.clone())),
            deadline,
        )
        .map_err(Short::Refused)?;
        Ok(Claim::Claimed(token.clone()))
    }

    /// `record` is taken, not cloned, once it is written. An operation that returns `Err` to make
    /// room elsewhere leaves it for the next try.
    pub(super) fn complete(
        &mut self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: &mut Option<Record>,
        deadline: u64,
        op: &Op,
    ) -> Result<bool, Short> {
        // Taken only by the operation that writes it and returns at once: never missing here.
        let len = record.as_ref().map_or(0, Record::len);
        let hash = self.hasher.hash_one(key.id());
        if let Some(idx) = self.live(hash, key.id(), op.now) {
            match &self.entries[at(idx)].state {
                State::Open(Some(t)) if t == token => {}
                // Released: nothing holds the key, so the record is written, as after a lapse.
                State::Open(None) => {}
                _ => return Ok(false),
            }
            // The record needs its bytes, less the steps it frees. Our own pending entry is
            // never dropped to make room; a released one may be.
            let need = self.record_need(idx, len);
            self.make_room(key.scope_hash(), need, op)?;
            if !self.entries[at(idx)].is_vacant() {
                let Some(record) = record.take() else {
                    return Ok(false);
                };
                self.fill(idx, *fingerprint, record, deadline);
                return Ok(true);
            }
        }
        // Nothing holds the key: write the record as a new entry.
        let need = Usage::new(1, ENTRY_OVERHEAD + len);
        self.make_room(key.scope_hash(), need, op)?;
        let Some(record) = record.take() else {
            return Ok(false);
        };
        self.insert(key, hash, *fingerprint, State::Done(record), deadline)
            .map_err(Short::Refused)?;
        Ok(true)
    }

    /// Ends the claim of `token`. A key with steps is kept, released, for their retention.
    pub(super) fn release(&mut self, key: &StoreKey, token: &Token, now: u64) -> bool {
        let hash = self.hasher.hash_one(key.id());
        let Some(idx) = self.live(hash, key.id(), now) else {
            return false;
        };
        if self.entries[at(idx)].state.holder() != Some(token) {
            return false;
        }
        if !self.end_claim(idx, now) {
            self.remove(idx);
        }
        true
    }

    /// Deletes the key's live record and its steps. A pending claim goes only when `pending`.
    pub(super) fn forget(&mut self, key: &StoreKey, pending: bool, now: u64) -> Forgotten {
        let Some(idx) = self.live(self.hasher.hash_one(key.id()), key.id(), now) else {
            return Forgotten::Nothing;
        };
        let found = match self.entries[at(idx)].state {
            State::Done(_) => Forgotten::Record,
            State::Open(Some(_)) if pending => Forgotten::Pending,
            State::Open(Some(_)) => return Forgotten::KeptPending,
            // Kept for its steps alone: they go, as the key is used anew.
            State::Open(None) => Forgotten::Nothing,
        };
        self.remove(idx);
        found
    }

    /// The lease left on `key` in nanoseconds, when a live pending claim holds it.
    pub(super) fn pending_left(&self, key: &StoreKey, now: u64) -> Option<u64> {
        let idx = self.find(self.hasher.hash_one(key.id()), key.id())?;
        let e = &self.entries[at(idx)];
        (e.deadline > now && e.state.is_pending()).then(|| e.deadline - now)
    }

    /// What holds the key, read without touching it: no entry moves in the order of what is
    /// dropped, and nothing expired is swept.
    pub(super) fn inspect(&self, key: &StoreKey, now: u64) -> Inspected {
        let Some(idx) = self.find(self.hasher.hash_one(key.id()), key.id()) else {
            return Inspected::Absent;
        };
        let e = &self.entries[at(idx)];
        if e.deadline <= now {
            return Inspected::Absent;
        }
        let left = Duration::from_nanos(e.deadline - now);
        match &e.state {
            State::Open(Some(_)) => Inspected::Pending {
                fingerprint: e.fingerprint,
                lease_left: left,
            },
            State::Done(record) => Inspected::Done {
                fingerprint: e.fingerprint,
                record: record.clone(),
                expires_in: left,
            },
            // Kept for its steps alone: the next claim takes the key.
            State::Open(None) => Inspected::Absent,
        }
    }

    pub(super) fn renew(&mut self, key: &StoreKey, token: &Token, deadline: u64, now: u64) -> bool {
        let hash = self.hasher.hash_one(key.id());
        let Some(idx) = self.live(hash, key.id(), now) else {
            return false;
        };
        let e = &mut self.entries[at(idx)];
        if e.state.holder() == Some(token) {
            e.deadline = deadline;
            self.earliest = self.earliest.min(deadline);
            return true;
        }
        false
    }
}
