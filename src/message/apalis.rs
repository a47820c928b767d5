//! The message door on [apalis](https://docs.rs/apalis) workers, jobs and queues built on
//! tower services.
//!
//! ```
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::message::MessageIdempotencyLayer;
//! use tower_idempotency::message::apalis::ApalisLayer;
//!
//! let layer = ApalisLayer::new(MessageIdempotencyLayer::new(MemoryStore::new(), "email-workers"));
//! // WorkerBuilder::new("email-worker-1").backend(storage).layer(layer).build(send_email)
//! # let _ = layer;
//! ```
//!
//! [`ApalisLayer`] wraps a [`MessageIdempotencyLayer`] for a worker's layer stack. An apalis
//! [`Task`] is a [`Message`]:
//!
//! - **key**, by [`TaskKey`], default [`TaskKey::TaskId`]. It is the task's own idempotency
//!   key, set by `TaskBuilder::idempotency_key`. Else it is a task metadata entry
//!   `Idempotency-Key` in any case. Else it is the task's id. The backend gives a task its id
//!   when it is pushed, and keeps it across retries and redeliveries. So a redelivery is a
//!   repeat, and two tasks pushed with equal arguments are two jobs: a daily
//!   `Reminder { user: 5 }` runs every day. Keying by the arguments instead is an opt-in,
//!   [`TaskKey::Arguments`], whose risks its docs state. apalis-redis and `MemoryStorage`
//!   themselves drop a second push under one `idempotency_key`. The door catches the
//!   redeliveries of the first.
//! - **topic**: the task's queue, empty when the backend does not say. apalis-redis does not.
//! - **body**, the fingerprint that tells a reused key from a redelivery: the arguments as
//!   JSON, with every object's keys and every array's items sorted. So the order of a
//!   `HashMap` or a `HashSet`, new at every deserialization, does not make a redelivery
//!   `KeyReused`. The cost: under one given key, two tasks whose arguments differ only in
//!   the order of a list are taken for one message, a repeat and not `KeyReused`.
//! - **consumer name**, the scope: the name of the worker *pool*. It is the same in every
//!   process that works the queue. It is not `WorkerBuilder::new`'s per-worker name, or a
//!   task redelivered to another worker would not be seen as a repeat.
//!
//! # Outcomes
//!
//! apalis reads a task's fate from its status. The backend files the task by it: done,
//! retried, dead. apalis' `RetryPolicy` stops at `Killed`. apalis sets the status from the
//! handler's result. So the adapter sets it for every answer the door gives, also those that
//! do not run the handler. Without it, a task redelivered to apalis-redis keeps the `Running`
//! it was fetched with, and is filed dead. The answer goes back to apalis as the [`Handled`]
//! outcome, or as apalis' own errors. Backends that keep results serialize the outcome into
//! the task's result:
//!
//! | outcome | answer to apalis | status | apalis-redis then |
//! | --- | --- | --- | --- |
//! | ran, untracked | `Ok(Handled::Recorded / Untracked)` | `Done` | done |
//! | completed repeat | `Ok(Handled::Replayed)` | `Done` | done |
//! | repeat in flight, with the opt-in [`skip_in_flight`](MessageIdempotencyLayer::skip_in_flight) | `Ok(Handled::Skipped)` | `Done` | done: if the first holder crashed mid-handler, its work is lost |
//! | repeat in flight, past [`wait_in_flight`](MessageIdempotencyLayer::wait_in_flight) | `RetryAfterError` with the door's [`retry_after`](super::MessageError::retry_after) | `Pending` | rescheduled after *attempt* seconds, not reading the delay; not an attempt, so never dead for it |
//! | handler `Err(e)`, key released | `Err(e)` unchanged | as apalis sets it: `Failed`, or `Killed` for an `AbortError`, `Pending` for a `RetryAfterError` | retried after *attempt* seconds, dead after 25 attempts |
//! | a handler error the door does not retry | `AbortError` | `Killed` | dead, not retried |
//! | `Handled::Released` or `Handled::Held`, the key released or held | `Err` ([`Unsuccessful`]) | `Failed` | retried, as above |
//! | `Handled::Failed`, the key released | `AbortError` of [`Unsuccessful`] | `Killed` | dead, not retried |
//! | store failure on claim | `Err`, the store error as source | `Failed` | retried |
//! | key reused, key missing or invalid, invalid record | `AbortError` | `Killed` | dead, not retried |
//!
//! A worker that dies mid-handler holds its task's claim until the engine's lease lapses,
//! since it renews it no longer. apalis-redis re-enqueues the dead worker's tasks once its
//! heartbeats stop: `Config::heartbeat_interval` × `Config::missed_heartbeats`. Each
//! redelivery before the lease lapses is a repeat in flight, rescheduled, and the first
//! after it runs the task. A worker that dies after recording, before acknowledging, costs
//! nothing: the redelivery is a completed repeat.
//!
//! apalis-redis stops a worker on any error from Redis, and two of its settings make one
//! out of a slow reply. It counts the product above in whole seconds, and a worker's own
//! heartbeat may find the worker orphaned: keep it at 3 s or more, in whole seconds (its
//! default is 30 s × 10). Under 2 s, as with 500 ms × 2, a heartbeat that falls either side
//! of a second re-enqueues its own worker's tasks, and the worker stops with "worker not
//! registered". And `apalis_redis::connect` keeps redis' default response timeout, 500 ms: a
//! reply later than that stops the worker. Connect with a `ConnectionManagerConfig` of a few
//! seconds instead.
//!
//! # apalis' retry layer
//!
//! Add this layer *inside* apalis' retry layer: after `.retry(..)` in the builder chain,
//! which makes it the inner one. Each retry then goes through the door, a failed attempt
//! having released the key. Outside the retry layer, retries would run under one claim, and
//! a redelivery meanwhile would meet a key in flight.
//!
//! `RetryPolicy` never retries a task whose status is `Killed`. Its own check for an
//! `AbortError` compares the error's type, so it never matches the boxed errors of a
//! worker's stack. The `Killed` status is what stops it. apalis sets it when the handler
//! returns an `AbortError`, and the adapter with every `AbortError` it returns. apalis counts
//! an attempt when the handler runs. So a refusal that does not run it, a repeat in flight
//! or a store failure, is retried at once without counting, until the key is decided or the
//! store answers. Give the policy a backoff: `RetryPolicy::retries(n).with_backoff(..)`.
//!
//! apalis-redis retries a failed task on its own, as in the table above. apalis' in-memory
//! `MemoryStorage` takes a task off its channel for good. An `Err` there is final unless the
//! retry layer runs the task again in the worker. So configure retries there, or a handler's
//! error loses the message. The lease arithmetic of the [module
//! docs](super#the-lease-and-the-brokers-redelivery) applies.

