//! Model-based test of the [`Store`] contract: random sequences of claim / complete / release /
//! renew / time steps run against a store AND against a small reference model written here, and
//! every answer of the store must be the model's (token fencing included).
//!
//! The model keeps, per key, `None | Pending { token, fingerprint, until } | Done { fingerprint,
//! record, until }` with the semantics of the `Store` docs (src/store/mod.rs): a record whose
//! `until` is not after now is absent; `complete` writes only if the token holds the key pending
//! or nothing live holds it; `release` deletes only a live pending record of the token; `renew`
//! extends only a live pending record of the token.
//!
//! - [`MemoryStore`] runs on a [`ManualClock`]: time is exact, so the model hits deadlines on
//!   the nanosecond (an advance lands on, one millisecond before or one after a deadline).
//! - `RedisStore` runs on real time (expiry is the server's `PX`). Time moves in steps of
//!   [`STEP`]; every lease and retention is a whole number of steps plus half a step, and every
//!   operation must finish in the first half of its step minus [`GUARD`], so no answer is ever
//!   read near a deadline. A case whose operations overrun (a loaded machine) stops there
//!   without asserting further and is counted; it never fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "redis")]
use crate::support::redis_server;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use std::time::Duration;
use tower_idempotency::engine::Fingerprint;
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::store::{Claim, Record, StoreKey, Token};
use tower_idempotency::{MemoryStore, Store};

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// The keys a case plays with.
const KEYS: usize = 3;
/// Distinct fingerprints and records a case uses.
const FPS: usize = 2;
const RECORDS: usize = 3;

/// Which token an operation presents.
#[derive(Debug, Clone, Copy)]
enum Tok {
    /// The token of the key's latest claim (the holder, unless its lease lapsed).
    Latest,
    /// An older token of the same key (a stale holder), counted back from the latest.
    Back(u8),
    /// The latest token of another key.
    Foreign(usize),
    /// A token no store ever issued.
    Stranger,
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: usize,
        fp: usize,
        lease: u8,
    },
    Complete {
        key: usize,
        tok: Tok,
        fp: usize,
        record: usize,
        ttl: u8,
    },
    Release {
        key: usize,
        tok: Tok,
    },
    Renew {
        key: usize,
        tok: Tok,
        lease: u8,
    },
    /// Moves time `steps` steps; on the memory store also `nudge` ms (−1, 0, +1) around them.
    Advance {
        steps: u8,
        nudge: i8,
    },
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        6 => Just(Tok::Latest),
        2 => (1u8..4).prop_map(Tok::Back),
        1 => (1..KEYS).prop_map(Tok::Foreign),
        1 => Just(Tok::Stranger),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let fp = 0..FPS;
    let units = 1u8..=3;
    prop_oneof![
        4 => (key.clone(), fp.clone(), units.clone())
            .prop_map(|(key, fp, lease)| Op::Claim { key, fp, lease }),
        3 => (key.clone(), tok(), fp, 0..RECORDS, units.clone())
            .prop_map(|(key, tok, fp, record, ttl)| Op::Complete { key, tok, fp, record, ttl }),
        2 => (key.clone(), tok()).prop_map(|(key, tok)| Op::Release { key, tok }),
        2 => (key, tok(), units).prop_map(|(key, tok, lease)| Op::Renew { key, tok, lease }),
        3 => (0u8..=3, -1i8..=1).prop_map(|(steps, nudge)| Op::Advance { steps, nudge }),
    ]
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), (max / 2).max(1)..=max)
}

// ---------------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Pending {
        token: usize,
        fp: usize,
        until: u64,
    },
    Done {
        fp: usize,
        record: usize,
        until: u64,
    },
}

impl Slot {
    fn until(&self) -> u64 {
        match self {
            Self::Pending { until, .. } | Self::Done { until, .. } => *until,
        }
    }
}

