//! A Redis store, shared by every replica of a service: standalone Redis or Redis Cluster.
//!
//! When a service runs as more than one process, a retry may land on another replica than the
//! first attempt; the [`MemoryStore`](super::MemoryStore) of that replica has never seen the
//! key and would run the work again. [`RedisStore`] keeps the records in Redis, where every
//! replica finds them.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379", "orders")
//!     .await?
//!     .with_timeout(Duration::from_millis(500));
//! let report = store.verify().await?; // version floor, eviction policy (warns when risky)
//! println!("{report:?}");
//! let engine = Engine::new(store);
//! # let _ = engine; Ok(()) }
//! ```
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
//! | complete | script: write the done value with `PX ttl` only if the key is absent or pending under the caller's token |
//! | release | script: `DEL` only if the key is pending under the caller's token |
//! | renew | script: `PEXPIRE lease` only if the key is pending under the caller's token |
//!
//! A first execution therefore costs two commands (claim, complete); a replay, an in-flight
//! answer and a key-reuse answer cost one, a single native command. A native command costs the
//! server much less than a script call, which is why the claim, the step every request makes,
//! is not a script.
//!
//! A server older than 7.0 refuses `SET … NX … GET` with a syntax error, which executes
//! nothing; the store then sends the claim as a script (`GET`, and `SET NX PX` when absent) from
//! that call on, and logs it once at `info` ([`RedisStore::verify`] on such a server makes
//! that choice before the first claim). [`RedisStore::with_native_claim`] chooses the
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
//! [`RedisStore::with_pipelining`] turns it on or off; it is off for stores made with
//! [`RedisStore::new`] and for Redis Cluster, whose connection cannot take one pipeline of
//! keys in many slots.
//!
//! Expiry belongs to the server (`PX`, `PEXPIRE`): a pending key lapses with its lease, a done
//! key with its retention, and no sweeper runs anywhere.
//!
//! # Keys and values
//!
//! A record is one Redis string, keyed `ti:<ns>:{<id>}`: `<ns>` is the first 16 hex digits of a
//! domain-separated SHA-256 of the namespace (the namespace itself is never stored), `<id>` the
//! hex [`StoreKey::id`], already a hash of namespace, scope and client key. The id sits inside a
//! hash tag, so each record is its own cluster slot and one busy caller's keys spread over the
//! whole cluster. The value is compact binary:
//!
//! ```text
//! pending: 'P' fingerprint:32 token:16
//! done:    'D' fingerprint:32 record            (the engine's encoded record, bytes as bytes)
//! ```
//!
//! Anything else found under a key fails the request as a
//! [`Protocol`](StoreErrorKind::Protocol) error: the work never runs on an unclear answer.
//!
//! # Server requirements
//!
//! Redis **5.0** or newer ([`MIN_REDIS_VERSION`]); [`RedisStore::verify`] checks it, and 7.0 or
//! newer for the native claim (older servers get the claim script, above). The
//! scripts use only `GET`, `SET … NX PX`, `DEL` and `PEXPIRE` (all older than 3.0), but 5.0 is
//! the first version that replicates a script by its effects by default: replicas and the AOF
//! receive the writes the script made, rather than re-running the script against their own
//! copy of the data and clock. Redis Cluster (hash tags) and Valkey work alike.
//!
//! # Failures
//!
//! Every call is bounded by an operation timeout ([`DEFAULT_TIMEOUT`], 1 s; see
//! [`RedisStore::with_timeout`]). Errors keep the Redis error as their source and map to:
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
//! connection: after [`RECONNECT_AFTER_TIMEOUTS`] (2) in a row it makes a fresh
//! `ConnectionManager` from the same URL and settings, in the background (bounded by
//! [`RECONNECT_TIMEOUT`]), and the calls after it use the new connection (logged at `warn`).
//! Any successful call resets the count; one replacement is made at a time; a replacement
//! that fails keeps the old connection and is tried again after the next run of timeouts.
//! Calls already in flight finish on the connection they started on, which closes once the
//! last of them is done. Measured in `tests/faults/proxy.rs`: with a 300 ms operation timeout,
//! a store whose connection went half-open answers again about 0.9 s later (three 503s: the two
//! timeouts that start the replacement, and a call that began on the old connection while the
//! new one was being made). A Redis that is merely slow (a long script, a latency spike) also
//! gets its connection replaced; that costs one new connection per run of timeouts, nothing
//! more. A store built with [`RedisStore::new`], or with `connect_cluster`, keeps its
//! connection as given, unless it is handed a way to make another with
//! [`RedisStore::with_reconnect`].
//!
//! # Durability: what "no duplicate processing" rests on
//!
//! The promise holds only while Redis keeps the records. Two ordinary events make Redis lose
//! a record it already acknowledged, and then the next duplicate **runs the work again**:
//!
//! - **Eviction.** With a `maxmemory-policy` other than `noeviction`, a full Redis deletes keys
//!   to make room, idempotency records included. Use `noeviction` (writes then fail, claims
//!   answer 503, and nothing is run twice); [`RedisStore::verify`] warns otherwise.
//! - **Failover.** Redis replicates asynchronously. When a primary fails and a replica is
//!   promoted, the writes the replica had not yet received are gone: a record completed a
//!   moment before the failure may not exist on the new primary. The same holds after a
//!   restart of a server without persistence.
//!
//! Keep the retention (the engine's ttl) at least as long as clients retry.
//!
//! [`ConnectionManager`]: ::redis::aio::ConnectionManager

