//! The transactional door in an axum handler: an order and its idempotency record committed
//! in one PostgreSQL transaction, behind the layer's `Idempotency-Key` semantics (replay, 409, 422).
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --example transactional --features postgres
//! ```
//!
//! Creates the idempotency table and an `example_orders` table, starts the app on 127.0.0.1 (a
//! free port), then posts one order under one key three times: the first inserts the order
//! and its record in one transaction (201), the repeat is replayed (`idempotent-replayed:
//! true`, no second order), and the same key with another body is refused (422). Then it
//! prints how many orders exist and exits.
//!
//! The handler does by hand what the layer does for every route (key, principal, fingerprint,
//! answers), because the layer cannot own the handler's transaction: [`within`] claims the
//! key *inside* it. Use this where the work is writes to the same database; elsewhere the
//! layer is enough (see the `transactional` module docs).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tower_idempotency::IdempotencyKey;
use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
use tower_idempotency::http::{REPLAYED_HEADER, Rejection, RejectionKind};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::postgres::sqlx::postgres::PgPoolOptions;
use tower_idempotency::store::postgres::sqlx::{self, PgPool};
use tower_idempotency::transactional::{Within, WithinErrorKind, within};

/// The namespace of this route's keys (a store key hashes it with the principal and the key).
const NAMESPACE: &str = "orders.create";

/// The app's state: the engine over the PostgreSQL store, and the pool the handler's
/// transactions come from.
#[derive(Clone, Debug)]
pub(crate) struct App {
    engine: Engine<PostgresStore>,
    pool: PgPool,
}

/// A new order, as posted.
#[derive(Deserialize)]
struct NewOrder {
    sku: String,
    quantity: i32,
}

/// An order, as answered.
#[derive(Serialize)]
struct Order {
    id: i64,
    sku: String,
    quantity: i32,
}

/// The app over `pool`: creates the idempotency table and `example_orders` when missing.
///
/// # Errors
/// When a table cannot be created.
pub(crate) async fn app(pool: PgPool) -> Result<Router, Box<dyn std::error::Error + Send + Sync>> {
    let store = PostgresStore::new(pool.clone(), "example")?;
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS example_orders \
         (id bigserial PRIMARY KEY, sku text NOT NULL, quantity int NOT NULL)",
    )
    .execute(&pool)
    .await?;
    // Expired records stay until purged.
    let purging = store.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            let _ = purging.purge().await;
        }
    });
    let engine = Engine::builder(store)
        .retention(Duration::from_secs(24 * 60 * 60))
        .build();
    Ok(Router::new()
        .route("/orders", post(create_order))
        .with_state(App { engine, pool }))
}

