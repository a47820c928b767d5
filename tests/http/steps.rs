//! `Steps` in handlers behind the layer, over a real TCP server: a retry after a 5xx runs only
//! the steps that did not complete; a completed request replays without running any; mistakes
//! in a handler's steps are refused before they run.

#![allow(clippy::unwrap_used)]

use crate::support;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::http::{RequestExt, TestServer, send, with_auth};
use tokio::sync::oneshot;
use tower_idempotency::engine::{Engine, Raw, StepErrorKind};
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Secret, Steps};

const ORDER: &str = r#"{"sku":"book","qty":1}"#;

/// Providers that count what they did. The mailer fails as often as told first.
#[derive(Default)]
struct Providers {
    reserved: AtomicUsize,
    charged: AtomicUsize,
    mailed: AtomicUsize,
    mail_failures_left: AtomicUsize,
    /// The derived key each charge was sent under, with how often.
    charge_keys: Mutex<HashMap<String, usize>>,
}

type Shared = Arc<Providers>;

async fn checkout(State(p): State<Shared>, steps: Steps) -> (StatusCode, Json<Value>) {
    let p = &*p;
    let hold = steps
        .run("reserve", Raw, |_| async {
            let n = p.reserved.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, String>(format!("hold-{n}"))
        })
        .await;
    let Ok(hold) = hold else {
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({})));
    };
    let charge = steps
        .run("charge", Raw, |key| async move {
            let n = p.charged.fetch_add(1, Ordering::SeqCst) + 1;
            *p.charge_keys
                .lock()
                .unwrap()
                .entry(key.to_string())
                .or_default() += 1;
            Ok::<_, String>(format!("charge-{n}"))
        })
        .await;
    let Ok(charge) = charge else {
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({})));
    };
    let receipt = steps
        .run("receipt", Raw, |_| async {
            if p.mail_failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(String::from("mail provider answered 502"));
            }
            p.mailed.fetch_add(1, Ordering::SeqCst);
            Ok(String::from("sent"))
        })
        .await;
    match receipt {
        Ok(_) => (
            StatusCode::CREATED,
            Json(json!({ "hold": hold, "charge": charge })),
        ),
        // The provider failed: answer 503 so the key is released and the client retries.
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": e.to_string() })),
        ),
    }
}

