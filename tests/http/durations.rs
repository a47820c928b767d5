//! No `Duration` a user passes to a setter panics: every duration setter of the layer at
//! `ZERO` and `Duration::MAX`, and a repeat waiting without bound.
//! Paused clock: the longest waits pass at once.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::engine::Engine;
use tower_idempotency::http::{RequestBody, Streaming};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal};

/// The layered service, as the tests call it.
trait Svc:
    tower::Service<
        Request<Full<Bytes>>,
        Response = Response<tower_idempotency::http::ResponseBody<Full<Bytes>>>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> Svc for S where
    S: tower::Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency::http::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/work")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// Every duration setter of the layer and its engine at `d`.
fn every_duration(d: Duration) -> IdempotencyLayer {
    let engine = Engine::builder(MemoryStore::new())
        .lease(d)
        .retention(d)
        .build();
    IdempotencyLayer::new(engine)
        .streaming(Streaming::default().collect_timeout(d).lease_limit(d))
        .wait_in_flight(d)
        .detached_timeout(d)
}

/// A layer over a handler that sleeps `work` (on the paused clock) and answers 201; the runs
/// are counted.
fn sleeping(layer: &IdempotencyLayer, work: Duration) -> (impl Svc, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let svc = layer.layer(service_fn(
        move |_req: Request<RequestBody<Full<Bytes>>>| {
            r.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(work).await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from_static(b"made")))
                        .expect("response"),
                )
            }
        },
    ));
    (svc, runs)
}

/// Every setter at `ZERO`, then at `Duration::MAX`: a run and its retry, no panic.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_duration_setter_takes_zero_and_the_maximum() {
    for d in [Duration::ZERO, Duration::MAX] {
        let (svc, _) = sleeping(&every_duration(d), Duration::from_millis(10));
        let first = svc.clone().oneshot(request("k")).await.expect("infallible");
        assert_eq!(first.status(), StatusCode::CREATED, "{d:?}");
        let again = svc.clone().oneshot(request("k")).await.expect("infallible");
        assert!(
            again.status() == StatusCode::CREATED,
            "{d:?}: replayed or run again, never a failure: {}",
            again.status()
        );
    }
}

/// `wait_in_flight(Duration::MAX)`: the repeat waits for the first run and gets its replay
/// (it panicked at the first repeat).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_duplicate_waits_without_bound_for_the_first_run() {
    let layer = IdempotencyLayer::default().wait_in_flight(Duration::MAX);
    let (svc, runs) = sleeping(&layer, Duration::from_secs(5));
    let first = tokio::spawn(svc.clone().oneshot(request("k-wait")));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let repeat = svc
        .clone()
        .oneshot(request("k-wait"))
        .await
        .expect("infallible");
    assert_eq!(repeat.status(), StatusCode::CREATED);
    assert!(
        repeat.headers().contains_key("idempotent-replayed"),
        "the repeat waited and got the replay"
    );
    first.await.expect("the first run").expect("infallible");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
