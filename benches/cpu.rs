//! CPU time per request through the layer, in process, next to the bare handler: rows
//! interleaved in short rounds and each measured in this process's CPU time (not wall time),
//! so a machine shared with other work skews them less than the wall-clock rows of
//! `benches/layer.rs`. Prints a table of the median over the rounds.
//!
//! ```text
//! cargo bench --bench cpu                     # the instrumentation compiled out
//! cargo bench --bench cpu --features metrics  # compiled in: no recorder, then Prometheus's
//! ```
//!
//! Compare the ratios to `bare` between the two runs: the cost of the feature with no
//! recorder installed, and under the recorder an operator installs.

#![allow(missing_docs)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::Request;
use std::fmt::Write as _;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal, http::PrincipalMode};

/// This process's user + system CPU time, from `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat (Linux)");
    // The fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are the 14th and 15th fields; `rest` starts at the 3rd.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

async fn handler(body: Bytes) -> (http::StatusCode, &'static str) {
    let _: serde_json::Value = serde_json::from_slice(&body).expect("json");
    (http::StatusCode::CREATED, "{\"id\":\"42\"}")
}

fn json_body(len: usize) -> Bytes {
    let mut s = String::from("{\"item\":\"");
    while s.len() < len - 2 {
        s.push('x');
    }
    s.push_str("\"}");
    Bytes::from(s)
}

fn request(key: Option<&str>, body: &Bytes) -> Request<Body> {
    let mut b = Request::post("/orders").header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    let mut req = b.body(Body::from(body.clone())).expect("request");
    req.extensions_mut().insert(Principal::new("bench"));
    req
}

/// One row: a router and how its keys are chosen.
struct Row {
    name: &'static str,
    router: Router,
    fresh: bool,
    /// Runs under a Prometheus recorder (feature `metrics`).
    recorded: bool,
}

const ROUNDS: usize = 7;
/// Each row runs at least this much CPU per round (the clock ticks every 10 ms).
const PER_ROUND: Duration = Duration::from_millis(400);

fn main() {
    let list = std::env::args().any(|a| a == "--list");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let body = json_body(1024);
    let layered = || -> Router {
        Router::new().route("/orders", post(handler)).layer(
            // Records outlive a round only briefly: the store stays near steady state.
            IdempotencyLayer::new(
                tower_idempotency::engine::Engine::builder(MemoryStore::new())
                    .retention(Duration::from_secs(2))
                    .build(),
            )
            .principal(PrincipalMode::Required),
        )
    };
    let mut rows = vec![
        Row {
            name: "bare",
            router: Router::new().route("/orders", post(handler)),
            fresh: false,
            recorded: false,
        },
        Row {
            name: "fresh key",
            router: layered(),
            fresh: true,
            recorded: false,
        },
        Row {
            name: "replay",
            router: layered(),
            fresh: false,
            recorded: false,
        },
    ];
    if cfg!(feature = "metrics") {
        rows.push(Row {
            name: "fresh key, Prometheus recorder",
            router: layered(),
            fresh: true,
            recorded: true,
        });
        rows.push(Row {
            name: "replay, Prometheus recorder",
            router: layered(),
            fresh: false,
            recorded: true,
        });
    }
    // `--list`, as a libtest harness answers it: the rows, nothing run.
    if list {
        for row in &rows {
            println!("cpu/{}: benchmark", row.name);
        }
        return;
    }
    #[cfg(feature = "metrics")]
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let mut next_key = 0u64;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for round in 0..=ROUNDS {
        for (i, row) in rows.iter().enumerate() {
            #[cfg(feature = "metrics")]
            let _local = row
                .recorded
                .then(|| metrics::set_default_local_recorder(&recorder));
            let _ = row.recorded;
            let start = cpu_time();
            let mut n = 0u64;
            let mut key = String::new();
            rt.block_on(async {
                // Batches of 1000 between looks at the clock.
                while !n.is_multiple_of(1000) || cpu_time() - start < PER_ROUND {
                    n += 1;
                    key.clear();
                    if row.fresh {
                        next_key += 1;
                        write!(key, "k-{next_key}").expect("a string");
                    } else {
                        key.push_str("replay-key");
                    }
                    let key = (row.name != "bare").then_some(key.as_str());
                    let res = row
                        .router
                        .clone()
                        .oneshot(request(key, &body))
                        .await
                        .expect("call");
                    assert!(res.status().is_success(), "{}", res.status());
                    let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
                }
            });
            let spent = cpu_time() - start;
            // Round 0 warms up (first keys, lazies, the replay row's record).
            if round > 0 {
                #[allow(clippy::cast_precision_loss)]
                samples[i].push(spent.as_secs_f64() * 1e6 / n as f64);
            }
        }
    }
    let median = |xs: &[f64]| {
        let mut xs = xs.to_vec();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let bare = median(&samples[0]);
    println!(
        "CPU time per request (in process, 1 KiB JSON body, median of {ROUNDS} rounds of {PER_ROUND:?} of CPU each; feature `metrics` {})",
        if cfg!(feature = "metrics") {
            "on"
        } else {
            "off"
        }
    );
    println!("| row | µs of CPU | ÷ bare |");
    println!("| --- | ---: | ---: |");
    for (row, xs) in rows.iter().zip(&samples) {
        let m = median(xs);
        println!("| {} | {m:.2} | {:.2}× |", row.name, m / bare);
    }
}
