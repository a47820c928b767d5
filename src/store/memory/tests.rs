//! Unit tests of the memory store: its invariants, eviction order and bounds.

use super::budget::Usage;
use super::shard::Shard;
use super::slab::{Entry, NIL, State, at};
use super::*;
use crate::store::StoreErrorKind;
use crate::store::clock::ManualClock;
use bytes::Bytes;
use std::hash::BuildHasher;

const LEASE: Duration = Duration::from_secs(10);
const RETENTION: Duration = Duration::from_secs(100);

fn key(scope: u8, id: u32) -> StoreKey {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&id.to_le_bytes());
    k[4] = scope;
    StoreKey::from_parts([scope; 32], k)
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint::from_bytes([n; 32])
}

fn record(len: usize) -> Record {
    Record::from_bytes(Bytes::from(vec![7u8; len]))
}

/// The store-wide rule alone: no pending share, which the tests of the share set themselves.
fn no_share(b: MemoryStoreBuilder) -> MemoryStoreBuilder {
    b.max_pending_per_scope(usize::MAX)
        .max_pending_bytes_per_scope(usize::MAX)
}

/// A store of one shard on a manual clock; no record size is promised, so tiny byte budgets
/// are accepted. No pending share: the tests of the share build their own store.
fn store(b: MemoryStoreBuilder) -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    let s = no_share(b)
        .shards(1)
        .max_record_bytes(0)
        .clock(clock.clone())
        .build()
        .expect("valid bounds");
    (s, clock)
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

async fn claim(s: &MemoryStore, k: StoreKey) -> Result<Claim, StoreError> {
    s.claim(&k, &fp(1), LEASE).await
}

async fn claimed(s: &MemoryStore, k: StoreKey) -> Token {
    match claim(s, k).await {
        Ok(Claim::Claimed(t)) => t,
        other => panic!("expected {k:?} to be claimed, got {other:?}"),
    }
}

async fn done(s: &MemoryStore, k: StoreKey, len: usize, retention: Duration) {
    let t = claimed(s, k).await;
    assert!(
        s.complete(&k, &t, &fp(1), record(len), retention)
            .await
            .expect("complete"),
        "complete {k:?}"
    );
}

/// What the store holds for `k`, without touching it.
fn peek(s: &MemoryStore, k: StoreKey) -> &'static str {
    let now = s.now();
    let shard = lock(&s.shards[s.home(&k)]);
    let Some(i) = shard.find(shard.hasher.hash_one(k.id()), k.id()) else {
        return "absent";
    };
    let e = &shard.entries[at(i)];
    match &e.state {
        _ if e.deadline <= now => "expired",
        State::Open(Some(_)) => "pending",
        State::Open(None) => "released",
        State::Done(_) => "done",
    }
}

impl MemoryStore {
    /// Checks every invariant of every shard, and that the shards' counts add up to the
    /// store-wide budget (no step is running).
    fn check(&self) {
        let mut total = Usage::default();
        for cell in &*self.shards {
            let shard = lock(cell);
            shard.check();
            total = total.plus(Usage::new(shard.len + shard.steps, shard.bytes));
        }
        let limits = self.budget.limits;
        assert_eq!(
            self.budget.used(),
            total,
            "the budget counts what the shards hold"
        );
        assert!(total.entries <= limits.entries, "entries bound");
        assert!(total.bytes <= limits.bytes, "bytes bound");
    }
}