use super::{Claim, Store, StoreError, StoreErrorKind, Token};
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::oneshot;

mod verify;

pub use self::verify::{EvictionCheck, VerifyReport};
/// The `redis` crate this store is built on, for building connections of your own.
pub use ::redis;

/// The oldest Redis server the store works with: 5.0 (see the [module docs](self)).
pub const MIN_REDIS_VERSION: (u32, u32, u32) = (5, 0, 0);

/// The first Redis version whose `SET` takes `NX` and `GET` together: 7.0 (claims are then one
/// native command; see the [module docs](self)).
pub const NATIVE_CLAIM_VERSION: (u32, u32, u32) = (7, 0, 0);

/// The default bound on one store operation: 1 second.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Consecutive operation timeouts after which a store that can reconnect (made by
/// [`RedisStore::connect`], or given [`RedisStore::with_reconnect`]) replaces its connection:
/// 2. See the [module docs](self#failures).
pub const RECONNECT_AFTER_TIMEOUTS: u32 = 2;

/// The bound on making a connection: the first one in [`RedisStore::connect`], and each
/// replacement after a run of timeouts: 5 seconds.
pub const RECONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const NAMESPACE_DOMAIN: &[u8] = b"tower-idempotency/redis-ns/v1";
const PENDING: u8 = b'P';
const DONE: u8 = b'D';
const FP_END: usize = 1 + 32;
const PENDING_LEN: usize = FP_END + 16;
/// Longest expiry sent to Redis (about 100 years): far past any lease or retention, and far
/// from the overflow Redis refuses when it adds an expiry to its clock.
const MAX_EXPIRY_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/claim.lua")));
static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("redis/complete.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis/renew.lua")));

/// An idempotency [`Store`] in Redis or Redis Cluster, generic over the connection.
///
/// `C` is any `redis` async connection that is cheap to clone: the default
/// [`ConnectionManager`](::redis::aio::ConnectionManager) (reconnects by itself), a
/// `MultiplexedConnection`, or, with the `redis-cluster` feature, a
/// `cluster_async::ClusterConnection`. Clones of the store share one connection, and its
/// replacement when the store replaces it after a run of timeouts (see the
/// [module docs](self#failures)).
///
/// See the [module docs](self) for the key layout, the scripts, the version floor and the
/// durability caveats.
pub struct RedisStore<C = ::redis::aio::ConnectionManager> {
    shared: Arc<Shared<C>>,
    /// Makes a replacement connection; `None`: the connection is kept as given.
    reconnect: Option<Reconnect<C>>,
    prefix: Arc<str>,
    timeout: Duration,
}

/// The future of a replacement connection.
type Connecting<C> = Pin<Box<dyn Future<Output = Result<C, RedisError>> + Send>>;
/// Makes a replacement connection.
type Reconnect<C> = Arc<dyn Fn() -> Connecting<C> + Send + Sync>;

/// The connection all clones of a store use, and the state that decides when to replace it.
struct Shared<C> {
    /// The connection in use. Each operation clones it out; the lock is never held across an
    /// `.await`.
    current: RwLock<C>,
    /// Bumped, under the write lock, each time the connection is replaced: a timeout met on a
    /// connection already replaced does not count against its successor.
    generation: AtomicU64,
    /// Consecutive operation timeouts on the current connection.
    timeouts: AtomicU32,
    /// A replacement is being made (at most one at a time).
    reconnecting: AtomicBool,
    /// Claims are sent as the native `SET … NX PX … GET`; cleared for good when the server
    /// refuses that syntax (before 7.0) or by [`RedisStore::with_native_claim`].
    native_claim: AtomicBool,
    /// Commands are queued and written together (see [`RedisStore::with_pipelining`]).
    pipelining: AtomicBool,
    /// Commands waiting for the next write.
    outbox: Mutex<Outbox>,
}

/// A command waiting in the outbox, where its answer goes, and its caller's timeout.
type Queued = (
    ::redis::Cmd,
    oneshot::Sender<Result<Value, RedisError>>,
    Duration,
);

/// The commands queued since the last write.
#[derive(Default)]
struct Outbox {
    queued: Vec<Queued>,
    /// A flush task is spawned and has not yet taken the queue.
    scheduled: bool,
}

impl<C: Clone> Shared<C> {
    fn new(conn: C) -> Self {
        Self {
            current: RwLock::new(conn),
            generation: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
            reconnecting: AtomicBool::new(false),
            native_claim: AtomicBool::new(true),
            pipelining: AtomicBool::new(false),
            outbox: Mutex::new(Outbox::default()),
        }
    }

