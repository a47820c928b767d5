//! A Redis store, shared by every replica of a service: standalone Redis, Redis Sentinel or
//! Redis Cluster.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("orders")
//!     .timeout(Duration::from_millis(500))
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//! let report = store.verify().await?; // version floor, eviction policy (warns when risky)
//! println!("{report:?}");
//! let engine = Engine::new(store);
//! # let _ = engine; Ok(()) }
//! ```
//!
//! When a service runs as more than one process, a retry may land on another replica than the
//! first attempt; the [`MemoryStore`](super::MemoryStore) of that replica has never seen the
//! key and would run the work again. [`RedisStore`] keeps the records in Redis, where every
//! replica finds them.
//!
//! # Settings
//!
//! [`RedisStore::builder`] makes a [`RedisStoreBuilder`]: the operation timeout, native or
//! scripted claims, pipelining, the replicas a complete waits for and the way to replace a
//! silent connection are set there and fixed when the store is built. [`RedisStore::connect`] and [`RedisStore::new`] are
//! shortcuts with the defaults. Clones of a store share its connection and what it learned
//! about the server (that it refuses `SET … NX … GET`), never a setting.
//!
//! # One round trip per step
//!
//! Each step of the [`Store`] contract is one command. The claim is Redis's own
//! `SET key pending NX PX lease GET` (Redis 7.0 and newer): it writes the pending value only
//! when the key is absent and answers what the key held, atomically, with no script. The other
//! steps must check the fencing token before they write, so each is a Lua script, sent as one
//! `EVALSHA` (loaded with `SCRIPT LOAD` the first time a server answers `NOSCRIPT`), which runs
//! atomically on the server:
//!
//! | step | command |
//! | --- | --- |
//! | claim | `SET key pending NX PX lease GET`: nil → claimed; a value → that record, unchanged |
//! | complete | script: write the done value with `PX retention` only if the key is absent or pending under the caller's token, and then `DEL` the key's [steps](#steps) |
//! | release | script: `DEL` only if the key is pending under the caller's token |
//! | renew | script: `PEXPIRE lease` only if the key is pending under the caller's token, and keep the key's [steps](#steps) their retention past it |
//!
//! A first execution therefore costs two commands (claim, complete); a replay, an in-flight
//! answer and a key-reuse answer cost one, a single native command. A native command costs the
//! server much less than a script call, which is why the claim, the step every request makes,
//! is not a script. The steps of a request's work cost one script call each (see
//! [Steps](#steps)).
//!
//! A server older than 7.0 refuses `SET … NX … GET` with a syntax error, which executes
//! nothing; the store then sends the claim as a script (`GET`, and `SET NX PX` when absent) from
//! that call on, and logs it once at `info` ([`RedisStore::verify`] on such a server makes
//! that choice before the first claim). [`RedisStoreBuilder::native_claim`] chooses the
//! script from the start (for a proxy in front of Redis that rejects the syntax some other
//! way). The token is made by the client from the operating system's CSPRNG
//! ([`Token::generate`]), never by the server.
//!
//! # Pipelining
//!
//! A busy server has many requests in flight at once, each waiting on its own Redis command.
//! Written one by one, every command costs a `write` on the client and a `read` and a `write`
//! on the server; on loopback that system-call and TCP work, not Redis's own, is most of what
//! a command costs. The store made by [`RedisStore::connect`] therefore queues the commands of
//! concurrent requests and writes them as one pipeline: the first command queued spawns a
//! small task that yields once to the runtime (so the other tasks that are ready run and queue
//! theirs), then sends everything queued in one write and hands each caller its own answer.
//! Batches do not wait for each other; a lone request costs one extra task wake-up.
//!
//! Nothing about the guarantees changes: each command is still atomic on the server and
//! answered on its own (a `NOSCRIPT` or `OOM` error reaches only the caller whose command
//! met it), and each caller's operation timeout runs from the moment its command is queued.
//! [`RedisStoreBuilder::pipelining`] turns it on or off; it is off for stores built over a
//! connection ([`RedisStore::new`], [`RedisStoreBuilder::build`]) and for Redis Cluster, whose
//! connection cannot take one pipeline of keys in many slots.
//!
//! Expiry belongs to the server (`PX`, `PEXPIRE`): a pending key lapses with its lease, a done
//! key with its retention, and no sweeper runs anywhere.
//!
//! # Keys and values
//!
//! A record is one Redis string, keyed `ti:<ns>:{<id>}`. `<ns>` is the first 16 hex digits of
//! a domain-separated SHA-256 of the store's prefix; the prefix itself is never stored. `<id>`
//! is the hex [`StoreKey::id`], already a hash of the door's namespace, scope and client key. The id sits inside a
//! hash tag, so each record is its own cluster slot and one busy caller's keys spread over the
//! whole cluster. The value is compact binary:
//!
//! ```text
//! pending: 'P' fingerprint:32 token:16
//! done:    'D' fingerprint:32 record            (the engine's encoded record, bytes as bytes)
//! ```
//!
//! Anything else found under a key fails the request as a
//! [`Protocol`](crate::store::StoreErrorKind::Protocol) error: the work never runs on an
//! unclear answer.
//!
//! # Steps
//!
//! The steps of a request's work ([`Steps`](crate::engine::Steps)) live beside its record,
//! in one Redis hash keyed `ti:<ns>:{<id>}:s`: the record's key and `:s`. The hash tag is the
//! record's, so the scripts of complete, renew and forget reach both in one call. A field is
//! a step's 32-byte [`StepId`], its value the engine's bytes for the step. One more field,
//! `r`, holds the longest retention (`retention`) the key's steps were recorded with. Each call is
//! one script:
//!
//! | call | commands |
//! | --- | --- |
//! | record_step | `HSETNX`; when found, `HGET` (the first record wins); when recorded, `HGET` and `HSET` of `r`, `GET` and `PTTL` of the record, `PTTL` and `PEXPIRE` of the hash |
//! | steps | `HGETALL`, without `r` |
//! | complete | `DEL` of the hash, in the record's script, when the record is written |
//! | renew | `HGET` of `r`, `PTTL` and `PEXPIRE` of the hash, in the record's script, when the lease is extended |
//! | forget | `DEL` of the hash with the record, unless a pending claim is kept |
//!
//! What is kept, and for how long:
//!
//! - **While a claim holds the key**, the hash expires no sooner than its retention after
//!   the end of the lease: each step recorded, and each renewal (the engine's, every third of
//!   the lease, and the one before each step), moves its expiry on, never back. A retention
//!   shorter than the lease, or a long gap between two steps, cannot lose a step that the
//!   retry after a crash needs.
//! - **A released key, or a lapsed lease**, keeps the hash as it was: at least the retention
//!   after the last step recorded and after the lease's end. The next claimant reads it.
//! - **A completed key** keeps no steps: the complete that writes the record deletes the
//!   hash in the same script, since the record answers every repeat. A complete that is
//!   refused (another claim holds the key) leaves the hash to that claim.
//!
//! `steps` is a script, not the bare `HGETALL`, so
//! that it runs on the primary: a connection set to read from replicas, or with a client-side
//! cache, may answer a read-only command from there, and a step missed that way would run its
//! side effect again. A request that uses steps reads them once, when its first step runs, and
//! records each step that succeeds; a request that uses none sends neither. With
//! [`RedisStoreBuilder::wait_for_replicas`], each recorded step waits for the replicas as a
//! complete does.
//!
//! Measured on Redis 7.0, key, expiry and `r` included: a key's steps cost about 200 bytes, and
//! each step its value and about 45 bytes, while every value is at most 64 bytes (a
//! listpack). Once one is longer the hash becomes a hash table: about 300 bytes, and about 90
//! a step. An engine with a [`Secret`](crate::Secret) adds a 32-byte tag to each value.
//!
//! # Server requirements
//!
//! Redis **5.0** or newer; [`RedisStore::verify`] checks it, and 7.0 or newer for the native
//! claim (older servers get the claim script, above). The scripts use only `GET`,
//! `SET … NX PX`, `DEL`, `PEXPIRE`, `PTTL`, `HSETNX`, `HSET`, `HGET` and `HGETALL` (all older than
//! 3.0), but 5.0 is the first version that replicates a script by its effects by default:
//! replicas and the AOF receive the writes the script made, rather than re-running the script
//! against their own copy of the data and clock. Redis Cluster (hash tags) and Valkey work alike.
//!
//! # Failures
//!
//! Every step is bounded by one operation timeout (1 s by default; see
//! [`RedisStoreBuilder::timeout`]), however many round trips it takes: a script the server
//! answered `NOSCRIPT` for is loaded and sent again, and a native claim the server refused is
//! sent as the script, all before the same deadline. Errors keep the Redis error as their
//! source and map to:
//!
//! | Redis error | [`StoreErrorKind`] |
//! | --- | --- |
//! | the operation timeout, or an I/O timeout | `Timeout` |
//! | connection refused, reset or dropped; cluster down, moved, read-only, loading; refused by the server (OOM, ACL) | `Unavailable` |
//! | an answer that does not parse, an unexpected type, a script error | `Protocol` |
//!
//! A claim that fails answers 503 and the work does not run. A step that timed out may still
//! have been applied by the server: a claim may leave the key pending until its lease lapses
//! (a retry gets 409 until then), a complete may have stored the record.
//!
//! The connection made by [`RedisStore::connect`] is a
//! [`ConnectionManager`]: when Redis goes away, calls fail fast, and the first call after Redis
//! is back reconnects; the application needs no restart.
//!
//! A connection can also go silent without ever failing: a half-open TCP connection, when the
//! peer or a NAT, firewall or load balancer on the way lost its state and no reset arrives.
//! The kernel keeps the socket open (for a vanished peer, Linux gives up after its
//! retransmission timeout, about 15 minutes), and the `ConnectionManager` reconnects only on a
//! connection *error*, never on a timeout, so every call would time out until then. The store
//! made by [`RedisStore::connect`] therefore counts consecutive operation timeouts on its
//! connection. After 2 in a row it makes a fresh `ConnectionManager` from the same URL and
//! settings, in the background, bounded by 5 s. The calls after it use the new connection
//! (logged at `warn`). Any successful call resets the count. One replacement is made at a
//! time. A replacement that fails keeps the old connection, and is tried again after the next
//! run of timeouts.
//! Calls already in flight finish on the connection they started on, which closes once the
//! last of them is done. Measured in `tests/faults/proxy.rs`: with the default 1 s operation
//! timeout, a store whose connection went half-open answers again 2–3 s later (two or three
//! 503s: the two timeouts that start the replacement, and at times a call that began on the
//! old connection while the new one was being made). A Redis that is merely slow (a long script, a latency spike) also
//! gets its connection replaced; that costs one new connection per run of timeouts, nothing
//! more. A store made by `connect_cluster` does the same with a new `ClusterConnection` from
//! the same nodes: the cluster client reconnects a node after a connection error, never after
//! a timeout. A store built over a connection ([`RedisStore::new`],
//! [`RedisStoreBuilder::build`]) keeps its connection as given, unless it is handed a way to
//! make another with [`RedisStoreBuilder::reconnect`].
//!
//! # Sentinel
//!
//! With the `redis-sentinel` feature, [`RedisStoreBuilder::connect_sentinel`] asks the
//! sentinels which server is the primary of a service and connects to it. When the primary
//! dies, the sentinels promote a replica. The store notices from its own steps: one that
//! finds the connection refused or dropped, or gets `READONLY` from a demoted primary, or 2 in
//! a row that time out. It then asks the sentinels again, in the background, and connects to
//! the primary they name. A connection that lost its primary is never used again: it would
//! reconnect to the old address, where the old primary, restarted, answers as a primary until
//! the sentinels demote it. A complete or a recorded step that was refused on the lost
//! connection, never sent, or answered `READONLY` (nothing applied) is sent again once on the
//! connection that replaces it, within its operation timeout: a complete is fenced by its
//! token, and a step's first record wins, so sending either again is safe. Until they name one
//! that answers as primary, operations fail at once (`Unavailable` or `Timeout`: claims answer 503,
//! nothing runs), and each failure asks again. The operation timeout and the replacement of a
//! silent connection hold as above.
//!
//! An old primary may also go on answering as a primary after the sentinels promoted another:
//! cut off from them, or not reconfigured yet. Nothing sent there fails, so the operations never
//! tell the store to look again: it would keep writing where the stores that moved no longer
//! read, and a key would run on both sides. So the
//! store also asks the sentinels every second (a fixed interval) which primary they name
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`, the first sentinel that answers, in the order given).
//! When it is not the one the connection was made for, the store connects to the primary they
//! name, as above, and puts that connection in place; the writes that wait for replicas move
//! to a new connection with it. Steps sent before then still go to the old primary: about a
//! second of them, after the sentinels agree. The asking runs in a task of the store's own,
//! which ends within a second of the last clone of the store being dropped. A store given
//! [`RedisStoreBuilder::reconnect`] makes its own connections and is not followed this way.
//!
//! Measured on loopback with `down-after-milliseconds 500` and `failover-timeout 2000`: a
//! store whose primary was killed (`kill -9`) serves again about 1.7 s later
//! (`tests/store/redis_sentinel.rs`). Under a duplicate storm of 8 clients on two application
//! processes, requests succeeded again 1.3 to 2.4 s after the kill (`tests/faults/failover.rs`).
//! Sentinel's own settings decide most of that time.
//!
//! A failover loses the writes the replica had not received (see
//! [Durability](#durability-what-no-duplicate-processing-rests-on)).
//! [`RedisStoreBuilder::wait_for_replicas`] closes that gap for completed records.
//!
//! # Bounds
//!
//!
//! Nothing bounds what one caller keeps in Redis. The [`MemoryStore`](super::MemoryStore)
//! caps each scope and drops the records of the scope that holds the most; a `RedisStore`
//! has no per-scope count, only Redis's `maxmemory` for everyone together, and each record
//! lives until its retention ends (the engine's retention, 24 h by default) whoever wrote it. A
//! flood of fresh keys from one principal therefore:
//!
//! - under `noeviction` (the recommended policy), fills Redis until writes fail with `OOM`:
//!   every caller's claim then answers 503 and nothing runs (Redis refuses the native
//!   `SET … NX GET` before reading, so even a request that would replay gets 503; the claim
//!   script still replays), completes of work in flight fail (the caller still gets the
//!   handler's response; the key stays pending until its lease ends), and this lasts until
//!   enough of the flood's records expire;
//! - under an eviction policy, makes Redis evict other callers' records, and their next
//!   repeats **run again**.
//!
//! Bound it in front of the layer: rate-limit per principal (at the gateway, or a limiter
//! keyed on the same principal before the idempotency layer), so one caller cannot write more
//! than its rate times the retention. Size `maxmemory` for the sum of the callers' rates
//! times the retention times a record's size (about 270 bytes for a pending key on Redis 7.0,
//! key and expiry included; a done record adds the stored response, up to the record body
//! limit; a request's [steps](#steps) add their own), keep the retention as short as clients
//! retry, and use the HTTP layer's `status` response mode where bodies are large.
//!
//! The store offers no per-scope cap of its own because none fits the one-round-trip design.
//! The claim and its count would have to change together, atomically: one script touching the
//! record and a counter of the scope, so both keys in one hash slot. That slot would be the
//! scope's, putting all of one caller's keys on one node, the hot slot the key layout avoids
//! by hashing the whole key. The claim would become a script, losing the native one-command
//! `SET … NX GET`. And the count would drift: a pending key that expires with its lease runs
//! no code on the server, so nothing would decrement it. A count kept by each process does
//! not bound a caller whose requests spread over several replicas.
//!
//! # Durability: what "no duplicate processing" rests on
//!
//! The promise holds only while Redis keeps the records. Two ordinary events make Redis lose
//! a record it already acknowledged, and then the next repeat **runs the work again**:
//!
//! - **Eviction.** With a `maxmemory-policy` other than `noeviction`, a full Redis deletes keys
//!   to make room, idempotency records included. Use `noeviction` (writes then fail, claims
//!   answer 503, and nothing is run twice); [`RedisStore::verify`] warns otherwise.
//! - **Failover.** Redis replicates asynchronously. When a primary fails and a replica is
//!   promoted, the writes the replica had not yet received are gone: a record completed a
//!   moment before the failure may not exist on the new primary. The same holds after a
//!   restart of a server without persistence.
//!
//! [`RedisStoreBuilder::wait_for_replicas`] makes each complete wait until `n` replicas hold
//! the record (`WAIT`, in the same round trip as the write), and each recorded step likewise.
//! An acknowledged record then survives the promotion of any of those replicas. It costs one
//! replica round trip per fresh request; a complete the replicas do not acknowledge in time
//! fails with [`NotReplicated`](crate::store::StoreErrorKind::NotReplicated), and the caller
//! still gets the handler's response; the record is on the primary, and repeats replay it
//! unless a failover loses it first. Claims are not waited for: a claim lost in a failover
//! lets a repeat that arrives during the first run run too. The writes that wait go on a
//! connection of their own, so a `WAIT` never holds the claims behind it, and a primary with
//! fewer replicas in sync than asked is answered `NotReplicated` at once.
//!
//! Measured in `tests/faults/failover.rs` (`failover_storm_figures`): 300 keys sent three
//! times each by 8 clients on two stores, the primary killed, the old primary restarted, every
//! key sent once more at the end. With the replica 300 ms behind (a partition) when the
//! primary is killed and the option off, 193 and 195 acknowledged records were lost (two
//! runs) and their keys ran again. With `wait_for_replicas(1, 50 ms)`, none (asserted, also in
//! CI): 11 and 15 keys ran again after a 2xx, each after a complete that failed and was never
//! acknowledged (asserted: no more than without the option). With the
//! replica in step, no key ran again, option off or on. The option needs `n + 1` replicas to
//! keep acknowledging through a failover: with one replica, every complete after the
//! promotion failed `NotReplicated` (at once, without waiting) until the old primary had
//! rejoined and synced. With 32 callers at once the option cost 14–38 µs per first run (about
//! 180 µs without it), and a lone caller one replica round trip (`wait_for_replicas_cost` in
//! `tests/store/redis_replicas.rs`).
//!
//! Keep the retention at least as long as clients retry.
//!
//! [`ConnectionManager`]: ::redis::aio::ConnectionManager
//! [`StoreErrorKind`]: crate::store::StoreErrorKind

use super::{Claim, Forgotten, Inspected, StepId, StepRecorded, Store, StoreError, Token};
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreKey;
use ::redis::aio::ConnectionLike;
use bytes::Bytes;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

mod builder;
mod codec;
mod connection;
mod error;
#[cfg(feature = "redis-sentinel")]
mod follow;
mod pipeline;
mod replicated;
mod scripts;
mod verify;

use self::codec::{Arg, ClaimReply, Digits, KeyBytes, StepsKeyBytes};
use self::connection::{Inner, Reconnect};
use self::error::OpError;

pub use self::builder::RedisStoreBuilder;
pub use self::verify::{EvictionCheck, VerifyReport};
/// The `redis` crate this store is built on, for building connections of your own.
pub use ::redis;

/// The oldest Redis server the store works with (see the [module docs](self)).
pub(crate) const MIN_REDIS_VERSION: (u32, u32, u32) = (5, 0, 0);

/// The first Redis version whose `SET` takes `NX` and `GET` together: claims are then one
/// native command.
pub(crate) const NATIVE_CLAIM_VERSION: (u32, u32, u32) = (7, 0, 0);

/// The default bound on one store operation.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Consecutive operation timeouts after which a store that can reconnect (made by
/// [`RedisStore::connect`] or `connect_cluster`, or given [`RedisStoreBuilder::reconnect`])
/// replaces its connection. See the [module docs](self#failures).
pub(crate) const RECONNECT_AFTER_TIMEOUTS: u32 = 2;

/// The bound on making a connection: the first one in [`RedisStore::connect`], and each
/// replacement after a run of timeouts.
pub(crate) const RECONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An idempotency [`Store`] in Redis or Redis Cluster, generic over the connection.
///
/// `C` is any `redis` async connection that is cheap to clone: the default
/// [`ConnectionManager`](::redis::aio::ConnectionManager) (reconnects by itself), a
/// `MultiplexedConnection`, or, with the `redis-cluster` feature, a
/// `cluster_async::ClusterConnection`. Clones of the store share one connection, and its
/// replacement when the store replaces it after a run of timeouts (see the
/// [module docs](self#failures)).
///
/// Made by [`RedisStore::builder`], or by the shortcuts [`RedisStore::connect`] and
/// [`RedisStore::new`] with the default settings. See the [module docs](self) for the key
/// layout, the scripts, the version floor and the durability caveats.
pub struct RedisStore<C = ::redis::aio::ConnectionManager> {
    inner: Arc<Inner<C>>,
    prefix: Arc<str>,
    // Settings, fixed when the store is built.
    timeout: Duration,
    native_claim: bool,
    pipelining: bool,
    /// Makes a replacement connection; `None`: the connection is kept as given.
    reconnect: Option<Reconnect<C>>,
    /// The replacement asks Sentinel for the primary, and a lost primary starts one.
    follow_primary: bool,
    /// `WAIT` after each complete and recorded step: how many replicas, and for how long at
    /// most.
    replicas: Option<WaitReplicas>,
}

/// The `WAIT` a complete is followed by (see [`RedisStoreBuilder::wait_for_replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    count: usize,
    timeout: Duration,
}