/// The model's state: the live slot of each key, the tokens issued per key (oldest first, as
/// indices into `tokens`), and the model time (units chosen by the backend).
#[derive(Debug, Default)]
struct Model {
    now: u64,
    slots: HashMap<usize, Slot>,
    tokens: Vec<Token>,
    issued: HashMap<usize, Vec<usize>>,
}

impl Model {
    /// The key's record if it is live now (expired = absent).
    fn live(&self, key: usize) -> Option<&Slot> {
        self.slots.get(&key).filter(|s| s.until() > self.now)
    }

    /// The token index an operation presents; `None` is the stranger token.
    fn pick(&self, key: usize, tok: Tok) -> Option<usize> {
        let of = |k: usize| self.issued.get(&k).map(Vec::as_slice).unwrap_or_default();
        match tok {
            Tok::Latest => of(key).last().copied(),
            Tok::Back(n) => {
                let own = of(key);
                own.len()
                    .checked_sub(1 + usize::from(n))
                    .map(|i| own[i])
                    .or_else(|| own.first().copied())
            }
            Tok::Foreign(d) => of((key + d) % KEYS).last().copied(),
            Tok::Stranger => None,
        }
    }

    fn holds(&self, key: usize, token: Option<usize>) -> bool {
        matches!(self.live(key), Some(Slot::Pending { token: t, .. }) if Some(*t) == token)
    }
}

/// What the case saw, summed over the run and printed for RELIABILITY.md.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    cases: u64,
    /// Cases stopped early because an operation overran its time window (Redis only).
    cut_short: u64,
    ops_checked: u64,
    claimed: u64,
    claim_pending: u64,
    claim_done: u64,
    writes_refused: u64,
    /// Complete / release / renew refused to a token that once held the key (fencing).
    stale_token_fenced: u64,
    /// Operations on a key whose previous record had expired.
    after_expiry: u64,
}

