//! gRPC mode with a real tonic client and server over loopback: first call, replay (message,
//! initial metadata, status and trailing metadata), concurrent repeats, released statuses,
//! every gRPC rejection, the layer on the whole server and around one service, and each kind
//! of streaming RPC (recorded when it fits the record limit, passed through and released when
//! it does not).
#![cfg(feature = "tonic")]

use crate::support::pb;

use bytes::Bytes;
use pb::orders_client::OrdersClient;
use pb::orders_server::{Orders, OrdersServer};
use pb::{CreateOrder, ImportSummary, Order, OrderEvent, WatchOrder};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::service::{InterceptorLayer, LayerExt};
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tower_idempotency::engine::Engine;
use tower_idempotency::http::{Rejection, RejectionKind};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal};

// ---------------------------------------------------------------------------------------------
// The service under test
// ---------------------------------------------------------------------------------------------

/// Counts its calls. `item` picks what `Create` does: "invalid" → INVALID_ARGUMENT with
/// details and metadata, "flaky" → UNAVAILABLE on the first call, "slow" → waits for the test
/// to let it go. `Watch` with id "fails" ends its stream with UNAVAILABLE; with id "endless"
/// it never ends.
#[derive(Clone, Default)]
struct OrderService {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    calls: AtomicUsize,
    entered: Notify,
    release: Notify,
}

impl OrderService {
    fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    fn count(&self) -> usize {
        self.state.calls.fetch_add(1, Ordering::SeqCst) + 1
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Orders for OrderService {
    async fn create(&self, request: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        let n = self.count();
        let m = request.into_inner();
        match m.item.as_str() {
            "invalid" => {
                let mut md = MetadataMap::new();
                md.insert("x-field", MetadataValue::from_static("quantity"));
                return Err(Status::with_details_and_metadata(
                    Code::InvalidArgument,
                    "quantity must be positive: 0 ≤ 0",
                    Bytes::from_static(b"\x08\x01details"),
                    md,
                ));
            }
            "flaky" if n == 1 => return Err(Status::unavailable("warming up")),
            "slow" => {
                self.state.entered.notify_one();
                self.state.release.notified().await;
            }
            _ => {}
        }
        let id = format!("o-{n}");
        let mut res = Response::new(Order {
            id: id.clone(),
            item: m.item,
            quantity: m.quantity,
        });
        res.metadata_mut()
            .insert("x-order-id", id.parse().expect("metadata value"));
        Ok(res)
    }

    type WatchStream = BoxStream<OrderEvent>;

    async fn watch(
        &self,
        request: Request<WatchOrder>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.count();
        let w = request.into_inner();
        let tail = (w.id == "fails").then(|| Err(Status::unavailable("lost the feed")));
        let id = w.id.clone();
        let padding = vec![b'x'; w.padding as usize];
        let events = (1..=w.events).map(move |seq| {
            Ok(OrderEvent {
                id: id.clone(),
                seq,
                padding: padding.clone(),
            })
        });
        let stream = tokio_stream::iter(events.chain(tail));
        if w.id == "endless" {
            // Its messages, then nothing, ever (a subscription).
            return Ok(Response::new(Box::pin(
                stream.chain(tokio_stream::pending()),
            )));
        }
        Ok(Response::new(Box::pin(stream)))
    }

    async fn import(
        &self,
        request: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<ImportSummary>, Status> {
        self.count();
        let mut stream = request.into_inner();
        let mut summary = ImportSummary::default();
        while let Some(m) = stream.message().await? {
            summary.count += 1;
            summary.total_quantity += m.quantity;
        }
        Ok(Response::new(summary))
    }

    type SyncStream = BoxStream<Order>;

    async fn sync(
        &self,
        request: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let n = self.count();
        let orders = request.into_inner().map(move |m| {
            m.map(|m| Order {
                id: format!("s-{n}-{}", m.item),
                item: m.item,
                quantity: m.quantity,
            })
        });
        Ok(Response::new(Box::pin(orders)))
    }
}

// ---------------------------------------------------------------------------------------------
// Servers and clients
// ---------------------------------------------------------------------------------------------

/// Demo authentication: `authorization: Bearer <name>` becomes the request's `Principal`.
#[allow(clippy::unnecessary_wraps, clippy::result_large_err)]
fn auth(mut req: Request<()>) -> Result<Request<()>, Status> {
    let name = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if let Some(name) = name {
        req.extensions_mut().insert(Principal::new(name));
    }
    Ok(req)
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    async fn client(&self) -> OrdersClient<Channel> {
        OrdersClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.expect("server task");
    }
}

/// Serves a `tonic::transport::server::Router` on 127.0.0.1:0 until `Running::stop`.
macro_rules! spawn {
    ($router:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let router = $router;
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Running {
            addr,
            stop: Some(stop),
            task,
        }
    }};
}

/// The layer on the whole server (`Server::builder().layer(…)`), behind the auth interceptor.
async fn serve(layer: IdempotencyLayer<MemoryStore>) -> (Running, OrderService) {
    let svc = OrderService::default();
    let running = spawn!(
        Server::builder()
            .layer(InterceptorLayer::new(auth))
            .layer(layer)
            .add_service(
                OrdersServer::new(svc.clone())
                    .send_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Gzip)
            )
    );
    (running, svc)
}

fn x_order_id() -> http::HeaderName {
    http::HeaderName::from_static("x-order-id")
}

/// The allow list of these tests: `x-order-id` (initial metadata of a created order) and
/// `x-field` (the trailing metadata of an `INVALID_ARGUMENT`).
fn layer() -> IdempotencyLayer<MemoryStore> {
    layer_over(Engine::new(MemoryStore::new()))
}

/// The test layer over an engine of its own (its record limit, say).
fn layer_over(engine: Engine<MemoryStore>) -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::new(engine)
        .allow_header(x_order_id())
        .expect("allowed")
        .allow_header(http::HeaderName::from_static("x-field"))
        .expect("allowed")
}