impl<C> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            prefix: Arc::clone(&self.prefix),
            timeout: self.timeout,
            native_claim: self.native_claim,
            pipelining: self.pipelining,
            reconnect: self.reconnect.clone(),
            follow_primary: self.follow_primary,
            replicas: self.replicas,
        }
    }
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("native_claim", &self.native_claim)
            .field("pipelining", &self.pipelining)
            .field("reconnects", &self.reconnect.is_some())
            .field("sentinel", &self.follow_primary)
            .field("wait_for_replicas", &self.wait_for_replicas())
            .finish_non_exhaustive()
    }
}

impl<C> RedisStore<C> {
    /// A builder for a store keeping its records under `prefix`. Set the operation timeout,
    /// native or scripted claims, pipelining or the replacement of a silent connection. Then
    /// connect, or build over a connection.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder("orders")
    ///     .timeout(Duration::from_millis(250))
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder(prefix: &str) -> RedisStoreBuilder<C> {
        RedisStoreBuilder::new(prefix)
    }

    /// Whether commands are pipelined (see [`RedisStoreBuilder::pipelining`]).
    #[must_use]
    pub fn pipelining(&self) -> bool {
        self.pipelining
    }

    /// Whether claims are sent as the native `SET … NX PX … GET` (see
    /// [`RedisStoreBuilder::native_claim`]); `false` also once the server refused it, or
    /// [`verify`](Self::verify) found a server older than 7.0.
    #[must_use]
    pub fn native_claim(&self) -> bool {
        self.native_claim && !self.inner.native_claim_unsupported.load(Ordering::Relaxed)
    }

