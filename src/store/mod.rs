//! Where records live: the [`Store`] contract, and the stores that ship with the crate.
//!
//! ```
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::MemoryStore;
//!
//! let store = MemoryStore::builder().max_entries(10_000).build()?;
//! let engine = Engine::new(store); // every door takes the engine, or the store itself
//! # let _ = engine;
//! # Ok::<(), tower_idempotency::ConfigError>(())
//! ```
//!
//! | store | where | for |
//! | --- | --- | --- |
//! | [`MemoryStore`] (default) | this process, bounded | one replica, or tests |
//! | `RedisStore` (feature `redis`) | a Redis server or cluster | many replicas sharing records |
//! | `PostgresStore` (feature `postgres`) | a table in PostgreSQL | many replicas, records as durable as your data; the work and its record in one transaction ([`transactional`](crate::transactional)) |
//! | `MySqlStore` (feature `mysql`) | a table in MySQL 8 or MariaDB 10.11 | the same, on MySQL (`transactional::mysql`) |
//!
//! # The contract
//!
//! Five operations every store implements, each atomic and one round trip on a networked store:
//! three for a request, a lease renewal, and one for an operator:
//!
//! | operation | does |
//! | --- | --- |
//! | [`claim`](Store::claim) | no live record: hold the key *pending* for `lease` under a fresh token → [`Claim::Claimed`]; else the record found |
//! | [`complete`](Store::complete) | store the key *done* with the record for `retention`, only if the token still holds it (or nothing does) |
//! | [`release`](Store::release) | delete the key, only if the token holds it pending |
//! | [`renew`](Store::renew) | extend a pending lease, only if the token holds it |
//! | [`forget`](Store::forget) | delete the key's record and steps so the key can be used again; a live pending claim only when asked |
//!
//! A sixth, [`inspect`](Store::inspect), reads what holds a key for an operator, changing
//! nothing. Its default answers [`StoreErrorKind::Unsupported`]; every store of this crate
//! implements it, in one round trip.
//!
//! Three more keep the [`Steps`](crate::Steps) of a request's work, each one round trip too.
//! They have defaults: a store without steps answers [`StoreErrorKind::Unsupported`].
//!
//! | operation | does |
//! | --- | --- |
//! | [`record_step`](Store::record_step) | record one step under the key, unless it is recorded: the first record wins |
//! | [`prepare_step`](Store::prepare_step) | before a step acts: whether the token still holds the key (by default, [`renew`](Store::renew)) |
//! | [`steps`](Store::steps) | every step recorded under the key, read when a handler first runs a step |
//!
//! The rest have defaults too: [`lease_left`](Store::lease_left) for a 409's `Retry-After`,
//! [`notifies_settled`](Store::notifies_settled) and [`wait_settled`](Store::wait_settled) for
//! a repeat that waits on a run in flight, and [`name`](Store::name) for the metrics.
//!
//! The token fences a claim. Once a lease has lapsed and another claimant holds the key, the
//! first holder's late `complete` or `release` leaves the new holder alone. The store never
//! compares fingerprints. The engine does, so every store answers alike. A store sees hashes
//! and opaque bytes only: [`StoreKey`], [`Fingerprint`], [`Record`]. No raw key, principal or
//! HTTP type reaches it.
//!
//! # Your own store
//!
//! A store for another backend implements the five operations, and `inspect` for an operator. Everything the [`Store`] trait
//! names is in this module. The three for steps are optional: without them, a handler's steps
//! fail with a clear error, and nothing else changes. This one keeps records in a `HashMap`
//! behind a mutex, with expiry on the process clock. A database would use its own clock, so that every replica agrees:
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//! use std::time::{Duration, Instant};
//! use tower_idempotency::store::{
//!     Claim, Fingerprint, Forgotten, Inspected, Record, Store, StoreError, StoreKey, Token,
//! };
//!
//! enum Entry {
//!     Pending { token: Token, fingerprint: Fingerprint, until: Instant },
//!     Done { fingerprint: Fingerprint, record: Record, until: Instant },
//! }
//!
//! impl Entry {
//!     fn live(&self, now: Instant) -> bool {
//!         match self {
//!             Entry::Pending { until, .. } | Entry::Done { until, .. } => *until > now,
//!         }
//!     }
//!     fn held_by(&self, holder: &Token, now: Instant) -> bool {
//!         matches!(self, Entry::Pending { token, .. } if token == holder) && self.live(now)
//!     }
//! }
//!
//! #[derive(Default)]
//! struct HashMapStore(Mutex<HashMap<StoreKey, Entry>>);
//!
//! impl Store for HashMapStore {
//!     async fn claim(&self, key: &StoreKey, fp: &Fingerprint, lease: Duration) -> Result<Claim, StoreError> {
//!         let token = Token::generate()?; // from the OS CSPRNG, never guessable
//!         let now = Instant::now();
//!         let mut map = self.0.lock().expect("not poisoned");
//!         match map.get(key).filter(|e| e.live(now)) {
//!             Some(Entry::Pending { fingerprint, .. }) => Ok(Claim::Pending { fingerprint: *fingerprint }),
//!             Some(Entry::Done { fingerprint, record, .. }) => {
//!                 Ok(Claim::Done { fingerprint: *fingerprint, record: record.clone() })
//!             }
//!             None => {
//!                 let until = now + lease;
//!                 map.insert(*key, Entry::Pending { token: token.clone(), fingerprint: *fp, until });
//!                 Ok(Claim::Claimed(token))
//!             }
//!         }
//!     }
//!
//!     async fn complete(
//!         &self, key: &StoreKey, token: &Token, fp: &Fingerprint, record: Record, retention: Duration,
//!     ) -> Result<bool, StoreError> {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().expect("not poisoned");
//!         // Written if this token still holds the key, or if nothing live holds it.
//!         let free = map.get(key).is_none_or(|e| e.held_by(token, now) || !e.live(now));
//!         if free {
//!             map.insert(*key, Entry::Done { fingerprint: *fp, record, until: now + retention });
//!         }
//!         Ok(free)
//!     }
//!
//!     async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
//!         let mut map = self.0.lock().expect("not poisoned");
//!         let held = map.get(key).is_some_and(|e| e.held_by(token, Instant::now()));
//!         if held {
//!             map.remove(key);
//!         }
//!         Ok(held)
//!     }
//!
//!     async fn renew(&self, key: &StoreKey, token: &Token, lease: Duration) -> Result<bool, StoreError> {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().expect("not poisoned");
//!         match map.get_mut(key) {
//!             Some(Entry::Pending { token: t, until, .. }) if t == token && *until > now => {
//!                 *until = now + lease;
//!                 Ok(true)
//!             }
//!             _ => Ok(false),
//!         }
//!     }
//!
//!     async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().expect("not poisoned");
//!         let found = match map.get(key).filter(|e| e.live(now)) {
//!             None => return Ok(Forgotten::Nothing),
//!             Some(Entry::Done { .. }) => Forgotten::Record,
//!             Some(Entry::Pending { .. }) if pending => Forgotten::Pending,
//!             Some(Entry::Pending { .. }) => return Ok(Forgotten::KeptPending),
//!         };
//!         map.remove(key);
//!         Ok(found)
//!     }
//!
//!     async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
//!         let now = Instant::now();
//!         let map = self.0.lock().expect("not poisoned");
//!         Ok(match map.get(key).filter(|e| e.live(now)) {
//!             None => Inspected::Absent,
//!             Some(Entry::Pending { fingerprint, until, .. }) => {
//!                 Inspected::Pending { fingerprint: *fingerprint, lease_left: *until - now }
//!             }
//!             Some(Entry::Done { fingerprint, record, until }) => Inspected::Done {
//!                 fingerprint: *fingerprint,
//!                 record: record.clone(),
//!                 expires_in: *until - now,
//!             },
//!         })
//!     }
//! }
//!
//! // Use it like any store: every door takes it, or an engine over it.
//! let engine = tower_idempotency::engine::Engine::new(HashMapStore::default());
//! ```
//!
//! Then prove that it answers like the stores of this crate. The conformance suite, feature
//! `test-util`, expands one test per behaviour of the contract in your own test file. It
//! covers claims, fencing, expiry, concurrent claims, and replays through the engine:
//!
//! ```ignore
//! // tests/conformance.rs, with `tower-idempotency = { features = ["test-util"] }` and
//! // `tokio = { features = ["macros", "rt-multi-thread", "time"] }` as dev-dependencies.
//! use std::time::Duration;
//! use tower_idempotency::conformance::Harness;
//!
//! struct MyHarness(HashMapStore);
//!
//! impl Harness for MyHarness {
//!     type S = HashMapStore;
//!     fn store(&self) -> &HashMapStore { &self.0 }
//!     // The store's time: a real sleep for a store on a real clock.
//!     async fn advance(&self, d: Duration) { tokio::time::sleep(d).await }
//! }
//!
//! tower_idempotency::store_conformance!(async { MyHarness(HashMapStore::default()) });
//! ```

