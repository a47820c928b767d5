//! Following a failover away from a primary that still answers (see the
//! [module docs](super#sentinel)).
//!
//! After a promotion the old primary may go on answering as a primary: cut off from the
//! sentinels, or not reconfigured yet. Nothing the store sends there fails, so its operations never
//! tell it to look again; every store connected there keeps writing where the others no longer
//! read. A task of the store's own therefore asks the sentinels, every [`FOLLOW_INTERVAL`],
//! which primary they name, and replaces the connection when it was made for another one.

use super::connection::{Address, WeakStore};
use super::{DEFAULT_TIMEOUT, RedisStore};
use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo};
use std::time::Duration;

/// How often a store connected through Sentinel asks the sentinels for the primary.
pub(crate) const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);

/// The host and port in `info`; `None` for a Unix socket (the sentinels name none).
pub(super) fn address(info: &ConnectionInfo) -> Option<Address> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// Starts the task that follows the primary the sentinels name for `service` (see the
/// module docs). It holds the store weakly: dropping the last clone of the store ends it.
pub(super) fn spawn<C>(store: &RedisStore<C>, sentinels: Vec<ConnectionInfo>, service: String)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let follower = Follower {
        store: store.downgrade(),
        sentinels: sentinels.into_iter().map(|info| (info, None)).collect(),
        service,
    };
    runtime.spawn(follower.run());
}

struct Follower<C> {
    store: WeakStore<C>,
    /// Each sentinel, in the order given, and a connection to it once made.
    sentinels: Vec<(ConnectionInfo, Option<MultiplexedConnection>)>,
    service: String,
}

impl<C> Follower<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(mut self) {
        loop {
            tokio::time::sleep(FOLLOW_INTERVAL).await;
            let Some((generation, Some(primary))) = self.store.upgrade().map(|s| s.inner.primary())
            else {
                // The store is gone; or its connection was not made through a lookup.
                return;
            };
            let Some(named) = self.ask().await else {
                continue;
            };
            if named == primary {
                continue;
            }
            let Some(store) = self.store.upgrade() else {
                return;
            };
            store.follow(generation, primary);
        }
    }

    /// The primary the first sentinel that answers names, in the order given, as the lookup
    /// that makes a connection asks them; `None` when none answers with one. Each sentinel
    /// gets at most the default operation timeout.
    async fn ask(&mut self) -> Option<Address> {
        let mut cmd = ::redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.service);
        for (info, cached) in &mut self.sentinels {
            let answer = tokio::time::timeout(DEFAULT_TIMEOUT, async {
                if cached.is_none() {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
                        .set_response_timeout(Some(DEFAULT_TIMEOUT));
                    let conn = Client::open(info.clone())?
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    *cached = Some(conn);
                }
                let Some(conn) = cached.as_mut() else {
                    return Ok(None);
                };
                cmd.query_async::<Option<(String, u16)>>(conn).await
            })
            .await;
            match answer {
                Ok(Ok(Some(named))) => return Some(named),
                // This sentinel does not know the service: ask the next.
                Ok(Ok(None)) => {}
                Ok(Err(_)) | Err(_) => *cached = None,
            }
        }
        None
    }
}