async fn serve(providers: Shared) -> TestServer {
    let app = Router::new()
        .route("/checkout", post(checkout))
        .with_state(providers)
        .layer(IdempotencyLayer::new(MemoryStore::new()).principal(PrincipalMode::Required));
    TestServer::start(with_auth(app)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_5xx_runs_only_the_steps_that_did_not_complete() {
    let p = Shared::default();
    p.mail_failures_left.store(1, Ordering::SeqCst);
    let server = serve(Arc::clone(&p)).await;
    let order = || {
        server
            .post("/checkout", ORDER)
            .principal("alice")
            .key("order-1")
    };

    let first = send(order()).await;
    assert_eq!(first.status, 503, "{}", first.describe());
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "the first run charged");
    assert_eq!(p.mailed.load(Ordering::SeqCst), 0, "and failed to mail");

    let retry = send(order()).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert!(!retry.is_replay(), "the retry ran the handler again");
    assert_eq!(
        retry.json(),
        json!({ "hold": "hold-1", "charge": "charge-1" }),
        "the retry answers with the first run's reservation and charge"
    );
    assert_eq!(p.reserved.load(Ordering::SeqCst), 1, "reserved once");
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(p.mailed.load(Ordering::SeqCst), 1, "mailed once");

    let replay = send(order()).await;
    assert!(replay.is_replay(), "the completed request replays");
    assert_eq!(replay.json(), retry.json());
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "a replay runs no step");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_forwards_a_key_stable_across_retries_and_distinct_per_request() {
    let p = Shared::default();
    p.mail_failures_left.store(1, Ordering::SeqCst);
    let server = serve(Arc::clone(&p)).await;

    // The first order's charge runs once, under one key; another order's under another.
    let a = send(server.post("/checkout", ORDER).principal("alice").key("a")).await;
    assert_eq!(a.status, 503);
    let b = send(server.post("/checkout", ORDER).principal("alice").key("b")).await;
    assert_eq!(b.status, 201);
    let keys = p.charge_keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "one charge key per request: {keys:?}");
    assert!(
        keys.values().all(|n| *n == 1),
        "each charged once: {keys:?}"
    );
    assert!(
        keys.keys().all(|k| k.len() == 64 && k != "a" && k != "b"),
        "a derived key never shows the client's: {keys:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_body_under_a_released_key_is_refused_as_a_reused_key_and_runs_no_step() {
    let p = Shared::default();
    p.mail_failures_left.store(1, Ordering::SeqCst);
    let server = serve(Arc::clone(&p)).await;

    let first = send(server.post("/checkout", ORDER).principal("alice").key("k")).await;
    assert_eq!(first.status, 503);
    // Same key, another body: the key's steps are the first request's.
    let other = send(
        server
            .post("/checkout", r#"{"sku":"pen","qty":2}"#)
            .principal("alice")
            .key("k"),
    )
    .await;
    assert_eq!(other.status, 422, "{}", other.describe());
    assert_eq!(other.json()["code"], "idempotency.key_reused");
    assert_eq!(p.reserved.load(Ordering::SeqCst), 1, "no step ran again");
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "no step ran again");
    // The claim was released, not completed: the first request's retry finishes its work.
    let retry = send(server.post("/checkout", ORDER).principal("alice").key("k")).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert_eq!(
        retry.json(),
        json!({ "hold": "hold-1", "charge": "charge-1" })
    );
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "charged once");
    server.stop().await;
}

/// Steps recorded under a secret's old key: after a rotation (`Secret::rotated`, which accepts
/// the old key) the retry finds them as its own and runs only the unfinished step; once the old
/// key is dropped they cannot be verified, and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_under_a_rotated_secret_replay_and_a_dropped_key_runs_no_step() {
    let p = Shared::default();
    p.mail_failures_left.store(1, Ordering::SeqCst);
    let store = Arc::new(MemoryStore::new());
    let old_secret = Secret::new(vec![1; 32]).unwrap();
    let app = |secret: Secret| {
        let engine = Engine::builder(Arc::clone(&store)).secret(secret).build();
        Router::new()
            .route("/checkout", post(checkout))
            .with_state(Arc::clone(&p))
            .layer(IdempotencyLayer::new(engine).principal(PrincipalMode::Required))
    };
    let old = TestServer::start(with_auth(app(old_secret.clone()))).await;
    let first = send(old.post("/checkout", ORDER).principal("alice").key("k")).await;
    assert_eq!(first.status, 503);
    old.stop().await;

    // The old key dropped: the recorded steps are found, cannot be verified, nothing runs.
    let rotated = old_secret.rotated(vec![2; 32]).unwrap();
    let dropped = TestServer::start(with_auth(app(rotated.without_previous()))).await;
    let retry = send(dropped.post("/checkout", ORDER).principal("alice").key("k")).await;
    assert_eq!(retry.status, 503, "{}", retry.describe());
    assert_eq!(retry.json()["code"], "idempotency.record_invalid");
    assert_eq!(p.reserved.load(Ordering::SeqCst), 1, "no step ran again");
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "no step ran again");
    dropped.stop().await;

    // Rotated, the old key accepted: the steps are this request's, answered from their
    // records, and the retry finishes the work.
    let new = TestServer::start(with_auth(app(rotated))).await;
    let retry = send(new.post("/checkout", ORDER).principal("alice").key("k")).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert_eq!(
        retry.json(),
        json!({ "hold": "hold-1", "charge": "charge-1" })
    );
    assert_eq!(p.reserved.load(Ordering::SeqCst), 1, "no step ran again");
    assert_eq!(p.charged.load(Ordering::SeqCst), 1, "no step ran again");
    assert_eq!(
        p.mailed.load(Ordering::SeqCst),
        1,
        "the unfinished step ran"
    );
    new.stop().await;
}