use bytes::Bytes;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub mod clock;
pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "macros")]
pub(crate) mod erased;
pub(crate) mod fingerprint;
mod key;
mod record;

pub use fingerprint::Fingerprint;
pub use key::StoreKey;
pub use record::Record;

/// The default largest recorded body: the engine's limit unless set, and what the memory store
/// sizes its largest entry by.
pub(crate) const DEFAULT_MAX_RECORD_BODY: usize = 1024 * 1024;
pub use memory::{MemoryStats, MemoryStore, MemoryStoreBuilder};

/// A backend that keeps idempotency records.
///
/// Every method is one atomic operation. A networked store should make each one round trip.
/// Futures are `Send` so the layer can run on a multi-threaded runtime.
pub trait Store: Send + Sync + 'static {
    /// Holds `key` pending for `lease` under a new token, unless a live record holds it.
    fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Stores `record` as the key's result for `retention`, if `token` still holds the key or nothing
    /// does. Returns whether the record was written. `false` means another holder has the key.
    ///
    /// A written record answers every repeat, so a store that keeps steps deletes the key's
    /// steps in the same atomic operation. A complete that is refused leaves them.
    fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes the key if `token` holds it pending. Returns whether it was deleted.
    fn release(
        &self,
        key: &StoreKey,
        token: &Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extends the pending lease of `key` to `lease` from now, if `token` holds it. Returns
    /// whether the lease was extended.
    ///
    /// A store that keeps steps also keeps the key's steps, in the same operation, until at
    /// least their retention after the new lease's end: a crash's retry comes after it.
    fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes the key's record and its steps so the key can be used again. An operator does
    /// this, never the engine on a request. A completed record is deleted. A live pending claim
    /// is deleted only when `pending` is `true`. Its work may be running: deleting it lets a
    /// retry run the work again while the first run goes on. A kept pending claim keeps its
    /// steps. Says what was found.
    fn forget(
        &self,
        key: &StoreKey,
        pending: bool,
    ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send;

    /// What holds `key` now, for an operator: nothing, a pending claim and the lease it has
    /// left, or a completed record and how long it is kept. It reads only. No claim is taken,
    /// no lease or retention changes, and a bounded store keeps its order of what it drops.
    /// An expired record or lapsed lease is [`Inspected::Absent`], as a claim would find it.
    ///
    /// The default answers [`StoreErrorKind::Unsupported`]: a store of your own implements it
    /// to let [`Engine::inspect`](crate::engine::Engine::inspect) read keys.
    fn inspect(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Inspected, StoreError>> + Send {
        let _ = key;
        std::future::ready(Err(StoreError::new(
            StoreErrorKind::Unsupported,
            "this store cannot inspect keys: it does not implement Store::inspect",
        )))
    }

    /// Records one step of the work under `key`, unless a step is already recorded there
    /// under `step`. The key's steps are then kept at least `retention` from now, and at least `retention`
    /// past the lease of a pending claim on the key; renewing the claim keeps them so, and
    /// completing the key deletes them. It is not fenced by a
    /// token: a step's side effect happened, so its record is worth keeping whoever holds the
    /// key. The first record of a step wins. A later one gets [`StepRecorded::Found`] with the
    /// first's bytes and changes nothing.
    ///
    /// The default answers [`StoreErrorKind::Unsupported`]: a store of your own keeps no steps
    /// until it implements this and [`steps`](Self::steps).
    fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<StepRecorded, StoreError>> + Send {
        let _ = (key, step, value, retention);
        std::future::ready(Err(steps_unsupported()))
    }

    /// Readies one step of the work under `key`, before the step's side effect runs. It extends
    /// the pending lease to `lease` from now if `token` still holds the key, as
    /// [`renew`](Self::renew) does, and a store with a bound makes sure it has room for the
    /// step's record. Returns whether `token` still holds the key: `false` means the lease was
    /// lost and the step must not run.
    ///
    /// The default is [`renew`](Self::renew). A bounded store overrides it to refuse, with
    /// [`StoreErrorKind::StoreFull`] or [`StoreErrorKind::ScopeFull`], a step it could not
    /// record, before the step acts.
    fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.renew(key, token, lease)
    }

    /// Every step recorded under `key` and not expired, in any order. Steps outlive a released
    /// claim and a lapsed lease; a completed key has none.
    ///
    /// The default answers [`StoreErrorKind::Unsupported`].
    fn steps(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Vec<(StepId, Bytes)>, StoreError>> + Send {
        let _ = key;
        std::future::ready(Err(steps_unsupported()))
    }

    /// How long the pending claim on `key` has left, when a live one holds it. `None` when
    /// nothing pending holds it, or the store cannot tell, as by default. The HTTP layer's
    /// `Retry-After` on 409 comes from it. It is asked only for a request found in flight, never
    /// on the way of a first run or a replay.
    fn lease_left(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        let _ = key;
        std::future::ready(Ok(None))
    }

    /// Whether [`wait_settled`](Self::wait_settled) returns as soon as the key settles, rather
    /// than after `within`. It does when the store is told in process. The default is `false`.
    /// The engine polls a store that is not, with backoff.
    fn notifies_settled(&self) -> bool {
        false
    }

    /// Waits until the pending claim on `key` may have settled, at most `within`. It has
    /// settled when completed, released, or its lease lapsed. Spurious returns are allowed:
    /// the caller claims again to see. The default sleeps `within`. A store that can be told
    /// in process, as the memory store, returns early. It says so with
    /// [`notifies_settled`](Self::notifies_settled).
    fn wait_settled(&self, key: &StoreKey, within: Duration) -> impl Future<Output = ()> + Send {
        let _ = key;
        tokio::time::sleep(within)
    }

    /// A short fixed name for the store's kind: `memory`, `redis`, `postgres`, `mysql` or `sqlite`. It is the
    /// `store` label of the operation timings, with feature `metrics`. A store of your own may name
    /// itself. Keep it one fixed word, never a host or other unbounded value.
    fn name(&self) -> &'static str {
        "custom"
    }
}

impl<S: Store> Store for Arc<S> {
    fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        (**self).claim(key, fingerprint, lease)
    }
    fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).complete(key, token, fingerprint, record, retention)
    }
    fn release(
        &self,
        key: &StoreKey,
        token: &Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).release(key, token)
    }
    fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).renew(key, token, lease)
    }
    fn forget(
        &self,
        key: &StoreKey,
        pending: bool,
    ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send {
        (**self).forget(key, pending)
    }
    fn lease_left(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        (**self).lease_left(key)
    }
    fn inspect(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Inspected, StoreError>> + Send {
        (**self).inspect(key)
    }
    fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<StepRecorded, StoreError>> + Send {
        (**self).record_step(key, step, value, retention)
    }
    fn steps(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Vec<(StepId, Bytes)>, StoreError>> + Send {
        (**self).steps(key)
    }
    fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).prepare_step(key, token, lease)
    }
    fn notifies_settled(&self) -> bool {
        (**self).notifies_settled()
    }
    fn wait_settled(&self, key: &StoreKey, within: Duration) -> impl Future<Output = ()> + Send {
        (**self).wait_settled(key, within)
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The key was free and is now held pending under this token.
    Claimed(Token),
    /// Another claimant holds the key and its work has not finished.
    Pending {
        /// The fingerprint of the request that holds the key.
        fingerprint: Fingerprint,
    },
    /// The key's work finished. This is its record.
    Done {
        /// The fingerprint of the request that completed the key.
        fingerprint: Fingerprint,
        /// The stored result.
        record: Record,
    },
}

/// What [`Store::forget`] found under a key, and whether it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Forgotten {
    /// No live record held the key: nothing to forget.
    Nothing,
    /// A completed record was deleted: the key runs its work again on the next request.
    Record,
    /// A pending claim was deleted, as asked for explicitly. The next request runs the work. The
    /// first run, if it still goes on, has lost its claim. Its record is written if nothing holds
    /// the key when it completes, as after a lapsed lease. That is when no request claimed it
    /// meanwhile. While another claim or record holds the key, it records nothing.
    Pending,
    /// A pending claim holds the key and was kept. Deleting it was not asked for.
    KeptPending,
}

