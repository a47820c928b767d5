//! Feature `metrics`: each door's outcomes counted once, read with the facade's debugging
//! recorder (installed for the test's thread only, so tests running side by side stay apart:
//! `#[tokio::test]` runs the server, the client and the layer on that one thread).

use crate::support;
use axum::Router;
use axum::routing::post;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::BTreeMap;
use std::sync::Arc;
use support::http::{RequestExt, SpyStore, TestServer, Work, send, server_with, with_auth};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore};

/// What the recorder saw since the last look: `name{k=v,…}` (labels sorted) → the counter's
/// increase, a gauge's value, or a histogram's number of samples.
fn seen(snap: &Snapshotter) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (ck, _, _, value) in snap.snapshot().into_vec() {
        let key = ck.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        #[allow(clippy::cast_precision_loss)]
        let v = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(xs) => xs.len() as f64,
        };
        out.insert(name, v);
    }
    out
}

/// The counters of requests and results that moved since the last look, as `name{labels}`
/// without the metric name's prefix (`requests{door=http,outcome=ran}`).
fn counted(snap: &Snapshotter) -> BTreeMap<String, f64> {
    seen(snap)
        .into_iter()
        .filter(|(k, v)| *v > 0.0 && k.starts_with("idempotency_re"))
        .map(|(k, v)| (k.replacen("idempotency_", "", 1).replace("_total", ""), v))
        .collect()
}

fn expect(pairs: &[&str]) -> BTreeMap<String, f64> {
    pairs.iter().map(|k| ((*k).to_owned(), 1.0)).collect()
}

#[tokio::test]
async fn counts_each_http_outcome_once() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let store = SpyStore::new();
    let (server, _work) = server_with(
        IdempotencyLayer::new(store.clone())
            .max_request_body(128)
            .metrics_label("route", "work")
            .expect("a free label key"),
    )
    .await;
    let fresh = |o: &str| format!("requests{{door=http,outcome={o},route=work}}");
    let result = |r: &str| format!("results{{door=http,result={r},route=work}}");

    let a = send(server.work("k1").principal("p")).await;
    assert_eq!(a.status, 201);
    assert_eq!(
        counted(&snap),
        expect(&[&fresh("ran"), &result("completed")]),
        "a first request: one fresh, one completed"
    );

    assert!(send(server.work("k1").principal("p")).await.is_replay());
    assert_eq!(counted(&snap), expect(&[&fresh("replayed")]));

    let reused = send(
        server
            .post("/work", r#"{"other":1}"#)
            .key("k1")
            .principal("p"),
    )
    .await;
    assert_eq!(reused.status, 422);
    assert_eq!(counted(&snap), expect(&[&fresh("key_reused")]));

    let invalid = send(
        server
            .post("/work", "{}")
            .header("idempotency-key", "a b")
            .principal("p"),
    )
    .await;
    assert_eq!(invalid.status, 400);
    assert_eq!(counted(&snap), expect(&[&fresh("key_invalid")]));

    let missing = send(server.post("/work", "{}").principal("p")).await;
    assert_eq!(missing.status, 400);
    assert_eq!(counted(&snap), expect(&[&fresh("key_missing")]));

    let anonymous = send(server.work("k2")).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(counted(&snap), expect(&[&fresh("principal_missing")]));

    let large = send(
        server
            .post("/work", &"x".repeat(200))
            .key("k3")
            .principal("p"),
    )
    .await;
    assert_eq!(large.status, 413);
    assert_eq!(counted(&snap), expect(&[&fresh("body_too_large")]));

    let failed = send(server.work("k4").principal("p").respond(503)).await;
    assert_eq!(failed.status, 503);
    assert_eq!(
        counted(&snap),
        expect(&[&fresh("ran"), &result("released")]),
        "a 5xx from the handler: fresh, then released"
    );

    store.fail_claims(true);
    let down = send(server.work("k5").principal("p")).await;
    assert_eq!(down.status, 503);
    assert_eq!(counted(&snap), expect(&[&fresh("store_failed")]));
    store.fail_claims(false);

    store.fail_completes(true);
    let unrecorded = send(server.work("k6").principal("p")).await;
    assert_eq!(
        unrecorded.status, 201,
        "the caller still gets the handler's answer"
    );
    assert_eq!(
        counted(&snap),
        expect(&[&fresh("ran"), &result("complete_failed")])
    );
    store.fail_completes(false);

    // A method the layer does not act on is not its business: nothing is counted.
    let read = send(server.request(reqwest::Method::GET, "/work")).await;
    assert_eq!(read.status, 201);
    assert_eq!(counted(&snap), BTreeMap::new());
    server.stop().await;
}

