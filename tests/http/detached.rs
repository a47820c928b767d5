//! Work whose caller went away, bounded: a hung handler is cancelled at the detached timeout
//! and its key left to its lease; work beyond the most detached at once is cancelled at once;
//! a handler that panicked is never polled again. Time is tokio's paused clock (the memory
//! store's default clock follows it), so a loaded machine cannot overrun a bound.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::task::Poll;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_idempotency::http::{Drain, RequestBody, ResponseBody};
use tower_idempotency::{IdempotencyLayer, Principal};

const BODY: &str = r#"{"item":"book"}"#;
/// The engine's default lease and the layer's default detached timeout.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);
const DEFAULT_DETACHED_TIMEOUT: Duration = Duration::from_secs(5 * 60);

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/work")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .expect("request")
}

/// What the handler did, shared with the test.
#[derive(Clone, Default)]
struct Runs {
    started: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

/// Counts a handler cut short: dropped before it answered (disarmed when it answers).
struct CancelGuard(Option<Arc<AtomicUsize>>);

impl CancelGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(cancelled) = self.0.take() {
            cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The layered service, as the tests call it.
trait Svc:
    Service<Request<Full<Bytes>>, Response = Response<Out>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Svc for S where
    S: Service<Request<Full<Bytes>>, Response = Response<Out>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

type Out = ResponseBody<Full<Bytes>>;

/// A service whose first `hang` runs never answer (a hung handler); later runs answer 201.
fn service(layer: &IdempotencyLayer, hang: usize) -> (impl Svc, Runs) {
    let runs = Runs::default();
    let r = runs.clone();
    let inner = service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let run = r.started.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = CancelGuard(Some(Arc::clone(&r.cancelled)));
        async move {
            if run <= hang {
                std::future::pending::<()>().await;
            }
            guard.disarm();
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(format!("run {run}"))))
                    .expect("response"),
            )
        }
    });
    (layer.layer(inner), runs)
}

/// Sends `key`'s request, lets the handler start, then drops the call (the client left).
async fn leave_mid_handler(svc: &impl Svc, runs: &Runs, key: &str) {
    let started = runs.started.load(Ordering::SeqCst);
    let mut call = Box::pin(svc.clone().oneshot(request(key)));
    for _ in 0..100 {
        if runs.started.load(Ordering::SeqCst) > started {
            break;
        }
        let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "the handler hangs");
        tokio::task::yield_now().await;
    }
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        started + 1,
        "the handler started"
    );
    drop(call);
}

async fn status(svc: &impl Svc, key: &str) -> StatusCode {
    svc.clone()
        .oneshot(request(key))
        .await
        .expect("infallible")
        .status()
}

/// With the defaults, a hung handler whose client left runs on for the detached timeout, then
/// is cancelled; its lease is no longer renewed, so the key is answered 409 until that lease
/// lapses (not released: the handler may have had effects), and the retry after it runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hung_handler_whose_client_left_is_cancelled_at_the_detached_timeout() {
    let layer = IdempotencyLayer::default();
    let in_flight = layer.drain();
    let (svc, runs) = service(&layer, 1);
    leave_mid_handler(&svc, &runs, "hung").await;
    assert_eq!(in_flight.detached(), 1, "the work runs on by itself");

    tokio::time::sleep(DEFAULT_DETACHED_TIMEOUT - Duration::from_secs(1)).await;
    assert_eq!(
        runs.cancelled.load(Ordering::SeqCst),
        0,
        "runs on until the bound"
    );
    assert_eq!(
        status(&svc, "hung").await,
        StatusCode::CONFLICT,
        "held, lease renewed"
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        runs.cancelled.load(Ordering::SeqCst),
        1,
        "cancelled at the bound"
    );
    assert_eq!(in_flight.detached(), 0, "its place is given back");
    assert!(in_flight.is_empty(), "no work left: {in_flight:?}");
    assert_eq!(
        status(&svc, "hung").await,
        StatusCode::CONFLICT,
        "not released: the key is left to its lease"
    );

    tokio::time::sleep(DEFAULT_LEASE).await;
    assert_eq!(
        status(&svc, "hung").await,
        StatusCode::CREATED,
        "the lease lapsed: the retry runs"
    );
    assert_eq!(runs.started.load(Ordering::SeqCst), 2);
}