    /// The replicas each complete and recorded step waits for, and the longest wait (see
    /// [`RedisStoreBuilder::wait_for_replicas`]); `None` when they do not wait.
    #[must_use]
    pub fn wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.replicas.map(|w| (w.count, w.timeout))
    }

    /// The operation timeout (see [`RedisStoreBuilder::timeout`]).
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The start of every key this store writes: `ti:` and 16 hex digits of the hashed store
    /// prefix. For operators looking at Redis: a record's key is
    /// `<prefix>:{<StoreKey::id_hex>}` (see the [module docs](self#keys-and-values)).
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of `key`, on the stack.
    fn key_bytes(&self, key: &StoreKey) -> KeyBytes {
        KeyBytes::new(&self.prefix, key)
    }
}

impl RedisStore<::redis::aio::ConnectionManager> {
    /// Connects to the Redis at `url` with the default settings. A shortcut for
    /// `RedisStore::builder(prefix).connect(url)`; see [`RedisStoreBuilder::connect`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`](crate::ConfigError)),
    /// the URL is invalid or the server cannot be reached. `Timeout` when connecting takes
    /// longer than 5 s.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::builder(prefix).connect(url).await
    }
}

#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
impl RedisStore<::redis::aio::ConnectionManager> {
    /// Connects to the primary the Redis Sentinels at `sentinels` name for `service_name`,
    /// with the default settings, and follows it across a failover. A shortcut for
    /// `RedisStore::builder(prefix).connect_sentinel(sentinels, service_name, None)`; see
    /// [`RedisStoreBuilder::connect_sentinel`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`](crate::ConfigError)),
    /// a sentinel URL is invalid, or no sentinel names a primary that answers as one.
    /// `Timeout` when connecting takes longer than 5 s.
    pub async fn connect_sentinel<I, T>(
        sentinels: I,
        service_name: &str,
        prefix: &str,
    ) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        Self::builder(prefix)
            .connect_sentinel(sentinels, service_name, None)
            .await
    }
}

