//! Claimed work that finishes when the client goes away, and the handle a graceful shutdown
//! waits on.
//!
//! Once a key is claimed, the handler's future, the reading of its response body and the
//! writing of the record run inside one boxed future. While the caller listens it is polled in
//! place, as any future (no task hop, no channel). If the response future is dropped first (the
//! client closed the connection, an outer timeout fired), the rest of that future is moved onto
//! a task of its own, so the handler is never cut between two side effects and its outcome is
//! recorded: the retry is answered from the record instead of 409 and a later re-run.
//!
//! Every such future, attached or moved, holds a token of one [`TaskTracker`] per layer, so
//! [`InFlightWork::wait`] sees both. `tokio-util`'s tracker is used rather than a hand-made
//! counter and notifier: it is the tokio project's own answer to exactly this (counting
//! tasks, waking a waiter when the count reaches zero after a close), and it is already in the
//! lock file through `redis`, `tonic` and `h2`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TrackedFuture;

/// The claimed work of one layer (and of every service and `#[idempotent]` route built from
/// it) that has not finished yet: handlers still running, and responses still being recorded.
/// Made by [`IdempotencyLayer::in_flight`](super::IdempotencyLayer::in_flight); cheap to clone.
///
/// Wait on it after the server has stopped taking requests, so that the work clients left
/// behind is finished and recorded before the process exits:
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_idempotency::IdempotencyLayer;
///
/// # async fn run(listener: tokio::net::TcpListener, shutdown: impl std::future::Future<Output = ()> + Send + 'static) {
/// let layer = IdempotencyLayer::new();
/// let in_flight = layer.in_flight();
/// let app: Router = Router::new().route("/orders", post(|| async { "created" })).layer(layer);
///
/// axum::serve(listener, app).with_graceful_shutdown(shutdown).await.unwrap();
/// // The server has stopped; the handlers of clients that went away may still run.
/// if !in_flight.wait(Duration::from_secs(30)).await {
///     eprintln!("{} idempotent requests still running at exit", in_flight.len());
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct InFlightWork {
    tracker: TaskTracker,
}

impl InFlightWork {
    pub(crate) fn new() -> Self {
        Self {
            tracker: TaskTracker::new(),
        }
    }

    /// How many claimed requests have not finished (their handler running, or their response
    /// being read and recorded), whether their client still listens or not.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether every claimed request has finished.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every claimed request has finished, at most `limit`; `true` when they all
    /// did. Work claimed while it waits is waited for too. Work still running at the limit
    /// goes on (it is not cancelled); if the process then exits, its keys stay pending until
    /// their leases lapse, as without this wait.
    pub async fn wait(&self, limit: Duration) -> bool {
        // The tracker's `wait` ends only once it is closed and empty; reopened after, so the
        // layer keeps counting if the server goes on.
        self.tracker.close();
        let done = tokio::time::timeout(limit, self.tracker.wait())
            .await
            .is_ok();
        self.tracker.reopen();
        done
    }

    /// `work`, counted, and moved onto a task of its own if dropped before it finishes.
    pub(crate) fn detachable<F>(&self, work: F) -> Detachable<F>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Detachable {
            work: Some(Box::pin(self.tracker.track_future(work))),
        }
    }

    /// `work`, counted, dropped with its caller (the layer's `run_to_completion(false)`).
    pub(crate) fn counted<F: Future>(&self, work: F) -> TrackedFuture<F> {
        self.tracker.track_future(work)
    }
}

impl fmt::Debug for InFlightWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightWork")
            .field("len", &self.len())
            .finish()
    }
}

/// A future polled in place while its caller waits for it, and spawned to finish on its own
/// when its caller drops it first (its output is then discarded).
pub(crate) struct Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<Pin<Box<TrackedFuture<F>>>>,
}

impl<F> Future for Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = self
            .work
            .as_mut()
            .expect("Detachable polled after completion");
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // Outside a runtime (it is shutting down) there is nowhere to run the rest: it is
        // dropped, and its key stays pending until its lease lapses, as before this existed.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                tracing::debug!(
                    "idempotent request abandoned by its caller; its handler runs on and its outcome is recorded"
                );
                drop(rt.spawn(work));
            }
            Err(_) => {
                tracing::warn!(
                    "idempotent request abandoned outside a runtime; its handler is cancelled and its key stays pending until its lease lapses"
                );
            }
        }
    }
}
