//! The axum extractors `IdempotencyKey` and `DerivedKey` (and their `Option` forms) in handlers
//! behind the layer, over a real TCP server.

use crate::support;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use support::http::{RequestExt, TestServer, send, store_key, with_auth};
use tower_idempotency::engine::Scope;
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::{DerivedKey, IdempotencyKey, IdempotencyLayer};

const BODY: &str = r#"{"item":"book"}"#;

async fn keys(key: IdempotencyKey, derived: DerivedKey) -> Json<Value> {
    Json(json!({ "key": key.as_str(), "derived": derived.as_str() }))
}

async fn optional_keys(key: Option<IdempotencyKey>, derived: Option<DerivedKey>) -> Json<Value> {
    Json(json!({
        "key": key.as_ref().map(IdempotencyKey::as_str),
        "derived": derived.as_ref().map(DerivedKey::as_str),
    }))
}

async fn key_only(key: IdempotencyKey) -> String {
    key.as_str().to_owned()
}

async fn derived_only(derived: DerivedKey) -> String {
    derived.as_str().to_owned()
}

async fn serve(router: Router) -> TestServer {
    TestServer::start(with_auth(router)).await
}

async fn derived_key(server: &TestServer, principal: &str, key: &str) -> String {
    let a = send(server.post("/keys", BODY).principal(principal).key(key)).await;
    assert_eq!(a.status, 200, "{}", a.describe());
    a.json()["derived"]
        .as_str()
        .expect("a derived key in the answer")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_extractor_yields_the_key_as_sent_unquoted() {
    let server = serve(
        Router::new()
            .route("/keys", post(keys))
            .layer(IdempotencyLayer::default()),
    )
    .await;
    let a = send(
        server
            .post("/keys", BODY)
            .principal("alice")
            .key(r#""order-\"7\"""#),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.describe());
    assert_eq!(a.json()["key"], r#"order-"7""#, "the sf-string, unescaped");
    let bare = send(server.post("/keys", "{}").principal("alice").key("bare-1")).await;
    assert_eq!(bare.json()["key"], "bare-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_key_is_64_hex_and_matches_derived_key_derive() {
    let layer = IdempotencyLayer::default().namespace("payments");
    let server = serve(Router::new().route("/keys", post(keys)).layer(layer)).await;
    let derived = derived_key(&server, "alice", "pay-1").await;
    assert_eq!(derived.len(), 64, "{derived}");
    assert!(
        derived
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "lowercase hex: {derived}"
    );
    let key = IdempotencyKey::new("pay-1").expect("key");
    let expected = DerivedKey::derive("payments", &Scope::principal("alice"), &key);
    assert_eq!(derived, expected.as_str(), "namespace + scope + key");
    assert_ne!(
        derived,
        store_key("payments", "alice", "pay-1").id_hex(),
        "the derived key is not the store key (domain-separated)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_key_is_the_same_for_the_same_principal_and_key_across_servers() {
    // Two servers with stores of their own: the derived key is stable, not random per run.
    let one = serve(
        Router::new()
            .route("/keys", post(keys))
            .layer(IdempotencyLayer::default()),
    )
    .await;
    let two = serve(
        Router::new()
            .route("/keys", post(keys))
            .layer(IdempotencyLayer::default()),
    )
    .await;
    let a = derived_key(&one, "alice", "pay-1").await;
    let b = derived_key(&two, "alice", "pay-1").await;
    assert_eq!(a, b, "same namespace, principal and key: same derived key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_key_differs_across_principals_keys_and_namespaces() {
    let server = serve(
        Router::new()
            .route("/keys", post(keys))
            .layer(IdempotencyLayer::default()),
    )
    .await;
    let other_ns = serve(
        Router::new()
            .route("/keys", post(keys))
            .layer(IdempotencyLayer::default().namespace("other")),
    )
    .await;
    let alice = derived_key(&server, "alice", "pay-1").await;
    let bob = derived_key(&server, "bob", "pay-1").await;
    let alice_2 = derived_key(&server, "alice", "pay-2").await;
    let alice_other_ns = derived_key(&other_ns, "alice", "pay-1").await;
    assert_ne!(alice, bob, "another principal");
    assert_ne!(alice, alice_2, "another key");
    assert_ne!(alice, alice_other_ns, "another namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_extractors_are_none_without_a_key() {
    let layer = IdempotencyLayer::default().require_key(false);
    let server = serve(
        Router::new()
            .route("/keys", post(optional_keys))
            .layer(layer),
    )
    .await;
    let a = send(server.post("/keys", BODY)).await;
    assert_eq!(a.status, 200, "{}", a.describe());
    assert_eq!(a.json(), json!({ "key": null, "derived": null }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_extractors_are_some_with_a_key() {
    let layer = IdempotencyLayer::default().require_key(false);
    let server = serve(
        Router::new()
            .route("/keys", post(optional_keys))
            .layer(layer),
    )
    .await;
    let a = send(server.post("/keys", BODY).principal("alice").key("k1")).await;
    assert_eq!(a.status, 200, "{}", a.describe());
    assert_eq!(a.json()["key"], "k1");
    assert_eq!(a.json()["derived"].as_str().map(str::len), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_extractors_share_the_anonymous_scope_in_optional_principal_mode() {
    let layer = IdempotencyLayer::default().principal(PrincipalMode::Optional);
    let server = serve(Router::new().route("/keys", post(keys)).layer(layer)).await;
    let a = send(server.post("/keys", BODY).key("k1")).await;
    let key = IdempotencyKey::new("k1").expect("key");
    let expected = DerivedKey::derive("http", &Scope::anonymous(), &key);
    assert_eq!(
        a.json()["derived"],
        expected.as_str(),
        "the anonymous scope"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_extractor_without_a_key_when_not_required_is_400() {
    let layer = IdempotencyLayer::default().require_key(false);
    let server = serve(Router::new().route("/keys", post(key_only)).layer(layer)).await;
    let a = send(server.post("/keys", BODY)).await;
    assert_eq!(a.status, 400, "{}", a.describe());
    assert!(
        String::from_utf8_lossy(&a.body).contains("requires an idempotency key"),
        "{}",
        a.describe()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_extractor_without_the_layer_is_500_saying_the_layer_is_missing() {
    let server = serve(Router::new().route("/keys", post(key_only))).await;
    let a = send(server.post("/keys", BODY).principal("alice").key("k1")).await;
    assert_eq!(a.status, 500, "a wiring error: {}", a.describe());
    let text = String::from_utf8_lossy(&a.body);
    assert!(
        text.contains("IdempotencyLayer") && text.contains("installed"),
        "the message says the layer is missing: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_key_extractor_without_the_layer_is_500_saying_the_layer_is_missing() {
    let server = serve(Router::new().route("/keys", post(derived_only))).await;
    let a = send(server.post("/keys", BODY).principal("alice").key("k1")).await;
    assert_eq!(a.status, 500, "{}", a.describe());
    assert!(
        String::from_utf8_lossy(&a.body).contains("IdempotencyLayer"),
        "{}",
        a.describe()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_extractors_without_the_layer_are_none() {
    let server = serve(Router::new().route("/keys", post(optional_keys))).await;
    let a = send(server.post("/keys", BODY).principal("alice").key("k1")).await;
    assert_eq!(a.status, 200, "{}", a.describe());
    assert_eq!(a.json(), json!({ "key": null, "derived": null }));
}
