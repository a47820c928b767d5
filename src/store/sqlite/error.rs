//! How the store's failures map to [`StoreErrorKind`].

use crate::store::{StoreError, StoreErrorKind};

/// SQLite's primary result codes the store tells apart (the low byte of an extended code).
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_CORRUPT: i64 = 11;
const SQLITE_NOTADB: i64 = 26;

/// A failed operation: SQLite's error, or the store's own.
#[derive(Debug)]
pub(crate) enum OpError {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for OpError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl From<tokio::time::error::Elapsed> for OpError {
    fn from(e: tokio::time::error::Elapsed) -> Self {
        Self::Store(StoreError::with_source(
            StoreErrorKind::Timeout,
            "SQLite operation timed out",
            e,
        ))
    }
}

impl OpError {
    /// Another connection held the database's write lock past the busy timeout: the
    /// operation applied nothing.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, Self::Sql(e) if busy(e))
    }

    /// [`is_busy`](Self::is_busy) of SQLite's own error.
    pub(crate) fn is_busy_sql(e: &sqlx::Error) -> bool {
        busy(e)
    }

    /// The operation timed out in the store, after it may have been applied.
    pub(crate) fn timed_out(&self) -> bool {
        matches!(self, Self::Store(e) if e.kind() == StoreErrorKind::Timeout)
    }

    pub(crate) fn kind(&self) -> StoreErrorKind {
        match self {
            Self::Sql(e) => kind_of(e),
            Self::Store(e) => e.kind(),
        }
    }

    pub(crate) fn into_store(self, op: &'static str) -> StoreError {
        match self {
            Self::Sql(e) => StoreError::with_source(kind_of(&e), op, e),
            Self::Store(e) => e,
        }
    }
}

fn primary_code(e: &sqlx::Error) -> Option<i64> {
    match e {
        sqlx::Error::Database(db) => db.code()?.parse::<i64>().ok().map(|c| c & 0xff),
        _ => None,
    }
}

fn busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(SQLITE_BUSY | SQLITE_LOCKED))
}

/// Maps a sqlx error to a store error kind.
pub(super) fn kind_of(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::Database(_) => match primary_code(e) {
            // Another connection kept the write lock for the whole busy timeout.
            Some(SQLITE_BUSY | SQLITE_LOCKED) => StoreErrorKind::Timeout,
            // The file is not a database the store can read.
            Some(SQLITE_CORRUPT | SQLITE_NOTADB) => StoreErrorKind::Protocol,
            // Read-only, out of disk, cannot open, a missing table: nothing was applied.
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
        // I/O, a closed pool, a crashed worker thread, configuration.
        _ => StoreErrorKind::Unavailable,
    }
}

/// An answer the store does not understand.
pub(crate) fn protocol(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}
