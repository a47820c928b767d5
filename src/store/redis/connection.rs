//! The connection every clone of a store shares, and its replacement after a run of timeouts
//! (see the [module docs](super#failures)).

use super::error::OpError;
use super::replicated::Jobs;
use super::{RECONNECT_AFTER_TIMEOUTS, RECONNECT_TIMEOUT, RedisStore};
use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// The host and port of the primary a connection was made for, as the sentinels name it.
pub(super) type Address = (String, u16);
/// A new connection, and the primary it was made for when the sentinels named one.
pub(super) type Made<C> = (C, Option<Address>);
/// The future of a replacement connection.
pub(super) type Connecting<C> = Pin<Box<dyn Future<Output = Result<Made<C>, RedisError>> + Send>>;
/// Makes a replacement connection.
pub(super) type Reconnect<C> = Arc<dyn Fn() -> Connecting<C> + Send + Sync>;

/// What every clone of a store shares: the connection, the state that decides when to replace
/// it, the outbox of pipelined commands, and what the store learned about the server.
///
/// No setting lives here: those are plain fields of [`RedisStore`], fixed when it is built.
pub(super) struct Inner<C> {
    /// The connection in use, and the primary it was made for when the sentinels named one.
    /// Each operation clones the connection out; the lock is never held across an `.await`.
    current: RwLock<(C, Option<Address>)>,
    /// Bumped, under the write lock, each time the connection is replaced: a timeout met on a
    /// connection already replaced does not count against its successor.
    generation: AtomicU64,
    /// Consecutive operation timeouts on the current connection.
    timeouts: AtomicU32,
    /// A replacement is being made (at most one at a time).
    reconnecting: AtomicBool,
    /// The generation, plus one, of a Sentinel store's connection that lost its primary (0:
    /// none). Nothing is sent on it again. Its manager would reconnect to the old address, where
    /// the old primary, restarted, answers as a primary until Sentinel demotes it.
    condemned: AtomicU64,
    /// The server refused `SET … NX … GET` (older than 7.0), so claims use the script. A fact
    /// about the server, learned once, not a setting: every clone of the store sees it.
    pub(super) native_claim_unsupported: AtomicBool,
    /// Commands waiting for the next pipelined write.
    pub(super) outbox: Mutex<Outbox>,
    /// Where writes that wait for replicas go (see `replicated`), once one was sent.
    pub(super) writer: OnceLock<Jobs>,
    /// Woken each time the connection is replaced, for operations waiting to be sent again.
    replaced: Notify,
}

impl<C: Clone> Inner<C> {
    pub(super) fn new(conn: C) -> Self {
        Self::made((conn, None))
    }

    /// Over a connection made for the primary the sentinels named.
    pub(super) fn made((conn, primary): Made<C>) -> Self {
        Self {
            current: RwLock::new((conn, primary)),
            generation: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
            reconnecting: AtomicBool::new(false),
            condemned: AtomicU64::new(0),
            native_claim_unsupported: AtomicBool::new(false),
            outbox: Mutex::new(Outbox::default()),
            writer: OnceLock::new(),
            replaced: Notify::new(),
        }
    }

    /// The connection in use and its generation.
    pub(super) fn checkout(&self) -> (u64, C) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        // Written under the write lock only: consistent with `current` while it is read.
        (self.generation.load(Ordering::Relaxed), current.0.clone())
    }

    /// The generation of the connection in use and the primary it was made for.
    #[cfg(feature = "redis-sentinel")]
    pub(super) fn primary(&self) -> (u64, Option<Address>) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        (self.generation.load(Ordering::Relaxed), current.1.clone())
    }

    /// The generation of the connection in use.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Whether the connection of `generation` lost its primary and waits for a replacement.
    pub(super) fn condemned(&self, generation: u64) -> bool {
        self.condemned.load(Ordering::Acquire) == generation + 1
    }

    /// Puts `conn` in place of the current connection; returns the old one (dropped by the
    /// caller, outside the lock).
    fn replace(&self, made: Made<C>) -> Made<C> {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.timeouts.store(0, Ordering::Relaxed);
        let old = std::mem::replace(&mut *current, made);
        self.replaced.notify_waiters();
        old
    }

    /// Waits until the connection of `generation` has been replaced, or `deadline`: whether it
    /// was.
    pub(super) async fn replaced_since(&self, generation: u64, deadline: Instant) -> bool {
        loop {
            let replaced = self.replaced.notified();
            let now = self.generation();
            if now != generation && !self.condemned(now) {
                return true;
            }
            if tokio::time::timeout_at(deadline, replaced).await.is_err() {
                return false;
            }
        }
    }
}

