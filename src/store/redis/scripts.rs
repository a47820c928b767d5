//! The Lua scripts, sent as `EVALSHA` and loaded when the server answers `NOSCRIPT`.
//!
//! Each script touches one key, so it runs on that key's cluster slot; each checks the
//! claim's token before it writes (see the [module docs](super#one-round-trip-per-step)).

use super::RedisStore;
use super::codec::{Arg, KeyBytes};
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
/// Forget: delete the key's record (a pending claim only when asked).
pub(super) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("forget.lua")));
/// The lease left on a pending claim (asked only for a request found in flight).
pub(super) static LEASE_LEFT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lease_left.lua")));
/// Renew: extend the lease if the token holds the key pending.
pub(super) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("renew.lua")));

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs `script` on `key` with `args`: `EVALSHA` (pipelined when the store pipelines);
    /// on `NOSCRIPT`, loads the script and runs it again. All of it by the step's `deadline`:
    /// loading a script never stretches a step past its operation timeout.
    pub(super) async fn eval(
        &self,
        script: &Script,
        key: &KeyBytes,
        args: &[Arg<'_>],
        deadline: Instant,
    ) -> Result<Value, OpError> {
        let cmd = evalsha(script, key, args);
        match self.query(cmd, deadline).await {
            // The server does not have the script yet (first use, restart, SCRIPT FLUSH):
            // `invoke_async` loads it and runs it again.
            Err(e) if e.is_no_script() => {
                let mut invocation = script.key(key.as_bytes());
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

/// `EVALSHA sha 1 key args…`, its buffers sized once: a done value is written into the
/// command where it goes, with no growing and no copy of its own.
pub(super) fn evalsha(script: &Script, key: &KeyBytes, args: &[Arg<'_>]) -> ::redis::Cmd {
    let hash = script.get_hash();
    let data = 7 + hash.len() + 1 + key.as_bytes().len() + args.iter().map(Arg::len).sum::<usize>();
    let mut cmd = ::redis::Cmd::with_capacity(4 + args.len(), data);
    cmd.arg("EVALSHA").arg(hash).arg(1).arg(key.as_bytes());
    for a in args {
        cmd.arg(a);
    }
    cmd
}
