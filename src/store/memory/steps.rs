//! The memory store's recorded steps. A key's steps belong to its entry: they are counted in
//! its shard, its scope's weight and the store's one budget, and expire or are dropped with it.
//! The module docs state the rules.

use super::STEP_OVERHEAD;
use super::budget::Usage;
use super::shard::{Op, Shard, Short};
use super::slab::{NIL, State, StepList, at};
use crate::store::Fingerprint;
use crate::store::StoreKey;
use crate::store::{StepId, StepRecorded, Token};
use bytes::Bytes;
use std::hash::BuildHasher;

impl Shard {
    /// The live entry of `id`. An expired one is dropped, but a lapsed claim with steps is kept
    /// as released, for its steps: then it is returned.
    pub(super) fn live(&mut self, hash: u64, id: &[u8; 32], now: u64) -> Option<u32> {
        let idx = self.find(hash, id)?;
        (self.entries[at(idx)].deadline > now || self.expire(idx, now)).then_some(idx)
    }

    /// Meets an entry past its deadline. A pending claim with steps lapsed: its steps are kept
    /// their retention past the lease. Anything else goes. Returns whether the entry is still
    /// there.
    pub(super) fn expire(&mut self, idx: u32, now: u64) -> bool {
        let e = &self.entries[at(idx)];
        if e.state.is_pending() && e.steps != NIL {
            let lapsed = e.deadline;
            self.end_claim(idx, lapsed);
            if self.entries[at(idx)].deadline > now {
                return true;
            }
        }
        self.drop_entry(idx, now);
        false
    }

    /// Ends the pending claim on the entry at `end`, keeping its steps for their retention from
    /// then. Returns `false`, changing nothing, when it has no steps: the entry should go.
    pub(super) fn end_claim(&mut self, idx: u32, end: u64) -> bool {
        let Some(list) = self.step_list(idx) else {
            return false;
        };
        let deadline = list.until.max(end.saturating_add(list.retention));
        let e = &mut self.entries[at(idx)];
        e.state = State::Open(None);
        e.deadline = deadline;
        let s = e.scope;
        self.pending -= 1;
        self.earliest = self.earliest.min(deadline);
        self.link_done(idx);
        self.rerank(s);
        true
    }

    /// Claims a released entry: it holds the key pending again, with its steps.
    pub(super) fn reopen(
        &mut self,
        idx: u32,
        token: &Token,
        fingerprint: Fingerprint,
        deadline: u64,
    ) {
        self.unlink_done(idx);
        let e = &mut self.entries[at(idx)];
        e.state = State::Open(Some(token.clone()));
        e.fingerprint = fingerprint;
        e.deadline = deadline;
        let s = e.scope;
        self.pending += 1;
        self.earliest = self.earliest.min(deadline);
        self.rerank(s);
    }

    pub(super) fn step_list(&self, idx: u32) -> Option<&StepList> {
        match self.entries[at(idx)].steps {
            NIL => None,
            l => Some(&self.step_lists[at(l)]),
        }
    }

    /// What the entry's steps are counted for.
    fn step_usage(&self, idx: u32) -> Usage {
        self.step_list(idx)
            .map_or(Usage::default(), |l| Usage::new(l.steps.len(), l.bytes))
    }

    /// Frees the entry's steps. Their room goes into the credit.
    pub(super) fn clear_steps(&mut self, idx: u32) {
        let l = std::mem::replace(&mut self.entries[at(idx)].steps, NIL);
        if l == NIL {
            return;
        }
        let list = std::mem::take(&mut self.step_lists[at(l)]);
        self.free_step_lists.push(l);
        let freed = Usage::new(list.steps.len(), list.bytes);
        let s = self.entries[at(idx)].scope;
        let linked = !self.entries[at(idx)].state.is_pending();
        let slot = &mut self.scopes[at(s)];
        if linked {
            slot.droppable = slot.droppable.minus(freed);
        }
        // At most `u32::MAX` entries of a scope are counted, so its steps fit too.
        slot.records -= u32::try_from(freed.entries).unwrap_or(u32::MAX);
        slot.bytes -= freed.bytes;
        self.steps -= freed.entries;
        self.step_bytes -= freed.bytes;
        self.bytes -= freed.bytes;
        self.rerank(s);
        self.credit = self.credit.plus(freed);
    }

