//! The tower stack on a tonic channel (`StampKeyLayer` + `BufferRequestLayer` + `RetryLayer`)
//! against a tonic server behind the layer with `MemoryStore`: `ABORTED` in flight is retried
//! after its pushback and answered from the record; `FAILED_PRECONDITION` for a reused key is
//! returned at once; a handler's `UNAVAILABLE` is retried where the channel's server is
//! declared to honour keys, and not by default.
#![cfg(feature = "tonic")]

use crate::support::pb;

use pb::orders_client::OrdersClient;
use pb::orders_server::{Orders, OrdersServer};
use pb::{CreateOrder, ImportSummary, Order, OrderEvent, WatchOrder};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::InterceptorLayer;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;
use tower_idempotency::{IdempotencyLayer, Principal};
use tower_idempotency_client::{Attempts, BufferRequestLayer, BufferedBody, StampKeyLayer};

/// Counts its calls; item "slow" waits until released, "flaky" is `UNAVAILABLE` on the first
/// call (released by the layer, so the retry runs it again). `import` counts the messages it
/// read (`UNAVAILABLE` on the first call when the first item is "flaky"); `sync` answers each
/// message as it arrives.
#[derive(Clone, Default)]
struct Service {
    calls: Arc<AtomicUsize>,
    messages: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Orders for Service {
    async fn create(&self, request: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let m = request.into_inner();
        match m.item.as_str() {
            "slow" => {
                self.entered.notify_one();
                self.release.notified().await;
            }
            "flaky" if n == 1 => return Err(Status::unavailable("warming up")),
            _ => {}
        }
        Ok(Response::new(Order {
            id: format!("o-{n}"),
            item: m.item,
            quantity: m.quantity,
        }))
    }

    type WatchStream = Stream<OrderEvent>;

    async fn watch(&self, _: Request<WatchOrder>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in these tests"))
    }

    async fn import(
        &self,
        request: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<ImportSummary>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let mut stream = request.into_inner();
        let (mut count, mut total, mut flaky) = (0, 0, false);
        while let Some(m) = stream.message().await? {
            flaky |= count == 0 && m.item == "flaky";
            count += 1;
            total += m.quantity;
            self.messages.fetch_add(1, Ordering::SeqCst);
        }
        if flaky && n == 1 {
            return Err(Status::unavailable("warming up"));
        }
        Ok(Response::new(ImportSummary {
            count,
            total_quantity: total,
        }))
    }

    type SyncStream = Stream<Order>;

    async fn sync(
        &self,
        request: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut stream = request.into_inner();
        let answers = async_stream_of(move |tx| async move {
            let mut n = 0;
            while let Ok(Some(m)) = stream.message().await {
                n += 1;
                let order = Order {
                    id: format!("s-{n}"),
                    item: m.item,
                    quantity: m.quantity,
                };
                if tx.send(Ok(order)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(answers))
    }
}

/// A stream fed by a task running `f` with the sending half of a channel.
fn async_stream_of<T, F, Fut>(f: F) -> Stream<T>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[allow(clippy::unnecessary_wraps, clippy::result_large_err)]
fn auth(mut req: Request<()>) -> Result<Request<()>, Status> {
    req.extensions_mut().insert(Principal::new("alice"));
    Ok(req)
}

async fn serve() -> (SocketAddr, Service) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let svc = Service::default();
    let router = Server::builder()
        .layer(InterceptorLayer::new(auth))
        // A 3 s lease: the pushback of an in-flight call (the lease left, at most a third of
        // the lease) is then 1 s.
        .layer(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(tower_idempotency::MemoryStore::new())
                .lease(Duration::from_secs(3))
                .build(),
        ))
        .add_service(OrdersServer::new(svc.clone()));
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("serve");
    });
    (addr, svc)
}

/// The same service without the idempotency layer, for the client's streaming calls (what
/// the client's buffer layer does with them, whatever the server).
async fn serve_plain() -> (SocketAddr, Service) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let svc = Service::default();
    let router = Server::builder().add_service(OrdersServer::new(svc.clone()));
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("serve");
    });
    (addr, svc)
}

/// A generated client over the retrying tower stack (no server declared to honour keys, or
/// the policy given).
macro_rules! retrying_client {
    ($addr:expr) => {
        retrying_client!($addr, crate::rig::policy())
    };
    ($addr:expr, $policy:expr) => {
        retrying_client!($addr, $policy, BufferRequestLayer::new())
    };
    ($addr:expr, $policy:expr, $buffer:expr) => {{
        let channel = Channel::from_shared(format!("http://{}", $addr))
            .expect("uri")
            .connect_lazy();
        let stack = ServiceBuilder::new()
            .layer(StampKeyLayer::new())
            .layer($buffer)
            .layer(RetryLayer::new($policy))
            .map_request(|req: http::Request<BufferedBody>| req.map(tonic::body::Body::new))
            .service(channel);
        OrdersClient::new(stack)
    }};
}

