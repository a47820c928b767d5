//! Making room: expired records first, then the oldest completed records of the scope that
//! holds the most, never a smaller scope's. The module docs state the rule.

use super::budget::Usage;
use super::shard::{Op, Shard, Short, Visit};
use super::slab::{NIL, State, at};
use crate::store::StoreKey;
use crate::store::{StoreError, StoreErrorKind};
use std::sync::atomic::Ordering::Relaxed;

impl Shard {
    /// Makes sure the operation's credit covers `need` for an operation of `scope`, dropping only
    /// what the rule allows and only once it is known to be enough.
    pub(super) fn make_room(
        &mut self,
        scope: &[u8; 32],
        need: Usage,
        op: &Op,
    ) -> Result<(), Short> {
        let cap = self.budget.limits.per_scope;
        if need.entries > cap {
            // A key's first step needs the key's entry and the step's.
            return Err(self.refuse(true, "the scope's cap is below what the operation adds"));
        }
        // A fixed cap binds an operation that adds records or steps to a scope that would hold
        // more than `cap` with them. (A slot emptied by a drop is vacant: `records == 0`.)
        let slot = (need.entries > 0 && cap != usize::MAX)
            .then(|| self.find_scope(scope))
            .flatten();
        let capped =
            |s: &Self| slot.is_some_and(|r| at(s.scopes[at(r)].records) + need.entries > cap);
        if !capped(self) && self.take(need) {
            return Ok(());
        }
        // Expired records go first: every operation treats them as absent already. The scope's own
        // oldest completed records are the likeliest of its own to have expired.
        while let Some(r) = slot.filter(|_| capped(self)) {
            let head = self.scopes[at(r)].head;
            if head == NIL || self.entries[at(head)].deadline > op.now {
                break;
            }
            self.drop_entry(head, op.now);
        }
        self.drop_expired(op.now, |s| !capped(s) && s.take(need));
        if !capped(self) && self.take(need) {
            return Ok(());
        }

        let r = self.find_scope(scope);
        // At its cap, the scope's own oldest droppable records are the first to go: as many
        // as bring it under the cap. `forced` is the last of them and the room they free.
        let forced = match r {
            Some(r) if capped(self) => {
                let excess = at(self.scopes[at(r)].records) + need.entries - cap;
                let (mut freed, mut last) = (Usage::default(), NIL);
                let mut i = self.scopes[at(r)].head;
                while i != NIL && freed.entries < excess {
                    freed = freed.plus(self.usage(i));
                    last = i;
                    i = self.entries[at(i)].scope_next;
                }
                if freed.entries < excess {
                    return Err(self.refuse(
                        true,
                        "the scope is at its cap and all its records are pending",
                    ));
                }
                Some((r, last, freed))
            }
            _ => None,
        };
        let rest = need.minus(forced.map_or(Usage::default(), |(_, _, freed)| freed));
        if self.take(rest) {
            self.drop_forced(forced, op.now);
            return Ok(());
        }
        let forced_last = forced.map(|(_, last, _)| last);

        let weight = r.map_or(0, |r| self.weight(r));
        let elsewhere = self.budget.elsewhere(self.number, op.now, &op.visited);
        let heaviest = elsewhere.heaviest.filter(|&(_, w)| w >= weight);
        if let Some(shard) = elsewhere.expired {
            return Err(Short::Elsewhere(Visit {
                shard,
                need: rest,
                weight,
                live: heaviest.is_some_and(|(h, _)| h == shard),
            }));
        }
        // Whether the scope has a completed record besides the one that goes anyway.
        let own = r.is_some_and(|r| match forced_last {
            Some(f) => self.entries[at(f)].scope_next != NIL,
            None => self.scopes[at(r)].head != NIL,
        });
        let top = self.by_weight.top().map(|(w, _)| w);
        let here = match heaviest {
            None => own || top.is_some_and(|w| w >= weight),
            Some((_, other)) => {
                (own && weight >= other) || top.is_some_and(|w| w >= other && w >= weight)
            }
        };
        if here && self.can_free(rest.minus(self.credit), r, weight, forced_last) {
            self.drop_forced(forced, op.now);
            if self.drop_by_weight(need, r, weight, op.now) {
                return Ok(());
            }
        } else if let Some((shard, _)) = heaviest {
            return Err(Short::Elsewhere(Visit {
                shard,
                need: rest,
                weight,
                live: true,
            }));
        }
        Err(self.refuse(
            r.is_some(),
            "the store is full and the room would have to come from the scope's own records, \
             which are pending, or from smaller scopes",
        ))
    }