impl Shard {
    fn check(&self) {
        let limits = self.budget.limits;
        assert!(self.credit.is_zero(), "no credit is left between steps");
        let live: Vec<u32> = (0..self.entries.len())
            .filter(|&i| !self.entries[i].is_vacant())
            .map(|i| u32::try_from(i).expect("index"))
            .collect();
        assert_eq!(self.len, live.len(), "len");
        assert_eq!(self.index.len(), live.len(), "index len");
        let mut bytes = 0;
        let mut pending = 0;
        let (mut steps, mut step_bytes) = (0, 0);
        let mut per_scope = std::collections::HashMap::<u32, (u32, usize)>::new();
        let mut loose = std::collections::HashMap::<u32, Usage>::new();
        for &i in &live {
            let e = &self.entries[at(i)];
            assert!(e.deadline >= self.earliest, "earliest is a lower bound");
            assert_eq!(
                self.find(self.hasher.hash_one(e.id), &e.id),
                Some(i),
                "indexed"
            );
            let list = self.step_list(i);
            let (n, b) = list.map_or((0, 0), |l| {
                let b: usize = l.steps.iter().map(|(_, v)| v.len() + STEP_OVERHEAD).sum();
                assert_eq!(l.bytes, b, "a list counts its steps' bytes");
                assert!(!l.steps.is_empty(), "an empty list is freed");
                (l.steps.len(), b)
            });
            let cost = match &e.state {
                State::Open(Some(_)) => {
                    pending += 1;
                    ENTRY_OVERHEAD
                }
                State::Open(None) => {
                    assert!(n > 0, "a released key is kept for its steps only");
                    ENTRY_OVERHEAD
                }
                State::Done(r) => {
                    assert_eq!(n, 0, "a completed key keeps no steps");
                    ENTRY_OVERHEAD + r.len()
                }
            } + b;
            assert_eq!(self.cost(i), cost, "cost");
            steps += n;
            step_bytes += b;
            bytes += cost;
            let counts = per_scope.entry(e.scope).or_default();
            counts.0 += 1 + u32::try_from(n).expect("steps");
            counts.1 += cost;
            if !e.state.is_pending() {
                let d = loose.entry(e.scope).or_default();
                *d = d.plus(Usage::new(1 + n, cost));
            }
        }
        assert_eq!(self.bytes, bytes, "bytes");
        assert_eq!((self.steps, self.step_bytes), (steps, step_bytes), "steps");
        assert_eq!(self.pending, pending, "pending");
        assert_eq!(
            self.scope_index.len(),
            per_scope.len(),
            "no empty scopes kept"
        );
        let mut ranked = std::collections::BTreeSet::new();
        for (&s, &(n, b)) in &per_scope {
            let slot = &self.scopes[at(s)];
            assert_eq!((slot.records, slot.bytes), (n, b), "scope counts");
            assert!(at(n) <= limits.per_scope, "scope cap");
            let droppable = loose.get(&s).copied().unwrap_or_default();
            assert_eq!(
                slot.droppable, droppable,
                "a scope counts its droppable part"
            );
            assert!(
                limits
                    .pending_share
                    .covers(Usage::new(at(n), b).minus(droppable)),
                "pending share"
            );
            if slot.head != NIL {
                ranked.insert((limits.weight(n, b), s));
            }
            assert_eq!(self.find_scope(&slot.hash), Some(s), "scope indexed");
            // The scope list holds exactly the scope's completed entries, in order.
            let mut prev = NIL;
            let mut i = slot.head;
            let mut listed = 0;
            while i != NIL {
                let e = &self.entries[at(i)];
                assert!(!e.state.is_pending() && e.scope == s, "scope list");
                assert_eq!(e.scope_prev, prev, "scope back link");
                prev = i;
                i = e.scope_next;
                listed += 1;
            }
            assert_eq!(slot.tail, prev, "scope tail");
            let done = live
                .iter()
                .filter(|&&i| {
                    self.entries[at(i)].scope == s && !self.entries[at(i)].state.is_pending()
                })
                .count();
            assert_eq!(listed, done, "every droppable entry of the scope is listed");
        }
        assert_eq!(
            self.by_weight.check(&self.scopes),
            ranked,
            "every scope with a completed record is ranked by its weight"
        );
        let mut prev = NIL;
        let mut i = self.done_head;
        let mut listed = 0;
        while i != NIL {
            let e = &self.entries[at(i)];
            assert!(!e.state.is_pending(), "done list");
            assert_eq!(e.prev, prev, "back link");
            prev = i;
            i = e.next;
            listed += 1;
        }
        assert_eq!(self.done_tail, prev, "tail");
        assert_eq!(
            listed,
            self.len - self.pending,
            "every completed entry is listed"
        );
    }
}

#[test]
fn entry_fits_its_stated_overhead() {
    let per_entry = std::mem::size_of::<Entry>() + std::mem::size_of::<u32>() + 1;
    assert!(
        std::mem::size_of::<Entry>() <= 128,
        "entry is {} bytes",
        std::mem::size_of::<Entry>()
    );
    assert!(
        per_entry + 16 <= ENTRY_OVERHEAD,
        "entry, index slot and malloc header fit the overhead"
    );
}

