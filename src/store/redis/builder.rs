//! [`RedisStoreBuilder`]: the settings of a [`RedisStore`], fixed when it is built.

use super::codec::prefix_of;
use super::connection::{Connecting, Inner, Made, Reconnect};
use super::error::OpError;
use super::{DEFAULT_TIMEOUT, RECONNECT_TIMEOUT, RedisStore, WaitReplicas};
use crate::error::ConfigError;
use crate::store::{StoreError, StoreErrorKind};
use ::redis::RedisError;
use ::redis::aio::{ConnectionLike, ConnectionManager};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Builds a [`RedisStore`]: made by [`RedisStore::builder`], each setter names its setting,
/// and the store is built over a connection ([`build`](Self::build)) or connects itself
/// ([`connect`](RedisStoreBuilder::connect), `connect_sentinel`, `connect_cluster`).
///
/// The settings are fixed when the store is built; clones of the store share its connection,
/// never a setting that could change under them.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::redis::RedisStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("orders")
///     .timeout(Duration::from_millis(500))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// assert_eq!(store.timeout(), Duration::from_millis(500));
/// # Ok(()) }
/// ```
#[must_use]
pub struct RedisStoreBuilder<C = ConnectionManager> {
    /// The key prefix made from the store prefix, or why the prefix was refused (reported by
    /// the terminal method).
    prefix: Result<String, ConfigError>,
    timeout: Duration,
    native_claim: bool,
    /// `None`: the terminal method's default (on for `connect`, off otherwise).
    pipelining: Option<bool>,
    reconnect: Option<Reconnect<C>>,
    /// Set by `connect_sentinel`: the reconnect finds the primary anew.
    follow_primary: bool,
    replicas: Option<WaitReplicas>,
}

