//! The load benchmark's server: `POST /orders` behind one of the rows' middleware, on a Tokio
//! runtime with ONE worker thread.
//!
//! ```text
//! load-server --row <floor|bare|memory|memory-bounded|redis|redis-unpipelined|redis-cluster|redis-sentinel|redis-sentinel-wait|postgres|postgres-durable|postgres-pool|idempotent-memory|idempotent-redis|axum-idempotent>
//!             --port N [--redis-url redis://127.0.0.1:P] [--postgres-url postgres://…]
//! ```
//!
//! - `POST /orders`: parses the JSON body (about 1 KiB) into a typed order with serde_json,
//!   counts one handler execution, answers 201 with a small JSON body.
//! - `POST /orders` in the `floor` row: reads the body into `Bytes`, answers a 10-byte JSON
//!   201 (no parse, no store, no execution counted): the cost a replay cannot go below.
//! - `POST /login` (axum-idempotent row only): creates a session, answers its cookie.
//! - `GET /stats` (outside every idempotency layer): `{"executions": n, "rss_kib": r,
//!   "records": m | null}` — RSS from /proc/self/status, records from the store where it says.
//!
//! Keys are scoped per caller: the generator sends `x-client: c<connection>`; this crate and
//! `idempotent` scope by that header, `axum-idempotent` by its session (one per connection).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde::Deserialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The retention every row uses (the crates' common default): records outlive the run.
const TTL: Duration = Duration::from_secs(24 * 60 * 60);

