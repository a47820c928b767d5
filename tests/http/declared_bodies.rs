//! A declared response whose body cannot be recorded whole (over the record limit,
//! slower than the collection bound, failing) never frees its key: its status and headers are
//! recorded at once, and the retry is replayed them. A gRPC one, whose status is in trailers
//! the layer could not read, holds its key. Paused clock: no real-time bound to overrun.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::engine::Verdict;
use tower_idempotency::http::RequestBody;
use tower_idempotency::{IdempotencyLayer, Principal};

/// The engine's default lease.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// One step of a response body.
enum Step {
    Data(&'static [u8]),
    Wait(Duration),
    Fail,
}

/// A body that plays its steps: data frames, waits on the (paused) clock, a failure.
struct Scripted {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Scripted {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            sleep: None,
        }
    }
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            return match self.steps.pop_front() {
                None => Poll::Ready(None),
                Some(Step::Data(d)) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(d))))),
                Some(Step::Fail) => Poll::Ready(Some(Err(std::io::Error::other("body failed")))),
                Some(Step::Wait(d)) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(d)));
                    continue;
                }
            };
        }
    }
}

/// The layered service, as the tests call it.
trait Svc:
    tower::Service<
        Request<Full<Bytes>>,
        Response = Response<tower_idempotency::http::ResponseBody<Scripted>>,
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
            Response = Response<tower_idempotency::http::ResponseBody<Scripted>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

fn request(key: &str, grpc: bool) -> Request<Full<Bytes>> {
    let content_type = if grpc {
        "application/grpc"
    } else {
        "application/json"
    };
    Request::post("/charge")
        .header("idempotency-key", key)
        .header("content-type", content_type)
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// A layer over a handler that charges (counted), declares its 500 recorded and answers
/// with `steps`; the second return counts the runs.
fn charging(
    layer: IdempotencyLayer,
    status: u16,
    grpc: bool,
    steps: fn() -> Vec<Step>,
) -> (impl Svc, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let svc = layer.layer(service_fn(
        move |_req: Request<RequestBody<Full<Bytes>>>| {
            r.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut res = Response::builder()
                    .status(status)
                    .header(
                        "content-type",
                        if grpc {
                            "application/grpc"
                        } else {
                            "text/plain"
                        },
                    )
                    .body(Scripted::new(steps()))
                    .expect("response");
                tower_idempotency::http::declare(&mut res, Verdict::Record);
                Ok::<_, Infallible>(res)
            }
        },
    ));
    (svc, runs)
}

/// Sends once and reads the answer's body to its end (or failure): `(status, body failed)`.
async fn send(svc: &impl Svc, key: &str, grpc: bool) -> (StatusCode, bool, bool) {
    let res = svc
        .clone()
        .oneshot(request(key, grpc))
        .await
        .expect("infallible");
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let failed = res.into_body().collect().await.is_err();
    (status, replayed, failed)
}

/// The first run's body fails while the layer reads it to record it; declared,
/// the retry is replayed the 500 (status and headers), not charged again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_declared_answer_whose_body_fails_is_recorded_not_released() {
    let (svc, runs) = charging(IdempotencyLayer::default(), 500, false, || {
        vec![Step::Data(b"charged"), Step::Fail]
    });
    let (status, replayed, failed) = send(&svc, "fails", false).await;
    assert_eq!(
        (status, replayed, failed),
        (StatusCode::INTERNAL_SERVER_ERROR, false, true)
    );
    let (status, replayed, _) = send(&svc, "fails", false).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(replayed, "the retry is replayed the declared answer");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
}

/// Over the record limit, then failing: recorded as status and headers, replayed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_declared_answer_over_the_record_limit_that_fails_is_recorded() {
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(tower_idempotency::MemoryStore::new())
            .max_record_body(4)
            .build(),
    );
    let (svc, runs) = charging(layer, 201, false, || {
        vec![Step::Data(b"0123456789"), Step::Fail]
    });
    let (status, _, failed) = send(&svc, "large", false).await;
    assert_eq!((status, failed), (StatusCode::CREATED, true));
    let (status, replayed, failed) = send(&svc, "large", false).await;
    assert_eq!(
        (status, replayed, failed),
        (StatusCode::CREATED, true, false)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
}

/// Slower than the collection bound, and the client leaves before its end: recorded at once,
/// so the retry is replayed, even after the lease (which a held key would have let lapse).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_declared_answer_whose_client_leaves_is_recorded() {
    let layer = IdempotencyLayer::default().streaming(
        tower_idempotency::http::Streaming::default().collect_timeout(Duration::from_secs(1)),
    );
    let (svc, runs) = charging(layer, 500, false, || {
        vec![
            Step::Data(b"charged"),
            Step::Wait(Duration::from_secs(10)),
            Step::Data(b"; order not stored"),
        ]
    });
    let res = svc
        .clone()
        .oneshot(request("slow", false))
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    drop(res); // the client leaves mid-body
    tokio::time::sleep(DEFAULT_LEASE * 2).await;
    let (status, replayed, _) = send(&svc, "slow", false).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(replayed, "replayed, not run again");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
}

/// gRPC: a declared answer over the record limit has its status in trailers the layer
/// cannot read; the key is held until its lease lapses (409), never released at once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_declared_grpc_answer_over_the_record_limit_holds_its_key() {
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(tower_idempotency::MemoryStore::new())
            .max_record_body(4)
            .build(),
    );
    let (svc, runs) = charging(layer, 200, true, || vec![Step::Data(b"0123456789")]);
    let (status, _, _) = send(&svc, "grpc-large", true).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = send(&svc, "grpc-large", true).await;
    assert_eq!(status, StatusCode::OK, "a gRPC rejection is an HTTP 200");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "held: not run again at once"
    );
    tokio::time::sleep(DEFAULT_LEASE + Duration::from_secs(1)).await;
    send(&svc, "grpc-large", true).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the lease lapsed: runs again"
    );
}
