//! JSON request bodies: the key read from a field of a JSON body
//! (`IdempotencyLayer::key_from_json_field`, DESIGN.md §3 step 2) and the fingerprint of a JSON
//! body by value (`IdempotencyLayer::fingerprint_json_by_value`), over a real TCP server.

use crate::support;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use support::http::{Answer, Chunks, RequestExt, SpyStore, TestServer, Work, bounded, send};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::http::ConfigErrorKind;

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

fn body_key_layer(store: &SpyStore, field: &str) -> IdempotencyLayer<SpyStore> {
    IdempotencyLayer::with_store(store.clone())
        .key_from_json_field(field)
        .expect("a valid field")
}

#[track_caller]
fn assert_ran(a: &Answer, execution: u64) {
    assert_eq!(a.status, 201, "the handler answered: {}", a.describe());
    assert!(!a.is_replay(), "not a replay: {}", a.describe());
    assert_eq!(a.execution(), execution, "execution #{execution}");
}

#[track_caller]
fn assert_replay_of(a: &Answer, execution: u64) {
    assert_eq!(a.status, 201, "{}", a.describe());
    assert!(a.is_replay(), "a replay: {}", a.describe());
    assert_eq!(
        a.execution(),
        execution,
        "the replay of execution #{execution}"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 11, item 12: the key in a JSON body field
// ---------------------------------------------------------------------------------------------

const KEYED: &str = r#"{"idempotency_key":"order-1","item":"book"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_key_replays_a_repeat_sent_without_a_header() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/idempotency_key")).await;
    let first = send(server.post("/work", KEYED).principal("alice")).await;
    assert_ran(&first, 1);
    assert_eq!(
        first.json()["body_len"].as_u64(),
        Some(KEYED.len() as u64),
        "the handler got the whole body the layer read"
    );
    let second = send(server.post("/work", KEYED).principal("alice")).await;
    assert_replay_of(&second, 1);
    assert_eq!(work.executions(), 1, "the repeat did not run");
    assert_eq!(store.claims(), 2, "both requests were keyed");

    // Another key in the same field is another request.
    let other = send(
        server
            .post("/work", r#"{"idempotency_key":"order-2","item":"book"}"#)
            .principal("alice"),
    )
    .await;
    assert_ran(&other, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_given_as_a_bare_name_is_a_top_level_field() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "idempotency_key")).await;
    for _ in 0..2 {
        send(server.post("/work", KEYED).principal("alice")).await;
    }
    assert_eq!(work.executions(), 1, "the bare name found the key");
    // A bare name is one field, not a path: a name with a `/` is taken as it is.
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "a/b")).await;
    for _ in 0..2 {
        let a = send(server.post("/work", r#"{"a/b":"k"}"#).principal("alice")).await;
        assert_eq!(a.status, 201, "{}", a.describe());
    }
    assert_eq!(work.executions(), 1, "the field `a/b` held the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_pointer_reaches_a_nested_field_with_escapes() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/meta/idem~1key")).await;
    let body = r#"{"item":"book","meta":{"idem/key":"k-nested"}}"#;
    let first = send(server.post("/work", body).principal("alice")).await;
    assert_ran(&first, 1);
    let second = send(server.post("/work", body).principal("alice")).await;
    assert_replay_of(&second, 1);
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_key_wins_over_the_json_field() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/idempotency_key")).await;
    let body = r#"{"idempotency_key":"from-body","item":"book"}"#;
    let first = send(
        server
            .post("/work", body)
            .principal("alice")
            .key("from-header"),
    )
    .await;
    assert_ran(&first, 1);
    let again = send(
        server
            .post("/work", body)
            .principal("alice")
            .key("from-header"),
    )
    .await;
    assert_replay_of(&again, 1);
    // Without the header the body's key is used: it was never claimed, so this one runs.
    let body_only = send(server.post("/work", body).principal("alice")).await;
    assert_ran(&body_only, 2);
    assert_eq!(work.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_body_without_the_field_is_400_key_missing_when_required() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/idempotency_key")).await;
    for body in [
        r#"{"item":"book"}"#,
        r#"{"idempotency_key":null,"item":"book"}"#,
        r#"["idempotency_key","k"]"#,
        r#"{"meta":{"idempotency_key":"nested, not top-level"}}"#,
    ] {
        let a = send(server.post("/work", body).principal("alice")).await;
        a.assert_problem(400, "idempotency.key_missing");
        let detail = a.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(
            detail.contains("/idempotency_key"),
            "the rejection names the body field: {detail}"
        );
    }
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(store.claims(), 0, "nothing was claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_body_without_the_field_passes_through_with_its_body_when_not_required() {
    let store = SpyStore::new();
    let (server, work) =
        server_with(body_key_layer(&store, "/idempotency_key").required(false)).await;
    let body = r#"{"item":"book"}"#;
    for attempt in 1..=2 {
        // No principal either: an unkeyed request passes before the principal check.
        let a = send(server.post("/work", body)).await;
        assert_ran(&a, attempt);
        assert_eq!(
            a.json()["body_len"].as_u64(),
            Some(body.len() as u64),
            "the handler got the buffered body"
        );
    }
    assert_eq!(work.executions(), 2, "an unkeyed request runs every time");
    assert_eq!(store.claims(), 0, "an unkeyed request makes no store call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_key_without_a_principal_is_401() {
    let store = SpyStore::new();
    for required in [true, false] {
        let layer = body_key_layer(&store, "/idempotency_key").required(required);
        let (server, work) = server_with(layer).await;
        let a = send(server.post("/work", KEYED)).await;
        a.assert_problem(401, "idempotency.principal_missing");
        assert_eq!(work.executions(), 0, "required={required}: not run");
    }
    assert_eq!(store.claims(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_that_is_not_a_string_is_400_key_invalid() {
    let store = SpyStore::new();
    for required in [true, false] {
        let layer = body_key_layer(&store, "/idempotency_key").required(required);
        let (server, work) = server_with(layer).await;
        for body in [
            r#"{"idempotency_key":42}"#,
            r#"{"idempotency_key":true}"#,
            r#"{"idempotency_key":{"id":"k"}}"#,
            r#"{"idempotency_key":["k"]}"#,
        ] {
            let a = send(server.post("/work", body).principal("alice")).await;
            a.assert_problem(400, "idempotency.key_invalid");
        }
        assert_eq!(work.executions(), 0, "required={required}: not run");
    }
    assert_eq!(store.claims(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_with_an_invalid_key_or_twice_is_400_key_invalid() {
    let store = SpyStore::new();
    let layer = body_key_layer(&store, "/idempotency_key").max_key_len(8);
    let (server, work) = server_with(layer).await;
    for body in [
        r#"{"idempotency_key":""}"#,
        r#"{"idempotency_key":"123456789"}"#,
        r#"{"idempotency_key":"a\u0001b"}"#,
        r#"{"idempotency_key":"clé"}"#,
        r#"{"idempotency_key":"a","idempotency_key":"a"}"#,
    ] {
        let a = send(server.post("/work", body).principal("alice")).await;
        a.assert_problem(400, "idempotency.key_invalid");
    }
    assert_eq!(work.executions(), 0);
    assert_eq!(store.claims(), 0);
    // An escaped key is the key it spells.
    let escaped = send(
        server
            .post("/work", r#"{"idempotency_key":"\u006b-1"}"#)
            .principal("alice"),
    )
    .await;
    assert_ran(&escaped, 1);
    let plain = send(
        server
            .post("/work", r#"{"idempotency_key":"\u006b-1"}"#)
            .principal("alice"),
    )
    .await;
    assert_replay_of(&plain, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_that_is_not_json_has_no_key() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/idempotency_key")).await;
    for body in [
        r#"{"idempotency_key":"k","item":}"#,
        r#"{"idempotency_key":"k"} trailing"#,
        "",
    ] {
        let a = send(server.post("/work", body).principal("alice")).await;
        a.assert_problem(400, "idempotency.key_missing");
    }
    assert_eq!(work.executions(), 0);

    // Not required: the handler gets the request and answers the broken JSON itself.
    let (server, work) =
        server_with(body_key_layer(&store, "/idempotency_key").required(false)).await;
    let broken = r#"{"idempotency_key":"k","item":}"#;
    for attempt in 1..=2 {
        let a = send(server.post("/work", broken).principal("alice")).await;
        assert_ran(&a, attempt);
    }
    assert_eq!(work.executions(), 2);
    assert_eq!(store.claims(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_is_read_from_json_and_plus_json_bodies_only() {
    let store = SpyStore::new();
    let (server, work) = server_with(body_key_layer(&store, "/idempotency_key")).await;
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonp",
    ] {
        let a = send(post_as(&server, content_type, KEYED).principal("alice")).await;
        a.assert_problem(400, "idempotency.key_missing");
    }
    let no_content_type = send(
        server
            .client()
            .post(server.url("/work"))
            .body(KEYED)
            .principal("alice"),
    )
    .await;
    no_content_type.assert_problem(400, "idempotency.key_missing");
    assert_eq!(work.executions(), 0);

    for (n, content_type) in [
        "Application/JSON; charset=utf-8",
        "application/merge-patch+json",
        "application/vnd.api+json ; ext=x",
    ]
    .into_iter()
    .enumerate()
    {
        let body = format!(r#"{{"idempotency_key":"k-{n}"}}"#);
        let first = send(post_as(&server, content_type, &body).principal("alice")).await;
        assert_eq!(first.status, 201, "{content_type}: {}", first.describe());
        let second = send(post_as(&server, content_type, &body).principal("alice")).await;
        assert!(second.is_replay(), "{content_type}: {}", second.describe());
    }
    assert_eq!(work.executions(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_body_over_the_limit_without_a_header_key_is_413() {
    let store = SpyStore::new();
    // Even when a key is not required: the body could hold a key the layer cannot read.
    let layer = body_key_layer(&store, "/idempotency_key")
        .required(false)
        .max_request_body(32);
    let (server, work) = server_with(layer).await;
    let big = format!(r#"{{"idempotency_key":"k","item":"{}"}}"#, "x".repeat(64));
    let declared = send(server.post("/work", &big).principal("alice")).await;
    declared.assert_problem(413, "idempotency.body_too_large");

    let client = Client::builder(TokioExecutor::new()).build_http::<Chunks>();
    let req = hyper::Request::post(server.url("/work"))
        .header("content-type", "application/json")
        .header("x-principal", "alice")
        .body(Chunks::new(
            big.as_bytes()
                .chunks(16)
                .map(Bytes::copy_from_slice)
                .collect::<Vec<_>>(),
        ))
        .expect("request");
    let res = bounded(
        Duration::from_secs(10),
        "a chunked request",
        client.request(req),
    )
    .await
    .expect("the chunked request reaches the server");
    assert_eq!(res.status(), 413);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).expect("problem json");
    assert_eq!(json["code"], "idempotency.body_too_large");

    // A body that is not JSON is not read for a key: it passes through untouched.
    let text = send(post_as(&server, "text/plain", &big)).await;
    assert_eq!(text.status, 201, "{}", text.describe());
    assert_eq!(work.executions(), 1, "only the text body ran");
    assert_eq!(store.claims(), 0);
}

#[test]
fn json_field_that_is_not_a_valid_pointer_is_a_config_error() {
    for field in ["", "/a~2b", "/a~"] {
        let err = IdempotencyLayer::new()
            .key_from_json_field(field)
            .expect_err(field);
        assert_eq!(err.kind(), ConfigErrorKind::InvalidJsonField, "{field:?}");
    }
    assert!(IdempotencyLayer::new().key_from_json_field("/").is_ok());
    assert!(IdempotencyLayer::new().key_from_json_field("a~b").is_ok());
}

// ---------------------------------------------------------------------------------------------
// Issue 11, item 15: the fingerprint of a JSON body by value
// ---------------------------------------------------------------------------------------------

fn by_value_layer(store: &SpyStore) -> IdempotencyLayer<SpyStore> {
    IdempotencyLayer::with_store(store.clone()).fingerprint_json_by_value(true)
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
    let (server, work) = server_with(IdempotencyLayer::with_store(SpyStore::new())).await;
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
    let (raw, _) = server_with(IdempotencyLayer::with_store(store.clone())).await;
    send(raw.post("/work", body).principal("alice").key("k")).await;
    let raw_fp = store.last_fingerprint().expect("claimed");
    let (by_value, _) = server_with(by_value_layer(&store)).await;
    let a = send(by_value.post("/work", body).principal("alice").key("k")).await;
    a.assert_problem(422, "idempotency.key_reused");
    assert_ne!(store.last_fingerprint(), Some(raw_fp));
}
