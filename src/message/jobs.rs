//! The message door on [apalis](https://docs.rs/apalis) workers (jobs and queues built on tower
//! services).
//!
//! [`JobIdempotencyLayer`] wraps a [`MessageIdempotencyLayer`] for a worker's layer stack:
//! `WorkerBuilder::new(..).backend(storage).layer(JobIdempotencyLayer::new(..)).build(handler)`.
//! An apalis [`Task`] is a [`Message`]:
//!
//! - **key**: the task's own idempotency key (`TaskBuilder::idempotency_key`), read as the
//!   `Idempotency-Key` header; else a task metadata entry of that name (any case); else the
//!   SHA-256 of the queue name and the task's arguments serialized as JSON (so the same
//!   arguments pushed twice are one job: give tasks a key when that is not what you want);
//! - **topic**: the task's queue (empty when the backend does not say);
//! - **consumer name** (the scope): the name of the worker *pool* — the same in every process
//!   that works the queue, not `WorkerBuilder::new`'s per-worker name, or a task redelivered to
//!   another worker would not be seen as a duplicate.
//!
//! The service answers apalis with the [`Handled`] outcome (serialized into the task's result by
//! backends that keep results) and turns the door's errors into apalis' own:
//!
//! | outcome | answer to apalis | apalis-redis then |
//! | --- | --- | --- |
//! | ran, completed duplicate, skipped duplicate, untracked | `Ok(Handled::…)` | done |
//! | handler `Err(e)` (key released) | `Err(e)` unchanged | failed: retried after *attempt* seconds, dead after 25 attempts |
//! | a result classified unsuccessful (key released) | `Err` ("unsuccessful result") | as above |
//! | duplicate in flight, [`InProgress::Reject`](super::InProgress::Reject) | `RetryAfterError` with the lease | pending: rescheduled after *attempt* seconds (apalis-redis 1.0 does not read the delay) |
//! | store failure on claim | `Err` (the store error as source) | failed: retried |
//! | key reused, key missing or invalid, invalid record | `AbortError` | killed: dead set, not retried |
//!
//! **Where it sits.** Add this layer *inside* apalis' retry layer (after `.retry(..)` in the
//! builder chain, which makes it the inner one): each retry then goes through the door, a failed
//! attempt having released the key. Outside the retry layer, retries would run under one claim,
//! and a redelivery meanwhile would meet a key in flight.
//!
//! **What the backends do with an `Err`.** apalis-redis 1.0 reschedules a failed task (after
//! `attempt` seconds, up to 25 attempts, then the dead set) and re-enqueues the tasks of a
//! worker whose heartbeats stopped (`Config::heartbeat_interval` ×
//! `Config::missed_heartbeats`): the crash-before-ack case this door makes safe. apalis'
//! in-memory `MemoryStorage` takes a task off its channel for good: an `Err` there is final
//! unless apalis' retry layer (`.retry(RetryPolicy::retries(n))`, which never retries an
//! `AbortError`) runs the task again in the worker, so
//! configure retries there, or a handler's error loses the message. The lease arithmetic of the
//! [module docs](super#the-lease-and-the-brokers-redelivery) applies: with `Reject`, apalis-redis'
//! retries span 1 + 2 + … + 25 s = 325 s, more than the default 60 s lease.
//!
//! ```
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::message::MessageIdempotencyLayer;
//! use tower_idempotency::message::jobs::JobIdempotencyLayer;
//!
//! let layer = JobIdempotencyLayer::new(MessageIdempotencyLayer::new(
//!     Engine::new(MemoryStore::new()),
//!     "email-workers",
//! ));
//! // WorkerBuilder::new("email-worker-1").backend(storage).layer(layer).build(send_email)
//! # let _ = layer;
//! ```

use super::error::{MessageError, MessageErrorKind};
use super::key::Message;
use super::layer::{Handled, MessageIdempotency, MessageIdempotencyLayer};
pub use apalis_core;
use apalis_core::error::{AbortError, BoxDynError, RetryAfterError};
use apalis_core::task::Task;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

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
        match serde_json::to_vec(&self.args) {
            Ok(json) => Cow::Owned(json),
            // Arguments a backend stored as JSON always serialize; for any other, the task id
            // stands in, so two tasks never share a digest (a redelivery keeps its id).
            Err(e) => {
                tracing::warn!(target: "tower_idempotency::message", error = %e, "task arguments do not serialize as JSON; keyed by the task id");
                let id = self.ctx().task_id().map(ToString::to_string);
                Cow::Owned(format!("\0task-id:{}", id.unwrap_or_default()).into_bytes())
            }
        }
    }
}

/// The message door for apalis workers; see the [module docs](self).
#[derive(Clone, Debug)]
#[must_use]
pub struct JobIdempotencyLayer<L> {
    inner: L,
}

impl<L> JobIdempotencyLayer<L> {
    /// The door configured as `layer` (its consumer name: the worker pool's).
    pub fn new(layer: L) -> Self {
        Self { inner: layer }
    }
}

impl<S, St, K, C, F> Layer<S> for JobIdempotencyLayer<MessageIdempotencyLayer<St, K, C, F>> {
    type Service = JobIdempotency<MessageIdempotency<S, St, K, C, F>>;

    fn layer(&self, inner: S) -> Self::Service {
        JobIdempotency {
            inner: self.inner.layer(inner),
        }
    }
}

/// The service made by [`JobIdempotencyLayer`].
#[derive(Clone, Debug)]
pub struct JobIdempotency<T> {
    inner: T,
}

impl<T> JobIdempotency<T> {
    /// The door's service.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The door's service, unwrapped.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

/// The handler's result was classified unsuccessful: the key was released, and the task fails
/// so the backend retries it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Unsuccessful;

impl fmt::Display for Unsuccessful {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the task's result was classified unsuccessful; it will run again")
    }
}

impl std::error::Error for Unsuccessful {}

impl<T, Args, R, E> Service<Task<Args>> for JobIdempotency<T>
where
    T: Service<Task<Args>, Response = Handled<R>, Error = MessageError<E>>,
    E: Into<BoxDynError>,
{
    type Response = Handled<R>;
    type Error = BoxDynError;
    type Future = JobFuture<T::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(to_apalis)
    }

    fn call(&mut self, task: Task<Args>) -> Self::Future {
        JobFuture {
            inner: self.inner.call(task),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`JobIdempotency`].
    pub struct JobFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> fmt::Debug for JobFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for JobFuture<F>
where
    F: Future<Output = Result<Handled<R>, MessageError<E>>>,
    E: Into<BoxDynError>,
{
    type Output = Result<Handled<R>, BoxDynError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map(|out| match out {
            Ok(Handled::Failed(_)) => Err(Box::new(Unsuccessful) as BoxDynError),
            Ok(handled) => Ok(handled),
            Err(e) => Err(to_apalis(e)),
        })
    }
}

/// The door's error as apalis reads it: the handler's own error unchanged, a duplicate in
/// flight as `RetryAfterError`, a store failure as a plain (retried) error, the rest as
/// `AbortError` (not retried).
fn to_apalis<E: Into<BoxDynError>>(e: MessageError<E>) -> BoxDynError {
    match e.split_handler() {
        Err(handler) => handler.into(),
        Ok(door) => match door.kind() {
            MessageErrorKind::InFlight => {
                let after = door.retry_after().unwrap_or_default();
                Box::new(RetryAfterError::new(door, after))
            }
            MessageErrorKind::Store => Box::new(door),
            _ => Box::new(AbortError::new(door)),
        },
    }
}