#[test]
fn expired_records_go_before_the_oldest_completed() {
    block(async {
        let (s, clock) = store(MemoryStore::builder().max_entries(4));
        done(&s, key(1, 1), 10, RETENTION).await; // oldest completed, long retention
        done(&s, key(2, 2), 10, Duration::from_secs(1)).await; // expires first
        claimed(&s, key(3, 3)).await; // pending, lease 10 s
        let t4 = claimed(&s, key(4, 4)).await;
        s.complete(&key(4, 4), &t4, &fp(1), record(1), RETENTION)
            .await
            .expect("complete");
        clock.advance(Duration::from_secs(2));

        claimed(&s, key(5, 5)).await;
        assert_eq!(
            peek(&s, key(1, 1)),
            "done",
            "the oldest completed record survives"
        );
        assert_eq!(peek(&s, key(3, 3)), "pending");
        let st = s.stats();
        assert_eq!((st.expired_drops, st.early_drops), (1, 0), "{st:?}");

        // An expired pending claim goes before the oldest completed record too.
        clock.advance(Duration::from_secs(9)); // key 3's lease (10 s) has lapsed; key 5's has not
        claimed(&s, key(6, 6)).await;
        assert_eq!(peek(&s, key(1, 1)), "done");
        let st = s.stats();
        assert_eq!(
            (st.expired_drops, st.early_drops, st.entries),
            (2, 0, 4),
            "{st:?}"
        );
        s.check();
    });
}

#[test]
fn oldest_completed_goes_when_nothing_expired() {
    block(async {
        let (s, _clock) = store(MemoryStore::builder().max_entries(3));
        done(&s, key(1, 1), 10, RETENTION).await;
        done(&s, key(1, 2), 10, RETENTION).await;
        claimed(&s, key(3, 3)).await;

        claimed(&s, key(4, 4)).await;
        assert_eq!(
            peek(&s, key(1, 1)),
            "absent",
            "the oldest completed record was dropped"
        );
        assert_eq!(peek(&s, key(1, 2)), "done");
        assert_eq!(peek(&s, key(3, 3)), "pending");
        let st = s.stats();
        assert_eq!((st.early_drops, st.expired_drops), (1, 0), "{st:?}");
        s.check();
    });
}

#[test]
fn pending_in_lease_is_never_dropped() {
    block(async {
        let (s, clock) = store(MemoryStore::builder().max_entries(2));
        claimed(&s, key(1, 1)).await;
        claimed(&s, key(2, 2)).await;

        let err = claim(&s, key(3, 3))
            .await
            .expect_err("only pending records: full");
        assert_eq!(err.kind(), StoreErrorKind::StoreFull);
        assert_eq!(peek(&s, key(1, 1)), "pending");
        assert_eq!(peek(&s, key(2, 2)), "pending");
        assert_eq!(s.stats().store_full_refusals, 1);

        // Once the leases lapse, the claims are expired and make room.
        clock.advance(LEASE);
        claimed(&s, key(3, 3)).await;
        assert_eq!(s.stats().early_drops, 0);
        s.check();
    });
}

#[test]
fn full_store_drops_nothing_when_dropping_cannot_help() {
    block(async {
        let (s, _clock) = store(MemoryStore::builder().max_entries(3));
        done(&s, key(1, 1), 10, RETENTION).await;
        claimed(&s, key(2, 2)).await;
        claimed(&s, key(3, 3)).await;
        // One completed record: dropping it makes room.
        claimed(&s, key(4, 4)).await;
        assert_eq!(peek(&s, key(1, 1)), "absent");
        // Now all three are pending.
        assert_eq!(
            claim(&s, key(5, 5)).await.expect_err("full").kind(),
            StoreErrorKind::StoreFull
        );
        s.check();
    });
}

#[test]
fn scope_at_its_cap_drops_its_own_oldest() {
    block(async {
        let (s, _clock) = store(
            MemoryStore::builder()
                .max_entries(100)
                .max_entries_per_scope(2),
        );
        done(&s, key(9, 1), 10, RETENTION).await; // another scope's, oldest of all
        done(&s, key(1, 2), 10, RETENTION).await;
        done(&s, key(1, 3), 10, RETENTION).await;

        claimed(&s, key(1, 4)).await;
        assert_eq!(peek(&s, key(9, 1)), "done", "other scopes are left alone");
        assert_eq!(peek(&s, key(1, 2)), "absent", "the scope's own oldest went");
        assert_eq!(peek(&s, key(1, 3)), "done");
        assert_eq!(s.stats().early_drops, 1);
        s.check();
    });
}

