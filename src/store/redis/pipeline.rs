//! Sending commands: one by one, or queued and written together as one pipeline (see the
//! [module docs](super#pipelining)).

use super::RedisStore;
use super::connection::{Inner, Queued, WaitArgs, condemned, timed};
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
            self.refuse_condemned(generation)?;
            let [answer] = self.inner.enqueue(&runtime, [cmd], None, deadline);
            return self
                .bounded(generation, deadline, async move {
                    received(answer.await).and_then(Value::extract_error)
                })
                .await;
        }
        let (generation, mut conn) = self.inner.checkout();
        self.bounded(generation, deadline, cmd.query_async(&mut conn))
            .await
    }

    /// Sends the commands of a step together, in order, on one connection and in one write
    /// (one pipeline of their own, or one of the outbox's); bounded by the step's `deadline`.
    ///
    /// Each reply comes as the server sent it, a server error included. An `Err` is a failure
    /// of the connection. The first server error is what counts towards replacing the
    /// connection (a `READONLY` from a demoted primary). `wait`: the last command is that
    /// `WAIT`, which the outbox may share with the other steps of its batch.
    pub(super) async fn query_all<const N: usize>(
        &self,
        cmds: [::redis::Cmd; N],
        wait: Option<WaitArgs>,
        deadline: Instant,
    ) -> Result<[Value; N], OpError> {
        let (generation, result) = if self.pipelining
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let generation = self.inner.generation();
            self.refuse_condemned(generation)?;
            let answers = self.inner.enqueue(&runtime, cmds, wait, deadline);
            let result = timed(deadline, async move {
                let mut values = Vec::with_capacity(N);
                for answer in answers {
                    values.push(received(answer.await)?);
                }
                Ok(values)
            })
            .await;
            (generation, result)
        } else {
            let (generation, mut conn) = self.inner.checkout();
            self.refuse_condemned(generation)?;
            let mut pipe = ::redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            let result = timed(deadline, async move {
                conn.req_packed_commands(&pipe, 0, N).await
            })
            .await;
            (generation, result)
        };
        let values = result.and_then(|values| {
            <[Value; N]>::try_from(values).map_err(|_| {
                OpError::Redis(RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline was answered with the wrong number of replies",
                )))
            })
        });
        let observed = match &values {
            Ok(values) => values
                .iter()
                .find_map(|v| v.clone().extract_error().err())
                .map(OpError::Redis),
            Err(_) => None,
        };
        self.note(generation, values.as_ref().err().or(observed.as_ref()));
        values
    }
}

/// The answer of a queued command, or the error of a pipeline dropped before it answered.
fn received(
    answer: Result<Result<Value, RedisError>, oneshot::error::RecvError>,
) -> Result<Value, RedisError> {
    answer.unwrap_or_else(|_| {
        Err(RedisError::from((
            ErrorKind::Io,
            "the pipeline carrying the command was dropped",
        )))
    })
}