/// What [`Store::inspect`] found under a key. The engine reads it as a
/// [`KeyState`](crate::engine::KeyState).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inspected {
    /// No live record holds the key: the next claim takes it. A lapsed lease or an expired
    /// record reads so.
    Absent,
    /// A pending claim holds the key: its work may be running.
    Pending {
        /// The fingerprint of the request that holds the key.
        fingerprint: Fingerprint,
        /// How long the lease has left, by the store's clock.
        lease_left: Duration,
    },
    /// The key's work finished and this is its record.
    Done {
        /// The fingerprint of the request that completed the key.
        fingerprint: Fingerprint,
        /// The stored result.
        record: Record,
        /// How long the record is kept from now, by the store's clock.
        expires_in: Duration,
    },
}

impl Inspected {
    /// What a claim's answer `found` says, with `left` the time its record or lease has left:
    /// for a store that reads a key as its claim does.
    #[cfg(any(
        feature = "redis",
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite"
    ))]
    pub(crate) fn of(found: Claim, left: Duration) -> Result<Self, StoreError> {
        match found {
            Claim::Pending { fingerprint } => Ok(Self::Pending {
                fingerprint,
                lease_left: left,
            }),
            Claim::Done {
                fingerprint,
                record,
            } => Ok(Self::Done {
                fingerprint,
                record,
                expires_in: left,
            }),
            Claim::Claimed(_) => Err(StoreError::new(
                StoreErrorKind::Protocol,
                "an inspection found a claim of its own",
            )),
        }
    }
}

