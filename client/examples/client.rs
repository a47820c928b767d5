//! Calling an idempotent API with retries, through a flaky network.
//!
//! ```text
//! cargo run -p tower-idempotency-client --example client --features reqwest
//! ```
//!
//! Everything runs in this process, on loopback ports it picks. An order API runs behind
//! `IdempotencyLayer`. A flaky TCP proxy in front of it loses the first answer after the
//! handler ran, then resets the next connection.
//!
//! The client is `reqwest-middleware` with `RetryMiddleware`. It stamps one key on the order
//! and retries with it: the policy declares the API, here the proxy's address, as honouring
//! keys. Each attempt is printed; `RUST_LOG` overrides the filter. The final answer shows one
//! execution on the server, the third attempt answered from the record. Last, the same key
//! with another order gets 422 `idempotency.key_reused` at once, with its problem details.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use reqwest_middleware::ClientBuilder;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_idempotency::{IdempotencyLayer, Principal};
use tower_idempotency_client::{Attempts, RetryMiddleware, RetryPolicy};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "tower_idempotency_client=debug".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();

    let executions = Arc::new(AtomicU64::new(0));
    let api = serve(orders_api(Arc::clone(&executions))).await?;
    // Connection 1: the answer is lost after the handler ran; connection 2: reset; then fine.
    let flaky = flaky_proxy(api, vec![Fault::LoseAnswer, Fault::Reset]).await?;
    println!("order API on 127.0.0.1:{api}, flaky proxy on 127.0.0.1:{flaky}\n");

    // The API runs behind `IdempotencyLayer`: a lost answer or a 5xx may be retried under
    // the same key. Undeclared servers get a POST again only when nothing ran.
    let policy = RetryPolicy::new()
        .keys_honoured_by([format!("127.0.0.1:{flaky}").parse()?])
        .max_attempts(5)
        .base_delay(Duration::from_millis(200))
        .deadline(Duration::from_secs(10));
    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(RetryMiddleware::new(policy))
        .build();
    let url = format!("http://127.0.0.1:{flaky}/orders");

    println!("POST /orders {{\"item\":\"book\"}} (a key is stamped once and kept by every retry)");
    let res = client
        .post(&url)
        .bearer_auth("alice")
        .json(&json!({ "item": "book" }))
        .send()
        .await?;
    let attempts = res.extensions().get::<Attempts>().cloned();
    let status = res.status();
    let body: Value = res.json().await?;
    println!("-> {status} {body}");
    if let Some(a) = attempts {
        println!(
            "   {} attempts, replayed: {}, stopped: {}",
            a.count(),
            a.replayed(),
            a.reason()
        );
    }
    println!(
        "   executions on the server: {}\n",
        executions.load(Ordering::SeqCst)
    );

    println!("POST /orders with a key of our own, used before for another order");
    let reused = "example-key-0001";
    for item in ["lamp", "desk"] {
        let res = client
            .post(&url)
            .bearer_auth("alice")
            .header("idempotency-key", reused)
            .json(&json!({ "item": item }))
            .send()
            .await?;
        let attempts = res.extensions().get::<Attempts>().map(Attempts::count);
        let status = res.status();
        let body: Value = res.json().await?;
        println!("-> {item}: {status} after {attempts:?} attempt(s): {body}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The order API (as the quickstart, in-process)
// ---------------------------------------------------------------------------------------------

fn orders_api(executions: Arc<AtomicU64>) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .with_state(executions)
        .layer(IdempotencyLayer::default())
        .layer(middleware::from_fn(authenticate))
}

/// Demo authentication: the bearer token's text is the principal.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if let Some(user) = user {
        req.extensions_mut().insert(Principal::new(user));
    }
    next.run(req).await
}

async fn create_order(
    State(executions): State<Arc<AtomicU64>>,
    Json(order): Json<Value>,
) -> Response {
    let execution = executions.fetch_add(1, Ordering::SeqCst) + 1;
    let id = format!("o-{execution}");
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "item": order["item"], "execution": execution })),
    )
        .into_response()
}

async fn serve(app: Router) -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

// ---------------------------------------------------------------------------------------------
// A flaky proxy
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Forward the request; close the connection when the answer arrives (the handler ran).
    LoseAnswer,
    /// Forward the request; reset the connection when the answer arrives.
    Reset,
}

/// A proxy to `127.0.0.1:target` whose n-th connection suffers `faults[n]` (later ones pass).
async fn flaky_proxy(target: u16, faults: Vec<Fault>) -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let fault = faults.get(next.fetch_add(1, Ordering::SeqCst)).copied();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    return;
                };
                let _ = relay(client, server, fault).await;
            });
        }
    });
    Ok(port)
}

async fn relay(client: TcpStream, server: TcpStream, fault: Option<Fault>) -> std::io::Result<()> {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = sr.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            match fault {
                Some(Fault::LoseAnswer) => return Ok(()),
                Some(Fault::Reset) => {
                    cw.as_ref().set_zero_linger()?;
                    return Ok(());
                }
                None => cw.write_all(&buf[..n]).await?,
            }
        }
    };
    // The first to finish ends the connection (both halves are dropped).
    tokio::select! {
        () = up => Ok(()),
        r = down => r,
    }
}