use super::error::{MessageError, MessageErrorKind};
use super::key::{HeaderOrHash, Identify, Message, MessageKey};
use super::layer::{Handled, MessageIdempotency, MessageIdempotencyLayer};
use crate::engine::key::KeyError;
pub use apalis_core;
use apalis_core::error::{AbortError, BoxDynError, RetryAfterError};
use apalis_core::task::Task;
use apalis_core::task::status::{AtomicStatus, Status};
use apalis_core::task::task_id::TaskId;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tower_layer::Layer;
use tower_service::Service;

/// The schema version under which a task id is digested, apart from every digest of
/// arguments. Those have none.
const TASK_ID_SCHEMA: &str = "apalis/task-id";

impl<Args: serde::Serialize> Message for Task<Args> {
    fn topic(&self) -> &str {
        self.ctx().queue().map_or("", AsRef::as_ref)
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        let ctx = self.ctx();
        if name.eq_ignore_ascii_case("idempotency-key")
            && let Some(key) = ctx.idempotency_key()
        {
            return Some(key.as_bytes());
        }
        ctx.metadata()
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    }

    fn body(&self) -> Cow<'_, [u8]> {
        Cow::Owned(arguments_json(self, Lists::Sorted))
    }
}

/// Whether a JSON array's items keep their order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lists {
    InOrder,
    Sorted,
}