#[tokio::test]
async fn counts_in_flight_and_passthrough() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (server, work) = server_with(IdempotencyLayer::default().require_key(false)).await;

    let first = tokio::spawn(send(server.work("k").principal("p").header("x-gate", "g")));
    work.wait_runs("k", 1).await;
    let second = send(server.work("k").principal("p")).await;
    assert_eq!(second.status, 409);
    assert_eq!(
        counted(&snap),
        expect(&[
            "requests{door=http,outcome=ran}",
            "requests{door=http,outcome=in_flight}"
        ])
    );
    work.open("g");
    assert_eq!(first.await.expect("the first request").status, 201);
    assert_eq!(
        counted(&snap),
        expect(&["results{door=http,result=completed}"])
    );

    let unkeyed = send(server.post("/work", "{}").principal("p")).await;
    assert_eq!(unkeyed.status, 201);
    assert_eq!(
        counted(&snap),
        expect(&["requests{door=http,outcome=untracked}"])
    );
    server.stop().await;
}

#[tokio::test]
async fn counts_a_full_scope_and_a_full_store() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemoryStore::builder()
        .max_entries(2)
        .max_entries_per_scope(1)
        .build()
        .expect("valid bounds");
    let (server, work) = server_with(IdempotencyLayer::new(store)).await;

    // Two scopes each hold one pending claim: the store is full, and each scope at its cap.
    let a = tokio::spawn(send(server.work("a").principal("p").header("x-gate", "g")));
    let b = tokio::spawn(send(server.work("b").principal("q").header("x-gate", "g")));
    work.wait_runs("a", 1).await;
    work.wait_runs("b", 1).await;
    let _ = counted(&snap);

    let scope_full = send(server.work("a2").principal("p")).await;
    assert_eq!(scope_full.status, 429);
    assert_eq!(
        counted(&snap),
        expect(&["requests{door=http,outcome=scope_full}"])
    );
    let store_full = send(server.work("c").principal("r")).await;
    assert_eq!(store_full.status, 503);
    assert_eq!(
        counted(&snap),
        expect(&["requests{door=http,outcome=store_full}"])
    );
    work.open("g");
    assert_eq!(a.await.expect("a").status, 201);
    assert_eq!(b.await.expect("b").status, 201);
    server.stop().await;
}

#[tokio::test]
async fn counts_a_record_that_fails_validation() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    // Two layers over one store: the second reads records with a smaller body limit, so the
    // first one's record fails validation there.
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    let writer = TestServer::start(work.app(IdempotencyLayer::new(Arc::clone(&store)))).await;
    let reader = TestServer::start(
        work.app(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(Arc::clone(&store))
                .max_record_body(8)
                .build(),
        )),
    )
    .await;
    assert_eq!(send(writer.work("k").principal("p")).await.status, 201);
    let _ = counted(&snap);
    let refused = send(reader.work("k").principal("p")).await;
    refused.assert_problem(503, "idempotency.record_invalid");
    assert_eq!(
        counted(&snap),
        expect(&["requests{door=http,outcome=record_invalid}"])
    );
    writer.stop().await;
    reader.stop().await;
}

#[tokio::test]
async fn times_each_store_step_and_reports_the_memory_gauges() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(MemoryStore::new());
    let work = Work::new();
    let server = TestServer::start(work.app(IdempotencyLayer::new(Arc::clone(&store)))).await;

    assert_eq!(send(server.work("k1").principal("p")).await.status, 201);
    assert_eq!(
        send(server.work("k2").principal("p").respond(503))
            .await
            .status,
        503
    );
    store.report_metrics();
    let seen = seen(&snap);
    let timing = |op: &str| {
        seen.get(&format!(
            "idempotency_store_duration_seconds{{op={op},result=ok,store=memory}}"
        ))
        .copied()
    };
    assert_eq!(timing("claim"), Some(2.0), "two claims timed: {seen:?}");
    assert_eq!(
        timing("complete"),
        Some(1.0),
        "one completion timed: {seen:?}"
    );
    assert_eq!(timing("release"), Some(1.0), "one release timed: {seen:?}");
    assert_eq!(seen.get("idempotency_memory_entries{}"), Some(&1.0));
    assert_eq!(seen.get("idempotency_memory_pending{}"), Some(&0.0));
    let stats = store.stats();
    #[allow(clippy::cast_precision_loss)]
    let bytes = stats.bytes as f64;
    assert_eq!(seen.get("idempotency_memory_bytes{}"), Some(&bytes));
    assert_eq!(
        seen.get("idempotency_memory_early_drops_total{}"),
        Some(&0.0)
    );
    server.stop().await;
}