fn call<T>(msg: T, key: Option<&str>, who: Option<&str>) -> Request<T> {
    let mut req = Request::new(msg);
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", key.parse().expect("key"));
    }
    if let Some(who) = who {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {who}").parse().expect("auth"),
        );
    }
    req
}

fn order(item: &str, quantity: u32) -> CreateOrder {
    CreateOrder {
        item: item.to_owned(),
        quantity,
    }
}

fn meta<'a>(md: &'a MetadataMap, name: &str) -> Option<&'a str> {
    md.get(name).and_then(|v| v.to_str().ok())
}

fn replayed(md: &MetadataMap) -> bool {
    meta(md, "idempotent-replayed") == Some("true")
}

// ---------------------------------------------------------------------------------------------
// Unary
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn first_call_runs_and_a_repeat_is_replayed_with_its_metadata() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;

    let first = client
        .create(call(order("book", 2), Some("k-1"), Some("alice")))
        .await
        .expect("first call");
    assert!(!replayed(first.metadata()));
    assert_eq!(meta(first.metadata(), "x-order-id"), Some("o-1"));
    let first_order = first.into_inner();
    assert_eq!(first_order.id, "o-1");

    let again = client
        .create(call(order("book", 2), Some("k-1"), Some("alice")))
        .await
        .expect("replay");
    assert!(replayed(again.metadata()), "{:?}", again.metadata());
    assert_eq!(meta(again.metadata(), "x-order-id"), Some("o-1"));
    assert_eq!(again.into_inner(), first_order);
    assert_eq!(svc.calls(), 1, "the handler ran once");

    // Another principal's key of the same name is another key.
    let bob = client
        .create(call(order("book", 2), Some("k-1"), Some("bob")))
        .await
        .expect("bob");
    assert!(!replayed(bob.metadata()));
    assert_eq!(bob.into_inner().id, "o-2");
    server.stop().await;
}

