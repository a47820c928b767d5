//! The idempotency layer in front of a tonic gRPC server, and a tonic client calling it.
//!
//! ```text
//! cargo run --example grpc --features tonic
//! ```
//!
//! Starts an order service on 127.0.0.1 (a free port) with `IdempotencyLayer` on
//! `Server::builder().layer(…)`, behind a demo authentication interceptor, then makes three
//! calls under one idempotency key: the first runs the handler, the repeat is replayed
//! (`idempotent-replayed: true`, the same order), and the same key with another request is
//! refused with FAILED_PRECONDITION. Then it stops the server and exits.
//!
//! The service is generated from `tests/support/grpc/orders.proto`; the generated code is
//! checked in next to it, so no protoc is needed.

#[path = "../tests/support/grpc/orders.v1.rs"]
#[allow(
    unreachable_pub,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    clippy::all
)]
mod pb;

use pb::orders_client::OrdersClient;
use pb::orders_server::{Orders, OrdersServer};
use pb::{CreateOrder, ImportSummary, Order, OrderEvent, WatchOrder};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::InterceptorLayer;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};
use tower_idempotency::{IdempotencyLayer, Principal};

/// An order service that numbers the orders it creates (so a replay is easy to tell from a
/// second run).
#[derive(Default)]
struct OrderService {
    created: AtomicU32,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Orders for OrderService {
    async fn create(&self, request: Request<CreateOrder>) -> Result<Response<Order>, Status> {
        let n = self.created.fetch_add(1, Ordering::SeqCst) + 1;
        let m = request.into_inner();
        println!("  [server] handler runs: creating order o-{n}");
        let mut res = Response::new(Order {
            id: format!("o-{n}"),
            item: m.item,
            quantity: m.quantity,
        });
        res.metadata_mut().insert(
            "x-order-id",
            format!("o-{n}")
                .parse()
                .map_err(|_| Status::internal("id"))?,
        );
        Ok(res)
    }

    type WatchStream = BoxStream<OrderEvent>;

    async fn watch(&self, _: Request<WatchOrder>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }

    async fn import(
        &self,
        _: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<ImportSummary>, Status> {
        Err(Status::unimplemented("not in this example"))
    }

    type SyncStream = BoxStream<Order>;

    async fn sync(
        &self,
        _: Request<Streaming<CreateOrder>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        Err(Status::unimplemented("not in this example"))
    }
}

/// Demo authentication: `authorization: Bearer <name>` becomes the caller's `Principal`
/// (idempotency keys are scoped per principal). Use your real authentication here.
#[allow(clippy::result_large_err)]
fn authenticate(mut req: Request<()>) -> Result<Request<()>, Status> {
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

fn create(
    item: &str,
    quantity: u32,
    key: &str,
) -> Result<Request<CreateOrder>, Box<dyn std::error::Error>> {
    let mut req = Request::new(CreateOrder {
        item: item.to_owned(),
        quantity,
    });
    req.metadata_mut().insert("idempotency-key", key.parse()?);
    req.metadata_mut()
        .insert("authorization", "Bearer alice".parse()?);
    Ok(req)
}

fn show(res: &Response<Order>) -> String {
    let md = res.metadata();
    let get = |name: &str| md.get(name).and_then(|v| v.to_str().ok()).unwrap_or("-");
    format!(
        "order {} ({} x {}); x-order-id: {}; idempotent-replayed: {}",
        res.get_ref().id,
        res.get_ref().quantity,
        res.get_ref().item,
        get("x-order-id"),
        get("idempotent-replayed"),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();

    // Order matters: the interceptor runs first (outermost) and sets the principal.
    let idempotency = IdempotencyLayer::default()
        // Replay this response metadata entry too (content-type and grpc-encoding are
        // replayed by default; so are the status trailers, while custom trailing metadata
        // needs the allow list too).
        .allow_header(http::HeaderName::from_static("x-order-id"))?;
    let server = tokio::spawn(
        Server::builder()
            .layer(InterceptorLayer::new(authenticate))
            .layer(idempotency)
            .add_service(OrdersServer::new(OrderService::default()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    println!("gRPC server on {addr}");

    let mut client = OrdersClient::connect(format!("http://{addr}")).await?;
    let key = "3f1c9a52-order-1";

    println!("1. first call, idempotency-key {key}");
    let first = client.create(create("book", 2, key)?).await?;
    println!("   -> {}", show(&first));

    println!("2. the same call again (a retry after a timeout, say)");
    let again = client.create(create("book", 2, key)?).await?;
    println!("   -> {}  (the handler did not run)", show(&again));

    println!("3. the same key with a different request");
    match client.create(create("book", 5, key)?).await {
        Ok(res) => println!("   -> unexpected success: {}", show(&res)),
        Err(status) => println!("   -> {:?}: {}", status.code(), status.message()),
    }

    let _ = stop.send(());
    server.await??;
    println!("server stopped");
    Ok(())
}
