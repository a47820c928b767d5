//! Failures inside the store, and the one place they become [`StoreError`]s.
//!
//! A failed statement stays an [`OpError`] inside the store, so that the store can send again
//! a statement PostgreSQL rolled back for a concurrent transaction, and the transactional door
//! can tell a lock wait that ran out (answered "in flight") from other failures. It becomes a [`StoreError`] once, keeping the sqlx error as its source.

use crate::store::{StoreError, StoreErrorKind};
use sqlx::postgres::{PgDatabaseError, PgSeverity};
use tokio::time::error::Elapsed;

/// `lock_not_available`: a lock wait ran out (`lock_timeout`, or `NOWAIT`).
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `query_canceled`: `statement_timeout`, or a cancel request.
const QUERY_CANCELED: &str = "57014";
/// `serialization_failure`: a row changed after this transaction's snapshot (repeatable read,
/// serializable).
const SERIALIZATION_FAILURE: &str = "40001";
/// `deadlock_detected`.
const DEADLOCK_DETECTED: &str = "40P01";
/// `admin_shutdown`: `pg_terminate_backend`, a smart or fast shutdown.
const ADMIN_SHUTDOWN: &str = "57P01";
/// `crash_shutdown`: another server process crashed, or an immediate shutdown.
const CRASH_SHUTDOWN: &str = "57P02";
/// `cannot_connect_now`: the server is starting or shutting down.
const CANNOT_CONNECT_NOW: &str = "57P03";
/// `idle_session_timeout`.
const IDLE_SESSION_TIMEOUT: &str = "57P05";
/// The class of connection exceptions.
const CONNECTION_EXCEPTION: &str = "08";

/// Why a statement failed.
#[derive(Debug)]
pub(crate) enum OpError {
    /// PostgreSQL, the connection or the pool answered an error.
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
    /// The SQLSTATE of a database error.
    fn code(&self) -> Option<String> {
        match self {
            Self::Sql(e) | Self::Connect(e) => code(e),
            Self::Elapsed(_) => None,
        }
    }

    /// A lock wait ran out: another transaction holds the row (the transactional door answers
    /// "in flight").
    pub(crate) fn is_lock_wait(&self) -> bool {
        self.code().as_deref() == Some(LOCK_NOT_AVAILABLE)
    }

    /// PostgreSQL rolled the statement's transaction back for a concurrent one: a
    /// serialization failure or a deadlock. Nothing of it was applied; sent again in a new
    /// transaction it may succeed.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Self::Sql(e) if conflicted(e))
    }

    /// The sqlx error of a [conflict](Self::is_conflict); any other failure as it is.
    pub(crate) fn into_conflict(self) -> Result<sqlx::Error, Self> {
        match self {
            Self::Sql(e) if conflicted(&e) => Ok(e),
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

    /// The statement's connection is gone: the server or the network ended it.
    pub(crate) fn lost_connection(&self) -> bool {
        matches!(self, Self::Sql(e) if lost(e))
    }

    /// The server ended the session before it could commit the statement. It ends a session for
    /// `pg_terminate_backend`, a shutdown or an idle timeout only between two statements, or
    /// within one, rolling it back: never between a commit and its answer. So the statement was
    /// not applied, and a new connection may send it again.
    pub(crate) fn unapplied(&self) -> bool {
        matches!(
            self.code().as_deref(),
            Some(ADMIN_SHUTDOWN | CANNOT_CONNECT_NOW | IDLE_SESSION_TIMEOUT)
        ) && matches!(self, Self::Sql(_))
    }
}

/// Whether a connection that failed with `e` is still usable: only after an error the server
/// answered and that leaves its session open.
pub(super) fn keeps_connection(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_)) && !lost(e)
}

/// The connection is gone: an I/O or TLS failure, an answer out of protocol, or the server
/// ending the session (a fatal error, a connection exception, a shutdown).
fn lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let fatal = db
                .try_downcast_ref::<PgDatabaseError>()
                .is_some_and(|pg| matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic));
            fatal
                || db.code().is_some_and(|c| {
                    c.starts_with(CONNECTION_EXCEPTION)
                        || matches!(
                            c.as_ref(),
                            ADMIN_SHUTDOWN
                                | CRASH_SHUTDOWN
                                | CANNOT_CONNECT_NOW
                                | IDLE_SESSION_TIMEOUT
                        )
                })
        }
        _ => false,
    }
}

fn conflicted(e: &sqlx::Error) -> bool {
    code(e).is_some_and(|c| matches!(c.as_str(), SERIALIZATION_FAILURE | DEADLOCK_DETECTED))
}

fn code(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Maps a sqlx error to a store error kind.
fn kind_of(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => StoreErrorKind::Timeout,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some(LOCK_NOT_AVAILABLE | QUERY_CANCELED) => StoreErrorKind::Timeout,
            Some(SERIALIZATION_FAILURE | DEADLOCK_DETECTED) => StoreErrorKind::Conflict,
            // Refused, not ready, out of resources, or the table is missing: the operation did
            // not run.
            _ => StoreErrorKind::Unavailable,
        },
        // An answer the store does not understand.
        sqlx::Error::Protocol(_)
        | sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_) => StoreErrorKind::Protocol,
        // Not reachable: I/O, TLS, a closed pool, configuration.
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
    fn timeouts_of_every_origin_are_timeouts() {
        assert_eq!(
            OpError::from(sqlx::Error::PoolTimedOut).kind(),
            StoreErrorKind::Timeout
        );
        let io = OpError::from(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )));
        assert_eq!(io.kind(), StoreErrorKind::Timeout);
        let e = io.into_store("PostgreSQL claim");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<sqlx::Error>()));
    }

    #[test]
    fn other_failures_are_unavailable_or_protocol() {
        let refused = OpError::from(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(refused.kind(), StoreErrorKind::Unavailable);
        assert!(!refused.is_lock_wait() && !refused.is_conflict());
        let closed = OpError::from(sqlx::Error::PoolClosed);
        assert_eq!(closed.kind(), StoreErrorKind::Unavailable);
        let decode = OpError::from(sqlx::Error::Decode("bad".into()));
        assert_eq!(decode.kind(), StoreErrorKind::Protocol);
    }

    #[test]
    fn a_lost_connection_is_unknown_unless_the_server_said_otherwise() {
        let reset = OpError::from(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert!(reset.lost_connection() && !reset.unapplied());
        let sqlx::Error::Io(io) = sqlx::Error::Io(std::io::ErrorKind::UnexpectedEof.into()) else {
            unreachable!()
        };
        assert!(!keeps_connection(&sqlx::Error::Io(io)));
        // No connection was had: nothing to send again on a new one.
        let refused = OpError::Connect(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(!refused.lost_connection());
        assert_eq!(refused.kind(), StoreErrorKind::Unavailable);
        let decode = OpError::from(sqlx::Error::Decode("bad".into()));
        assert!(!decode.lost_connection());
    }
}