/// The bound is the layer's own: a shorter one cancels sooner.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_detached_timeout_is_configurable() {
    let bound = Duration::from_secs(30);
    let layer = IdempotencyLayer::default().detached_timeout(bound);
    let (svc, runs) = service(&layer, 1);
    leave_mid_handler(&svc, &runs, "short").await;
    tokio::time::sleep(bound + Duration::from_secs(1)).await;
    assert_eq!(
        runs.cancelled.load(Ordering::SeqCst),
        1,
        "cancelled at 30 s"
    );
    tokio::time::sleep(DEFAULT_LEASE).await;
    assert_eq!(status(&svc, "short").await, StatusCode::CREATED);
}

/// Work dropped while the most detached work already runs is cancelled at once, its key left
/// to its lease; the work that did detach runs on, its key held.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn work_beyond_the_most_detached_is_cancelled_and_left_to_its_lease() {
    let layer = IdempotencyLayer::default().max_detached(1);
    let in_flight: Drain = layer.drain();
    let (svc, runs) = service(&layer, 2);
    leave_mid_handler(&svc, &runs, "first").await;
    leave_mid_handler(&svc, &runs, "second").await;
    tokio::task::yield_now().await;
    assert_eq!(in_flight.detached(), 1, "one detached, at most");
    assert_eq!(in_flight.len(), 1, "the second is not counted any more");
    assert_eq!(
        runs.cancelled.load(Ordering::SeqCst),
        1,
        "the second was cancelled"
    );
    assert_eq!(
        status(&svc, "second").await,
        StatusCode::CONFLICT,
        "left to its lease"
    );

    tokio::time::sleep(DEFAULT_LEASE + Duration::from_secs(1)).await;
    assert_eq!(
        status(&svc, "second").await,
        StatusCode::CREATED,
        "lapsed: runs again"
    );
    assert_eq!(
        status(&svc, "first").await,
        StatusCode::CONFLICT,
        "the detached one still holds its key"
    );
}

thread_local! {
    /// Panics raised on this thread (the test's; a current-thread runtime runs its tasks here).
    static PANICS: Cell<usize> = const { Cell::new(0) };
}

/// Counts panics per thread, then reports them as before.
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

/// A handler that panics, caught outside the layer (as `CatchPanicLayer` does), its call then
/// dropped: the work is not moved onto a task and polled again (which raised a second panic,
/// "`async fn` resumed after panicking"); the key is left to its lease, then the retry runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_handler_caught_outside_the_layer_is_not_polled_again() {
    count_panics();
    let layer = IdempotencyLayer::default();
    let in_flight = layer.drain();
    let panics_left = Arc::new(AtomicUsize::new(1));
    let left = Arc::clone(&panics_left);
    let inner = service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
        let panics = left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        async move {
            tokio::task::yield_now().await;
            assert!(!panics, "the handler panics on purpose");
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from_static(b"made")))
                    .expect("response"),
            )
        }
    });
    let mut svc = layer.layer(inner);
    let before = PANICS.with(Cell::get);
    let mut call: Pin<Box<_>> =
        Box::pin(svc.ready().await.expect("ready").call(request("k-panic")));
    let caught = loop {
        let polled = std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
                call.as_mut().poll(cx)
            })))
        })
        .await;
        match polled {
            Ok(Poll::Pending) => tokio::task::yield_now().await,
            Ok(Poll::Ready(_)) => break false,
            Err(_) => break true,
        }
    };
    assert!(caught, "the handler's panic unwinds through the layer");
    drop(call);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        PANICS.with(Cell::get) - before,
        1,
        "one panic, the handler's: the work is not polled again"
    );
    assert!(in_flight.is_empty(), "nothing runs on: {in_flight:?}");
    assert_eq!(
        status(&svc, "k-panic").await,
        StatusCode::CONFLICT,
        "the key is left to its lease"
    );
    tokio::time::sleep(DEFAULT_LEASE + Duration::from_secs(1)).await;
    assert_eq!(
        status(&svc, "k-panic").await,
        StatusCode::CREATED,
        "then the retry runs"
    );
}