/// `POST /orders`: checks the request as the layer would, then inserts the order and its
/// record in one transaction.
async fn create_order(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // The caller: a real service verifies a token; this demo takes the bearer's text.
    let Some(principal) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return problem(RejectionKind::PrincipalMissing, "authenticate first");
    };
    let key = match headers
        .get_all("idempotency-key")
        .iter()
        .collect::<Vec<_>>()[..]
    {
        [] => return problem(RejectionKind::KeyMissing, "send an Idempotency-Key header"),
        [value] => match IdempotencyKey::parse_header(value.as_bytes()) {
            Ok(key) => key,
            Err(e) => return problem(RejectionKind::KeyInvalid, e.to_string()),
        },
        _ => return problem(RejectionKind::KeyInvalid, "send one Idempotency-Key header"),
    };
    // Validated before the claim: a request that fails here may be retried with the same key.
    let Ok(Json(order)) = Json::<NewOrder>::from_bytes(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected {\"sku\": …, \"quantity\": …}",
        )
            .into_response();
    };

    // The layer's default fingerprint: method, path, raw query, content-type and body.
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map_or(&b""[..], |v| v.as_bytes());
    let fingerprint = Fingerprint::builder()
        .field(method.as_str().as_bytes())
        .field(uri.path().as_bytes())
        .field(uri.query().unwrap_or_default().as_bytes())
        .field(content_type)
        .field(&body)
        .finish();
    // As every door derives it: keyed under the engine's secret when it has one.
    let store_key = app
        .engine
        .store_key(NAMESPACE, &Scope::principal(principal), &key);

    let Ok(mut conn) = app.pool.acquire().await else {
        return problem(RejectionKind::Store, "the database is unavailable");
    };
    let outcome = within(&app.engine, &mut conn, store_key, fingerprint, |tx| {
        Box::pin(async move {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO example_orders (sku, quantity) VALUES ($1, $2) RETURNING id",
            )
            .bind(&order.sku)
            .bind(order.quantity)
            .fetch_one(&mut *tx)
            .await?;
            let body = serde_json::to_vec(&Order {
                id,
                sku: order.sku,
                quantity: order.quantity,
            })
            .map_err(|e| sqlx::Error::Encode(e.into()))?;
            Ok::<_, sqlx::Error>(Recorded::new(
                201,
                vec![
                    ("content-type".into(), "application/json".into()),
                    ("location".into(), format!("/orders/{id}").into()),
                ],
                Some(body.into()),
            ))
        })
    })
    .await;

    match outcome {
        Ok(Within::Recorded(recorded)) => respond(recorded, false),
        Ok(Within::Replayed(recorded)) => respond(recorded, true),
        Ok(Within::InFlight) => Rejection::new(
            RejectionKind::InFlight,
            "a request with this key is still being processed; retry later",
        )
        .with_retry_after(Duration::from_secs(1))
        .to_problem_response()
        .map(Into::into),
        Ok(Within::KeyReused) => problem(
            RejectionKind::KeyReused,
            "this key was already used for a different request",
        ),
        Ok(_) => problem(
            RejectionKind::RecordInvalid,
            "the stored response for this key could not be replayed",
        ),
        Err(e) if e.kind() == WithinErrorKind::Store => Rejection::new(
            RejectionKind::Store,
            "the database is unavailable; retry with the same key",
        )
        .with_retry_after(Duration::from_secs(1))
        .to_problem_response()
        .map(Into::into),
        // The transaction lost to a concurrent one: no order was placed, the key is free.
        Err(e) if e.kind() == WithinErrorKind::Conflict => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "the order conflicted with a concurrent one; retry",
        )
            .into_response(),
        // The work's statements failed, here only when the database did: the order was not
        // placed and the key is free, so a retry with the same key is safe.
        Err(_) => Rejection::new(
            RejectionKind::Store,
            "the order was not placed; retry with the same key",
        )
        .with_retry_after(Duration::from_secs(1))
        .to_problem_response()
        .map(Into::into),
    }
}

/// The layer's problem+json answer for `kind`.
fn problem(kind: RejectionKind, detail: impl Into<std::borrow::Cow<'static, str>>) -> Response {
    Rejection::new(kind, detail)
        .to_problem_response()
        .map(Into::into)
}

/// A recorded response as an HTTP response; a replay says so.
fn respond(recorded: Recorded, replayed: bool) -> Response {
    let mut res = Response::new(recorded.body.unwrap_or_default().into());
    *res.status_mut() = StatusCode::from_u16(recorded.status).unwrap_or(StatusCode::OK);
    for (name, value) in recorded.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&name),
            HeaderValue::from_bytes(&value),
        ) {
            res.headers_mut().append(name, value);
        }
    }
    if replayed {
        res.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    res
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    // A short wait for a connection: while the database is down, requests fail in 2 s with a
    // 503 instead of waiting sqlx's default 30 s.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await?;
    let router = app(pool.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    println!("serving on http://{addr}");

    let client = reqwest::Client::new();
    let mut key = [0u8; 8];
    getrandom::fill(&mut key)?;
    let key: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let send = |body: &'static str| {
        client
            .post(format!("http://{addr}/orders"))
            .header("authorization", "Bearer alice")
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (what, body) in [
        ("first request", r#"{"sku":"X-1","quantity":2}"#),
        ("repeat", r#"{"sku":"X-1","quantity":2}"#),
        ("same key, other body", r#"{"sku":"X-1","quantity":3}"#),
    ] {
        let res = send(body).await?;
        let status = res.status();
        let replayed = res.headers().contains_key("idempotent-replayed");
        println!(
            "{what}: {status}{} {}",
            if replayed { " (replayed)" } else { "" },
            res.text().await?
        );
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM example_orders")
        .fetch_one(&pool)
        .await?;
    println!("orders in the table: {orders}");
    Ok(())
}