impl<C> RedisStoreBuilder<C> {
    /// A builder for a store keeping its records under `prefix`, with the default settings.
    ///
    /// The prefix names the application. Two applications sharing one Redis need different
    /// prefixes, or they would answer each other's requests. An empty prefix is refused when
    /// the store is built, with a [`ConfigError`] of kind
    /// [`InvalidName`](crate::ConfigErrorKind::InvalidName).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix_of(prefix),
            timeout: DEFAULT_TIMEOUT,
            native_claim: true,
            pipelining: None,
            reconnect: None,
            follow_primary: false,
            replicas: None,
        }
    }

    /// Bounds every store step (claim, complete, release, renew) to `timeout`, including the
    /// script load and retry a step may need; a step that takes longer fails with
    /// [`StoreErrorKind::Timeout`]. Default: 1 s. At least 1 ms.
    ///
    /// Keep it well below the lease: a claim must not outlive the lease it takes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Sends claims as Redis's native `SET … NX PX … GET` (`true`, the default, on Redis 7.0
    /// and newer) or as a Lua script (`false`). The default falls back to the script by itself
    /// when the server refuses the syntax; choose `false` where something in front of Redis
    /// (a proxy) rejects it in another way.
    ///
    /// Both answer alike; the script costs the server more per claim (see the
    /// [module docs](super)).
    ///
    /// ```no_run
    /// use tower_idempotency::store::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Behind a proxy that rejects `SET … NX … GET` without saying "syntax error".
    /// let store = RedisStore::builder("orders")
    ///     .native_claim(false)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// assert!(!store.native_claim());
    /// # Ok(()) }
    /// ```
    pub fn native_claim(mut self, native: bool) -> Self {
        self.native_claim = native;
        self
    }

    /// Queues the commands of concurrent requests and writes them to Redis together, as one
    /// pipeline per round of the runtime's scheduler, instead of one write per command.
    /// On by default for [`connect`](RedisStoreBuilder::connect), off for
    /// [`build`](Self::build) and `connect_cluster` (a cluster connection cannot take one
    /// pipeline of keys in many slots). See the [module docs](super#pipelining).
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
    /// let store = RedisStore::builder("orders").pipelining(true).build(conn)?;
    /// assert!(store.pipelining());
    /// # Ok(()) }
    /// ```
    pub fn pipelining(mut self, on: bool) -> Self {
        self.pipelining = Some(on);
        self
    }

    /// Makes each complete return only once `replicas` replicas hold the record, waiting at
    /// most `timeout` for them (Redis `WAIT`, sent with the write in one round trip). Fewer
    /// in time: the complete fails with [`StoreErrorKind::NotReplicated`]. Each recorded
    /// step of a request's work waits alike (see [Steps](super#steps)). Default: off
    /// (nothing waits). `replicas` 0 turns it off. `timeout` at least 1 ms; at most a third
    /// of the operation timeout, and three quarters of the time left when `WAIT` is sent.
    ///
    /// What it buys: a record the store acknowledged survives a failover. Redis replicates
    /// asynchronously, so a replica promoted after the primary dies may lack the last
    /// records; their next repeats would run again. With this on, an acknowledged record
    /// is on `replicas` replicas, and Sentinel promotes one of them. Choose at least 1, and
    /// no more than the replicas you run, or every complete fails.
    ///
    /// What it costs: one replica round trip added to every fresh request, and one to each
    /// recorded step. The writes that wait go on a connection of their own, made the way the
    /// store makes its connection, so a `WAIT` never holds the claims and other operations. One
    /// batch waits at a time on it: the writes queued meanwhile share the next `WAIT`, so a
    /// complete waits at most about two `WAIT` bounds. Each batch asks the primary which
    /// replicas are in sync (`ROLE`); while fewer than `replicas` are, the writes are sent
    /// without a `WAIT` and fail `NotReplicated` at once, rather than each waiting its whole
    /// `timeout` (after a failover, the new primary has no replica until the old one rejoins
    /// and syncs, seconds later). A store built over a connection without
    /// [`reconnect`](Self::reconnect) cannot make another, and sends the `WAIT` on its one
    /// connection, where the operations behind it wait too.
    ///
    /// A failed complete still answers the caller with the handler's response. With
    /// `NotReplicated` the record is on the primary: repeats replay it, and it reaches the
    /// replicas as they catch up. If the primary dies before a replica has it, the record is
    /// lost and a repeat runs again: only acknowledged records are kept. `NotReplicated` in the
    /// logs and the `not_replicated` metric count them. So that a failover keeps acknowledged
    /// records and the store keeps acknowledging, run at least `replicas + 1` replicas: with
    /// exactly `replicas`, the promotion of one leaves too few, and every complete fails
    /// `NotReplicated` until the old primary has rejoined as a replica and synced.
    ///
    /// A recorded step that is not acknowledged in time is still returned to the handler,
    /// with a warning. It is on the primary; if the primary dies before a replica has it, a
    /// retry runs the step again.
    ///
    /// Claims do not wait. A claim lost in a failover lets a repeat that arrives while
    /// the first run is still working run too; a record is never lost once acknowledged.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder("orders")
    ///     .wait_for_replicas(1, Duration::from_millis(200))
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// assert_eq!(store.wait_for_replicas(), Some((1, Duration::from_millis(200))));
    /// # Ok(()) }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then(|| WaitReplicas {
            count: replicas,
            timeout: timeout.max(Duration::from_millis(1)),
        });
        self
    }

    /// Replaces the connection with one made by `connect` after 2 operation timeouts in a row
    /// (see the [module docs](super#failures)). This is for a connection that can go silent
    /// without failing (half-open), which its own reconnection never notices.
    /// [`connect`](RedisStoreBuilder::connect) and `connect_cluster` set one by themselves (a
    /// new connection from the same URL or nodes); this one takes its place.
    ///
    /// `connect` runs in a task of its own, one at a time, bounded by 5 s. When it fails or times out the store keeps its connection and tries again after the next
    /// run of timeouts.
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
    /// let store = RedisStore::builder("orders")
    ///     .reconnect(move || ConnectionManager::new_with_config(client.clone(), config.clone()))
    ///     .build(conn)?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn reconnect<F, Fut>(mut self, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<C, RedisError>> + Send + 'static,
    {
        self.reconnect = Some(Arc::new(move || -> Connecting<C> {
            let conn = connect();
            // Made by the caller: no primary the sentinels named.
            Box::pin(async move { Ok((conn.await?, None)) })
        }));
        self
    }
}

impl<C> RedisStoreBuilder<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The store over an existing connection. Pipelining is off unless set (a cluster
    /// connection cannot take it); the connection is kept as given unless
    /// [`reconnect`](Self::reconnect) is set.
    ///
    /// # Errors
    /// A [`ConfigError`] when the prefix is empty.
    pub fn build(self, conn: C) -> Result<RedisStore<C>, ConfigError> {
        self.build_made((conn, None))
    }

    /// The store over a connection made for the primary the sentinels named.
    fn build_made(self, made: Made<C>) -> Result<RedisStore<C>, ConfigError> {
        let prefix = self.prefix?;
        Ok(RedisStore {
            inner: Arc::new(Inner::made(made)),
            prefix: prefix.into(),
            timeout: self.timeout,
            native_claim: self.native_claim,
            pipelining: self.pipelining.unwrap_or(false),
            reconnect: self.reconnect,
            follow_primary: self.follow_primary,
            replicas: self.replicas,
        })
    }
}

