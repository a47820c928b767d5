//! The connections of a store made by [`connect`](super::MySqlStoreBuilder::connect). A
//! step takes one, sends its one statement and gives it back. Nothing else crosses the wire.
//!
//! A sqlx pool checks a connection with an exchange of its own when it hands it out, and again
//! when it takes it back. A step would then be three exchanges for one statement. Here a
//! connection is checked only when it has been idle for [`CHECK_AFTER_IDLE`]: one a server or
//! a network may have closed unseen. A connection whose session ended is closed, never given
//! back, and the idle ones are checked before their next operation: a shutdown or a switchover ends
//! them all. A new connection gets the store's session settings, as the first did.

use super::error::keeps_connection;
use super::sql;
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// A connection idle this long is checked, with one exchange, before a step takes it.
pub(super) const CHECK_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Up to a fixed number of connections, opened when a step needs one and kept open.
pub(super) struct Connections {
    options: MySqlConnectOptions,
    /// Run on each new connection: the store's session settings.
    setup: String,
    /// The idle connections, the last given back on top, and when each was given back: `None`
    /// when it is to be checked before its next operation.
    idle: Mutex<Vec<(MySqlConnection, Option<Instant>)>>,
    /// One permit per connection a step may hold, open or not yet opened.
    permits: Semaphore,
}

impl Connections {
    /// Up to `size` connections to `options`, starting with `first`.
    pub(super) fn new(
        options: MySqlConnectOptions,
        setup: String,
        size: u32,
        first: MySqlConnection,
    ) -> Self {
        Self {
            options,
            setup,
            idle: Mutex::new(vec![(first, Some(Instant::now()))]),
            permits: Semaphore::new(size as usize),
        }
    }

    /// A connection for one operation: an idle one, else a new one. `fresh` asks for a new one, for
    /// an operation sent again after its connection was lost. It waits for a permit while every
    /// connection is taken.
    pub(super) async fn take(&self, fresh: bool) -> Result<Taken<'_>, sqlx::Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let idle = if fresh {
                None
            } else {
                self.idle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop()
            };
            let Some((mut conn, since)) = idle else {
                break;
            };
            // A connection that fails its check is dropped, which closes its socket.
            let recent = since.is_some_and(|since| since.elapsed() < CHECK_AFTER_IDLE);
            if recent || conn.ping().await.is_ok() {
                return Ok(Taken {
                    owner: self,
                    conn,
                    permit,
                });
            }
        }
        let mut conn = MySqlConnection::connect_with(&self.options).await?;
        sqlx::raw_sql(sql::statement(self.setup.clone()))
            .execute(&mut conn)
            .await?;
        Ok(Taken {
            owner: self,
            conn,
            permit,
        })
    }
}

/// A connection a step holds. [`give_back`](Self::give_back) returns it for the next step.
/// Dropped otherwise, as when its step's timeout ran out, it is closed: it may be in the middle
/// of an exchange.
pub(super) struct Taken<'a> {
    owner: &'a Connections,
    pub(super) conn: MySqlConnection,
    permit: SemaphorePermit<'a>,
}

impl Taken<'_> {
    /// Gives the connection back, unless `failure` shows it broken: only an error the server
    /// answered, and that left the session open, leaves a connection sound. A broken one is
    /// closed, and the idle ones are checked before their next operation: what ended one session,
    /// such as a shutdown, may have ended theirs.
    pub(super) fn give_back(self, failure: Option<&sqlx::Error>) {
        let Taken {
            owner,
            conn,
            permit,
        } = self;
        let mut idle = owner.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_none_or(keeps_connection) {
            idle.push((conn, Some(Instant::now())));
        } else {
            for (_, since) in idle.iter_mut() {
                *since = None;
            }
        }
        drop(idle);
        // The permit goes after the connection: a step waiting for it finds the connection.
        drop(permit);
    }
}