impl Tally {
    fn add(&mut self, o: &Self) {
        self.cases += o.cases;
        self.cut_short += o.cut_short;
        self.ops_checked += o.ops_checked;
        self.claimed += o.claimed;
        self.claim_pending += o.claim_pending;
        self.claim_done += o.claim_done;
        self.writes_refused += o.writes_refused;
        self.stale_token_fenced += o.stale_token_fenced;
        self.after_expiry += o.after_expiry;
    }
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

/// A store under test with its notion of time.
trait Backend {
    type S: Store;
    fn store(&self) -> &Self::S;
    /// The key of model key `i` in this case.
    fn key(&self, i: usize) -> StoreKey;
    /// A lease or retention of `units` steps: the duration sent to the store and its length in
    /// model time.
    fn span(&self, units: u8) -> (Duration, u64);
    /// Moves time; returns the new model time.
    async fn advance(&mut self, steps: u8, nudge: i8, now: u64) -> u64;
    /// Whether the operation that just finished ran far enough from every deadline for its
    /// answer to be checked.
    fn trustworthy(&self) -> bool {
        true
    }
}

fn fingerprint(i: usize) -> Fingerprint {
    Fingerprint::builder()
        .field(b"model")
        .field(&[u8::try_from(i).unwrap()])
        .finish()
}

fn record(i: usize) -> Record {
    Record::from_bytes(Bytes::from(format!("record-{i}").into_bytes()))
}

/// Fresh random bytes (from the OS CSPRNG through `Token`).
fn random32() -> [u8; 32] {
    let a = Token::generate().unwrap();
    let b = Token::generate().unwrap();
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(a.as_bytes());
    out[16..].copy_from_slice(b.as_bytes());
    out
}

/// Runs one case: every operation against the backend and the model; the first mismatch fails.
async fn run_case<B: Backend>(b: &mut B, case: &[Op]) -> Result<Tally, TestCaseError> {
    let mut m = Model::default();
    let mut t = Tally {
        cases: 1,
        ..Tally::default()
    };
    let stranger = Token::generate().unwrap();
    let keys: Vec<StoreKey> = (0..KEYS).map(|i| b.key(i)).collect();
    for (step, op) in case.iter().enumerate() {
        let token_of =
            |m: &Model, idx: Option<usize>| idx.map_or(stranger.clone(), |i| m.tokens[i].clone());
        if let Op::Advance { steps, nudge } = *op {
            m.now = b.advance(steps, nudge, m.now).await;
            continue;
        }
        let key = match *op {
            Op::Claim { key, .. }
            | Op::Complete { key, .. }
            | Op::Release { key, .. }
            | Op::Renew { key, .. } => key,
            Op::Advance { .. } => unreachable!(),
        };
        let expired_before = m.slots.get(&key).is_some_and(|s| s.until() <= m.now);
        let ctx = |what: &str| {
            format!(
                "step {step} ({op:?}): {what}; model {:?}",
                m.slots.get(&key)
            )
        };
        match *op {
            Op::Claim { key, fp, lease } => {
                let (lease_d, lease_m) = b.span(lease);
                let got = b.store().claim(&keys[key], &fingerprint(fp), lease_d).await;
                if !b.trustworthy() {
                    t.cut_short += 1;
                    return Ok(t);
                }
                let got = got.map_err(|e| fail(&ctx(&format!("store error {e}"))))?;
                match (m.live(key).cloned(), got) {
                    (None, Claim::Claimed(token)) => {
                        prop_assert!(
                            !m.tokens.contains(&token) && token != stranger,
                            "{}",
                            ctx("a claim issued a token seen before")
                        );
                        m.tokens.push(token);
                        let idx = m.tokens.len() - 1;
                        m.issued.entry(key).or_default().push(idx);
                        m.slots.insert(
                            key,
                            Slot::Pending {
                                token: idx,
                                fp,
                                until: m.now + lease_m,
                            },
                        );
                        t.claimed += 1;
                    }
                    (Some(Slot::Pending { fp: held, .. }), Claim::Pending { fingerprint: f }) => {
                        prop_assert_eq!(f, fingerprint(held), "{}", ctx("pending fingerprint"));
                        t.claim_pending += 1;
                    }
                    (
                        Some(Slot::Done {
                            fp: held,
                            record: r,
                            ..
                        }),
                        Claim::Done {
                            fingerprint: f,
                            record: got,
                        },
                    ) => {
                        prop_assert_eq!(f, fingerprint(held), "{}", ctx("done fingerprint"));
                        prop_assert_eq!(got, record(r), "{}", ctx("done record"));
                        t.claim_done += 1;
                    }
                    (want, got) => {
                        return Err(fail(&ctx(&format!(
                            "store answered {got:?}, model {want:?}"
                        ))));
                    }
                }
            }
            Op::Complete {
                key,
                tok,
                fp,
                record: r,
                ttl,
            } => {
                let idx = m.pick(key, tok);
                let (ttl_d, ttl_m) = b.span(ttl);
                let got = b
                    .store()
                    .complete(
                        &keys[key],
                        &token_of(&m, idx),
                        &fingerprint(fp),
                        record(r),
                        ttl_d,
                    )
                    .await;
                if !b.trustworthy() {
                    t.cut_short += 1;
                    return Ok(t);
                }
                let got = got.map_err(|e| fail(&ctx(&format!("store error {e}"))))?;
                let want = m.live(key).is_none() || m.holds(key, idx);
                prop_assert_eq!(got, want, "{}", ctx("complete"));
                if want {
                    m.slots.insert(
                        key,
                        Slot::Done {
                            fp,
                            record: r,
                            until: m.now + ttl_m,
                        },
                    );
                } else {
                    t.tally_refusal(&m, key, idx);
                }
            }
            Op::Release { key, tok } => {
                let idx = m.pick(key, tok);
                let got = b.store().release(&keys[key], &token_of(&m, idx)).await;
                if !b.trustworthy() {
                    t.cut_short += 1;
                    return Ok(t);
                }
                let got = got.map_err(|e| fail(&ctx(&format!("store error {e}"))))?;
                let want = m.holds(key, idx);
                prop_assert_eq!(got, want, "{}", ctx("release"));
                if want {
                    m.slots.remove(&key);
                } else {
                    t.tally_refusal(&m, key, idx);
                }
            }
            Op::Renew { key, tok, lease } => {
                let idx = m.pick(key, tok);
                let (lease_d, lease_m) = b.span(lease);
                let got = b
                    .store()
                    .renew(&keys[key], &token_of(&m, idx), lease_d)
                    .await;
                if !b.trustworthy() {
                    t.cut_short += 1;
                    return Ok(t);
                }
                let got = got.map_err(|e| fail(&ctx(&format!("store error {e}"))))?;
                let want = m.holds(key, idx);
                prop_assert_eq!(got, want, "{}", ctx("renew"));
                if want {
                    let now = m.now;
                    if let Some(Slot::Pending { until, .. }) = m.slots.get_mut(&key) {
                        *until = now + lease_m;
                    }
                } else {
                    t.tally_refusal(&m, key, idx);
                }
            }
            Op::Advance { .. } => unreachable!(),
        }
        t.ops_checked += 1;
        if expired_before {
            t.after_expiry += 1;
        }
    }
    Ok(t)
}

impl Tally {
    fn tally_refusal(&mut self, m: &Model, key: usize, idx: Option<usize>) {
        self.writes_refused += 1;
        let once_held = idx.is_some_and(|i| m.issued.get(&key).is_some_and(|v| v.contains(&i)));
        if once_held {
            self.stale_token_fenced += 1;
        }
    }
}

fn fail(msg: &str) -> TestCaseError {
    TestCaseError::fail(msg.to_owned())
}

/// Runs `cases` random cases of up to `steps` operations, each on a backend from `make`.
fn check<B: Backend>(
    rt: &tokio::runtime::Runtime,
    cases: u32,
    steps: usize,
    shrink: u32,
    make: impl Fn() -> B,
) -> Tally {
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: shrink,
        failure_persistence: None,
        ..Config::default()
    });
    let total = std::cell::Cell::new(Tally::default());
    let result = runner.run(&ops(steps), |case| {
        let mut backend = make();
        let t = rt.block_on(run_case(&mut backend, &case))?;
        let mut sum = total.get();
        sum.add(&t);
        total.set(sum);
        Ok(())
    });
    if let Err(e) = result {
        panic!("the store disagrees with the model: {e}");
    }
    total.get()
}