    /// The connection in use and its generation.
    fn checkout(&self) -> (u64, C) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        // Written under the write lock only: consistent with `current` while it is read.
        (self.generation.load(Ordering::Relaxed), current.clone())
    }

    /// Puts `conn` in place of the current connection; returns the old one (dropped by the
    /// caller, outside the lock).
    fn replace(&self, conn: C) -> C {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.timeouts.store(0, Ordering::Relaxed);
        std::mem::replace(&mut *current, conn)
    }
}

impl<C> Shared<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Queues `cmd` for the next write, spawning the task that writes it unless one is
    /// already waiting to.
    fn enqueue(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        cmd: ::redis::Cmd,
        timeout: Duration,
    ) -> oneshot::Receiver<Result<Value, RedisError>> {
        let (tx, rx) = oneshot::channel();
        let spawn = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            outbox.queued.push((cmd, tx, timeout));
            !std::mem::replace(&mut outbox.scheduled, true)
        };
        if spawn {
            runtime.spawn(Arc::clone(self).flush());
        }
        rx
    }

    /// Writes everything queued as one pipeline and hands each caller its own answer.
    async fn flush(self: Arc<Self>) {
        // Yield once: the tasks that are ready now run first and queue their commands, so
        // a busy server writes one pipeline per round of its scheduler, not one per command.
        tokio::task::yield_now().await;
        let queued = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            outbox.scheduled = false;
            std::mem::take(&mut outbox.queued)
        };
        // Bounded like its callers: a silent connection must not keep this task (and the
        // connection it holds) alive after every caller has given up.
        let limit = queued.iter().map(|q| q.2).max().unwrap_or(DEFAULT_TIMEOUT);
        let (_, mut conn) = self.checkout();
        if let [(cmd, _, _)] = &queued[..] {
            // A server error comes back as a value; make it the caller's error.
            let answer = tokio::time::timeout(limit, conn.req_packed_command(cmd))
                .await
                .unwrap_or_else(|_| Err(elapsed()))
                .and_then(Value::extract_error);
            if let Some((_, tx, _)) = queued.into_iter().next() {
                let _ = tx.send(answer);
            }
            return;
        }
        let mut pipe = ::redis::pipe();
        let mut senders = Vec::with_capacity(queued.len());
        for (cmd, tx, _) in queued {
            pipe.add_command(cmd);
            senders.push(tx);
        }
        let answers =
            tokio::time::timeout(limit, conn.req_packed_commands(&pipe, 0, senders.len()))
                .await
                .unwrap_or_else(|_| Err(elapsed()));
        match answers {
            Ok(answers) if answers.len() == senders.len() => {
                for (answer, tx) in answers.into_iter().zip(senders) {
                    // A command's own error (NOSCRIPT, OOM, …) goes to its caller only.
                    let _ = tx.send(answer.extract_error());
                }
            }
            Ok(_) => {
                let e = RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline was answered with the wrong number of replies",
                ));
                for tx in senders {
                    let _ = tx.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for tx in senders {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The error of a pipeline that outlived its callers' timeouts.
fn elapsed() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the pipeline timed out",
    ))
}

/// Clears [`Shared::reconnecting`] when the replacement attempt ends, however it ends (done,
/// failed, or its task dropped with the runtime).
struct ReconnectGuard<C>(Arc<Shared<C>>);

impl<C> Drop for ReconnectGuard<C> {
    fn drop(&mut self) {
        self.0.reconnecting.store(false, Ordering::Release);
    }
}

impl<C> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            reconnect: self.reconnect.clone(),
            prefix: Arc::clone(&self.prefix),
            timeout: self.timeout,
        }
    }
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("reconnects", &self.reconnect.is_some())
            .finish_non_exhaustive()
    }
}

/// The namespace given to a [`RedisStore`] was empty.
///
/// Two applications that share one Redis must use different namespaces, or they would answer
/// each other's requests; an empty namespace is refused so none is forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidNamespace;

impl fmt::Display for InvalidNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the Redis store's namespace must not be empty")
    }
}

impl std::error::Error for InvalidNamespace {}

impl RedisStore<::redis::aio::ConnectionManager> {
    /// Connects to the Redis at `url` (`redis://host:port/db`, `rediss://` with a TLS feature
    /// of the `redis` crate) through a [`ConnectionManager`](::redis::aio::ConnectionManager),
    /// which reconnects by itself after Redis comes back.
    ///
    /// Each connection attempt is bounded by the operation timeout ([`DEFAULT_TIMEOUT`]), and a
    /// lost connection is retried twice with a short back-off before calls fail fast (the next
    /// call then tries again). Responses are bounded by the store's operation timeout, not by
    /// the connection. A connection that only times out (half-open) is replaced after
    /// [`RECONNECT_AFTER_TIMEOUTS`] timeouts in a row (see the [module docs](self#failures)).
    /// For other settings, build a `ConnectionManager` and use [`RedisStore::new`] (with
    /// [`RedisStore::with_reconnect`] to keep the replacement).
    ///
    /// # Errors
    /// `Unavailable` when the namespace is empty (source: [`InvalidNamespace`]), the URL is
    /// invalid or the server cannot be reached; `Timeout` when connecting takes longer than a
    /// few seconds.
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, StoreError> {
        let prefix = prefix_of(namespace).map_err(invalid_namespace)?;
        let client = ::redis::Client::open(url).map_err(|e| map_err("invalid Redis URL", e))?;
        let config = ::redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let connect = move || {
            ::redis::aio::ConnectionManager::new_with_config(client.clone(), config.clone())
        };
        let conn = tokio::time::timeout(RECONNECT_TIMEOUT, connect())
            .await
            .map_err(|e| timed_out("connecting to Redis timed out", e))?
            .map_err(|e| map_err("connecting to Redis failed", e))?;
        Ok(Self::with_prefix(conn, prefix)
            .with_reconnect(connect)
            .with_pipelining(true))
    }
}

