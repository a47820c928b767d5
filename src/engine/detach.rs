//! Claimed work that finishes when its caller goes away, and the handle a graceful shutdown
//! waits on. The doors share it, and it knows nothing of HTTP or messages.
//!
//! Once a key is claimed, the door's work runs inside one boxed future. That work is the
//! handler, the reading of its answer, and the writing of the record. While the caller
//! listens, the future is polled in place, as any future, with no task hop and no channel. The
//! caller may drop it first. An HTTP client closed the connection, a consumer shut down, or an
//! outer timeout fired. Then the rest of that future is moved onto a task of its own. So the
//! handler is never cut between two side effects, and its outcome is recorded. The retry or
//! redelivery is answered from the record. It does not wait for the lease to lapse and run
//! again.
//!
//! Detached work is bounded twice. Work nobody waits for cannot hold a key or the process
//! forever. Nor can it escape the concurrency limits and timeouts outside the layer:
//!
//! - **In time**: it runs at most 5 min after its caller left, unless the door's
//!   `detached_timeout` says otherwise. Then it is cancelled where it stands.
//! - **In number**: at most 1024 per layer run on at once, unless the door's `max_detached`
//!   says otherwise. Work dropped beyond that is cancelled where it stands instead of
//!   detached.
//!
//! Cancelled work records nothing and releases nothing. The key stays pending until its lease
//! lapses, since the lease renewal stopped with the work. Then a retry runs the work again, as
//! after a crash. Releasing it at once would let that retry run while the cancelled work's
//! effects may still be landing. Recording it would store an answer the handler never gave.
//!
//! Work whose poll panicked is never detached. It is poisoned, and polling it again would only
//! raise a second, misleading panic. It is dropped, and its key too stays pending until its
//! lease lapses.
//!
//! Every such future, attached or moved, holds a token of one [`TaskTracker`] per layer. So
//! [`Drain::wait`] sees both. `tokio-util`'s tracker is used rather than a hand-made counter
//! and notifier. It is the tokio project's own answer to exactly this: counting tasks, and
//! waking a waiter when the count reaches zero after a close. It is already in the lock file
//! through `redis`, `tonic` and `h2`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TrackedFuture;
use tracing::Instrument;

/// The claimed work of one door that has not finished yet: handlers still running, and
/// outcomes still being recorded. Wait on it at shutdown.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::http::Drain;
///
/// /// Called once the server has stopped taking requests.
/// async fn finish(drain: Drain) {
///     // The handlers of clients that went away may still run: let them finish.
///     if !drain.wait(Duration::from_secs(30)).await {
///         eprintln!("{} idempotent requests still running at exit", drain.len());
///     }
/// }
/// ```
///
/// Got by the `drain()` method of the HTTP layer and of the message door. It counts the work
/// of every service and `#[idempotent]` route built from that door. Cheap to clone. The same
/// type is `engine::Drain`, `http::Drain` and `message::Drain`.
#[derive(Clone)]
pub struct Drain {
    tracker: TaskTracker,
    /// How many run on a task of their own, shared by every clone.
    detached: Arc<AtomicUsize>,
    /// This layer's bounds on detached work. It is a copy, so a layer's setter changes its own.
    bounds: Bounds,
}

/// The bounds on work that runs on after its caller left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bounds {
    timeout: Duration,
    max: usize,
}

/// How long work whose caller went away may run on before it is cancelled. A layer may set its
/// own with `detached_timeout`.
pub(crate) const DEFAULT_DETACHED_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How many works whose callers went away may run on at once, per layer. A layer may set its
/// own with `max_detached`.
pub(crate) const DEFAULT_MAX_DETACHED: usize = 1024;

impl Drain {
    pub(crate) fn new() -> Self {
        Self {
            tracker: TaskTracker::new(),
            detached: Arc::new(AtomicUsize::new(0)),
            bounds: Bounds {
                timeout: DEFAULT_DETACHED_TIMEOUT,
                max: DEFAULT_MAX_DETACHED,
            },
        }
    }

