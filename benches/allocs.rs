//! Heap allocations per request through the layer (counted by `dhat`), in process, next to the bare handler: the
//! count the load benchmark's profile pointed at (`malloc`/`free` are the largest entries
//! after the kernel's TCP path). Prints a table; it measures no time.
//!
//! ```text
//! cargo bench --bench allocs
//! cargo bench --bench allocs --features metrics   # + rows under a Prometheus recorder
//! ALLOCS_SITES=fresh cargo bench --bench allocs    # one row (floor, bare, fresh, replay), with
//!                                                  # every allocation site in dhat-heap.json
//! ```
//!
//! `dhat-heap.json` opens in dhat's viewer (`dh_view.html`); the sites that run once per
//! request are those whose block count is about the number of requests.

#![allow(missing_docs)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::Request;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::engine::Scope;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

fn counts() -> (u64, u64) {
    let s = dhat::HeapStats::get();
    (s.total_blocks, s.total_bytes)
}

async fn handler(
    body: Bytes,
) -> (
    http::StatusCode,
    [(http::HeaderName, &'static str); 1],
    String,
) {
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    (
        http::StatusCode::CREATED,
        [(http::header::CONTENT_TYPE, "application/json")],
        format!(
            r#"{{"id":"o-1","items":{},"status":"created"}}"#,
            v["items"].as_array().map_or(0, Vec::len)
        ),
    )
}

fn body() -> Bytes {
    let mut items = String::new();
    for i in 0..8 {
        if i > 0 {
            items.push(',');
        }
        items.push_str(&format!(
            r#"{{"sku":"SKU-{i:06}","quantity":{i},"price_cents":{}}}"#,
            1000 + i
        ));
    }
    let mut s = format!(r#"{{"customer":"c-1","currency":"EUR","items":[{items}],"note":""#);
    while s.len() < 1024 - 2 {
        s.push('x');
    }
    s.push_str("\"}");
    Bytes::from(s)
}

fn request(key: &str, body: &Bytes) -> Request<Body> {
    Request::post("/orders")
        .header("content-type", "application/json")
        .header("x-client", "c1")
        .header("idempotency-key", key)
        .body(Body::from(body.clone()))
        .expect("request")
}

fn main() {
    // `--list`, as a libtest harness answers it: the rows, nothing run.
    if std::env::args().any(|a| a == "--list") {
        for row in ["floor", "bare", "fresh", "replay"] {
            println!("allocs/{row}: benchmark");
        }
        return;
    }
    // With ALLOCS_SITES, one row and a profile of its allocation sites; else counts only
    // (dhat's testing mode writes no profile file).
    let sites = std::env::var("ALLOCS_SITES").ok();
    let _profiler = if sites.is_some() {
        dhat::Profiler::new_heap()
    } else {
        dhat::Profiler::builder().testing().build()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let body = body();
    // Both routers finalized with `with_state(())`, as `axum::serve` does: an unfinalized
    // router would rebuild its layered endpoint (four small boxes) on every request.
    let bare: Router = Router::new().route("/orders", post(handler)).with_state(());
    // The floor: reads the body and answers a constant (no parse, no store).
    let floor: Router = Router::new()
        .route(
            "/orders",
            post(|body: Bytes| async move {
                let _ = body.len();
                (http::StatusCode::CREATED, "{\"id\":\"1\"}")
            }),
        )
        .with_state(());
    let layered: Router = Router::new()
        .route("/orders", post(handler))
        .layer(
            IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(MemoryStore::new())
                    .retention(Duration::from_secs(3600))
                    .build(),
            )
            .principal_fn(|p| {
                p.headers
                    .get("x-client")
                    .and_then(|v| v.to_str().ok())
                    .map(Scope::principal)
            }),
        )
        .with_state(());
    const N: usize = 2000;
    // Keys made before counting, so their strings are not counted.
    let keys: Vec<String> = (0..3 * N).map(|i| format!("k-{i}")).collect();
    let run = |router: &Router, keys: &mut dyn Iterator<Item = &String>| {
        rt.block_on(async {
            // Warm-up: first-use allocations (runtime, lazies) are not per request.
            let res = router
                .clone()
                .oneshot(request("warm", &body))
                .await
                .expect("call");
            let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
            let (a0, b0) = counts();
            for _ in 0..N {
                let key = keys.next().expect("key");
                let req = request(key, &body);
                let res = router.clone().oneshot(req).await.expect("call");
                assert!(res.status().is_success(), "{}", res.status());
                let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
            }
            let (a1, b1) = counts();
            #[allow(clippy::cast_precision_loss)] // counts far below 2^52
            ((a1 - a0) as f64 / N as f64, (b1 - b0) as f64 / N as f64)
        })
    };
    // The request itself (headers, body handle) is made inside the loop for every row alike.
    if let Some(row) = sites {
        let replay_key = "k-0".to_owned();
        let (a, b) = match row.as_str() {
            "floor" => run(&floor, &mut keys[..N].iter()),
            "bare" => run(&bare, &mut keys[..N].iter()),
            "fresh" => run(&layered, &mut keys[N..].iter()),
            "replay" => run(&layered, &mut std::iter::repeat_n(&replay_key, N)),
            other => panic!("ALLOCS_SITES is floor, bare, fresh or replay, not {other:?}"),
        };
        println!("{row}: {a:.1} allocations, {b:.0} bytes per request; sites in dhat-heap.json");
        return;
    }
    let (floor_a, floor_b) = run(&floor, &mut keys[..N].iter());
    let (bare_a, bare_b) = run(&bare, &mut keys[..N].iter());
    let (fresh_a, fresh_b) = run(&layered, &mut keys[N..].iter());
    let replay_key = "k-0".to_owned();
    let (replay_a, replay_b) = run(&layered, &mut std::iter::repeat_n(&replay_key, N));
    println!("allocations per request (in process, 1 KiB JSON body, {N} requests)");
    println!("| row | allocations | bytes allocated | allocations over bare |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| floor (body read, no parse) | {floor_a:.1} | {floor_b:.0} | {:+.1} |",
        floor_a - bare_a
    );
    println!("| bare | {bare_a:.1} | {bare_b:.0} | — |");
    println!(
        "| memory, fresh | {fresh_a:.1} | {fresh_b:.0} | {:+.1} |",
        fresh_a - bare_a
    );
    println!(
        "| memory, replay | {replay_a:.1} | {replay_b:.0} | {:+.1} |",
        replay_a - bare_a
    );
    // Feature `metrics`: the same rows under the recorder operators install (for this thread
    // only; the runtime is current-thread). Its first sight of each series allocates; the warm
    // up request of each row meets that.
    #[cfg(feature = "metrics")]
    {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let _local = metrics::set_default_local_recorder(&recorder);
        let (fresh_a, fresh_b) = run(&layered, &mut keys[2 * N..].iter());
        let (replay_a, replay_b) = run(&layered, &mut std::iter::repeat_n(&replay_key, N));
        println!(
            "| memory, fresh, Prometheus recorder | {fresh_a:.1} | {fresh_b:.0} | {:+.1} |",
            fresh_a - bare_a
        );
        println!(
            "| memory, replay, Prometheus recorder | {replay_a:.1} | {replay_b:.0} | {:+.1} |",
            replay_a - bare_a
        );
    }
}
