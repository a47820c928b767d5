//! Failures inside the store, and the one place they become [`StoreError`]s.
//!
//! Inside the store a failed round trip stays an [`OpError`], so a caller that must tell
//! `NOSCRIPT` or a syntax error from other failures reads the [`RedisError`] itself. It becomes
//! a [`StoreError`] once, at the edge of a public method, keeping the Redis error as its source.

use crate::store::{StoreError, StoreErrorKind};
use ::redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::time::error::Elapsed;

/// Why a round trip failed.
#[derive(Debug)]
pub(super) enum OpError {
    /// Redis, or the connection to it, answered an error.
    Redis(RedisError),
    /// The operation timeout ran out first.
    Elapsed(Elapsed),
}

impl From<RedisError> for OpError {
    fn from(e: RedisError) -> Self {
        Self::Redis(e)
    }
}

impl From<Elapsed> for OpError {
    fn from(e: Elapsed) -> Self {
        Self::Elapsed(e)
    }
}

impl OpError {
    /// The operation timeout, or an I/O timeout: what counts towards replacing a connection.
    pub(super) fn is_timeout(&self) -> bool {
        match self {
            Self::Elapsed(_) => true,
            Self::Redis(e) => e.is_timeout(),
        }
    }

    /// The primary is gone or no longer the primary: the connection dropped or was refused
    /// (an I/O error), or the server answered `READONLY` (a demoted primary). A store that
    /// finds its primary through Sentinel counts these as it counts timeouts.
    pub(super) fn is_primary_lost(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_io_error()
            || e.is_connection_dropped()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
    }

    /// The command was never sent (its connection had lost its primary, or could not be
    /// made), or the server refused it as a replica (`READONLY`) before running it: nothing
    /// was applied, and sending it again on the next connection is safe.
    pub(super) fn is_unsent(&self) -> bool {
        matches!(self, Self::Redis(e) if is_unsent(e)
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
    }

    /// The server does not hold the script (`NOSCRIPT`).
    pub(super) fn is_no_script(&self) -> bool {
        matches!(self, Self::Redis(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
    }

    /// The server refused a command's syntax (`ERR syntax error`): it did not run.
    pub(super) fn is_syntax_error(&self) -> bool {
        matches!(self, Self::Redis(e) if e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| d.to_ascii_lowercase().starts_with("syntax error")))
    }

    /// The server refused the command: not allowed (ACL), or with an error code the client
    /// does not classify (what a managed Redis answers for a disabled `CONFIG`, or `OOM`).
    pub(super) fn is_refused(&self) -> bool {
        matches!(self, Self::Redis(e) if matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::Extension
        ))
    }

    /// The store error kind this failure maps to (see the [module docs](super#failures)).
    pub(super) fn kind(&self) -> StoreErrorKind {
        match self {
            Self::Elapsed(_) => StoreErrorKind::Timeout,
            Self::Redis(e) => kind_of(e),
        }
    }

    /// The store error for a failure of `op`, keeping the cause as its source.
    pub(super) fn into_store(self, op: &'static str) -> StoreError {
        let kind = self.kind();
        match self {
            Self::Redis(e) => StoreError::with_source(kind, op, e),
            Self::Elapsed(e) => StoreError::with_source(kind, op, e),
        }
    }
}

/// Maps a Redis error to a store error kind.
fn kind_of(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
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
}

/// What the description of an error says when its command was never sent.
const UNSENT: &str = "command not sent";

/// `e`, marked as the error of a command that was never sent (see [`OpError::is_unsent`]).
pub(super) fn unsent(e: RedisError) -> RedisError {
    RedisError::from((ErrorKind::Io, UNSENT, e.to_string()))
}

fn is_unsent(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Io && e.to_string().contains(UNSENT)
}

/// An answer the store does not understand.
pub(super) fn protocol(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(line: &[u8]) -> OpError {
        match ::redis::parse_redis_value(line).and_then(::redis::Value::extract_error) {
            Err(e) => OpError::Redis(e),
            Ok(v) => panic!("not an error: {v:?}"),
        }
    }

    #[test]
    fn recognises_the_errors_the_store_acts_on() {
        let no_script = server_error(b"-NOSCRIPT No matching script.\r\n");
        assert!(no_script.is_no_script() && !no_script.is_syntax_error());
        assert_eq!(no_script.kind(), StoreErrorKind::Protocol);

        let syntax = server_error(b"-ERR syntax error\r\n");
        assert!(syntax.is_syntax_error() && !syntax.is_no_script());

        let denied = server_error(b"-NOPERM no permissions to run 'config'\r\n");
        assert!(denied.is_refused());
        assert_eq!(denied.kind(), StoreErrorKind::Unavailable);

        let demoted = server_error(b"-READONLY You can't write against a read only replica.\r\n");
        assert!(demoted.is_primary_lost() && !demoted.is_timeout());
        assert_eq!(demoted.kind(), StoreErrorKind::Unavailable);
        assert!(!denied.is_primary_lost() && !no_script.is_primary_lost());
        assert!(demoted.is_unsent() && !denied.is_unsent() && !no_script.is_unsent());

        let oom = server_error(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n");
        assert!(!oom.is_timeout() && !oom.is_no_script());
        assert_eq!(oom.kind(), StoreErrorKind::Unavailable);
    }

    #[test]
    fn timeouts_of_either_origin_are_timeouts() {
        let io = OpError::Redis(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )));
        assert!(io.is_timeout());
        let refused = OpError::Redis(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(refused.is_primary_lost() && !refused.is_timeout());
        assert_eq!(io.kind(), StoreErrorKind::Timeout);
        assert!(!io.is_unsent() && !refused.is_unsent());
        let never_sent = OpError::Redis(unsent(RedisError::from((
            ErrorKind::Io,
            "the connection lost its primary",
        ))));
        assert!(never_sent.is_unsent() && never_sent.is_primary_lost());
        assert_eq!(never_sent.kind(), StoreErrorKind::Unavailable);
        let e = io.into_store("Redis claim");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.is::<RedisError>()));
    }
}