/// The task's arguments as canonical JSON. For arguments that do not serialize, it is the task
/// id: a redelivery keeps it, and two tasks never share it.
fn arguments_json<Args: serde::Serialize>(task: &Task<Args>, lists: Lists) -> Vec<u8> {
    match serde_json::to_value(&task.args) {
        Ok(json) => {
            let mut out = Vec::new();
            canonical_json(&json, lists, &mut out);
            out
        }
        // Arguments a backend stored as JSON always serialize.
        Err(e) => {
            tracing::warn!(target: "tower_idempotency::message", error = %e, "task arguments do not serialize as JSON; keyed by the task id");
            let id = task.ctx().task_id().map(ToString::to_string);
            format!("\0task-id:{}", id.unwrap_or_default()).into_bytes()
        }
    }
}

/// JSON with every object's keys sorted, and with `Lists::Sorted` every array's items. So a
/// map's or a set's iteration order does not change the bytes. A `HashMap`'s and a
/// `HashSet`'s order is new at every deserialization.
fn canonical_json(value: &serde_json::Value, lists: Lists, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(k, out);
                out.push(b':');
                canonical_json(v, lists, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            let mut items: Vec<Vec<u8>> = items
                .iter()
                .map(|v| {
                    let mut item = Vec::new();
                    canonical_json(v, lists, &mut item);
                    item
                })
                .collect();
            if lists == Lists::Sorted {
                items.sort_unstable();
            }
            out.push(b'[');
            out.extend_from_slice(&items.join(&b","[..]));
            out.push(b']');
        }
        scalar => write_json(scalar, out),
    }
}

fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Strings and JSON scalars always serialize, and a Vec never fails a write.
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(target: "tower_idempotency::message", error = %e, "a JSON value did not serialize");
    }
}

/// How the door finds an apalis task's key.
///
/// Each way takes the task's own idempotency key first, set by
/// `TaskBuilder::idempotency_key`. Then a task metadata entry `Idempotency-Key`, in any case.
/// They differ in what keys a task that has neither.
///
/// ```
/// use apalis_core::task::builder::TaskBuilder;
/// use apalis_core::task::task_id::TaskId;
/// use tower_idempotency::message::Identify;
/// use tower_idempotency::message::apalis::TaskKey;
///
/// let reminder = |id: u64| TaskBuilder::new(5_u32).task_id(TaskId::from_int(id)).build();
/// let (monday, tuesday) = (reminder(1), reminder(2));
/// // Equal arguments, two tasks: two keys by default, one by the arguments.
/// assert_ne!(TaskKey::TaskId.identify(&monday).unwrap(), TaskKey::TaskId.identify(&tuesday).unwrap());
/// assert_eq!(TaskKey::Arguments.identify(&monday).unwrap(), TaskKey::Arguments.identify(&tuesday).unwrap());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskKey {
    /// The task's id, as [`TaskKey::task_id_key`] makes it. The default.
    ///
    /// It is the same for every retry and redelivery of one task, never for two tasks. A
    /// task without an id has no key: it runs untracked, or is refused with
    /// [`require_key`](MessageIdempotencyLayer::require_key). apalis' backends give every
    /// task an id.
    #[default]
    TaskId,
    /// The [digest](MessageKey::digest) of the queue and the arguments as JSON. Every
    /// object's keys are sorted; arrays keep their order.
    ///
    /// **Tasks pushed with equal arguments are one job.** The second is a repeat and does
    /// not run, at any later time within the engine's retention: a daily reminder with the
    /// same arguments runs once. Use it where a repeat push is a producer's retry and equal
    /// arguments mean the same work. A `HashSet` in the arguments, or any value whose JSON
    /// is not the same each time, keys each delivery differently. A redelivery then runs
    /// again.
    Arguments,
    /// No key unless the producer gave one: the task runs untracked, or is refused with
    /// [`require_key`](MessageIdempotencyLayer::require_key).
    GivenOnly,
}

