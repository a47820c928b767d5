//! After the handler (what is recorded, what is released) and what a
//! replay carries (allowed and denied headers, repeated lines, response modes, records that
//! fail re-validation), over a real TCP server.

use crate::support;

use bytes::Bytes;
use http::{HeaderName, StatusCode};
use http_body_util::Full;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::http::{
    Answer, RequestExt, SpyStore, TestServer, default_fingerprint, plant, secret_store_key, send,
    server_with, store_key,
};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::ConfigErrorKind;
use tower_idempotency::engine::Recorded;
use tower_idempotency::http::{RequestBody, ResponseBody, ResponseMode};
use tower_idempotency::store::Record;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal, Secret};

const BODY: &str = r#"{"item":"book"}"#;

/// The same keyed request twice, the handler answering `status`.
async fn twice(server: &TestServer, key: &str, status: u16) -> (Answer, Answer) {
    let request = || {
        server
            .post("/work", BODY)
            .principal("alice")
            .key(key)
            .respond(status)
    };
    let first = send(request()).await;
    let second = send(request()).await;
    assert_eq!(
        first.status.as_u16(),
        status,
        "the handler's status: {}",
        first.describe()
    );
    assert!(!first.is_replay(), "a first run is not a replay");
    (first, second)
}

// ---------------------------------------------------------------------------------------------
// Step 9: recorded or released
// ---------------------------------------------------------------------------------------------

async fn assert_recorded(statuses: &[u16]) {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    for &s in statuses {
        let (first, second) = twice(&server, &format!("k-{s}"), s).await;
        assert!(
            second.is_replay(),
            "{s} is recorded and replayed: {}",
            second.describe()
        );
        assert_eq!(second.status, first.status, "{s}: same status");
        assert_eq!(second.body, first.body, "{s}: same body");
    }
    assert_eq!(work.executions(), statuses.len(), "each ran once");
    assert_eq!(store.completes(), statuses.len(), "each was recorded");
    assert_eq!(store.releases(), 0, "nothing was released");
}

