//! A shard: its records, its scopes and its counters behind one lock, and the four steps.

use super::ENTRY_OVERHEAD;
use super::slab::{Entry, NIL, ScopeSlot, State, at};
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
use crate::store::{Claim, StoreError, Token};
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// The bounds of one shard.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) entries: usize,
    pub(super) bytes: usize,
    pub(super) per_scope: usize,
}

/// One shard of a [`MemoryStore`](super::MemoryStore).
pub(super) struct Shard {
    pub(super) limits: Limits,
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
    pub(super) done_head: u32,
    pub(super) done_tail: u32,
    pub(super) len: usize,
    pub(super) pending: usize,
    pub(super) bytes: usize,
    /// No entry's deadline is earlier than this (`u64::MAX`: no entry).
    pub(super) earliest: u64,
    pub(super) early_drops: u64,
    pub(super) expired_drops: u64,
    pub(super) scope_full: u64,
    pub(super) store_full: u64,
}

impl Shard {
    pub(super) fn new(limits: Limits) -> Self {
        Self {
            limits,
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

    pub(super) fn claim(
        &mut self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        token: Token,
        deadline: u64,
        now: u64,
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
        self.make_scope_room(key.scope_hash(), now)?;
        self.make_room(1, ENTRY_OVERHEAD, now)?;
        self.insert(
            key,
            hash,
            *fingerprint,
            State::Pending(token.clone()),
            deadline,
        )?;
        Ok(Claim::Claimed(token))
    }

    pub(super) fn complete(
        &mut self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        deadline: u64,
        now: u64,
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
                self.make_room(0, extra, now)?;
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
        self.make_scope_room(key.scope_hash(), now)?;
        self.make_room(1, ENTRY_OVERHEAD + record.len(), now)?;
        let idx = self.insert(key, hash, *fingerprint, State::Done(record), deadline)?;
        self.link_done(idx);
        Ok(true)
    }

    pub(super) fn release(&mut self, key: &StoreKey, token: &Token, now: u64) -> bool {
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

    pub(super) fn renew(&mut self, key: &StoreKey, token: &Token, deadline: u64, now: u64) -> bool {
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
}