impl TaskKey {
    /// The key [`TaskKey::TaskId`] gives a task with this id and no key of its own.
    ///
    /// Pass it to [`MessageIdempotencyLayer::forget`]. It is a digest, so it never equals a
    /// key a producer gave, whatever the id spells.
    #[must_use]
    pub fn task_id_key(id: &TaskId) -> MessageKey {
        MessageKey::digest("", Some(TASK_ID_SCHEMA), id.to_string().as_bytes())
    }
}

impl<Args: serde::Serialize> Identify<Task<Args>> for TaskKey {
    fn identify(&self, task: &Task<Args>) -> Result<Option<MessageKey>, KeyError> {
        if let Some(given) = task.header("Idempotency-Key") {
            return MessageKey::given(given).map(Some);
        }
        Ok(match self {
            Self::TaskId => task.ctx().task_id().map(Self::task_id_key),
            Self::Arguments => Some(MessageKey::digest(
                task.topic(),
                task.schema_version(),
                &arguments_json(task, Lists::InOrder),
            )),
            Self::GivenOnly => None,
        })
    }
}

/// The message door for apalis workers. See the [module docs](self).
#[derive(Clone, Debug)]
#[must_use]
pub struct ApalisLayer<L> {
    inner: L,
}

impl<St, C, F> ApalisLayer<MessageIdempotencyLayer<St, TaskKey, C, F>> {
    /// The door configured as `layer`, tasks keyed by [`TaskKey::TaskId`].
    ///
    /// Name the layer's consumer after the worker pool. Its [`Identify`] is replaced: the
    /// default would key a task by its arguments. Choose another with
    /// [`identify`](ApalisLayer::identify).
    pub fn new(layer: MessageIdempotencyLayer<St, HeaderOrHash, C, F>) -> Self {
        Self {
            inner: layer.identify(TaskKey::default()),
        }
    }
}

impl<St, K, C, F> ApalisLayer<MessageIdempotencyLayer<St, K, C, F>> {
    /// Finds tasks' keys with `identify`: a [`TaskKey`] or an [`Identify`] of your own.
    /// Default: [`TaskKey::TaskId`].
    ///
    /// [`HeaderOrHash`] keys a task without a key by its arguments, as
    /// [`TaskKey::Arguments`] does.
    pub fn identify<K2>(self, identify: K2) -> ApalisLayer<MessageIdempotencyLayer<St, K2, C, F>> {
        ApalisLayer {
            inner: self.inner.identify(identify),
        }
    }
}

impl<S, St, K, C, F> Layer<S> for ApalisLayer<MessageIdempotencyLayer<St, K, C, F>> {
    type Service = ApalisService<MessageIdempotency<S, St, K, C, F>>;

    fn layer(&self, inner: S) -> Self::Service {
        ApalisService {
            inner: self.inner.layer(inner),
        }
    }
}

/// The service made by [`ApalisLayer`].
#[derive(Clone, Debug)]
pub struct ApalisService<T> {
    inner: T,
}

impl<T> ApalisService<T> {
    /// The door's service.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The door's service, unwrapped.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

/// The handler ran, and the classifier released or held the key, or failed the task.
///
/// The task fails with it, so the backend retries it. For [`Handled::Failed`] it comes
/// inside an `AbortError`, and the task is killed.
#[derive(Debug)]
#[non_exhaustive]
pub struct Unsuccessful;

impl fmt::Display for Unsuccessful {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the task's result was not recorded as done")
    }
}

impl std::error::Error for Unsuccessful {}

impl<T, Args, R, E> Service<Task<Args>> for ApalisService<T>
where
    T: Service<Task<Args>, Response = Handled<R>, Error = MessageError<E>>,
    E: Into<BoxDynError>,
{
    type Response = Handled<R>;
    type Error = BoxDynError;
    type Future = ApalisFuture<T::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(|e| to_apalis(e).1)
    }

    fn call(&mut self, task: Task<Args>) -> Self::Future {
        let status = task.ctx().raw_status().clone();
        ApalisFuture {
            inner: self.inner.call(task),
            status,
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`ApalisService`].
    pub struct ApalisFuture<F> {
        #[pin]
        inner: F,
        // The task's status, shared with apalis: what its backend and retry layer act on.
        status: AtomicStatus,
    }
}