// ---------------------------------------------------------------------------------------------
// MemoryStore on a manual clock
// ---------------------------------------------------------------------------------------------

/// One memory-store step of model time (model time is nanoseconds of the manual clock).
const MEMORY_STEP: Duration = Duration::from_millis(100);
const NANOS_PER_MS: u64 = 1_000_000;

struct MemoryBackend {
    store: MemoryStore,
    clock: ManualClock,
    scope: [u8; 32],
}

impl Backend for MemoryBackend {
    type S = MemoryStore;
    fn store(&self) -> &MemoryStore {
        &self.store
    }
    fn key(&self, i: usize) -> StoreKey {
        // Two keys share a scope and one has its own, so both shard paths are used.
        let scope = if i == 0 { [0xAA; 32] } else { self.scope };
        StoreKey::from_parts(scope, [u8::try_from(i).unwrap(); 32])
    }
    fn span(&self, units: u8) -> (Duration, u64) {
        let d = MEMORY_STEP * u32::from(units);
        (d, u64::try_from(d.as_nanos()).unwrap())
    }
    async fn advance(&mut self, steps: u8, nudge: i8, now: u64) -> u64 {
        let base = u64::try_from((MEMORY_STEP * u32::from(steps)).as_nanos()).unwrap();
        let by = match nudge {
            -1 => base.saturating_sub(NANOS_PER_MS),
            1 => base + NANOS_PER_MS,
            _ => base,
        };
        self.clock.advance(Duration::from_nanos(by));
        now + by
    }
}

