//! Micro-benchmarks: the fingerprint, the memory store, and one request through the layer in
//! process (`oneshot`), next to the bare handler measured in the same run.
//!
//! ```text
//! cargo bench --bench layer
//! cargo bench --bench layer -- fingerprint    # raw vs by-value JSON fingerprints
//! cargo bench --bench layer --features metrics -- layer_1KiB   # + rows under a Prometheus recorder
//! cargo bench --bench layer --features encrypt -- encrypt_1KiB  # records encrypted at rest
//! ```
//!
//! With the feature `metrics` and no recorder installed, the `first_run` and `replay` rows
//! measure the instrumentation's floor (each event meets the facade's no-op recorder); the
//! `…/prometheus` rows run under `metrics-exporter-prometheus`'s recorder, what an operator
//! installs. Without the feature the calls are compiled out: compare the rows' ratios to
//! `bare` between a run with and one without it.

#![allow(missing_docs)] // criterion's macros generate undocumented items

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::Request;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
use tower_idempotency::store::{Claim, Store, StoreKey};
use tower_idempotency::{
    IdempotencyKey, IdempotencyLayer, MemoryStore, Principal, Secret, http::PrincipalMode,
};

fn json_body(len: usize) -> Bytes {
    let mut s = String::from("{\"item\":\"");
    while s.len() < len - 2 {
        s.push('x');
    }
    s.push_str("\"}");
    Bytes::from(s)
}

/// About `len` bytes of a typical JSON request: an order with nested lines, numbers, escapes.
fn json_order(len: usize) -> Bytes {
    let mut lines = Vec::new();
    let mut s = String::new();
    while s.len() < len {
        let n = lines.len();
        lines.push(format!(
            r#"{{"sku": "SKU-{n:05}", "name": "Item \u00e9 {n}", "qty": {n}, "price": {n}.99, "gift": false}}"#
        ));
        s = format!(
            r#"{{"customer": {{"id": "c-42", "email": "a@example.com"}}, "currency": "EUR", "lines": [{}], "note": null}}"#,
            lines.join(", ")
        );
    }
    Bytes::from(s)
}

/// The default fingerprint of a JSON request, raw or by value.
fn fingerprint_json(body: &[u8], by_value: bool) -> Fingerprint {
    let head = Fingerprint::builder()
        .field(b"POST")
        .field(b"/orders")
        .field(b"")
        .field(b"application/json");
    if by_value {
        head.json_value(body).finish()
    } else {
        head.field(body).finish()
    }
}

/// The key header as clients send it: an sf-string (quoted), and bare.
fn key(c: &mut Criterion) {
    let mut g = c.benchmark_group("key");
    for (name, value) in [
        (
            "quoted_uuid",
            &b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\""[..],
        ),
        ("bare_uuid", &b"8e03978e-40d5-43e8-bc93-6894a57f9324"[..]),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| tower_idempotency::IdempotencyKey::parse_header(std::hint::black_box(value)))
        });
    }
    g.finish();
}

fn fingerprint(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint");
    // A JSON body by its bytes (the default) and by value (`Fingerprinting::json_by_value`): one
    // long string member, and an order of many members.
    for (name, body) in [
        ("json_1KiB_one_string", json_body(1024)),
        ("json_1KiB_order", json_order(1024)),
    ] {
        assert_ne!(
            fingerprint_json(&body, true),
            fingerprint_json(&body, false),
            "{name} parses as JSON"
        );
        g.throughput(Throughput::Bytes(body.len() as u64));
        for (mode, by_value) in [("raw", false), ("by_value", true)] {
            g.bench_with_input(BenchmarkId::new(name, mode), &body, |b, body| {
                b.iter(|| fingerprint_json(body, by_value));
            });
        }
    }
    for size in [1024usize, 64 * 1024] {
        let body = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| {
                Fingerprint::builder()
                    .field(b"POST")
                    .field(b"/orders")
                    .field(b"")
                    .field(b"application/json")
                    .field(body)
                    .finish()
            });
        });
    }
    g.finish();
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The memory store rows' retention: short, so the store stays near steady state.
const TTL: Duration = Duration::from_millis(50);
/// The engine's defaults, for the rows that call the store directly.
const LEASE: Duration = Duration::from_secs(60);
const STORE_TIMEOUT: Duration = Duration::from_secs(30);

