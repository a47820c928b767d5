//! Writes that wait for replicas (see [`RedisStoreBuilder::wait_for_replicas`]): sent on a
//! connection of their own, so that a `WAIT` never holds the connection claims use.
//!
//! `WAIT` counts the replication offset of its own connection's writes, so each write and the
//! `WAIT` that covers it go on that one connection, in one pipeline. One task writes them, one
//! batch at a time: the writes queued while a batch waits go together in the next, under one
//! `WAIT`, so a complete waits at most about two `WAIT` bounds, however many there are.
//!
//! Each batch starts with `ROLE`. Its list of replicas in sync says, for the next batch,
//! whether a `WAIT` can succeed at all: with fewer replicas than asked, the writes are sent
//! without one and answered `NotReplicated` at once. A `ROLE` that is not `master` means the
//! server was demoted: the store then asks for the primary again (through Sentinel, when it
//! finds its primary that way).
//!
//! [`RedisStoreBuilder::wait_for_replicas`]: super::RedisStoreBuilder::wait_for_replicas

use super::connection::{WeakStore, timed};
use super::error::{OpError, unsent};
use super::{RECONNECT_TIMEOUT, RedisStore, WaitReplicas};
use ::redis::aio::ConnectionLike;
use ::redis::{ErrorKind, RedisError, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A write waiting for the writer, and where its answer goes: the write's reply and the
/// number of replicas that acknowledged it.
pub(super) struct Job {
    cmd: ::redis::Cmd,
    replicas: WaitReplicas,
    deadline: Instant,
    answer: oneshot::Sender<Result<(Value, Value), RedisError>>,
}

/// Where a store's replicated writes go.
pub(super) type Jobs = mpsc::UnboundedSender<Job>;

/// The message of the error a server that is no longer the primary gets.
const DEMOTED: &str = "the Redis server is no longer the primary (ROLE)";

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Sends `cmd` (a write) followed by a `WAIT` for `replicas` on the writer's connection:
    /// the write's reply and the replicas that acknowledged it. `None` when this store has no
    /// writer (it cannot make a connection of its own, or runs outside a Tokio runtime): the
    /// caller then sends both on the shared connection.
    pub(super) async fn send_replicated(
        &self,
        cmd: ::redis::Cmd,
        replicas: WaitReplicas,
        deadline: Instant,
    ) -> Option<Result<(Value, Value), OpError>> {
        let jobs = self.writer()?;
        let (answer, rx) = oneshot::channel();
        let job = Job {
            cmd,
            replicas,
            deadline,
            answer,
        };
        if jobs.send(job).is_err() {
            return None;
        }
        Some(
            timed(deadline, async move {
                rx.await.unwrap_or_else(|_| {
                    Err(RedisError::from((
                        ErrorKind::Io,
                        "the writer of replicated writes stopped",
                    )))
                })
            })
            .await,
        )
    }

    /// The writer's queue, its task started on first use.
    fn writer(&self) -> Option<Jobs> {
        let reconnect = self.reconnect.as_ref()?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let jobs = self.inner.writer.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let writer = Writer {
                store: self.downgrade(),
                reconnect: std::sync::Arc::clone(reconnect),
            };
            runtime.spawn(writer.run(rx));
            tx
        });
        Some(jobs.clone())
    }
}

/// The task that sends replicated writes. It keeps the store's settings but not its shared
/// state, so that dropping the last store ends it.
struct Writer<C> {
    store: WeakStore<C>,
    reconnect: super::connection::Reconnect<C>,
}

/// The writer's connection, the generation of the store's connection it was made under, and
/// the replicas in sync that its server named last (`None`: not asked yet).
struct Conn<C> {
    generation: u64,
    conn: C,
    in_sync: Option<usize>,
}