/// Where one step of a request's work is recorded under its key: 32 bytes the engine derives
/// from the request's fingerprint and the step's place in the work. A store keeps it as an
/// opaque field name.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepId([u8; 32]);

impl StepId {
    /// A step id from bytes a store kept.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The id's 32 bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StepId({}…)", &crate::hex::encode(&self.0)[..12])
    }
}

/// What [`Store::record_step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepRecorded {
    /// The step is now recorded with the bytes given.
    Recorded,
    /// The step was recorded before, by an overlapping run. These are its bytes; they were
    /// kept, not overwritten.
    Found(Bytes),
}

fn steps_unsupported() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unsupported,
        "this store keeps no steps: it does not implement Store::record_step and Store::steps",
    )
}

/// An unguessable token that fences one claim: 16 bytes from the OS CSPRNG.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token([u8; 16]);

impl Token {
    /// A fresh token from the operating system's CSPRNG.
    ///
    /// Tokens are drawn from the OS in batches of 64 per thread: one system call instead of 64.
    /// Every byte still comes from the OS source, and each one is handed out once.
    ///
    /// # Errors
    /// When the OS random source fails. Nothing may be claimed then.
    pub fn generate() -> Result<Self, StoreError> {
        const BATCH: usize = 64;
        thread_local! {
            static POOL: std::cell::RefCell<([u8; 16 * BATCH], usize)> =
                const { std::cell::RefCell::new(([0; 16 * BATCH], BATCH)) };
        }
        POOL.with_borrow_mut(|(buf, next)| {
            if *next == BATCH {
                getrandom::fill(buf).map_err(|e| {
                    StoreError::with_source(
                        StoreErrorKind::Unavailable,
                        "OS random source failed",
                        e,
                    )
                })?;
                *next = 0;
            }
            let mut b = [0u8; 16];
            let slot = &mut buf[*next * 16..(*next + 1) * 16];
            b.copy_from_slice(slot);
            // Used bytes are wiped so a token never stays behind in the pool.
            slot.fill(0);
            *next += 1;
            Ok(Self(b))
        })
    }