#[cfg(feature = "redis-cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
impl RedisStore<::redis::cluster_async::ClusterConnection> {
    /// Connects to a Redis Cluster through any of its `nodes` with the default settings. A
    /// shortcut for `RedisStore::builder(prefix).connect_cluster(nodes)`; see
    /// [`RedisStoreBuilder::connect_cluster`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`](crate::ConfigError)),
    /// a node URL is invalid or no node can be reached. `Timeout` when connecting takes longer
    /// than 5 s.
    pub async fn connect_cluster<I, T>(nodes: I, prefix: &str) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        Self::builder(prefix).connect_cluster(nodes).await
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over an existing connection with the default settings, keeping records under
    /// `prefix`. A shortcut for `RedisStore::builder(prefix).build(conn)`; see
    /// [`RedisStoreBuilder::build`]. Pipelining is off.
    ///
    /// ```no_run
    /// use tower_idempotency::store::redis::{RedisStore, redis};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let store = RedisStore::new(conn, "orders")?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`](crate::ConfigError) when `prefix` is empty.
    pub fn new(conn: C, prefix: &str) -> Result<Self, crate::ConfigError> {
        Self::builder(prefix).build(conn)
    }

    /// A writing script and `WAIT`, in one round trip: the script's reply and the number of
    /// replicas that acknowledged. Sent on the connection of replicated writes when the store
    /// can make one (see `replicated`), else on the shared connection. A `NOSCRIPT` loads the
    /// script and sends both again; a write that was not sent (a lost primary, a demoted one)
    /// is sent again once on the next connection. All by the operation's `deadline`.
    async fn eval_replicated(
        &self,
        script: &::redis::Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        replicas: WaitReplicas,
        deadline: Instant,
    ) -> Result<(::redis::Value, ::redis::Value), OpError> {
        let (mut loaded, mut resent) = (false, false);
        loop {
            let generation = self.inner.generation();
            let cmd = scripts::evalsha(script, keys, args);
            let Some(answer) = self.send_replicated(cmd, replicas, deadline).await else {
                return self
                    .eval_replicated_shared(script, keys, args, replicas, deadline)
                    .await;
            };
            let e = match answer {
                Ok((written, acknowledged)) => match written.extract_error() {
                    Ok(written) => return Ok((written, acknowledged)),
                    Err(e) => OpError::Redis(e),
                },
                Err(e) => e,
            };
            if e.is_no_script() && !loaded {
                // The server lost its scripts (a restart, a failover to a replica that never
                // ran this one): load it, then send the write and its `WAIT` again.
                loaded = true;
                let (generation, mut conn) = self.inner.checkout();
                self.bounded(generation, deadline, script.load_async(&mut conn))
                    .await?;
                continue;
            }
            if e.is_unsent() && !resent && self.inner.replaced_since(generation, deadline).await {
                resent = true;
                continue;
            }
            return Err(e);
        }
    }

