//! The slab's entries and scope slots: the data a shard keeps, with no behaviour of a shard
//! (that is in `index.rs`, `shard.rs` and `evict.rs`).

use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::{StepId, Token};
use bytes::Bytes;

/// "No entry" in the intrusive lists and free lists.
pub(super) const NIL: u32 = u32::MAX;

/// One key's record. Kept compact (about 128 bytes): hashes inline, times as `u64` nanoseconds of
/// the store's clock, `u32` slab indices for the two intrusive lists of droppable records and
/// for the key's steps.
pub(super) struct Entry {
    pub(super) id: [u8; 32],
    pub(super) fingerprint: Fingerprint,
    /// Lease end while pending, retention end once done, the steps' end once released
    /// (nanoseconds of the store's clock).
    pub(super) deadline: u64,
    pub(super) state: State,
    /// The slot of the entry's scope in `Shard::scopes`; `NIL` marks a vacant slab slot.
    pub(super) scope: u32,
    /// The shard's droppable records (completed, or released with steps), oldest first. In a
    /// vacant entry, `next` is the free list.
    pub(super) prev: u32,
    pub(super) next: u32,
    /// The scope's droppable records, oldest first.
    pub(super) scope_prev: u32,
    pub(super) scope_next: u32,
    /// The key's steps in `Shard::step_lists`; `NIL`: none. It sits in what was padding, so a
    /// record without steps costs nothing more.
    pub(super) steps: u32,
}

/// Two variants only, so the discriminant hides in `Bytes`' pointer niche (32 bytes, not 40).
pub(super) enum State {
    /// A pending claim under its token. `None` once released or lapsed: no claim holds the
    /// key, which is kept for its steps alone and may be claimed.
    Open(Option<Token>),
    Done(Record),
}

impl State {
    /// The token of the pending claim that holds the key.
    pub(super) fn holder(&self) -> Option<&Token> {
        match self {
            Self::Open(t) => t.as_ref(),
            Self::Done(_) => None,
        }
    }

    /// Whether a pending claim holds the key.
    pub(super) fn is_pending(&self) -> bool {
        self.holder().is_some()
    }

    /// Whether the key is kept for its steps alone.
    pub(super) fn is_released(&self) -> bool {
        matches!(self, Self::Open(None))
    }
}

/// The state a vacant slot keeps (it owns nothing).
pub(super) const VACANT: State = State::Open(None);

/// A key's recorded steps, owned by its entry.
#[derive(Default)]
pub(super) struct StepList {
    pub(super) steps: Vec<(StepId, Bytes)>,
    /// Their counted bytes: each value plus [`STEP_OVERHEAD`](super::STEP_OVERHEAD).
    pub(super) bytes: usize,
    /// The retention the last step was recorded with. Once no claim holds the key, its steps
    /// are kept at least this long.
    pub(super) retention: u64,
    /// The latest end of retention a step was recorded with.
    pub(super) until: u64,
}

impl Entry {
    pub(super) fn is_vacant(&self) -> bool {
        self.scope == NIL
    }
}

/// A scope that holds records. A vacant slot has `records == 0` and `head` is the free list.
pub(super) struct ScopeSlot {
    pub(super) hash: [u8; 32],
    /// Its records and their steps: each counts as one entry.
    pub(super) records: u32,
    /// Counted bytes of its records and steps.
    pub(super) bytes: usize,
    /// What its droppable records hold, their steps included. The rest is held by its
    /// pending claims, which nothing may drop.
    pub(super) droppable: super::budget::Usage,
    /// Its droppable records, oldest first.
    pub(super) head: u32,
    pub(super) tail: u32,
    /// Its place in the shard's `by_weight` heap (`NIL`: not there).
    pub(super) rank: u32,
}

pub(super) fn at(i: u32) -> usize {
    i as usize
}