fn fresh_key(scope: &Scope) -> StoreKey {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    StoreKey::derive(
        "bench",
        scope,
        &IdempotencyKey::new(&n.to_string()).expect("key"),
    )
}

fn memory_store(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_store");
    let record = Recorded::new(201, vec![], Some(Bytes::from_static(b"{\"id\":\"1\"}")));
    let fp = Fingerprint::builder().field(b"x").finish();
    // Retention short enough that the store stays near steady state instead of filling up.
    let make = || Engine::builder(MemoryStore::new()).retention(TTL).build();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let engine = make();
    g.bench_function("claim_complete/1_thread", |b| {
        b.to_async(&rt).iter(|| async {
            let scope = Scope::principal("p");
            let key = fresh_key(&scope);
            let tower_idempotency::engine::Begin::Run(t) =
                engine.begin(key, fp).await.expect("claim")
            else {
                panic!("fresh key must be claimed")
            };
            engine.complete(t, &record).await.expect("complete");
        });
    });

    // What the engine adds over the store's own two operations: the store alone, the store
    // with each operation bounded as the engine bounds it (`store_timeout`), and the engine
    // with a `Secret` (the store key, fingerprint and record keyed under it).
    let store = MemoryStore::builder().build().expect("a valid store");
    let encoded = record.encode().expect("record");
    g.bench_function("claim_complete/store_only", |b| {
        b.to_async(&rt).iter(|| async {
            let key = fresh_key(&Scope::principal("p"));
            let Claim::Claimed(token) = store.claim(&key, &fp, LEASE).await.expect("claim") else {
                panic!("fresh key must be claimed")
            };
            let done = store.complete(&key, &token, &fp, encoded.clone(), TTL);
            assert!(done.await.expect("complete"));
        });
    });
    g.bench_function("claim_complete/store_timeout", |b| {
        b.to_async(&rt).iter(|| async {
            let key = fresh_key(&Scope::principal("p"));
            let claim = tokio::time::timeout(STORE_TIMEOUT, store.claim(&key, &fp, LEASE));
            let Claim::Claimed(token) = claim.await.expect("in time").expect("claim") else {
                panic!("fresh key must be claimed")
            };
            let done = store.complete(&key, &token, &fp, encoded.clone(), TTL);
            let done = tokio::time::timeout(STORE_TIMEOUT, done).await;
            assert!(done.expect("in time").expect("complete"));
        });
    });
    let secret = Secret::new([7u8; 32].to_vec()).expect("secret");
    let keyed = Engine::builder(MemoryStore::new())
        .retention(TTL)
        .secret(secret)
        .build();
    g.bench_function("claim_complete/secret", |b| {
        b.to_async(&rt).iter(|| async {
            let scope = Scope::principal("p");
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let key = keyed.store_key(
                "bench",
                &scope,
                &IdempotencyKey::new(&n.to_string()).expect("key"),
            );
            let tower_idempotency::engine::Begin::Run(t) =
                keyed.begin(key, fp).await.expect("claim")
            else {
                panic!("fresh key must be claimed")
            };
            keyed.complete(t, &record).await.expect("complete");
        });
    });

    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let engine = make();
    g.bench_function("claim_complete/2_threads_x2", |b| {
        b.to_async(&rt2).iter(|| {
            let e1 = engine.clone();
            let e2 = engine.clone();
            let record = record.clone();
            async move {
                let one = |e: Engine<MemoryStore>, p: &'static str, record: Recorded| {
                    tokio::spawn(async move {
                        let key = fresh_key(&Scope::principal(p));
                        let tower_idempotency::engine::Begin::Run(t) =
                            e.begin(key, fp).await.expect("claim")
                        else {
                            panic!("fresh key must be claimed")
                        };
                        e.complete(t, &record).await.expect("complete");
                    })
                };
                let a = one(e1, "a", record.clone());
                let b = one(e2, "b", record);
                a.await.expect("task");
                b.await.expect("task");
            }
        });
    });
    g.finish();
}

async fn handler(body: Bytes) -> (http::StatusCode, &'static str) {
    let _: serde_json::Value = serde_json::from_slice(&body).expect("json");
    (http::StatusCode::CREATED, "{\"id\":\"42\"}")
}