impl<F> fmt::Debug for ApalisFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApalisFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ApalisFuture<F>
where
    F: Future<Output = Result<Handled<R>, MessageError<E>>>,
    E: Into<BoxDynError>,
{
    type Output = Result<Handled<R>, BoxDynError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (status, out) = match ready!(this.inner.poll(cx)) {
            Ok(Handled::Released(_) | Handled::Held(_)) => (
                Some(Status::Failed),
                Err(Box::new(Unsuccessful) as BoxDynError),
            ),
            Ok(Handled::Failed(_)) => (
                Some(Status::Killed),
                Err(Box::new(AbortError::new(Unsuccessful)) as BoxDynError),
            ),
            // Also when the handler did not run (a repeat): the task is done.
            Ok(handled) => (Some(Status::Done), Ok(handled)),
            Err(e) => {
                let (status, e) = to_apalis(e);
                (status, Err(e))
            }
        };
        if let Some(status) = status {
            this.status.store(status);
        }
        Poll::Ready(out)
    }
}

/// The door's error as apalis reads it, and the task status that goes with it. `None` keeps
/// the one apalis set from the handler's own result. The handler's error goes unchanged, or
/// as an `AbortError` when the door does not retry it. A repeat in flight goes as
/// `RetryAfterError`, a store failure as a plain error that is retried, the rest as
/// `AbortError`, not retried.
fn to_apalis<E: Into<BoxDynError>>(e: MessageError<E>) -> (Option<Status>, BoxDynError) {
    let retryable = e.is_retryable();
    match e.split_handler() {
        Err(handler) if retryable => (None, handler.into()),
        Err(handler) => (Some(Status::Killed), Box::new(AbortError::new(handler))),
        Ok(door) => match door.kind() {
            MessageErrorKind::InFlight => {
                let after = door.retry_after().unwrap_or_default();
                (
                    Some(Status::Pending),
                    Box::new(RetryAfterError::new(door, after)),
                )
            }
            _ if retryable => (Some(Status::Failed), Box::new(door)),
            _ => (Some(Status::Killed), Box::new(AbortError::new(door))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use crate::engine::Verdict;
    use apalis_core::task::builder::TaskBuilder;
    use std::collections::{HashMap, HashSet};
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Notify;
    use tower::{ServiceExt, service_fn};

    fn task<A>(args: A, id: u64) -> Task<A> {
        TaskBuilder::new(args).task_id(TaskId::from_int(id)).build()
    }

    fn door() -> MessageIdempotencyLayer<MemoryStore> {
        MessageIdempotencyLayer::new(MemoryStore::new(), "reminders")
    }

    fn counting(
        runs: &Arc<AtomicUsize>,
    ) -> impl Service<Task<u32>, Response = (), Error = Infallible, Future: Send> + Clone + Send + 'static
    {
        let runs = Arc::clone(runs);
        service_fn(move |_: Task<u32>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(()) }
        })
    }

    #[tokio::test]
    async fn two_tasks_with_equal_arguments_both_run_by_default() {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = ApalisLayer::new(door()).layer(counting(&runs));
        let monday = svc.clone().oneshot(task(5_u32, 1)).await.unwrap();
        let tuesday = svc.clone().oneshot(task(5_u32, 2)).await.unwrap();
        assert_eq!(
            (monday, tuesday),
            (Handled::Recorded(()), Handled::Recorded(()))
        );
        // A redelivery of one of them (same id) is its repeat.
        let again = svc.oneshot(task(5_u32, 2)).await.unwrap();
        assert_eq!(again, Handled::Replayed(None));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "each task ran once");
    }

    #[tokio::test]
    async fn keying_by_arguments_is_an_opt_in_that_merges_equal_arguments() {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = ApalisLayer::new(door())
            .identify(TaskKey::Arguments)
            .layer(counting(&runs));
        let first = svc.clone().oneshot(task(5_u32, 1)).await.unwrap();
        let second = svc.oneshot(task(5_u32, 2)).await.unwrap();
        assert_eq!(
            (first, second),
            (Handled::Recorded(()), Handled::Replayed(None))
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_given_key_comes_before_the_task_id() {
        let runs = Arc::new(AtomicUsize::new(0));
        let svc = ApalisLayer::new(door()).layer(counting(&runs));
        let keyed = |id| {
            TaskBuilder::new(5_u32)
                .task_id(TaskId::from_int(id))
                .idempotency_key("reminder-5-monday")
                .build()
        };
        assert_eq!(
            svc.clone().oneshot(keyed(1)).await.unwrap(),
            Handled::Recorded(())
        );
        // Another task (a producer's retry) under the same key does not run.
        assert_eq!(
            svc.oneshot(keyed(2)).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// Two maps with the same entries whose plain JSON differs, as their hashers differ.
    fn maps_in_two_orders() -> (HashMap<String, u32>, HashMap<String, u32>) {
        let entries: Vec<(String, u32)> = (0..32).map(|i| (format!("item-{i}"), i)).collect();
        let a: HashMap<_, _> = entries.iter().cloned().collect();
        for _ in 0..100 {
            let b: HashMap<_, _> = entries.iter().rev().cloned().collect();
            if serde_json::to_vec(&a).unwrap() != serde_json::to_vec(&b).unwrap() {
                return (a, b);
            }
        }
        panic!("100 hash maps iterated in one order");
    }

    #[test]
    fn a_hash_map_argument_has_one_body_in_any_order() {
        let (a, b) = maps_in_two_orders();
        let (a, b) = (task(a, 1), task(b, 1));
        assert_eq!(a.body(), b.body());
        assert_eq!(
            TaskKey::Arguments.identify(&a).unwrap(),
            TaskKey::Arguments.identify(&b).unwrap()
        );
    }

    #[tokio::test]
    async fn a_redelivery_whose_hash_map_iterates_anew_is_a_duplicate_under_a_given_key() {
        let (a, b) = maps_in_two_orders();
        let keyed = |args| TaskBuilder::new(args).idempotency_key("order-17").build();
        let svc =
            ApalisLayer::new(door()).layer(service_fn(|_: Task<HashMap<String, u32>>| async {
                Ok::<_, Infallible>(())
            }));
        assert_eq!(
            svc.clone().oneshot(keyed(a)).await.unwrap(),
            Handled::Recorded(())
        );
        let again = svc.oneshot(keyed(b)).await;
        assert_eq!(again.unwrap(), Handled::Replayed(None), "not KeyReused");
    }

    /// Two sets with the same items whose plain JSON differs, as their hashers differ.
    fn sets_in_two_orders() -> (HashSet<u32>, HashSet<u32>) {
        let a: HashSet<u32> = (0..32).collect();
        for _ in 0..100 {
            let b: HashSet<u32> = (0..32).rev().collect();
            if serde_json::to_vec(&a).unwrap() != serde_json::to_vec(&b).unwrap() {
                return (a, b);
            }
        }
        panic!("100 hash sets iterated in one order");
    }

    #[tokio::test]
    async fn a_redelivery_whose_hash_set_iterates_anew_is_a_duplicate_under_the_task_id() {
        let (a, b) = sets_in_two_orders();
        let svc = ApalisLayer::new(door()).layer(service_fn(|_: Task<HashSet<u32>>| async {
            Ok::<_, Infallible>(())
        }));
        assert_eq!(
            svc.clone().oneshot(task(a, 1)).await.unwrap(),
            Handled::Recorded(())
        );
        let again = svc.oneshot(task(b, 1)).await;
        assert_eq!(again.unwrap(), Handled::Replayed(None), "not KeyReused");
    }

    #[test]
    fn keying_by_arguments_keeps_the_order_of_a_list() {
        let (first, second) = (task(vec![1_u32, 2], 1), task(vec![2_u32, 1], 2));
        assert_ne!(
            TaskKey::Arguments.identify(&first).unwrap(),
            TaskKey::Arguments.identify(&second).unwrap()
        );
    }

    #[test]
    fn a_task_id_key_is_never_a_given_key_nor_an_arguments_digest() {
        let t = task(5_u32, 7);
        let by_id = TaskKey::TaskId.identify(&t).unwrap().unwrap();
        assert_eq!(by_id, TaskKey::task_id_key(&TaskId::from_int(7)));
        assert!(!by_id.is_given());
        assert_ne!(by_id, MessageKey::given(b"7").unwrap());
        assert_ne!(Some(by_id), TaskKey::Arguments.identify(&t).unwrap());
        assert_eq!(TaskKey::GivenOnly.identify(&t).unwrap(), None);
    }

    /// The first delivery of task 1 runs until released. Meanwhile a second delivery of it goes
    /// through `svc`, and its answer and status are returned.
    async fn duplicate_while_the_first_runs(
        layer: MessageIdempotencyLayer<MemoryStore>,
    ) -> (Result<Handled<()>, BoxDynError>, Status) {
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (s, r) = (Arc::clone(&started), Arc::clone(&release));
        let svc = ApalisLayer::new(layer).layer(service_fn(move |_: Task<u32>| {
            let (s, r) = (Arc::clone(&s), Arc::clone(&r));
            async move {
                s.notify_one();
                r.notified().await;
                Ok::<_, Infallible>(())
            }
        }));
        let first = tokio::spawn(svc.clone().oneshot(task(5_u32, 1)));
        started.notified().await;
        let repeat = task(5_u32, 1);
        let status = repeat.ctx().raw_status().clone();
        let out = svc.oneshot(repeat).await;
        release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded(()));
        (out, status.load())
    }

    #[tokio::test]
    async fn a_duplicate_in_flight_is_retried_after_the_doors_delay_not_completed() {
        for mode in [Duration::ZERO, Duration::from_millis(10)] {
            let (out, status) = duplicate_while_the_first_runs(door().wait_in_flight(mode)).await;
            let e = out.expect_err("not acknowledged");
            let retry = e
                .downcast_ref::<RetryAfterError>()
                .unwrap_or_else(|| panic!("{mode:?}: a RetryAfterError, got {e}"));
            assert!(retry.get_duration() > Duration::ZERO, "the lease left");
            assert_eq!(status, Status::Pending, "{mode:?}: rescheduled, not done");
        }
    }

    #[tokio::test]
    async fn skip_acknowledges_a_duplicate_in_flight_only_when_chosen() {
        let (out, status) = duplicate_while_the_first_runs(door().skip_in_flight(true)).await;
        assert_eq!(out.unwrap(), Handled::Skipped);
        assert_eq!(status, Status::Done);
    }

    #[tokio::test]
    async fn a_completed_duplicate_is_done_though_the_handler_did_not_run() {
        let svc = ApalisLayer::new(door())
            .layer(service_fn(|_: Task<u32>| async { Ok::<_, Infallible>(()) }));
        svc.clone().oneshot(task(5_u32, 1)).await.unwrap();
        let redelivery = task(5_u32, 1);
        // As apalis-redis hands over a task re-enqueued from a dead worker.
        redelivery.ctx().raw_status().store(Status::Running);
        let status = redelivery.ctx().raw_status().clone();
        assert_eq!(
            svc.oneshot(redelivery).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(status.load(), Status::Done);
    }

    #[tokio::test]
    async fn a_reused_key_is_an_abort_error_and_kills_the_task() {
        let svc = ApalisLayer::new(door())
            .layer(service_fn(|_: Task<u32>| async { Ok::<_, Infallible>(()) }));
        let keyed = |args: u32| TaskBuilder::new(args).idempotency_key("k").build();
        svc.clone().oneshot(keyed(1)).await.unwrap();
        let other = keyed(2);
        let status = other.ctx().raw_status().clone();
        let e = svc.oneshot(other).await.unwrap_err();
        let abort = e.downcast_ref::<AbortError>().expect("an AbortError");
        let door = std::error::Error::source(abort).expect("the door's error");
        let door = door
            .downcast_ref::<MessageError<Infallible>>()
            .expect("a MessageError");
        assert_eq!(door.kind(), MessageErrorKind::KeyReused);
        assert_eq!(status.load(), Status::Killed);
    }

    #[tokio::test]
    async fn an_unsuccessful_result_fails_the_task() {
        let svc = ApalisLayer::new(door().classify(|r: &Result<bool, Infallible>| match r {
            Ok(true) => Verdict::Record,
            _ => Verdict::Release,
        }))
        .layer(service_fn(|_: Task<u32>| async {
            Ok::<_, Infallible>(false)
        }));
        let t = task(5_u32, 1);
        // apalis marks it done: the handler returned `Ok`.
        t.ctx().raw_status().store(Status::Done);
        let status = t.ctx().raw_status().clone();
        let e = svc.oneshot(t).await.unwrap_err();
        assert!(e.downcast_ref::<Unsuccessful>().is_some());
        assert_eq!(status.load(), Status::Failed);
    }

    #[tokio::test]
    async fn a_result_classified_fail_kills_the_task() {
        let svc = ApalisLayer::new(door().classify(|r: &Result<bool, Infallible>| match r {
            Ok(true) => Verdict::Record,
            _ => Verdict::Fail,
        }))
        .layer(service_fn(|_: Task<u32>| async {
            Ok::<_, Infallible>(false)
        }));
        let t = task(5_u32, 1);
        t.ctx().raw_status().store(Status::Done);
        let status = t.ctx().raw_status().clone();
        let e = svc.oneshot(t).await.unwrap_err();
        let abort = e.downcast_ref::<AbortError>().expect("an AbortError");
        let cause = std::error::Error::source(abort).expect("the cause");
        assert!(cause.downcast_ref::<Unsuccessful>().is_some(), "{cause}");
        assert_eq!(status.load(), Status::Killed);
    }

    #[tokio::test]
    async fn a_handler_error_keeps_the_status_apalis_gave_it() {
        let svc = ApalisLayer::new(door()).layer(service_fn(|_: Task<u32>| async {
            Err::<(), BoxDynError>(Box::new(AbortError::new("permanent")))
        }));
        let t = task(5_u32, 1);
        t.ctx().raw_status().store(Status::Killed);
        let status = t.ctx().raw_status().clone();
        let e = svc.oneshot(t).await.unwrap_err();
        assert!(e.downcast_ref::<AbortError>().is_some(), "unchanged");
        assert_eq!(status.load(), Status::Killed);
    }

    #[tokio::test]
    async fn an_error_the_door_calls_permanent_kills_the_task() {
        #[derive(Debug)]
        struct CardDeclined;
        impl fmt::Display for CardDeclined {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("card declined")
            }
        }
        impl std::error::Error for CardDeclined {}

        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let layer = ApalisLayer::new(door().classify(|r: &Result<(), BoxDynError>| match r {
            Err(e) if e.downcast_ref::<CardDeclined>().is_some() => Verdict::Fail,
            Ok(_) => Verdict::Record,
            Err(_) => Verdict::Release,
        }));
        let svc = layer.layer(service_fn(move |_: Task<u32>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), BoxDynError>(Box::new(CardDeclined)) }
        }));
        let t = task(5_u32, 1);
        let status = t.ctx().raw_status().clone();
        let e = svc.clone().oneshot(t).await.unwrap_err();
        let abort = e.downcast_ref::<AbortError>().expect("an AbortError");
        let cause = std::error::Error::source(abort).expect("the handler's error");
        assert!(cause.downcast_ref::<CardDeclined>().is_some(), "{cause}");
        assert_eq!(status.load(), Status::Killed, "apalis files it dead");
        // The key was released: a task that is sent again (by hand) runs.
        let _ = svc.oneshot(task(5_u32, 1)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