    /// A token from bytes a store kept.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The token's 16 bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// A store operation that failed. The layer answers a failed claim with 503, or 429 for a full
/// scope. It never runs the work on an unclear answer.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: &'static str,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl StoreError {
    /// An error of `kind` with a short message.
    #[must_use]
    pub fn new(kind: StoreErrorKind, message: &'static str) -> Self {
        Self {
            kind,
            message,
            source: None,
        }
    }

    /// An error of `kind` caused by `source`.
    #[must_use]
    pub fn with_source(
        kind: StoreErrorKind,
        message: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            kind,
            message,
            source: Some(source.into()),
        }
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.store_unavailable`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// Whether the same operation may succeed when tried again later. Every kind but
    /// [`Protocol`](StoreErrorKind::Protocol) and [`Unsupported`](StoreErrorKind::Unsupported)
    /// is: the backend was away, slow, full or busy. An answer the store does not understand is
    /// likely to come back the same.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.kind,
            StoreErrorKind::Protocol | StoreErrorKind::Unsupported
        )
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency store {}: {}", self.kind, self.message)
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The kinds of store failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached or refused the operation.
    Unavailable,
    /// The operation did not finish within its time limit.
    Timeout,
    /// The backend answered something the store does not understand.
    Protocol,
    /// The store is full and holds nothing it may drop. It is answered 503.
    StoreFull,
    /// The caller's scope is at its cap and all its records are pending. It is answered 429.
    ScopeFull,
    /// The backend rolled the operation back for a concurrent transaction, each time it was tried. In
    /// PostgreSQL this is a serialization failure or a deadlock. Nothing was applied, and the
    /// operation may succeed when tried again. It is not an outage.
    Conflict,
    /// The write was applied on the primary, but fewer replicas than asked acknowledged it in
    /// time (Redis `WAIT`). The record may still reach them; a failover before it does would
    /// lose it. Not an outage of the primary.
    NotReplicated,
    /// The store does not do what was asked: a store of your own that keeps no steps.
    Unsupported,
}

impl StoreErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.store_unavailable`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Unavailable => "idempotency.store_unavailable",
            Self::Timeout => "idempotency.store_timeout",
            Self::Protocol => "idempotency.store_protocol",
            Self::StoreFull => "idempotency.store_full",
            Self::ScopeFull => "idempotency.scope_full",
            Self::Conflict => "idempotency.store_conflict",
            Self::NotReplicated => "idempotency.store_not_replicated",
            Self::Unsupported => "idempotency.store_unsupported",
        }
    }
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol error",
            Self::StoreFull => "full",
            Self::ScopeFull => "scope full",
            Self::Conflict => "conflict",
            Self::NotReplicated => "not replicated",
            Self::Unsupported => "unsupported",
        })
    }
}

#[cfg(test)]
mod token_tests {
    use super::Token;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_unique_across_batches_and_threads() {
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(*Token::generate().unwrap().as_bytes()));
        }
        let other: Vec<_> = std::thread::spawn(|| {
            (0..200)
                .map(|_| *Token::generate().unwrap().as_bytes())
                .collect()
        })
        .join()
        .unwrap();
        for t in other {
            assert!(seen.insert(t), "a token repeated across threads");
        }
        assert!(!seen.contains(&[0u8; 16]));
    }
}