#[cfg(feature = "redis-cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
impl RedisStore<::redis::cluster_async::ClusterConnection> {
    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port` each); the
    /// client learns the rest of the cluster from them and follows slot moves and failovers.
    ///
    /// Connection attempts and responses are bounded by [`DEFAULT_TIMEOUT`]. For other
    /// settings, build a `ClusterConnection` with [`redis::cluster::ClusterClient::builder`]
    /// and use [`RedisStore::new`].
    ///
    /// # Errors
    /// `Unavailable` when the namespace is empty (source: [`InvalidNamespace`]), a node URL is
    /// invalid or no node can be reached; `Timeout` when connecting takes longer than a few
    /// seconds.
    pub async fn connect_cluster<I, T>(nodes: I, namespace: &str) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        let prefix = prefix_of(namespace).map_err(invalid_namespace)?;
        let client = ::redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(DEFAULT_TIMEOUT)
            .response_timeout(DEFAULT_TIMEOUT)
            .build()
            .map_err(|e| map_err("invalid Redis Cluster nodes", e))?;
        let conn = tokio::time::timeout(DEFAULT_TIMEOUT * 5, client.get_async_connection())
            .await
            .map_err(|e| timed_out("connecting to Redis Cluster timed out", e))?
            .map_err(|e| map_err("connecting to Redis Cluster failed", e))?;
        Ok(Self::with_prefix(conn, prefix))
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over an existing connection, keeping records under `namespace`.
    ///
    /// Pipelining is off (a cluster connection cannot take it); for a standalone connection,
    /// turn it on with [`RedisStore::with_pipelining`] as [`RedisStore::connect`] does.
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
    /// [`InvalidNamespace`] when `namespace` is empty.
    pub fn new(conn: C, namespace: &str) -> Result<Self, InvalidNamespace> {
        Ok(Self::with_prefix(conn, prefix_of(namespace)?))
    }

    fn with_prefix(conn: C, prefix: String) -> Self {
        Self {
            shared: Arc::new(Shared::new(conn)),
            reconnect: None,
            prefix: prefix.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Replaces the connection with one made by `connect` after [`RECONNECT_AFTER_TIMEOUTS`]
    /// operation timeouts in a row, as [`RedisStore::connect`] does with its
    /// `ConnectionManager` (see the [module docs](self#failures)): for a connection that can go
    /// silent without failing (half-open), which its own reconnection never notices.
    ///
    /// `connect` runs in a task of its own, one at a time, bounded by [`RECONNECT_TIMEOUT`];
    /// when it fails or times out the store keeps its connection and tries again after the next
    /// run of timeouts. Set it before cloning the store: a clone made earlier shares the
    /// connection but does not replace it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::redis::{RedisStore, redis};
    /// use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let config = ConnectionManagerConfig::new()
    ///     .set_connection_timeout(Some(Duration::from_millis(200)));
    /// let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
    /// let store = RedisStore::new(conn, "orders")?
    ///     .with_reconnect(move || ConnectionManager::new_with_config(client.clone(), config.clone()));
    /// # let _ = store; Ok(()) }
    /// ```
    #[must_use]
    pub fn with_reconnect<F, Fut>(mut self, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<C, RedisError>> + Send + 'static,
    {
        self.reconnect = Some(Arc::new(move || -> Connecting<C> { Box::pin(connect()) }));
        self
    }

    /// Bounds every store operation (each one round trip) to `timeout`; a call that takes
    /// longer fails with [`StoreErrorKind::Timeout`]. Default: [`DEFAULT_TIMEOUT`] (1 s).
    ///
    /// Keep it well below the lease: a claim must not outlive the lease it takes.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Sends claims as Redis's native `SET … NX PX … GET` (`true`, the default, on Redis 7.0
    /// and newer) or as a Lua script (`false`). The default falls back to the script by itself
    /// when the server refuses the syntax; choose `false` where something in front of Redis
    /// (a proxy) rejects it in another way. Applies to every clone of the store.
    ///
    /// Both answer alike; the script costs the server more per claim (see the
    /// [module docs](self)).
    ///
    /// ```no_run
    /// use tower_idempotency::store::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Behind a proxy that rejects `SET … NX … GET` without saying "syntax error".
    /// let store = RedisStore::connect("redis://127.0.0.1:6379", "orders")
    ///     .await?
    ///     .with_native_claim(false);
    /// assert!(!store.native_claim());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_native_claim(self, native: bool) -> Self {
        self.shared.native_claim.store(native, Ordering::Relaxed);
        self
    }