#[test]
fn a_scope_at_its_cap_drops_nothing_when_the_step_is_refused_anyway() {
    block(async {
        let (s, _clock) = store(
            MemoryStore::builder()
                .max_entries(100)
                .max_bytes(4 * ENTRY_OVERHEAD + 300)
                .max_entries_per_scope(2),
        );
        done(&s, key(1, 1), 10, RETENTION).await;
        // Key 2's claim is released: its late complete writes a new entry.
        let t2 = claimed(&s, key(1, 2)).await;
        assert!(s.release(&key(1, 2), &t2).await.expect("release"));
        claimed(&s, key(1, 3)).await; // scope 1 at its cap: one completed, one pending
        claimed(&s, key(2, 1)).await;
        claimed(&s, key(2, 2)).await;

        // Dropping scope 1's record would not make room for 400 more bytes: nothing is dropped.
        let err = s
            .complete(&key(1, 2), &t2, &fp(1), record(400), RETENTION)
            .await
            .expect_err("no room");
        assert!(
            matches!(
                err.kind(),
                StoreErrorKind::ScopeFull | StoreErrorKind::StoreFull
            ),
            "{err}"
        );
        assert_eq!(peek(&s, key(1, 1)), "done", "the scope's record was kept");
        assert_eq!(s.stats().early_drops, 0);
        s.check();
    });
}

#[test]
fn scope_at_its_cap_drops_its_expired_first() {
    block(async {
        let (s, clock) = store(
            MemoryStore::builder()
                .max_entries(100)
                .max_entries_per_scope(3),
        );
        done(&s, key(1, 1), 10, RETENTION).await;
        done(&s, key(1, 2), 10, Duration::from_secs(1)).await;
        claimed(&s, key(1, 3)).await;
        clock.advance(Duration::from_secs(2));

        claimed(&s, key(1, 4)).await;
        assert_eq!(peek(&s, key(1, 1)), "done");
        let st = s.stats();
        assert_eq!((st.early_drops, st.expired_drops), (0, 1), "{st:?}");
        s.check();
    });
}

#[test]
fn all_pending_scope_is_full_while_others_claim() {
    block(async {
        let (s, _clock) = store(
            MemoryStore::builder()
                .max_entries(100)
                .max_entries_per_scope(2),
        );
        claimed(&s, key(1, 1)).await;
        claimed(&s, key(1, 2)).await;

        let err = claim(&s, key(1, 3)).await.expect_err("scope full");
        assert_eq!(err.kind(), StoreErrorKind::ScopeFull);
        claimed(&s, key(2, 1)).await;
        let st = s.stats();
        assert_eq!(
            (st.scope_full_refusals, st.store_full_refusals, st.entries),
            (1, 0, 3),
            "{st:?}"
        );
        s.check();
    });
}

#[test]
fn bytes_bound_is_respected() {
    block(async {
        let limit = 2 * ENTRY_OVERHEAD + 100;
        let (s, _clock) = store(MemoryStore::builder().max_bytes(limit));
        done(&s, key(1, 1), 60, RETENTION).await;
        let t2 = claimed(&s, key(2, 2)).await;
        assert_eq!(s.stats().bytes, 2 * ENTRY_OVERHEAD + 60);

        // Completing key 2 needs 60 more bytes: key 1 (not key 2) is dropped to fit.
        assert!(
            s.complete(&key(2, 2), &t2, &fp(1), record(60), RETENTION)
                .await
                .expect("complete")
        );
        let st = s.stats();
        assert_eq!(
            (st.entries, st.bytes, st.early_drops),
            (1, ENTRY_OVERHEAD + 60, 1),
            "{st:?}"
        );
        assert_eq!(peek(&s, key(2, 2)), "done");
        s.check();

        // A record that can never fit is refused without dropping anything.
        let t3 = claimed(&s, key(3, 3)).await;
        let err = s
            .complete(&key(3, 3), &t3, &fp(1), record(limit), RETENTION)
            .await
            .expect_err("too big");
        assert_eq!(
            err.kind(),
            StoreErrorKind::ScopeFull,
            "the scope holds a pending record"
        );
        assert_eq!(peek(&s, key(3, 3)), "pending", "the key stays pending");
        assert_eq!(peek(&s, key(2, 2)), "done", "nothing was dropped in vain");
        assert!(s.stats().bytes <= limit);
        s.check();
    });
}

#[test]
fn purge_counts_the_steps_it_drops() {
    block(async {
        let (s, clock) = store(MemoryStore::builder());
        let k = key(1, 1);
        let t = claimed(&s, k).await;
        assert!(s.prepare_step(&k, &t, LEASE).await.expect("room"));
        for n in 1..=2u8 {
            let step = StepId::from_bytes([n; 32]);
            s.record_step(&k, &step, Bytes::from_static(b"v"), Duration::from_secs(1))
                .await
                .expect("recorded");
        }
        assert!(s.release(&k, &t).await.expect("release"));
        done(&s, key(1, 2), 5, Duration::from_secs(1)).await;
        clock.advance(LEASE + Duration::from_secs(2));
        // A released key with its two steps, and a record: four, as the PostgreSQL purge
        // counts a row per record and per step.
        assert_eq!(s.purge(), 4);
        assert_eq!(s.purge(), 0, "nothing left to drop");
        assert_eq!(s.stats().entries, 0);
        s.check();
    });
}