#[derive(Deserialize)]
#[allow(dead_code)] // parsed, not used: the parse is the work
struct Order {
    customer: String,
    currency: String,
    items: Vec<Item>,
    note: String,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Item {
    sku: String,
    quantity: u32,
    price_cents: u64,
}

type RecordsFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<u64>> + Send>> + Send + Sync>;

#[derive(Clone)]
struct App {
    executions: Arc<AtomicU64>,
    records: Option<RecordsFn>,
}

async fn create_order(State(app): State<App>, body: Bytes) -> Response {
    let order: Order = match serde_json::from_slice(&body) {
        Ok(o) => o,
        Err(_) => return (StatusCode::BAD_REQUEST, "bad json").into_response(),
    };
    let n = app.executions.fetch_add(1, Ordering::Relaxed) + 1;
    let body = format!(
        r#"{{"id":"o-{n}","items":{},"status":"created"}}"#,
        order.items.len()
    );
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn stats(State(app): State<App>) -> Json<serde_json::Value> {
    let records = match &app.records {
        Some(f) => f().await,
        None => None,
    };
    Json(serde_json::json!({
        "executions": app.executions.load(Ordering::Relaxed),
        "rss_kib": rss_kib(),
        "records": records,
    }))
}

/// The caller: `x-client` (load-gen sends one per connection) or else the bearer token of
/// `Authorization` (the wrk mode sends one for every request: a single principal).
fn client_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-client")
        .or_else(|| headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
}

/// The floor: what a replay cannot go below. It reads the whole body (as any replay must, to
/// fingerprint it) and answers a 10-byte JSON 201, with no JSON parse and no store.
async fn floor(body: Bytes) -> Response {
    let _ = body.len();
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"id":"1"}"#, // 10 bytes
    )
        .into_response()
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn build(
    row: &str,
    redis_url: Option<String>,
    postgres_url: Option<String>,
) -> (Router<App>, Option<RecordsFn>) {
    let orders = || Router::<App>::new().route("/orders", post(create_order));
    match row {
        "bare" => (orders(), None),
        "floor" => (Router::<App>::new().route("/orders", post(floor)), None),
        "memory" | "memory-bounded" => {
            use tower_idempotency::engine::Scope;
            use tower_idempotency::{IdempotencyLayer, MemoryStore};
            let store = if row == "memory" {
                // Bounds high enough that nothing is dropped during a run: every record of the
                // run stays, as with the peers (their stores are unbounded).
                MemoryStore::builder()
                    .max_entries(64 << 20)
                    .max_bytes(64 << 30)
                    .build()
                    .expect("memory store bounds")
            } else {
                MemoryStore::new() // default bounds: 100 000 records, 64 MiB
            };
            let store = Arc::new(store);
            let layer = IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(Arc::clone(&store))
                    .retention(TTL)
                    .build(),
            )
            .principal_fn(|p| client_of(&p.headers).map(Scope::principal));
            let records: RecordsFn = Arc::new(move || {
                let n = store.stats().entries as u64;
                Box::pin(async move { Some(n) })
            });
            (orders().layer(layer), Some(records))
        }
        "redis" | "redis-unpipelined" => {
            use tower_idempotency::engine::Scope;
            use tower_idempotency::{IdempotencyLayer, RedisStore};
            let url = redis_url.expect("--redis-url");
            // `redis-unpipelined`: each command written as soon as it is queued, not gathered
            // with those of the other requests of the same scheduler round.
            let store = RedisStore::builder("bench")
                .pipelining(row == "redis")
                .connect(&url)
                .await
                .expect("connect to Redis");
            let layer = IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(store)
                    .retention(TTL)
                    .build(),
            )
            .principal_fn(|p| client_of(&p.headers).map(Scope::principal));
            (orders().layer(layer), None)
        }
        "redis-cluster" => {
            use tower_idempotency::engine::Scope;
            use tower_idempotency::{IdempotencyLayer, RedisStore};
            let url = redis_url.expect("--redis-url");
            // The cluster's nodes, comma-separated; no pipelining (connect_cluster's default).
            let store = RedisStore::builder("bench")
                .connect_cluster(url.split(',').map(str::to_owned).collect::<Vec<_>>())
                .await
                .expect("connect to Redis Cluster");
            let layer = IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(store)
                    .retention(TTL)
                    .build(),
            )
            .principal_fn(|p| client_of(&p.headers).map(Scope::principal));
            (orders().layer(layer), None)
        }
        "redis-sentinel" | "redis-sentinel-wait" => {
            use tower_idempotency::engine::Scope;
            use tower_idempotency::{IdempotencyLayer, RedisStore};
            let url = redis_url.expect("--redis-url");
            // The sentinels, comma-separated; `redis-sentinel-wait`: each complete waits for
            // the replica (`WAIT 1`, at most 50 ms).
            let mut builder = RedisStore::builder("bench");
            if row == "redis-sentinel-wait" {
                builder = builder.wait_for_replicas(1, std::time::Duration::from_millis(50));
            }
            let store = builder
                .connect_sentinel(
                    url.split(',').map(str::to_owned).collect::<Vec<_>>(),
                    "bench-primary",
                    None,
                )
                .await
                .expect("connect through Redis Sentinel");
            let layer = IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(store)
                    .retention(TTL)
                    .build(),
            )
            .principal_fn(|p| client_of(&p.headers).map(Scope::principal));
            (orders().layer(layer), None)
        }
        "postgres" | "postgres-durable" | "postgres-pool" => {
            use tower_idempotency::engine::Scope;
            use tower_idempotency::store::postgres::sqlx::postgres::{
                PgConnectOptions, PgPoolOptions,
            };
            use tower_idempotency::{IdempotencyLayer, PostgresStore};
            let url = postgres_url.expect("--postgres-url");
            let store = if row == "postgres-pool" {
                // A sqlx pool with its defaults (it checks a connection when it hands it out
                // and when it takes it back), 10 connections and the store's
                // statement_timeout, given to `new`.
                let options: PgConnectOptions = url.parse().expect("URL");
                let pool = PgPoolOptions::new()
                    .max_connections(10)
                    .connect_lazy_with(options.options([("statement_timeout", "1000ms")]));
                PostgresStore::new(pool, "bench").expect("store")
            } else {
                // The store's own connections (10), as `connect` makes them.
                PostgresStore::connect(&url, "bench")
                    .await
                    .expect("connect to PostgreSQL")
            };
            store.migrate().await.expect("create the table");
            let counter = store.clone();
            let layer = IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(store)
                    .retention(TTL)
                    .build(),
            )
            .principal_fn(|p| client_of(&p.headers).map(Scope::principal));
            let records: RecordsFn = Arc::new(move || {
                let pool = counter.pool().clone();
                Box::pin(async move {
                    tower_idempotency::store::postgres::sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM tower_idempotency",
                    )
                    .fetch_one(&pool)
                    .await
                    .ok()
                    .map(|n| n as u64)
                })
            });
            (orders().layer(layer), Some(records))
        }
        "idempotent-memory" => {
            use idempotent::memory::MemoryStore;
            use idempotent::middleware::IdempotencyLayer;
            let store = MemoryStore::builder()
                .try_build()
                .expect("idempotent memory store");
            let counter = store.clone();
            let layer = IdempotencyLayer::new(store)
                .scope(|p| client_of(&p.headers).map(String::from))
                .completed_ttl(TTL);
            let records: RecordsFn = Arc::new(move || {
                let s = counter.clone();
                Box::pin(async move { s.len().await.ok().map(|n| n as u64) })
            });
            (orders().layer(layer), Some(records))
        }
        "idempotent-redis" => {
            use idempotent::middleware::IdempotencyLayer;
            use idempotent::valkey::ValkeyStore;
            let url = redis_url.expect("--redis-url");
            let store = ValkeyStore::with_url(url)
                .prefix("bench")
                .try_build()
                .await
                .expect("idempotent valkey store");
            let layer = IdempotencyLayer::new(store)
                .scope(|p| client_of(&p.headers).map(String::from))
                .completed_ttl(TTL);
            (orders().layer(layer), None)
        }
        "axum-idempotent" => {
            use axum_idempotent::{IdempotentLayer, IdempotentOptions};
            use ruts::store::moka::MokaStore;
            use ruts::{CookieOptions, Session, SessionLayer};
            let store = Arc::new(MokaStore::builder().max_capacity(100_000).build());
            let secs = TTL.as_secs();
            let options = IdempotentOptions::default()
                .use_idempotency_key_header(Some("idempotency-key"), true)
                .expire_after(secs as i64);
            async fn login(session: Session<MokaStore>) -> StatusCode {
                let ttl = ruts::store::Ttl::new(24 * 60 * 60).expect("ttl");
                match session.set("user", &"bench", ttl, None).await {
                    Ok(()) => StatusCode::NO_CONTENT,
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
                }
            }
            let app = Router::<App>::new()
                .route("/login", post(login))
                .merge(orders().layer(IdempotentLayer::<MokaStore>::new(options)))
                .layer(
                    SessionLayer::new(store).with_cookie_options(
                        CookieOptions::build()
                            .name("session")
                            .max_age(secs)
                            .path("/"),
                    ),
                )
                .layer(tower_cookies::CookieManagerLayer::new());
            (app, None)
        }
        other => panic!("unknown row `{other}`"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let row = arg(&args, "--row").expect("--row");
    let port: u16 = arg(&args, "--port")
        .and_then(|p| p.parse().ok())
        .expect("--port N");
    let redis_url = arg(&args, "--redis-url");
    let postgres_url = arg(&args, "--postgres-url");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let executions = Arc::new(AtomicU64::new(0));
        let (routes, records) = build(&row, redis_url, postgres_url).await;
        let app = App {
            executions,
            records,
        };
        let router = Router::new()
            .route("/stats", get(stats))
            .merge(routes)
            .with_state(app);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        eprintln!("load-server: row {row} on 127.0.0.1:{port}");
        axum::serve(listener, router).await.expect("serve");
    });
}
