//! The store's failures. It becomes a [`StoreError`] once, keeping the sqlx error as its source.

use crate::store::{StoreError, StoreErrorKind};
use sqlx::mysql::MySqlDatabaseError;
use tokio::time::error::Elapsed;

/// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` ran out. Only the statement is rolled back.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`: InnoDB rolled the whole transaction back.
const DEADLOCK: u16 = 1213;
/// `ER_SERVER_SHUTDOWN`.
const SERVER_SHUTDOWN: u16 = 1053;
/// `ER_QUERY_INTERRUPTED`: `KILL QUERY`.
const QUERY_INTERRUPTED: u16 = 1317;
/// MariaDB's `ER_STATEMENT_TIMEOUT` (`max_statement_time`).
const STATEMENT_TIMEOUT: u16 = 1969;
/// MySQL's `ER_QUERY_TIMEOUT` (`max_execution_time`).
const QUERY_TIMEOUT: u16 = 3024;
/// MariaDB's `ER_CONNECTION_KILLED`: `KILL`, a shutdown.
const CONNECTION_KILLED: u16 = 1927;
/// MySQL's `ER_CLIENT_INTERACTION_TIMEOUT`: `wait_timeout` ended the session.
const CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
/// `ER_NET_READ_INTERRUPTED` and the other network errors of the server's side.
const NET_ERRORS: std::ops::RangeInclusive<u16> = 1152..=1161;

/// Why a statement failed.
#[derive(Debug)]
pub(crate) enum OpError {
    /// The server, the connection or the pool answered an error.
    Sql(sqlx::Error),
    /// No connection could be had for the statement: nothing was sent.
    Connect(sqlx::Error),
    /// The store's operation timeout ran out first.
    Elapsed(Elapsed),
}

impl From<sqlx::Error> for OpError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<Elapsed> for OpError {
    fn from(e: Elapsed) -> Self {
        Self::Elapsed(e)
    }
}

impl OpError {
    fn number(&self) -> Option<u16> {
        match self {
            Self::Sql(e) | Self::Connect(e) => number(e),
            Self::Elapsed(_) => None,
        }
    }

    /// A lock wait ran out: another transaction holds the row (the transactional door answers
    /// "in flight").
    pub(crate) fn is_lock_wait(&self) -> bool {
        self.number() == Some(LOCK_WAIT_TIMEOUT)
    }

    /// InnoDB rolled the statement's transaction back for a deadlock with a concurrent one.
    /// Nothing of it was applied; sent again in a new transaction it may succeed.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Self::Sql(e) if number(e) == Some(DEADLOCK))
    }

    /// The sqlx error of a [conflict](Self::is_conflict); any other failure as it is.
    pub(crate) fn into_conflict(self) -> Result<sqlx::Error, Self> {
        match self {
            Self::Sql(e) if number(&e) == Some(DEADLOCK) => Ok(e),
            other => Err(other),
        }
    }

    /// The store error kind this failure maps to (see the [module docs](super#failures)).
    pub(crate) fn kind(&self) -> StoreErrorKind {
        match self {
            Self::Elapsed(_) => StoreErrorKind::Timeout,
            Self::Sql(e) | Self::Connect(e) => kind_of(e),
        }
    }

    /// The store error for a failure of `op`, keeping the cause as its source.
    pub(crate) fn into_store(self, op: &'static str) -> StoreError {
        let kind = self.kind();
        match self {
            Self::Sql(e) | Self::Connect(e) => StoreError::with_source(kind, op, e),
            Self::Elapsed(e) => StoreError::with_source(kind, op, e),
        }
    }

    /// The statement's connection is gone: the server or the network ended it. Whether the
    /// statement was applied is unknown: MySQL does not say.
    pub(crate) fn lost_connection(&self) -> bool {
        matches!(self, Self::Sql(e) if lost(e))
    }
}

/// Whether a connection that failed with `e` is still usable: only after an error the server
/// answered and that leaves its session open and outside any transaction. A step is several
/// statements in one query; an error stops it where it is, so only errors that roll back no
/// more than their statement keep the connection.
pub(super) fn keeps_connection(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_)) && !lost(e)
}

/// The connection is gone: an I/O or TLS failure, an answer out of protocol, or the server
/// ending the session.
fn lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(_) => number(e).is_some_and(|n| {
            matches!(
                n,
                SERVER_SHUTDOWN | CONNECTION_KILLED | CLIENT_INTERACTION_TIMEOUT
            ) || NET_ERRORS.contains(&n)
        }),
        _ => false,
    }
}

fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Maps a sqlx error to a store error kind.
fn kind_of(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => StoreErrorKind::Timeout,
        sqlx::Error::Database(_) => match number(e) {
            Some(LOCK_WAIT_TIMEOUT | QUERY_INTERRUPTED | STATEMENT_TIMEOUT | QUERY_TIMEOUT) => {
                StoreErrorKind::Timeout
            }
            Some(DEADLOCK) => StoreErrorKind::Conflict,
            // Refused, not ready, out of resources, or the table is missing.
            _ => StoreErrorKind::Unavailable,
        },
        sqlx::Error::Protocol(_)
        | sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_) => StoreErrorKind::Protocol,
        _ => StoreErrorKind::Unavailable,
    }
}

/// An answer the store does not understand.
pub(crate) fn protocol(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_kinds_and_keep_their_source() {
        let timeout = OpError::from(sqlx::Error::PoolTimedOut);
        assert_eq!(timeout.kind(), StoreErrorKind::Timeout);
        let e = timeout.into_store("MySQL claim");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<sqlx::Error>()));
        let reset = OpError::from(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert!(reset.lost_connection());
        assert_eq!(reset.kind(), StoreErrorKind::Unavailable);
        let refused = OpError::Connect(sqlx::Error::Io(
            std::io::ErrorKind::ConnectionRefused.into(),
        ));
        assert!(!refused.lost_connection() && !refused.is_lock_wait() && !refused.is_conflict());
        let decode = OpError::from(sqlx::Error::Decode("bad".into()));
        assert_eq!(decode.kind(), StoreErrorKind::Protocol);
    }
}