#[test]
fn empty_scopes_leave_no_bookkeeping() {
    block(async {
        let (s, clock) = store(MemoryStore::builder());
        for i in 0..50u8 {
            let t = claimed(&s, key(i, 1)).await;
            assert!(s.release(&key(i, 1), &t).await.expect("release"));
            done(&s, key(i, 2), 5, Duration::from_secs(1)).await;
        }
        assert_eq!(s.stats().scopes, 50);
        clock.advance(Duration::from_secs(2));
        assert_eq!(s.purge(), 50);
        let st = s.stats();
        assert_eq!(
            (st.entries, st.bytes, st.pending, st.scopes),
            (0, 0, 0, 0),
            "{st:?}"
        );
        s.check();
    });
}

#[test]
fn expired_entries_are_absent_to_every_step() {
    block(async {
        let (s, clock) = store(MemoryStore::builder());
        let t = claimed(&s, key(1, 1)).await;
        clock.advance(LEASE);
        assert!(
            !s.renew(&key(1, 1), &t, LEASE).await.expect("renew"),
            "an expired lease is not renewed"
        );
        assert_eq!(s.stats().entries, 0, "and the expired entry was dropped");
        let t = claimed(&s, key(1, 1)).await;
        clock.advance(LEASE);
        assert!(!s.release(&key(1, 1), &t).await.expect("release"));
        assert_eq!(s.stats().expired_drops, 2);
        s.check();
    });
}

#[test]
fn impossible_settings_are_refused() {
    // Every refusal is one kind; its message names the setting.
    let refused = |b: MemoryStoreBuilder| {
        let err = b.build().expect_err("refused");
        assert_eq!(err.kind(), crate::ConfigErrorKind::OutOfRange);
        let text = err.to_string();
        ["max_entries_per_scope", "max_entries", "max_bytes"]
            .into_iter()
            .find(|s| text.contains(s))
            .expect("the message names the setting")
    };
    assert_eq!(
        refused(MemoryStore::builder().max_entries(0)),
        "max_entries"
    );
    assert_eq!(
        refused(MemoryStore::builder().max_bytes(DEFAULT_MAX_RECORD_BYTES)),
        "max_bytes",
        "one record plus its overhead must fit"
    );
    assert_eq!(
        refused(
            MemoryStore::builder()
                .max_bytes(1024)
                .max_record_bytes(1024 - ENTRY_OVERHEAD + 1)
        ),
        "max_bytes"
    );
    assert_eq!(
        refused(MemoryStore::builder().max_entries_per_scope(0)),
        "max_entries_per_scope"
    );
    assert_eq!(
        refused(
            MemoryStore::builder()
                .max_entries(100)
                .max_entries_per_scope(101)
        ),
        "max_entries_per_scope",
        "a cap above the store is a mistake in the numbers"
    );
    let err = MemoryStore::builder()
        .max_bytes(512 * 1024)
        .build()
        .expect_err("refused");
    assert!(err.to_string().contains("max_record_bytes"), "{err}");

    // Just enough is accepted.
    MemoryStore::builder()
        .max_entries(1)
        .max_bytes(1024)
        .max_record_bytes(1024 - ENTRY_OVERHEAD)
        .max_entries_per_scope(1)
        .build()
        .expect("one record of the largest size fits");
    MemoryStore::builder()
        .max_bytes(DEFAULT_MAX_RECORD_BYTES + ENTRY_OVERHEAD)
        .build()
        .expect("one record of the default largest size fits");
}

#[test]
fn shards_are_clamped_and_do_not_split_the_budgets() {
    let s = MemoryStore::builder().shards(0).build().expect("valid");
    assert_eq!(s.shards.len(), 1);
    let s = MemoryStore::builder()
        .shards(usize::MAX)
        .build()
        .expect("valid");
    assert_eq!(s.shards.len(), MAX_SHARDS);
    assert_eq!(
        (s.budget.limits.entries, s.budget.limits.bytes),
        (DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES)
    );
    let s = MemoryStore::builder()
        .max_entries(3)
        .shards(64)
        .build()
        .expect("valid");
    assert_eq!(s.shards.len(), 64, "more shards than records is allowed");
}