impl<C> Inner<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Queues `cmds` for the next write, together and in order, spawning the task that
    /// writes them unless one is already waiting to. `wait`: the last command is that `WAIT`.
    fn enqueue<const N: usize>(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        cmds: [::redis::Cmd; N],
        wait: Option<WaitArgs>,
        deadline: Instant,
    ) -> [oneshot::Receiver<Result<Value, RedisError>>; N] {
        let spawn = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            let mut i = 0;
            let receivers = cmds.map(|cmd| {
                let (tx, rx) = oneshot::channel();
                i += 1;
                let wait = if i == N { wait } else { None };
                outbox.queued.push((cmd, tx, deadline, wait));
                rx
            });
            let spawn = !std::mem::replace(&mut outbox.scheduled, true);
            (spawn, receivers)
        };
        if spawn.0 {
            runtime.spawn(Arc::clone(self).flush());
        }
        spawn.1
    }

    /// Writes everything queued as one pipeline and hands each caller its own answer.
    async fn flush(self: Arc<Self>) {
        // Yield once: the tasks that are ready now run first and queue their commands, so
        // a busy server writes one pipeline per round of its scheduler, not one per command.
        tokio::task::yield_now().await;
        let queued = {
            let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
            outbox.scheduled = false;
            // The next batch starts with room for one like this one: no growing step by step.
            let room = outbox.queued.len();
            std::mem::replace(&mut outbox.queued, Vec::with_capacity(room))
        };
        // Bounded like its callers: a silent connection must not keep this task (and the
        // connection it holds) alive after every caller has given up.
        let Some(limit) = queued.iter().map(|q| q.2).max() else {
            return;
        };
        let slots = share_waits(queued);
        let (generation, mut conn) = self.checkout();
        if self.condemned(generation) {
            for (_, senders) in slots {
                senders.send(Err(condemned()));
            }
            return;
        }
        if let [(cmd, _)] = &slots[..] {
            // A server error comes back as a value; the caller reads it.
            let answer = tokio::time::timeout_at(limit, conn.req_packed_command(cmd))
                .await
                .unwrap_or_else(|_| Err(elapsed()));
            if let Some((_, senders)) = slots.into_iter().next() {
                senders.send(answer);
            }
            return;
        }
        let mut pipe = ::redis::Pipeline::with_capacity(slots.len());
        let mut answer_to = Vec::with_capacity(slots.len());
        for (cmd, senders) in slots {
            pipe.add_command(cmd);
            answer_to.push(senders);
        }
        let answers =
            tokio::time::timeout_at(limit, conn.req_packed_commands(&pipe, 0, answer_to.len()))
                .await
                .unwrap_or_else(|_| Err(elapsed()));
        match answers {
            Ok(answers) if answers.len() == answer_to.len() => {
                for (answer, senders) in answers.into_iter().zip(answer_to) {
                    // A command's own error (NOSCRIPT, OOM, …) goes to its caller only.
                    senders.send(Ok(answer));
                }
            }
            Ok(_) => {
                let e = RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline was answered with the wrong number of replies",
                ));
                for senders in answer_to {
                    senders.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for senders in answer_to {
                    senders.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Where a queued command's answer goes.
type Sender = oneshot::Sender<Result<Value, RedisError>>;

/// The callers one command of a pipeline answers: one, or the callers of a shared `WAIT`.
enum Senders {
    One(Sender),
    Many(Vec<Sender>),
}

impl Senders {
    /// Hands `answer` to each caller: moved to a lone one, cloned only for a shared `WAIT`.
    fn send(self, answer: Result<Value, RedisError>) {
        match self {
            Self::One(tx) => {
                let _ = tx.send(answer);
            }
            Self::Many(txs) => {
                for tx in txs {
                    let _ = tx.send(answer.clone());
                }
            }
        }
    }
}

/// A command of a pipeline and the callers its answer goes to.
type Slot = (::redis::Cmd, Senders);

/// The batch as pipeline commands. Two or more `WAIT`s become one, at the end: it waits for
/// every write before it, so each caller's write is covered. It asks for the most replicas
/// any of them asked for, for the shortest time any of them had left. One `WAIT` stays where
/// it is.
fn share_waits(queued: Vec<Queued>) -> Vec<Slot> {
    let waits = queued.iter().filter(|q| q.3.is_some()).count();
    if waits < 2 {
        return queued
            .into_iter()
            .map(|(cmd, tx, _, _)| (cmd, Senders::One(tx)))
            .collect();
    }
    let mut slots = Vec::with_capacity(queued.len() - waits + 1);
    let mut shared = Vec::with_capacity(waits);
    let (mut replicas, mut ms) = (0, u64::MAX);
    for (cmd, tx, _, wait) in queued {
        match wait {
            Some(w) => {
                replicas = replicas.max(w.replicas);
                ms = ms.min(w.ms);
                shared.push(tx);
            }
            None => slots.push((cmd, Senders::One(tx))),
        }
    }
    slots.push((wait_cmd(WaitArgs { replicas, ms }), Senders::Many(shared)));
    slots
}

/// `WAIT replicas ms`.
pub(super) fn wait_cmd(w: WaitArgs) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd("WAIT");
    cmd.arg(w.replicas).arg(w.ms.max(1));
    cmd
}

/// The error of a pipeline that outlived its callers' timeouts.
fn elapsed() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the pipeline timed out",
    ))
}