    /// Adds a step to the entry. The operation's credit must cover it.
    fn add_step(&mut self, idx: u32, id: StepId, value: Bytes, until: u64, retention: u64) {
        let cost = value.len() + STEP_OVERHEAD;
        if self.entries[at(idx)].steps == NIL {
            let l = match self.free_step_lists.pop() {
                Some(l) => l,
                None => {
                    self.step_lists.push(StepList::default());
                    // Lists are at most one per entry, and entries are `u32`-indexed.
                    u32::try_from(self.step_lists.len() - 1).unwrap_or(NIL)
                }
            };
            self.entries[at(idx)].steps = l;
        }
        let e = &mut self.entries[at(idx)];
        let list = &mut self.step_lists[at(e.steps)];
        list.steps.push((id, value));
        list.bytes += cost;
        list.retention = retention;
        list.until = list.until.max(until);
        if e.state.is_released() {
            e.deadline = e.deadline.max(until);
        }
        let linked = !e.state.is_pending();
        let s = e.scope;
        let slot = &mut self.scopes[at(s)];
        if linked {
            slot.droppable = slot.droppable.plus(Usage::new(1, cost));
        }
        slot.records += 1;
        slot.bytes += cost;
        self.steps += 1;
        self.step_bytes += cost;
        self.bytes += cost;
        self.rerank(s);
        self.spend(Usage::new(1, cost));
    }

    /// Records a step under the key unless it is recorded. A completed key keeps none.
    pub(super) fn record_step(
        &mut self,
        key: &StoreKey,
        id: &StepId,
        value: &Bytes,
        retention: u64,
        op: &Op,
    ) -> Result<StepRecorded, Short> {
        let until = op.now.saturating_add(retention);
        let cost = value.len() + STEP_OVERHEAD;
        let hash = self.hasher.hash_one(key.id());
        if let Some(idx) = self.live(hash, key.id(), op.now) {
            if matches!(self.entries[at(idx)].state, State::Done(_)) {
                // Its record answers every repeat: the step serves nothing.
                return Ok(StepRecorded::Recorded);
            }
            if let Some((_, first)) = self
                .step_list(idx)
                .and_then(|l| l.steps.iter().find(|(s, _)| s == id))
            {
                return Ok(StepRecorded::Found(first.clone()));
            }
            if self.entries[at(idx)].state.is_pending() {
                self.within_pending_share(key.scope_hash(), Usage::new(1, cost), op.now)?;
            }
            self.make_room(key.scope_hash(), Usage::new(1, cost), op)?;
            // A released key is droppable: making room may have dropped it.
            if !self.entries[at(idx)].is_vacant() {
                self.add_step(idx, *id, value.clone(), until, retention);
                return Ok(StepRecorded::Recorded);
            }
        }
        // No claim holds the key: it is kept for the step, released.
        let need = Usage::new(2, super::ENTRY_OVERHEAD + cost);
        self.make_room(key.scope_hash(), need, op)?;
        let unknown = Fingerprint::from_bytes([0; 32]);
        let idx = self
            .insert(key, hash, unknown, State::Open(None), until)
            .map_err(Short::Refused)?;
        self.add_step(idx, *id, value.clone(), until, retention);
        Ok(StepRecorded::Recorded)
    }

    /// The key's steps. A completed key has none.
    pub(super) fn read_steps(&mut self, key: &StoreKey, now: u64) -> Vec<(StepId, Bytes)> {
        let hash = self.hasher.hash_one(key.id());
        self.live(hash, key.id(), now)
            .filter(|&idx| !matches!(self.entries[at(idx)].state, State::Done(_)))
            .and_then(|idx| self.step_list(idx))
            .map(|l| l.steps.clone())
            .unwrap_or_default()
    }

    /// Renews the claim when `token` holds the key, after making sure a step's record of its
    /// fixed overhead has room. The room is checked, not held: it goes back to the store when
    /// the operation ends.
    pub(super) fn prepare_step(
        &mut self,
        key: &StoreKey,
        token: &Token,
        deadline: u64,
        op: &Op,
    ) -> Result<bool, Short> {
        let hash = self.hasher.hash_one(key.id());
        let Some(idx) = self.live(hash, key.id(), op.now) else {
            return Ok(false);
        };
        if self.entries[at(idx)].state.holder() != Some(token) {
            return Ok(false);
        }
        // Our own pending entry: making room never drops it.
        let need = Usage::new(1, STEP_OVERHEAD);
        self.within_pending_share(key.scope_hash(), need, op.now)?;
        self.make_room(key.scope_hash(), need, op)?;
        self.entries[at(idx)].deadline = deadline;
        self.earliest = self.earliest.min(deadline);
        Ok(true)
    }

    /// What completing the entry needs beyond the room its steps free.
    pub(super) fn record_need(&self, idx: u32, len: usize) -> Usage {
        Usage::new(0, len).minus(self.step_usage(idx))
    }
}