/// Random steps over a few scopes and keys under tight bounds; every invariant holds after
/// each step.
#[test]
fn random_steps_keep_every_invariant() {
    let st = random_steps(1, Some(4));
    assert!(
        st.early_drops > 0 && st.expired_drops > 0 && st.scope_full_refusals > 0,
        "{st:?}"
    );
}

/// The same over four shards and no fixed cap: room is made across shards.
#[test]
fn random_steps_over_shards_keep_every_invariant() {
    let st = random_steps(4, None);
    assert!(
        st.early_drops > 0 && st.expired_drops > 0 && st.scope_full_refusals > 0,
        "{st:?}"
    );
}

/// Four threads at once over four shards under tight bounds: the store-wide counts never pass
/// the bounds, and add up exactly once the threads are done.
#[test]
fn concurrent_steps_keep_the_budget_exact() {
    let clock = ManualClock::new();
    let s = std::sync::Arc::new(
        MemoryStore::builder()
            .shards(4)
            .max_entries(16)
            .max_bytes(16 * ENTRY_OVERHEAD + 400)
            .max_record_bytes(0)
            .clock(clock.clone())
            .build()
            .expect("valid"),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = std::sync::Arc::clone(&s);
            let clock = clock.clone();
            std::thread::spawn(move || {
                block(async move {
                    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
                    let mut tokens = std::collections::HashMap::<u32, Token>::new();
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let id = u32::try_from(x % 32).expect("small");
                        let k = key(u8::try_from(id % 7).expect("small"), id);
                        let retention = Duration::from_millis((x >> 16) % 2000);
                        match (x >> 32) % 6 {
                            5 => {
                                let step =
                                    StepId::from_bytes([u8::try_from(x % 3).expect("small"); 32]);
                                let value = Bytes::from(vec![
                                    1u8;
                                    usize::try_from((x >> 8) % 60)
                                        .expect("small")
                                ]);
                                let _ = s.record_step(&k, &step, value, retention).await;
                            }
                            0 | 1 => {
                                if let Ok(Claim::Claimed(tok)) =
                                    s.claim(&k, &fp(1), retention).await
                                {
                                    tokens.insert(id, tok);
                                }
                            }
                            2 => {
                                if let Some(tok) = tokens.get(&id) {
                                    let len = usize::try_from((x >> 8) % 120).expect("small");
                                    let _ =
                                        s.complete(&k, tok, &fp(1), record(len), retention).await;
                                }
                            }
                            3 => {
                                if let Some(tok) = tokens.get(&id) {
                                    let _ = s.release(&k, tok).await;
                                }
                            }
                            _ if t == 0 => clock.advance(Duration::from_millis((x >> 40) % 300)),
                            _ => {}
                        }
                        let used = s.budget.used();
                        assert!(
                            used.entries <= 16 && used.bytes <= 16 * ENTRY_OVERHEAD + 400,
                            "{used:?}"
                        );
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    s.check();
    let st = s.stats();
    assert!(st.early_drops > 0 && st.expired_drops > 0, "{st:?}");
}

fn random_steps(shards: usize, cap: Option<usize>) -> MemoryStats {
    block(async {
        let clock = ManualClock::new();
        let mut b = MemoryStore::builder()
            .shards(shards)
            .max_entries(12)
            .max_bytes(12 * ENTRY_OVERHEAD + 200)
            .max_record_bytes(0)
            .clock(clock.clone());
        if let Some(cap) = cap {
            b = b.max_entries_per_scope(cap);
        }
        let s = b.build().expect("valid");
        let mut tokens: std::collections::HashMap<u32, Token> = std::collections::HashMap::new();
        let mut recorded = 0;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let r = next();
            let id = u32::try_from(r % 24).expect("small");
            let k = key(u8::try_from(id % 5).expect("small"), id);
            let len = usize::try_from((r >> 8) % 80).expect("small");
            let retention = Duration::from_millis((r >> 16) % 3000);
            match (r >> 32) % 10 {
                0 | 1 => {
                    if let Ok(Claim::Claimed(t)) = s.claim(&k, &fp(1), retention).await {
                        tokens.insert(id, t);
                    }
                }
                6 | 7 => {
                    let step =
                        StepId::from_bytes([u8::try_from((r >> 48) % 3).expect("small"); 32]);
                    let value = Bytes::from(vec![1u8; len / 2]);
                    if let Ok(crate::store::StepRecorded::Recorded) =
                        s.record_step(&k, &step, value, retention).await
                    {
                        recorded += 1;
                    }
                }
                8 => {
                    if let Some(t) = tokens.get(&id) {
                        let _ = s.prepare_step(&k, t, retention).await;
                    }
                }
                9 if r & 1 == 0 => {
                    let _ = s.forget(&k, r & 2 == 0).await;
                }
                9 => {
                    let _ = s.steps(&k).await.expect("steps");
                }
                2 => {
                    if let Some(t) = tokens.get(&id) {
                        let _ = s.complete(&k, t, &fp(1), record(len), retention).await;
                    }
                }
                3 => {
                    if let Some(t) = tokens.get(&id) {
                        let _ = s.release(&k, t).await;
                    }
                }
                4 => {
                    if let Some(t) = tokens.get(&id) {
                        let _ = s.renew(&k, t, retention).await;
                    }
                }
                _ => clock.advance(Duration::from_millis((r >> 40) % 500)),
            }
            s.check();
        }
        assert!(recorded > 1_000, "steps were recorded: {recorded}");
        s.stats()
    })
}

#[test]
fn budgets_are_store_wide() {
    block(async {
        let clock = ManualClock::new();
        let s = no_share(MemoryStore::builder())
            .max_entries(64)
            .shards(4)
            .clock(clock)
            .build()
            .expect("valid");
        for scope in 0..=255u8 {
            let _ = claim(&s, key(scope, 1)).await;
        }
        let per_shard: Vec<usize> = s.shards.iter().map(|c| lock(c).len).collect();
        assert_eq!(per_shard.iter().sum::<usize>(), 64, "{per_shard:?}");
        assert_eq!(s.stats().store_full_refusals, 256 - 64);
        s.check();

        // One scope may use all of it.
        let s = no_share(MemoryStore::builder())
            .max_entries(64)
            .shards(4)
            .clock(ManualClock::new())
            .build()
            .expect("valid");
        for id in 0..64 {
            claimed(&s, key(7, id)).await;
        }
        s.check();
    });
}

#[test]
fn a_scope_as_large_as_the_largest_makes_room_from_its_own() {
    block(async {
        let (s, _clock) = store(MemoryStore::builder().max_entries(6));
        for id in 0..3 {
            done(&s, key(1, id), 10, RETENTION).await;
            done(&s, key(2, id), 10, RETENTION).await;
        }
        claimed(&s, key(1, 3)).await;
        claimed(&s, key(2, 3)).await;
        for id in 1..3 {
            assert_eq!(peek(&s, key(1, id)), "done");
            assert_eq!(peek(&s, key(2, id)), "done");
        }
        assert_eq!(peek(&s, key(1, 0)), "absent", "scope 1 gave its own");
        assert_eq!(peek(&s, key(2, 0)), "absent", "scope 2 gave its own");
        s.check();
    });
}

#[test]
fn expired_records_in_another_shard_go_before_live_ones() {
    block(async {
        let clock = ManualClock::new();
        let s = no_share(MemoryStore::builder())
            .max_entries(4)
            .shards(2)
            .clock(clock.clone())
            .build()
            .expect("valid");
        // Scope 2 lives in shard 0, scopes 1 and 3 in shard 1.
        assert_eq!((s.home(&key(2, 0)), s.home(&key(1, 0))), (0, 1));
        done(&s, key(3, 0), 10, RETENTION).await;
        done(&s, key(2, 0), 10, Duration::from_secs(1)).await;
        done(&s, key(2, 1), 10, RETENTION).await;
        done(&s, key(2, 2), 10, RETENTION).await;
        clock.advance(Duration::from_secs(2));

        claimed(&s, key(1, 0)).await;
        let st = s.stats();
        assert_eq!((st.expired_drops, st.early_drops), (1, 0), "{st:?}");
        assert_eq!(peek(&s, key(3, 0)), "done");
        assert_eq!(peek(&s, key(2, 1)), "done");
        s.check();

        // Nothing expired now: scope 2 (shard 0) holds the most and gives its oldest.
        claimed(&s, key(1, 1)).await;
        assert_eq!(peek(&s, key(2, 1)), "absent");
        assert_eq!(peek(&s, key(3, 0)), "done", "scope 3 holds less");
        assert_eq!(s.stats().early_drops, 1);
        s.check();
    });
}

#[test]
fn a_scope_holds_at_most_its_pending_share() {
    block(async {
        let clock = ManualClock::new();
        // A share of a tenth of 100 entries and of 100 000 bytes.
        let s = MemoryStore::builder()
            .max_entries(100)
            .max_bytes(100_000)
            .max_pending_per_scope(10)
            .max_pending_bytes_per_scope(10_000)
            .max_record_bytes(0)
            .shards(1)
            .clock(clock.clone())
            .build()
            .expect("valid");
        let held: Vec<Token> = {
            let mut v = Vec::new();
            for id in 0..10 {
                v.push(claimed(&s, key(1, id)).await);
            }
            v
        };
        let err = claim(&s, key(1, 10)).await.expect_err("past the share");
        assert_eq!(err.kind(), StoreErrorKind::ScopeFull, "{err}");
        claimed(&s, key(2, 0)).await;
        s.check();

        // A claim that completes holds nothing any more: the scope claims again, and its
        // completed records are not counted.
        assert!(
            s.complete(&key(1, 0), &held[0], &fp(1), record(10), RETENTION)
                .await
                .expect("complete")
        );
        for id in 20..60 {
            done(&s, key(1, id), 10, RETENTION).await;
        }
        let t = claimed(&s, key(1, 10)).await;
        assert_eq!(
            claim(&s, key(1, 11))
                .await
                .expect_err("at the share")
                .kind(),
            StoreErrorKind::ScopeFull
        );
        s.check();

        // A step of a pending key is held too: the bytes share (10 000) refuses a large one,
        // and the entries share any step once the scope holds ten entries.
        let step = StepId::from_bytes([1; 32]);
        let big = Bytes::from(vec![0u8; 10_000]);
        let err = s
            .record_step(&key(1, 10), &step, big, RETENTION)
            .await
            .expect_err("past the bytes share");
        assert_eq!(err.kind(), StoreErrorKind::ScopeFull, "{err}");
        let err = s
            .prepare_step(&key(1, 10), &t, LEASE)
            .await
            .expect_err("at the share");
        assert_eq!(err.kind(), StoreErrorKind::ScopeFull, "{err}");

        // Released with its steps: droppable, not held; claimed again, held again.
        assert!(s.release(&key(1, 1), &held[1]).await.expect("release"));
        assert!(
            s.prepare_step(&key(1, 2), &held[2], LEASE)
                .await
                .expect("room")
        );
        s.record_step(&key(1, 2), &step, Bytes::from_static(b"v"), RETENTION)
            .await
            .expect("recorded");
        assert!(s.release(&key(1, 2), &held[2]).await.expect("release"));
        claimed(&s, key(1, 11)).await;
        s.check();
        // The released key with its step would hold two entries: the scope holds ten already.
        assert_eq!(
            claim(&s, key(1, 2))
                .await
                .expect_err("past the share")
                .kind(),
            StoreErrorKind::ScopeFull
        );

        // Claims past their lease hold nothing.
        clock.advance(LEASE + Duration::from_secs(1));
        for id in 100..110 {
            claimed(&s, key(1, id)).await;
        }
        s.check();
        assert_eq!(s.stats().scope_full_refusals, 5);
    });
}

#[test]
fn the_pending_share_refuses_settings_that_hold_no_claim() {
    for b in [
        MemoryStore::builder().max_pending_per_scope(0),
        MemoryStore::builder().max_pending_bytes_per_scope(ENTRY_OVERHEAD - 1),
    ] {
        let err = b.build().expect_err("refused");
        assert_eq!(err.kind(), crate::ConfigErrorKind::OutOfRange);
        assert!(err.to_string().contains("max_pending"), "{err}");
    }
    MemoryStore::builder()
        .max_pending_per_scope(1)
        .max_pending_bytes_per_scope(ENTRY_OVERHEAD)
        .build()
        .expect("one claim per scope");
}

/// A small store's default share has a floor: a tenth of ten entries would be one, which a
/// claim fills by itself, so no pending claim could record a step although the store has room.
#[test]
fn a_small_store_with_the_default_share_still_records_a_step_of_a_pending_claim() {
    block(async {
        let s = MemoryStore::builder()
            .max_entries(10)
            .max_record_bytes(0)
            .shards(1)
            .clock(ManualClock::new())
            .build()
            .expect("valid");
        let t = claimed(&s, key(1, 0)).await;
        assert!(
            s.prepare_step(&key(1, 0), &t, LEASE)
                .await
                .expect("a store of ten entries has room for a claim and its step")
        );
        let step = StepId::from_bytes([1; 32]);
        s.record_step(&key(1, 0), &step, Bytes::from_static(b"v"), RETENTION)
            .await
            .expect("recorded");
        s.check();
    });
}
