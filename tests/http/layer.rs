//! The HTTP layer over a real TCP server: the check order (steps 1–8),
//! principal, tenant and namespace isolation, and the three ways to mount the layer in axum.
//!
//! Rejections in detail (bad keys, body limits, store failures, problem+json) are in
//! `http/rejections.rs`; what happens after the handler and what a replay carries are in
//! `http/replay.rs`; concurrent repeats, lease renewal and dropped clients are in
//! `http/concurrency.rs`; the extractors in `http/extractors.rs`; the quickstart example's
//! contract in `e2e/quickstart.rs`.

use crate::support;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use reqwest::Method;
use std::sync::Arc;
use std::time::Duration;
use support::http::{
    Chunks, RequestExt, SpyStore, TestServer, Work, bounded, default_fingerprint, eventually, send,
    server_with, store_key, with_auth,
};
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::store::Claim;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Store};

const BODY: &str = r#"{"item":"book"}"#;

// ---------------------------------------------------------------------------------------------
// Step 1: methods
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_with_a_key_passes_through_and_runs_every_time() {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    for attempt in 1..=2 {
        let a = send(
            server
                .request(Method::GET, "/work")
                .principal("alice")
                .key("k-get"),
        )
        .await;
        assert_eq!(a.status, 201, "GET #{attempt} runs: {}", a.describe());
        assert!(!a.is_replay(), "a GET is never replayed");
        assert_eq!(a.execution(), attempt, "GET #{attempt} ran the handler");
    }
    assert_eq!(work.executions(), 2, "a safe method runs every time");
    assert_eq!(store.claims(), 0, "a safe method makes no store call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_option_limits_the_layer_to_the_listed_methods() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone()).methods([Method::PUT]);
    let (server, work) = server_with(layer).await;
    for _ in 0..2 {
        let a = send(server.post("/work", BODY).principal("alice").key("k")).await;
        assert!(!a.is_replay(), "POST is outside the set: {}", a.describe());
    }
    assert_eq!(work.executions(), 2, "POST passed through twice");
    assert_eq!(store.claims(), 0, "POST made no store call");

    let put = || {
        server
            .request(Method::PUT, "/work")
            .principal("alice")
            .key("k")
    };
    let first = send(put()).await;
    let second = send(put()).await;
    assert!(!first.is_replay(), "first PUT runs: {}", first.describe());
    assert!(
        second.is_replay(),
        "second PUT is replayed: {}",
        second.describe()
    );
    assert_eq!(work.executions(), 3, "PUT ran once");
}

// ---------------------------------------------------------------------------------------------
// Steps 3–5: key, principal
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_and_not_required_passes_through_before_the_principal_check() {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone()).require_key(false)).await;
    for attempt in 1..=2 {
        // No principal and no key: the principal is only required for keyed requests.
        let a = send(server.post("/work", BODY)).await;
        assert_eq!(
            a.status,
            201,
            "unkeyed request #{attempt}: {}",
            a.describe()
        );
        assert!(!a.is_replay());
    }
    assert_eq!(work.executions(), 2, "an unkeyed request runs every time");
    assert_eq!(store.claims(), 0, "an unkeyed request makes no store call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_request_without_a_principal_is_401_principal_missing() {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    let a = send(server.post("/work", BODY).key("k1")).await;
    a.assert_problem(401, "idempotency.principal_missing");
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(store.claims(), 0, "nothing reached the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_principal_is_checked_before_a_missing_required_key() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let a = send(server.post("/work", BODY)).await;
    a.assert_problem(401, "idempotency.principal_missing");
    assert_eq!(work.executions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_key_missing_is_400_key_missing() {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    let a = send(server.post("/work", BODY).principal("alice")).await;
    a.assert_problem(400, "idempotency.key_missing");
    assert!(
        a.json()["detail"]
            .as_str()
            .is_some_and(|d| d.contains("idempotency-key")),
        "the detail names the header: {}",
        a.describe()
    );
    assert_eq!(work.executions(), 0, "the handler did not run");
    assert_eq!(store.claims(), 0, "nothing reached the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_and_bare_forms_of_a_key_are_one_key() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let bare = send(server.post("/work", BODY).principal("alice").key("order-7")).await;
    let quoted = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key(r#""order-7";v=1"#),
    )
    .await;
    assert!(!bare.is_replay(), "{}", bare.describe());
    assert!(
        quoted.is_replay(),
        "`\"order-7\"` is the same key as `order-7`: {}",
        quoted.describe()
    );
    assert_eq!(work.executions(), 1);
}

// ---------------------------------------------------------------------------------------------
// Step 8: claim outcomes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_with_a_key_is_claimed_and_runs() {
    let store = SpyStore::new();
    let (server, work) = server_with(IdempotencyLayer::new(store.clone())).await;
    let a = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert_eq!(a.status, 201, "{}", a.describe());
    assert!(!a.is_replay(), "a first run is not a replay");
    assert_eq!(a.execution(), 1);
    assert_eq!(work.executions(), 1);
    assert_eq!(store.claims(), 1, "one claim");
    assert_eq!(store.completes(), 1, "the 201 was recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_of_a_completed_request_is_replayed_without_running_the_handler() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let first = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    let second = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert!(
        second.is_replay(),
        "the repeat is a replay: {}",
        second.describe()
    );
    assert_eq!(
        second.header("idempotent-replayed"),
        Some("true"),
        "replay header value"
    );
    assert_eq!(second.status, first.status, "same status");
    assert_eq!(second.body, first.body, "same body");
    assert_eq!(work.executions(), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_while_the_first_is_in_flight_is_409_in_flight_with_retry_after() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let slow = server
        .post("/work", BODY)
        .principal("alice")
        .key("k1")
        .delay_ms(800);
    let first = tokio::spawn(send(slow));
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 1).await,
        "the first request reached the handler"
    );
    let dup = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    dup.assert_problem(409, "idempotency.in_flight");
    // The lease the first run has left (the default 60 s, claimed under a second ago), at
    // most a third of the lease.
    assert_eq!(
        dup.header("retry-after"),
        Some("20"),
        "409 says when to retry"
    );

    let first = bounded(Duration::from_secs(10), "the slow request", first)
        .await
        .expect("the slow request task");
    assert_eq!(first.status, 201, "{}", first.describe());
    let later = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert!(
        later.is_replay(),
        "after completion: replay, {}",
        later.describe()
    );
    assert_eq!(work.executions(), 1, "the handler ran once");
}

async fn assert_key_reused(server: &TestServer, work: &Work, second: reqwest::RequestBuilder) {
    let first = send(server.post("/work?x=1", BODY).principal("alice").key("k1")).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    let a = send(second).await;
    a.assert_problem(422, "idempotency.key_reused");
    assert_eq!(work.executions(), 1, "the other request did not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_body_is_422_key_reused() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let other = server
        .post("/work?x=1", r#"{"item":"pen"}"#)
        .principal("alice")
        .key("k1");
    assert_key_reused(&server, &work, other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_path_is_422_key_reused() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let other = server.post("/other?x=1", BODY).principal("alice").key("k1");
    assert_key_reused(&server, &work, other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_query_is_422_key_reused() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let other = server.post("/work?x=2", BODY).principal("alice").key("k1");
    assert_key_reused(&server, &work, other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_a_different_content_type_is_422_key_reused() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let other = server
        .client()
        .post(server.url("/work?x=1"))
        .header("content-type", "text/plain")
        .body(BODY)
        .principal("alice")
        .key("k1");
    assert_key_reused(&server, &work, other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_request_while_the_first_is_in_flight_is_422_key_reused() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let slow = server
        .post("/work", BODY)
        .principal("alice")
        .key("k1")
        .delay_ms(800);
    let first = tokio::spawn(send(slow));
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 1).await,
        "the first request reached the handler"
    );
    let other = send(
        server
            .post("/work", r#"{"item":"pen"}"#)
            .principal("alice")
            .key("k1"),
    )
    .await;
    other.assert_problem(422, "idempotency.key_reused");
    let first = bounded(Duration::from_secs(10), "the slow request", first)
        .await
        .expect("the slow request task");
    assert_eq!(first.status, 201);
    assert_eq!(work.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_within_the_limit_is_fingerprinted_and_replayed() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Chunks>();
    let request = || {
        hyper::Request::post(server.url("/work"))
            .header("content-type", "application/json")
            .header("x-principal", "alice")
            .header("idempotency-key", "chunked")
            .body(Chunks::new([
                Bytes::from_static(b"{\"item\":"),
                Bytes::from_static(b"\"book\"}"),
            ]))
            .expect("request")
    };
    let mut answers = Vec::new();
    for _ in 0..2 {
        let res = bounded(
            Duration::from_secs(10),
            "a chunked request",
            client.request(request()),
        )
        .await
        .expect("the chunked request reaches the server");
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        answers.push((status, replayed, body));
    }
    assert_eq!(answers[0].0, 201);
    assert!(!answers[0].1, "the first chunked request runs");
    assert!(answers[1].1, "the same chunked body is a replay");
    assert_eq!(answers[0].2, answers[1].2, "same body");
    assert_eq!(work.executions(), 1);

    // The same bytes in one piece have the same fingerprint.
    let whole = send(server.post("/work", BODY).principal("alice").key("chunked")).await;
    assert!(
        whole.is_replay(),
        "the fingerprint does not depend on chunking: {}",
        whole.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// Scopes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_with_the_same_key_runs_its_own_work() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let alice = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    let bob = send(server.post("/work", BODY).principal("bob").key("k1")).await;
    assert!(!alice.is_replay());
    assert!(
        !bob.is_replay(),
        "bob is not served alice's record: {}",
        bob.describe()
    );
    assert_ne!(alice.execution(), bob.execution(), "two executions");
    assert_eq!(work.executions(), 2);

    let alice_again = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    let bob_again = send(server.post("/work", BODY).principal("bob").key("k1")).await;
    assert!(alice_again.is_replay() && bob_again.is_replay());
    assert_eq!(
        alice_again.execution(),
        alice.execution(),
        "alice gets her own record"
    );
    assert_eq!(
        bob_again.execution(),
        bob.execution(),
        "bob gets his own record"
    );
    assert_eq!(work.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_principal_under_another_tenant_runs_its_own_work() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let acme = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .header("x-tenant", "acme")
            .key("k1"),
    )
    .await;
    let globex = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .header("x-tenant", "globex")
            .key("k1"),
    )
    .await;
    assert!(
        !acme.is_replay() && !globex.is_replay(),
        "{}",
        globex.describe()
    );
    assert_eq!(work.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_principal_mode_shares_one_anonymous_scope_so_a_second_anonymous_caller_gets_a_replay()
 {
    let layer = IdempotencyLayer::new(SpyStore::new()).principal(PrincipalMode::Optional);
    let (server, work) = server_with(layer).await;
    // Two different anonymous callers (two connections, no principal) with one key.
    let first = send(server.post("/work", BODY).key("anon-1")).await;
    let other_caller = support::http::client(); // a client of its own, its own connections
    let second = send(
        other_caller
            .post(server.url("/work"))
            .header("content-type", "application/json")
            .body(BODY)
            .key("anon-1"),
    )
    .await;
    assert!(!first.is_replay(), "{}", first.describe());
    assert!(
        second.is_replay(),
        "anonymous callers share one scope (the documented risk): {}",
        second.describe()
    );
    assert_eq!(work.executions(), 1);

    // An authenticated caller still has a scope of its own.
    let alice = send(server.post("/work", BODY).principal("alice").key("anon-1")).await;
    assert!(!alice.is_replay(), "{}", alice.describe());
    assert_eq!(work.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_sharing_one_store_keep_their_records_apart() {
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    let a =
        TestServer::start(work.app(IdempotencyLayer::new(Arc::clone(&store)).namespace("a"))).await;
    let b =
        TestServer::start(work.app(IdempotencyLayer::new(Arc::clone(&store)).namespace("b"))).await;
    let in_a = send(a.post("/work", BODY).principal("alice").key("k1")).await;
    let in_b = send(b.post("/work", BODY).principal("alice").key("k1")).await;
    assert!(!in_a.is_replay());
    assert!(!in_b.is_replay(), "namespace b does not see a's record");
    assert_eq!(work.executions(), 2);
    let again_a = send(a.post("/work", BODY).principal("alice").key("k1")).await;
    assert!(again_a.is_replay());
    assert_eq!(again_a.execution(), in_a.execution());
}

// ---------------------------------------------------------------------------------------------
// Mounting in axum
// ---------------------------------------------------------------------------------------------

async fn assert_runs_once(server: &TestServer, work: &Work) {
    let first = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    let second = send(server.post("/work", BODY).principal("alice").key("k1")).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(!first.is_replay());
    assert!(second.is_replay(), "{}", second.describe());
    assert_eq!(work.executions(), 1);
    let missing = send(server.post("/work", BODY).principal("alice")).await;
    missing.assert_problem(400, "idempotency.key_missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_works_as_router_layer() {
    let work = Work::new();
    let router = Router::new()
        .route("/work", post(support::http::work))
        .with_state(work.clone())
        .layer(IdempotencyLayer::default());
    let server = TestServer::start(with_auth(router)).await;
    assert_runs_once(&server, &work).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_works_as_router_route_layer() {
    let work = Work::new();
    let router = Router::new()
        .route("/work", post(support::http::work))
        .route_layer(IdempotencyLayer::default())
        .with_state(work.clone());
    let server = TestServer::start(with_auth(router)).await;
    assert_runs_once(&server, &work).await;
    let unrouted = send(server.post("/nowhere", BODY).principal("alice")).await;
    assert_eq!(
        unrouted.status,
        404,
        "route_layer leaves unmatched paths alone: {}",
        unrouted.describe()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_works_per_route_on_a_method_router() {
    let work = Work::new();
    let router = Router::new()
        .route(
            "/work",
            post(support::http::work).layer(IdempotencyLayer::default()),
        )
        .route("/other", post(support::http::work))
        .with_state(work.clone());
    let server = TestServer::start(with_auth(router)).await;
    assert_runs_once(&server, &work).await;
    let elsewhere = send(server.post("/other", BODY).principal("alice").key("k1")).await;
    assert!(
        !elsewhere.is_replay() && elsewhere.status == 201,
        "a route without the layer runs normally: {}",
        elsewhere.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// Two layers on one route
// ---------------------------------------------------------------------------------------------

/// The same layer twice around the routes, one store: the inner one sees the outer one's claim
/// of the same store key and passes the request through, so the handler runs (once) instead of
/// the inner layer answering 409 and the outer one recording that 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stacked_layers_over_one_store_run_the_handler_once() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone());
    let work = Work::new();
    let app = with_auth(work.routes().layer(layer.clone()).layer(layer));
    let server = TestServer::start(app).await;
    let request = || server.post("/work", BODY).principal("alice").key("k-twice");

    let first = send(request()).await;
    assert_eq!(first.status, 201, "the handler ran: {}", first.describe());
    assert!(!first.is_replay());
    let again = send(request()).await;
    assert!(again.is_replay(), "{}", again.describe());
    assert_eq!((again.status.as_u16(), again.execution()), (201, 1));
    assert_eq!(work.executions(), 1, "the handler ran once");
    assert_eq!(
        (store.claims(), store.completes(), store.releases()),
        (2, 1, 0),
        "only the outer layer claimed (once per request) and recorded"
    );
}

/// Two layers whose store keys differ (two namespaces over one store), in either order: a
/// rejection of the inner one (409, the key held by another request in its namespace) goes to
/// the caller with its `Retry-After`, and the outer one releases its claim instead of recording
/// the rejection, so the retry runs once the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_layers_rejection_is_never_recorded_by_the_outer_layer() {
    for (outer_ns, inner_ns) in [("outer", "inner"), ("inner", "outer")] {
        let store = SpyStore::new();
        let outer = IdempotencyLayer::new(store.clone()).namespace(outer_ns);
        let inner = IdempotencyLayer::new(store.clone()).namespace(inner_ns);
        let work = Work::new();
        let server = TestServer::start(with_auth(work.routes().layer(inner).layer(outer))).await;
        let request = || {
            server
                .post("/work", BODY)
                .principal("alice")
                .key("k-nested")
        };

        // Another request with the same body holds the key in the inner layer's namespace.
        let fp = default_fingerprint("POST", "/work", "", "application/json", BODY.as_bytes());
        let held = store_key(inner_ns, "alice", "k-nested");
        let Claim::Claimed(token) = store
            .memory()
            .claim(&held, &fp, Duration::from_secs(60))
            .await
            .expect("claim")
        else {
            panic!("the key is free");
        };

        let busy = send(request()).await;
        busy.assert_problem(409, "idempotency.in_flight");
        assert!(
            busy.header("retry-after").is_some(),
            "{outer_ns} outside {inner_ns}: the inner layer's 409 keeps its Retry-After"
        );
        assert_eq!(store.completes(), 0, "the outer layer recorded nothing");
        assert_eq!(store.releases(), 1, "the outer layer released its claim");

        assert!(
            store
                .memory()
                .release(&held, &token)
                .await
                .expect("release")
        );
        let retry = send(request()).await;
        assert_eq!(
            (retry.status.as_u16(), retry.is_replay()),
            (201, false),
            "{outer_ns} outside {inner_ns}: the retry runs: {}",
            retry.describe()
        );
        assert_eq!(work.executions(), 1);
    }
}