/// The floor: reads the body, parses nothing, answers a constant (what a replay cannot beat).
async fn floor(body: Bytes) -> (http::StatusCode, &'static str) {
    let _ = body.len();
    (http::StatusCode::CREATED, "{\"id\":\"1\"}")
}

fn request(key: Option<String>, body: &Bytes) -> Request<Body> {
    let mut b = Request::post("/orders").header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    let mut req = b.body(Body::from(body.clone())).expect("request");
    req.extensions_mut().insert(Principal::new("bench"));
    req
}

/// One request through `router`, answered 201.
async fn call(router: &Router, key: Option<String>, body: &Bytes) {
    let res = router
        .clone()
        .oneshot(request(key, body))
        .await
        .expect("call");
    assert_eq!(res.status(), 201);
}

fn layer_overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let body = json_body(1024);
    // Finalized with `with_state(())`, as `axum::serve` does (an unfinalized router rebuilds
    // its layered endpoint on every request).
    let bare: Router = Router::new().route("/orders", post(handler)).with_state(());
    let floor_router: Router = Router::new().route("/orders", post(floor)).with_state(());
    let layered: Router = Router::new()
        .route("/orders", post(handler))
        .layer(
            IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(MemoryStore::new())
                    .retention(Duration::from_secs(5))
                    .build(),
            )
            .principal(PrincipalMode::Required),
        )
        .with_state(());
    // The same layer with a `Secret`: the store key, fingerprint and record keyed under it.
    let secret = Secret::new([7u8; 32].to_vec()).expect("secret");
    let keyed: Router = Router::new()
        .route("/orders", post(handler))
        .layer(
            IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(MemoryStore::new())
                    .retention(Duration::from_secs(5))
                    .secret(secret)
                    .build(),
            )
            .principal(PrincipalMode::Required),
        )
        .with_state(());
    // The same layer with its spans at info, for a subscriber that keeps info spans.
    let traced: Router = Router::new()
        .route("/orders", post(handler))
        .layer(
            IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(MemoryStore::new())
                    .retention(Duration::from_secs(5))
                    .span_level(tracing::Level::INFO)
                    .build(),
            )
            .principal(PrincipalMode::Required),
        )
        .with_state(());
    // Warm one key for each replay row.
    rt.block_on(async {
        call(&layered, Some("replay-key".into()), &body).await;
        call(&keyed, Some("replay-key".into()), &body).await;
        call(&traced, Some("replay-key".into()), &body).await;
    });
    let n = Arc::new(AtomicU64::new(0));

    let mut g = c.benchmark_group("layer_1KiB_json");
    g.bench_function("floor", |b| {
        b.to_async(&rt).iter(|| async {
            call(&floor_router, Some("k".into()), &body).await;
        });
    });
    g.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| async {
            call(&bare, None, &body).await;
        });
    });
    g.bench_function("first_run", |b| {
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            call(&layered, Some(format!("k-{k}")), &body).await;
        });
    });
    g.bench_function("replay", |b| {
        b.to_async(&rt).iter(|| async {
            call(&layered, Some("replay-key".into()), &body).await;
        });
    });
    g.bench_function("first_run/secret", |b| {
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            call(&keyed, Some(format!("k-{k}")), &body).await;
        });
    });
    g.bench_function("replay/secret", |b| {
        b.to_async(&rt).iter(|| async {
            call(&keyed, Some("replay-key".into()), &body).await;
        });
    });
    // A subscriber that keeps info spans, as a pipeline behind an info filter does: the
    // registry stores each span, and `fmt` formats its fields and writes its events to a sink.
    // For this thread only (the runtime is current-thread), while these rows run.
    let info_subscriber = || {
        use tracing_subscriber::layer::SubscriberExt;
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::sink))
    };
    g.bench_function("first_run/info_spans", |b| {
        let _subscriber = tracing::subscriber::set_default(info_subscriber());
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            call(&traced, Some(format!("k-{k}")), &body).await;
        });
    });
    g.bench_function("replay/info_spans", |b| {
        let _subscriber = tracing::subscriber::set_default(info_subscriber());
        b.to_async(&rt).iter(|| async {
            call(&traced, Some("replay-key".into()), &body).await;
        });
    });
    // The registry alone, behind the same filter: what storing the spans costs, without the
    // formatting of their fields.
    g.bench_function("first_run/info_spans_registry", |b| {
        use tracing_subscriber::layer::SubscriberExt;
        let registry =
            tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO);
        let _subscriber = tracing::subscriber::set_default(registry);
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            call(&traced, Some(format!("k-{k}")), &body).await;
        });
    });
    // The default level under the same subscriber: the spans are at debug, so it keeps none.
    g.bench_function("first_run/default_spans", |b| {
        let _subscriber = tracing::subscriber::set_default(info_subscriber());
        b.to_async(&rt).iter(|| async {
            let k = n.fetch_add(1, Ordering::Relaxed);
            call(&layered, Some(format!("k-{k}")), &body).await;
        });
    });
    #[cfg(feature = "metrics")]
    {
        // The recorder for this thread only (the runtime is current-thread), while these rows
        // run.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        g.bench_function("first_run/prometheus", |b| {
            let _local = metrics::set_default_local_recorder(&recorder);
            b.to_async(&rt).iter(|| async {
                let k = n.fetch_add(1, Ordering::Relaxed);
                call(&layered, Some(format!("k-{k}")), &body).await;
            });
        });
        // Counted, so that the check below runs only where the row did: `--list` and a filter
        // that leaves the row out run nothing.
        let replays = AtomicU64::new(0);
        g.bench_function("replay/prometheus", |b| {
            let _local = metrics::set_default_local_recorder(&recorder);
            b.to_async(&rt).iter(|| async {
                replays.fetch_add(1, Ordering::Relaxed);
                call(&layered, Some("replay-key".into()), &body).await;
            });
        });
        let text = recorder.handle().render();
        assert!(
            replays.load(Ordering::Relaxed) == 0
                || text.contains(r#"idempotency_requests_total{door="http",outcome="replayed"}"#),
            "the recorder saw the replays: {text}"
        );
    }
    g.finish();
}