    /// Refuses an operation that would leave `scope` holding more than its share under pending
    /// claims: `adds` more held by a claim (a new claim, a step of a pending key, or a released
    /// key claimed again with its steps). Nothing may drop what a claim holds, so without the
    /// share one caller whose work never finishes could fill the store and refuse every other.
    /// Claims past their lease are absent: they are swept first when the scope seems over.
    pub(super) fn within_pending_share(
        &mut self,
        scope: &[u8; 32],
        adds: Usage,
        now: u64,
    ) -> Result<(), Short> {
        let share = self.budget.limits.pending_share;
        let held = |s: &Self| {
            s.find_scope(scope).map_or(Usage::default(), |r| {
                let slot = &s.scopes[at(r)];
                Usage::new(at(slot.records), slot.bytes).minus(slot.droppable)
            })
        };
        if share.covers(held(self).plus(adds)) {
            return Ok(());
        }
        if self.earliest <= now {
            self.sweep(now);
        }
        if share.covers(held(self).plus(adds)) {
            Ok(())
        } else {
            Err(self.refuse(
                true,
                "the scope holds its share of the store under pending claims",
            ))
        }
    }

    /// Drops the scope's oldest droppable records up to `last`, which bring it under its cap.
    fn drop_forced(&mut self, forced: Option<(u32, u32, Usage)>, now: u64) {
        let Some((r, last, _)) = forced else {
            return;
        };
        loop {
            // The scope keeps `last` until the end, so its slot stays its own.
            let head = self.scopes[at(r)].head;
            self.drop_entry(head, now);
            if head == last {
                break;
            }
        }
    }

    /// Gives a visiting operation room. Expired records go first. Then, if `live`, the oldest completed
    /// records of its heaviest scopes go, of those that weigh at least as much as the visitor's.
    /// It is all or nothing: live records go only when they make all the room the visitor misses.
    pub(super) fn give_room(&mut self, visit: &Visit, now: u64) -> bool {
        self.drop_expired(now, |s| s.take(visit.need));
        if self.take(visit.need) {
            return true;
        }
        visit.live
            && self.can_free(visit.need.minus(self.credit), None, visit.weight, None)
            && self.drop_by_weight(visit.need, None, visit.weight, now)
    }

    /// Moves free room of the store into the operation's credit. Returns whether the credit covers
    /// `need`.
    pub(super) fn take(&mut self, need: Usage) -> bool {
        self.budget.take(need, &mut self.credit)
    }

    /// Whether dropping what the rule allows frees `deficit`. The rule allows every completed
    /// record of the scope `own`, after `forced`, which goes anyway. Of each other scope, it allows
    /// its oldest completed records while it still weighs at least `weight`. The total does not
    /// depend on the order the drops are made in. So this walk stops as soon as it has found
    /// enough: it visits about as many records as will be dropped.
    fn can_free(&self, deficit: Usage, own: Option<u32>, weight: u64, forced: Option<u32>) -> bool {
        let mut left = deficit;
        if left.is_zero() {
            return true;
        }
        if let Some(r) = own {
            let mut i = forced.map_or(self.scopes[at(r)].head, |f| self.entries[at(f)].scope_next);
            while i != NIL {
                left = left.minus(self.usage(i));
                if left.is_zero() {
                    return true;
                }
                i = self.entries[at(i)].scope_next;
            }
        }
        self.by_weight.any_at_least(weight, &mut |_, s| {
            if Some(s) == own {
                return false;
            }
            let slot = &self.scopes[at(s)];
            let (mut records, mut bytes) = (slot.records, slot.bytes);
            let mut i = slot.head;
            while i != NIL && self.budget.limits.weight(records, bytes) >= weight {
                let freed = self.usage(i);
                left = left.minus(freed);
                if left.is_zero() {
                    return true;
                }
                records = records.saturating_sub(u32::try_from(freed.entries).unwrap_or(u32::MAX));
                bytes -= freed.bytes;
                i = self.entries[at(i)].scope_next;
            }
            false
        })
    }