#[tokio::test]
async fn a_compressed_response_replays() {
    let (server, svc) = serve(layer()).await;
    let mut client = server
        .client()
        .await
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip);
    let first = client
        .create(call(order("gzip", 1), Some("k-gz"), Some("alice")))
        .await
        .expect("first");
    assert_eq!(meta(first.metadata(), "grpc-encoding"), Some("gzip"));
    let again = client
        .create(call(order("gzip", 1), Some("k-gz"), Some("alice")))
        .await
        .expect("replay");
    assert!(replayed(again.metadata()));
    assert_eq!(meta(again.metadata(), "grpc-encoding"), Some("gzip"));
    assert_eq!(again.into_inner(), first.into_inner());
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_recorded_error_replays_its_status_details_and_metadata() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;
    let first = client
        .create(call(order("invalid", 0), Some("k-bad"), Some("alice")))
        .await
        .expect_err("INVALID_ARGUMENT");
    assert_eq!(first.code(), Code::InvalidArgument);
    assert_eq!(meta(first.metadata(), "x-field"), Some("quantity"));
    assert!(!replayed(first.metadata()));

    let again = client
        .create(call(order("invalid", 0), Some("k-bad"), Some("alice")))
        .await
        .expect_err("replayed INVALID_ARGUMENT");
    assert_eq!(again.code(), Code::InvalidArgument);
    assert_eq!(again.message(), first.message());
    assert_eq!(again.message(), "quantity must be positive: 0 ≤ 0");
    assert_eq!(again.details(), first.details());
    assert_eq!(meta(again.metadata(), "x-field"), Some("quantity"));
    assert!(replayed(again.metadata()), "{:?}", again.metadata());
    assert_eq!(svc.calls(), 1, "a caller-caused status is recorded");
    server.stop().await;
}

#[tokio::test]
async fn trailing_metadata_off_the_allow_list_is_not_replayed() {
    // The default allow list: `x-field` is not on it, the gRPC status trailers always are.
    let (server, svc) = serve(IdempotencyLayer::default()).await;
    let mut client = server.client().await;
    let first = client
        .create(call(order("invalid", 0), Some("k-md"), Some("alice")))
        .await
        .expect_err("INVALID_ARGUMENT");
    assert_eq!(meta(first.metadata(), "x-field"), Some("quantity"));

    let again = client
        .create(call(order("invalid", 0), Some("k-md"), Some("alice")))
        .await
        .expect_err("replayed INVALID_ARGUMENT");
    assert!(replayed(again.metadata()), "{:?}", again.metadata());
    assert_eq!(again.code(), Code::InvalidArgument);
    assert_eq!(again.message(), first.message());
    assert_eq!(
        again.details(),
        first.details(),
        "grpc-status-details-bin is kept"
    );
    assert_eq!(
        meta(again.metadata(), "x-field"),
        None,
        "metadata off the allow list is not replayed: {:?}",
        again.metadata()
    );
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_transient_status_is_released_and_the_retry_runs() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;
    let first = client
        .create(call(order("flaky", 1), Some("k-flaky"), Some("alice")))
        .await
        .expect_err("UNAVAILABLE");
    assert_eq!(first.code(), Code::Unavailable);
    assert_eq!(first.message(), "warming up");

    let retry = client
        .create(call(order("flaky", 1), Some("k-flaky"), Some("alice")))
        .await
        .expect("the retry runs the handler again");
    assert!(!replayed(retry.metadata()));
    assert_eq!(retry.into_inner().id, "o-2");
    assert_eq!(svc.calls(), 2);

    let third = client
        .create(call(order("flaky", 1), Some("k-flaky"), Some("alice")))
        .await
        .expect("replay of the success");
    assert!(replayed(third.metadata()));
    assert_eq!(third.into_inner().id, "o-2");
    assert_eq!(svc.calls(), 2);
    server.stop().await;
}

