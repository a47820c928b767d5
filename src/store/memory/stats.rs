//! What a [`MemoryStore`] holds and what it dropped or refused.

use super::shard::Shard;
#[cfg(doc)]
use super::{ENTRY_OVERHEAD, MemoryStore};

/// What a [`MemoryStore`] holds, and what it dropped or refused since it was built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Records held, pending and completed (expired ones not yet dropped included).
    pub entries: usize,
    /// Of those, pending claims.
    pub pending: usize,
    /// Bytes counted against `max_bytes`: record bytes plus [`ENTRY_OVERHEAD`] per record.
    pub bytes: usize,
    /// Scopes that hold at least one record.
    pub scopes: usize,
    /// Completed records dropped before their retention ended, to make room.
    pub early_drops: u64,
    /// Expired records dropped (past retention, or pending past lease).
    pub expired_drops: u64,
    /// Steps refused because the scope was at its cap with only pending records.
    pub scope_full_refusals: u64,
    /// Steps refused because the shard held nothing it could drop.
    pub store_full_refusals: u64,
}

impl Shard {
    /// Adds this shard's counts to `stats`.
    pub(super) fn add_to(&self, stats: &mut MemoryStats) {
        stats.entries += self.len;
        stats.pending += self.pending;
        stats.bytes += self.bytes;
        stats.scopes += self.scope_index.len();
        stats.early_drops += self.early_drops;
        stats.expired_drops += self.expired_drops;
        stats.scope_full_refusals += self.scope_full;
        stats.store_full_refusals += self.store_full;
    }
}
