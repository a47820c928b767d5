//! The `transactional` example's handler on a real PostgreSQL server: an order and its record
//! in one transaction, answered with the layer's semantics (replay, 409, 422, 400, 401).
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use crate::support::postgres_server::PostgresServer;
use std::time::Duration;
use tower_idempotency::store::postgres::sqlx;

#[path = "../../examples/transactional.rs"]
#[allow(dead_code)] // its `main` is the example's
mod example;

async fn code(res: reqwest::Response) -> (u16, Option<String>, serde_json::Value) {
    let status = res.status().as_u16();
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, res.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_places_one_order_per_key_with_the_layers_answers() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let pool = server.pool(8).await;
    let router = example::app(pool.clone()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = reqwest::Client::new();
    let post = |key: Option<&str>, user: Option<&str>, body: &str| {
        let mut req = client
            .post(format!("http://{addr}/orders"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        if let Some(user) = user {
            req = req.header("authorization", format!("Bearer {user}"));
        }
        req.send()
    };
    let order = r#"{"sku":"E2E-1","quantity":2}"#;
    let orders = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM example_orders WHERE sku = 'E2E-1'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    let first = post(Some("k-1"), Some("alice"), order).await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].clone();
    let body = first.text().await.unwrap();

    let again = post(Some("k-1"), Some("alice"), order).await.unwrap();
    assert_eq!(
        again.status(),
        201,
        "the repeat is answered with the record"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.text().await.unwrap(), body);
    assert_eq!(orders().await, 1, "one order for two requests");

    let other = code(
        post(
            Some("k-1"),
            Some("alice"),
            r#"{"sku":"E2E-1","quantity":3}"#,
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (other.0, other.2["code"].as_str()),
        (422, Some("idempotency.key_reused"))
    );
    let bob = post(Some("k-1"), Some("bob"), order).await.unwrap();
    assert_eq!(bob.status(), 201, "another caller's key is another key");
    assert!(bob.headers().get("idempotent-replayed").is_none());
    assert_eq!(orders().await, 2);

    let missing = code(post(None, Some("alice"), order).await.unwrap()).await;
    assert_eq!(
        (missing.0, missing.2["code"].as_str()),
        (400, Some("idempotency.key_missing"))
    );
    let anonymous = code(post(Some("k-2"), None, order).await.unwrap()).await;
    assert_eq!(anonymous.0, 401);

    // The first request of k-3 waits on a lock held elsewhere, holding its claim: a repeat
    // waits out the lock wait (1 s) and is told the first is in flight.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE example_orders IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let slow = tokio::spawn(post(Some("k-3"), Some("alice"), order));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dup = code(post(Some("k-3"), Some("alice"), order).await.unwrap()).await;
    assert_eq!(
        (dup.0, dup.2["code"].as_str()),
        (409, Some("idempotency.in_flight"))
    );
    assert_eq!(dup.1.as_deref(), Some("1"), "with Retry-After");
    blocker.rollback().await.unwrap();
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);
    let replay = post(Some("k-3"), Some("alice"), order).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(orders().await, 3);
}