#[tokio::test]
async fn a_concurrent_duplicate_is_aborted() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;
    let mut first_client = client.clone();
    let first = tokio::spawn(async move {
        first_client
            .create(call(order("slow", 1), Some("k-slow"), Some("alice")))
            .await
    });
    svc.state.entered.notified().await;

    let dup = client
        .create(call(order("slow", 1), Some("k-slow"), Some("alice")))
        .await
        .expect_err("ABORTED");
    assert_eq!(dup.code(), Code::Aborted);
    assert!(
        dup.message().starts_with("idempotency.in_flight: "),
        "{}",
        dup.message()
    );
    // The lease the first call has left (the default 60 s), at most a third of the lease.
    assert_eq!(
        meta(dup.metadata(), "grpc-retry-pushback-ms"),
        Some("20000")
    );

    svc.state.release.notify_one();
    let first = first.await.expect("task").expect("first call");
    assert_eq!(first.into_inner().id, "o-1");
    let again = client
        .create(call(order("slow", 1), Some("k-slow"), Some("alice")))
        .await
        .expect("replay");
    assert!(replayed(again.metadata()));
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Rejections
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn rejections_are_grpc_statuses() {
    // A custom HTTP renderer does not apply to gRPC callers.
    let (server, svc) = serve(
        layer()
            .max_request_body(64)
            .render_rejection(|_| http::Response::new(Bytes::from_static(b"custom"))),
    )
    .await;
    let mut client = server.client().await;

    let first = client
        .create(call(order("book", 1), Some("k-r"), Some("alice")))
        .await
        .expect("first");
    assert_eq!(first.into_inner().id, "o-1");

    let cases: [(Request<CreateOrder>, Code, &str); 5] = [
        (
            call(order("book", 9), Some("k-r"), Some("alice")),
            Code::FailedPrecondition,
            "idempotency.key_reused",
        ),
        (
            call(order("book", 1), None, Some("alice")),
            Code::InvalidArgument,
            "idempotency.key_missing",
        ),
        (
            call(order("book", 1), Some("a b"), Some("alice")),
            Code::InvalidArgument,
            "idempotency.key_invalid",
        ),
        (
            call(order("book", 1), Some("k-anon"), None),
            Code::Unauthenticated,
            "idempotency.principal_missing",
        ),
        (
            call(order(&"x".repeat(100), 1), Some("k-big"), Some("alice")),
            Code::ResourceExhausted,
            "idempotency.body_too_large",
        ),
    ];
    for (req, code, machine) in cases {
        let status = client.create(req).await.expect_err(machine);
        assert_eq!(status.code(), code, "{machine}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{machine}: ")),
            "{machine}: {}",
            status.message()
        );
    }
    assert_eq!(svc.calls(), 1, "no rejected call reached the handler");
    server.stop().await;
}

/// One layer in front of a mixed service: a JSON request gets problem+json, a gRPC request a
/// gRPC status; the `Rejection` is in the response extensions either way.
#[tokio::test]
async fn one_layer_serves_http_and_grpc_callers() {
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, ServiceExt};

    let svc = IdempotencyLayer::default().layer(OrdersServer::new(OrderService::default()));
    let http_req = http::Request::post("/orders.v1.Orders/Create")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let res = svc.clone().oneshot(http_req).await.expect("infallible");
    assert_eq!(res.status(), http::StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert_eq!(
        res.extensions().get::<Rejection>().map(Rejection::kind),
        Some(RejectionKind::PrincipalMissing)
    );

    let grpc_req = http::Request::post("/orders.v1.Orders/Create")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("request");
    let res = svc.oneshot(grpc_req).await.expect("infallible");
    assert_eq!(res.status(), http::StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert_eq!(res.headers()["grpc-status"], "16");
    let rejection = res
        .extensions()
        .get::<Rejection>()
        .cloned()
        .expect("rejection in extensions");
    assert_eq!(rejection.kind(), RejectionKind::PrincipalMissing);
    let status = Status::from_header_map(res.headers()).expect("status");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(status.message(), rejection.grpc_message());
    let expected = rejection.to_status();
    assert_eq!(expected.code(), status.code());
    assert_eq!(expected.message(), status.message());
    assert!(
        res.into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .is_empty()
    );
}

// ---------------------------------------------------------------------------------------------
// The layer around one service
// ---------------------------------------------------------------------------------------------

async fn first_and_replay(server: Running, svc: &OrderService) {
    let mut client = server.client().await;
    let first = client
        .create(call(order("lamp", 1), Some("k-one"), Some("alice")))
        .await
        .expect("first");
    let again = client
        .create(call(order("lamp", 1), Some("k-one"), Some("alice")))
        .await
        .expect("replay");
    assert!(replayed(again.metadata()));
    assert_eq!(again.into_inner(), first.into_inner());
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

#[tokio::test]
async fn around_one_service_with_named_layer() {
    let svc = OrderService::default();
    let server = spawn!(
        Server::builder()
            .layer(InterceptorLayer::new(auth))
            .add_service(layer().named_layer(OrdersServer::new(svc.clone())))
    );
    first_and_replay(server, &svc).await;
}

#[tokio::test]
async fn around_one_service_with_service_builder() {
    let svc = OrderService::default();
    let server = spawn!(
        Server::builder()
            .layer(InterceptorLayer::new(auth))
            .add_service(
                tower::ServiceBuilder::new()
                    .layer(layer())
                    .service(OrdersServer::new(svc.clone()))
            )
    );
    first_and_replay(server, &svc).await;
}

// ---------------------------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------------------------

async fn watch(
    client: &mut OrdersClient<Channel>,
    id: &str,
    events: u32,
    padding: u32,
) -> (MetadataMap, Vec<OrderEvent>, Status) {
    let w = WatchOrder {
        id: id.to_owned(),
        events,
        padding,
    };
    let res = client
        .watch(call(w, Some(&format!("k-{id}")), Some("alice")))
        .await
        .expect("watch");
    let md = res.metadata().clone();
    let mut stream = res.into_inner();
    let mut got = Vec::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(e)) => got.push(e),
            Ok(None) => break Status::ok(""),
            Err(s) => break s,
        }
    };
    (md, got, status)
}

