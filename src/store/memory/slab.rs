//! The slab's entries and scope slots: the data a shard keeps, with no behaviour of a shard
//! (that is in `index.rs`, `shard.rs` and `evict.rs`).

use crate::engine::fingerprint::Fingerprint;
use crate::engine::record::Record;
use crate::store::Token;

/// "No entry" in the intrusive lists and free lists.
pub(super) const NIL: u32 = u32::MAX;

/// One record. Kept compact (about 128 bytes): hashes inline, times as `u64` nanoseconds of the
/// store's clock, `u32` slab indices for the two intrusive lists of completed records.
pub(super) struct Entry {
    pub(super) id: [u8; 32],
    pub(super) fingerprint: Fingerprint,
    /// Lease end while pending, retention end once done (nanoseconds of the store's clock).
    pub(super) deadline: u64,
    pub(super) state: State,
    /// The slot of the entry's scope in `Shard::scopes`; `NIL` marks a vacant slab slot.
    pub(super) scope: u32,
    /// The shard's completed records, oldest first. In a vacant entry, `next` is the free list.
    pub(super) prev: u32,
    pub(super) next: u32,
    /// The scope's completed records, oldest first.
    pub(super) scope_prev: u32,
    pub(super) scope_next: u32,
}

/// Two variants only, so the discriminant hides in `Bytes`' pointer niche (32 bytes, not 40).
pub(super) enum State {
    Pending(Token),
    Done(Record),
}

/// The state a vacant slot keeps (it owns nothing).
pub(super) const VACANT: State = State::Pending(Token::from_bytes([0; 16]));

impl Entry {
    pub(super) fn is_vacant(&self) -> bool {
        self.scope == NIL
    }
}

/// A scope that holds records. A vacant slot has `records == 0` and `head` is the free list.
pub(super) struct ScopeSlot {
    pub(super) hash: [u8; 32],
    pub(super) records: u32,
    /// Counted bytes of its records ([`ENTRY_OVERHEAD`] each plus the record's length).
    pub(super) bytes: usize,
    /// Its completed records, oldest first.
    pub(super) head: u32,
    pub(super) tail: u32,
    /// Its place in the shard's `by_weight` heap (`NIL`: not there).
    pub(super) rank: u32,
}

pub(super) fn at(i: u32) -> usize {
    i as usize
}