    /// Sets how long detached work may run on. Any value is taken. `ZERO` cancels it at its next
    /// wait, and `Duration::MAX` never does.
    pub(crate) fn set_detached_timeout(&mut self, timeout: Duration) {
        self.bounds.timeout = timeout;
    }

    /// Sets how many detached works may run on at once. Zero means none is detached.
    pub(crate) fn set_max_detached(&mut self, max: usize) {
        self.bounds.max = max;
    }

    /// How many of the claimed requests or messages that have not finished run on a task of
    /// their own, their caller gone. It is at most the layer's `max_detached`.
    #[must_use]
    pub fn detached(&self) -> usize {
        self.detached.load(Ordering::Acquire)
    }

    /// How many claimed requests or messages have not finished, whether their caller still
    /// listens or not. Their handler is running, or its outcome is being read and recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// Whether every claimed request or message has finished.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every claimed request or message has finished, at most `limit`. Returns `true`
    /// when they all did. Work claimed while it waits is waited for too. Work still running at the
    /// limit goes on: it is not cancelled. If the process then exits, its keys stay pending until
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
        // Boxed before it is wrapped: the work (kilobytes for an HTTP handler's) is moved once,
        // into its box, and the span it finishes in is only attached if it is detached.
        Detachable {
            work: Some(self.tracker.track_future(Box::pin(work))),
            span: tracing::Span::current(),
            polling: false,
            detached: Arc::clone(&self.detached),
            bounds: self.bounds,
        }
    }

    /// `work`, counted, and dropped with its caller. This is a layer's `run_to_completion(false)`.
    pub(crate) fn counted<F: Future>(&self, work: F) -> TrackedFuture<F> {
        self.tracker.track_future(work)
    }
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("len", &self.len())
            .field("detached", &self.detached())
            .field("detached_timeout", &self.bounds.timeout)
            .field("max_detached", &self.bounds.max)
            .finish()
    }
}

/// A future polled in place while its caller waits for it. When its caller drops it first, it
/// is spawned to finish on its own, within the bounds. Its output is then discarded.
pub(crate) struct Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<TrackedFuture<Pin<Box<F>>>>,
    /// The span the work was started in. Its caller polls it there, and a detached task enters it.
    span: tracing::Span,
    /// Set while the work is polled. When it is still set at the drop, the poll unwound: the work
    /// panicked and is poisoned.
    polling: bool,
    detached: Arc<AtomicUsize>,
    bounds: Bounds,
}

impl<F> Future for Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let work = this
            .work
            .as_mut()
            .expect("Detachable polled after completion");
        this.polling = true;
        let out = Pin::new(work).poll(cx);
        this.polling = false;
        let out = std::task::ready!(out);
        this.work = None;
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
        if self.polling {
            // The poll unwound: the work panicked. Polled again it would only panic again.
            tracing::warn!(
                "idempotent work panicked; it is not run again and its key stays pending until its lease lapses"
            );
            return;
        }
        // Outside a runtime (it is shutting down) there is nowhere to run the rest: it is
        // dropped, and its key stays pending until its lease lapses, as before this existed.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "idempotent work abandoned outside a runtime; its handler is cancelled and its key stays pending until its lease lapses"
            );
            return;
        };
        let Some(slot) = Slot::take(&self.detached, self.bounds.max) else {
            tracing::warn!(
                max_detached = self.bounds.max,
                "idempotent work abandoned by its caller while the most detached work already runs; its handler is cancelled and its key stays pending until its lease lapses"
            );
            return;
        };
        tracing::debug!(
            "idempotent work abandoned by its caller; its handler runs on and its outcome is recorded"
        );
        let timeout = self.bounds.timeout;
        let detached = async move {
            let _slot = slot;
            if tokio::time::timeout(timeout, work).await.is_err() {
                tracing::warn!(
                    detached_timeout = ?timeout,
                    "idempotent work abandoned by its caller still runs at the detached timeout; its handler is cancelled and its key stays pending until its lease lapses"
                );
            }
        };
        drop(
            rt.spawn(detached.instrument(std::mem::replace(&mut self.span, tracing::Span::none()))),
        );
    }
}

