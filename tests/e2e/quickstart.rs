//! The quickstart example's contract, tested against
//! the built example binary run as a child process on a free port, with the memory store (how
//! the binary is found or built: `tests/support/quickstart.rs`).

use crate::support;

use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};
use support::http::{Answer, bounded, client, send};
use support::quickstart::Quickstart;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_replays_a_repeated_order_without_running_it_again() {
    let qs = Quickstart::start_memory().await;
    let body = json!({ "item": "book" });
    let first = send(qs.order("alice", "order-1", &body)).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(!first.is_replay());
    let id = first.json()["id"].as_str().expect("an order id").to_owned();
    assert_eq!(first.json()["item"], "book");
    assert_eq!(first.json()["execution"], 1);
    assert_eq!(
        first.header("location"),
        Some(format!("/orders/{id}").as_str())
    );
    assert!(
        first.header("set-cookie").is_some(),
        "the first answer sets a cookie"
    );
    assert!(first.header("x-request-id").is_some());

    let second = send(qs.order("alice", "order-1", &body)).await;
    assert_eq!(second.status, 201, "{}", second.describe());
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(second.header("location"), first.header("location"));
    assert_eq!(second.body, first.body, "the same order");
    assert!(
        second.header("set-cookie").is_none(),
        "no Set-Cookie on a replay"
    );
    assert!(
        second.header("x-request-id").is_none(),
        "no X-Request-Id on a replay"
    );
    assert_eq!(qs.executions().await, 1, "one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_releases_a_failed_order_so_the_retry_runs_again() {
    let qs = Quickstart::start_memory().await;
    let body = json!({ "item": "book", "fail": 503 });
    let first = send(qs.order("alice", "order-f", &body)).await;
    let retry = send(qs.order("alice", "order-f", &body)).await;
    for (n, a) in [(1, &first), (2, &retry)] {
        assert_eq!(a.status, 503, "{}", a.describe());
        assert!(!a.is_replay(), "a 503 is never replayed");
        assert_eq!(a.json()["execution"], n, "attempt {n} executed");
    }
    assert_eq!(qs.executions().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_answers_409_to_a_concurrent_duplicate_of_a_slow_order() {
    let qs = Quickstart::start_memory().await;
    let body = json!({ "item": "book", "delay_ms": 1500 });
    let first = tokio::spawn(send(qs.order("alice", "order-slow", &body)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while qs.executions().await == 0 {
        assert!(Instant::now() < deadline, "the slow order never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dup = send(qs.order("alice", "order-slow", &body)).await;
    dup.assert_problem(409, "idempotency.in_flight");
    assert!(dup.header("retry-after").is_some());

    let first: Answer = bounded(Duration::from_secs(20), "the slow order", first)
        .await
        .expect("the slow order task");
    assert_eq!(first.status, 201, "{}", first.describe());
    let later = send(qs.order("alice", "order-slow", &body)).await;
    assert!(later.is_replay(), "{}", later.describe());
    assert_eq!(qs.executions().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_preflight_from_another_origin_allows_the_idempotency_key_header() {
    let qs = Quickstart::start_memory().await;
    let a = send(
        client()
            .request(Method::OPTIONS, format!("{}/orders", qs.base))
            .header("origin", "https://shop.example")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type,idempotency-key",
            ),
    )
    .await;
    assert!(a.status.is_success(), "{}", a.describe());
    assert_eq!(a.header("access-control-allow-origin"), Some("*"));
    let allowed = a
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    for h in ["authorization", "content-type", "idempotency-key"] {
        assert!(allowed.contains(h), "{h} is allowed: {allowed:?}");
    }
    let methods = a.header("access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("POST"), "POST is allowed: {methods:?}");
    assert_eq!(qs.executions().await, 0, "a preflight runs nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_exposes_the_replayed_header() {
    let qs = Quickstart::start_memory().await;
    let body = json!({ "item": "book" });
    for _ in 0..2 {
        let a = send(
            qs.order("alice", "order-cors", &body)
                .header("origin", "https://shop.example"),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.describe());
        assert_eq!(a.header("access-control-allow-origin"), Some("*"));
        let exposed = a
            .header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            exposed.contains("idempotent-replayed"),
            "a page can read the replay header: {exposed:?}"
        );
    }
}

/// The headers a page reads from a cross-origin answer: `location` after
/// a 201, `retry-after` after a 409, and `idempotent-replayed` on a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_cors_exposes_location_and_retry_after() {
    let qs = Quickstart::start_memory().await;
    let exposed = |a: &Answer| {
        assert_eq!(a.header("access-control-allow-origin"), Some("*"));
        a.header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let body = json!({ "item": "book", "delay_ms": 1500 });
    let from_page = |key: &str| {
        qs.order("alice", key, &body)
            .header("origin", "https://shop.example")
    };
    let first = tokio::spawn(send(from_page("order-cors-slow")));
    let deadline = Instant::now() + Duration::from_secs(10);
    while qs.executions().await == 0 {
        assert!(Instant::now() < deadline, "the slow order never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dup = send(from_page("order-cors-slow")).await;
    dup.assert_problem(409, "idempotency.in_flight");
    assert!(dup.header("retry-after").is_some());
    let on_409 = exposed(&dup);
    assert!(
        on_409.contains("retry-after"),
        "a page can read when to retry a 409: {on_409:?}"
    );

    let first: Answer = bounded(Duration::from_secs(20), "the slow order", first)
        .await
        .expect("the slow order task");
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(first.header("location").is_some());
    let on_201 = exposed(&first);
    for h in ["location", "idempotent-replayed", "retry-after"] {
        assert!(on_201.contains(h), "a page can read {h}: {on_201:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_stats_counts_executions() {
    let qs = Quickstart::start_memory().await;
    assert_eq!(qs.executions().await, 0);
    let body = json!({ "item": "book" });
    send(qs.order("alice", "s-1", &body)).await;
    send(qs.order("alice", "s-1", &body)).await; // a replay
    send(qs.order("bob", "s-1", &body)).await; // another principal
    assert_eq!(qs.executions().await, 2, "two executions, one replay");
    // The key is optional: an unkeyed order runs every time.
    for _ in 0..2 {
        let a = send(
            client()
                .post(format!("{}/orders", qs.base))
                .header("authorization", "Bearer alice")
                .json(&body),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.describe());
        assert!(!a.is_replay());
    }
    assert_eq!(qs.executions().await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_refuses_a_keyed_order_without_a_principal() {
    let qs = Quickstart::start_memory().await;
    let a = send(
        client()
            .post(format!("{}/orders", qs.base))
            .header("idempotency-key", "anon")
            .json(&json!({ "item": "book" })),
    )
    .await;
    a.assert_problem(401, "idempotency.principal_missing");
    assert_eq!(qs.executions().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_metrics_count_each_outcome() {
    let qs = Quickstart::start_memory().await;
    let body = json!({ "item": "book" });
    assert_eq!(send(qs.order("alice", "m-1", &body)).await.status, 201);
    assert!(send(qs.order("alice", "m-1", &body)).await.is_replay());
    let other = json!({ "item": "lamp" });
    assert_eq!(send(qs.order("alice", "m-1", &other)).await.status, 422);
    let failed = json!({ "item": "book", "fail": 503 });
    assert_eq!(send(qs.order("alice", "m-2", &failed)).await.status, 503);
    let anonymous = client()
        .post(format!("{}/orders", qs.base))
        .header("idempotency-key", "m-3")
        .json(&body);
    assert_eq!(send(anonymous).await.status, 401);
    let unkeyed = client()
        .post(format!("{}/orders", qs.base))
        .header("authorization", "Bearer alice")
        .json(&body);
    assert_eq!(send(unkeyed).await.status, 201);

    let m = qs.metrics().await;
    let value = |series: &str| m.get(series).copied();
    for (outcome, n) in [
        ("ran", 2.0),
        ("replayed", 1.0),
        ("key_reused", 1.0),
        ("principal_missing", 1.0),
        ("untracked", 1.0),
    ] {
        let series = format!(r#"idempotency_requests_total{{door="http",outcome="{outcome}"}}"#);
        assert_eq!(value(&series), Some(n), "{series} in {m:#?}");
    }
    for (result, n) in [("completed", 1.0), ("released", 1.0)] {
        let series = format!(r#"idempotency_results_total{{door="http",result="{result}"}}"#);
        assert_eq!(value(&series), Some(n), "{series} in {m:#?}");
    }
    let claims =
        r#"idempotency_store_duration_seconds_count{store="memory",op="claim",result="ok"}"#;
    assert_eq!(value(claims), Some(4.0), "four claims timed: {m:#?}");
    assert_eq!(value("idempotency_memory_entries"), Some(1.0), "{m:#?}");
    assert_eq!(value("idempotency_memory_pending"), Some(0.0), "{m:#?}");
    assert_eq!(
        value("idempotency_memory_early_drops_total"),
        Some(0.0),
        "{m:#?}"
    );
    assert!(
        m.keys().all(|s| !s.contains("m-1") && !s.contains("alice")),
        "no key or principal in a label: {m:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_prints_how_to_try_it_with_curl() {
    let qs = Quickstart::start_memory().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = qs.stdout();
        if out.contains("curl") && out.contains(&qs.base) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the quickstart prints its address and a curl command; it printed: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