/// Clears [`Inner::reconnecting`] when the replacement attempt ends, however it ends (done,
/// failed, or its task dropped with the runtime).
struct ReconnectGuard<C>(Arc<Inner<C>>);

impl<C> Drop for ReconnectGuard<C> {
    fn drop(&mut self) {
        self.0.reconnecting.store(false, Ordering::Release);
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The deadline of a step starting now: one operation timeout for all its round trips.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Runs one round trip of a step on the connection of `generation`, until the step's
    /// `deadline`, and counts its outcome towards replacing that connection.
    pub(super) async fn bounded<T>(
        &self,
        generation: u64,
        deadline: Instant,
        fut: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, OpError> {
        self.refuse_condemned(generation)?;
        let result = timed(deadline, fut).await;
        self.note(generation, result.as_ref().err());
        result
    }

    /// Counts the outcome of a round trip on the connection of `generation` towards
    /// replacing it (a store that cannot reconnect counts nothing).
    ///
    /// A success resets the count; a timeout adds one. The `RECONNECT_AFTER_TIMEOUTS`th in a
    /// row starts a replacement unless one is under way. On a store that finds its primary
    /// through Sentinel, a lost primary ([`OpError::is_primary_lost`]) condemns the connection
    /// and starts a replacement at once.
    /// Other errors leave the count alone (the `ConnectionManager` handles a connection that
    /// fails). Outcomes on a connection already replaced are ignored.
    pub(super) fn note(&self, generation: u64, error: Option<&OpError>) {
        let Some(reconnect) = &self.reconnect else {
            return;
        };
        let inner = &self.inner;
        let current = || inner.generation() == generation;
        match error {
            None => {
                // Read first: the common case writes nothing.
                if inner.timeouts.load(Ordering::Relaxed) != 0 && current() {
                    inner.timeouts.store(0, Ordering::Relaxed);
                }
            }
            Some(e)
                if (e.is_timeout() || (self.follow_primary && e.is_primary_lost()))
                    && current() =>
            {
                let timeouts = inner.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                let lost = self.follow_primary && e.is_primary_lost();
                if lost {
                    inner.condemned.store(generation + 1, Ordering::Release);
                }
                if (lost || timeouts >= RECONNECT_AFTER_TIMEOUTS)
                    && !inner.reconnecting.swap(true, Ordering::AcqRel)
                {
                    self.spawn_reconnect(reconnect, Why::Failing(timeouts));
                }
            }
            Some(_) => {}
        }
    }

    /// Fails a round trip on a condemned connection (see [`Inner::condemned`]) without sending
    /// it, and counts it: each such failure may start the next replacement attempt.
    pub(super) fn refuse_condemned(&self, generation: u64) -> Result<(), OpError> {
        if !self.inner.condemned(generation) {
            return Ok(());
        }
        let e = OpError::Redis(condemned());
        self.note(generation, Some(&e));
        Err(e)
    }

    /// Replaces the connection of `generation`, made for `primary`, when the sentinels name
    /// another primary (see `follow`). The connection is not refused meanwhile: the old
    /// primary still answers, and the replacement takes one lookup. Does nothing while a
    /// replacement is under way.
    #[cfg(feature = "redis-sentinel")]
    pub(super) fn follow(&self, generation: u64, primary: Address) {
        let Some(reconnect) = &self.reconnect else {
            return;
        };
        if self.inner.generation() == generation
            && !self.inner.reconnecting.swap(true, Ordering::AcqRel)
        {
            self.spawn_reconnect(reconnect, Why::Moved(primary));
        }
    }

    /// Makes a replacement connection in a task of its own and puts it in place; on failure,
    /// keeps the current one and starts the count again. The caller set `reconnecting`.
    fn spawn_reconnect(&self, reconnect: &Reconnect<C>, why: Why) {
        let guard = ReconnectGuard(Arc::clone(&self.inner));
        // The `redis` feature's `tokio-comp` brings tokio's runtime; a store is only used in one.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let reconnect = Arc::clone(reconnect);
        let prefix = Arc::clone(&self.prefix);
        runtime.spawn(async move {
            let inner = &guard.0;
            let timeouts = match &why {
                Why::Failing(timeouts) => *timeouts,
                Why::Moved(_) => 0,
            };
            match tokio::time::timeout(RECONNECT_TIMEOUT, reconnect()).await {
                Ok(Ok((_, Some(primary)))) if matches!(&why, Why::Moved(old) if *old == primary) => {
                    // The sentinels disagree while the news of a failover spreads, and the
                    // lookup asked one that still names this primary: keep the connection.
                    tracing::debug!(
                        key_prefix = %prefix,
                        primary = %format_args!("{}:{}", primary.0, primary.1),
                        "Redis Sentinel lookup named the primary in use; keeping the connection",
                    );
                }
                Ok(Ok(made)) => {
                    let primary = made.1.clone();
                    let old = inner.replace(made);
                    match (&why, primary) {
                        (Why::Moved(old), Some(new)) => tracing::warn!(
                            key_prefix = %prefix,
                            from = %format_args!("{}:{}", old.0, old.1),
                            to = %format_args!("{}:{}", new.0, new.1),
                            "Redis connection replaced: the sentinels name another primary",
                        ),
                        _ => tracing::warn!(
                            key_prefix = %prefix,
                            timeouts,
                            "Redis connection replaced after consecutive operation timeouts \
                             (silent or half-open connection) or, through Sentinel, a lost \
                             primary",
                        ),
                    }
                    drop(old);
                }
                Ok(Err(e)) => {
                    inner.timeouts.store(0, Ordering::Relaxed);
                    tracing::warn!(
                        key_prefix = %prefix,
                        timeouts,
                        error = %e,
                        "Redis connection timing out or, through Sentinel, on a primary no \
                         longer named, but a replacement could not be made; keeping it and \
                         trying again after the next timeouts or the next asking",
                    );
                }
                Err(_) => {
                    inner.timeouts.store(0, Ordering::Relaxed);
                    tracing::warn!(
                        key_prefix = %prefix,
                        timeouts,
                        timeout = ?RECONNECT_TIMEOUT,
                        "Redis connection timing out or, through Sentinel, on a primary no \
                         longer named, and making a replacement timed out; keeping it and \
                         trying again after the next timeouts or the next asking",
                    );
                }
            }
        });
    }
}

/// Why a connection is replaced.
enum Why {
    /// Operation timeouts in a row (their number), or a lost primary.
    Failing(u32),
    /// The sentinels name another primary than this one, the connection's, which may still
    /// answer as a primary.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    Moved(Address),
}

/// The error of a round trip refused on a condemned connection: a lost primary. Nothing was
/// sent.
pub(super) fn condemned() -> RedisError {
    super::error::unsent(RedisError::from((
        ::redis::ErrorKind::Io,
        "the connection lost its Redis primary; waiting for Sentinel to name one",
    )))
}

/// A store without its hold on the shared state: what a task of the store's own keeps, so
/// that dropping the last store ends it.
pub(super) struct WeakStore<C> {
    inner: Weak<Inner<C>>,
    settings: RedisStore<()>,
    reconnect: Option<Reconnect<C>>,
}

impl<C> RedisStore<C> {
    /// The store, without keeping its shared state alive.
    pub(super) fn downgrade(&self) -> WeakStore<C> {
        WeakStore {
            inner: Arc::downgrade(&self.inner),
            settings: RedisStore {
                inner: Arc::new(Inner::new(())),
                prefix: Arc::clone(&self.prefix),
                timeout: self.timeout,
                native_claim: self.native_claim,
                pipelining: self.pipelining,
                reconnect: None,
                follow_primary: self.follow_primary,
                replicas: self.replicas,
            },
            reconnect: self.reconnect.clone(),
        }
    }
}

impl<C> WeakStore<C> {
    /// The store, while another still holds it.
    pub(super) fn upgrade(&self) -> Option<RedisStore<C>> {
        let s = &self.settings;
        Some(RedisStore {
            inner: self.inner.upgrade()?,
            prefix: Arc::clone(&s.prefix),
            timeout: s.timeout,
            native_claim: s.native_claim,
            pipelining: s.pipelining,
            reconnect: self.reconnect.clone(),
            follow_primary: s.follow_primary,
            replicas: s.replicas,
        })
    }
}

/// Runs `fut` until `deadline`.
pub(super) async fn timed<T>(
    deadline: Instant,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, OpError> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(OpError::Redis(e)),
        Err(e) => Err(OpError::Elapsed(e)),
    }
}

/// A command waiting in the outbox, where its answer goes, and its caller's deadline. The
/// answer is the server's reply as it came, a server error included (`Value::ServerError`);
/// an `Err` is a failure of the connection.
pub(super) type Queued = (
    ::redis::Cmd,
    oneshot::Sender<Result<Value, RedisError>>,
    Instant,
    Option<WaitArgs>,
);

/// A queued `WAIT numreplicas timeout_ms`: the outbox writes one for all of a batch's.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitArgs {
    pub(super) replicas: usize,
    pub(super) ms: u64,
}

/// The commands queued since the last write.
#[derive(Default)]
pub(super) struct Outbox {
    pub(super) queued: Vec<Queued>,
    /// A flush task is spawned and has not yet taken the queue.
    pub(super) scheduled: bool,
}