/// One of the places for detached work, given back when the work ends or is cancelled.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A place, if fewer than `max` are taken.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(Arc::clone(count)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work its caller dropped finishes on a task of its own, in the span it was started in. For
    /// the HTTP layer that is the request's span, so its log lines still name the request.
    #[tokio::test(flavor = "current_thread")]
    async fn detached_work_finishes_in_the_span_it_was_started_in() {
        let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
        let in_flight = Drain::new();
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
    /// Counts its polls and its drop. It is pending forever, or panics at its first poll.
    struct Probe {
        polls: Arc<AtomicUsize>,
        dropped: Arc<AtomicUsize>,
        panics: bool,
    }

    impl Future for Probe {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            assert!(!self.panics, "the handler panics on purpose");
            Poll::Pending
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn probe(panics: bool) -> (Probe, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let p = Probe {
            polls: Arc::clone(&polls),
            dropped: Arc::clone(&dropped),
            panics,
        };
        (p, polls, dropped)
    }

    /// Polls `work` once in place, then drops it, as when its caller goes away.
    async fn poll_once_and_drop<F>(work: Detachable<F>)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let mut work = Box::pin(work);
        let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
        assert!(first.is_pending());
    }

    /// Work whose poll panicked is poisoned. It is dropped after the panic, by an outer catch or
    /// the task that caught it. It is not moved onto a task and polled again.
    #[tokio::test(flavor = "current_thread")]
    async fn panicked_work_is_not_polled_again() {
        let in_flight = Drain::new();
        let (work, polls, dropped) = probe(true);
        let mut work = Box::pin(in_flight.detachable(work));
        let caught = std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                || work.as_mut().poll(cx),
            )))
        })
        .await;
        assert!(caught.is_err(), "the poll panicked");
        drop(work);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, never again");
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the work is dropped");
        assert_eq!(in_flight.detached(), 0, "nothing detached");
        assert!(in_flight.is_empty(), "nothing counted");
    }

    /// Detached work runs at most the detached timeout, then is cancelled. Its place and its count
    /// are given back.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn detached_work_is_cancelled_at_the_detached_timeout() {
        let in_flight = Drain::new();
        let (work, _, dropped) = probe(false);
        poll_once_and_drop(in_flight.detachable(work)).await;
        assert_eq!(in_flight.detached(), 1, "detached");
        tokio::time::sleep(DEFAULT_DETACHED_TIMEOUT - Duration::from_secs(1)).await;
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            0,
            "still running before the bound"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "cancelled at the bound");
        assert_eq!(in_flight.detached(), 0);
        assert!(in_flight.is_empty());
    }

    /// Beyond the most detached work at once, work its caller dropped is cancelled at once.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn work_beyond_the_most_detached_is_cancelled() {
        let mut in_flight = Drain::new();
        in_flight.set_max_detached(1);
        let (first, _, first_dropped) = probe(false);
        let (second, _, second_dropped) = probe(false);
        poll_once_and_drop(in_flight.detachable(first)).await;
        poll_once_and_drop(in_flight.detachable(second)).await;
        tokio::task::yield_now().await;
        assert_eq!(in_flight.detached(), 1, "one detached");
        assert_eq!(first_dropped.load(Ordering::SeqCst), 0, "the first runs on");
        assert_eq!(
            second_dropped.load(Ordering::SeqCst),
            1,
            "the second is cancelled"
        );
        assert_eq!(in_flight.len(), 1);
        // Its place is given back when it ends.
        tokio::time::sleep(DEFAULT_DETACHED_TIMEOUT + Duration::from_secs(1)).await;
        assert_eq!(in_flight.detached(), 0);
        let (third, _, third_dropped) = probe(false);
        poll_once_and_drop(in_flight.detachable(third)).await;
        assert_eq!(in_flight.detached(), 1, "a place again");
        assert_eq!(third_dropped.load(Ordering::SeqCst), 0);
    }
}