#[tokio::test]
async fn counts_grpc_requests_under_their_own_door() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (server, _work) = server_with(IdempotencyLayer::default()).await;
    // Without a principal: refused with a gRPC status before anything runs.
    let res = send(
        server
            .client()
            .post(server.url("/work"))
            .header("content-type", "application/grpc")
            .key("k"),
    )
    .await;
    assert_eq!(
        res.status, 200,
        "a gRPC refusal is a 200 with a grpc-status"
    );
    assert_eq!(
        counted(&snap),
        expect(&["requests{door=grpc,outcome=principal_missing}"])
    );
    server.stop().await;
}

#[tokio::test]
async fn counts_an_extractor_refusal_under_the_extract_door() {
    async fn needs_key(key: IdempotencyKey) -> String {
        key.as_str().to_owned()
    }
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let app = Router::new()
        .route("/k", post(needs_key))
        .layer(IdempotencyLayer::default().require_key(false));
    let server = TestServer::start(with_auth(app)).await;
    let res = send(server.post("/k", "{}").principal("p")).await;
    assert_eq!(res.status, 400);
    assert_eq!(
        counted(&snap),
        expect(&[
            "requests{door=http,outcome=untracked}",
            "requests{door=extract,outcome=key_missing}"
        ]),
        "the layer passes the unkeyed request on; the extractor refuses it"
    );
    server.stop().await;
}

#[test]
fn a_layer_label_may_not_take_a_key_the_layer_sets() {
    for key in ["door", "outcome", "result"] {
        let err = IdempotencyLayer::default()
            .metrics_label(key, "x")
            .expect_err("a reserved label key");
        assert_eq!(
            err.kind(),
            tower_idempotency::ConfigErrorKind::ReservedLabel
        );
    }
}

/// A memory store whose completions find the lease lost and whose releases fail.
struct Unlucky(MemoryStore);

impl tower_idempotency::Store for Unlucky {
    async fn claim(
        &self,
        key: &tower_idempotency::store::StoreKey,
        fingerprint: &tower_idempotency::engine::Fingerprint,
        lease: std::time::Duration,
    ) -> Result<tower_idempotency::store::Claim, tower_idempotency::store::StoreError> {
        self.0.claim(key, fingerprint, lease).await
    }
    async fn complete(
        &self,
        _: &tower_idempotency::store::StoreKey,
        _: &tower_idempotency::store::Token,
        _: &tower_idempotency::engine::Fingerprint,
        _: tower_idempotency::store::Record,
        _: std::time::Duration,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        Ok(false)
    }
    async fn release(
        &self,
        _: &tower_idempotency::store::StoreKey,
        _: &tower_idempotency::store::Token,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        Err(tower_idempotency::store::StoreError::new(
            tower_idempotency::store::StoreErrorKind::Timeout,
            "the test store times out releases",
        ))
    }
    async fn renew(
        &self,
        key: &tower_idempotency::store::StoreKey,
        token: &tower_idempotency::store::Token,
        lease: std::time::Duration,
    ) -> Result<bool, tower_idempotency::store::StoreError> {
        self.0.renew(key, token, lease).await
    }
    async fn forget(
        &self,
        key: &tower_idempotency::store::StoreKey,
        pending: bool,
    ) -> Result<tower_idempotency::store::Forgotten, tower_idempotency::store::StoreError> {
        self.0.forget(key, pending).await
    }
}

#[tokio::test]
async fn counts_a_lost_lease_and_a_failed_release() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (server, _work) = server_with(IdempotencyLayer::new(Unlucky(MemoryStore::new()))).await;

    assert_eq!(send(server.work("k1").principal("p")).await.status, 201);
    assert_eq!(
        counted(&snap),
        expect(&[
            "requests{door=http,outcome=ran}",
            "results{door=http,result=lease_lost}"
        ])
    );
    assert_eq!(
        send(server.work("k2").principal("p").respond(503))
            .await
            .status,
        503
    );
    let seen_now = seen(&snap);
    assert_eq!(
        seen_now.get("idempotency_results_total{door=http,result=release_failed}"),
        Some(&1.0),
        "{seen_now:?}"
    );
    assert_eq!(
        seen_now.get("idempotency_store_duration_seconds{op=release,result=timeout,store=custom}"),
        Some(&1.0),
        "a failed step is timed under its error's kind, the store under its default name: {seen_now:?}"
    );
    server.stop().await;
}