    /// Drops completed records until the credit covers `need`. They come from the heaviest scope,
    /// or from the scope `own` itself when it is among the heaviest. They never come from a scope
    /// lighter than `weight` other than `own`. Returns whether the credit covers `need` in the end.
    fn drop_by_weight(&mut self, need: Usage, own: Option<u32>, weight: u64, now: u64) -> bool {
        loop {
            if self.take(need) {
                return true;
            }
            // A slot emptied by a drop is vacant (`records == 0`; its `head` is the free list).
            let own =
                own.filter(|&r| self.scopes[at(r)].records > 0 && self.scopes[at(r)].head != NIL);
            let victim = match (own, self.by_weight.top()) {
                (Some(r), Some((top, _))) if self.weight(r) >= top => r,
                (_, Some((top, s))) if top >= weight => s,
                (Some(r), _) => r,
                _ => return false,
            };
            self.drop_entry(self.scopes[at(victim)].head, now);
        }
    }

    /// Drops expired records until `enough` holds. The shard's oldest completed records go first,
    /// as the likeliest to have expired. Then the whole shard is swept, if anything may still have
    /// expired.
    fn drop_expired(&mut self, now: u64, mut enough: impl FnMut(&mut Self) -> bool) {
        while !enough(self)
            && self.done_head != NIL
            && self.entries[at(self.done_head)].deadline <= now
        {
            self.drop_entry(self.done_head, now);
        }
        if self.earliest <= now && !enough(self) {
            self.sweep(now);
        }
    }

    /// Counts a refusal: `ScopeFull` when the requesting scope holds records, else `StoreFull`.
    fn refuse(&self, holds_records: bool, why: &'static str) -> Short {
        Short::Refused(if holds_records {
            self.budget.scope_full.fetch_add(1, Relaxed);
            StoreError::new(StoreErrorKind::ScopeFull, why)
        } else {
            self.budget.store_full.fetch_add(1, Relaxed);
            StoreError::new(
                StoreErrorKind::StoreFull,
                "the store is full and holds nothing that may be dropped for this scope",
            )
        })
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
                if let Ok(idx) = u32::try_from(i)
                    && self.expire(idx, now)
                {
                    // A lapsed claim kept, released, for its steps.
                    earliest = earliest.min(self.entries[i].deadline);
                }
            } else {
                earliest = earliest.min(e.deadline);
            }
        }
        self.earliest = earliest;
    }

    /// Removes an entry to make room or because it expired, and counts the drop. A live completed
    /// record's or released key's drop is also logged, at most one line per 10 s of the store's
    /// clock, which tells the drops since the last line and the latest one.
    pub(super) fn drop_entry(&mut self, idx: u32, now: u64) {
        let e = &self.entries[at(idx)];
        let early =
            e.deadline > now && (e.state.is_released() || matches!(e.state, State::Done(_)));
        if e.deadline <= now {
            self.expired_drops += 1;
        } else if early {
            self.early_drops += 1;
        }
        let told = early.then(|| self.budget.early_drop(now)).flatten();
        if let Some(drops) = told {
            self.warn_early_drop(idx, now, drops);
        }
        self.remove(idx);
    }

    fn warn_early_drop(&self, idx: u32, now: u64, drops: u64) {
        let e = &self.entries[at(idx)];
        if e.state.is_released() {
            let slot = &self.scopes[at(e.scope)];
            tracing::warn!(
                drops,
                key = ?StoreKey::from_parts(slot.hash, e.id),
                retention_left_ms = (e.deadline - now) / 1_000_000,
                steps = self.step_list(idx).map_or(0, |l| l.steps.len()),
                scope_records = slot.records,
                scope_bytes = slot.bytes,
                "idempotency records or steps dropped before their retention ended to make room \
                 (`drops` since the last such line, at most one every 10 s; the latest: steps \
                 of a released key, its scope holds the most); a retry of their requests would \
                 run again (raise the memory store's bounds)"
            );
        } else {
            let slot = &self.scopes[at(e.scope)];
            tracing::warn!(
                drops,
                key = ?StoreKey::from_parts(slot.hash, e.id),
                retention_left_ms = (e.deadline - now) / 1_000_000,
                scope_records = slot.records,
                scope_bytes = slot.bytes,
                "idempotency records or steps dropped before their retention ended to make room \
                 (`drops` since the last such line, at most one every 10 s; the latest: a \
                 completed record, its scope holds the most); a retry of their requests would \
                 run again (raise the memory store's bounds)"
            );
        }
    }
}