#[test]
fn memory_store_matches_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = check(&rt, 512, 40, 4096, || {
        let clock = ManualClock::new();
        MemoryBackend {
            store: MemoryStore::builder()
                .shards(4)
                .clock(clock.clone())
                .build()
                .unwrap(),
            clock,
            scope: random32(),
        }
    });
    eprintln!("model_stores memory: {t:?}");
    assert!(
        t.stale_token_fenced > 100 && t.after_expiry > 100 && t.claim_done > 100,
        "the cases exercise fencing, expiry and replays: {t:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// RedisStore on real time
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "redis")]
mod redis_model {
    use super::*;
    use redis_server::RedisServer;
    use tokio::time::Instant;
    use tower_idempotency::store::redis::RedisStore;

    /// One step of real time; leases and retentions are `n` steps plus half a step.
    pub(super) const STEP: Duration = Duration::from_millis(120);
    /// How close to the middle of a step (where deadlines fall) an operation may end.
    pub(super) const GUARD: Duration = Duration::from_millis(20);

    struct RedisBackend {
        store: RedisStore,
        keys: [StoreKey; KEYS],
        /// Real time of model time 0 (model time counts half steps).
        start: Instant,
        /// The model time of the step the current operation runs in.
        half_steps: u64,
    }

    impl Backend for RedisBackend {
        type S = RedisStore;
        fn store(&self) -> &RedisStore {
            &self.store
        }
        fn key(&self, i: usize) -> StoreKey {
            self.keys[i]
        }
        fn span(&self, units: u8) -> (Duration, u64) {
            (STEP * u32::from(units) + STEP / 2, 2 * u64::from(units) + 1)
        }
        async fn advance(&mut self, steps: u8, _nudge: i8, now: u64) -> u64 {
            self.half_steps = now + 2 * u64::from(steps);
            tokio::time::sleep_until(self.start + step_start(self.half_steps)).await;
            self.half_steps
        }
        fn trustworthy(&self) -> bool {
            // The operation began at or after its step's start (sleep_until) and must end before
            // the middle of the step, less the guard.
            Instant::now() + GUARD <= self.start + step_start(self.half_steps) + STEP / 2
        }
    }

    fn step_start(half_steps: u64) -> Duration {
        STEP * u32::try_from(half_steps / 2).unwrap()
    }

    /// Runs `cases` cases on a fresh namespace; each case uses fresh random keys.
    pub(super) fn run(cases: u32, steps: usize) {
        let Some(server) = RedisServer::shared() else {
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ns = format!("model-{}", hex(&random32()[..6]));
        let store = rt
            .block_on(
                RedisStore::builder(&ns)
                    .timeout(Duration::from_secs(2))
                    .connect(&server.url()),
            )
            .unwrap();
        // Loads the scripts, so no case pays for NOSCRIPT round trips.
        rt.block_on(async {
            let k = StoreKey::from_parts(random32(), random32());
            let _ = store.claim(&k, &fingerprint(0), STEP).await.unwrap();
            let t = Token::generate().unwrap();
            let _ = store.renew(&k, &t, STEP).await.unwrap();
            let _ = store.release(&k, &t).await.unwrap();
            let _ = store
                .complete(&k, &t, &fingerprint(0), record(0), STEP)
                .await;
        });
        let t = check(&rt, cases, steps, 64, || RedisBackend {
            store: store.clone(),
            keys: std::array::from_fn(|_| StoreKey::from_parts(random32(), random32())),
            start: Instant::now(),
            half_steps: 0,
        });
        eprintln!("model_stores redis: {t:?}");
        assert!(t.ops_checked > 0, "no operation was checked: {t:?}");
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}

// Two tests of 12 cases each, so libtest runs them side by side (they mostly sleep).
#[cfg(feature = "redis")]
#[test]
fn redis_store_matches_the_model_a() {
    redis_model::run(12, 20);
}

#[cfg(feature = "redis")]
#[test]
fn redis_store_matches_the_model_b() {
    redis_model::run(12, 20);
}
