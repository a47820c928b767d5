//! JSON request bodies fingerprinted by value (`Fingerprinting::json_by_value`), over a real
//! TCP server.

use crate::support;

use support::http::{Answer, RequestExt, SpyStore, TestServer, Work, send};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::http::Fingerprinting;

async fn server_with(layer: IdempotencyLayer<SpyStore>) -> (TestServer, Work) {
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    (server, work)
}

/// A POST to `/work` with `body` sent as `content_type`.
fn post_as(server: &TestServer, content_type: &str, body: &str) -> reqwest::RequestBuilder {
    server
        .client()
        .post(server.url("/work"))
        .header("content-type", content_type)
        .body(body.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The fingerprint of a JSON body by value
// ---------------------------------------------------------------------------------------------

fn by_value_layer(store: &SpyStore) -> IdempotencyLayer<SpyStore> {
    IdempotencyLayer::new(store.clone()).fingerprint(Fingerprinting::default().json_by_value(true))
}

/// Sends `first`, then `second` under one key; returns the second answer.
async fn first_then(server: &TestServer, key: &str, first: &str, second: &str) -> Answer {
    let a = send(server.post("/work", first).principal("alice").key(key)).await;
    assert_eq!(a.status, 201, "the first request ran: {}", a.describe());
    assert!(!a.is_replay());
    send(server.post("/work", second).principal("alice").key(key)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserialised_json_body_is_422_by_default() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let second = first_then(&server, "k", r#"{"item": "book"}"#, r#"{"item":"book"}"#).await;
    second.assert_problem(422, "idempotency.key_reused");
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserialised_json_body_is_a_replay_when_fingerprinted_by_value() {
    let (server, work) = server_with(by_value_layer(&SpyStore::new())).await;
    let pairs = [
        // Insignificant whitespace.
        (r#"{"item": "book"}"#, r#"{"item":"book"}"#),
        // Object key order, also nested, with whitespace around everything.
        (
            r#"{"item":"book","qty":2,"meta":{"a":[1,{"y":true,"x":null}],"b":"c"}}"#,
            "\n { \"qty\" : 2 ,\r\n\t\"meta\":{\"b\":\"c\",\"a\":[ 1 , {\"x\":null,\"y\":true} ]}, \"item\":\"book\" }\n",
        ),
        // The same string written with and without escapes.
        (
            r#"{"item":"b\u006fok\/1 \u00e9"}"#,
            r#"{"item":"book/1 é"}"#,
        ),
        // Duplicate names keep their order among themselves.
        (r#"{"a":1,"b":2,"a":3}"#, r#"{"b":2,"a":1,"a":3}"#),
    ];
    for (n, (first, second)) in pairs.iter().enumerate() {
        let key = format!("k-{n}");
        let answer = first_then(&server, &key, first, second).await;
        assert!(
            answer.is_replay(),
            "{first} then {second}: {}",
            answer.describe()
        );
    }
    assert_eq!(work.executions(), pairs.len(), "each pair ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_bodies_with_other_values_are_still_422_by_value() {
    let (server, work) = server_with(by_value_layer(&SpyStore::new())).await;
    let pairs = [
        (r#"{"qty":1}"#, r#"{"qty":2}"#),
        // Numbers are compared by their text: never a replay of a value read differently.
        (r#"{"qty":1}"#, r#"{"qty":1.0}"#),
        (r#"{"qty":1e2}"#, r#"{"qty":100}"#),
        (
            r#"{"amount":12345678901234567890.000000001}"#,
            r#"{"amount":12345678901234567890.000000002}"#,
        ),
        // Array order is significant.
        (r#"{"items":[1,2]}"#, r#"{"items":[2,1]}"#),
        // Duplicate names in another order among themselves.
        (r#"{"a":1,"a":3}"#, r#"{"a":3,"a":1}"#),
        (r#"{"a":"1"}"#, r#"{"a":1}"#),
        (r#"{"a":null}"#, r#"{}"#),
        (r#"{"a":{}}"#, r#"{"a":[]}"#),
        (r#"["a","b"]"#, r#"["ab"]"#),
        (r#"{"ab":"c"}"#, r#"{"a":"bc"}"#),
    ];
    for (n, (first, second)) in pairs.iter().enumerate() {
        let key = format!("k-{n}");
        let answer = first_then(&server, &key, first, second).await;
        answer.assert_problem(422, "idempotency.key_reused");
    }
    assert_eq!(work.executions(), pairs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_that_does_not_parse_or_is_not_json_is_fingerprinted_by_its_bytes() {
    let (server, work) = server_with(by_value_layer(&SpyStore::new())).await;
    // Not JSON: the raw bytes decide.
    let broken = first_then(&server, "k-broken", r#"{"a": 1,}"#, r#"{"a":1,}"#).await;
    broken.assert_problem(422, "idempotency.key_reused");
    let same = first_then(&server, "k-same", r#"{"a": 1,}"#, r#"{"a": 1,}"#).await;
    assert!(same.is_replay(), "{}", same.describe());
    // Another content type: the raw bytes decide.
    let text = |body: &str| {
        post_as(&server, "text/plain", body)
            .principal("alice")
            .key("k-text")
    };
    let first = send(text(r#"{"item": "book"}"#)).await;
    assert_eq!(first.status, 201);
    let second = send(text(r#"{"item":"book"}"#)).await;
    second.assert_problem(422, "idempotency.key_reused");
    // A `+json` type is fingerprinted by value too.
    let patch = |body: &str| {
        post_as(&server, "application/merge-patch+json", body)
            .principal("alice")
            .key("k-patch")
    };
    assert_eq!(send(patch(r#"{"b": 1, "a": 2}"#)).await.status, 201);
    let again = send(patch(r#"{"a":2,"b":1}"#)).await;
    assert!(again.is_replay(), "{}", again.describe());
    assert_eq!(work.executions(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_value_and_raw_fingerprints_of_one_body_differ() {
    // Turning the option on changes the fingerprint of every JSON body: a repeat across the
    // change is 422, never a replay of a request that was compared another way.
    let store = SpyStore::new();
    let body = r#"{"item":"book"}"#;
    let (raw, _) = server_with(IdempotencyLayer::new(store.clone())).await;
    send(raw.post("/work", body).principal("alice").key("k")).await;
    let raw_fp = store.last_fingerprint().expect("claimed");
    let (by_value, _) = server_with(by_value_layer(&store)).await;
    let a = send(by_value.post("/work", body).principal("alice").key("k")).await;
    a.assert_problem(422, "idempotency.key_reused");
    assert_ne!(store.last_fingerprint(), Some(raw_fp));
}