fn create(item: &str, key: Option<&str>) -> Request<CreateOrder> {
    let mut req = Request::new(CreateOrder {
        item: item.to_owned(),
        quantity: 1,
    });
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", key.parse().expect("key"));
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_aborted_in_flight_is_retried_after_its_pushback() {
    let (addr, svc) = serve().await;
    let key = "grpc-in-flight";
    let mut direct = OrdersClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let entered = svc.entered.notified();
    let first = tokio::spawn(async move { direct.create(create("slow", Some(key))).await });
    entered.await;
    let release = {
        let svc = svc.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            svc.release.notify_one();
        }
    };
    let mut client = retrying_client!(addr);
    let start = Instant::now();
    let (res, ()) = tokio::join!(client.create(create("slow", Some(key))), release);
    let res = res.expect("the retry is answered from the record");
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "waited for the 1 s pushback: {:?}",
        start.elapsed()
    );
    let attempts = res
        .extensions()
        .get::<Attempts>()
        .cloned()
        .expect("Attempts");
    assert_eq!(attempts.count(), 2, "ABORTED, then the replay");
    assert!(attempts.replayed());
    assert_eq!(res.into_inner().id, "o-1", "the first run's answer");
    first.await.expect("task").expect("the first call");
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_key_reused_is_not_retried() {
    let (addr, svc) = serve().await;
    let mut client = retrying_client!(addr);
    let key = "grpc-reused";
    client
        .create(create("chair", Some(key)))
        .await
        .expect("first");
    let status = client
        .create(create("table", Some(key)))
        .await
        .expect_err("the key was used for another order");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().starts_with("idempotency.key_reused"),
        "{status:?}"
    );
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1, "not retried, not run");
}

/// A handler's `UNAVAILABLE` may follow a run: retried only where keys are declared honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unavailable_from_a_handler_is_not_retried_by_default() {
    let (addr, svc) = serve().await;
    let mut client = retrying_client!(addr);
    let status = client
        .create(create("flaky", None))
        .await
        .expect_err("the first call's answer");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1, "not sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unavailable_is_retried_with_a_stamped_key() {
    let (addr, svc) = serve().await;
    let mut client = retrying_client!(addr, crate::rig::policy().keys_honoured_by_all());
    let res = client
        .create(create("flaky", None))
        .await
        .expect("the retry succeeds");
    let attempts = res
        .extensions()
        .get::<Attempts>()
        .cloned()
        .expect("Attempts");
    assert_eq!(attempts.count(), 2, "UNAVAILABLE, then the run");
    assert!(
        !attempts.replayed(),
        "UNAVAILABLE is released, the retry runs"
    );
    assert_eq!(res.into_inner().id, "o-2");
    assert_eq!(svc.calls.load(Ordering::SeqCst), 2);
}

fn orders(items: &[&str]) -> Vec<CreateOrder> {
    items
        .iter()
        .map(|item| CreateOrder {
            item: (*item).to_owned(),
            quantity: 1,
        })
        .collect()
}

/// A bidirectional call whose caller waits for the first answer before it sends the second
/// message: the buffer layer must not wait for the caller's stream to end (it would wait for
/// ever); the call goes through at once, sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_call_that_waits_for_an_answer_is_not_held() {
    let (addr, svc) = serve_plain().await;
    let mut client = retrying_client!(addr, crate::rig::policy().keys_honoured_by_all());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(orders(&["first"]).remove(0)).await.expect("send");
    let talk = async {
        let res = client
            .sync(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("the call starts");
        assert!(
            res.extensions().get::<Attempts>().is_none(),
            "a streamed call bypasses the retries"
        );
        let mut answers = res.into_inner();
        let first = answers.message().await.expect("answer").expect("one");
        assert_eq!(first.item, "first");
        tx.send(orders(&["second"]).remove(0)).await.expect("send");
        let second = answers.message().await.expect("answer").expect("two");
        assert_eq!(second.item, "second");
        drop(tx);
        assert!(answers.message().await.expect("end").is_none());
    };
    tokio::time::timeout(Duration::from_secs(20), talk)
        .await
        .expect("the bidi call was held by the buffer layer");
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1);
}

/// A client stream longer than the buffer's limit is not held whole: it is sent on as it is
/// read, once; the handler's `UNAVAILABLE` is not retried (no copy was kept) and every message
/// arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stream_over_the_limit_is_sent_once_and_whole() {
    let (addr, svc) = serve_plain().await;
    let mut client = retrying_client!(
        addr,
        crate::rig::policy().keys_honoured_by_all(),
        BufferRequestLayer::new().limit(256)
    );
    let mut items = vec!["flaky"; 1];
    items.extend(std::iter::repeat_n("bulk-order-item", 99));
    let status = client
        .import(tokio_stream::iter(orders(&items)))
        .await
        .expect_err("the first call's UNAVAILABLE, not retried");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1, "sent once");
    assert_eq!(
        svc.messages.load(Ordering::SeqCst),
        100,
        "every message arrived"
    );
}

/// A client stream whose messages are all ready and fit the limit is held whole, so it is
/// retried like a unary call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stream_within_the_limit_is_buffered_and_retried() {
    let (addr, svc) = serve_plain().await;
    let mut client = retrying_client!(addr, crate::rig::policy().keys_honoured_by_all());
    let res = client
        .import(tokio_stream::iter(orders(&["flaky", "b", "c"])))
        .await
        .expect("the retry succeeds");
    let attempts = res
        .extensions()
        .get::<Attempts>()
        .cloned()
        .expect("Attempts");
    assert_eq!(attempts.count(), 2, "UNAVAILABLE, then the run");
    let summary = res.into_inner();
    assert_eq!(summary.count, 3);
    assert_eq!(svc.calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        svc.messages.load(Ordering::SeqCst),
        6,
        "each attempt sent all three"
    );
}
