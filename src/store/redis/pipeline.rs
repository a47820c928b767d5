//! Sending commands: one by one, or queued and written together as one pipeline (see the
//! [module docs](super#pipelining)).

use super::RedisStore;
use super::connection::Inner;
use super::error::OpError;
use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, RedisError, Value};
use std::sync::{Arc, PoisonError};
use tokio::sync::oneshot;
use tokio::time::Instant;

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Sends one command of a step: through the outbox when pipelining (inside a Tokio
    /// runtime), directly otherwise; bounded by the step's `deadline` either way.
    pub(super) async fn query(
        &self,
        cmd: ::redis::Cmd,
        deadline: Instant,
    ) -> Result<Value, OpError> {
        if self.pipelining
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let generation = self.inner.generation();
            let answer = self.inner.enqueue(&runtime, cmd, deadline);
            return self
                .bounded(generation, deadline, async move {
                    answer.await.unwrap_or_else(|_| {
                        Err(RedisError::from((
                            ErrorKind::Io,
                            "the pipeline carrying the command was dropped",
                        )))
                    })
                })
                .await;
        }
        let (generation, mut conn) = self.inner.checkout();
        self.bounded(generation, deadline, cmd.query_async(&mut conn))
            .await
    }
}

impl<C> Inner<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Queues `cmd` for the next write, spawning the task that writes it unless one is
    /// already waiting to.
    fn enqueue(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        cmd: ::redis::Cmd,
        deadline: Instant,
    ) -> oneshot::Receiver<Result<Value, RedisError>> {
        let (tx, rx) = oneshot::channel();
        let spawn = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            outbox.queued.push((cmd, tx, deadline));
            !std::mem::replace(&mut outbox.scheduled, true)
        };
        if spawn {
            runtime.spawn(Arc::clone(self).flush());
        }
        rx
    }

    /// Writes everything queued as one pipeline and hands each caller its own answer.
    async fn flush(self: Arc<Self>) {
        // Yield once: the tasks that are ready now run first and queue their commands, so
        // a busy server writes one pipeline per round of its scheduler, not one per command.
        tokio::task::yield_now().await;
        let queued = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            outbox.scheduled = false;
            std::mem::take(&mut outbox.queued)
        };
        // Bounded like its callers: a silent connection must not keep this task (and the
        // connection it holds) alive after every caller has given up.
        let Some(limit) = queued.iter().map(|q| q.2).max() else {
            return;
        };
        let (_, mut conn) = self.checkout();
        if let [(cmd, _, _)] = &queued[..] {
            // A server error comes back as a value; make it the caller's error.
            let answer = tokio::time::timeout_at(limit, conn.req_packed_command(cmd))
                .await
                .unwrap_or_else(|_| Err(elapsed()))
                .and_then(Value::extract_error);
            if let Some((_, tx, _)) = queued.into_iter().next() {
                let _ = tx.send(answer);
            }
            return;
        }
        let mut pipe = ::redis::pipe();
        let mut senders = Vec::with_capacity(queued.len());
        for (cmd, tx, _) in queued {
            pipe.add_command(cmd);
            senders.push(tx);
        }
        let answers =
            tokio::time::timeout_at(limit, conn.req_packed_commands(&pipe, 0, senders.len()))
                .await
                .unwrap_or_else(|_| Err(elapsed()));
        match answers {
            Ok(answers) if answers.len() == senders.len() => {
                for (answer, tx) in answers.into_iter().zip(senders) {
                    // A command's own error (NOSCRIPT, OOM, …) goes to its caller only.
                    let _ = tx.send(answer.extract_error());
                }
            }
            Ok(_) => {
                let e = RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline was answered with the wrong number of replies",
                ));
                for tx in senders {
                    let _ = tx.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for tx in senders {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The error of a pipeline that outlived its callers' timeouts.
fn elapsed() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the pipeline timed out",
    ))
}
