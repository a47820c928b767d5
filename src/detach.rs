//! Claimed work that finishes when its caller goes away, and the handle a graceful shutdown
//! waits on. Shared by the doors: it knows nothing of HTTP or messages.
//!
//! Once a key is claimed, the door's work (the handler, the reading of its answer, the writing
//! of the record) runs inside one boxed future. While the caller listens it is polled in
//! place, as any future (no task hop, no channel). If the caller drops it first (an HTTP
//! client closed the connection, a consumer shut down, an outer timeout fired), the rest of
//! that future is moved onto a task of its own, so the handler is never cut between two side
//! effects and its outcome is recorded: the retry or redelivery is answered from the record
//! instead of waiting for the lease to lapse and running again.
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
use tracing::Instrument;

/// The claimed work of one layer (and of every service and `#[idempotent]` route built from
/// it) that has not finished yet: handlers still running, and outcomes still being recorded.
/// Made by [`IdempotencyLayer::in_flight`](crate::IdempotencyLayer::in_flight) and
/// [`MessageIdempotencyLayer::in_flight`](crate::message::MessageIdempotencyLayer::in_flight);
/// cheap to clone. (The same type as `http::InFlightWork` and `message::InFlightWork`.)
///
/// Wait on it after the server (or consumer) has stopped taking work, so that the work its
/// callers left behind is finished and recorded before the process exits:
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

    /// How many claimed requests or messages have not finished (their handler running, or its
    /// outcome being read and recorded), whether their caller still listens or not.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether every claimed request or message has finished.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every claimed request or message has finished, at most `limit`; `true`
    /// when they all did. Work claimed while it waits is waited for too. Work still running at
    /// the limit goes on (it is not cancelled); if the process then exits, its keys stay
    /// pending until their leases lapse, as without this wait.
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
        // Boxed before it is wrapped: the work (kilobytes for an HTTP handler's) is moved once,
        // into its box, and the span it finishes in is only attached if it is detached.
        Detachable {
            work: Some(self.tracker.track_future(Box::pin(work))),
            span: tracing::Span::current(),
        }
    }

    /// `work`, counted, dropped with its caller (a layer's `run_to_completion(false)`).
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
    work: Option<TrackedFuture<Pin<Box<F>>>>,
    /// The span the work was started in; its caller polls it there, a detached task enters it.
    span: tracing::Span,
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
        let out = std::task::ready!(Pin::new(work).poll(cx));
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
                    "idempotent work abandoned by its caller; its handler runs on and its outcome is recorded"
                );
                drop(rt.spawn(
                    work.instrument(std::mem::replace(&mut self.span, tracing::Span::none())),
                ));
            }
            Err(_) => {
                tracing::warn!(
                    "idempotent work abandoned outside a runtime; its handler is cancelled and its key stays pending until its lease lapses"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work its caller dropped finishes on a task of its own, in the span it was started in
    /// (the request's, for the HTTP layer): its log lines still name the request.
    #[tokio::test(flavor = "current_thread")]
    async fn detached_work_finishes_in_the_span_it_was_started_in() {
        let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
        let in_flight = InFlightWork::new();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (report, seen) = tokio::sync::oneshot::channel();
        let span = tracing::info_span!("request");
        let work = span.in_scope(|| {
            in_flight.detachable(async move {
                let _ = wait.await;
                let name = tracing::Span::current().metadata().map(|m| m.name());
                let _ = report.send(name);
            })
        });
        let mut work = Box::pin(work);
        let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
        assert!(first.is_pending());
        drop(work);
        assert_eq!(in_flight.len(), 1, "the detached work is still counted");
        go.send(()).expect("the detached work waits");
        let name = tokio::time::timeout(Duration::from_secs(5), seen)
            .await
            .expect("finished")
            .expect("reported");
        assert_eq!(name, Some("request"));
    }
}