    /// [`eval_replicated`](Self::eval_replicated) on the shared connection, for a store that
    /// cannot make a connection of its own: the `WAIT` holds it while it waits.
    async fn eval_replicated_shared(
        &self,
        script: &::redis::Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        replicas: WaitReplicas,
        deadline: Instant,
    ) -> Result<(::redis::Value, ::redis::Value), OpError> {
        let wait = || {
            // Within three quarters of the time left, so that too few replicas fail the step
            // as `NotReplicated`, not `Timeout`; never 0 (`WAIT … 0` blocks for ever).
            let left = deadline.saturating_duration_since(Instant::now());
            connection::WaitArgs {
                replicas: replicas.count,
                ms: codec::millis(replicas.timeout.min(left * 3 / 4)).max(1),
            }
        };
        let cmd = scripts::evalsha(script, keys, args);
        let first = wait();
        let [written, acknowledged] = self
            .query_all([cmd, pipeline::wait_cmd(first)], Some(first), deadline)
            .await?;
        match written.extract_error() {
            Ok(written) => Ok((written, acknowledged.extract_error()?)),
            Err(e) => {
                let e = OpError::Redis(e);
                if !e.is_no_script() {
                    return Err(e);
                }
                let written = self.eval(script, keys, args, deadline).await?;
                let acknowledged = self.query(pipeline::wait_cmd(wait()), deadline).await?;
                Ok((written, acknowledged))
            }
        }
    }