/// Answers a 1 KiB JSON body: what an encrypted record seals.
#[cfg(feature = "encrypt")]
async fn handler_1k(body: Bytes) -> (http::StatusCode, Bytes) {
    (http::StatusCode::CREATED, body)
}

/// What encrypting the record costs (`Secret::encrypting`) against a `Secret` that only tags
/// it and no secret, for a request and a response of 1 KiB each: a first run and a replay,
/// in one run.
#[cfg(feature = "encrypt")]
fn encrypt_overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let body = json_body(1024);
    let router = |secret: Option<Secret>| -> Router {
        let mut engine = tower_idempotency::engine::Engine::builder(MemoryStore::new())
            .retention(Duration::from_secs(5));
        if let Some(s) = secret {
            engine = engine.secret(s);
        }
        Router::new()
            .route("/orders", post(handler_1k))
            .layer(IdempotencyLayer::new(engine.build()).principal(PrincipalMode::Required))
            .with_state(())
    };
    let secret = Secret::new([7u8; 32].to_vec()).expect("secret");
    let plain = router(None);
    let tagged = router(Some(secret.clone()));
    let sealed = router(Some(secret.encrypting()));
    rt.block_on(async {
        for r in [&plain, &tagged, &sealed] {
            call(r, Some("replay-key".into()), &body).await;
        }
    });
    let n = Arc::new(AtomicU64::new(0));
    let mut g = c.benchmark_group("encrypt_1KiB");
    for (name, r) in [("none", &plain), ("secret", &tagged), ("encrypt", &sealed)] {
        g.bench_function(format!("first_run/{name}"), |b| {
            b.to_async(&rt).iter(|| async {
                let k = n.fetch_add(1, Ordering::Relaxed);
                call(r, Some(format!("k-{k}")), &body).await;
            });
        });
        g.bench_function(format!("replay/{name}"), |b| {
            b.to_async(&rt).iter(|| async {
                call(r, Some("replay-key".into()), &body).await;
            });
        });
    }
    g.finish();
}

#[cfg(not(feature = "encrypt"))]
fn encrypt_overhead(_: &mut Criterion) {}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = key, fingerprint, memory_store, layer_overhead, encrypt_overhead
}
criterion_main!(benches);