impl RedisStoreBuilder<ConnectionManager> {
    /// Connects to the Redis at `url` (`redis://host:port/db`, `rediss://` with a TLS feature
    /// of the `redis` crate) through a [`ConnectionManager`], which reconnects by itself after
    /// Redis comes back. Pipelining is on unless set.
    ///
    /// Each connection attempt is bounded by 1 s, and a lost connection is
    /// retried twice with a short back-off before calls fail fast (the next call then tries
    /// again). Responses are bounded by the store's operation timeout, not by the connection.
    /// A connection that only times out (half-open) is replaced by a new `ConnectionManager`
    /// from the same URL after a run of timeouts (see the [module docs](super#failures)),
    /// unless [`reconnect`](Self::reconnect) says otherwise. For other connection settings,
    /// build a `ConnectionManager` and use [`build`](Self::build).
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`]), the URL is invalid
    /// or the server cannot be reached. `Timeout` when connecting takes longer than 5 s.
    pub async fn connect(mut self, url: &str) -> Result<RedisStore, StoreError> {
        if let Err(e) = &self.prefix {
            return Err(invalid_prefix(e.clone()));
        }
        let client = ::redis::Client::open(url)
            .map_err(|e| OpError::from(e).into_store("invalid Redis URL"))?;
        let config = manager_config();
        let connect = move || ConnectionManager::new_with_config(client.clone(), config.clone());
        let conn = tokio::time::timeout(RECONNECT_TIMEOUT, connect())
            .await
            .map_err(|e| OpError::from(e).into_store("connecting to Redis timed out"))?
            .map_err(|e| OpError::from(e).into_store("connecting to Redis failed"))?;
        if self.reconnect.is_none() {
            self = self.reconnect(connect);
        }
        self.pipelining = Some(self.pipelining.unwrap_or(true));
        self.build(conn).map_err(invalid_prefix)
    }
}

/// The settings of every `ConnectionManager` the store makes: each connection attempt bounded
/// by 1 s, a lost connection retried twice with a short back-off, responses bounded by the
/// store's operation timeout instead.
fn manager_config() -> ::redis::aio::ConnectionManagerConfig {
    ::redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

#[cfg(feature = "redis-sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
impl RedisStoreBuilder<ConnectionManager> {
    /// Connects to the primary that the Redis Sentinels at `sentinels` (`redis://host:26379`
    /// each) name for `service_name`, and follows it across a failover. `primary` carries
    /// what the primary itself needs (password, database, TLS), as in
    /// [`SentinelClient::build`](::redis::sentinel::SentinelClient::build); `None` for none.
    /// Pipelining is on unless set.
    ///
    /// The connection is a [`ConnectionManager`] to the primary found, as
    /// [`connect`](RedisStoreBuilder::connect) makes. After 2 failed steps in a row that say
    /// the primary is gone (a timeout, a refused or dropped connection, `READONLY` from a
    /// demoted primary), the store asks the sentinels again and connects to the primary they
    /// name, in the background, bounded by 5 s (see the [module docs](super#sentinel)).
    /// Until then steps fail with `Unavailable` or `Timeout`; the store needs no restart.
    /// The store also asks the sentinels every second which primary they name, and moves to
    /// it when it is not the one it is connected to: an old primary that still answers as a
    /// primary fails nothing, so the operations alone would never leave it.
    /// [`reconnect`](Self::reconnect) takes the place of that lookup, and of the asking.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = [
    ///     "redis://10.0.0.1:26379",
    ///     "redis://10.0.0.2:26379",
    ///     "redis://10.0.0.3:26379",
    /// ];
    /// let store = RedisStore::builder("orders")
    ///     .wait_for_replicas(1, Duration::from_millis(200))
    ///     .connect_sentinel(sentinels, "mymaster", None)
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`]), a sentinel URL is
    /// invalid, or no sentinel names a primary that answers as one. `Timeout` when connecting
    /// takes longer than 5 s.
    pub async fn connect_sentinel<I, T>(
        mut self,
        sentinels: I,
        service_name: &str,
        primary: Option<::redis::sentinel::SentinelNodeConnectionInfo>,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        if let Err(e) = &self.prefix {
            return Err(invalid_prefix(e.clone()));
        }
        let invalid = |e| OpError::from(e).into_store("invalid Redis Sentinel addresses");
        let sentinels = sentinels
            .into_iter()
            .map(::redis::IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let sentinel = ::redis::sentinel::SentinelClient::build(
            sentinels.clone(),
            service_name.to_owned(),
            primary,
            ::redis::sentinel::SentinelServerType::Master,
        )
        .map_err(invalid)?;
        let sentinel = Arc::new(tokio::sync::Mutex::new(sentinel));
        let connect = move || -> Connecting<ConnectionManager> {
            let sentinel = Arc::clone(&sentinel);
            Box::pin(async move {
                // One lookup at a time; the sentinels verify the primary's role.
                let client = sentinel.lock().await.async_get_client().await?;
                let primary = super::follow::address(client.get_connection_info());
                let conn = ConnectionManager::new_with_config(client, manager_config()).await?;
                Ok((conn, primary))
            })
        };
        let made = tokio::time::timeout(RECONNECT_TIMEOUT, connect())
            .await
            .map_err(|e| {
                OpError::from(e).into_store("connecting through Redis Sentinel timed out")
            })?
            .map_err(|e| OpError::from(e).into_store("connecting through Redis Sentinel failed"))?;
        // A connection of the caller's making does not say which primary it is for: nothing
        // to compare the sentinels' answer with.
        let follow = self.reconnect.is_none();
        if follow {
            self.reconnect = Some(Arc::new(connect));
        }
        self.follow_primary = true;
        self.pipelining = Some(self.pipelining.unwrap_or(true));
        let store = self.build_made(made).map_err(invalid_prefix)?;
        if follow {
            super::follow::spawn(&store, sentinels, service_name.to_owned());
        }
        Ok(store)
    }
}

#[cfg(feature = "redis-cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
impl RedisStoreBuilder<::redis::cluster_async::ClusterConnection> {
    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port` each); the
    /// client learns the rest of the cluster from them and follows slot moves and failovers.
    /// Pipelining is off unless set.
    ///
    /// Connection attempts and responses are bounded by 1 s. A connection that
    /// only times out (half-open) is replaced by a new `ClusterConnection` from the same nodes
    /// after a run of timeouts, as [`connect`](RedisStoreBuilder::connect) does (see the
    /// [module docs](super#failures)), unless [`reconnect`](Self::reconnect) says otherwise.
    /// For other settings, build a `ClusterConnection` with
    /// [`redis::cluster::ClusterClient::builder`] and use [`build`](Self::build).
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty (source: a [`ConfigError`]), a node URL is
    /// invalid or no node can be reached. `Timeout` when connecting takes longer than 5 s.
    pub async fn connect_cluster<I, T>(
        mut self,
        nodes: I,
    ) -> Result<RedisStore<::redis::cluster_async::ClusterConnection>, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        if let Err(e) = &self.prefix {
            return Err(invalid_prefix(e.clone()));
        }
        let client = ::redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(DEFAULT_TIMEOUT)
            .response_timeout(DEFAULT_TIMEOUT)
            .build()
            .map_err(|e| OpError::from(e).into_store("invalid Redis Cluster nodes"))?;
        let conn = tokio::time::timeout(RECONNECT_TIMEOUT, client.get_async_connection())
            .await
            .map_err(|e| OpError::from(e).into_store("connecting to Redis Cluster timed out"))?
            .map_err(|e| OpError::from(e).into_store("connecting to Redis Cluster failed"))?;
        // The cluster client reconnects a node after an error, never after a timeout: a
        // silent connection needs replacing as a standalone one does.
        if self.reconnect.is_none() {
            self = self.reconnect(move || {
                let client = client.clone();
                async move { client.get_async_connection().await }
            });
        }
        self.build(conn).map_err(invalid_prefix)
    }
}

impl<C> fmt::Debug for RedisStoreBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("native_claim", &self.native_claim)
            .field("pipelining", &self.pipelining)
            .field("reconnects", &self.reconnect.is_some())
            .field("sentinel", &self.follow_primary)
            .field("replicas", &self.replicas)
            .finish()
    }
}

fn invalid_prefix(e: ConfigError) -> StoreError {
    StoreError::with_source(StoreErrorKind::Unavailable, "invalid prefix", e)
}