    /// [`eval`](Self::eval) of a script that is safe to send twice (it checks the claim's
    /// token, or writes only what is absent): a script that was not sent (its connection lost
    /// its primary, or a demoted primary refused it) is sent again once, on the connection
    /// that replaces it, by the same `deadline`.
    async fn eval_resent(
        &self,
        script: &::redis::Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        deadline: Instant,
    ) -> Result<::redis::Value, OpError> {
        let generation = self.inner.generation();
        match self.eval(script, keys, args, deadline).await {
            Err(e) if e.is_unsent() && self.inner.replaced_since(generation, deadline).await => {
                self.eval(script, keys, args, deadline).await
            }
            other => other,
        }
    }

    /// A claim's answer: the native `SET … NX PX … GET` unless the store was built without it
    /// or the server refused it, else the claim script; by one `deadline` either way.
    async fn claim_reply(
        &self,
        key: &KeyBytes,
        pending: &[u8],
        lease: &[u8],
        deadline: Instant,
    ) -> Result<ClaimReply, OpError> {
        if self.native_claim() {
            // Sized once: `SET`, the key, the pending value, `NX PX`, the lease, `GET`.
            let data = 3 + key.as_bytes().len() + pending.len() + 4 + lease.len() + 3;
            let mut cmd = ::redis::Cmd::with_capacity(7, data);
            cmd.arg("SET")
                .arg(key.as_bytes())
                .arg(pending)
                .arg("NX")
                .arg("PX")
                .arg(lease)
                .arg("GET");
            match self.query(cmd, deadline).await {
                Ok(reply) => return Ok(ClaimReply::Native(reply)),
                // Refused before it ran (Redis < 7.0): nothing was written; use the script.
                Err(e) if e.is_syntax_error() => {
                    if !self
                        .inner
                        .native_claim_unsupported
                        .swap(true, Ordering::Relaxed)
                    {
                        tracing::info!(
                            key_prefix = %self.prefix,
                            "Redis refused SET NX GET (older than 7.0); claims use a script from now on",
                        );
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let reply = self
            .eval(
                &scripts::CLAIM,
                &[key.as_bytes()],
                &[Arg::Bytes(pending), Arg::Bytes(lease)],
                deadline,
            )
            .await?;
        Ok(ClaimReply::Script(reply))
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let deadline = self.deadline();
        let token = Token::generate()?;
        let pending = codec::pending_value(fingerprint, &token);
        let lease = Digits::new(codec::millis(lease));
        let reply = self
            .claim_reply(&self.key_bytes(key), &pending, lease.as_bytes(), deadline)
            .await
            .map_err(|e| e.into_store("Redis claim"))?;
        codec::parse_claim(reply, token)
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let deadline = self.deadline();
        let record = record.into_bytes();
        let retention = Digits::new(codec::millis(retention));
        let args = [
            Arg::Bytes(token.as_bytes()),
            Arg::Done(fingerprint, &record),
            Arg::Bytes(retention.as_bytes()),
        ];
        let key = self.key_bytes(key);
        let steps = StepsKeyBytes::new(&key);
        let keys = [key.as_bytes(), steps.as_bytes()];
        let Some(replicas) = self.replicas else {
            let reply = self
                .eval_resent(&scripts::COMPLETE, &keys, &args, deadline)
                .await
                .map_err(|e| e.into_store("Redis complete"))?;
            return codec::flag(reply, "unexpected answer to complete");
        };
        let (written, acknowledged) = self
            .eval_replicated(&scripts::COMPLETE, &keys, &args, replicas, deadline)
            .await
            .map_err(|e| e.into_store("Redis complete"))?;
        let written = codec::flag(written, "unexpected answer to complete")?;
        // Nothing written: nothing to replicate.
        if written {
            replicated(
                &acknowledged,
                replicas,
                "Redis complete: the record is on the primary, but fewer replicas than asked \
                 acknowledged it in time",
            )?;
        }
        Ok(written)
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let deadline = self.deadline();
        let reply = self
            .eval(
                &scripts::RELEASE,
                &[self.key_bytes(key).as_bytes()],
                &[Arg::Bytes(token.as_bytes())],
                deadline,
            )
            .await
            .map_err(|e| e.into_store("Redis release"))?;
        codec::flag(reply, "unexpected answer to release")
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let deadline = self.deadline();
        let lease = Digits::new(codec::millis(lease));
        let args = [Arg::Bytes(token.as_bytes()), Arg::Bytes(lease.as_bytes())];
        let key = self.key_bytes(key);
        let steps = StepsKeyBytes::new(&key);
        let reply = self
            .eval(
                &scripts::RENEW,
                &[key.as_bytes(), steps.as_bytes()],
                &args,
                deadline,
            )
            .await
            .map_err(|e| e.into_store("Redis renew"))?;
        codec::flag(reply, "unexpected answer to renew")
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        let deadline = self.deadline();
        let flag: &[u8] = if pending { b"1" } else { b"0" };
        let key = self.key_bytes(key);
        let reply = self
            .eval(
                &scripts::FORGET,
                &[key.as_bytes(), StepsKeyBytes::new(&key).as_bytes()],
                &[Arg::Bytes(flag)],
                deadline,
            )
            .await
            .map_err(|e| e.into_store("Redis forget"))?;
        match reply {
            ::redis::Value::Int(0) => Ok(Forgotten::Nothing),
            ::redis::Value::Int(1) => Ok(Forgotten::Record),
            ::redis::Value::Int(2) => Ok(Forgotten::Pending),
            ::redis::Value::Int(3) => Ok(Forgotten::KeptPending),
            _ => Err(StoreError::new(
                crate::store::StoreErrorKind::Protocol,
                "unexpected answer to forget",
            )),
        }
    }

    /// One script (`GET`, then `PTTL` when pending), asked only for a request found in flight.
    /// The default `wait_settled` applies: a repeat waiting on Redis polls with backoff
    /// (a `SUBSCRIBE` would need a connection of its own per process, outside the one round
    /// trip per step this store keeps).
    async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        let deadline = self.deadline();
        let reply = self
            .eval(
                &scripts::LEASE_LEFT,
                &[self.key_bytes(key).as_bytes()],
                &[],
                deadline,
            )
            .await
            .map_err(|e| e.into_store("Redis lease_left"))?;
        match reply {
            ::redis::Value::Int(ms) if ms >= 0 => {
                Ok(Some(Duration::from_millis(ms.unsigned_abs())))
            }
            // -1: nothing pending; -2: gone between GET and PTTL (cannot happen in a script).
            ::redis::Value::Int(_) => Ok(None),
            _ => Err(StoreError::new(
                crate::store::StoreErrorKind::Protocol,
                "unexpected answer to lease_left",
            )),
        }
    }

    /// One script: `GET`, and `PTTL` when something holds the key. It writes nothing, so it
    /// is never resent or waited on for replicas.
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let deadline = self.deadline();
        let reply = self
            .eval(
                &scripts::INSPECT,
                &[self.key_bytes(key).as_bytes()],
                &[],
                deadline,
            )
            .await
            .map_err(|e| e.into_store("Redis inspect"))?;
        codec::parse_inspected(reply)
    }

    /// One script on the key's steps hash and its record: `HSETNX`, then `HGET` when found, or
    /// when recorded the hash's expiry set no sooner than the retention after now and after
    /// the lease of a pending claim. With [`RedisStoreBuilder::wait_for_replicas`], followed by `WAIT` in the same
    /// round trip, as a complete is: a recorded step lost in a failover runs again.
    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        let deadline = self.deadline();
        let retention = Digits::new(codec::millis(retention));
        let args = [
            Arg::Bytes(step.as_bytes()),
            Arg::Bytes(&value),
            Arg::Bytes(retention.as_bytes()),
        ];
        let key = self.key_bytes(key);
        let steps = StepsKeyBytes::new(&key);
        let keys = [steps.as_bytes(), key.as_bytes()];
        let Some(replicas) = self.replicas else {
            let reply = self
                .eval_resent(&scripts::RECORD_STEP, &keys, &args, deadline)
                .await
                .map_err(|e| e.into_store("Redis record_step"))?;
            return codec::parse_step_recorded(reply);
        };
        let (written, acknowledged) = self
            .eval_replicated(&scripts::RECORD_STEP, &keys, &args, replicas, deadline)
            .await
            .map_err(|e| e.into_store("Redis record_step"))?;
        let recorded = codec::parse_step_recorded(written)?;
        if recorded == StepRecorded::Recorded {
            replicated(
                &acknowledged,
                replicas,
                "Redis record_step: the step is on the primary, but fewer replicas than asked \
                 acknowledged it in time",
            )?;
        }
        Ok(recorded)
    }

    /// One script, `HGETALL` on the key's steps hash (see `steps.lua` for why not the bare
    /// command).
    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        let deadline = self.deadline();
        let steps = StepsKeyBytes::new(&self.key_bytes(key));
        let reply = self
            .eval(&scripts::STEPS, &[steps.as_bytes()], &[], deadline)
            .await
            .map_err(|e| e.into_store("Redis steps"))?;
        codec::parse_steps(reply)
    }
}

/// Whether `WAIT`'s answer covers a write: `Ok` when `replicas` acknowledged it, else
/// [`NotReplicated`](crate::store::StoreErrorKind::NotReplicated) with `message`.
fn replicated(
    acknowledged: &::redis::Value,
    replicas: WaitReplicas,
    message: &'static str,
) -> Result<(), StoreError> {
    match acknowledged {
        ::redis::Value::Int(n) if usize::try_from(*n).is_ok_and(|n| n >= replicas.count) => Ok(()),
        ::redis::Value::Int(_) => Err(StoreError::new(
            crate::store::StoreErrorKind::NotReplicated,
            message,
        )),
        _ => Err(error::protocol("unexpected answer to WAIT")),
    }
}
