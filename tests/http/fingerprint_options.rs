//! What the fingerprint covers: JSON fields left out or picked, request headers,
//! the query in any order, the route template. Defaults unchanged (the other tests). On the
//! memory store and on Redis.

use crate::support;

use axum::Router;
use axum::routing::post;
use support::http::{RequestExt, TestServer, Work, send};
use tower_idempotency::http::{Fingerprinting, PrincipalMode};
use tower_idempotency::store::Store;
use tower_idempotency::{IdempotencyLayer, Principal};

async fn options<St: Store>(store: St) {
    let layer = IdempotencyLayer::new(store).fingerprint(
        Fingerprinting::default()
            .json_exclude(["/sent_at", "/auth/token"])
            .expect("valid pointers")
            .headers([http::HeaderName::from_static("x-account")])
            .canonical_query(true),
    );
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let post = |path: &str, key: &str, body: &str, account: &str| {
        server
            .post(path, body)
            .principal("alice")
            .key(key)
            .header("x-account", account)
    };

    // Excluded fields may change between attempts; the rest may not.
    let first = send(post(
        "/work",
        "k1",
        r#"{"item":"book","sent_at":"1","auth":{"token":"a"}}"#,
        "acc-1",
    ))
    .await;
    assert_eq!(first.status, 201);
    let retry = send(post(
        "/work",
        "k1",
        r#"{"auth":{"token":"b"},"sent_at":"2","item":"book"}"#,
        "acc-1",
    ))
    .await;
    assert!(
        retry.is_replay(),
        "a rotated timestamp and token: {}",
        retry.describe()
    );
    send(post(
        "/work",
        "k1",
        r#"{"item":"pen","sent_at":"3","auth":{"token":"c"}}"#,
        "acc-1",
    ))
    .await
    .assert_problem(422, "idempotency.key_reused");

    // A fingerprinted header: another account under the same key is another request.
    send(post(
        "/work",
        "k1",
        r#"{"item":"book","sent_at":"4"}"#,
        "acc-2",
    ))
    .await
    .assert_problem(422, "idempotency.key_reused");

    // The query's order does not count; its content does.
    assert_eq!(
        send(post("/work?a=1&b=2", "k2", "{}", "acc-1"))
            .await
            .status,
        201
    );
    assert!(
        send(post("/work?b=2&a=1", "k2", "{}", "acc-1"))
            .await
            .is_replay()
    );
    send(post("/work?b=3&a=1", "k2", "{}", "acc-1"))
        .await
        .assert_problem(422, "idempotency.key_reused");
    assert_eq!(work.executions(), 2);
}

// Once per store: `on_memory::…`, `on_redis::…`.
crate::support::stores::per_store!([on_memory: memory, on_redis: redis] {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fingerprint_options() {
        let Some(store) = store().await else {
            return;
        };
        options(store).await;
    }
});

/// Only the included fields count: a note may change, the amount may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_included_fields_count() {
    let layer = IdempotencyLayer::default().fingerprint(
        Fingerprinting::default()
            .json_include(["/amount", "/currency"])
            .expect("valid pointers"),
    );
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let post = |body: &str| server.post("/work", body).principal("alice").key("pay");
    assert_eq!(
        send(post(r#"{"amount":5,"currency":"EUR","note":"a"}"#))
            .await
            .status,
        201
    );
    assert!(
        send(post(r#"{"note":"b","currency":"EUR","amount":5}"#))
            .await
            .is_replay()
    );
    send(post(r#"{"amount":6,"currency":"EUR","note":"a"}"#))
        .await
        .assert_problem(422, "idempotency.key_reused");
    send(post(r#"{"amount":5,"note":"a"}"#))
        .await
        .assert_problem(422, "idempotency.key_reused");
}

#[test]
fn a_malformed_pointer_is_refused_at_build_time() {
    let err = Fingerprinting::default()
        .json_exclude(["/a~2"])
        .expect_err("`~2` is no escape");
    assert_eq!(err.kind(), tower_idempotency::ConfigErrorKind::InvalidName);
}

/// The route template instead of the path, with the layer on the route (after routing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_template_stands_for_the_path() {
    async fn handler() -> (http::StatusCode, &'static str) {
        (http::StatusCode::CREATED, "made")
    }
    let app = |template: bool| {
        let layer = IdempotencyLayer::default()
            .principal(PrincipalMode::Optional)
            .fingerprint(Fingerprinting::default().route_template(template));
        Router::new()
            .route("/items/{id}", post(handler))
            .route_layer(layer)
            .layer(axum::Extension(Principal::new("alice")))
    };
    let with = TestServer::start(app(true)).await;
    let req = |s: &TestServer, path: &str| {
        s.request(reqwest::Method::POST, path)
            .header("idempotency-key", "one")
    };
    assert_eq!(send(req(&with, "/items/1")).await.status, 201);
    assert!(
        send(req(&with, "/items/2")).await.is_replay(),
        "one template, one request"
    );

    let without = TestServer::start(app(false)).await;
    assert_eq!(send(req(&without, "/items/1")).await.status, 201);
    send(req(&without, "/items/2"))
        .await
        .assert_problem(422, "idempotency.key_reused");
}