/// Takes the steps twice: one sequence.
async fn twice(a: Steps, b: Steps) -> String {
    a.run("reserve", Raw, |_| async {
        Ok::<_, String>("r".to_owned())
    })
    .await
    .unwrap();
    match b
        .run("reserve", Raw, |_| async {
            Ok::<_, String>("again".to_owned())
        })
        .await
    {
        Err(e) => format!("{:?}", e.kind()),
        Ok(v) => v,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_steps_extractors_of_one_request_are_one_sequence() {
    let app = Router::new()
        .route("/twice", post(twice))
        .layer(IdempotencyLayer::new(MemoryStore::new()).principal(PrincipalMode::Required));
    let server = TestServer::start(with_auth(app)).await;
    let a = send(server.post("/twice", ORDER).principal("alice").key("t")).await;
    assert_eq!(a.text(), "NameReused", "{}", a.describe());
    server.stop().await;
}

/// Moves its steps into a task that outlives the request, and reports what a step did there.
async fn leaks(
    State(tx): State<Arc<Mutex<Option<oneshot::Sender<Steps>>>>>,
    steps: Steps,
) -> &'static str {
    let tx = tx.lock().unwrap().take().unwrap();
    tx.send(steps).unwrap();
    "answered"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_kept_past_their_request_run_nothing() {
    let (tx, rx) = oneshot::channel();
    let app = Router::new()
        .route("/leak", post(leaks))
        .with_state(Arc::new(Mutex::new(Some(tx))))
        .layer(IdempotencyLayer::new(MemoryStore::new()).principal(PrincipalMode::Required));
    let server = TestServer::start(with_auth(app)).await;
    let a = send(server.post("/leak", ORDER).principal("alice").key("l")).await;
    assert_eq!(a.status, 200, "{}", a.describe());
    let steps = rx.await.unwrap();
    let ran = AtomicUsize::new(0);
    let e = steps
        .run("charge", Raw, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(String::new())
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StepErrorKind::ClaimLost, "{e}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    server.stop().await;
}

async fn reused(steps: Steps) -> (StatusCode, String) {
    let first = steps
        .run("charge", Raw, |_| async { Ok::<_, String>(String::new()) })
        .await;
    assert!(first.is_ok());
    match steps
        .run("charge", Raw, |_| async {
            panic!("a reused name must not run");
            #[allow(unreachable_code)]
            Ok::<String, String>(String::new())
        })
        .await
    {
        Err(e) if e.kind() == StepErrorKind::NameReused => {
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        other => (StatusCode::OK, format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_name_used_twice_in_one_run_is_refused_before_it_runs() {
    let app = Router::new()
        .route("/reused", post(reused))
        .layer(IdempotencyLayer::new(MemoryStore::new()).principal(PrincipalMode::Required));
    let server = TestServer::start(with_auth(app)).await;
    let a = send(server.post("/reused", ORDER).principal("alice").key("r")).await;
    assert_eq!(a.status, 500, "{}", a.describe());
    assert!(
        a.text().contains("used twice"),
        "the error names the mistake: {}",
        a.text()
    );
    server.stop().await;
}

async fn optional(steps: Option<Steps>) -> String {
    format!("{}", steps.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_request_has_no_steps_and_a_keyed_one_has() {
    let app = Router::new().route("/opt", post(optional)).layer(
        IdempotencyLayer::new(MemoryStore::new())
            .principal(PrincipalMode::Optional)
            .require_key(false),
    );
    let server = TestServer::start(app).await;
    let unkeyed = send(server.post("/opt", ORDER)).await;
    assert_eq!(unkeyed.text(), "false");
    let keyed = send(server.post("/opt", ORDER).key("x")).await;
    assert_eq!(keyed.text(), "true");
    server.stop().await;
}
