//! The quickstart: an order API behind `IdempotencyLayer`.
//!
//! ```text
//! # memory store, 127.0.0.1:3000 (PORT overrides)
//! cargo run -p tower-idempotency-quickstart --example quickstart
//! # records in Redis
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p tower-idempotency-quickstart --example quickstart --features redis
//! ```
//!
//! With `REDIS_URL` set (and the `redis` feature), records live in Redis under the namespace
//! `quickstart`, so several quickstart processes share them.
//!
//! - `Authorization: Bearer <name>` makes `<name>` the principal (demo authentication).
//! - `POST /orders` with `{"item": "book", "delay_ms": 100?, "fail": 503?}` counts an execution,
//!   sleeps `delay_ms`, answers `fail` as the status if given, else 201 with the order.
//! - `GET /stats` answers `{"executions": n}`.
//! - `GET /metrics` answers the idempotency metrics in the Prometheus text format (requests by
//!   outcome, how claimed keys ended, store step timings, the memory store's gauges).

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_idempotency::{IdempotencyLayer, Principal, Store};

#[derive(Deserialize)]
struct NewOrder {
    item: String,
    delay_ms: Option<u64>,
    fail: Option<u16>,
}

#[derive(Clone, Default)]
struct App {
    executions: Arc<AtomicU64>,
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).expect("OS random source");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn create_order(
    axum::extract::State(app): axum::extract::State<App>,
    Json(order): Json<NewOrder>,
) -> Response {
    let execution = app.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(ms) = order.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    }
    if let Some(code) = order.fail {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (
            status,
            Json(json!({ "error": "failed on request", "execution": execution })),
        )
            .into_response();
    }
    let id = random_hex(8);
    let mut res = (
        StatusCode::CREATED,
        Json(json!({ "id": id, "item": order.item, "execution": execution })),
    )
        .into_response();
    let h = res.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{id}")).expect("hex id"),
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!("session={}", random_hex(16))).expect("hex"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_str(&random_hex(8)).expect("hex"),
    );
    res
}

async fn stats(axum::extract::State(app): axum::extract::State<App>) -> Json<serde_json::Value> {
    Json(json!({ "executions": app.executions.load(Ordering::SeqCst) }))
}

/// What `GET /metrics` renders: the Prometheus recorder's handle, and what to refresh first
/// (the memory store's gauges, read at scrape time).
#[derive(Clone)]
struct Metrics {
    handle: PrometheusHandle,
    refresh: Arc<dyn Fn() + Send + Sync>,
}

impl Metrics {
    /// Installs the Prometheus recorder for the process. Store step timings are rendered as
    /// histograms (buckets from 100 µs to 2.5 s) so `histogram_quantile` works on them.
    fn install() -> Self {
        const BUCKETS: [f64; 10] = [
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0, 2.5,
        ];
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("idempotency_store_duration_seconds".into()),
                &BUCKETS,
            )
            .expect("buckets are not empty")
            .install_recorder()
            .expect("the only metrics recorder of the process");
        // The recorder's periodic upkeep (what its HTTP listener would run, had we enabled it).
        let upkeep = handle.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        });
        Self {
            handle,
            refresh: Arc::new(|| {}),
        }
    }
}

async fn render_metrics(axum::extract::State(m): axum::extract::State<Metrics>) -> Response {
    (m.refresh)();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        m.handle.render(),
    )
        .into_response()
}

/// Demo authentication: `Authorization: Bearer <name>` → principal `<name>`.
async fn demo_auth(mut req: Request, next: Next) -> Response {
    let name = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    if let Some(name) = name {
        req.extensions_mut().insert(Principal::new(name));
    }
    next.run(req).await
}

fn app<St: Store>(idempotency: IdempotencyLayer<St>, metrics: Metrics) -> Router {
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::any())
        .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("idempotency-key"),
        ])
        // What a browser client reads: whether an answer is a replay, where a created order
        // lives (201), and when to retry a request still in flight (409).
        .expose_headers([
            header::HeaderName::from_static("idempotent-replayed"),
            header::LOCATION,
            header::RETRY_AFTER,
        ]);
    Router::new()
        .route("/orders", post(create_order))
        .route("/stats", get(stats))
        .with_state(App::default())
        // Layers run outside-in from the last one: CORS, then authentication, then idempotency.
        .layer(idempotency)
        // Beside the idempotency layer: a scrape is not an order.
        .route("/metrics", get(render_metrics).with_state(metrics))
        .layer(middleware::from_fn(demo_auth))
        .layer(cors)
}

#[cfg(feature = "redis")]
async fn redis_app(url: &str, metrics: Metrics) -> std::io::Result<Router> {
    let store = tower_idempotency::RedisStore::connect(url, "quickstart")
        .await
        .map_err(std::io::Error::other)?;
    let report = store.verify().await.map_err(std::io::Error::other)?;
    println!("redis: {report:?}");
    Ok(app(
        IdempotencyLayer::new(store).require_key(false),
        metrics,
    ))
}

#[cfg(not(feature = "redis"))]
async fn redis_app(_url: &str, _metrics: Metrics) -> std::io::Result<Router> {
    Err(std::io::Error::other(
        "REDIS_URL is set but the example was built without the `redis` feature: add `--features redis`",
    ))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // `RUST_LOG=debug` (a plain level) shows replays and claims. A level rather than
    // tracing-subscriber's `EnvFilter`, whose regex engine would double the first build.
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing_subscriber::filter::LevelFilter>().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO);
    tracing_subscriber::fmt().with_max_level(level).init();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let metrics = Metrics::install();
    let (router, store) = match std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => (redis_app(&url, metrics).await?, "redis store"),
        None => {
            let layer = IdempotencyLayer::default().require_key(false);
            // The memory store's gauges, fresh at every scrape.
            let engine = layer.engine().clone();
            let metrics = Metrics {
                refresh: Arc::new(move || engine.store().report_metrics()),
                ..metrics
            };
            (app(layer, metrics), "memory store")
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("tower-idempotency quickstart on http://{addr} ({store})");
    println!("try it (run the same command twice: the second answer is a replay):");
    println!(
        "  curl -i -X POST http://{addr}/orders -H 'authorization: Bearer alice' -H 'idempotency-key: order-1' -H 'content-type: application/json' -d '{{\"item\":\"book\"}}'"
    );
    println!("  curl http://{addr}/stats");
    println!("  curl http://{addr}/metrics");
    axum::serve(listener, router).await
}