    /// Queues the commands of concurrent requests and writes them to Redis together, as one
    /// pipeline per round of the runtime's scheduler, instead of one write per command.
    /// On by default for [`RedisStore::connect`], off for [`RedisStore::new`] and Redis
    /// Cluster (a cluster connection cannot take one pipeline of keys in many slots). Applies
    /// to every clone of the store. See the [module docs](self#pipelining).
    ///
    /// Each command still has its own answer and its own error, and the operation timeout
    /// counts from the moment it is queued.
    ///
    /// ```no_run
    /// use tower_idempotency::store::redis::{RedisStore, redis};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let store = RedisStore::new(conn, "orders")?.with_pipelining(true);
    /// assert!(store.pipelining());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_pipelining(self, on: bool) -> Self {
        self.shared.pipelining.store(on, Ordering::Relaxed);
        self
    }

    /// Whether commands are pipelined (see [`RedisStore::with_pipelining`]).
    #[must_use]
    pub fn pipelining(&self) -> bool {
        self.shared.pipelining.load(Ordering::Relaxed)
    }

    /// Whether claims are sent as the native `SET … NX PX … GET` (see
    /// [`RedisStore::with_native_claim`]); `false` after the server refused it.
    #[must_use]
    pub fn native_claim(&self) -> bool {
        self.shared.native_claim.load(Ordering::Relaxed)
    }

    /// The operation timeout.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The prefix of every key this store writes (`ti:` and 16 hex digits of the hashed
    /// namespace), for operators looking at Redis.
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key holding the record of `key`.
    #[must_use]
    pub fn redis_key(&self, key: &StoreKey) -> String {
        format!("{}:{{{}}}", self.prefix, key.id_hex())
    }

    /// [`RedisStore::redis_key`] on the stack: every command names its key, and the hot path
    /// makes no allocation for it.
    fn key_bytes(&self, key: &StoreKey) -> KeyBytes {
        KeyBytes::new(&self.prefix, key)
    }

    /// The connection in use now; clone it to send commands of your own.
    ///
    /// A store that reconnects ([`RedisStore::connect`], [`RedisStore::with_reconnect`])
    /// replaces its connection after a run of timeouts, so take it afresh for each use rather
    /// than keeping a clone, and do not hold the returned reference across an `.await` (it
    /// holds a read lock that a replacement waits for).
    #[must_use]
    pub fn connection(&self) -> impl Deref<Target = C> + '_ {
        self.shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks the server at start-up: its version is at least [`MIN_REDIS_VERSION`] (below
    /// [`NATIVE_CLAIM_VERSION`], claims use the script from then on), and its
    /// `maxmemory-policy` is `noeviction` (warned through `tracing` otherwise, since an evicted
    /// record lets the next duplicate run). On Redis Cluster every primary is checked.
    ///
    /// The policy is read from `INFO`, or from `CONFIG GET maxmemory-policy` when `INFO` does
    /// not show it; where both are refused (managed Redis), the report says the policy could
    /// not be checked ([`EvictionCheck::Unknown`]) instead of failing.
    ///
    /// # Errors
    /// The usual store errors when Redis cannot be asked; `Protocol` when the server is older
    /// than the floor or its `INFO` carries no version.
    pub async fn verify(&self) -> Result<VerifyReport, StoreError> {
        let (generation, mut conn) = self.shared.checkout();
        let info: Value = self
            .bounded(
                "Redis INFO",
                generation,
                ::redis::cmd("INFO").query_async(&mut conn),
            )
            .await?;
        let mut report = verify::from_info(&info)?;
        if matches!(report.eviction, EvictionCheck::Unknown { .. }) {
            let mut cmd = ::redis::cmd("CONFIG");
            cmd.arg("GET").arg("maxmemory-policy");
            report.eviction = match self
                .bounded(
                    "Redis CONFIG GET",
                    generation,
                    cmd.query_async::<Value>(&mut conn),
                )
                .await
            {
                Ok(v) => verify::from_config_get(&v),
                Err(e) if e.kind() == StoreErrorKind::Protocol || is_refused(&e) => {
                    EvictionCheck::Unknown {
                        reason: "CONFIG GET was refused",
                    }
                }
                Err(e) => return Err(e),
            };
        }
        report.warn();
        // A server that cannot take `SET … NX … GET` gets the script from the first claim on,
        // instead of after one refused attempt.
        if report.version < NATIVE_CLAIM_VERSION {
            self.shared.native_claim.store(false, Ordering::Relaxed);
        }
        Ok(report)
    }

    /// Runs one operation on the connection of `generation` within the operation timeout,
    /// and counts its outcome towards replacing that connection.
    async fn bounded<T>(
        &self,
        op: &'static str,
        generation: u64,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(map_err(op, e)),
            Err(e) => Err(timed_out(op, e)),
        };
        if let Some(reconnect) = &self.reconnect {
            self.observe(reconnect, generation, result.as_ref().err());
        }
        result
    }

    /// A success resets the count of timeouts; a timeout adds one, and the
    /// [`RECONNECT_AFTER_TIMEOUTS`]th in a row starts a replacement unless one is under way.
    /// Other errors leave the count alone (the `ConnectionManager` handles a connection that
    /// fails). Outcomes on a connection already replaced are ignored.
    fn observe(&self, reconnect: &Reconnect<C>, generation: u64, error: Option<&StoreError>) {
        let shared = &self.shared;
        let current = || shared.generation.load(Ordering::Relaxed) == generation;
        match error {
            None => {
                // Read first: the common case writes nothing.
                if shared.timeouts.load(Ordering::Relaxed) != 0 && current() {
                    shared.timeouts.store(0, Ordering::Relaxed);
                }
            }
            Some(e) if e.kind() == StoreErrorKind::Timeout && current() => {
                let timeouts = shared.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts >= RECONNECT_AFTER_TIMEOUTS
                    && !shared.reconnecting.swap(true, Ordering::AcqRel)
                {
                    self.spawn_reconnect(reconnect, timeouts);
                }
            }
            Some(_) => {}
        }
    }

    /// Makes a replacement connection in a task of its own and puts it in place; on failure,
    /// keeps the current one and starts the count again. The caller set `reconnecting`.
    fn spawn_reconnect(&self, reconnect: &Reconnect<C>, timeouts: u32) {
        let guard = ReconnectGuard(Arc::clone(&self.shared));
        // The `redis` feature's `tokio-comp` brings tokio's runtime; a store is only used in one.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let reconnect = Arc::clone(reconnect);
        let prefix = Arc::clone(&self.prefix);
        runtime.spawn(async move {
            let shared = &guard.0;
            match tokio::time::timeout(RECONNECT_TIMEOUT, reconnect()).await {
                Ok(Ok(conn)) => {
                    let old = shared.replace(conn);
                    tracing::warn!(
                        key_prefix = %prefix,
                        timeouts,
                        "Redis connection replaced after consecutive operation timeouts \
                         (silent or half-open connection)",
                    );
                    drop(old);
                }
                Ok(Err(e)) => {
                    shared.timeouts.store(0, Ordering::Relaxed);
                    tracing::warn!(
                        key_prefix = %prefix,
                        timeouts,
                        error = %e,
                        "Redis connection timing out, but a replacement could not be made; \
                         keeping it and trying again after the next timeouts",
                    );
                }
                Err(_) => {
                    shared.timeouts.store(0, Ordering::Relaxed);
                    tracing::warn!(
                        key_prefix = %prefix,
                        timeouts,
                        timeout = ?RECONNECT_TIMEOUT,
                        "Redis connection timing out, and making a replacement timed out; \
                         keeping it and trying again after the next timeouts",
                    );
                }
            }
        });
    }

    /// Sends one command: through the outbox when pipelining (inside a Tokio runtime),
    /// directly otherwise; bounded by the operation timeout either way.
    async fn query(&self, op: &'static str, cmd: ::redis::Cmd) -> Result<Value, StoreError> {
        if self.shared.pipelining.load(Ordering::Relaxed)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let generation = self.shared.generation.load(Ordering::Relaxed);
            let answer = self.shared.enqueue(&runtime, cmd, self.timeout);
            return self
                .bounded(op, generation, async move {
                    answer.await.unwrap_or_else(|_| {
                        Err(RedisError::from((
                            ErrorKind::Io,
                            "the pipeline carrying the command was dropped",
                        )))
                    })
                })
                .await;
        }
        let (generation, mut conn) = self.shared.checkout();
        self.bounded(op, generation, cmd.query_async(&mut conn))
            .await
    }

    async fn run(
        &self,
        op: &'static str,
        script: &Script,
        key: &StoreKey,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let redis_key = self.key_bytes(key);
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(1).arg(redis_key.as_bytes());
        for a in args {
            cmd.arg(*a);
        }
        match self.query(op, cmd).await {
            // The server does not have the script yet (first use, restart, SCRIPT FLUSH):
            // `invoke_async` loads it and runs it again.
            Err(e) if is_no_script(&e) => {
                let mut invocation = script.key(redis_key.as_bytes());
                for a in args {
                    invocation.arg(*a);
                }
                let (generation, mut conn) = self.shared.checkout();
                self.bounded(op, generation, invocation.invoke_async(&mut conn))
                    .await
            }
            other => other,
        }
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let token = Token::generate()?;
        let mut pending = [0u8; PENDING_LEN];
        pending[0] = PENDING;
        pending[1..FP_END].copy_from_slice(fingerprint.as_bytes());
        pending[FP_END..].copy_from_slice(token.as_bytes());
        let lease = Digits::new(millis(lease));
        if self.shared.native_claim.load(Ordering::Relaxed) {
            let mut cmd = ::redis::cmd("SET");
            cmd.arg(self.key_bytes(key).as_bytes())
                .arg(&pending)
                .arg("NX")
                .arg("PX")
                .arg(lease.as_bytes())
                .arg("GET");
            match self.query("Redis claim", cmd).await {
                // Nil: the key was absent and now holds our pending value.
                Ok(Value::Nil) => return Ok(Claim::Claimed(token)),
                Ok(Value::BulkString(stored)) => return parse_stored(stored),
                Ok(_) => return Err(protocol("unexpected answer to claim")),
                // Refused before it ran (Redis < 7.0): nothing was written; use the script.
                Err(e) if is_syntax_error(&e) => {
                    if self.shared.native_claim.swap(false, Ordering::Relaxed) {
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
            .run(
                "Redis claim",
                &CLAIM,
                key,
                &[&pending[..], lease.as_bytes()],
            )
            .await?;
        match reply {
            Value::Int(1) => Ok(Claim::Claimed(token)),
            Value::BulkString(stored) => parse_stored(stored),
            _ => Err(protocol("unexpected answer to claim")),
        }
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let record = record.into_bytes();
        let mut done = Vec::with_capacity(FP_END + record.len());
        done.push(DONE);
        done.extend_from_slice(fingerprint.as_bytes());
        done.extend_from_slice(&record);
        let ttl = Digits::new(millis(ttl));
        let args: [&[u8]; 3] = [token.as_bytes(), &done, ttl.as_bytes()];
        flag(
            self.run("Redis complete", &COMPLETE, key, &args).await?,
            "unexpected answer to complete",
        )
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        flag(
            self.run("Redis release", &RELEASE, key, &[token.as_bytes()])
                .await?,
            "unexpected answer to release",
        )
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let lease = Digits::new(millis(lease));
        flag(
            self.run(
                "Redis renew",
                &RENEW,
                key,
                &[token.as_bytes(), lease.as_bytes()],
            )
            .await?,
            "unexpected answer to renew",
        )
    }
}

/// `ti:` and the first 16 hex digits of the namespace's domain-separated SHA-256.
fn prefix_of(namespace: &str) -> Result<String, InvalidNamespace> {
    if namespace.is_empty() {
        return Err(InvalidNamespace);
    }
    let mut h = Sha256::new();
    h.update(NAMESPACE_DOMAIN);
    h.update(namespace.as_bytes());
    let digest = h.finalize();
    Ok(format!("ti:{}", crate::scope::hex(&digest[..8])))
}

/// A duration as whole milliseconds for `PX`/`PEXPIRE`: rounded up, at least 1, at most
/// [`MAX_EXPIRY_MS`].
fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_EXPIRY_MS)
}

/// A number's decimal digits, on the stack (a command argument).
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    #[allow(clippy::cast_possible_truncation)] // `n % 10` is a digit
    fn new(mut n: u64) -> Self {
        let mut buf = [b'0'; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Self { buf, start };
            }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `<prefix>:{<64 hex digits>}`, on the stack.
struct KeyBytes {
    buf: [u8; KEY_LEN],
}

/// `ti:` + 16 hex digits, `:{`, 64 hex digits, `}`.
const KEY_LEN: usize = 3 + 16 + 2 + 64 + 1;

impl KeyBytes {
    fn new(prefix: &str, key: &StoreKey) -> Self {
        let mut buf = [0u8; KEY_LEN];
        let p = prefix.as_bytes();
        // Every prefix is made by `prefix_of`: `ti:` and 16 hex digits.
        debug_assert_eq!(p.len(), 19);
        buf[..19].copy_from_slice(&p[..19]);
        buf[19..21].copy_from_slice(b":{");
        crate::scope::hex_into(key.id(), &mut buf[21..KEY_LEN - 1]);
        buf[KEY_LEN - 1] = b'}';
        Self { buf }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Parses a value the claim found under the key. Strict: a value of another layout is
/// a protocol error, never a claim.
fn parse_stored(stored: Vec<u8>) -> Result<Claim, StoreError> {
    let fingerprint = |b: &[u8]| -> Fingerprint {
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&b[1..FP_END]);
        Fingerprint::from_bytes(fp)
    };
    match stored.first() {
        Some(&PENDING) if stored.len() == PENDING_LEN => Ok(Claim::Pending {
            fingerprint: fingerprint(&stored),
        }),
        Some(&DONE) if stored.len() >= FP_END => {
            let fp = fingerprint(&stored);
            let record = Record::from_bytes(Bytes::from(stored).slice(FP_END..));
            Ok(Claim::Done {
                fingerprint: fp,
                record,
            })
        }
        _ => Err(protocol("unrecognised value under an idempotency key")),
    }
}

/// The 1/0 answer of complete, release and renew; anything else is a protocol error.
fn flag(reply: Value, unexpected: &'static str) -> Result<bool, StoreError> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        _ => Err(protocol(unexpected)),
    }
}

fn protocol(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

fn invalid_namespace(e: InvalidNamespace) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unavailable, "invalid namespace", e)
}

fn timed_out(op: &'static str, e: tokio::time::error::Elapsed) -> StoreError {
    StoreError::with_source(StoreErrorKind::Timeout, op, e)
}

/// The Redis error behind a store error, if one is.
fn redis_source(e: &StoreError) -> Option<&RedisError> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<RedisError>())
}