#[tokio::test]
async fn a_server_stream_within_the_record_limit_is_recorded_and_replayed() {
    let (server, svc) = serve(layer_over(
        Engine::builder(MemoryStore::new())
            .max_record_body(4096)
            .build(),
    ))
    .await;
    let mut client = server.client().await;
    let (md, first, status) = watch(&mut client, "small", 5, 100).await;
    assert_eq!(status.code(), Code::Ok);
    assert!(!replayed(&md));
    assert_eq!(first.len(), 5);
    let (md, again, status) = watch(&mut client, "small", 5, 100).await;
    assert_eq!(status.code(), Code::Ok);
    assert!(replayed(&md));
    assert_eq!(again, first);
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_server_stream_over_the_record_limit_is_passed_through_whole_and_released() {
    let (server, svc) = serve(layer_over(
        Engine::builder(MemoryStore::new())
            .max_record_body(4096)
            .build(),
    ))
    .await;
    let mut client = server.client().await;
    for attempt in 1..=2 {
        let (md, got, status) = watch(&mut client, "large", 40, 1000).await;
        assert_eq!(status.code(), Code::Ok, "attempt {attempt}: {status:?}");
        assert!(!replayed(&md), "attempt {attempt}");
        assert_eq!(got.len(), 40, "attempt {attempt}: the whole stream");
        assert!(
            got.iter()
                .zip(1..)
                .all(|(e, seq)| e.seq == seq && e.padding.len() == 1000),
            "attempt {attempt}: in order, intact"
        );
        assert_eq!(svc.calls(), attempt, "released: the repeat runs again");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_server_stream_that_never_ends_goes_out_after_the_collection_bound_and_is_released() {
    let bound = std::time::Duration::from_millis(200);
    let (server, svc) = serve(
        layer().streaming(tower_idempotency::http::Streaming::default().collect_timeout(bound)),
    )
    .await;
    let mut client = server.client().await;
    for attempt in 1..=2 {
        let w = WatchOrder {
            id: "endless".to_owned(),
            events: 3,
            padding: 10,
        };
        let opened = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let res = client
                .watch(call(w, Some("k-endless"), Some("alice")))
                .await
                .expect("watch");
            assert!(!replayed(res.metadata()), "attempt {attempt}");
            let mut stream = res.into_inner();
            let mut got = Vec::new();
            while got.len() < 3 {
                got.push(stream.message().await.expect("a message").expect("more"));
            }
            (stream, got)
        })
        .await;
        let (_stream, got) = opened.unwrap_or_else(|_| {
            panic!("attempt {attempt}: the messages were held back until the stream's end")
        });
        assert!(
            got.iter().zip(1..).all(|(e, seq)| e.seq == seq),
            "attempt {attempt}: in order"
        );
        // Released (its status comes at an end that never comes): the repeat runs again.
        assert_eq!(svc.calls(), attempt);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_server_stream_ending_in_a_transient_status_is_released() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;
    for attempt in 1..=2 {
        let (md, got, status) = watch(&mut client, "fails", 3, 10).await;
        assert_eq!(
            got.len(),
            3,
            "attempt {attempt}: the messages before the error"
        );
        assert_eq!(status.code(), Code::Unavailable, "attempt {attempt}");
        assert_eq!(status.message(), "lost the feed");
        assert!(!replayed(&md));
        assert_eq!(svc.calls(), attempt);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_client_stream_is_buffered_fingerprinted_and_replayed() {
    let (server, svc) = serve(layer().max_request_body(256)).await;
    let mut client = server.client().await;
    let batch = |n: u32| tokio_stream::iter((1..=n).map(|q| order("pen", q)));

    let first = client
        .import(call(batch(3), Some("k-import"), Some("alice")))
        .await
        .expect("first");
    assert_eq!(
        first.get_ref(),
        &ImportSummary {
            count: 3,
            total_quantity: 6
        }
    );
    let again = client
        .import(call(batch(3), Some("k-import"), Some("alice")))
        .await
        .expect("replay");
    assert!(replayed(again.metadata()));
    assert_eq!(again.into_inner(), first.into_inner());

    let other = client
        .import(call(batch(4), Some("k-import"), Some("alice")))
        .await
        .expect_err("another stream under the same key");
    assert_eq!(other.code(), Code::FailedPrecondition);

    let too_big = client
        .import(call(batch(50), Some("k-import-big"), Some("alice")))
        .await
        .expect_err("over the request limit");
    assert_eq!(too_big.code(), Code::ResourceExhausted);
    assert!(too_big.message().starts_with("idempotency.body_too_large"));
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_bidirectional_stream_is_recorded_and_replayed() {
    let (server, svc) = serve(layer()).await;
    let mut client = server.client().await;
    let input = || tokio_stream::iter(["a", "b", "c"].map(|i| order(i, 1)));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let res = client
            .sync(call(input(), Some("k-sync"), Some("alice")))
            .await
            .expect("sync");
        let md = res.metadata().clone();
        let got: Vec<Order> = res
            .into_inner()
            .collect::<Result<_, _>>()
            .await
            .expect("whole stream");
        runs.push((replayed(&md), got));
    }
    assert!(!runs[0].0);
    assert!(runs[1].0);
    assert_eq!(runs[0].1.len(), 3);
    assert_eq!(runs[0].1, runs[1].1);
    assert_eq!(svc.calls(), 1);
    server.stop().await;
}

/// `ResponseMode::StatusAndHeaders` keeps no messages: statuses and metadata replay, a stream replays
/// empty, and a unary OK replays without its message (which a tonic client refuses).
#[tokio::test]
async fn status_mode_replays_statuses_and_metadata_without_messages() {
    use tower_idempotency::http::ResponseMode;
    let (server, svc) = serve(layer().response_mode(ResponseMode::StatusAndHeaders)).await;
    let mut client = server.client().await;

    let (_, first, status) = watch(&mut client, "status-mode", 2, 10).await;
    assert_eq!((first.len(), status.code()), (2, Code::Ok));
    let (md, again, status) = watch(&mut client, "status-mode", 2, 10).await;
    assert!(replayed(&md));
    assert_eq!(
        (again.len(), status.code()),
        (0, Code::Ok),
        "an empty stream"
    );

    for _ in 0..2 {
        let err = client
            .create(call(order("invalid", 0), Some("k-sm-bad"), Some("alice")))
            .await
            .expect_err("INVALID_ARGUMENT");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(meta(err.metadata(), "x-field"), Some("quantity"));
    }

    client
        .create(call(order("book", 1), Some("k-sm-ok"), Some("alice")))
        .await
        .expect("first");
    let replay = client
        .create(call(order("book", 1), Some("k-sm-ok"), Some("alice")))
        .await
        .expect_err("a unary OK without its message");
    assert_eq!(replay.code(), Code::Internal, "{replay:?}");
    assert_eq!(svc.calls(), 3, "watch, invalid, book: each ran once");
    server.stop().await;
}