async fn assert_released(statuses: &[u16]) {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    for &s in statuses {
        let (first, second) = twice(&server, &format!("k-{s}"), s).await;
        assert!(
            !second.is_replay(),
            "{s} is released, not replayed: {}",
            second.describe()
        );
        assert_eq!(
            second.status.as_u16(),
            s,
            "{s}: the retry ran and answered again"
        );
        assert_eq!(
            second.header("location").map(str::to_owned),
            Some(format!("/things/{}", work.executions())),
            "{s}: the retry is a new execution"
        );
        assert_ne!(first.header("location"), second.header("location"));
    }
    assert_eq!(work.executions(), 2 * statuses.len(), "each ran twice");
    assert_eq!(store.completes(), 0, "nothing was recorded");
    assert_eq!(
        store.releases(),
        2 * statuses.len(),
        "every run was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_statuses_are_recorded_and_replayed() {
    assert_recorded(&[200, 201, 202, 204]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_other_than_408_425_429_are_recorded_and_replayed() {
    assert_recorded(&[400, 401, 403, 404, 409, 410, 422]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_released_so_the_retry_runs_again() {
    assert_released(&[500, 502, 503, 504]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_client_errors_408_425_429_are_released_so_the_retry_runs_again() {
    assert_released(&[408, 425, 429]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_recorded_and_replayed_with_their_location() {
    // Post/Redirect/Get: a 303 after a create is the work's final answer.
    assert_recorded(&[300, 301, 302, 303, 307, 308]).await;
    let (server, work) = server_with(IdempotencyLayer::default()).await;
    let (first, second) = twice(&server, "k-prg", 303).await;
    assert!(second.is_replay(), "{}", second.describe());
    assert_eq!(second.status, StatusCode::SEE_OTHER);
    assert_eq!(
        (first.header("location"), second.header("location")),
        (Some("/things/1"), Some("/things/1")),
        "the replay sends the client where the first answer did"
    );
    assert_eq!(work.executions(), 1, "the create ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_modified_is_released_so_the_retry_runs_again() {
    assert_released(&[304]).await;
}

// ---------------------------------------------------------------------------------------------
// Step 9 with a classification hook: validation errors released
// ---------------------------------------------------------------------------------------------

#[derive(serde::Deserialize)]
struct NewOrder {
    #[allow(dead_code)]
    item: String,
}

/// `POST /orders` taking `Json<NewOrder>` (axum answers 400, 415 or 422 for a bad request
/// inside the layer), and `POST /taken` answering a business 409, behind `layer`.
async fn json_server(layer: IdempotencyLayer<SpyStore>) -> (TestServer, Arc<AtomicUsize>) {
    use axum::extract::State;
    use axum::routing::post;
    let runs = Arc::new(AtomicUsize::new(0));
    async fn create(
        State(runs): State<Arc<AtomicUsize>>,
        axum::Json(_order): axum::Json<NewOrder>,
    ) -> (StatusCode, String) {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        (StatusCode::CREATED, format!("order {n}"))
    }
    async fn taken(State(runs): State<Arc<AtomicUsize>>) -> (StatusCode, String) {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        (StatusCode::CONFLICT, format!("taken {n}"))
    }
    let app = axum::Router::new()
        .route("/orders", post(create))
        .route("/taken", post(taken))
        .with_state(Arc::clone(&runs))
        .layer(layer.principal(tower_idempotency::http::PrincipalMode::Optional));
    (TestServer::start(app).await, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_validation_preset_a_corrected_request_runs_under_the_same_key() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone())
        .classify(tower_idempotency::http::ValidationClassifier);
    let (server, runs) = json_server(layer).await;
    let orders = || server.client().post(server.url("/orders"));
    let valid = r#"{"item":"book"}"#;
    let cases = [
        (
            "malformed JSON",
            orders()
                .header("content-type", "application/json")
                .body(r#"{"item":"#),
            400,
        ),
        ("no content-type", orders().body(valid), 415),
        (
            "a Json<T> that does not deserialize",
            orders()
                .header("content-type", "application/json")
                .body(r#"{"item":5}"#),
            422,
        ),
    ];
    for (i, (what, bad, status)) in cases.into_iter().enumerate() {
        let key = format!("k-valid-{i}");
        let refused = send(bad.key(&key)).await;
        assert_eq!(
            refused.status.as_u16(),
            status,
            "{what}: {}",
            refused.describe()
        );
        let corrected = send(
            orders()
                .header("content-type", "application/json")
                .body(valid)
                .key(&key),
        )
        .await;
        assert_eq!(
            (corrected.status.as_u16(), corrected.is_replay()),
            (201, false),
            "{what}, then the corrected request under the same key runs: {}",
            corrected.describe()
        );
        let again = send(
            orders()
                .header("content-type", "application/json")
                .body(valid)
                .key(&key),
        )
        .await;
        assert!(again.is_replay(), "{what}: the corrected run is recorded");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "one run per corrected request"
    );

    // The preset releases only validation statuses: a business 409 is still recorded.
    let first = send(server.client().post(server.url("/taken")).key("k-taken")).await;
    let again = send(server.client().post(server.url("/taken")).key("k-taken")).await;
    assert_eq!(first.status, StatusCode::CONFLICT);
    assert!(again.is_replay(), "{}", again.describe());
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_hook_a_validation_error_is_recorded() {
    // The default (the reference table): the 400 is the key's record, and the corrected request
    // is another request under a used key.
    let (server, runs) = json_server(IdempotencyLayer::new(SpyStore::new())).await;
    let post = |body: &'static str| {
        server
            .client()
            .post(server.url("/orders"))
            .header("content-type", "application/json")
            .body(body)
            .key("k-default")
    };
    assert_eq!(send(post(r#"{"item":"#)).await.status, 400);
    send(post(r#"{"item":"book"}"#))
        .await
        .assert_problem(422, "idempotency.key_reused");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[derive(Debug, PartialEq, Eq)]
struct Boom(&'static str);

fn keyed_request() -> http::Request<Full<Bytes>> {
    http::Request::post("/work")
        .header("idempotency-key", "k-err")
        .header("content-type", "application/json")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .expect("request")
}

#[tokio::test]
async fn inner_service_error_releases_the_key_and_comes_back_unchanged() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone());
    let calls = Arc::new(AtomicUsize::new(0));

    let c = Arc::clone(&calls);
    let failing = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<http::Response<Full<Bytes>>, _>(Boom("the inner service failed")) }
        },
    ));
    let err = failing
        .oneshot(keyed_request())
        .await
        .expect_err("the inner error comes back");
    assert_eq!(err, Boom("the inner service failed"), "unchanged");
    assert_eq!(store.releases(), 1, "the key was released");
    assert_eq!(store.completes(), 0, "nothing was recorded");

    let c = Arc::clone(&calls);
    let working = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Boom>(
                    http::Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from_static(b"made")))
                        .expect("response"),
                )
            }
        },
    ));
    let res = working
        .oneshot(keyed_request())
        .await
        .expect("the retry succeeds");
    assert_eq!(res.status(), StatusCode::CREATED, "the retry ran");
    assert!(!res.headers().contains_key("idempotent-replayed"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the inner service ran twice"
    );
}

/// The handler's first body fails after one 7-byte chunk: the key must be released (not
/// recorded), so the retry runs again and its own answer becomes the record.
async fn assert_failing_body_releases_the_key(layer: IdempotencyLayer<SpyStore>, store: &SpyStore) {
    let (server, work) = server_with(layer).await;
    let request = || {
        server
            .post("/work", BODY)
            .principal("alice")
            .key("k-broken")
            .header("x-fail-body-first", "1")
    };
    // The first execution's body fails after one chunk: the client sees a broken answer.
    match request().send().await {
        Ok(res) => assert!(
            res.bytes().await.is_err(),
            "the client cannot read a whole body from a failed stream"
        ),
        Err(e) => assert!(!e.is_timeout(), "the failure is not a timeout: {e}"),
    }
    assert_eq!(work.executions(), 1);
    assert_eq!(store.completes(), 0, "nothing was recorded");
    assert_eq!(store.releases(), 1, "the key was released");

    let retry = send(request()).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert!(
        !retry.is_replay(),
        "the retry runs again, no success the client never received is replayed: {}",
        retry.describe()
    );
    assert_eq!(retry.execution(), 2, "the retry ran the handler");
    let replay = send(request()).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.status, 201);
    assert_eq!(work.executions(), 2, "the retry's answer is the record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_body_failing_while_streamed_releases_the_key() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone());
    assert_failing_body_releases_the_key(layer, &store).await;
}

/// Status mode recorded before the body had streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_mode_response_body_failing_while_streamed_releases_the_key() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone()).response_mode(ResponseMode::StatusAndHeaders);
    assert_failing_body_releases_the_key(layer, &store).await;
}

/// A body over the record limit was recorded before the rest had streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_body_over_the_record_limit_failing_while_streamed_releases_the_key() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store.clone())
            .max_record_body(4)
            .build(),
    );
    assert_failing_body_releases_the_key(layer, &store).await;
}

async fn assert_over_limit_recorded_as_status_only(header: &str, value: &str, expected: &[u8]) {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store.clone())
            .max_record_body(8)
            .build(),
    );
    let (server, work) = server_with(layer).await;
    let request = || {
        server
            .post("/work", BODY)
            .principal("alice")
            .key("k-big")
            .header(header, value)
    };
    let first = send(request()).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert_eq!(
        &first.body[..],
        expected,
        "the client receives the whole body"
    );
    assert_eq!(store.completes(), 1, "recorded (status and headers)");

    let replay = send(request()).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.status, 201, "the same status");
    assert!(
        replay.body.is_empty(),
        "a status-only record has an empty body"
    );
    assert_eq!(
        replay.header("location"),
        Some("/things/1"),
        "allowed headers are kept"
    );
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_of_known_length_over_the_record_limit_is_sent_whole_and_recorded_as_status_only()
{
    assert_over_limit_recorded_as_status_only("x-body-bytes", "100", &[b'x'; 100]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_response_over_the_record_limit_is_sent_whole_and_recorded_as_status_only() {
    let expected = b"0123456789".repeat(10);
    assert_over_limit_recorded_as_status_only("x-stream-chunks", "10", &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_complete_still_answers_the_handlers_response_and_the_key_stays_pending_until_its_lease_lapses()
 {
    // The store's clock is moved by hand: a busy machine cannot make the lease lapse early.
    let clock = tower_idempotency::store::clock::ManualClock::new();
    let store = SpyStore::over(
        MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store"),
    );
    store.fail_completes(true);
    let layer = IdempotencyLayer::new(store.clone());
    let lease = layer.engine().lease();
    let (server, work) = server_with(layer).await;
    let request = || {
        server
            .post("/work", BODY)
            .principal("alice")
            .key("k-unrecorded")
    };

    let first = send(request()).await;
    assert_eq!(
        first.status,
        201,
        "the caller gets the handler's response: {}",
        first.describe()
    );
    assert!(!first.is_replay());
    assert_eq!(first.execution(), 1);
    assert!(
        first.header("set-cookie").is_some(),
        "the handler's own response, cookies and all"
    );
    assert_eq!(store.completes(), 1, "complete was tried");

    let right_after = send(request()).await;
    right_after.assert_problem(409, "idempotency.in_flight");
    clock.advance(lease - Duration::from_millis(1));
    send(request())
        .await
        .assert_problem(409, "idempotency.in_flight");

    clock.advance(Duration::from_millis(2));
    let after_lease = send(request()).await;
    assert_eq!(after_lease.status, 201, "{}", after_lease.describe());
    assert!(!after_lease.is_replay(), "re-run after the lease");
    assert_eq!(after_lease.execution(), 2);
    assert_eq!(work.executions(), 2);
}

// ---------------------------------------------------------------------------------------------
// what a replay carries
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_cookie_and_request_id_are_never_replayed() {
    let (server, _work) = server_with(IdempotencyLayer::default()).await;
    let (first, replay) = twice(&server, "k-cookie", 201).await;
    assert!(
        first.header("set-cookie").is_some(),
        "the first answer sets a cookie"
    );
    assert!(first.header("x-request-id").is_some());
    assert!(replay.is_replay(), "{}", replay.describe());
    assert!(
        replay.header("set-cookie").is_none(),
        "Set-Cookie is never replayed: {:?}",
        replay.headers
    );
    assert!(
        replay.header("x-request-id").is_none(),
        "X-Request-Id is never replayed: {:?}",
        replay.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn location_and_content_type_are_replayed() {
    let (server, _work) = server_with(IdempotencyLayer::default()).await;
    let (first, replay) = twice(&server, "k-loc", 201).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(replay.header("location"), Some("/things/1"));
    assert_eq!(replay.header("content-type"), Some("application/json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_link_lines_are_replayed_in_order() {
    let (server, _work) = server_with(IdempotencyLayer::default()).await;
    let (first, replay) = twice(&server, "k-link", 201).await;
    let expected = vec![
        "<a>; rel=\"first\"".to_owned(),
        "<b>; rel=\"second\"".to_owned(),
    ];
    assert_eq!(
        first.header_all("link"),
        expected,
        "the handler sent two lines"
    );
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.header_all("link"), expected, "both lines, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_off_the_allow_list_is_not_replayed() {
    let (server, _work) = server_with(IdempotencyLayer::default()).await;
    let (first, replay) = twice(&server, "k-plain", 201).await;
    assert_eq!(first.header("x-order-id"), Some("order-1"));
    assert!(replay.is_replay());
    assert!(
        replay.header("x-order-id").is_none(),
        "{:?}",
        replay.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_added_with_allow_header_is_replayed() {
    let layer = IdempotencyLayer::default()
        .allow_header(HeaderName::from_static("x-order-id"))
        .expect("x-order-id may be allowed");
    let (server, _work) = server_with(layer).await;
    let (_first, replay) = twice(&server, "k-allowed", 201).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.header("x-order-id"), Some("order-1"));
}

#[test]
fn allow_header_refuses_denied_headers_at_build_time() {
    for name in [
        "set-cookie",
        "x-request-id",
        "content-length",
        "transfer-encoding",
        "date",
        "retry-after",
        "ratelimit-remaining",
        "x-ratelimit-limit",
        "traceparent",
        "idempotent-replayed",
    ] {
        let err = IdempotencyLayer::default()
            .allow_header(HeaderName::from_static(name))
            .expect_err(name);
        assert_eq!(err.kind(), ConfigErrorKind::DeniedHeader, "{name}");
        assert!(
            err.to_string().contains(name),
            "the error names {name}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_mode_replays_status_and_headers_with_an_empty_body() {
    let (server, work) =
        server_with(IdempotencyLayer::default().response_mode(ResponseMode::StatusAndHeaders))
            .await;
    let (first, replay) = twice(&server, "k-status", 201).await;
    assert!(!first.body.is_empty(), "the caller gets the whole body");
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.status, 201);
    assert!(
        replay.body.is_empty(),
        "no body was kept: {}",
        replay.describe()
    );
    assert_eq!(replay.header("location"), Some("/things/1"));
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(work.executions(), 1);
}

/// The headers of a 201 that describe its (gzip-encoded) body, plus `content-type` and
/// `location`, which describe the response.
const REPRESENTATION: &[(&str, &str)] = &[
    ("content-encoding", "gzip"),
    ("etag", "\"v1\""),
    ("last-modified", "Tue, 01 Jul 2025 10:00:00 GMT"),
    ("content-range", "bytes 0-9/10"),
    (
        "digest",
        "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
    ),
    (
        "content-digest",
        "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
    ),
    (
        "repr-digest",
        "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",
    ),
];

/// Runs one keyed request through `layer` over a handler answering a gzip body with its
/// representation headers, reads the answer whole, then repeats it; returns the replay's
/// headers and body.
async fn replay_of_a_represented_body(
    layer: IdempotencyLayer<SpyStore>,
) -> (http::HeaderMap, Bytes) {
    use http_body_util::BodyExt;
    let layer = layer
        .allow_header(HeaderName::from_static("content-range"))
        .and_then(|l| l.allow_header(HeaderName::from_static("digest")))
        .and_then(|l| l.allow_header(HeaderName::from_static("content-digest")))
        .and_then(|l| l.allow_header(HeaderName::from_static("repr-digest")))
        .expect("digest headers may be allowed");
    let mut answers = Vec::new();
    for _ in 0..2 {
        let svc = layer.clone().layer(service_fn(
            |_req: http::Request<RequestBody<Full<Bytes>>>| async {
                let mut res = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .header("location", "/things/1");
                for (n, v) in REPRESENTATION {
                    res = res.header(*n, *v);
                }
                Ok::<_, Boom>(
                    res.body(Full::new(Bytes::from_static(b"\x1f\x8bgzip bytes")))
                        .expect("response"),
                )
            },
        ));
        let mut req = keyed_request();
        req.headers_mut()
            .insert("idempotency-key", http::HeaderValue::from_static("k-gzip"));
        let res = svc.oneshot(req).await.expect("an answer");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("the body").to_bytes();
        answers.push((parts.headers, body));
    }
    let (first, first_body) = answers.remove(0);
    assert!(
        !first.contains_key("idempotent-replayed"),
        "the first answer ran"
    );
    assert_eq!(
        &first_body[..],
        b"\x1f\x8bgzip bytes",
        "the caller gets the whole body"
    );
    for (n, _) in REPRESENTATION {
        assert!(
            first.contains_key(*n),
            "the handler's own answer keeps `{n}`"
        );
    }
    answers.remove(0)
}

/// A record without a body must not replay headers describing a body.
fn assert_no_representation_headers(headers: &http::HeaderMap, body: &Bytes) {
    assert_eq!(
        headers["idempotent-replayed"], "true",
        "a replay: {headers:?}"
    );
    assert!(body.is_empty(), "a status-only record has no body");
    for (n, _) in REPRESENTATION {
        assert!(
            !headers.contains_key(*n),
            "`{n}` describes a body the replay does not have: {headers:?}"
        );
    }
    assert_eq!(headers["content-type"], "application/json", "kept");
    assert_eq!(headers["location"], "/things/1", "kept");
}

#[tokio::test]
async fn status_mode_record_drops_the_headers_that_describe_the_body() {
    let layer =
        IdempotencyLayer::new(SpyStore::new()).response_mode(ResponseMode::StatusAndHeaders);
    let (headers, body) = replay_of_a_represented_body(layer).await;
    assert_no_representation_headers(&headers, &body);
}

#[tokio::test]
async fn over_the_record_limit_record_drops_the_headers_that_describe_the_body() {
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(SpyStore::new())
            .max_record_body(4)
            .build(),
    );
    let (headers, body) = replay_of_a_represented_body(layer).await;
    assert_no_representation_headers(&headers, &body);
}

#[tokio::test]
async fn full_record_keeps_the_headers_that_describe_its_body() {
    let (headers, body) =
        replay_of_a_represented_body(IdempotencyLayer::new(SpyStore::new())).await;
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(&body[..], b"\x1f\x8bgzip bytes");
    for (n, v) in REPRESENTATION {
        assert_eq!(headers[*n], *v, "`{n}` describes the recorded body");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_without_a_body_stored_with_body_headers_replays_without_them() {
    // As an earlier version wrote it: status mode, `content-encoding` and `etag` kept.
    let store = Arc::new(MemoryStore::new());
    let fp = default_fingerprint("POST", "/work", "", "application/json", BODY.as_bytes());
    let fields = [
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
        ("etag", "\"v1\""),
    ]
    .iter()
    .map(|(n, v)| {
        (
            Bytes::from_static(n.as_bytes()),
            Bytes::from_static(v.as_bytes()),
        )
    })
    .collect();
    let record = Recorded::new(201, fields, None).encode().expect("encode");
    plant(&*store, &store_key("http", "alice", "k-old"), &fp, record).await;
    let (server, work) = server_with(IdempotencyLayer::new(Arc::clone(&store))).await;
    let replay = send(server.post("/work", BODY).principal("alice").key("k-old")).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert!(
        replay.header("content-encoding").is_none(),
        "{:?}",
        replay.headers
    );
    assert!(replay.header("etag").is_none(), "{:?}", replay.headers);
    assert_eq!(work.executions(), 0);
}

/// An allowed header value over 64 KiB cannot be encoded into a record. The
/// key was released (an immediate retry re-ran the work) while the log said it stays pending.
#[tokio::test]
async fn response_with_a_header_too_long_to_record_is_recorded_without_it() {
    use http_body_util::BodyExt;
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let long_link = format!("<{}>; rel=\"next\"", "x".repeat(70 * 1024));
    let mut answers = Vec::new();
    for _ in 0..2 {
        let c = Arc::clone(&calls);
        let link = long_link.clone();
        let svc = layer.clone().layer(service_fn(
            move |_req: http::Request<RequestBody<Full<Bytes>>>| {
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                let link = link.clone();
                async move {
                    Ok::<_, Boom>(
                        http::Response::builder()
                            .status(201)
                            .header("content-type", "application/json")
                            .header("location", format!("/things/{n}"))
                            .header("link", "<short>; rel=\"self\"")
                            .header("link", link)
                            .body(Full::new(Bytes::from(format!("{{\"execution\":{n}}}"))))
                            .expect("response"),
                    )
                }
            },
        ));
        let mut req = keyed_request();
        req.headers_mut()
            .insert("idempotency-key", http::HeaderValue::from_static("k-long"));
        let (parts, body) = svc.oneshot(req).await.expect("an answer").into_parts();
        let body = body.collect().await.expect("the body").to_bytes();
        answers.push((parts, body));
    }
    let (first, first_body) = &answers[0];
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(&first_body[..], b"{\"execution\":1}");
    assert_eq!(
        first.headers.get_all("link").iter().count(),
        2,
        "the caller gets the handler's own headers"
    );
    let (replay, replay_body) = &answers[1];
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the work ran once; the retry was answered from a record"
    );
    assert_eq!(store.releases(), 0, "the key was not released");
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(
        &replay_body[..],
        b"{\"execution\":1}",
        "the body is recorded"
    );
    assert_eq!(
        replay.headers["location"], "/things/1",
        "the rest is recorded"
    );
    let links: Vec<_> = replay.headers.get_all("link").iter().collect();
    assert_eq!(
        links,
        ["<short>; rel=\"self\""],
        "only the value too long is left out"
    );
}

// ---------------------------------------------------------------------------------------------
// re-validation at replay
// ---------------------------------------------------------------------------------------------

/// Plants `record` for alice's `key` with the fingerprint of `POST /work` + [`BODY`], then
/// sends that request: the answer must be 503 `record_invalid` with the handler not run.
async fn assert_planted_record_refused(key: &str, record: Record) {
    let store = Arc::new(MemoryStore::new());
    let fp = default_fingerprint("POST", "/work", "", "application/json", BODY.as_bytes());
    plant(&*store, &store_key("http", "alice", key), &fp, record).await;
    let (server, work) = server_with(IdempotencyLayer::new(Arc::clone(&store))).await;
    let a = send(server.post("/work", BODY).principal("alice").key(key)).await;
    a.assert_problem(503, "idempotency.record_invalid");
    assert_eq!(
        work.executions(),
        0,
        "a refused record is not a reason to run again"
    );
}

fn encoded(status: u16, headers: &[(&'static str, &'static str)]) -> Record {
    let fields = headers
        .iter()
        .map(|(n, v)| {
            (
                Bytes::from_static(n.as_bytes()),
                Bytes::from_static(v.as_bytes()),
            )
        })
        .collect();
    Recorded::new(status, fields, Some(Bytes::from_static(b"{}")))
        .encode()
        .expect("encode the planted record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_with_a_non_recordable_status_is_503_record_invalid() {
    assert_planted_record_refused(
        "k-500",
        encoded(500, &[("content-type", "application/json")]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_with_a_denied_header_is_503_record_invalid() {
    let record = encoded(201, &[("location", "/x"), ("set-cookie", "session=stolen")]);
    assert_planted_record_refused("k-cookie", record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_with_corrupt_bytes_is_503_record_invalid() {
    let record = Record::from_bytes(Bytes::from_static(b"not a record"));
    assert_planted_record_refused("k-corrupt", record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_with_a_header_no_longer_allowed_is_503_record_invalid() {
    let store = Arc::new(MemoryStore::new());
    let loose = IdempotencyLayer::new(Arc::clone(&store))
        .allow_header(HeaderName::from_static("x-order-id"))
        .expect("x-order-id may be allowed");
    let (before, work) = server_with(loose).await;
    let first = send(
        before
            .post("/work", BODY)
            .principal("alice")
            .key("k-narrowed"),
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.describe());

    // The same store under the default allow list: the record is checked against it.
    let (after, work_after) = server_with(IdempotencyLayer::new(Arc::clone(&store))).await;
    let a = send(
        after
            .post("/work", BODY)
            .principal("alice")
            .key("k-narrowed"),
    )
    .await;
    a.assert_problem(503, "idempotency.record_invalid");
    assert_eq!(
        work.executions() + work_after.executions(),
        1,
        "no second run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_secret_a_record_planted_without_it_is_503_record_invalid() {
    let secret = Secret::new([7u8; 32]).expect("a 32-byte secret");
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store.clone())
            .secret(secret.clone())
            .build(),
    ))
    .await;
    // A first request shows which (keyed) fingerprint the store sees for this request.
    let probe = send(server.post("/work", BODY).principal("alice").key("k-probe")).await;
    assert_eq!(probe.status, 201, "{}", probe.describe());
    let keyed = store.last_fingerprint().expect("the probe was claimed");

    // Someone with store access but without the secret writes a well-formed record.
    plant(
        store.memory(),
        &secret_store_key(&secret, "http", "alice", "k-forged"),
        &keyed,
        encoded(201, &[]),
    )
    .await;
    let a = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("k-forged"),
    )
    .await;
    a.assert_problem(503, "idempotency.record_invalid");
    assert_eq!(work.executions(), 1, "only the probe ran");

    // A record the layer wrote itself still replays.
    let replay = send(server.post("/work", BODY).principal("alice").key("k-probe")).await;
    assert!(replay.is_replay(), "{}", replay.describe());

    // It rests under the store key keyed by the secret, not the plain one: who reads the store
    // cannot tell which key of which principal a record is for.
    use tower_idempotency::Store;
    use tower_idempotency::store::Claim;
    let plain = store_key("http", "alice", "k-probe");
    let found = store
        .memory()
        .claim(&plain, &keyed, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        matches!(found, Claim::Claimed(_)),
        "nothing under the plain store key: {found:?}"
    );
}

/// A secret changed with `Secret::rotated` keeps the store keys and accepts the old key: a
/// retry of a request recorded under the old secret replays. Once the old key is dropped
/// (`without_previous`), the record is still found and refused (its fingerprint was keyed by
/// the dropped key), never run again. A secret made anew moves the store keys: the retry runs
/// again, the documented cost of that change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_replays_old_records_and_a_dropped_one_runs_nothing_again() {
    let store = SpyStore::new();
    let old = Secret::new([1u8; 32]).expect("a 32-byte secret");
    let with = |secret: Secret| {
        IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(store.clone())
                .secret(secret)
                .build(),
        )
    };
    let (before, work_before) = server_with(with(old.clone())).await;
    let first = send(before.post("/work", BODY).principal("alice").key("k-rot")).await;
    assert_eq!(first.status, 201, "{}", first.describe());

    let rotated = old.rotated([2u8; 32]).unwrap();
    let (after, work_after) = server_with(with(rotated.clone())).await;
    let retry = send(after.post("/work", BODY).principal("alice").key("k-rot")).await;
    assert!(retry.is_replay(), "{}", retry.describe());
    assert_eq!(retry.json(), first.json(), "the first run's answer");

    let (dropped, work_dropped) = server_with(with(rotated.without_previous())).await;
    let retry = send(dropped.post("/work", BODY).principal("alice").key("k-rot")).await;
    retry.assert_problem(422, "idempotency.key_reused");
    assert_eq!(
        work_after.executions() + work_dropped.executions(),
        0,
        "nothing ran again"
    );

    let (anew, work_anew) = server_with(with(Secret::new([2u8; 32]).unwrap())).await;
    let retry = send(anew.post("/work", BODY).principal("alice").key("k-rot")).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert_eq!(
        work_anew.executions(),
        1,
        "under new store keys, the work runs again"
    );
    assert_eq!(work_before.executions(), 1);
}

// ---------------------------------------------------------------------------------------------
// trailers pass the allow and deny lists
// ---------------------------------------------------------------------------------------------

/// A response body of one data frame, then trailers.
struct WithTrailers {
    frames: std::collections::VecDeque<http_body::Frame<Bytes>>,
}

impl WithTrailers {
    fn new(trailers: &[(&'static str, &'static str)]) -> Self {
        let mut map = http::HeaderMap::new();
        for (n, v) in trailers {
            map.append(
                HeaderName::from_static(n),
                http::HeaderValue::from_static(v),
            );
        }
        Self {
            frames: [
                http_body::Frame::data(Bytes::from_static(b"made")),
                http_body::Frame::trailers(map),
            ]
            .into(),
        }
    }
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

#[tokio::test]
async fn http_trailers_pass_the_allow_list() {
    let layer = IdempotencyLayer::default()
        .allow_header(HeaderName::from_static("x-order-id"))
        .expect("x-order-id may be allowed");
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let service = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, std::convert::Infallible>(http::Response::new(WithTrailers::new(&[
                    ("x-order-id", "o-1"),
                    ("x-checksum", "sha256=abc"),
                    ("server-timing", "db;dur=53"),
                    ("set-cookie", "session=s1"),
                ])))
            }
        },
    ));
    async fn trailers_of(res: http::Response<ResponseBody<WithTrailers>>) -> http::HeaderMap {
        use http_body_util::BodyExt;
        let collected = res.into_body().collect().await.expect("the body");
        collected.trailers().cloned().unwrap_or_default()
    }

    let first = service
        .clone()
        .oneshot(keyed_request())
        .await
        .expect("first");
    let first = trailers_of(first).await;
    assert_eq!(
        first.len(),
        4,
        "the caller gets every trailer the handler sent"
    );

    let replay = service.oneshot(keyed_request()).await.expect("replay");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replayed = trailers_of(replay).await;
    assert_eq!(
        replayed.get("x-order-id").map(|v| v.as_bytes()),
        Some(&b"o-1"[..]),
        "an allowed trailer is replayed"
    );
    for name in ["x-checksum", "server-timing", "set-cookie"] {
        assert!(
            !replayed.contains_key(name),
            "{name} is not on the allow list: not replayed ({replayed:?})"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_with_a_trailer_off_the_allow_list_is_503_record_invalid() {
    let record = Recorded::new(201, vec![], Some(Bytes::from_static(b"{}")))
        .with_trailers(vec![(
            Bytes::from_static(b"x-checksum"),
            Bytes::from_static(b"sha256=abc"),
        )])
        .encode()
        .expect("encode the planted record");
    assert_planted_record_refused("k-trailer", record).await;
}