fn is_refused(e: &StoreError) -> bool {
    redis_source(e).is_some_and(|r| {
        matches!(
            r.kind(),
            ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::Extension
        )
    })
}

/// The server does not hold the script (`NOSCRIPT`).
fn is_no_script(e: &StoreError) -> bool {
    redis_source(e).is_some_and(|r| r.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
}

/// The server refused a command's syntax (`ERR syntax error`): it did not run.
fn is_syntax_error(e: &StoreError) -> bool {
    redis_source(e).is_some_and(|r| {
        r.code() == Some("ERR")
            && r.detail()
                .is_some_and(|d| d.to_ascii_lowercase().starts_with("syntax error"))
    })
}

/// Maps a Redis error to a store error kind, keeping it as the source.
fn map_err(op: &'static str, e: RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else {
        match e.kind() {
            // The server (or our script) answered something we do not understand.
            ErrorKind::Parse
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::Server(
                ServerErrorKind::ResponseError
                | ServerErrorKind::NoScript
                | ServerErrorKind::CrossSlot
                | ServerErrorKind::ExecAbort,
            ) => StoreErrorKind::Protocol,
            // Not reachable, not ready, or refused: I/O, cluster state, OOM, ACL, auth.
            _ => StoreErrorKind::Unavailable,
        }
    };
    StoreError::with_source(kind, op, e)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A connection that is never used.
    #[derive(Clone)]
    struct NoConnection;

    impl ConnectionLike for NoConnection {
        fn req_packed_command<'a>(
            &'a mut self,
            _: &'a ::redis::Cmd,
        ) -> ::redis::RedisFuture<'a, Value> {
            unreachable!("not used")
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a ::redis::Pipeline,
            _: usize,
            _: usize,
        ) -> ::redis::RedisFuture<'a, Vec<Value>> {
            unreachable!("not used")
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[test]
    fn prefix_hides_the_namespace() {
        let p = prefix_of("orders").unwrap();
        assert_eq!(p.len(), 3 + 16);
        assert!(p.starts_with("ti:") && !p.contains("orders"));
        assert_ne!(p, prefix_of("orders2").unwrap());
        assert_eq!(prefix_of(""), Err(InvalidNamespace));
    }

    #[test]
    fn millis_round_up_and_stay_in_range() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_secs(60)), 60_000);
        assert_eq!(millis(Duration::MAX), MAX_EXPIRY_MS);
        for n in [0, 1, 9, 10, 60_000, MAX_EXPIRY_MS, u64::MAX] {
            assert_eq!(Digits::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn key_bytes_match_the_documented_key() {
        let store = RedisStore::new(NoConnection, "orders").unwrap();
        let key = StoreKey::derive(
            "orders",
            &crate::Scope::principal("p"),
            &crate::IdempotencyKey::new("k").unwrap(),
        );
        assert_eq!(
            store.key_bytes(&key).as_bytes(),
            store.redis_key(&key).as_bytes()
        );
    }

    #[test]
    fn parses_pending_and_done_values() {
        let mut v = vec![PENDING];
        v.extend_from_slice(&[7; 32]);
        v.extend_from_slice(&[9; 16]);
        assert_eq!(
            parse_stored(v).unwrap(),
            Claim::Pending {
                fingerprint: Fingerprint::from_bytes([7; 32])
            }
        );
        let mut v = vec![DONE];
        v.extend_from_slice(&[7; 32]);
        v.extend_from_slice(b"rec");
        let Claim::Done {
            fingerprint,
            record,
        } = parse_stored(v).unwrap()
        else {
            panic!("done")
        };
        assert_eq!(fingerprint, Fingerprint::from_bytes([7; 32]));
        assert_eq!(record.as_bytes().as_ref(), b"rec");
    }

    #[test]
    fn refuses_values_of_another_layout() {
        let mut pending = vec![PENDING];
        pending.extend_from_slice(&[0; 48]);
        for bad in [
            vec![],
            vec![b'X'; 49],
            pending[..48].to_vec(),
            [&pending[..], b"x"].concat(),
            vec![DONE; 32],
        ] {
            let err = parse_stored(bad).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol);
        }
    }

    #[test]
    fn flags_are_strict() {
        assert!(flag(Value::Int(1), "renew").unwrap());
        assert!(!flag(Value::Int(0), "renew").unwrap());
        for bad in [
            Value::Int(2),
            Value::Nil,
            Value::BulkString(b"1".to_vec()),
            Value::Okay,
        ] {
            assert_eq!(
                flag(bad, "renew").unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
    }

    #[test]
    fn scripts_check_the_pending_layout() {
        // The scripts index the token at bytes 34..=49 of a 49-byte pending value ('P' = 80).
        assert_eq!((PENDING_LEN, FP_END + 1, PENDING), (49, 34, 80));
        for src in [
            include_str!("redis/complete.lua"),
            include_str!("redis/release.lua"),
            include_str!("redis/renew.lua"),
        ] {
            assert!(src.contains(
                "#held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1]"
            ));
        }
    }
}