impl<C> Writer<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Job>) {
        let mut conn: Option<Conn<C>> = None;
        while let Some(first) = rx.recv().await {
            let mut jobs = vec![first];
            while let Ok(job) = rx.try_recv() {
                jobs.push(job);
            }
            let Some(store) = self.store.upgrade() else {
                return;
            };
            self.batch(&store, &mut conn, jobs).await;
        }
    }

    /// Sends one batch: `ROLE`, the writes, and `WAIT` unless too few replicas are in sync.
    async fn batch(&self, store: &RedisStore<C>, slot: &mut Option<Conn<C>>, jobs: Vec<Job>) {
        let generation = store.inner.generation();
        if store.inner.condemned(generation) {
            return answer_all(jobs, &Err(super::connection::condemned()));
        }
        // A write whose caller gave up is still sent: the record of work that ran is worth
        // keeping. Each batch is bounded by one operation timeout.
        let limit = Instant::now() + store.timeout;
        if slot.as_ref().is_none_or(|c| c.generation != generation) {
            *slot = None;
            match tokio::time::timeout(RECONNECT_TIMEOUT.min(store.timeout), (self.reconnect)())
                .await
            {
                Ok(Ok((conn, _))) => {
                    *slot = Some(Conn {
                        generation,
                        conn,
                        in_sync: None,
                    });
                }
                Ok(Err(e)) => return answer_all(jobs, &Err(unsent(e))),
                Err(_) => {
                    return answer_all(
                        jobs,
                        &Err(unsent(RedisError::from((
                            ErrorKind::Io,
                            "making a connection for replicated writes timed out",
                        )))),
                    );
                }
            }
        }
        let Some(c) = slot.as_mut() else { return };
        if c.in_sync.is_none() {
            // A new connection: ask first, so that a primary without replicas says so at once.
            match timed(
                limit,
                ::redis::cmd("ROLE").query_async::<Value>(&mut c.conn),
            )
            .await
            {
                Ok(role) => match in_sync(&role) {
                    Some(n) => c.in_sync = Some(n),
                    None => return self.demoted(store, slot, generation, jobs),
                },
                Err(e) => return self.failed(store, slot, generation, jobs, e),
            }
        }
        let asked = jobs.iter().map(|j| j.replicas.count).max().unwrap_or(1);
        let wait = c.in_sync.is_some_and(|n| n >= asked).then(|| {
            // At most a third of the operation timeout: a write queued while a batch waits
            // waits for that one and for its own, and still fails as `NotReplicated`, not
            // `Timeout`. Within three quarters of the time the most pressed caller has left;
            // never 0 (`WAIT … 0` blocks for ever).
            let left = jobs
                .iter()
                .map(|j| j.deadline.saturating_duration_since(Instant::now()))
                .min()
                .unwrap_or_default();
            let bound = jobs
                .iter()
                .map(|j| j.replicas.timeout)
                .min()
                .unwrap_or_default()
                .min(store.timeout / 3);
            super::codec::millis(bound.min(left * 3 / 4)).max(1)
        });
        let mut pipe = ::redis::Pipeline::with_capacity(jobs.len() + 2);
        pipe.add_command(::redis::cmd("ROLE"));
        for job in &jobs {
            pipe.add_command(job.cmd.clone());
        }
        if let Some(ms) = wait {
            pipe.add_command(super::pipeline::wait_cmd(super::connection::WaitArgs {
                replicas: asked,
                ms,
            }));
        }
        let count = pipe.len();
        let answers = timed(limit, c.conn.req_packed_commands(&pipe, 0, count)).await;
        let mut answers = match answers {
            Ok(answers) if answers.len() == count => answers,
            Ok(_) => {
                let e = RedisError::from((
                    ErrorKind::Parse,
                    "a pipeline was answered with the wrong number of replies",
                ));
                return self.failed(store, slot, generation, jobs, OpError::Redis(e));
            }
            Err(e) => return self.failed(store, slot, generation, jobs, e),
        };
        let acknowledged = if wait.is_some() {
            answers.pop().unwrap_or(Value::Int(0))
        } else {
            // No `WAIT`: no replica acknowledged.
            Value::Int(0)
        };
        let mut answers = answers.into_iter();
        let role = answers.next().unwrap_or(Value::Nil);
        // The first server error a write met counts towards replacing the store's connection
        // (a `READONLY` from a demoted primary), as on the shared connection.
        let observed = answers
            .clone()
            .find_map(|v| v.extract_error().err())
            .map(OpError::Redis);
        store.note(generation, observed.as_ref());
        for (job, written) in jobs.into_iter().zip(answers) {
            let _ = job.answer.send(Ok((written, acknowledged.clone())));
        }
        match in_sync(&role) {
            Some(n) => c.in_sync = Some(n),
            None => {
                *slot = None;
                store.note(generation, Some(&OpError::Redis(demoted())));
            }
        }
    }

    /// The server answered `ROLE` as something other than a primary: nothing is written there;
    /// the store asks for the primary again.
    fn demoted(
        &self,
        store: &RedisStore<C>,
        slot: &mut Option<Conn<C>>,
        generation: u64,
        jobs: Vec<Job>,
    ) {
        *slot = None;
        let e = OpError::Redis(demoted());
        store.note(generation, Some(&e));
        answer_all(jobs, &Err(unsent(demoted())));
    }

    /// The connection failed: it is dropped, a lost primary is counted on the store's
    /// connection, and each caller gets the error.
    fn failed(
        &self,
        store: &RedisStore<C>,
        slot: &mut Option<Conn<C>>,
        generation: u64,
        jobs: Vec<Job>,
        e: OpError,
    ) {
        *slot = None;
        if e.is_primary_lost() {
            store.note(generation, Some(&e));
        }
        let e = match e {
            OpError::Redis(e) => e,
            OpError::Elapsed(_) => RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a replicated write timed out",
            )),
        };
        answer_all(jobs, &Err(e));
    }
}

fn answer_all(jobs: Vec<Job>, answer: &Result<(Value, Value), RedisError>) {
    for job in jobs {
        let _ = job.answer.send(answer.clone());
    }
}

/// The number of replicas in sync in a `ROLE` answer of a primary; `None` when the server is
/// not a primary (or the answer is not a `ROLE` answer).
fn in_sync(role: &Value) -> Option<usize> {
    let Value::Array(fields) = role else {
        return None;
    };
    let is_master = match fields.first() {
        Some(Value::BulkString(b)) => b.as_slice() == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    };
    match (is_master, fields.get(2)) {
        (true, Some(Value::Array(replicas))) => Some(replicas.len()),
        _ => None,
    }
}

fn demoted() -> RedisError {
    RedisError::from((ErrorKind::Io, DEMOTED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_replicas_in_sync_from_role() {
        let master = Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(3129659),
            Value::Array(vec![Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::BulkString(b"9001".to_vec()),
                Value::BulkString(b"3129242".to_vec()),
            ])]),
        ]);
        assert_eq!(in_sync(&master), Some(1));
        let alone = Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(0),
            Value::Array(vec![]),
        ]);
        assert_eq!(in_sync(&alone), Some(0));
        let replica = Value::Array(vec![
            Value::BulkString(b"slave".to_vec()),
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(9000),
            Value::BulkString(b"connected".to_vec()),
            Value::Int(3167038),
        ]);
        assert_eq!(in_sync(&replica), None);
        assert_eq!(in_sync(&Value::Nil), None);
    }
}
