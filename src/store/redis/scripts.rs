//! The Lua scripts, sent as `EVALSHA` and loaded when the server answers `NOSCRIPT`.
//!
//! Each script touches one record's keys, all in one cluster slot. The record's scripts check
//! the claim's token before they write (see the [module docs](super#one-round-trip-per-step));
//! the steps' scripts do not, as a step's first record wins whoever holds the key.

use super::RedisStore;
use super::codec::Arg;
use super::error::OpError;
use ::redis::aio::ConnectionLike;
use ::redis::{Script, Value};
use std::sync::LazyLock;
use tokio::time::Instant;

/// Claim (servers that refuse `SET … NX … GET`, or by choice): `GET`, and `SET NX PX` when
/// absent.
pub(super) static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("claim.lua")));
/// Complete: write the done value if the token holds the key pending, or nothing does.
pub(super) static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("complete.lua")));
/// Release: delete the key if the token holds it pending.
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));
/// Forget: delete the key's record (a pending claim only when asked) and its steps.
pub(super) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("forget.lua")));
/// The lease left on a pending claim (asked only for a request found in flight).
pub(super) static LEASE_LEFT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lease_left.lua")));
/// Inspect: the key's value and the time it has left, changing nothing.
pub(super) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("inspect.lua")));
/// Renew: extend the lease if the token holds the key pending.
pub(super) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("renew.lua")));
/// Record a step unless it is recorded, else answer the first record.
pub(super) static RECORD_STEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("record_step.lua")));
/// A key's steps, read on the primary.
pub(super) static STEPS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("steps.lua")));

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs `script` on `keys` (one record's, in one slot) with `args`: `EVALSHA` (pipelined
    /// when the store pipelines); on `NOSCRIPT`, loads the script and runs it again. All of it by the step's `deadline`:
    /// loading a script never stretches a step past its operation timeout.
    pub(super) async fn eval(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        deadline: Instant,
    ) -> Result<Value, OpError> {
        let cmd = evalsha(script, keys, args);
        match self.query(cmd, deadline).await {
            // The server does not have the script yet (first use, restart, SCRIPT FLUSH):
            // `invoke_async` loads it and runs it again.
            Err(e) if e.is_no_script() => {
                let mut invocation = script.prepare_invoke();
                for k in keys {
                    invocation.key(*k);
                }
                for a in args {
                    invocation.arg(a);
                }
                let (generation, mut conn) = self.inner.checkout();
                self.bounded(generation, deadline, invocation.invoke_async(&mut conn))
                    .await
            }
            other => other,
        }
    }
}

/// `EVALSHA sha numkeys keys… args…`, its buffers sized once: a done value is written into
/// the command where it goes, with no growing and no copy of its own.
pub(super) fn evalsha(script: &Script, keys: &[&[u8]], args: &[Arg<'_>]) -> ::redis::Cmd {
    let hash = script.get_hash();
    let data = 7
        + hash.len()
        + 1
        + keys.iter().map(|k| k.len()).sum::<usize>()
        + args.iter().map(Arg::len).sum::<usize>();
    let mut cmd = ::redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
    cmd.arg("EVALSHA").arg(hash).arg(keys.len());
    for k in keys {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(a);
    }
    cmd
}
